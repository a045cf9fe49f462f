"""Reusable float64 work buffers of the CPU kernels, a few per table.

A call of the fused CPU build makes a ``(4, B, N)`` float64 array of the
cosines and sines of its angles and dihedrals (`build.trig`). A fresh
array that large is fresh memory, and its first touch costs a page fault per
4 KiB (glibc hands every block past 32 MiB back to the kernel when it is freed,
so a loop of such calls faults on every one): for AdK's first 40 residues with
hydrogens (613 atoms) x 9,800 frames (188 MiB) the trig pass took 20-24 ms into
a new array against 9-12 ms into a reused one, of a 90-110 ms build. So the
array comes from buffers kept with the table (its
[`Topology`][batched_nerf.Topology], weakly: they go when the table does):

* `borrowed`: for the length of a ``with`` block (a call with nothing to
  differentiate, or scratch a backward reads and drops at once);
* `lease`: for as long as the returned `Lease` lives (a call with a
  gradient keeps its trig array for its backward: the lease lives on the
  autograd graph's `Turns`, and the buffer comes back when the
  graph is freed).

Bounds: only arrays of at least `MIN_BYTES` (smaller ones come from the
allocator's heap cheaply) and at most `MAX_BYTES`; each table keeps at
most `KEEP` idle buffers, the largest ones (a buffer in use is not kept
twice: a concurrent call, or a second graph alive at once, takes another or a
new one), and the idle buffers of all tables are entries of the process's
one ledger of idle arrays (`runtime.state.keep_idle`), under its one byte
budget (`batched_nerf.cache_budget`): past it the least recently returned go
first. `release` drops every idle buffer now.
"""

from __future__ import annotations

import functools
import weakref
from contextlib import AbstractContextManager

import numpy as np

from ...runtime.state import LOCK, idle_bytes, keep_idle, register_pool, release_idle, take_idle

__all__ = [
    "KEEP",
    "MAX_BYTES",
    "MIN_BYTES",
    "Lease",
    "borrowed",
    "held_bytes",
    "lease",
    "release",
]

#: Arrays smaller than this are made per call.
MIN_BYTES = 1 << 20
#: Arrays larger than this are made per call (and never kept).
MAX_BYTES = 1 << 30
#: Idle buffers kept per table: a training step's graph holds one trig array while its backward borrows
#: scratch, and a loop that keeps the last loss while it builds the next has two graphs alive.
KEEP = 2
#: The pool's name in the ledger and in `batched_nerf.cache_info`.
POOL = "work_buffers"


class _Slot:
    """One table's idle buffers (``dead``: its table is gone, buffers coming back are dropped)."""

    __slots__ = ("dead", "idle")

    def __init__(self) -> None:
        self.idle: list[np.ndarray] = []
        self.dead = False


# Every list and count below changes under ``_lock`` only, except the two inboxes: a buffer given back
# and a table freed may come from a finalizer, which may run on any thread, also inside a collection
# that an allocation under ``_lock`` started on the thread holding it; those append to an inbox (atomic
# under the GIL), and whoever holds the lock next settles it.
_lock = LOCK  # the one lock of derived state (runtime.state)
#: ``id(owner)`` -> its slot (by identity: an owner may be any object that takes a weak reference, a
#: tensor too, whose ``==`` a weak-key dictionary would call).
_slots: dict[int, _Slot] = {}
_returned: list[tuple[_Slot, np.ndarray]] = []  # inbox: buffers given back
_freed: list[int] = []  # inbox: ids of owners freed


def _drop(slot: _Slot, buffer: np.ndarray) -> None:
    """Let go of idle ``buffer`` (the ledger's entry is gone or goes now; hold ``_lock``)."""
    k = next(k for k, b in enumerate(slot.idle) if b is buffer)  # by identity: ``==`` is elementwise
    del slot.idle[k]


def _forget(slot: _Slot, buffer: np.ndarray) -> None:
    """Drop ``buffer`` from the idle ones and from the ledger (hold ``_lock``)."""
    _drop(slot, buffer)
    take_idle((POOL, id(buffer)))


def _settle() -> None:
    """Take in the inboxes, then keep within `KEEP` per table (the ledger keeps the byte budget;
    hold ``_lock``)."""
    while _freed:
        slot = _slots.pop(_freed.pop(), None)
        if slot is not None:
            slot.dead = True
            for buffer in list(slot.idle):
                _forget(slot, buffer)
    while _returned:
        slot, buffer = _returned.pop()
        if slot.dead:
            continue
        slot.idle.append(buffer)
        if len(slot.idle) > KEEP:  # the smallest goes
            smallest = min(slot.idle, key=lambda b: b.nbytes)
            if smallest is not buffer:
                take_idle((POOL, id(smallest)))
            _drop(slot, smallest)
            if smallest is buffer:
                continue
        keep_idle((POOL, id(buffer)), POOL, buffer.nbytes, functools.partial(_drop, slot, buffer))


