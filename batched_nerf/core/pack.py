"""Heterogeneous batches: several molecules in one table, one call, split back."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor

from ..topology.analysis import concatenate
from .checks import check_table
from .table import ConstructionTable


def pack_tables(tables: Sequence[ConstructionTable]) -> ConstructionTable:
    """Concatenate tables into one whose components are the given molecules.

    Atom ``k`` of ``tables[m]`` becomes atom ``offset_m + k`` of the packed
    table, with ``offset_m = sum(len(t) for t in tables[:m])``; fixed atoms keep
    their order, table by table. The packed table's analysis is composed from
    the parts' (offsets added, components and seeds renumbered, build orders
    concatenated), not redone; its plans are made on first use, and those of
    the fused engine and of [`to_internal`][batched_nerf.to_internal] are composed from the parts'
    plans (offsets added; parts without one are planned first, when that costs
    no more than planning the packed table), so a new combination of tables
    that were planned before costs a few array concatenations. The packed table
    keeps its parts for this (not when pickled). Build the packed molecules in one call by
    concatenating their values along the atom dimension (``torch.cat(...,
    dim=-1)`` for internal coordinates, ``dim=-2`` for ``fixed_xyz``), then
    [`split_atoms`][batched_nerf.split_atoms] the result.

    Args:
        tables: one or more [`ConstructionTable`][batched_nerf.ConstructionTable].

    Returns:
        The packed [`ConstructionTable`][batched_nerf.ConstructionTable] of ``sum(len(t))`` atoms.

    Raises:
        ValueError: ``tables`` is empty.
        TypeError: an element is not a ConstructionTable.

    Example:
        >>> import torch, batched_nerf as bn
        >>> water = bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
        >>> butane = bn.ConstructionTable.chain(4)
        >>> packed = bn.pack_tables([water, butane])
        >>> bonds = torch.tensor([0.0, 0.96, 0.96] + [0.0, 1.53, 1.53, 1.53])
        >>> angles = torch.tensor([0.0, 0.0, 1.82] + [0.0, 0.0, 1.95, 1.95])
        >>> dihedrals = torch.tensor([0.0, 0.0, 0.0] + [0.0, 0.0, 0.0, 3.14])
        >>> xyz = bn.to_cartesian(bonds, angles, dihedrals, packed)
        >>> [x.shape for x in bn.split_atoms(xyz, [water, butane])]
        [torch.Size([3, 3]), torch.Size([4, 3])]
    """
    tables = list(tables)
    if not tables:
        raise ValueError("pack_tables needs at least one table")
    parts = [check_table(table, f"tables[{k}]").topology for k, table in enumerate(tables)]
    # the parts are checked and analysed: compose their analyses (no re-analysis); plans on first use,
    # composed from the parts' plans where the engine can (the packed table keeps its parts for that)
    return ConstructionTable._from_topology(concatenate(parts), tables)


def _n_atoms(table: ConstructionTable | int, k: int) -> int:
    if isinstance(table, ConstructionTable):
        return table.n_atoms
    if isinstance(table, (int, np.integer)) and not isinstance(table, (bool, np.bool_)):
        if table < 0:
            raise ValueError(f"tables[{k}] = {int(table)}: an atom count must be >= 0")
        return int(table)
    raise TypeError(f"tables[{k}] must be a ConstructionTable or an atom count, got {type(table).__name__}")


def split_atoms(values: Tensor, tables: Sequence[ConstructionTable | int], dim: int = -2) -> list[Tensor]:
    """Split packed per-atom values back into one tensor per molecule.

    Args:
        values: e.g. ``(..., N, 3)`` coordinates (``dim=-2``) or ``(..., N)``
            internal coordinates (``dim=-1``) of a packed table.
        tables: the tables given to [`pack_tables`][batched_nerf.pack_tables], or their atom counts
            (Python or numpy integers).
        dim: the atom dimension of ``values``.

    Returns:
        Views ``(..., N_m, 3)`` (or ``(..., N_m)``), one per molecule.

    Raises:
        TypeError: an element is neither a ConstructionTable nor an integer.
        ValueError: a negative count, or the sizes do not add up to ``values.shape[dim]``.

    Example:
        >>> import torch, batched_nerf as bn
        >>> [x.shape for x in bn.split_atoms(torch.zeros(8, 7, 3), [3, 4])]
        [torch.Size([8, 3, 3]), torch.Size([8, 4, 3])]
    """
    sizes = [_n_atoms(t, k) for k, t in enumerate(tables)]
    if sum(sizes) != values.shape[dim]:
        raise ValueError(
            f"molecule sizes {sizes} add up to {sum(sizes)} atoms, but values of shape "
            f"{tuple(values.shape)} have {values.shape[dim]} along dim {dim}"
        )
    return list(values.split(sizes, dim=dim))
