"""Numba's threads for the CPU kernels: which threading layer runs them, how much work a call
needs before threads pay, and the kernels of a forked child (plain Python: numba is imported
inside the functions).

A launch of a parallel kernel costs about 2 us on GNU OpenMP or TBB and 70-80 us on numba's own
``workqueue`` (2-core Linux machine), and a TBB worker that slept through other work is slow to
wake, so each kernel keeps a serial bound per layer (the work below which a call runs on the
calling thread), and `serial_bound` picks the layer's; `count` turns it into a call's threads
and `launch` runs a kernel pair (a slice function and its ``prange`` over slices) on them. Which
layer `cache.prepare` asks for, and why, is said in `cache`.

GNU OpenMP is not fork-safe: numba ends a forked child at its first parallel launch when the
parent had launched one ("fork() called from a process already using GNU OpenMP"). So
`serial_in_forked_children` registers an after-fork hook that, in such a child, replaces each
parallel kernel by its `serial_twin`: the same Python function compiled without threads (its
``prange`` loops run in order on the calling thread: the same operations, the same bits).
"""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Callable
from typing import Any

__all__ = [
    "count",
    "gnu_omp_missing",
    "is_parallel",
    "launch",
    "load_tbb",
    "parallel_kernels",
    "serial_bound",
    "serial_in_forked_children",
    "serial_twin",
    "threading_layer",
]


def load_tbb() -> bool:
    """Whether numba's TBB pool imports, after loading the ``tbb`` wheel's ``libtbb.so.12`` where
    the loader alone does not find it (pip installs it into the environment's ``lib`` folder)."""
    try:
        importlib.import_module("numba.np.ufunc.tbbpool")
        return True
    except ImportError:
        pass
    try:
        from importlib import metadata

        files = metadata.files("tbb") or []
    except Exception:  # no tbb wheel (PackageNotFoundError), or no file list
        return False
    import ctypes

    for file in files:
        if file.name.startswith("libtbb.so.12"):
            try:
                ctypes.CDLL(str(file.locate()), mode=ctypes.RTLD_GLOBAL)
                importlib.import_module("numba.np.ufunc.tbbpool")
                return True
            except (OSError, ImportError):  # another TBB than numba takes: workqueue then
                return False
    return False


_layer: list[str] = []


def serial_bound(bound: int, workqueue: int, tbb: int | None = None) -> int:
    """A kernel's serial bound (below it, a call runs on the calling thread): ``bound`` on GNU OpenMP
    (a launch costs about 2 us and its workers spin a while after each region, so a call soon after
    another finds them awake), ``tbb`` on TBB (default ``bound``: a launch costs about 2 us, but a
    worker that slept through other work is slow to wake), ``workqueue`` on numba's ``workqueue``
    (70-80 us a launch); the layer is read once per process."""
    if not _layer:
        _layer.append(threading_layer())
    if _layer[0] == "workqueue":
        return workqueue
    return tbb if tbb is not None and _layer[0] == "tbb" else bound


def count(work: int, most: int, bound: int, workqueue: int, tbb: int | None = None) -> int:
    """Threads for a call of ``work`` units: 1 below the kernel's `serial_bound` (``bound``,
    ``workqueue``, ``tbb`` as there), else numba's thread count, at most ``most`` (the call's work
    items) and at least 1."""
    if work < serial_bound(bound, workqueue, tbb):
        return 1
    import numba

    return max(1, min(numba.get_num_threads(), most))


def launch(items: Callable[..., None], parallel: Callable[..., None], nt: int, *args: Any) -> None:
    """Run a kernel pair on ``nt`` threads: ``parallel(*args, nt)`` (a ``prange`` over ``nt``
    slices), or ``items(0, 1, *args)`` (the one slice, on the calling thread: no thread-pool round
    trip) where ``nt`` is 1."""
    if nt > 1:
        parallel(*args, nt)
    else:
        items(0, 1, *args)


def threading_layer() -> str:
    """The threading layer numba's parallel kernels run on (``"tbb"``, ``"omp"``,
    ``"workqueue"``), or the one they will once started."""
    from numba.core import config
    from numba.np.ufunc import parallel

    if parallel._is_initialized:
        return str(parallel._threading_layer)
    layer = str(config.THREADING_LAYER).lower()
    if layer in ("tbb", "omp", "workqueue"):
        return layer
    if load_tbb():
        return "tbb"
    return "workqueue" if layer in ("forksafe", "safe") or gnu_omp_missing() else "omp"


def gnu_omp_missing() -> bool:
    """Numba's default order is TBB, OpenMP, workqueue: True where its OpenMP pool does not load."""
    try:
        importlib.import_module("numba.np.ufunc.omppool")
    except Exception:
        return True
    return False


def is_parallel(value: Any) -> bool:
    """Whether ``value`` is a numba kernel compiled with ``parallel=True``."""
    options = getattr(value, "targetoptions", None)
    return isinstance(options, dict) and bool(options.get("parallel"))


def parallel_kernels(module: Any) -> list[tuple[str, Any]]:
    """``(name, kernel)`` for each parallel kernel of ``module`` (one kernel may have several names)."""
    return [(name, value) for name, value in list(vars(module).items()) if is_parallel(value)]


def serial_twin(dispatcher: Any, prepare: Callable[[Any], object]) -> Any:
    """The parallel kernel ``dispatcher`` as the forked child of a GNU OpenMP process runs it: a copy of
    its Python function, named ``<kernel>__serial`` (numba's disk cache keys a kernel by its name, not
    by its options: the copy keeps the two apart), compiled on its first call with ``parallel=False``;
    ``prepare`` is given the new dispatcher before that (the process-safe cache write)."""
    import numba

    py_func = dispatcher.py_func
    copy = types.FunctionType(
        py_func.__code__, py_func.__globals__, py_func.__name__ + "__serial", py_func.__defaults__,
        py_func.__closure__,
    )  # fmt: skip
    copy.__qualname__, copy.__doc__ = py_func.__qualname__ + "__serial", py_func.__doc__
    options = {k: v for k, v in dispatcher.targetoptions.items() if k != "nopython"}
    twin = numba.njit(cache=True, **{**options, "parallel": False})(copy)
    prepare(twin)
    return twin


_registered: list[bool] = []


def serial_in_forked_children(modules: list[Any], prepare: Callable[[Any], object]) -> None:
    """Register (once per process; POSIX) the after-fork hook that, in a child forked after GNU
    OpenMP threads ran, puts a `serial_twin` in place of each parallel kernel of ``modules`` (one
    twin per kernel, under every name a module gives it); ``prepare`` as `serial_twin`'s."""
    if _registered or not hasattr(os, "register_at_fork"):
        return
    _registered.append(True)

    def after_fork_in_child() -> None:
        from numba.np.ufunc import parallel

        if not (parallel._is_initialized and str(parallel._threading_layer) == "omp"):
            return
        twins: dict[int, Any] = {}
        for module in modules:
            for name, value in parallel_kernels(module):
                if id(value) not in twins:
                    twins[id(value)] = serial_twin(value, prepare)
                setattr(module, name, twins[id(value)])

    os.register_at_fork(after_in_child=after_fork_in_child)
