r"""Per-atom values <-> compact entries: the flow layer's layout, as a pair of linear autograd functions.

The flow layer ([`InternalCoordinateTransform`][batched_nerf.InternalCoordinateTransform]) keeps only the
informative internal coordinates, ordered by atom: the bonds of the atoms with a
bond reference, and so on. `gather` picks them out of ``(..., N)`` per-atom
values; `spread` puts ``(..., E)`` entries back, zero at the other atoms.
The two maps are each other's adjoints, so each one's backward is the other.
Both are linear, so they are differentiable to any order (``vmap``, ``jvp``).
Autograd through slices of the values would instead zero-fill an ``(..., E)``
array per slice and add them up: on alanine dipeptide x 4,096 that backward cost
1.5 ms of the flow layer's inverse, against ~0.1 ms for one ``cat``.

Each map is a copy, computed by whichever is fastest, with the same bits: a view
where the entries are one run of consecutive atoms (`gather`); on the CPU, where
the gate routes the call plain (inside the two Functions, on their tangents and
cotangents) and numba is installed, one pass of the CPU backend's copies
(`batched_nerf.engines.fused.cpu.entries`); otherwise torch: one ``index_select``
(`gather`), a ``cat`` of a few slices or one ``index_copy`` (`spread`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..engines.backends import available, require
from ..engines.function import linear_pair
from ..engines.fused.arrays import numpy_view
from ..runtime import gate

__all__ = ["EntryLayout", "gather", "spread"]

#: Entries of at most this many runs of consecutive atoms are spread by a ``cat`` of slices, not
#: ``index_copy``: ~80 us against ~100 us (alanine dipeptide x 4,096; both slow on a short last
#: dimension). Gathered, they are a view (one run) or one ``index_select``, which measured
#: 150-160 us against 190-250 us for a ``cat`` of their slices (the same rows, 2 threads, each
#: right after the inverse kernel).
MAX_RUNS = 8


def _runs(atoms: np.ndarray) -> tuple[tuple[int, int], ...] | None:
    """``((lo, hi), ...)``: ``atoms`` (ascending) as runs of consecutive atoms (``None``: more than
    `MAX_RUNS`)."""
    if atoms.size == 0:
        return ()
    cut = np.flatnonzero(np.diff(atoms) != 1) + 1
    lo, hi = atoms[np.r_[0, cut]], atoms[np.r_[cut - 1, atoms.size - 1]] + 1
    return tuple(zip(lo.tolist(), hi.tolist())) if lo.size <= MAX_RUNS else None


@dataclass(frozen=True, eq=False)
class EntryLayout:
    """Which of ``n_atoms`` atoms carry an entry: ``atoms`` ``(E,)`` ascending (a long tensor, on the
    device of the values), and the same as runs of consecutive atoms (``None``: too many runs)."""

    atoms: Tensor
    runs: tuple[tuple[int, int], ...] | None
    n_atoms: int

    @classmethod
    def of(cls, atoms: Tensor, n_atoms: int) -> EntryLayout:
        """The layout of ``atoms`` (``(E,)``, ascending, distinct) among ``n_atoms`` atoms."""
        return cls(atoms, _runs(atoms.cpu().numpy()), int(n_atoms))


def _kernels(x: Tensor) -> Any:
    """The CPU backend's entry copies (`batched_nerf.engines.fused.cpu.entries`) where they serve
    ``x``: a CPU float32/float64 tensor the gate routes plain (no gradient kept, no transform:
    inside the maps' Functions, on their tangents and cotangents), numba installed; else None."""
    if x.numel() and gate.kernel_inputs(x) and gate.plain(x) and available("cpu"):
        return require("cpu").entries
    return None


def _gather(values: Tensor, layout: EntryLayout) -> Tensor:
    runs = layout.runs
    if runs is not None and len(runs) <= 1:
        return values[..., runs[0][0] : runs[0][1]] if runs else values[..., :0]
    kernels = _kernels(values)
    if kernels is not None:
        out = kernels.gather(numpy_view(values).reshape(-1, values.shape[-1]), layout.atoms.numpy())
        return torch.from_numpy(out).reshape(*values.shape[:-1], -1)
    return values.index_select(-1, layout.atoms)


def _spread(entries: Tensor, layout: EntryLayout) -> Tensor:
    runs, n = layout.runs, layout.n_atoms
    kernels = _kernels(entries)
    if kernels is not None:
        out = kernels.spread(numpy_view(entries).reshape(-1, entries.shape[-1]), layout.atoms.numpy(), n)
        return torch.from_numpy(out).reshape(*entries.shape[:-1], n)
    if runs is None:
        full = entries.new_zeros((*entries.shape[:-1], n))
        return full.index_copy(-1, layout.atoms, entries)
    zero = entries.new_zeros(()).expand(*entries.shape[:-1], n)
    pieces, at, k = [], 0, 0  # at: next atom; k: next entry
    for lo, hi in runs:
        pieces += [zero[..., at:lo], entries[..., k : k + hi - lo]]
        at, k = hi, k + hi - lo
    pieces.append(zero[..., at:n])
    return torch.cat([p for p in pieces if p.shape[-1]], -1)


_Gather, _Spread = linear_pair(("Gather", "Spread"), _gather, _spread, module=__name__)


def gather(values: Tensor, layout: EntryLayout) -> Tensor:
    """The entries of ``values`` ``(..., N)``: ``(..., E)``, entry ``e`` the value of atom
    ``layout.atoms[e]`` (a view where the entries are one run of atoms).

    Example:
        >>> import torch
        >>> from batched_nerf.learning.entries import EntryLayout, gather
        >>> layout = EntryLayout.of(torch.tensor([0, 2, 3]), 5)
        >>> gather(torch.arange(10.0).reshape(2, 5), layout)
        tensor([[0., 2., 3.],
                [5., 7., 8.]])
    """
    if layout.runs is not None and len(layout.runs) <= 1:  # a view: its backward is one copy
        return _gather(values, layout)
    return _Gather.apply(values, layout)


def spread(entries: Tensor, layout: EntryLayout) -> Tensor:
    """``(..., E)`` entries -> ``(..., N)`` per-atom values, zero at atoms without an entry (the
    adjoint of `gather`).

    Example:
        >>> import torch
        >>> from batched_nerf.learning.entries import EntryLayout, spread
        >>> spread(torch.tensor([1.0, 2.0, 3.0]), EntryLayout.of(torch.tensor([0, 2, 3]), 5))
        tensor([1., 0., 2., 3., 0.])
    """
    return _Spread.apply(entries, layout)
