"""New tables: vectorised analysis, composed packing, lazy and bounded plans, cheap pickling."""

from __future__ import annotations

import heapq
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import batched_nerf as bn
from batched_nerf import data
from batched_nerf.engines.dispatch import auto_method, single_path
from batched_nerf.engines.levels import _pool_plans
from batched_nerf.topology.analysis import (
    Topology,
    _hooked,
    analyse,
    components,
    concatenate,
)
from batched_nerf.topology.order import _grouped_order, _nested_order, build_order

R = [-1, -1, -1]


# ------------------------------------------------------------------ oracles
def _oracle(refs: np.ndarray) -> tuple[list[int], list[int], list[int]]:
    """Per-row Python: union-find components (numbered by first atom), levels, heap build order."""
    n = len(refs)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for i, row in enumerate(refs.tolist()):
        for r in row:
            if r >= 0:
                a, b = sorted((find(i), find(r)))
                parent[b] = a
    roots = [find(i) for i in range(n)]
    number = {r: k for k, r in enumerate(sorted(set(roots)))}
    users: list[list[int]] = [[] for _ in range(n)]
    waiting = [0] * n
    for i, row in enumerate(refs.tolist()):
        for r in row:
            if r >= 0:
                users[r].append(i)
                waiting[i] += 1
    ready = [i for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    order, level = [], [0] * n
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        if (refs[i] >= 0).all():
            level[i] = 1 + max(level[r] for r in refs[i])
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    return [number[r] for r in roots], level, order


def _tree(n: int, seed: int, siblings: float = 0.3) -> np.ndarray:
    """Random branched table with sibling rows (methyl-like), rows in build order."""
    g = np.random.default_rng(seed)
    refs = [R, [0, -1, -1], [1, 0, -1]]
    for i in range(3, n):
        prev = refs[int(g.integers(max(3, i - 6), i))] if i > 3 else refs[3 - 1]
        if i > 4 and g.random() < siblings and min(prev) >= 0:
            j = refs.index(prev)
            refs.append([prev[0], prev[1], j])  # a sibling of row j
        else:
            b = int(g.integers(max(2, i - 6), i))
            a = refs[b][0] if refs[b][0] >= 0 else (b - 1 if b else 1)
            d = refs[b][1] if refs[b][1] >= 0 else next(k for k in range(i) if k not in (a, b))
            refs.append([b, a, d])
    return np.asarray(refs, dtype=np.int64)


def _shuffled(refs: np.ndarray, seed: int) -> np.ndarray:
    perm = np.random.default_rng(seed).permutation(len(refs))
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm))
    out = refs[perm].copy()
    out[out >= 0] = inv[out[out >= 0]]
    return out


def _swapped(refs: np.ndarray, seed: int) -> np.ndarray:
    """Neighbouring rows swapped here and there: a few forward references, as in protein tables."""
    perm = np.arange(len(refs))
    for i in np.random.default_rng(seed).integers(0, len(refs) - 1, len(refs) // 5):
        perm[[i, i + 1]] = perm[[i + 1, i]]
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm))
    out = refs[perm].copy()
    out[out >= 0] = inv[out[out >= 0]]
    return out


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), seed=st.integers(0, 10_000), mix=st.sampled_from(["none", "swap", "shuffle"]))
def test_analysis_matches_per_row_oracle(n: int, seed: int, mix: str) -> None:
    refs = _tree(n, seed)
    if mix == "shuffle":
        refs = _shuffled(refs, seed)
    elif mix == "swap":
        refs = _swapped(refs, seed)
    topo = analyse(refs)
    comp, level, order = _oracle(refs)
    assert topo.component.tolist() == comp
    assert topo.level.tolist() == level
    assert topo.order.tolist() == order == build_order(refs).tolist()
    assert topo.depth == max(level)


def test_protein_tables_take_the_vectorised_build_order() -> None:
    refs = bn.pack_tables([bn.protein.protein_table(s).table for s in ("MKVWY", "GASPDE")]).topology.refs
    assert not (refs < np.arange(len(refs))[:, None]).all()  # forward references: not the rows' order
    order = _grouped_order(refs, np.arange(len(refs)))
    assert order is not None and order.tolist() == _oracle(refs)[2]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), seed=st.integers(0, 10_000), mix=st.sampled_from(["none", "swap", "shuffle"]))
