"""The one owner of derived per-table state: plans, memo entries, and the process-wide pools.

Everything the package derives from a table's rows and keeps between calls lives
in the `State` of its owner (a [`ConstructionTable`][batched_nerf.ConstructionTable],
a protein table, a packed table):

* ``plans``: the engines' build plans, one per (engine, variant, device) (the
  table decides what a plan is; `State` only keeps them);
* ``memo``: every other value derived once per owner (pose layouts, log-det masks,
  clash pair lists, protein layouts, casts, masks), made by `memo`.

Process-wide pools that are not one owner's (the CPU kernels' work buffers, the
bound torsion build's arrays) register here with their byte count and their
release (`register_pool`), so that `info` reports all of it and `release_pools`
frees it. Their idle arrays and every owner's plans share one byte budget
(`cache_budget`): each is an entry of one ledger (`keep_idle`; a plan's from
`State.keep_plan`, used again with `State.touch_plan`), least recently used
first, and past the budget the oldest entry of any kind is dropped (a plan is
made again on its next use). A `State` goes with its
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

#: The one byte budget: bytes of the pools' idle arrays and the owners' plans over the whole process
#: (`cache_budget`).
_budget = [1 << 31]


class _Idle(NamedTuple):
    """One entry of the budget, an idle array (or set of arrays) of a pool or an owner's plan: its
    bytes, its holder (weakly, None: the pool forgets it itself) and how to let go of it (called
    under `LOCK`)."""

    pool: str
    n_bytes: int
    holder: weakref.ref | None
    drop: Callable[[], None]


#: The ledger of idle pooled arrays and plans, least recently used first (changed under `LOCK` only).
_idle: OrderedDict[Hashable, _Idle] = OrderedDict()
_idle_total = [0]


class State:
    """Derived state of one owner: ``plans`` (entries of the byte budget) and ``memo``."""

    __slots__ = ("__weakref__", "_owner", "memo", "plans")

    def __init__(self, owner: Any = None) -> None:
        self.plans: dict[Hashable, Any] = {}
        self.memo: dict[Hashable, Any] = {}
        # weakly: the owner's own arrays (a table's rows) are not derived state, `info` skips them
        self._owner = None if owner is None else weakref.ref(owner)
        with _lock:
            _LIVE.add(self)

    def __reduce__(self) -> tuple[Any, ...]:  # a pickled owner carries no derived state
        return (State, ())

    def keep_plan(self, key: Hashable, plan: Any) -> None:
        """Keep ``plan`` under ``key``: an entry of the byte budget, the most recently used (its
        bytes those of its arrays and tensors, the owner's own not counted), dropped from ``plans``
        when the budget needs its bytes or once this state is gone."""
        n_bytes = nbytes(plan, self._owners_arrays())
        ref = weakref.ref(self)

        def drop() -> None:  # under LOCK; a call that holds the plan keeps it
            state = ref()
            if state is not None:
                state.plans.pop(key, None)

        self.plans[key] = plan
        with _lock:
            keep_idle(("plan", id(self), key), "plans", n_bytes, drop, holder=self)

    def touch_plan(self, key: Hashable) -> None:
        """Mark the plan under ``key`` as the most recently used entry of the budget (on every plan
        lookup, so without `LOCK`: one ``move_to_end``, atomic, which every reader of the ledger
        allows for by iterating snapshots; an entry dropped meanwhile is left dropped)."""
        try:
            _idle.move_to_end(("plan", id(self), key))
        except KeyError:
            pass

    def clear(self) -> None:
        """Drop every plan and memo entry (made again on next use)."""
        with _lock:
            for key in list(self.plans):
                take_idle(("plan", id(self), key))
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
    for key, entry in list(_idle.items()):  # a snapshot: touch_plan moves entries without the lock
        if entry.holder is not None and entry.holder() is None:
            take_idle(key)


def _trim(budget: int) -> None:
    """Drop the least recently used entries of any kind until the ledger holds at most ``budget``
    bytes, forgetting those whose holders are gone on the way (hold `LOCK`; amortised O(1) an
    entry: the ledger may hold an entry per plan of every table of a data set)."""
    while _idle_total[0] > budget and _idle:
        key, entry = next(iter(_idle.items()))
        take_idle(key)
        if entry.holder is None or entry.holder() is not None:
            entry.drop()


def idle_bytes(pool: str) -> int:
    """Bytes of ``pool``'s idle entries whose holders are alive (hold `LOCK`)."""
    _forget_freed()
    return sum(e.n_bytes for e in list(_idle.values()) if e.pool == pool)


def release_idle(pool: str) -> None:
    """Drop every idle entry of ``pool`` (hold `LOCK`)."""
    for key, entry in list(_idle.items()):
        if entry.pool != pool:
            continue
        take_idle(key)
        entry.drop()


def budget() -> int:
    """The byte budget of idle pooled arrays now (`cache_budget` sets it)."""
    return _budget[0]


def cache_budget(n_bytes: int | None = None) -> int:
    """Read or set the one byte budget of the arrays kept between calls for reuse.

    The process keeps, between calls, every table's engine plans (made on a
    table's first use of an engine) and idle arrays for reuse: the CPU
    kernels' work buffers (a ``(4, B, N)`` float64 array of cosines and sines
    per call) and the bound torsion builds' broadcast arrays. All of them
    share this budget: past it, the least recently used plan or array is
    freed first (a plan is made again on its table's next use). The default
    is 2 GiB; setting a smaller budget frees the excess at once, and ``0``
    keeps nothing between calls (every call makes its own plan and arrays:
    slower, never wrong). Each table's other cached entries (``memo``) go
    with the table or its [`release`][batched_nerf.ConstructionTable.release].

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
    bound torsion builds' arrays. The plans and the pools share one byte
    budget (2 GiB unless [`cache_budget`][batched_nerf.cache_budget] sets
    another; least recently used dropped first).

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
