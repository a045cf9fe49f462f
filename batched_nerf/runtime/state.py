"""The one owner of derived per-table state: plans, memo entries, and the process-wide pools.

Everything the package derives from a table's rows and keeps between calls lives
in the `State` of its owner (a [`ConstructionTable`][batched_nerf.ConstructionTable],
a protein table, a packed table):

* ``plans``: the engines' build plans, one per (engine, variant, device), at most
  `PLAN_CACHE_SIZE`, least recently used dropped first (the table decides what a
  plan is; `State` only keeps them);
* ``memo``: every other value derived once per owner (pose layouts, log-det masks,
  clash pair lists, protein layouts, casts, masks), made by `memo`.

Process-wide pools that are not one owner's (the CPU kernels' work buffers, the
bound torsion build's arrays) register here with their byte count and their
release (`register_pool`), so that `info` reports all of it and `release_pools`
frees it. Their idle arrays share one byte budget (`cache_budget`): each idle
array is an entry of one ledger (`keep_idle`), least recently used first, and
past the budget the oldest entry of any pool is dropped. A `State` goes with its
owner (it is an attribute of it); a pickled owner carries none (plans and memo
are rebuilt on first use, in the worker).

This module imports nothing else of the package: the layers above register with it.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch

__all__ = [
    "LOCK",
    "PLAN_CACHE_SIZE",
    "State",
    "budget",
    "cache_budget",
    "cache_info",
    "idle_bytes",
    "info",
    "keep_idle",
    "memo",
    "nbytes",
    "register_pool",
    "release_idle",
    "release_pools",
    "state_of",
    "take_idle",
    "touch_idle",
]

#: Most plans an owner keeps (engine x variant x device); the least recently used goes first.
#: Every variant of every engine on two devices fits (5 plans per device today).
PLAN_CACHE_SIZE = 16

_T = TypeVar("_T")

#: Every live `State`, for the process-wide report (weakly: a state goes with its owner).
_LIVE: weakref.WeakSet[State] = weakref.WeakSet()
#: ``name -> (held_bytes, release)`` of the process-wide pools.
_POOLS: dict[str, tuple[Callable[[], int], Callable[[], None]]] = {}
#: The one lock of derived state: `_LIVE` and `_POOLS` here, the work buffers' lists and the kept
#: torsion arrays (the pools take it as theirs). Never held while a pool's function runs, and the
#: pools never block on it from a finalizer. The states themselves are filled by the thread that
#: uses them without it: a race makes a value twice, never a wrong one.
LOCK = threading.Lock()
_lock = LOCK

#: The one byte budget: bytes of idle arrays the pools keep over the whole process (`cache_budget`).
_budget = [1 << 31]


class _Idle(NamedTuple):
    """One idle array (or set of arrays) of a pool: its bytes, its holder (weakly, None: the pool
    forgets it itself) and how the pool lets go of it (called under `LOCK`)."""

    pool: str
    n_bytes: int
    holder: weakref.ref | None
    drop: Callable[[], None]


#: The ledger of idle pooled arrays, least recently used first (changed under `LOCK` only).
_idle: OrderedDict[Hashable, _Idle] = OrderedDict()
_idle_total = [0]


class State:
    """Derived state of one owner: ``plans`` (bounded, least recently used first out) and ``memo``."""

    __slots__ = ("__weakref__", "_owner", "memo", "plans")

    def __init__(self, owner: Any = None) -> None:
        self.plans: OrderedDict[Hashable, Any] = OrderedDict()
        self.memo: dict[Hashable, Any] = {}
        # weakly: the owner's own arrays (a table's rows) are not derived state, `info` skips them
        self._owner = None if owner is None else weakref.ref(owner)
        with _lock:
            _LIVE.add(self)

    def __reduce__(self) -> tuple[Any, ...]:  # a pickled owner carries no derived state
        return (State, ())

    def keep_plan(self, key: Hashable, plan: Any) -> None:
        """Keep ``plan`` under ``key`` as the most recent; drop the oldest past `PLAN_CACHE_SIZE`."""
        self.plans[key] = plan
        self.plans.move_to_end(key)
        while len(self.plans) > PLAN_CACHE_SIZE:
            self.plans.popitem(last=False)

    def clear(self) -> None:
        """Drop every plan and memo entry (made again on next use)."""
        self.plans.clear()
        self.memo.clear()

    def info(self) -> dict[str, int]:
        """``{"plans", "plan_bytes", "memo", "memo_bytes"}``: counts and bytes held (arrays and tensors
        reachable from the values, each storage counted once, the owner's own not at all)."""
        seen = self._owners_arrays()
        return {
            "plans": len(self.plans),
            "plan_bytes": sum(nbytes(v, seen) for v in list(self.plans.values())),
            "memo": len(self.memo),
            "memo_bytes": sum(nbytes(v, seen) for v in list(self.memo.values())),
        }

    def _owners_arrays(self) -> set[object]:
        """A `nbytes` ``seen`` set holding the owner's own arrays (a plan that keeps its table's
        topology does not count the rows)."""
        seen: set[object] = set()
        owner = None if self._owner is None else self._owner()
        if owner is not None:
            nbytes(owner, seen)
        return seen


def state_of(owner: Any) -> State:
    """The `State` of ``owner``, made on first use (kept in its ``__dict__``, also of a frozen dataclass)."""
    d = owner.__dict__
    state = d.get("_state")
    if state is None:
        state = d["_state"] = State(owner)
    return state


def memo(owner: Any, key: Hashable, make: Callable[[], _T]) -> _T:
    """``make()`` once per ``owner`` and ``key``; the kept value from then on."""
    values = state_of(owner).memo
    try:
        return values[key]
    except KeyError:
        value = values[key] = make()
        return value


def register_pool(name: str, held_bytes: Callable[[], int], release: Callable[[], None]) -> None:
    """Report a process-wide pool (work buffers, kept arrays) in `info` and free it in `release_pools`."""
    with _lock:
        _POOLS[name] = (held_bytes, release)


def release_pools() -> None:
    """Free every registered pool's idle memory now."""
    with _lock:
        pools = list(_POOLS.values())
    for _, release in pools:
        release()


def keep_idle(
    key: Hashable, pool: str, n_bytes: int, drop: Callable[[], None], holder: object = None
) -> None:
    """Enter an idle array of ``pool`` as the most recently used (replacing an entry of the same
    ``key``), then drop the oldest entries past the budget (hold `LOCK`).

    ``drop()`` lets go of the array when the budget needs its bytes (it must not take `LOCK`);
    with a ``holder``, the entry also goes, without ``drop``, once the holder is freed."""
    take_idle(key)
    ref = None if holder is None else weakref.ref(holder)
    _idle[key] = _Idle(pool, int(n_bytes), ref, drop)
    _idle_total[0] += int(n_bytes)
    _trim(_budget[0])


def touch_idle(key: Hashable) -> None:
    """Mark ``key``'s entry as the most recently used, if it is there (hold `LOCK`)."""
    if key in _idle:
        _idle.move_to_end(key)


def take_idle(key: Hashable) -> None:
    """Remove ``key``'s entry without dropping its array (back in use, or its holder let it go; hold
    `LOCK`)."""
    entry = _idle.pop(key, None)
    if entry is not None:
        _idle_total[0] -= entry.n_bytes


def _forget_freed() -> None:
    """Remove the entries whose holders are gone (hold `LOCK`)."""
    for key in [k for k, e in _idle.items() if e.holder is not None and e.holder() is None]:
        take_idle(key)


def _trim(budget: int) -> None:
    """Drop the least recently used entries of any pool until the ledger holds at most ``budget``
    bytes (hold `LOCK`)."""
    if _idle_total[0] <= budget:
        return
    _forget_freed()
    for key in list(_idle):
        if _idle_total[0] <= budget:
            break
        entry = _idle[key]
        take_idle(key)
        entry.drop()


def idle_bytes(pool: str) -> int:
    """Bytes of ``pool``'s idle entries whose holders are alive (hold `LOCK`)."""
    _forget_freed()
    return sum(e.n_bytes for e in _idle.values() if e.pool == pool)


def release_idle(pool: str) -> None:
    """Drop every idle entry of ``pool`` (hold `LOCK`)."""
    for key in [k for k, e in _idle.items() if e.pool == pool]:
        entry = _idle[key]
        take_idle(key)
        entry.drop()


def budget() -> int:
    """The byte budget of idle pooled arrays now (`cache_budget` sets it)."""
    return _budget[0]


def cache_budget(n_bytes: int | None = None) -> int:
    """Read or set the one byte budget of the arrays kept between calls for reuse.

    Beside each table's own plans and memo entries (bounded per table and freed
    with it), the process keeps idle arrays for reuse: the CPU kernels' work
    buffers (a ``(4, B, N)`` float64 array of cosines and sines per call) and
    the bound torsion builds' broadcast arrays. All of them share this budget:
    past it, the least recently used array of any pool is freed first. The
    default is 2 GiB; setting a smaller budget frees the excess at once, and
    ``0`` keeps nothing idle (every call makes its own arrays: slower for
    large batches, never wrong).

    Args:
        n_bytes: the new budget in bytes (a non-negative ``int``), or None to
            only read it.

    Returns:
        The budget in bytes before the call.

    Raises:
        TypeError: ``n_bytes`` is not an integer.
        ValueError: ``n_bytes`` is negative.

    Example:
        >>> import batched_nerf as bn
        >>> old = bn.cache_budget(256 << 20)  # at most 256 MiB idle from now on
        >>> bn.cache_budget() == 256 << 20
        True
        >>> _ = bn.cache_budget(old)
    """
    previous = _budget[0]
    if n_bytes is None:
        return previous
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, (int, np.integer)):
        raise TypeError(f"cache_budget takes a number of bytes (int), got {type(n_bytes).__name__}")
    if n_bytes < 0:
        raise ValueError(f"cache_budget takes a non-negative number of bytes, got {n_bytes}")
    with _lock:
        _budget[0] = int(n_bytes)
        _trim(_budget[0])
    return previous