def test_nested_order_is_the_heaps(n: int, seed: int, mix: str) -> None:
    refs = _tree(n, seed)
    refs = _shuffled(refs, seed) if mix == "shuffle" else _swapped(refs, seed) if mix == "swap" else refs
    _, level, order = _oracle(refs)
    got = _nested_order(refs, np.arange(len(refs)), np.asarray(level), max_passes=10**9)
    assert got is not None and got.tolist() == order


def test_linked_waters_take_the_nested_order(monkeypatch) -> None:
    from test_autotable import water_box

    from batched_nerf.topology import order as _build_order
    from batched_nerf.topology.auto import refs_from_xyz

    xyz = water_box(6)
    refs = refs_from_xyz(xyz, ["O", "H", "H"] * (len(xyz) // 3)).refs
    assert not (refs < np.arange(len(refs))[:, None]).all()  # forward references (the links)
    assert _grouped_order(refs, np.arange(len(refs))) is None  # not the one-level sort
    monkeypatch.setattr(_build_order, "_heap_order", None)  # the heap is not called
    monkeypatch.setattr(_build_order, "_ROWS_PER_PASS", 1)  # (a box this small would take the heap)
    topo = analyse(refs)
    _, level, order = _oracle(refs)
    assert topo.order.tolist() == order and topo.level.tolist() == level


def test_cycles_refuse_the_whole_array_orders() -> None:
    from batched_nerf.topology.order import _levels

    # rows 3 and 4 read each other: the critical references close a cycle, the jumps never settle
    loop = np.array([R, [0, -1, -1], [1, 0, -1], [4, 1, 0], [3, 1, 0]])
    assert _levels(loop, (loop >= 0).all(1), rounds=16) is None
    with pytest.raises(ValueError, match=r"^the references contain a cycle \(atoms \[3, 4\]"):
        build_order(loop)
    # a cycle through a row with one reference: the levels settle, the order check refuses them
    seedlike = np.array([R, [0, -1, -1], [1, 0, -1], [4, -1, -1], [3, 1, 0]])
    assert _levels(seedlike, (seedlike >= 0).all(1), rounds=16) is not None
    assert _nested_order(seedlike, np.arange(5), np.zeros(5, dtype=np.int64), max_passes=99) is None
    with pytest.raises(ValueError, match=r"^the references contain a cycle \(atoms \[3, 4\]"):
        build_order(seedlike)


def test_levels_take_the_deepest_reference() -> None:
    # row 5's deepest reference is its dihedral reference (a sibling chain 3 -> 4)
    refs = np.array([R, [0, -1, -1], [1, 0, -1], [2, 1, 0], [2, 1, 3], [2, 1, 4], [5, 2, 1]])
    assert analyse(refs).level.tolist() == [0, 0, 0, 1, 2, 3, 4]
    assert _oracle(refs)[1] == [0, 0, 0, 1, 2, 3, 4]


def test_components_of_any_reference_graph() -> None:
    # cycles and out-of-order links (link_components calls it before any check)
    refs = np.array([[3, -1, -1], R, [4, -1, -1], [0, -1, -1], [2, 1, -1], R])
    assert components(refs).tolist() == [0, 1, 1, 0, 1, 2]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    seed=st.integers(0, 10_000),
    forward=st.floats(0.0, 0.3),
    none=st.floats(0.0, 0.5),
)
def test_one_component_shortcut_agrees_with_hooking(n: int, seed: int, forward: float, none: float) -> None:
    """Random reference arrays (backward, forward and missing references, cycles): the one-pass
    answer for 'every row after the first references an earlier row' is the hooking's."""
    rng = np.random.default_rng(seed)
    refs = np.stack([rng.integers(0, max(i, 1), 3) for i in range(n)]).astype(np.int64)
    refs[rng.random((n, 3)) < forward] = rng.integers(0, n, 1)[0]  # some forward links
    refs[rng.random((n, 3)) < none] = -1
    refs[0] = -1
    want = _hooked(refs)
    assert components(refs).tolist() == want.tolist()


def test_fixed_and_error_rows_unchanged() -> None:
    with pytest.raises(ValueError, match=r"^row 4: reference cycle 4 -> 5 -> 4"):
        analyse([R, [0, -1, -1], [1, 0, -1], [2, 1, 0], [5, 2, 1], [4, 2, 1]])
    with pytest.raises(ValueError, match=r"^fixed atom 1 listed twice"):
        analyse([R, R, [1, -1, -1]], fixed=[1, 0, 1])
    with pytest.raises(ValueError, match=r"^row 2: atom 2 references itself"):
        analyse([R, [0, -1, -1], [2, 0, -1], [5, 0, 1]])


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=5), seed=st.integers(0, 1000))
def test_pack_composes_the_parts_analyses(sizes: list[int], seed: int) -> None:
    parts = [bn.ConstructionTable(_shuffled(_tree(n, seed + k), seed + k)) for k, n in enumerate(sizes)]
    parts.append(bn.ConstructionTable([R, [0, 2, 3], R, R, [1, 0, 2]], fixed=[3, 0, 2]))
    packed = bn.pack_tables(parts)
    offsets = np.cumsum([0] + [p.n_atoms for p in parts])
    refs = np.concatenate(
        [np.where(p.topology.refs >= 0, p.topology.refs + o, -1) for p, o in zip(parts, offsets)]
    )
    want = analyse(refs, fixed=np.concatenate([p.topology.fixed + o for p, o in zip(parts, offsets)]))
    got = packed.topology
    for name in want.__dataclass_fields__:
        a, b = getattr(want, name), getattr(got, name)
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, name
    whole = bn.ConstructionTable(refs, fixed=want.fixed)
    assert packed == whole
    assert (packed.single_path, packed.largest_component) == (whole.single_path, whole.largest_component)
    assert concatenate([p.topology for p in parts]).order.tolist() == want.order.tolist()
    again = pickle.loads(pickle.dumps(concatenate([p.topology for p in parts])))  # a plain Topology
    assert type(again) is Topology and not again.refs.flags.writeable
    assert np.array_equal(again.seed_slot, want.seed_slot) and again.depth == want.depth


