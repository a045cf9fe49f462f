"""Torsions and all other internal coordinates of proteins from coordinates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.checks import to_tensor
from ..core.convert import InternalCoordinates, to_internal
from ._build import packed_proteins
from ._sequence import protein_table


class Torsions(NamedTuple):
    """Backbone and side-chain torsions (conventions of [`build`][batched_nerf.protein.build]).

    ``phi``, ``psi``, ``omega`` are ``(..., L)``, ``chi`` ``(..., L, 4)``; entries
    a residue does not have (``phi`` of the first residue, ``omega`` of the
    last, ``chi`` beyond the side chain, padding) are ``0``.
    """

    phi: Tensor
    psi: Tensor
    omega: Tensor
    chi: Tensor


def _check_xyz(xyz: Any, trailing: tuple[int, ...], what: str) -> Tensor:
    x = to_tensor(xyz, "xyz")
    k = len(trailing)
    if x.ndim < k or tuple(x.shape[x.ndim - k :]) != trailing:
        raise ValueError(
            f"xyz must have shape {what} = (..., {', '.join(map(str, trailing))}), got {tuple(x.shape)}"
        )
    return x


def _gather(dihedrals: Tensor, rows: Tensor) -> Torsions:
    """Torsions ``(..., P, 7)`` from ``(..., N)`` dihedrals and ``(P, 7)`` rows (``-1``: none -> 0)."""
    n = dihedrals.shape[-1]
    padded = torch.cat([dihedrals, dihedrals.new_zeros(()).expand(*dihedrals.shape[:-1], 1)], dim=-1)
    index = torch.where(rows >= 0, rows, n).to(dihedrals.device)
    values = padded.index_select(-1, index.reshape(-1)).unflatten(-1, tuple(rows.shape))
    return Torsions(values[..., 0], values[..., 1], values[..., 2], values[..., 3:])


def internal_coordinates(
    xyz: Any, sequence: str | Sequence[str], *, hydrogens: bool = False, degrees: bool = False
) -> InternalCoordinates:
    """Bond lengths, angles and dihedrals of every heavy atom, in the rows of
    [`protein_table`][batched_nerf.protein.protein_table].

    ``bn.protein.build(sequence, *torsions(xyz, sequence), geometry=internal_coordinates(xyz, sequence))``
    reproduces ``xyz`` up to a rigid motion.

    Args:
        xyz: ``(..., N, 3)`` heavy atoms in the table's atom order (reorder
            other files with [`ProteinTable.order_from`][batched_nerf.protein.ProteinTable.order_from]).
        sequence: as for [`build`][batched_nerf.protein.build].
        hydrogens: ``xyz`` holds every atom (the all-atom table of [`build`][batched_nerf.protein.build]).
        degrees: angles and dihedrals in degrees.

    Returns:
        [`batched_nerf.InternalCoordinates`][batched_nerf.InternalCoordinates], each ``(..., N)``; the
        hydrogen
        rotors' dihedrals are ``dihedrals[..., table.rotor_rows]``.

    Raises:
        ValueError: ``xyz`` is not ``(..., N, 3)``, or a bad sequence.

    Example:
        >>> import torch, batched_nerf as bn
        >>> p = bn.protein.build("GG", torch.zeros(2), torch.zeros(2))
        >>> ic = bn.protein.internal_coordinates(p.xyz, "GG", degrees=True)
        >>> row = bn.protein.protein_table("GG").row("omega", 0)
        >>> round(abs(ic.dihedrals[row].item()), 3)
        180.0
    """
    t = protein_table(sequence, hydrogens=hydrogens)
    return to_internal(_check_xyz(xyz, (t.n_atoms, 3), "(..., N, 3)"), t.table, degrees=degrees)


def torsions(
    xyz: Any, sequence: str | Sequence[str], *, hydrogens: bool = False, degrees: bool = False
) -> Torsions:
    r"""phi, psi, omega and chi1-chi4 of every residue from heavy-atom coordinates.

    The inverse of [`build`][batched_nerf.protein.build]: ``build(sequence, *torsions(xyz, sequence))``
    rebuilds ``xyz`` (with ideal bond lengths and angles). Values agree with
    mdtraj's ``compute_phi``/``compute_psi``/``compute_omega``/``compute_chi1..4``
    where those define them, in ``(-pi, pi]``. Differentiable (``atan2`` based,
    finite at degenerate geometry).

    Args:
        xyz: ``(..., N, 3)`` in the atom order of [`protein_table`][batched_nerf.protein.protein_table].
        sequence: as for [`build`][batched_nerf.protein.build].
        hydrogens: ``xyz`` holds every atom (order of ``protein_table(sequence, hydrogens=True)``).
        degrees: return degrees.

    Returns:
        [`Torsions`][batched_nerf.protein.Torsions] ``(phi, psi, omega (..., L), chi (..., L, 4))``, zeros
        where undefined.

    Raises:
        ValueError: ``xyz`` is not ``(..., N, 3)``, or a bad sequence.

    Example:
        >>> import torch, batched_nerf as bn
        >>> phi, psi = torch.tensor([0.0, -60.0]), torch.tensor([140.0, 130.0])
        >>> chi = torch.tensor([[0.0] * 4, [-65.0, 175.0, 170.0, 160.0]])
        >>> xyz = bn.protein.build("AK", phi, psi, chi=chi, degrees=True).xyz
        >>> t = bn.protein.torsions(xyz, "AK", degrees=True)
        >>> t.phi.round().tolist(), t.psi.round().tolist(), t.chi[1].round().tolist()
        ([0.0, -60.0], [140.0, 130.0], [-65.0, 175.0, 170.0, 160.0])
    """
    t = protein_table(sequence, hydrogens=hydrogens)
    ic = to_internal(_check_xyz(xyz, (t.n_atoms, 3), "(..., N, 3)"), t.table, degrees=degrees)
    return _gather(ic.dihedrals, t.torsion_rows)


def torsions_batch(
    xyz: Any, sequences: Sequence[str | Sequence[str]], *, hydrogens: bool = False, degrees: bool = False
) -> Torsions:
    """Torsions of a mixed batch: the inverse of [`build_batch`][batched_nerf.protein.build_batch].

    Args:
        xyz: ``(..., B, N_max, 3)`` padded coordinates (padding is ignored).
        sequences: the ``B`` sequences.
        hydrogens: ``xyz`` holds every atom.
        degrees: return degrees.

    Returns:
        [`Torsions`][batched_nerf.protein.Torsions] with ``(..., B, L_max)`` (``chi``: ``(..., B, L_max,
        4)``), zeros in padding.

    Raises:
        ValueError: ``xyz`` is not ``(..., B, N_max, 3)``, or a bad sequence.

    Example:
        >>> import torch, batched_nerf as bn
        >>> phi, psi = torch.full((2, 3), -1.0), torch.full((2, 3), -0.8)
        >>> p = bn.protein.build_batch(["ACD", "GW"], phi, psi)
        >>> bn.protein.torsions_batch(p.xyz, ["ACD", "GW"]).psi
        tensor([[-0.8000, -0.8000, -0.8000],
                [-0.8000, -0.8000,  0.0000]])
    """
    packed = packed_proteins(sequences, hydrogens=hydrogens)
    x = _check_xyz(xyz, (len(packed.tables), packed.n_max, 3), "(..., B, N_max, 3)")
    ic = to_internal(packed.packed(x), packed.table, degrees=degrees)
    rows = torch.full((len(packed.tables), packed.l_max, 7), -1, dtype=torch.long)
    offset = 0
    for k, t in enumerate(packed.tables):
        rows[k, : t.n_residues] = torch.where(t.torsion_rows >= 0, t.torsion_rows + offset, -1)
        offset += t.n_atoms
    return _gather(ic.dihedrals, rows)
