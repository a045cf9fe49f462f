"""One owner of derived per-table state (`batched_nerf.runtime.state`): what a table, a protein
table and the process keep, reported in bytes and freed on request."""

from __future__ import annotations

import gc
import pickle

import pytest
import torch

import batched_nerf as bn
from batched_nerf.runtime import state


def _build(table: bn.ConstructionTable, batch: int = 4) -> torch.Tensor:
    n = table.n_atoms
    torch.manual_seed(0)
    return bn.to_cartesian(
        1.5 + torch.rand(batch, n, dtype=torch.float64),
        1.9 + 0.1 * torch.rand(batch, n, dtype=torch.float64),
        torch.rand(batch, n, dtype=torch.float64) * 6 - 3,
        table,
    )


def test_table_reports_and_releases_its_plans_and_memo() -> None:
    table = bn.ConstructionTable.chain(300)
    before = _build(table)
    table.cached("n", lambda topo: torch.zeros(1000, dtype=torch.float64))
    info = table.cache_info()
    assert info["plans"] >= 1
    assert info["plan_bytes"] > 300 * 8  # the plan's index arrays, at least one int64 per atom
    assert info["memo"] == 1
    assert info["memo_bytes"] == 8000
    assert table.release() is table
    assert table.cache_info() == {"plans": 0, "plan_bytes": 0, "memo": 0, "memo_bytes": 0}
    assert torch.equal(_build(table), before)  # made again on use, the same results
    assert table.cache_info()["plans"] >= 1


def test_process_report_counts_each_live_table_once_and_forgets_freed_ones() -> None:
    gc.collect()
    start = bn.cache_info()
    tables = [bn.ConstructionTable.chain(200 + k) for k in range(3)]
    for t in tables:
        _build(t)
    grown = bn.cache_info()
    assert grown["owners"] >= start["owners"] + 3
    assert grown["plan_bytes"] >= start["plan_bytes"] + sum(t.cache_info()["plan_bytes"] for t in tables)
    assert "work_buffers_bytes" in grown
    del tables, t
    gc.collect()
    assert bn.cache_info()["owners"] <= grown["owners"] - 3


def test_a_pickled_table_carries_no_derived_state() -> None:
    table = bn.ConstructionTable.chain(50)
    _build(table)
    copy = pickle.loads(pickle.dumps(table))
    assert copy.cache_info()["plans"] <= 1  # only what the table makes eagerly, nothing carried
    assert len(pickle.dumps(table)) == len(pickle.dumps(copy))


def test_protein_tables_keep_their_derived_arrays_in_the_one_state() -> None:
    p = bn.protein.protein_table("MKVWYAG")
    assert "_layout" not in vars(p)  # no private attributes stashed beside the state
    phi = torch.zeros(2, 7, dtype=torch.float64)
    bn.protein.build("MKVWYAG", phi, phi + 2.0)  # the cached table of the sequence
    kept = state.state_of(p)
    assert kept.memo  # casts, bound builds, layouts
    assert kept.info()["memo_bytes"] > 0
    assert [k for k in vars(p) if k.startswith("_")] == ["_state"]


def test_the_backbone_build_keeps_its_constants_with_its_chain_table() -> None:
    pytest.importorskip("numba", reason="the bound backbone build runs the fused CPU kernels")
    from batched_nerf.protein._backbone import backbone_table

    d = torch.linspace(-3.0, 3.0, 4 * 9 * 3).reshape(4, 9, 3)
    want = bn.protein.build_backbone(d, layout="foldingdiff")
    table = backbone_table(9, True)
    keys = set(state.state_of(table).memo)
    assert {("bound constants", "foldingdiff", torch.float32), ("atom source", "foldingdiff")} <= keys
    assert table.cache_info()["memo_bytes"] > 0  # reported by the table, not held beside it
    table.release()
    assert table.cache_info()["memo"] == 0
    assert torch.equal(bn.protein.build_backbone(d, layout="foldingdiff"), want)  # made again


def test_pools_register_and_release() -> None:
    freed = []
    state.register_pool("test_pool", lambda: 123, lambda: freed.append(True))
    try:
        assert bn.cache_info()["test_pool_bytes"] == 123
        state.release_pools()
        assert freed == [True]
    finally:
        state._POOLS.pop("test_pool")


def test_nbytes_counts_each_storage_once() -> None:
    x = torch.zeros(1000, dtype=torch.float64)
    a = x.numpy()
    assert state.nbytes([x, x[10:], x.view(10, 100)]) == 8000
    assert state.nbytes({"a": a, "b": a[::2]}) == 8000
    assert state.nbytes((1, "s", None, torch.device("cpu"))) == 0


def test_the_rows_a_plan_keeps_are_not_counted() -> None:
    """A fused plan keeps its table's topology; the report counts the plan's own arrays only (the
    rows are the table, not state derived from it), also process-wide."""
    table = bn.ConstructionTable.chain(1000)
    _build(table)
    plan = table.plan("fused")
    assert set(table._state.plans) == {("fused", 1, torch.device("cpu"))}
    assert table.cache_info()["plan_bytes"] == plan.index.nbytes + plan.starts.nbytes + plan.runs.nbytes
    assert state.nbytes(table.topology) > 0  # what was counted before


def test_the_pools_share_one_byte_budget_least_recently_used_first() -> None:
    """Work buffers and kept torsion arrays are entries of one ledger: past the budget the oldest
    entry goes, whichever pool it is in; a smaller budget frees the excess at once."""
    from batched_nerf.engines.fused import torsions, workspace

    state.release_pools()
    old = bn.cache_budget()
    n = workspace.MIN_BYTES // 8
    topo = bn.ConstructionTable.chain(4).topology
    try:
        with workspace.borrowed(topo, n):  # a work buffer of 8n bytes, idle after the block
            pass
        assert bn.cache_info()["work_buffers_bytes"] == 8 * n
        phi = torch.zeros(64, 7)
        bn.protein.build("MKVWYAG", phi, phi + 2.0)  # a bound build: its broadcast arrays kept
        arrays = torsions.kept_bytes()
        assert arrays > 0
        bn.cache_budget(8 * n + arrays - 1)  # one byte short: the oldest entry, the work buffer, goes
        assert workspace.held_bytes() == 0 and torsions.kept_bytes() == arrays
        with workspace.borrowed(topo, n):
            pass  # returned: now the newest, and the torsion arrays the oldest
        assert workspace.held_bytes() == 8 * n and torsions.kept_bytes() == 0
        bn.cache_budget(0)  # nothing idle is kept
        assert workspace.held_bytes() == 0
        with workspace.borrowed(topo, n):
            pass
        assert workspace.held_bytes() == 0
    finally:
        bn.cache_budget(old)
    assert bn.cache_budget() == old


def test_cache_budget_checks_its_argument() -> None:
    with pytest.raises(TypeError, match=r"cache_budget takes a number of bytes \(int\), got float"):
        bn.cache_budget(1.5)
    with pytest.raises(TypeError, match="got bool"):
        bn.cache_budget(True)
    with pytest.raises(ValueError, match="non-negative number of bytes, got -1"):
        bn.cache_budget(-1)
