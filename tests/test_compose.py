"""Plans of packed tables composed from their parts' plans (engines/compose.py) against planning anew.

The composed fused plan must behave exactly like the plan of the packed table made
from scratch: the same outputs and gradients bit for bit, and the same arrays
where the definitions agree (every part a single component or a single unit of its
own); the inverse plan is equal everywhere. ``PackedProteins`` (vectorised) is
checked against the loop it replaced, kept below as the oracle.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import batched_nerf as bn
from batched_nerf import engines
from batched_nerf.engines import compose
from batched_nerf.engines.compose import compose_fused, compose_inverse, worth_composing
from batched_nerf.engines.fused.build import UNIT_MIN_ATOMS, fused_plan
from batched_nerf.engines.inverse import inverse_plan
from batched_nerf.testing import construction_tables, fixed_positions, internal_coordinates

pytest.importorskip("numba", reason="the fused engine's CPU kernels need numba (the 'fast' extra)")


def tree(n: int, seed: int) -> np.ndarray:
    """A random branched single-component table of ``n`` atoms, rows in build order."""
    rng = np.random.default_rng(seed)
    refs = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]][:n]
    parent = [-1, 0, 1]
    for i in range(3, n):
        p = int(rng.integers(max(2, i - 8), i))
        a = parent[p]
        d = parent[a] if a > 0 else (2 if p != 2 else 0)
        if d in (p, a) or d < 0:
            d = 0 if 0 not in (p, a) else 1
        parent.append(p)
        refs.append([p, a, d])
    return np.asarray(refs, dtype=np.int64).reshape(-1, 3)


def anchored(n: int) -> bn.ConstructionTable:
    """A chain hanging from three fixed atoms (an anchored component)."""
    refs = [[-1, -1, -1]] * 3 + [[i - 1, i - 2, i - 3] for i in range(3, n)]
    return bn.ConstructionTable(refs, fixed=[0, 1, 2])


def planned(tables: list[bn.ConstructionTable]) -> list[bn.ConstructionTable]:
    for t in tables:
        t.plan("fused")
        t.plan("inverse")
    return tables


def anew(packed: bn.ConstructionTable) -> bn.ConstructionTable:
    """The same rows as a table of its own (no parts): planned from scratch."""
    return bn.ConstructionTable(packed.refs, packed.fixed)


def same_plan_arrays(got, want) -> None:
    np.testing.assert_array_equal(got.index, want.index)
    np.testing.assert_array_equal(got.starts, want.starts)
    np.testing.assert_array_equal(got.runs, want.runs)
    assert (got.width, got.reach) == (want.width, want.reach)


def inputs(table: bn.ConstructionTable, batch: int, seed: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    n = table.n_atoms
    bonds = 0.8 + torch.rand(batch, n, generator=g, dtype=dtype)
    angles = 0.4 + 2.3 * torch.rand(batch, n, generator=g, dtype=dtype)
    dihedrals = 6.0 * torch.rand(batch, n, generator=g, dtype=dtype) - 3.0
    fixed = None
    if table.n_fixed:
        # fixed atoms of each anchored part: a bent chain, well conditioned
        k = torch.arange(table.n_fixed, dtype=dtype)
        fixed = torch.stack([k, (k % 2) * 1.3, 0.2 * k], -1).expand(batch, -1, -1).contiguous()
    return bonds, angles, dihedrals, fixed


def same_outputs(packed: bn.ConstructionTable, batch: int = 3, seed: int = 0) -> None:
    """Outputs and gradients of the composed plan equal (bit for bit) those of the table planned anew."""
    other = anew(packed)
    b, a, d, f = inputs(packed, batch, seed)
    outs = []
    for table in (packed, other):
        leaves = [t.clone().requires_grad_() for t in (b, a, d)]
        xyz = bn.to_cartesian(*leaves, table, fixed_xyz=f, method="fused")
        grads = torch.autograd.grad((xyz * torch.cos(xyz)).sum(), leaves)
        ic = bn.to_internal(xyz.detach(), table, method="fused")
        outs.append((xyz.detach(), *grads, *ic))
    for got, want in zip(*outs):
        assert torch.equal(got, want)


# ------------------------------------------------------------------ equal arrays
def test_single_component_parts_equal_plan_arrays() -> None:
    sizes = (40, 700, 3, 1, 2, 300, 2_000, 90)
    parts = planned([bn.ConstructionTable(tree(n, seed=n)) for n in sizes])
    packed = bn.pack_tables(parts)
    got = packed.plan("fused")
    same_plan_arrays(got, fused_plan(packed.topology))
    assert got.starts.size > 2  # several units: the regrouping is exercised
    want = inverse_plan(packed.topology)
    got_inverse = packed.plan("inverse")
    for name in ("refs", "has_bond", "has_angle", "has_dihedral"):
        assert torch.equal(getattr(got_inverse, name), getattr(want, name))
    same_outputs(packed)


def test_anchored_parts_shift_fixed_slots() -> None:
    parts = planned([anchored(6), bn.ConstructionTable(tree(30, 1)), anchored(9)])
    packed = bn.pack_tables(parts)
    assert packed.n_fixed == 6
    same_plan_arrays(packed.plan("fused"), fused_plan(packed.topology))
    same_outputs(packed)


def test_protein_batch_equal_plan_arrays() -> None:
    seqs = ["ACDEFGHIK", "WY", "MKVLAAGG" * 8, "P"]
    parts = planned([bn.protein.protein_table(s).table for s in seqs])
    packed = bn.pack_tables(parts)
    same_plan_arrays(packed.plan("fused"), fused_plan(packed.topology))
    same_outputs(packed)


def test_nested_packs() -> None:
    inner = bn.pack_tables(planned([bn.ConstructionTable(tree(n, n)) for n in (5, 400)]))
    inner.plan("fused")
    outer = bn.pack_tables([*planned([bn.ConstructionTable(tree(50, 2))]), inner, anchored(5)])
    for t in outer._parts:
        t.plan("fused")
    same_plan_arrays(outer.plan("fused"), fused_plan(outer.topology))
    same_outputs(outer)


def test_units_regrouped_on_part_boundaries() -> None:
    # 300 parts of 4 atoms: one unit of the packed plan per >= 256 atoms, never splitting a part
    parts = planned([bn.ConstructionTable(tree(4, 0))]) * 300
    packed = bn.pack_tables(parts)
    plan = packed.plan("fused")
    assert set(plan.starts.tolist()) <= set(range(0, 1_201, 4))
    assert (np.diff(plan.starts)[:-1] >= UNIT_MIN_ATOMS).all()
    same_plan_arrays(plan, fused_plan(packed.topology))


# ------------------------------------------------------- same values, other units
@settings(max_examples=25)
@given(st.lists(construction_tables(max_atoms=30, max_components=4, fixed=None), min_size=1, max_size=4))
def test_any_parts_same_outputs(tables: list[bn.ConstructionTable]) -> None:
    packed = bn.pack_tables(planned(tables))
    plan = packed.plan("fused")
    # the composed units never split a part's unit; the part's rows stay together
    bounds = np.cumsum([0] + [t.n_atoms for t in tables])
    part_starts = {int(s) + int(o) for t, o in zip(tables, bounds) for s in t.plan("fused").starts}
    assert set(plan.starts.tolist()) <= part_starts | {packed.n_atoms}
    inverse = packed.plan("inverse")
    assert torch.equal(inverse.refs, inverse_plan(packed.topology).refs)
    same_outputs(packed, batch=2)


@settings(max_examples=10)
@given(construction_tables(max_atoms=20, max_components=3, fixed=True), st.data())
def test_anchored_random_same_outputs(table: bn.ConstructionTable, data: st.DataObject) -> None:
    packed = bn.pack_tables(planned([table, bn.ConstructionTable(tree(7, 3)), table]))
    other = anew(packed)
    ic = data.draw(internal_coordinates(packed, (2,)))
    fixed = data.draw(fixed_positions(packed, (2,)))
    got = bn.to_cartesian(*ic, packed, fixed_xyz=fixed, method="fused")
    want = bn.to_cartesian(*ic, other, fixed_xyz=fixed, method="fused")
    assert torch.equal(got, want)


def test_multi_component_part_coarser_units() -> None:
    # a part of 60 waters (180 atoms, one unit of its own) straddles a unit boundary of the packed
    # table: planned anew the packed plan splits it, composed it stays whole; the values are the same
    water = [[-1, -1, -1], [0, -1, -1], [0, 1, -1]]
    box = bn.ConstructionTable(
        [[r + 3 * k if r >= 0 else -1 for r in row] for k in range(60) for row in water]
    )
    packed = bn.pack_tables(planned([bn.ConstructionTable(tree(200, 0)), box]))
    got, want = packed.plan("fused"), fused_plan(packed.topology)
    np.testing.assert_array_equal(got.index, want.index)
    assert got.starts.tolist() == [0, 380] and want.starts.tolist() == [0, 257, 380]
    same_outputs(packed)


def test_second_order_and_gradcheck() -> None:
    parts = planned([bn.ConstructionTable(tree(6, 0)), bn.ConstructionTable(tree(5, 1))])
    packed = bn.pack_tables(parts)
    b, a, d, _ = inputs(packed, 2, 1)
    leaves = tuple(t.clone().requires_grad_() for t in (b, a, d))
    assert torch.autograd.gradcheck(lambda *x: bn.to_cartesian(*x, packed, method="fused"), leaves)
    assert torch.autograd.gradgradcheck(lambda *x: bn.to_cartesian(*x, packed, method="fused"), leaves)


# ----------------------------------------------------------------- when composed
def count_plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    real = engines.make_plan

    def counting(name, topo, variant=1):
        made.append(topo.n_atoms)
        return real(name, topo, variant)

    monkeypatch.setattr(engines, "make_plan", counting)
    return made


def test_composed_when_parts_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = planned([bn.ConstructionTable(tree(n, n)) for n in (30, 40, 50)])
    made = count_plans(monkeypatch)
    packed = bn.pack_tables(parts)
    packed.plan("fused")
    packed.plan("inverse")
    assert made == []  # nothing planned anew: composed
    packed.plan("levels")  # an engine that does not compose plans from scratch
    assert made == [120]


def test_many_unplanned_parts_planned_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = [bn.ConstructionTable(tree(20, k)) for k in range(64)]
    assert not worth_composing(20 * 64, 64)
    made = count_plans(monkeypatch)
    packed = bn.pack_tables(parts)
    packed.plan("fused")
    assert made == [1280]  # the packed table once; the parts stay unplanned
    assert all(not t._state.plans for t in parts)


def test_few_unplanned_parts_planned_then_composed(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = planned([bn.ConstructionTable(tree(500, k)) for k in range(4)])
    fresh = bn.ConstructionTable(tree(600, 9))
    made = count_plans(monkeypatch)
    bn.pack_tables([*parts, fresh]).plan("fused")
    assert made == [600]  # the new part, kept for later packs
    assert ("fused", 1, torch.device("cpu")) in fresh._state.plans


def test_pickled_pack_plans_anew() -> None:
    packed = bn.pack_tables(planned([bn.ConstructionTable(tree(9, 0)), anchored(5)]))
    again = pickle.loads(pickle.dumps(packed))
    assert again._parts is None and again == packed
    b, a, d, f = inputs(packed, 2, 0)
    got = bn.to_cartesian(b, a, d, again, fixed_xyz=f, method="fused")
    assert torch.equal(got, bn.to_cartesian(b, a, d, packed, fixed_xyz=f, method="fused"))


def test_policy() -> None:
    assert worth_composing(26_000, 32) and worth_composing(100, 1) and worth_composing(10, 0)
    assert not worth_composing(100, 2)
    assert compose.PLAN_ATOMS > 0


def test_compose_size_mismatch() -> None:
    a, b = bn.ConstructionTable(tree(5, 0)), bn.ConstructionTable(tree(6, 0))
    packed = bn.pack_tables([a, b])
    with pytest.raises(ValueError, match="the parts' plans hold 5 atoms, the packed topology 11"):
        compose_fused([fused_plan(a.topology)], packed.topology)
    with pytest.raises(ValueError, match="the parts' plans hold 6 atoms, the packed topology 11"):
        compose_inverse([inverse_plan(b.topology)], packed.topology)


# ------------------------------------------------------------- PackedProteins
def loop_packed(tables, n_total: int):
    """``PackedProteins.__init__``'s index maps as they were (a Python loop over the tables): the oracle."""
    b = len(tables)
    n_max = max(t.n_atoms for t in tables)
    l_max = max(t.n_residues for t in tables)
    positions = b * l_max
    sources, unpad, offset = [], [], 0
    for k, t in enumerate(tables):
        src = t.source.clone()
        own = src < t.n_atoms
        rel = src - t.n_atoms
        n_res = t.n_residues
        kind = torch.where(rel < 3 * n_res, rel // n_res, 3 + (rel - 3 * n_res) % 4)
        res = torch.where(rel < 3 * n_res, rel % n_res, (rel - 3 * n_res) // 4)
        pos = k * l_max + res
        packed = torch.where(
            kind < 3, n_total + kind * positions + pos, n_total + 3 * positions + 4 * pos + kind - 3
        )
        sources.append(torch.where(own, src + offset, packed))
        unpad.append(k * n_max + torch.arange(t.n_atoms))
        offset += t.n_atoms
    source, unpad_ = torch.cat(sources), torch.cat(unpad)
    pad = torch.full((b * n_max,), n_total, dtype=torch.long).index_put((unpad_,), torch.arange(n_total))
    chi = torch.zeros(b, l_max, 4, dtype=torch.float64)
    residue_index = torch.full((b, n_max), -1, dtype=torch.long)
    for k, t in enumerate(tables):
        chi[k, : t.n_residues] = t.default_chi
        residue_index[k, : t.n_atoms] = t.residue_index
    return {
        "source": source,
        "unpad": unpad_,
        "pad": pad,
        "bonds": torch.cat([t.bonds for t in tables]),
        "angles": torch.cat([t.angles for t in tables]),
        "dihedrals": torch.cat([t.dihedrals for t in tables]),
        "default_chi": chi,
        "residue_index": residue_index,
        "mask": residue_index >= 0,
    }


@pytest.mark.parametrize("hydrogens", [False, True])
@pytest.mark.parametrize(
    "sequences", [("ACDEFGHIKLMNPQRSTVWY", "G", "WWP"), ("ACE ALA NME", "KR", "HID CYX GLH"), ("M",)]
)
def test_packed_proteins_equal_the_loop(sequences: tuple[str, ...], hydrogens: bool) -> None:
    from batched_nerf.protein._build import PackedProteins

    packed = PackedProteins(tuple(bn.protein.protein_table(s).sequence for s in sequences), hydrogens)
    want = loop_packed(packed.tables, packed.table.n_atoms)
    for name, value in want.items():
        got = getattr(packed, name)
        assert got.dtype == value.dtype and torch.equal(got, value), name
