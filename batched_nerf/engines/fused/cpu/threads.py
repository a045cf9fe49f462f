"""Numba's threads for the CPU kernels: which threading layer runs them, and how much work a call
needs before threads pay (plain Python: numba is imported inside the functions).

A launch of a parallel kernel costs about 2 us on TBB and 70-80 us on numba's own
``workqueue`` (2-core Linux machine), so where the layer is ``workqueue`` the kernels run
`SERIAL_FACTOR` times more work on the calling thread (`serial_factor`). Which layer
`cache.prepare` asks for, and why, is said in `cache`.
"""

from __future__ import annotations

import importlib

__all__ = ["SERIAL_FACTOR", "gnu_omp_missing", "load_tbb", "serial_factor", "threading_layer"]


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


#: How much more work the CPU kernels run on the calling thread where the layer is ``workqueue``
#: (its launch costs 70-80 us): measured on 2 cores, float32, chains of 64-1,024 atoms, one thread
#: against two, forward / backward: 94 / 209 us against 222 / 330 us at 8,832 atom-samples, 344 / 825
#: against 259 / 927 at 35,328, 645 / 3,033 against 425 / 1,581 at 65,536 (TBB: two threads win
#: from 2,208 on).
SERIAL_FACTOR = 8
_factor: list[int] = []


def serial_factor() -> int:
    """`SERIAL_FACTOR` where the kernels run on ``workqueue``, else 1 (read once per process)."""
    if not _factor:
        _factor.append(SERIAL_FACTOR if threading_layer() == "workqueue" else 1)
    return _factor[0]


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
