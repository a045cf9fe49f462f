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


def _graph_turns(xyz: torch.Tensor):
    """The trig array kept by ``xyz``'s graph (the last constant, a ``Turns``, of its fused build node:
    ``FusedBuild`` or the bound torsion build's ``TorsionFn``)."""
    node = xyz.grad_fn
    while type(node).__name__ not in ("FusedBuildBackward", "TorsionFnBackward"):
        node = node.next_functions[0][0]
    return node.consts[-1]


def test_a_large_call_without_gradients_reuses_one_buffer_per_table() -> None:
    workspace.release()
    table = bn.ConstructionTable.chain(64)
    b, a, d = _inputs(table, 1024)  # 4 x 65,536 float64 = 2 MiB: above MIN_BYTES
    with torch.no_grad():
        first = bn.to_cartesian(b, a, d, table, method="fused")
        held = workspace.held_bytes()
        again = bn.to_cartesian(b, a, d, table, method="fused")
    assert held >= 4 * 1024 * 64 * 8 and workspace.held_bytes() == held  # kept, not grown
    assert torch.equal(first, again)
    small = bn.ConstructionTable.chain(8)
    with torch.no_grad():
        bn.to_cartesian(*_inputs(small, 4), small, method="fused")
    assert workspace.held_bytes() == held  # small calls make their own arrays
    del table
    gc.collect()
    assert workspace.held_bytes() == 0  # the buffer goes with the table


def test_a_graph_leases_its_trig_array_and_gives_it_back_when_freed() -> None:
    workspace.release()
    table = bn.ConstructionTable.chain(64)
    b, a, d = _inputs(table, 1024)
    with torch.no_grad():
        bn.to_cartesian(b, a, d, table, method="fused")
    held = workspace.held_bytes()
    address = []
    for _ in range(3):  # a training loop: each step's graph takes the table's buffer and frees it
        leaf = d.clone().requires_grad_()
        xyz = bn.to_cartesian(b, a, leaf, table, method="fused")
        turns = _graph_turns(xyz)
        assert turns.lease is not None and workspace.held_bytes() == 0  # in use by the graph
        address.append(turns.cs.ctypes.data)
        xyz.sum().backward()
        del xyz, turns
        assert workspace.held_bytes() == held  # back with the table
    assert len(set(address)) == 1  # one buffer, no fresh array per step


def test_graphs_alive_together_keep_their_own_arrays() -> None:
    workspace.release()
    table = bn.ConstructionTable.chain(64)
    (b, a, d), (b2, a2, d2) = _inputs(table, 1024), (x.flip(0) for x in _inputs(table, 1024))
    w = torch.randn(1024, 64, 3, generator=torch.Generator().manual_seed(3))

    def built(*inputs: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        leaves = [x.clone().requires_grad_() for x in inputs]
        return leaves, bn.to_cartesian(*leaves, table, method="fused")

    (l1, x1), (l2, x2) = built(b, a, d), built(b2, a2, d2)  # both graphs hold a trig array
    assert _graph_turns(x1).cs.ctypes.data != _graph_turns(x2).cs.ctypes.data
    with torch.no_grad():  # and a call with nothing to differentiate borrows a third
        bn.to_cartesian(b, a, d, table, method="fused")
    (x2 * w).sum().backward()
    (x1 * w).sum().backward()
    want = []
    for inputs in ((b, a, d), (b2, a2, d2)):
        leaves = [x.double().requires_grad_() for x in inputs]
        (bn.to_cartesian(*leaves, table, method="scan") * w.double()).sum().backward()
        want.append([x.grad for x in leaves])
    for leaves, ref in zip((l1, l2), want):
        for leaf, r in zip(leaves, ref):
            torch.testing.assert_close(leaf.grad.double(), r, rtol=1e-4, atol=1e-3)
    del x1, x2
    gc.collect()
    assert workspace.held_bytes() <= workspace.KEEP * 4 * 1024 * 64 * 8  # at most KEEP idle


def test_the_protein_build_leases_its_trig_array() -> None:
    workspace.release()
    seq = "ACDEFGHIKLMNPQRSTVWY" * 5
    t = bn.protein.protein_table(seq)
    g = torch.Generator().manual_seed(0)
    phi, psi = (torch.rand(48, 100, generator=g) * 6 - 3 for _ in range(2))
    leaves = [x.clone().requires_grad_() for x in (phi, psi)]
    xyz = bn.protein.build(seq, *leaves).xyz
    assert _graph_turns(xyz).lease is not None
    xyz.sum().backward()
    del xyz
    assert workspace.held_bytes() >= 4 * 48 * t.n_atoms * 8
    ref = [x.double().requires_grad_() for x in (phi, psi)]
    bn.protein.build(seq, *ref, method="scan").xyz.sum().backward()
    for got, want in zip(leaves, ref):  # float32 against the float64 reference
        scale = want.grad.abs().max().item()
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=0, atol=1e-3 * scale)