@pytest.mark.parametrize(
    "parts, whole_test",
    [
        (["chain5"], True),  # one third seed and full rows: single_path's whole test reads arrays
        (["chain5", "pair"], True),
        (["chain5", "water"], False),
        (["water", "water"], False),
        (["chain5", "chain5"], False),
        (["pair", "water"], False),
    ],
)
def test_packed_dispatch_values_come_from_the_parts(parts: list[str], whole_test: bool) -> None:
    """A packed table's single_path and largest component, made from its parts' (reading no array of
    the packed topology unless single_path's whole test must run), equal those of its rows' table."""
    tables = {
        "chain5": bn.ConstructionTable.chain(5),
        "water": bn.ConstructionTable([R, [0, -1, -1], [0, 1, -1]]),
        "pair": bn.ConstructionTable([R, [0, -1, -1]]),
    }
    packed = bn.pack_tables([tables[name] for name in parts])
    kept = ("depth", "_parts", "_state")  # not arrays of the packed rows
    lazy = {k for k in vars(packed.topology) if not k.startswith("n_") and k not in kept}
    whole = bn.ConstructionTable(packed.topology.refs)
    assert (packed.single_path, packed.largest_component) == (whole.single_path, whole.largest_component)
    assert bool(lazy) == whole_test, lazy


# ------------------------------------------------------------------ lazy plans
def _planned(table: bn.ConstructionTable) -> set[tuple[str, int]]:
    return {(kind, variant) for kind, variant, _ in table._state.plans}


