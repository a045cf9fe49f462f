"""Reusable float64 work buffers of the CPU kernels, one per table, for calls with nothing to differentiate.

A call of the fused CPU build makes a ``(4, B, N)`` float64 array of the
cosines and sines of its angles and dihedrals (:func:`.build.trig`). A fresh
array that large is fresh memory, and its first touch costs a page fault per
4 KiB: for AdK's first 40 residues with hydrogens (613 atoms) x 9,800 frames
(188 MiB) the trig pass took 20-24 ms into a new array against 9-12 ms into a
reused one, of a 90-110 ms build. So a call whose array is not kept for a
backward pass (no gradient, tangent or ``torch.func`` wrapper) borrows one
buffer kept with the table (its :class:`~batched_nerf._topology.Topology`,
weakly: the buffer goes when the table does), grown to the largest such call.

Bounds: only arrays of at least :data:`MIN_BYTES` (smaller ones come from the
allocator's heap cheaply) and at most :data:`MAX_BYTES`; one call at a time
per table (a concurrent call from another thread makes its own array).
:func:`release` drops every buffer now.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

__all__ = ["MAX_BYTES", "MIN_BYTES", "borrowed", "held_bytes", "release"]

#: Arrays smaller than this are made per call.
MIN_BYTES = 1 << 20
#: Arrays larger than this are made per call (and never kept).
MAX_BYTES = 1 << 30


class _Slot:
    __slots__ = ("buffer", "lock")

    def __init__(self) -> None:
        self.buffer = np.empty(0)
        self.lock = threading.Lock()


_slots: weakref.WeakKeyDictionary[object, _Slot] = weakref.WeakKeyDictionary()
_slots_lock = threading.Lock()


@contextmanager
def borrowed(owner: object, n_values: int) -> Iterator[np.ndarray | None]:
    """A float64 array of ``n_values`` kept with ``owner`` (a table's topology), or None.

    None (the caller makes its own array) outside the bounds of the module
    docstring, or while another call holds ``owner``'s buffer. The array is
    valid inside the ``with`` block only.

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf.engines.fused import workspace
        >>> topo = bn.ConstructionTable.chain(4).topology
        >>> with workspace.borrowed(topo, 1 << 18) as buf:
        ...     buf.shape, buf.dtype
        ((262144,), dtype('float64'))
        >>> with workspace.borrowed(topo, 10) as small:
        ...     small is None
        True
    """
    if not MIN_BYTES <= 8 * n_values <= MAX_BYTES:
        yield None
        return
    with _slots_lock:
        slot = _slots.get(owner)
        if slot is None:
            slot = _slots[owner] = _Slot()
    if not slot.lock.acquire(blocking=False):
        yield None
        return
    try:
        if slot.buffer.size < n_values:
            slot.buffer = np.empty(0)  # free the old one before making the larger one
            slot.buffer = np.empty(n_values)
        yield slot.buffer[:n_values]
    finally:
        slot.lock.release()


def held_bytes() -> int:
    """Bytes held by the buffers of the tables alive now."""
    with _slots_lock:
        return sum(slot.buffer.nbytes for slot in _slots.values())


def release() -> None:
    """Drop every buffer (the next large call of each table makes a new one)."""
    with _slots_lock:
        for slot in _slots.values():
            with slot.lock:
                slot.buffer = np.empty(0)
