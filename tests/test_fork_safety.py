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
    from batched_nerf.engines.fused.cpu import build

    ATOMS, SAMPLES = 64, 128  # 8,192 atom-samples: above build.SERIAL_WORK, so threaded
    assert SAMPLES * ATOMS >= build.SERIAL_WORK and numba.get_num_threads() > 1
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
            return convert(SAMPLES)  # threaded in the forked worker too

    parent = convert(SAMPLES)  # the parent runs the threaded kernels (starts numba's threads)
    print("LAYER", numba.threading_layer())
    loader = DataLoader(Frames(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    batches = [x for x in loader]
    assert len(batches) == 2 and torch.allclose(batches[0][0], parent)
    print("OK")
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork with GNU OpenMP: Linux")
def test_dataloader_fork_workers_after_threaded_kernels() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_THREADING_LAYER")}
    env.update(PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="2")
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "OK" in run.stdout
    assert "LAYER omp" not in run.stdout  # GNU OpenMP is not fork-safe


def test_an_explicit_threading_layer_is_kept() -> None:
    code = "import batched_nerf as bn, numba; bn.backends(); print(numba.config.THREADING_LAYER)"
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_THREADING_LAYER="omp")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["omp"]
    env.pop("NUMBA_THREADING_LAYER")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["forksafe"]


_THREADS = textwrap.dedent(
    """
    import threading, numba, torch
    import batched_nerf as bn
    from batched_nerf.engines.fused.cpu import cache

    table = bn.ConstructionTable.chain(64)
    b, a = torch.full((256, 64), 1.5, dtype=torch.float64), torch.full((256, 64), 1.9, dtype=torch.float64)
    d = torch.linspace(-3.0, 3.0, 256 * 64, dtype=torch.float64).reshape(256, 64)
    want = bn.to_cartesian(b, a, d, table, method="fused")  # threaded: 16,384 atom-samples
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


def test_python_threads_launching_threaded_kernels_together() -> None:
    """The fork-safe layer without TBB (workqueue) aborts the process when two Python threads launch
    parallel kernels at once; the package serialises its parallel launches there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_THREADING_LAYER")}
    env.update(PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="2")
    run = subprocess.run(
        [sys.executable, "-c", _THREADS], env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "OK" in run.stdout