def cache_info() -> dict[str, int]:
    """What the whole process keeps between calls: counts and bytes.

    Every table (and protein table) keeps what it derives from its rows in one
    state: engine plans and memo entries, see
    [`ConstructionTable.cache_info`][batched_nerf.ConstructionTable.cache_info]. Beside
    them the process keeps two pools of idle arrays for reuse: the CPU kernels'
    work buffers (at most 2 idle per table, freed with their table) and the
    bound torsion builds' arrays, under one byte budget (2 GiB unless
    [`cache_budget`][batched_nerf.cache_budget] sets another; least recently
    used dropped first).

    Returns:
        ``{"owners", "plans", "plan_bytes", "memo", "memo_bytes", ...}``: live
        states (one per table topology and per protein table), their plans and
        memo entries with the bytes of the arrays and tensors they hold (each
        storage counted once, device memory included), and a ``"<pool>_bytes"``
        entry per pool in use (``"work_buffers_bytes"``; ``"torsion_arrays_bytes"``
        once `batched_nerf.protein` is imported).

    Example:
        >>> import batched_nerf as bn
        >>> table = bn.ConstructionTable.chain(50).prepare()
        >>> info = bn.cache_info()
        >>> info["plans"] >= 1 and info["plan_bytes"] > 0
        True
    """
    return info()