def _in_bounds(n_bytes: int) -> bool:
    """Whether an array of ``n_bytes`` is kept (`MIN_BYTES` to `MAX_BYTES`)."""
    return MIN_BYTES <= n_bytes <= MAX_BYTES


def _take(owner: object, n_values: int) -> tuple[_Slot, np.ndarray]:
    """``owner``'s smallest idle buffer of at least ``n_values`` float64 values (no longer idle), else a
    new one of ``n_values`` (the caller checked `_in_bounds`)."""
    with _lock:
        _settle()
        slot = _slots.get(id(owner))
        if slot is None:
            slot = _slots[id(owner)] = _Slot()
            weakref.finalize(owner, _freed.append, id(owner)).atexit = False
        fits = [b for b in slot.idle if b.size >= n_values]
        buffer = min(fits, key=lambda b: b.size) if fits else None
        if buffer is not None:
            _forget(slot, buffer)
    return slot, np.empty(n_values) if buffer is None else buffer


def _give(slot: _Slot, buffer: np.ndarray) -> None:
    """Give ``buffer`` back to ``slot``: into the inbox, settled now unless the lock is held."""
    _returned.append((slot, buffer))
    if _lock.acquire(blocking=False):
        try:
            _settle()
        finally:
            _lock.release()


class _Borrowed:
    """The context manager `borrowed` returns (a class: cheaper per call than a generator)."""

    __slots__ = ("_dtype", "_n", "_owner", "_taken")

    def __init__(self, owner: object, n_values: int, dtype: np.dtype) -> None:
        self._owner, self._n, self._dtype, self._taken = owner, n_values, dtype, None

    def __enter__(self) -> np.ndarray:
        self._taken = _take(self._owner, -(-self._n * self._dtype.itemsize // 8))
        return self._taken[1].view(self._dtype)[: self._n]

    def __exit__(self, *exc: object) -> None:
        if self._taken is not None:
            _give(*self._taken)
            self._taken = None


class _Nothing:
    """`borrowed` outside the bounds: yields None (one shared instance)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NOTHING = _Nothing()


def borrowed(
    owner: object, n_values: int, dtype: np.dtype | type = np.float64
) -> AbstractContextManager[np.ndarray | None]:
    """A flat array of ``n_values`` of ``dtype`` (float64 by default, or float32) kept with ``owner`` (a
    table's topology), or None, as a context manager (``with borrowed(owner, n) as buf``).

    None (the caller makes its own array) outside the bounds of the module
    docstring. The array is valid inside the ``with`` block only.

    Example:
        >>> import numpy as np, batched_nerf as bn
        >>> from batched_nerf.engines.fused import workspace
        >>> topo = bn.ConstructionTable.chain(4).topology
        >>> with workspace.borrowed(topo, 1 << 18) as buf:
        ...     buf.shape, buf.dtype
        ((262144,), dtype('float64'))
        >>> with workspace.borrowed(topo, 1 << 19, np.float32) as buf32:  # the same bytes
        ...     buf32.shape, buf32.dtype
        ((524288,), dtype('float32'))
        >>> with workspace.borrowed(topo, 10) as small:
        ...     small is None
        True
    """
    dtype = np.dtype(dtype)
    if not _in_bounds(n_values * dtype.itemsize):
        return _NOTHING
    return _Borrowed(owner, n_values, dtype)


class Lease:
    """A buffer of `lease`: ``array`` is valid while this object lives; its memory goes back to the
    table's idle buffers when it is freed (nothing else may keep ``array`` or a view of it)."""

    __slots__ = ("_buffer", "_slot", "array")

    def __init__(self, slot: _Slot, buffer: np.ndarray, n_values: int) -> None:
        self._slot, self._buffer, self.array = slot, buffer, buffer[:n_values]

    def __del__(self) -> None:
        _give(self._slot, self._buffer)


def lease(owner: object, n_values: int) -> Lease | None:
    """A `Lease` of a float64 array of ``n_values`` kept with ``owner``, or None (outside the
    bounds: the caller makes its own array).

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf.engines.fused import workspace
        >>> topo = bn.ConstructionTable.chain(4).topology
        >>> held = workspace.lease(topo, 1 << 18)
        >>> held.array.shape, held.array.dtype
        ((262144,), dtype('float64'))
        >>> address = held.array.ctypes.data
        >>> del held  # back with the table: the next lease reuses its memory
        >>> workspace.lease(topo, 1 << 18).array.ctypes.data == address
        True
    """
    if not _in_bounds(8 * n_values):
        return None
    return Lease(*_take(owner, n_values), n_values)


def held_bytes() -> int:
    """Bytes of the idle buffers kept for the tables alive now (within the ledger's budget)."""
    with _lock:
        _settle()
        return idle_bytes(POOL)


def release() -> None:
    """Drop every idle buffer (buffers in use come back to their tables when their calls end)."""
    with _lock:
        _settle()
        release_idle(POOL)


register_pool(POOL, held_bytes, release)