def test_new_table_plans_nothing_until_used() -> None:
    table = bn.ConstructionTable.chain(300)
    assert _planned(table) == set()
    bn.to_cartesian(torch.ones(300), torch.ones(300), torch.ones(300), table, method="scan")
    assert _planned(table) == {("scan", 1)}  # one variant: the one this call uses
    table.prepare()
    assert _planned(table) >= {("scan", 1), ("scan", 8), ("scan", 32), ("levels", 1), ("inverse", 1)}
    small = bn.ConstructionTable.chain(30).prepare(methods=["levels"])
    assert _planned(small) == {("levels", 1)}
    with pytest.raises(ValueError, match=r"unknown engine 'fft'; expected one of \("):
        small.prepare(methods=["fft"])


def test_dispatch_builds_no_scan_plan() -> None:
    tree = bn.ConstructionTable(_tree(400, 1))
    assert tree.depth > 8 and not tree.single_path
    ones = torch.ones(1024, 400)
    chosen = auto_method(tree, 1024, "cpu")  # the fused engine with numba, else the level engine
    assert chosen in ("fused", "levels")
    bn.to_cartesian(ones, ones, ones, tree)
    assert _planned(tree) == {(chosen, 1)}
    packed = bn.pack_tables([data.load("alanine_dipeptide").table] * 3)
    bn.to_cartesian(*(torch.ones(66),) * 3, packed)
    assert _planned(packed) == {(auto_method(packed, 1, "cpu"), 1)}


def test_single_path_agrees_with_the_scan_plan() -> None:
    tables = [bn.ConstructionTable.chain(n) for n in (1, 2, 3, 4, 40)]
    tables += [data.load(name).table for name in ("alanine_dipeptide", "benzene", "chain_20", "polyethylene")]
    tables += [bn.ConstructionTable(_tree(50, k)) for k in range(4)]
    tables += [bn.pack_tables([bn.ConstructionTable.chain(5), bn.ConstructionTable.chain(6)])]
    for table in tables:
        rounds = table.plan("scan").rounds
        assert table.single_path == all(r.path is not None for r in rounds), table
        assert table.single_path == single_path(table.topology)


def test_plans_are_entries_of_the_one_byte_budget() -> None:
    """Every table's plans share the process's byte budget with the pooled arrays: past it the least
    recently used plan of any table goes (a use marks a plan recent) and is made again, equal, on
    its table's next use; release() takes a table's plans out of the budget."""
    key = ("scan", 1, torch.device("cpu"))
    old = bn.cache_budget()
    try:
        a, b = bn.ConstructionTable.chain(300), bn.ConstructionTable.chain(301)
        first = a.plan("scan")
        b.plan("scan")
        assert a.plan("scan") is first  # a used last: b's plan is now the oldest entry
        size = b.cache_info()["plan_bytes"]
        assert size > 0
        bn.cache_budget(int(1.5 * size))  # room for one of the two plans
        assert key in a._state.plans and key not in b._state.plans
        b.plan("scan")  # made again: a's plan, now the oldest, goes
        assert key not in a._state.plans and key in b._state.plans
        again = a.plan("scan")
        assert again is not first and torch.equal(again.inverse, first.inverse)
        b.release()  # out of the budget: a's plan and one more fit
        bn.cache_budget(int(1.5 * size) + 1)
        assert key in a._state.plans
        bn.cache_budget(0)  # nothing kept between calls: every use makes its plan, never wrong
        assert not a._state.plans
        assert torch.equal(a.plan("scan").inverse, first.inverse) and not a._state.plans
    finally:
        bn.cache_budget(old)


def test_plan_first_built_in_inference_mode_serves_backward() -> None:
    for method in ("scan", "levels"):
        table = bn.ConstructionTable(_tree(40, 2))
        b, a, d = (1.0 + torch.rand(3, 40, dtype=torch.float64) for _ in range(3))
        with torch.inference_mode():
            bn.to_cartesian(b, a, d, table, method=method)
            bn.to_internal(torch.randn(40, 3), table)
        leaf = b.clone().requires_grad_()
        bn.to_cartesian(leaf, a, d, table, method=method).square().sum().backward()
        x = torch.randn(40, 3, requires_grad=True)
        bn.to_internal(x, table).dihedrals.sum().backward()
        assert torch.isfinite(leaf.grad).all() and torch.isfinite(x.grad).all()


