"""The numba cache of the CPU kernels: say when they compile (a cache miss), and where their cache lives.

numba compiles a kernel on its first call with new argument types and keeps the
machine code in an on-disk cache (``cache=True``); a later process loads it in
milliseconds. A cache miss costs seconds per kernel (tens of seconds for a first
training step), so it is announced, before it starts:

* once per process, a ``logging`` WARNING on the logger ``batched_nerf`` (shown by
  default: with no logging configured, Python's last-resort handler prints it to
  stderr), naming what compiles, that it happens once, where the cache lives and
  how to compile ahead ([`batched_nerf.warmup`][batched_nerf.warmup]);
* every compile, an INFO record when it starts and when it ends (with its time).

A logging record rather than ``warnings.warn``: the message is raised from inside
numba's compiler (its ``numba:compile`` event), where a warnings filter set to
``error`` (``python -W error``, pytest's ``filterwarnings = error``) would turn it
into an exception that aborts the compile; and a compile is not a misuse to fix.
Silence it with ``logging.getLogger("batched_nerf").setLevel(logging.ERROR)``.

numba fires ``numba:compile`` only after its cache lookup failed, so the
announcement is exact: a cache hit says nothing. Only kernels of this package
count; a kernel compiled from inside another (its helpers) is part of its
caller's message.

Fork safety: numba's default threading layer on Linux is GNU OpenMP where it loads (no TBB),
and a process that forks after running a threaded kernel aborts in the child ("fork() called
from a process already using GNU OpenMP") at the child's first threaded kernel: every
``torch.utils.data.DataLoader`` with ``num_workers > 0`` (fork is Linux's default start
method) whose dataset calls the fused engine. So before the kernels load, :func:`prepare`
asks numba for its ``forksafe`` layer (``numba.config.THREADING_LAYER``): TBB where
installed (``pip install tbb``: fork- and thread-safe), else numba's own ``workqueue``
(fork-safe, present everywhere; like numba itself in that layer, two Python threads must
not run threaded kernels at the same time). It leaves numba alone where the user chose:
``NUMBA_THREADING_LAYER`` (or ``NUMBA_THREADING_LAYER_PRIORITY``) in the environment or
numba's config file, ``numba.config.THREADING_LAYER`` set in code, or numba's threads
already started by other code. ``NUMBA_THREADING_LAYER=omp`` (or ``default``) restores
numba's default, for programs that never fork after a threaded kernel.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

__all__ = ["COMPILES", "cache_dir", "describe", "lock_cache_writes", "prepare", "watch"]

LOGGER = logging.getLogger("batched_nerf")
#: Compiles seen in this process (top-level kernels of this package): (what, seconds); tests read it.
COMPILES: list[tuple[str, float]] = []

_PACKAGE = __package__.split(".")[0]  # "batched_nerf"
_state = threading.local()
_lock = threading.Lock()
_announced = False
_installed = False

#: kernel-module suffix -> the pass it serves
_PASSES = (
    ("inverse_blocks", "to_internal"),
    ("inverse", "to_internal"),
    ("trig", "to_cartesian / to_internal"),
    ("blocks", "to_cartesian"),
    ("samples", "to_cartesian"),
    ("build", "to_cartesian"),
    ("pose", "to_cartesian pose"),
    ("entries", "flow layer entries + log-det"),
)


#: The threading layer :func:`prepare` asks numba for (fork-safe: TBB, else workqueue).
THREADING_LAYER = "forksafe"
_prepared = False


def _choose_threading_layer() -> str | None:
    """Ask numba for a fork-safe threading layer unless the user chose one (module docstring);
    returns the layer set, or None where numba is left as it was."""
    from numba.core import config
    from numba.np.ufunc import parallel

    chosen = any(k in os.environ for k in ("NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY"))
    if chosen or str(config.THREADING_LAYER).lower() != "default" or parallel._is_initialized:
        return None
    config.THREADING_LAYER = THREADING_LAYER
    return THREADING_LAYER


def prepare() -> None:
    """What must hold before the kernel modules define their kernels (once per process; the
    package's ``__init__`` calls it where numba is installed): a fork-safe threading layer."""
    global _prepared
    with _lock:
        if _prepared:
            return
        _prepared = True
    _choose_threading_layer()


def cache_dir(dispatcher: Any = None) -> str:
    """Where numba keeps the compiled kernels of this package (``dispatcher``: of that kernel).

    numba's own choice, made when the kernel module is imported: ``NUMBA_CACHE_DIR``
    when set; else the ``__pycache__`` folder next to the kernel modules; where
    that is not writable (a read-only site-packages), a per-user folder
    (``~/.cache/numba/<folder>_<hash>``, from ``numba.misc.appdirs``).

    Raises:
        ImportError: numba is not installed.
    """
    if dispatcher is None:
        from .trig import _sincos as dispatcher
    return str(dispatcher._cache._cache_path)


def describe(dispatcher: Any, args: Any) -> str:
    """``"to_internal second order, blocked, float32 (inverse_blocks.second_items)"``."""
    func = dispatcher.py_func
    module, name = func.__module__.rsplit(".", 1)[-1], func.__name__
    what = next((p for suffix, p in _PASSES if module == suffix), module)
    low = name.lower()
    if "second" in low:
        part = "second order"
    elif "vjp" in low or "backward" in low or "grad" in low:
        part = "backward"
    elif "trig" in low or "sincos" in low:
        part = "cos/sin"
    elif "atan2" in low or "angles" in low:
        part = "atan2"
    else:
        part = "forward"
    plain = module in ("trig", "pose", "entries")  # one layout only
    layout = "blocked, " if module.endswith("blocks") else "" if plain else "per sample, "
    if "parallel" in low or low.endswith("_par") or "by_sample" in low or low.endswith("_rows"):
        layout += "threaded, "
    text = " ".join(str(a) for a in args)
    dtype = "float32" if "float32" in text else "float64"
    if "extract" in low:  # the pose read from coordinates: extract_pose, to_internal(return_pose=True)
        return f"extract_pose, {dtype} ({module}.{name})"
    return f"{what} {part}, {layout}{dtype} ({module}.{name})"


class _Announcer:
    """The ``numba:compile`` listener's work: announce the outermost compile of a kernel of this package."""

    def on_start(self, event: Any) -> None:
        depth = getattr(_state, "depth", 0)
        _state.depth = depth + 1
        dispatcher = event.data["dispatcher"]
        if depth or not dispatcher.py_func.__module__.startswith(_PACKAGE + "."):
            return
        what = describe(dispatcher, event.data["args"])
        _state.started = (what, time.perf_counter())
        global _announced
        with _lock:
            first, _announced = not _announced, True
        if first:
            LOGGER.warning(
                "batched_nerf: compiling the fused CPU kernels (numba) for %s: a one-time cost of "
                "seconds per kernel, then cached on disk in %s (choose with NUMBA_CACHE_DIR); later "
                "processes load them in milliseconds. Compile everything ahead with "
                "`batched-nerf warmup` or batched_nerf.warmup().",
                what,
                cache_dir(dispatcher),
            )
        LOGGER.info("batched_nerf: compiling %s (numba cache miss)", what)

    def on_end(self, event: Any) -> None:
        _state.depth = depth = max(getattr(_state, "depth", 1) - 1, 0)
        started = getattr(_state, "started", None)
        if depth or started is None:
            return
        _state.started = None
        what, t0 = started
        seconds = time.perf_counter() - t0
        COMPILES.append((what, seconds))
        LOGGER.info("batched_nerf: compiled %s in %.1f s", what, seconds)


def _locked_save(self: Any, key: Any, data: Any) -> None:
    """numba's ``IndexDataCacheFile.save``, made safe for processes compiling into one folder at once.

    numba's own ``save`` reads the index, picks the first data-file number not in it, writes the
    index, then the data, with no lock between processes: two processes that compile two
    signatures (say float32 and float64) of one kernel together both pick ``<kernel>.1.nbc``,
    and the index can end up naming, for one signature, the machine code of the other (loaded
    by every later process), or lose an entry. Here the whole read-pick-write runs under an
    exclusive ``flock`` on ``<index>.lock``, the data is written before the index names it, and
    both writes stay atomic (numba's temporary file + ``os.replace``).
    """
    import fcntl

    with open(self._index_path + ".lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            overloads = self._load_index()
            data_name = overloads.get(key)
            if data_name is None:
                taken = set(overloads.values())
                number = 1
                while self._data_name(number) in taken:
                    number += 1
                data_name = self._data_name(number)
            self._save_data(data_name, data)
            if overloads.get(key) != data_name:
                overloads[key] = data_name
                self._save_index(overloads)
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


_corrupt_seen: set[str] = set()


def _corrupt(path: str, exc: BaseException) -> None:
    """Say (once per file and process) that a cache file cannot be read and is taken as a miss."""
    with _lock:
        first = path not in _corrupt_seen
        _corrupt_seen.add(path)
    if first:
        LOGGER.warning(
            "batched_nerf: numba cache file %s is unreadable (%s: %s; truncated or empty?): taken as a "
            "cache miss, the kernel compiles again and overwrites it (where the folder is writable).",
            path,
            type(exc).__name__,
            exc,
        )


def _robust_load_index(self: Any) -> dict[Any, Any]:
    """numba's ``IndexDataCacheFile._load_index``, a corrupt index (a truncated or empty ``.nbi``:
    numba raises ``EOFError`` / ``UnpicklingError`` on every later call) taken as an empty one."""
    try:
        return self._numba_load_index()
    except Exception as exc:  # any unreadable index is a miss
        _corrupt(self._index_path, exc)
        return {}


def _robust_load(self: Any, key: Any) -> Any:
    """numba's ``IndexDataCacheFile.load``, a corrupt data file (``.nbc``) taken as a miss (the
    compile that follows overwrites it: the index keeps naming that file for the key)."""
    data_name = self._load_index().get(key)
    if data_name is None:
        return None
    try:
        return self._load_data(data_name)
    except OSError:  # removed while the index names it (numba's own case)
        return None
    except Exception as exc:  # truncated or empty: EOFError, UnpicklingError, ...
        _corrupt(self._data_path(data_name), exc)
        return None


def _cache_file_class() -> Any:
    """numba's ``IndexDataCacheFile`` with the locked save and the robust loads (None without numba's
    cache internals or ``fcntl``)."""
    global _LOCKED
    if _LOCKED is None:
        try:
            import fcntl  # noqa: F401  (POSIX only)

            from numba.core.caching import IndexDataCacheFile
        except ImportError:  # pragma: no cover - Windows, or another numba
            return None
        _LOCKED = type(
            "LockedIndexDataCacheFile",
            (IndexDataCacheFile,),
            {
                "save": _locked_save,
                "load": _robust_load,
                "_load_index": _robust_load_index,
                "_numba_load_index": IndexDataCacheFile._load_index,
            },
        )
    return _LOCKED


_LOCKED: Any = None


def lock_cache_writes(module: Any) -> int:
    """Give every cached numba kernel of ``module`` the process-safe cache write (`_locked_save`)
    and loads that take a corrupt cache file as a miss (`_robust_load`, `_robust_load_index`).

    Returns how many kernels it changed (0 where numba's cache internals differ from those
    known here, or without ``fcntl``: numba's own writes then).
    """
    locked = _cache_file_class()
    if locked is None:  # pragma: no cover - Windows, or another numba
        return 0
    from numba.core.caching import IndexDataCacheFile

    changed = 0
    for value in vars(module).values():
        cache_file = getattr(getattr(value, "_cache", None), "_cache_file", None)
        if type(cache_file) is IndexDataCacheFile:
            cache_file.__class__ = locked
            changed += 1
    return changed


def kernel_modules() -> list[Any]:
    """Every module of this package (``engines/fused/cpu``) but this one, imported: where the kernels
    live. Found by listing the package, so that a new kernel module needs no registration here."""
    import importlib
    import pkgutil
    import sys

    own = __name__.rsplit(".", 1)[-1]
    names = [m.name for m in pkgutil.iter_modules(sys.modules[__package__].__path__) if m.name != own]
    return [importlib.import_module(f"{__package__}.{name}") for name in sorted(names)]


def watch() -> None:
    """Register the compile listener with numba and make the kernels' cache writes process-safe
    (once per process; called when the CPU kernels load)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    for module in kernel_modules():
        lock_cache_writes(module)
    from numba.core import event

    class Listener(_Announcer, event.Listener):  # numba checks the base class
        pass

    event.register("numba:compile", Listener())
