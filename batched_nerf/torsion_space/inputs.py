"""Rotor tables from what torsion-space models hold: PyTorch Geometric batches and RDKit molecules.

Neither package is imported: a batch is anything with ``edge_index`` and
``num_nodes`` (and ``ptr`` or ``batch``), a molecule anything with ``GetBonds``
and ``GetNumAtoms``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import Tensor

from ..runtime.torch_compat import values_of
from .packed import _recent
from .rotors import Moving, RotorTable, Rule, _check_moving, _check_rule, rotatable_bonds

__all__ = ["rotor_tables"]


def rotor_tables(molecules: Any, *, moving: Moving = "smaller", rule: Rule = "graph") -> list[RotorTable]:
    """The cached [`RotorTable`][batched_nerf.RotorTable] of each molecule of a PyG batch or RDKit molecules.

    Accepts, without importing either package:

    * a PyTorch Geometric ``Data`` or ``Batch`` (anything with ``edge_index``
      ``(2, E)`` and ``num_nodes``; a batch's molecules from its ``ptr`` or,
      without it, its sorted ``batch`` vector): the bonds of each molecule are
      its edges (either or both directions);
    * an RDKit molecule (anything with ``GetBonds`` and ``GetNumAtoms``), or a
      sequence of them.

    Each table is [`RotorTable.from_connectivity`][batched_nerf.RotorTable.from_connectivity]'s,
    so the same molecule graph gives the same object; the same batch (the
    same ``edge_index`` and molecule boundaries) is answered from a cache of 64
    batches at the cost of hashing its edges. The list goes
    straight to [`update_torsions`][batched_nerf.update_torsions] with the
    batch's ``pos`` and ``batch``.

    Args:
        molecules: a PyG ``Data``/``Batch``, an RDKit ``Mol`` or a sequence of ``Mol``.
        moving: the side each bond turns, ``"smaller"`` or ``"larger"``.
        rule: ``"graph"`` (the peers' rule) or ``"chemistry"`` (see
            [`rotatable_bonds`][batched_nerf.rotatable_bonds]; RDKit molecules
            only: their bond orders and elements).

    Returns:
        One [`RotorTable`][batched_nerf.RotorTable] per molecule, in order.

    Raises:
        TypeError: ``molecules`` is none of these (naming its type, or the
            position of a wrong item in a sequence).
        ValueError: an edge joins two molecules of a batch (naming the edge),
            a malformed ``edge_index``, ``ptr`` or ``batch``, an unknown
            ``rule``, or ``rule="chemistry"`` for a PyG batch (it has no bond
            orders).

    Example:
        >>> import torch, batched_nerf as bn
        >>> from types import SimpleNamespace  # stands in for a torch_geometric Batch here
        >>> butane = [[0, 1], [1, 2], [2, 3]]
        >>> edges = torch.tensor(butane + [[4, 5], [5, 6]] + [[j, i] for i, j in butane]).T
        >>> data = SimpleNamespace(edge_index=edges, num_nodes=7, ptr=torch.tensor([0, 4, 7]))
        >>> [r.n_bonds for r in bn.rotor_tables(data)]
        [1, 0]
    """
    _check_moving(moving)
    _check_rule(rule)
    if hasattr(molecules, "edge_index"):
        if rule != "graph":
            raise ValueError(
                "rule='chemistry' needs bond orders, which a PyG batch does not carry: pass the RDKit "
                "molecules, or bonds=rotatable_bonds(..., rule='chemistry') to RotorTable per molecule"
            )
        return _pyg_tables(molecules, moving)
    if hasattr(molecules, "GetBonds") and hasattr(molecules, "GetNumAtoms"):
        return [_rdkit_table(molecules, moving, rule)]
    if isinstance(molecules, Sequence) and not isinstance(molecules, (str, bytes)):
        out = []
        for k, mol in enumerate(molecules):
            if not (hasattr(mol, "GetBonds") and hasattr(mol, "GetNumAtoms")):
                raise TypeError(f"molecules[{k}] must be an RDKit molecule, got {type(mol).__name__}")
            out.append(_rdkit_table(mol, moving, rule))
        return out
    raise TypeError(
        "molecules must be a torch_geometric Data/Batch (edge_index), an RDKit molecule or a "
        f"sequence of RDKit molecules, got {type(molecules).__name__}"
    )


def _rdkit_table(mol: Any, moving: Moving, rule: Rule) -> RotorTable:
    bonds = list(mol.GetBonds())
    pairs = np.asarray([(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in bonds], dtype=np.int64).reshape(
        -1, 2
    )
    n = mol.GetNumAtoms()
    chosen = None
    if rule == "chemistry":
        orders = [b.GetBondTypeAsDouble() for b in bonds]
        elements = np.asarray([a.GetAtomicNum() for a in mol.GetAtoms()], dtype=np.int64)
        chosen = rotatable_bonds(pairs, n, moving=moving, rule=rule, bond_orders=orders, elements=elements)
    return RotorTable.from_connectivity(pairs, n, bonds=chosen, moving=moving)


def _ints(values: Any, name: str) -> np.ndarray:
    """An integer-valued tensor or array-like as an int64 numpy array (also under torch.func)."""
    return values_of(values, name) if isinstance(values, Tensor) else np.asarray(values)


def _pyg_tables(data: Any, moving: Moving) -> list[RotorTable]:
    edges = _ints(data.edge_index, "edge_index")
    if edges.ndim != 2 or edges.shape[0] != 2 or not np.issubdtype(edges.dtype, np.integer):
        raise ValueError(
            f"edge_index must be (2, E) integer atom pairs, got shape {edges.shape} and dtype {edges.dtype}"
        )
    n = int(data.num_nodes)
    ptr, batch = getattr(data, "ptr", None), getattr(data, "batch", None)
    if ptr is not None:
        starts = _ints(ptr, "ptr").astype(np.int64)
    elif batch is not None:
        b = _ints(batch, "batch").astype(np.int64)
        if len(b) != n or (len(b) and ((np.diff(b) < 0).any() or b[0] < 0)):
            raise ValueError(f"batch must be {n} sorted non-negative molecule indices, one per atom")
        starts = np.searchsorted(b, np.arange((int(b[-1]) + 2) if len(b) else 1))
    else:
        starts = np.array([0, n], dtype=np.int64)
    if (
        starts.ndim != 1
        or len(starts) < 2
        or starts[0] != 0
        or starts[-1] != n
        or (np.diff(starts) < 0).any()
    ):
        raise ValueError(f"ptr must rise from 0 to the {n} atoms, got {starts.tolist()}")
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        raise ValueError(f"edge_index names atoms outside 0..{n - 1}")
    key = (edges.tobytes(), edges.shape, starts.tobytes(), moving)
    return list(_recent(_BATCH_CACHE, _BATCH_CACHE_SIZE, key, lambda: _split_batch(edges, starts, moving)))


_BATCH_CACHE: OrderedDict[tuple[Any, ...], tuple[RotorTable, ...]] = OrderedDict()
_BATCH_CACHE_SIZE = 64


def _split_batch(edges: np.ndarray, starts: np.ndarray, moving: Moving) -> tuple[RotorTable, ...]:
    """The rotor table of each molecule ``starts[m]:starts[m + 1]`` of a batch's ``(2, E)`` edges."""
    mol = np.searchsorted(starts, edges, side="right") - 1  # (2, E)
    cross = np.flatnonzero(mol[0] != mol[1])
    if len(cross):
        i, j = edges[:, cross[0]].tolist()
        raise ValueError(
            f"edge {cross[0]} ({i}, {j}) joins molecule {mol[0, cross[0]]} and molecule {mol[1, cross[0]]}"
        )
    order = np.argsort(mol[0], kind="stable")
    bounds = np.searchsorted(mol[0][order], np.arange(len(starts)))
    out = []
    for m in range(len(starts) - 1):
        local = edges[:, order[bounds[m] : bounds[m + 1]]].T - starts[m]
        pairs = np.unique(np.sort(local, axis=1), axis=0).reshape(-1, 2)
        out.append(RotorTable.from_connectivity(pairs, int(starts[m + 1] - starts[m]), moving=moving))
    return tuple(out)
