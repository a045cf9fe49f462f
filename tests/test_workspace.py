"""The fused CPU build's reusable trig buffer (engines/fused/workspace.py)."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

import batched_nerf as bn

pytest.importorskip("numba", reason="the fused CPU kernels need numba (the extra 'fast')")

from batched_nerf.engines.fused import workspace  # noqa: E402


def _inputs(table: bn.ConstructionTable, batch: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    n = table.n_atoms
    return (
        1.0 + torch.rand(batch, n, generator=g),
        1.7 + torch.rand(batch, n, generator=g),
        torch.randn(batch, n, generator=g),
    )


def test_a_large_call_without_gradients_reuses_one_buffer_per_table() -> None:
    workspace.release()
    table = bn.ConstructionTable.chain(64)
    b, a, d = _inputs(table, 1024)  # 4 x 65,536 float64 = 2 MiB: above MIN_BYTES
    with torch.no_grad():
        first = bn.to_cartesian(b, a, d, table, method="fused")
        held = workspace.held_bytes()
        again = bn.to_cartesian(b, a, d, table, method="fused")
    assert held >= 4 * 1024 * 64 * 8 and workspace.held_bytes() == held  # kept, not grown
    leaves = [x.clone().requires_grad_() for x in (b, a, d)]
    graded = bn.to_cartesian(*leaves, table, method="fused")  # keeps its own trig array for backward
    graded.sum().backward()
    assert torch.equal(first, again) and torch.equal(first, graded.detach())
    assert torch.isfinite(leaves[2].grad).all()
    small = bn.ConstructionTable.chain(8)
    with torch.no_grad():
        bn.to_cartesian(*_inputs(small, 4), small, method="fused")
    assert workspace.held_bytes() == held  # small calls make their own arrays
    del table, graded  # (its graph holds the plan)
    gc.collect()
    assert workspace.held_bytes() == 0  # the buffer goes with the table


def test_a_busy_buffer_is_not_shared_and_release_drops_it() -> None:
    topo = bn.ConstructionTable.chain(4).topology
    n = workspace.MIN_BYTES // 8
    seen = []
    with workspace.borrowed(topo, n) as mine:
        other = threading.Thread(target=lambda: seen.append(workspace.borrowed(topo, n).__enter__()))
        other.start()
        other.join()
        assert mine is not None and mine.size == n and seen == [None]
    with workspace.borrowed(topo, workspace.MAX_BYTES // 8 + 1) as huge:
        assert huge is None
    assert workspace.held_bytes() >= 8 * n
    workspace.release()
    assert workspace.held_bytes() == 0
