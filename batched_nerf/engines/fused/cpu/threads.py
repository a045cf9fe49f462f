"""Numba's threads for the CPU kernels: which threading layer runs them, and how much work a call
needs before threads pay (plain Python: numba is imported inside the functions).

A launch of a parallel kernel costs about 2 us on TBB and 70-80 us on numba's own
``workqueue`` (2-core Linux machine), so each kernel keeps two serial bounds (the work below
which a call runs on the calling thread), and `serial_bound` picks the layer's. Which layer
`cache.prepare` asks for, and why, is said in `cache`.
"""

from __future__ import annotations

import importlib

__all__ = ["gnu_omp_missing", "load_tbb", "serial_bound", "threading_layer"]


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


_workqueue: list[bool] = []


def serial_bound(bound: int, workqueue: int) -> int:
    """A kernel's serial bound (below it, a call runs on the calling thread): ``bound`` where a launch
    is cheap (TBB, OpenMP: about 2 us), ``workqueue`` on numba's ``workqueue`` (70-80 us a launch);
    the layer is read once per process."""
    if not _workqueue:
        _workqueue.append(threading_layer() == "workqueue")
    return workqueue if _workqueue[0] else bound


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