def info() -> dict[str, int]:
    """Process-wide counts and bytes: live owners, their plans and memo entries, each pool's bytes."""
    with _lock:
        states = list(_LIVE)
        pools = dict(_POOLS)
    out = {"owners": len(states), "plans": 0, "plan_bytes": 0, "memo": 0, "memo_bytes": 0}
    seen: set[object] = set()
    for state in states:  # the owners' own arrays first: not derived state, counted nowhere
        seen |= state._owners_arrays()
    for state in states:
        plans, values = list(state.plans.values()), list(state.memo.values())
        out["plans"] += len(plans)
        out["plan_bytes"] += sum(nbytes(v, seen) for v in plans)
        out["memo"] += len(values)
        out["memo_bytes"] += sum(nbytes(v, seen) for v in values)
    for name, (held, _) in sorted(pools.items()):
        out[f"{name}_bytes"] = int(held())
    return out


def nbytes(value: Any, seen: set[object] | None = None, depth: int = 8) -> int:
    """Bytes of the arrays and tensors reachable from ``value`` (containers, dataclasses, named
    tuples, objects' attributes; each storage once per ``seen``, which holds the ids of objects
    that stay alive during the count, and the data addresses of storages)."""
    seen = set() if seen is None else seen
    if depth < 0 or id(value) in seen or isinstance(value, State):  # a state is counted as its own
        return 0
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        if value.is_nested or value.layout != torch.strided:
            return 0
        storage = value.untyped_storage()
        key = ("storage", value.device, storage.data_ptr())
        if key in seen or storage.nbytes() == 0:
            return 0
        seen.add(key)
        return int(storage.nbytes())
    if isinstance(value, np.ndarray):
        base = value
        while isinstance(base.base, np.ndarray):
            base = base.base
        key = ("array", base.__array_interface__["data"][0])
        if key in seen or base.nbytes == 0:
            return 0
        seen.add(key)
        return int(base.nbytes)
    if isinstance(value, (str, bytes, int, float, bool, type(None), torch.device, torch.dtype, type)):
        return 0
    if isinstance(value, dict):
        items: Any = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    elif dataclasses.is_dataclass(value):
        items = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    elif hasattr(value, "__dict__"):
        items = list(vars(value).values())
    else:
        items = [getattr(value, s, None) for s in getattr(type(value), "__slots__", ())]
    return sum(nbytes(item, seen, depth - 1) for item in items)  # (items is alive until then)
