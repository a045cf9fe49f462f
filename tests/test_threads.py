"""The CPU kernels' thread launcher: a call's thread count and the kernel pair it runs."""

from __future__ import annotations

import pytest

numba = pytest.importorskip("numba", reason="the fused CPU kernels need numba")

from batched_nerf.engines.fused.cpu import threads  # noqa: E402


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba reports two threads and the layer is GNU OpenMP's, without starting numba's pool or
    fixing the process's layer (the library chooses it when it prepares the kernels)."""
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    monkeypatch.setattr(threads, "_layer", ["omp"])


@pytest.mark.parametrize("layer, bound", [("omp", 100), ("workqueue", 200), ("tbb", 300)])
def test_count_is_one_below_the_layers_serial_bound(
    two_threads, monkeypatch: pytest.MonkeyPatch, layer: str, bound: int
) -> None:
    monkeypatch.setattr(threads, "_layer", [layer])  # the layer serial_bound read once per process
    assert threads.count(bound - 1, 10, 100, 200, 300) == 1
    assert threads.count(bound, 10, 100, 200, 300) == 2


def test_count_is_capped_by_the_work_items_and_at_least_one(two_threads) -> None:
    assert threads.count(10**9, 1, 0, 0) == 1
    assert threads.count(10**9, 0, 0, 0) == 1
    assert threads.count(10**9, 5, 0, 0) == 2


def test_count_is_one_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numba, "get_num_threads", lambda: 1)
    monkeypatch.setattr(threads, "_layer", ["omp"])
    assert threads.count(10**9, 5, 0, 0) == 1


def test_launch_runs_the_parallel_kernel_or_the_one_slice() -> None:
    calls: list[tuple[str, tuple[object, ...]]] = []

    def items(*args: object) -> None:
        calls.append(("items", args))

    def parallel(*args: object) -> None:
        calls.append(("parallel", args))

    threads.launch(items, parallel, 1, "a", "b")
    threads.launch(items, parallel, 3, "a", "b")
    assert calls == [("items", (0, 1, "a", "b")), ("parallel", ("a", "b", 3))]
