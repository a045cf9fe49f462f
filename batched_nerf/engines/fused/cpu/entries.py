"""The flow layer's entry copies (numba): per-atom rows <-> compact entries of some of the atoms.

`gather` reads the entries ``(M, E)`` of rows ``(M, N)`` at their atoms, `spread` writes them
back into zeroed rows: plain copies, so bitwise what the torch maps of
`batched_nerf.learning.entries` give, in one pass over the rows. On a short last dimension
torch's ``index_select`` and ``cat`` of slices cost more (alanine dipeptide x 4,096, float32, 2
threads, with the calls around them: the three kinds spread in 219 us against 340 us for torch's
``cat``s right after a build, gathered in 154 us against 197 us for its ``index_select``s).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import threads

__all__ = ["gather", "spread"]

#: Below this many values (of the rows) a call runs on the calling thread (`WORKQUEUE_SERIAL_VALUES`
#: on numba's ``workqueue``, `threads.serial_bound`).
SERIAL_VALUES = 32768
WORKQUEUE_SERIAL_VALUES = 8 * SERIAL_VALUES


@njit(cache=True)
def _gather_items(t, nt, values, atoms, out):
    m = values.shape[0]
    for i in range(m * t // nt, m * (t + 1) // nt):
        for k in range(atoms.size):
            out[i, k] = values[i, atoms[k]]


@njit(cache=True, parallel=True)
def _gather_parallel(values, atoms, out, nt):
    for t in prange(nt):
        _gather_items(t, nt, values, atoms, out)


@njit(cache=True)
def _spread_items(t, nt, entries, atoms, out):
    m = entries.shape[0]
    for i in range(m * t // nt, m * (t + 1) // nt):
        for k in range(atoms.size):
            out[i, atoms[k]] = entries[i, k]


@njit(cache=True, parallel=True)
def _spread_parallel(entries, atoms, out, nt):
    for t in prange(nt):
        _spread_items(t, nt, entries, atoms, out)


def gather(values: np.ndarray, atoms: np.ndarray) -> np.ndarray:
    """``(M, E)`` entries ``values[:, atoms]`` of C-contiguous ``(M, N)`` rows; ``atoms`` ``(E,)``
    int64, distinct, in ``[0, N)``."""
    out = np.empty((values.shape[0], atoms.size), dtype=values.dtype)
    nt = threads.count(values.size, values.shape[0], SERIAL_VALUES, WORKQUEUE_SERIAL_VALUES)
    threads.launch(_gather_items, _gather_parallel, nt, values, atoms, out)
    return out


def spread(entries: np.ndarray, atoms: np.ndarray, n_atoms: int) -> np.ndarray:
    """``(M, n_atoms)`` rows, zero but at ``atoms`` ``(E,)`` (int64, distinct, in ``[0, n_atoms)``),
    where they hold the C-contiguous ``(M, E)`` ``entries``."""
    out = np.zeros((entries.shape[0], n_atoms), dtype=entries.dtype)  # calloc: zeroed pages
    nt = threads.count(out.size, entries.shape[0], SERIAL_VALUES, WORKQUEUE_SERIAL_VALUES)
    threads.launch(_spread_items, _spread_parallel, nt, entries, atoms, out)
    return out
