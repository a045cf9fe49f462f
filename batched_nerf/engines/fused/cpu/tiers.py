"""Tiered compilation of the blocked kernels: compiled when they are cached, or once they would pay.

The CPU backend has two layouts of each kernel (`build`, `inverse`): per sample,
which serves every call, and blocked (samples innermost, SIMD), 2-6x faster from
`build.BLOCK_MIN` samples on but also the larger cold compile (the committor pattern
on alanine dipeptide: 10-16 s for the per-sample kernels, then 24-40 s more for the
blocked ones at 64 samples, on the 2-core benchmark machine). So a call the dispatch rule
gives to a blocked kernel takes it when:

* it is compiled in this process, or numba's on-disk cache holds it for these argument types
  (after [`batched_nerf.warmup`][batched_nerf.warmup], or any earlier process that compiled it): loading costs
  milliseconds;
* or the per-sample kernels have run `TIER_UP_SECONDS` on calls that kernel would have
  served (then it compiles, announced by a WARNING on the logger ``batched_nerf``): a job that
  runs long enough for the faster kernel to matter gets it after a bounded delay, and a short
  script never pays its compile (the ski-rental rule of tiered JIT compilers);
* or tiering is off: ``BATCHED_NERF_TIERED=0`` in the environment (read at import; off:
  ``0``, ``false``, ``no``, ``off``, ``disabled``; on, the default: ``1``, ``true``, ``yes``,
  ``on``, ``enabled``; any other value raises a ``ValueError`` naming them), or
  `always` (what `batched_nerf.warmup` and the test suite use).

Each blocked entry kernel and dtype keeps its own state. The two layouts run the same
operations in the same order, so their results are the same bits (tested, also across an
empty and a warm disk cache in two processes): the switch changes speed, never values.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["TIER_UP_SECONDS", "always", "disabled", "ready", "report", "run", "timed"]

LOGGER = logging.getLogger("batched_nerf")
#: Seconds of per-sample kernel time, on calls a blocked kernel would have served, after which
#: that blocked kernel compiles (about a third of its cold compile: measured 24-40 s for the
#: blocked family of the committor pattern).
TIER_UP_SECONDS = 10.0

_lock = threading.Lock()
#: (kernel, dtype) -> True (may run) or the per-sample seconds spent so far
_state: dict[tuple[Any, str], Any] = {}
#: The spellings of ``BATCHED_NERF_TIERED`` (case-insensitive): tiering on, tiering off.
ON = ("1", "true", "yes", "on", "enabled")
OFF = ("0", "false", "no", "off", "disabled")


def _tiering_off(value: str | None) -> bool:
    """Whether ``BATCHED_NERF_TIERED=value`` turns tiering off (unset or empty: on).

    Raises:
        ValueError: a value that is none of `ON` and `OFF` (naming them).
    """
    word = (value or "").strip().lower()
    if word in OFF:
        return True
    if word in ON or not word:
        return False
    raise ValueError(
        f"BATCHED_NERF_TIERED={value!r} is not understood: use one of {', '.join(ON)} (tiered "
        f"compilation on, the default) or {', '.join(OFF)} (off: every blocked kernel compiles "
        "when first picked)"
    )


_always = _tiering_off(os.environ.get("BATCHED_NERF_TIERED"))


@contextlib.contextmanager
def always(enabled: bool = True) -> Iterator[None]:
    """Within the block, every blocked kernel may run (compiling where needed), as without tiering.

    On leaving it, kernels still waiting for their tier are asked again at their next call, so
    that what the block compiled ([`batched_nerf.warmup`][batched_nerf.warmup]) runs at once afterwards.
    """
    global _always
    before, _always = _always, enabled
    try:
        yield
    finally:
        _always = before
        with _lock:
            for key in [k for k, v in _state.items() if v is not True]:
                del _state[key]


def disabled() -> bool:
    """Whether tiering is off here (``BATCHED_NERF_TIERED=0``, or inside `always`)."""
    return _always


def report() -> dict[str, str]:
    """``"kernel (dtype)" -> "blocked"`` or ``"per sample (x s of TIER_UP_SECONDS)"`` for every blocked
    kernel a call has asked for in this process: what such a call runs now (either gives the same bits)."""
    with _lock:
        items = list(_state.items())
    out = {}
    for (kernel, dtype), state in items:
        name = f"{getattr(getattr(kernel, 'py_func', kernel), '__name__', kernel)} ({dtype})"
        out[name] = "blocked" if state is True else f"per sample ({state:.1f} s of {TIER_UP_SECONDS:g} s)"
    return out


def _cached(kernel: Any, args: tuple[Any, ...]) -> bool:
    """Whether ``kernel`` runs on ``args`` without compiling: in memory, or in numba's disk cache."""
    try:
        sig = tuple(kernel.typeof_pyval(a) for a in args)
        if sig in kernel.overloads:
            return True
        cache = kernel._cache
        if type(cache).__name__ == "NullCache":
            return False
        key = cache._index_key(sig, kernel.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:  # pragma: no cover - numba internals changed: no tiering (compile as before)
        return True


def ready(kernel: Any, args: tuple[Any, ...], dtype: Any) -> bool:
    """Whether the blocked ``kernel`` (a numba dispatcher) may run on ``args`` (of float ``dtype``)
    now (module docstring). One dict lookup after the first question per kernel and dtype.
    """
    key = (kernel, dtype)
    if _always or _state.get(key) is True:
        return True
    with _lock:  # every write to the state under the lock (``timed`` adds to it from other threads)
        state = _state.get(key)
        if state is None:
            state = _state[key] = True if _cached(kernel, args) else 0.0
        if state is True:
            return True
        if state < TIER_UP_SECONDS:
            return False
        _state[key] = True
    name = kernel.py_func.__name__
    LOGGER.warning(
        "batched_nerf: the per-sample kernels ran %.0f s on calls the blocked kernel %s serves "
        "faster; compiling it (%s, once: tens of seconds, then cached). `batched-nerf warmup` "
        "compiles every kernel ahead.",
        state,
        name,
        dtype,
    )
    return True


def timed(kernel: Any, dtype: Any, run: Callable[[], Any]) -> Any:
    """``run()`` (the per-sample kernels of a call ``kernel`` was not `ready` for), its time
    charged to ``kernel`` and ``dtype``."""
    t0 = time.perf_counter()
    try:
        return run()
    finally:
        key = (kernel, dtype)
        with _lock:
            state = _state.get(key, 0.0)
            if state is not True:
                _state[key] = state + time.perf_counter() - t0


def run(kernel: Any, args: tuple[Any, ...], dtype: Any, per_sample: Callable[[], Any]) -> Any:
    """``kernel(*args)`` (a blocked kernel the dispatch rule picked, on arrays of float ``dtype``)
    where it is `ready`, else ``per_sample()`` (the same call on the per-sample kernels),
    `timed`; what the call returns."""
    if ready(kernel, args, dtype):
        return kernel(*args)
    return timed(kernel, dtype, per_sample)