def test_pickle_carries_rows_not_plans() -> None:
    table = bn.ConstructionTable(_tree(500, 3)).prepare()
    blob = pickle.dumps(table)
    assert b"ScanPlan" not in blob and b"LevelPlan" not in blob and b"torch" not in blob
    copy = pickle.loads(blob)
    assert copy == table and copy.depth == table.depth and copy.single_path == table.single_path
    assert _planned(copy) == set() and not copy.topology.refs.flags.writeable
    b, a, d = (1.0 + torch.rand(2, 500, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(bn.to_cartesian(b, a, d, copy), bn.to_cartesian(b, a, d, table))


@pytest.mark.compile
def test_compile_with_fullgraph_needs_prepared_plans() -> None:
    table = bn.ConstructionTable.chain(9)
    ic = (torch.ones(2, 9),) * 3
    fn = torch.compile(lambda b, a, d: bn.to_cartesian(b, a, d, table, method="scan"), fullgraph=True)
    # the reason names table.prepare where torch takes one (torch.compiler.disable(reason=...))
    with pytest.raises(Exception, match=r"call table\.prepare\(device\) before compiling|_make_plan"):
        fn(*ic)
    build = bn.compile_builder(bn.ConstructionTable.chain(9), method="auto")  # prepares per call
    torch.testing.assert_close(build(*ic), bn.to_cartesian(*ic, table))


@pytest.mark.compile
@pytest.mark.parametrize("method", ["auto", "scan", "levels"])
def test_compile_of_a_table_never_used_eagerly(method: str) -> None:
    """The plan is made eagerly at the table's first use inside the compiled function (a graph
    break): was a TorchRuntimeError from numpy's setflags on a FakeTensor (issue 43, item 9)."""
    table = bn.ConstructionTable.chain(7)
    b, a = torch.full((3, 7), 1.5), torch.full((3, 7), 1.9)
    d = torch.linspace(-3.0, 3.0, 21).reshape(3, 7)
    fn = torch.compile(lambda b, a, d: bn.to_cartesian(b, a, d, table, method=method).square().sum(-1))
    got = fn(b, a, d)
    torch.testing.assert_close(got, bn.to_cartesian(b, a, d, table, method=method).square().sum(-1))


def _pool_plan_oracle(
    need_block: np.ndarray, need_slot: np.ndarray, block_size: list[int]
) -> tuple[list[tuple[int, list[int] | None]], list[int] | None]:
    """One level's pool, block by block (the per-level planner the vectorised one replaces)."""
    parts, pool_row, offset = [], np.zeros(need_block.size, dtype=np.int64), 0
    for s in np.unique(need_block).tolist():
        sel = need_block == s
        used = np.unique(need_slot[sel])
        whole = 2 * used.size >= block_size[s]
        parts.append((s, None if whole else used.tolist()))
        pool_row[sel] = offset + (need_slot[sel] if whole else np.searchsorted(used, need_slot[sel]))
        offset += block_size[s] if whole else used.size
    in_order = pool_row.size == offset and np.array_equal(pool_row, np.arange(offset))
    return parts, None if in_order else pool_row.tolist()


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    block_size=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    seed=st.integers(0, 10_000),
)
def test_level_pools_match_the_per_level_planner(counts: list[int], block_size: list[int], seed: int) -> None:
    g = np.random.default_rng(seed)
    reader = np.repeat(np.arange(len(counts)), counts)
    blocks = g.integers(0, len(block_size), reader.size)
    slots = np.array([g.integers(0, block_size[b]) for b in blocks], dtype=np.int64)
    parts, gathers = _pool_plans(reader, blocks, slots, block_size, len(counts))
    for k in range(len(counts)):
        want_parts, want_gather = _pool_plan_oracle(blocks[reader == k], slots[reader == k], block_size)
        assert [(s, None if r is None else r.tolist()) for s, r in parts[k]] == want_parts
        assert (None if gathers[k] is None else gathers[k].tolist()) == want_gather