def test_concurrent_borrowers_get_their_own_buffers_and_release_drops_them() -> None:
    workspace.release()
    topo = bn.ConstructionTable.chain(4).topology
    n = workspace.MIN_BYTES // 8
    seen = []
    with workspace.borrowed(topo, n) as mine:

        def other() -> None:
            with workspace.borrowed(topo, n) as theirs:
                seen.append(theirs.ctypes.data)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert mine is not None and mine.size == n and seen and seen[0] != mine.ctypes.data
    with workspace.borrowed(topo, workspace.MAX_BYTES // 8 + 1) as huge:
        assert huge is None
    assert workspace.held_bytes() == 2 * 8 * n
    held = [workspace.lease(topo, n) for _ in range(workspace.KEEP + 2)]
    del held
    assert workspace.held_bytes() == workspace.KEEP * 8 * n  # the smallest past KEEP are dropped
    workspace.release()
    assert workspace.held_bytes() == 0


def test_to_internal_keeps_its_atan2_arguments_with_the_plan() -> None:
    workspace.release()
    table = bn.ConstructionTable.chain(64)
    xyz = bn.to_cartesian(*_inputs(table, 1024), table, method="fused")
    want = bn.to_internal(xyz.double(), table, method="torch")
    first = bn.to_internal(xyz, table, method="fused")
    held = workspace.held_bytes()
    again = bn.to_internal(xyz, table, method="fused")
    assert held >= 4 * 1024 * 64 * 8 and workspace.held_bytes() == held  # kept, reused
    for got, same, ref in zip(first, again, want):
        assert torch.equal(got, same)
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    del table
    gc.collect()
    assert workspace.held_bytes() == 0  # the buffer goes with the table's plan


def test_a_table_freed_inside_the_workspace_lock_does_not_deadlock() -> None:
    # a garbage collection started by an allocation under the lock may free a table on that thread:
    # its finalizer must not wait for the lock
    topo = bn.ConstructionTable.chain(4).topology
    with workspace.borrowed(topo, workspace.MIN_BYTES // 8):
        pass

    def collect_inside_the_lock() -> None:
        nonlocal topo
        with workspace._lock:
            del topo
            gc.collect()

    thread = threading.Thread(target=collect_inside_the_lock, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_idle_buffers_stay_within_the_per_table_and_total_bounds(monkeypatch) -> None:
    workspace.release()
    topo = bn.ConstructionTable.chain(4).topology
    n = workspace.MIN_BYTES // 8
    held = [workspace.lease(topo, k * n) for k in (3, 1, 2)]  # three sizes, all in use at once
    assert workspace.held_bytes() == 0
    del held
    assert workspace.held_bytes() == 8 * n * (3 + 2)  # KEEP = 2: the smallest is dropped
    with workspace.borrowed(topo, n) as buf:  # the smallest that fits: 2n, 3n stays idle
        assert buf.size == n and workspace.held_bytes() == 8 * n * 3
    old = bn.cache_budget(8 * n * 4)  # the one byte budget of idle arrays: 3n, the oldest, goes now
    others = [bn.ConstructionTable.chain(4).topology for _ in range(3)]
    for other in others:  # each returns one buffer of n: the least recently returned go first
        with workspace.borrowed(other, n):
            pass
    assert workspace.held_bytes() == 8 * n * 3  # 3n, then topo's 2n went: the others' three remain
    with workspace.borrowed(topo, n):  # topo has none left: a new one
        assert workspace.held_bytes() == 8 * n * 3
    bn.cache_budget(old)
    workspace.release()
    assert workspace.held_bytes() == 0
