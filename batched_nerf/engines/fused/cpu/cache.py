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

Threads and fork: before the kernels load, `prepare` asks numba for GNU OpenMP (``omp``) where
its OpenMP pool loads, else for its ``forksafe`` layer: TBB where installed (``pip install
tbb``, part of the extra ``fast`` on Linux x86-64; pip puts the wheel's ``libtbb.so.12`` in the
environment's ``lib`` folder, which the loader does not search, so `threads.load_tbb` loads it
from the wheel's own file list first), else numba's own ``workqueue`` (present everywhere, but
a launch costs 70-80 us on a 2-core Linux machine, so the CPU kernels then run larger calls on
the calling thread, `threads.serial_bound`; and not thread-safe: two Python threads launching
parallel kernels together abort the process, so `watch` then wraps the package's parallel
kernels in `_Serialized`, whose launches take one lock). OpenMP first because torch's own CPU
threads are OpenMP's: after a torch op on several threads, torch's OpenMP workers keep spinning
for a while, and a kernel launched then on TBB's threads shares the cores with them (measured on
2 threads: ``to_internal`` of alanine dipeptide x 4,096 right after a torch flow layer took
2.4-2.9 ms on TBB, 1.7-2.0 ms on OpenMP, 1.3-1.9 ms alone). GNU OpenMP is not fork-safe (numba
ends a child forked after its parent ran a threaded kernel at the child's first one: every
``torch.utils.data.DataLoader`` with ``num_workers > 0``, fork being Linux's default start
method), so `watch` registers `threads.serial_in_forked_children`: in such a child the
package's parallel kernels run as their serial twins, compiled without threads. The choice is
left to the user where they made one: ``NUMBA_THREADING_LAYER`` (or
``NUMBA_THREADING_LAYER_PRIORITY``) in the environment or numba's config file,
``numba.config.THREADING_LAYER`` set in code, or numba's threads already started by other code
(a chosen ``tbb`` or ``forksafe`` still finds the wheel's ``libtbb.so.12``).

Where the cache cannot be written (`prepare` adds two cache locators to numba's, for
this package's kernels only): a ``NUMBA_CACHE_DIR`` that is read-only but already holds
this package's cache (a container image warmed at build time) is loaded from, and a kernel
missing there compiles without being saved; with no writable folder at all (numba alone
raises "cannot cache function ...: no locator available" at import) the kernels compile in
memory, once per process. Either, and a ``NUMBA_CACHE_DIR`` that numba cannot use (a file,
say), is said once in a WARNING naming the folder and the fix.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from typing import Any

from . import threads

__all__ = [
    "COMPILES",
    "cache_dir",
    "describe",
    "lock_cache_writes",
    "prepare",
    "watch",
]

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
)


#: The threading layers :func:`prepare` asks numba for: GNU OpenMP where its pool loads, else the
#: fork-safe one (TBB, else workqueue).
THREADING_LAYER = "omp"
FALLBACK_LAYER = "forksafe"
_prepared = False


def _choose_threading_layer() -> str | None:
    """Ask numba for GNU OpenMP, else a fork-safe layer, unless the user chose one (module
    docstring); returns the layer set, or None where numba is left as it was."""
    from numba.core import config
    from numba.np.ufunc import parallel

    chosen = any(k in os.environ for k in ("NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY"))
    layer = str(config.THREADING_LAYER).lower()
    ours = not (chosen or layer != "default" or parallel._is_initialized)
    if ours:
        layer = config.THREADING_LAYER = FALLBACK_LAYER if threads.gnu_omp_missing() else THREADING_LAYER
    if layer in ("tbb", "forksafe", "threadsafe", "safe") and not parallel._is_initialized:
        threads.load_tbb()  # the wheel's library, which numba alone would not find
    return layer if ours else None


def prepare() -> None:
    """What must hold before the kernel modules define their kernels (once per process; the
    package's ``__init__`` calls it where numba is installed): a fork-safe threading layer."""
    global _prepared
    with _lock:
        if _prepared:
            return
        _prepared = True
    _choose_threading_layer()
    _install_locators()


#: What :func:`cache_dir` says where the kernels have no disk cache.
NO_CACHE = "(none: compiled in memory, no writable cache folder; set NUMBA_CACHE_DIR)"
_ReadOnlyLocator: Any = None
_NoDiskLocator: Any = None


def _ours(py_func: Any) -> bool:
    return str(getattr(py_func, "__module__", "")).startswith(_PACKAGE + ".")


def _install_locators() -> None:
    """Add this package's two fallbacks to numba's cache locators (module docstring): after
    ``NUMBA_CACHE_DIR`` when writable, a read-only but populated ``NUMBA_CACHE_DIR``; after every
    other, no disk at all. Both answer for this package's kernels only."""
    global _ReadOnlyLocator, _NoDiskLocator
    try:
        from numba.core import config
        from numba.core.caching import (
            CacheImpl,
            UserProvidedCacheLocator,
            _CacheLocator,
            _SourceFileBackedLocatorMixin,
        )
    except ImportError:  # pragma: no cover - another numba: its own locators only
        return

    class ReadOnlyCacheLocator(UserProvidedCacheLocator):  # type: ignore[misc, valid-type]
        """``NUMBA_CACHE_DIR``'s folder for the kernels, readable, not writable, already made: loads
        only (`lock_cache_writes` gives its kernels a cache file that never saves)."""

        def ensure_cache_path(self) -> None:  # numba's write test, run before a save: none here
            pass

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if not (config.CACHE_DIR and _ours(py_func) and os.path.exists(py_file)):
                return None
            self = cls(py_func, py_file)
            path = self.get_cache_path()
            return self if os.path.isdir(path) and os.access(path, os.R_OK | os.X_OK) else None

    class NoDiskLocator(_SourceFileBackedLocatorMixin, _CacheLocator):  # type: ignore[misc, valid-type]
        """No usable folder: the kernel compiles in memory (`lock_cache_writes` replaces its
        cache by numba's ``NullCache``)."""

        def __init__(self, py_func: Any, py_file: str) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno

        def get_cache_path(self) -> str:
            return os.devnull

        def ensure_cache_path(self) -> None:
            raise OSError(f"no writable cache folder for {self._py_file}")

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            return cls(py_func, py_file) if _ours(py_func) and os.path.exists(py_file) else None

    _ReadOnlyLocator, _NoDiskLocator = ReadOnlyCacheLocator, NoDiskLocator
    classes = list(CacheImpl._locator_classes)
    at = classes.index(UserProvidedCacheLocator) + 1 if UserProvidedCacheLocator in classes else 0
    CacheImpl._locator_classes = [*classes[:at], ReadOnlyCacheLocator, *classes[at:], NoDiskLocator]


def _locator(dispatcher: Any) -> Any:
    return getattr(getattr(getattr(dispatcher, "_cache", None), "_impl", None), "locator", None)


def _problem(path: str) -> str:
    """Why numba cannot use ``path`` as its cache folder."""
    if os.path.exists(path) and not os.path.isdir(path):
        return "is a file, not a folder"
    if not os.path.exists(path):
        return "does not exist and cannot be created"
    return "is not writable"


def _check(kernels: list[Any], no_disk: list[Any]) -> None:
    """The one WARNING (or INFO) on where the kernels' cache is, where it is not where asked or
    nowhere (module docstring)."""
    from numba.core import config

    asked = str(config.CACHE_DIR or "")
    if no_disk:
        where = f"NUMBA_CACHE_DIR={asked!r} {_problem(asked)}" if asked else "NUMBA_CACHE_DIR is unset"
        LOGGER.warning(
            "batched_nerf: no writable folder for numba's cache of the CPU kernels (%s; the kernels' "
            "__pycache__ and numba's per-user folder are not writable either): they compile in memory, "
            "again in every process (seconds per kernel). Set NUMBA_CACHE_DIR to a writable folder "
            "(or to a read-only one warmed ahead with `batched-nerf warmup`).",
            where,
        )
        return
    if not asked or not kernels:
        return
    path = cache_dir(kernels[0])
    if type(_locator(kernels[0])) is _ReadOnlyLocator:
        LOGGER.info(
            "batched_nerf: NUMBA_CACHE_DIR=%r is read-only: the CPU kernels load from %s; one missing "
            "there compiles in memory, not saved.",
            asked,
            path,
        )
    elif not os.path.abspath(path).startswith(os.path.abspath(asked)):
        LOGGER.warning(
            "batched_nerf: NUMBA_CACHE_DIR=%r %s, so numba caches the CPU kernels in %s instead. "
            "Point NUMBA_CACHE_DIR at a writable folder (or a read-only one warmed ahead).",
            asked,
            _problem(asked),
            path,
        )


def cache_dir(dispatcher: Any = None) -> str:
    """Where numba keeps the compiled kernels of this package (``dispatcher``: of that kernel).

    numba's own choice, made when the kernel module is imported: ``NUMBA_CACHE_DIR``
    when set; else the ``__pycache__`` folder next to the kernel modules; where
    that is not writable (a read-only site-packages), a per-user folder
    (``~/.cache/numba/<folder>_<hash>``, from ``numba.misc.appdirs``); `NO_CACHE` where
    no folder is writable (module docstring).

    Raises:
        ImportError: numba is not installed.
    """
    if dispatcher is None:
        from .trig import _sincos as dispatcher
    path = getattr(dispatcher._cache, "_cache_path", None)
    return str(path) if path and type(_locator(dispatcher)) is not _NoDiskLocator else NO_CACHE


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
    plain = module in ("trig", "pose")  # one layout only
    blocked = module.endswith("blocks") or low.endswith("_blocks")
    layout = "blocked, " if blocked else "" if plain else "per sample, "
    if "parallel" in low or low.endswith("_par") or "by_sample" in low or low.endswith("_rows"):
        layout += "threaded, "
    text = " ".join(str(a) for a in args)
    dtype = "float32" if "float32" in text else "float64"
    if name == "zero_past":  # protein.build_backbone's atoms past each chain's length
        return f"zeros past lengths, {dtype} ({module}.{name})"
    if "extract" in low:  # the pose read from coordinates: extract_pose, to_internal(return_pose=True)
        return f"extract_pose, {dtype} ({module}.{name})"
    return f"{what} {part}, {layout}{dtype} ({module}.{name})"


def _kept(dispatcher: Any) -> str:
    """Where a compiled kernel goes, for the first-compile message."""
    path = cache_dir(dispatcher)
    if path == NO_CACHE:
        return (
            "kept in memory only: no writable cache folder (set NUMBA_CACHE_DIR), so every process compiles"
        )
    if type(_locator(dispatcher)) is _ReadOnlyLocator:
        return f"kept in memory only: the cache folder {path} is read-only (loads only)"
    return (
        f"cached on disk in {path} (choose with NUMBA_CACHE_DIR); later processes load them in milliseconds"
    )


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
                "seconds per kernel, then %s. Compile everything ahead with "
                "`batched-nerf warmup` or batched_nerf.warmup().",
                what,
                _kept(dispatcher),
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
        global _READ_ONLY
        _READ_ONLY = type("ReadOnlyIndexDataCacheFile", (_LOCKED,), {"save": _skip_save})
    return _LOCKED


_LOCKED: Any = None
_READ_ONLY: Any = None


def lock_cache_writes(module: Any) -> int:
    """Give every cached numba kernel of ``module`` the process-safe cache write (`_locked_save`)
    and loads that take a corrupt cache file as a miss (`_robust_load`, `_robust_load_index`).

    Returns how many kernels it changed (0 where numba's cache internals differ from those
    known here, or without ``fcntl``: numba's own writes then).
    """
    return sum(lock_writes(value) for value in list(vars(module).values()))


def lock_writes(dispatcher: Any) -> bool:
    """`lock_cache_writes` for one kernel: whether it changed it (a kernel with numba's own disk
    cache file; one with nowhere to cache gets numba's ``NullCache``, compiled in memory)."""
    locked = _cache_file_class()
    if locked is None:  # pragma: no cover - Windows, or another numba
        return False
    from numba.core.caching import IndexDataCacheFile, NullCache

    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if type(cache_file) is not IndexDataCacheFile:
        return False
    locator = type(_locator(dispatcher))
    if locator is _NoDiskLocator:  # nowhere to cache: compile in memory
        dispatcher._cache = NullCache()
        _NO_DISK.append(dispatcher)
        return False
    cache_file.__class__ = _READ_ONLY if locator is _ReadOnlyLocator else locked
    return True


def _skip_save(self: Any, key: Any, data: Any) -> None:
    """No save: the cache folder is read-only (`_install_locators`)."""


_NO_DISK: list[Any] = []


def kernel_modules() -> list[Any]:
    """Every module of this package (``engines/fused/cpu``) but this one, imported: where the kernels
    live. Found by listing the package, so that a new kernel module needs no registration here."""
    import importlib
    import pkgutil
    import sys

    own = __name__.rsplit(".", 1)[-1]
    names = [m.name for m in pkgutil.iter_modules(sys.modules[__package__].__path__) if m.name != own]
    return [importlib.import_module(f"{__package__}.{name}") for name in sorted(names)]


def thread_safe_layer() -> bool:
    """Whether numba's threading layer takes parallel kernels from several Python threads at once.

    The fork-safe choice of `prepare` is TBB where it imports, else ``workqueue``, which
    aborts the process when two threads launch parallel kernels together; GNU OpenMP (the
    user's ``NUMBA_THREADING_LAYER=omp``) and TBB do not.
    """
    from numba.core import config

    layer = str(config.THREADING_LAYER).lower()
    if layer in ("omp", "tbb", "threadsafe"):
        return True
    if layer == "workqueue":
        return False
    try:  # "forksafe" or "default": TBB first where its pool loads
        importlib.import_module("numba.np.ufunc.tbbpool")
    except Exception:  # ImportError, or libtbb missing
        return layer == "default" and not threads.gnu_omp_missing()
    return True


class _Serialized:
    """A parallel kernel whose launches take `PARALLEL_LOCK` (a layer that is not thread-safe):
    calls from several Python threads run one after the other instead of aborting the process.
    Every other attribute is the dispatcher's (the tiers and the cache read them)."""

    def __init__(self, dispatcher: Any) -> None:
        self.__dict__["_dispatcher"] = dispatcher

    def __call__(self, *args: Any) -> Any:
        with PARALLEL_LOCK:
            return self._dispatcher(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dispatcher, name)


#: Held while a parallel kernel runs, where numba's threading layer is not thread-safe.
PARALLEL_LOCK = threading.Lock()


def serialize_parallel_kernels(module: Any) -> int:
    """Wrap every parallel kernel of ``module`` in `_Serialized`; returns how many."""
    changed = 0
    for name, value in threads.parallel_kernels(module):
        if not isinstance(value, _Serialized):
            setattr(module, name, _Serialized(value))
            changed += 1
    return changed


def watch() -> None:
    """Register the compile listener with numba and make the kernels' cache writes process-safe
    (once per process; called when the CPU kernels load)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    modules = kernel_modules()
    for module in modules:
        lock_cache_writes(module)
    kernels = [v for m in modules for v in vars(m).values() if type(_locator(v)).__name__.endswith("Locator")]
    _check(kernels, _NO_DISK)
    if not thread_safe_layer():
        for module in modules:
            serialize_parallel_kernels(module)
    threads.serial_in_forked_children(modules, lock_writes)
    from numba.core import event

    class Listener(_Announcer, event.Listener):  # numba checks the base class
        pass

    event.register("numba:compile", Listener())
