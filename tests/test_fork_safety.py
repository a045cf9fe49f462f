"""Fork safety of the threaded CPU kernels: ``DataLoader`` workers forked after the parent ran them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba", reason="the fused CPU kernels need numba")

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = textwrap.dedent(
    """
    import numba, torch
    from torch.utils.data import DataLoader, Dataset
    import batched_nerf as bn
    from batched_nerf.engines.fused.cpu import build, samples, threads

    ATOMS, SAMPLES = 64, 640  # 40,960 atom-samples: above the serial bound of every layer, so threaded
    bounds = (build.SERIAL_WORK, build.WORKQUEUE_SERIAL_WORK, build.TBB_SERIAL_WORK)
    assert SAMPLES * ATOMS >= threads.serial_bound(*bounds)
    assert numba.get_num_threads() > 1
    table = bn.ConstructionTable.chain(ATOMS)

    def convert(n):
        g = torch.Generator().manual_seed(n)
        b = 1.5 + 0.1 * torch.rand(n, ATOMS, generator=g, dtype=torch.float64)
        a = 1.9 + 0.1 * torch.rand(n, ATOMS, generator=g, dtype=torch.float64)
        d = 3.0 * torch.rand(n, ATOMS, generator=g, dtype=torch.float64) - 1.5
        return bn.to_cartesian(b, a, d, table, method="fused")

    class Frames(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            xyz = convert(SAMPLES)  # threaded in the forked worker too (serial twins on OpenMP)
            kernel = samples._forward_parallel
            twin = not threads.is_parallel(kernel) and kernel.py_func.__name__ == "_forward_parallel__serial"
            return xyz, bn.to_internal(xyz, table)[2], torch.tensor(twin)

    parent = convert(SAMPLES)  # the parent runs the threaded kernels (starts numba's threads)
    dihedrals = bn.to_internal(parent, table)[2]
    print("LAYER", numba.threading_layer())
    loader = DataLoader(Frames(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    batches = [x for x in loader]
    assert len(batches) == 2
    for xyz, dih, twin in batches:  # the same bits as the parent's threads
        assert torch.equal(xyz[0], parent) and torch.equal(dih[1], dihedrals)
        assert twin.tolist() == [numba.threading_layer() == "omp"] * 2
    assert threads.is_parallel(samples._forward_parallel)  # the parent keeps its threads
    print("OK")
    """
)


def _env(layer: str | None) -> dict[str, str]:
    """The environment without a user's threading layer, or with ``layer`` chosen."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_THREADING_LAYER")}
    env.update(PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="2")
    if layer is not None:
        env["NUMBA_THREADING_LAYER"] = layer
    return env


#: The package's own choice (GNU OpenMP where numba's pool loads it), TBB and workqueue.
LAYERS = [None, "tbb", "workqueue"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork with GNU OpenMP: Linux")
@pytest.mark.parametrize("layer", LAYERS)
def test_dataloader_fork_workers_after_threaded_kernels(layer: str | None) -> None:
    if layer == "tbb" and not _has_tbb_wheel():
        pytest.skip("no tbb wheel here (pip install tbb; the extra 'fast' brings it on Linux x86-64)")
    env = _env(layer)
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "OK" in run.stdout
    if layer is None and not _gnu_omp_missing():
        assert "LAYER omp" in run.stdout  # not fork-safe: the workers ran the serial twins
    elif layer is not None:
        assert f"LAYER {layer}" in run.stdout


def test_an_explicit_threading_layer_is_kept() -> None:
    code = "import batched_nerf as bn, numba; bn.backends(); print(numba.config.THREADING_LAYER)"
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_THREADING_LAYER="omp")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["omp"]
    env.pop("NUMBA_THREADING_LAYER")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["forksafe" if _gnu_omp_missing() else "omp"]


_THREADS = textwrap.dedent(
    """
    import threading, numba, torch
    import batched_nerf as bn
    from batched_nerf.engines.fused.cpu import cache

    table = bn.ConstructionTable.chain(64)
    b, a = torch.full((640, 64), 1.5, dtype=torch.float64), torch.full((640, 64), 1.9, dtype=torch.float64)
    d = torch.linspace(-3.0, 3.0, 640 * 64, dtype=torch.float64).reshape(640, 64)
    want = bn.to_cartesian(b, a, d, table, method="fused")  # 40,960 atom-samples: threaded on every layer
    print("LAYER", numba.threading_layer(), cache.thread_safe_layer())
    errors = []

    def work():
        try:
            for _ in range(20):
                assert torch.equal(bn.to_cartesian(b, a, d, table, method="fused"), want)
                bn.to_internal(want, table)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    print("OK")
    """
)


@pytest.mark.parametrize("layer", LAYERS)
def test_python_threads_launching_threaded_kernels_together(layer: str | None) -> None:
    """The fork-safe layer without TBB (workqueue) aborts the process when two Python threads launch
    parallel kernels at once; the package serialises its parallel launches there."""
    env = _env(layer)
    run = subprocess.run(
        [sys.executable, "-c", _THREADS], env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "OK" in run.stdout


_LAYER = textwrap.dedent(
    """
    import numba, torch
    import batched_nerf as bn
    from batched_nerf.engines.fused.cpu import build, threads

    bound = threads.serial_bound(build.SERIAL_WORK, build.WORKQUEUE_SERIAL_WORK, build.TBB_SERIAL_WORK)
    print(threads.threading_layer(), bound, build._threads(64, 1, 384))  # before any launch
    table = bn.ConstructionTable.chain(64)
    bn.to_cartesian(torch.full((640, 64), 1.5), torch.full((640, 64), 1.9), torch.zeros(640, 64), table)
    print(numba.threading_layer(), threads.threading_layer())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tbb wheel's loader path: Linux")
def test_the_tbb_wheel_is_found_and_workqueue_runs_small_calls_on_one_thread() -> None:
    """The package's choice is GNU OpenMP where numba's pool loads it; pip puts the tbb wheel's
    libtbb.so.12 where the loader does not look: the package loads it for a chosen ``tbb``. On either
    (a launch of about 2 us) a call of 64 x 384 atom-samples runs on two threads; on workqueue (70-80
    us a launch) that call runs on the calling thread."""
    if not _gnu_omp_missing():
        run = subprocess.run(
            [sys.executable, "-c", _LAYER], env=_env(None), capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.split() == ["omp", "4096", "2", "omp", "omp"]
    if not _has_tbb_wheel():
        pytest.skip("no tbb wheel here (pip install tbb; the extra 'fast' brings it on Linux x86-64)")
    run = subprocess.run(
        [sys.executable, "-c", _LAYER], env=_env("tbb"), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["tbb", "16384", "2", "tbb", "tbb"]
    run = subprocess.run(
        [sys.executable, "-c", _LAYER], env=_env("workqueue"), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["workqueue", "32768", "1", "workqueue", "workqueue"]


def _has_tbb_wheel() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("tbb")
    except metadata.PackageNotFoundError:
        return False
    return True


def _gnu_omp_missing() -> bool:
    from batched_nerf.engines.fused.cpu import threads

    return threads.gnu_omp_missing()
