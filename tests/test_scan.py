"""The log-depth scan engine: frame-tree compilation, bands, dispatch, packing, precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import batched_nerf as bn
from batched_nerf import data
from batched_nerf.engines.dispatch import auto_method, scan_block
from batched_nerf.engines.levels import build_levels
from batched_nerf.engines.scan.build import build_scan
from batched_nerf.testing import construction_tables, fixed_positions, internal_coordinates

# Tables whose rows reference atoms freely (not only the primary / sibling
# patterns), so that irregular roots and several rounds are exercised.
IRREGULAR = [
    [-1, -1, -1],
    [0, -1, -1],
    [1, 0, -1],
    [2, 1, 0],
    [0, 1, 2],  # irregular: bond ref 0 is a seed, not a primary pattern
    [4, 0, 3],  # irregular (dihedral ref 3 is no sibling)
    [5, 4, 0],  # primary child of 5
    [6, 5, 4],
    [3, 2, 6],  # irregular, reads a scanned atom of the previous round
    [8, 3, 2],
]


def _build_all(table, b, a, d, fixed=None):  # type: ignore[no-untyped-def]
    ref = build_levels(table.plan("levels"), b, a, d, fixed)
    return ref, {k: build_scan(table.plan("scan", block=k), b, a, d, fixed) for k in (1, 2, 3, 8)}


@given(data=st.data(), table=construction_tables(max_atoms=30, fixed=None))
def test_bands_agree_with_levels(data: st.DataObject, table: bn.ConstructionTable) -> None:
    ic = data.draw(internal_coordinates(table, batch_shape=(2,)))
    fixed = data.draw(fixed_positions(table, batch_shape=(2,)))
    ref, outs = _build_all(table, *ic, fixed)
    for k, x in outs.items():
        torch.testing.assert_close(x, ref, atol=1e-10, rtol=0, msg=f"block {k}")


def test_irregular_rows_make_rounds() -> None:
    table = bn.ConstructionTable(IRREGULAR)
    plan = table.plan("scan")
    # 4 reads seeds only; 5 reads 4, placed in round 0; 8 reads 6, scanned below 5
    assert [r.irregular_atoms.tolist() for r in plan.rounds] == [[4], [5], [8]]
    g = torch.Generator().manual_seed(0)
    b = 1 + torch.rand(3, 10, generator=g, dtype=torch.float64)
    a = 0.5 + 2 * torch.rand(3, 10, generator=g, dtype=torch.float64)
    d = 6 * torch.rand(3, 10, generator=g, dtype=torch.float64) - 3
    ref, outs = _build_all(table, b, a, d)
    for x in outs.values():
        torch.testing.assert_close(x, ref, atol=1e-12, rtol=0)


def test_chain_is_one_round_of_log_depth() -> None:
    plan = bn.ConstructionTable.chain(4096).plan("scan")
    (rnd,) = plan.rounds
    assert rnd.irregular_atoms.numel() == 0 and rnd.n_anchor == 1
    assert len(rnd.jumps) == 12  # ceil(log2(4094 scanned depths))
    blocked = bn.ConstructionTable.chain(4096).plan("scan", block=32).rounds[0]
    assert len(blocked.step_sizes) == 32 and len(blocked.jumps) == 7


def test_siblings_join_the_scan() -> None:
    """Hydrogens referencing a sibling around the same axis are scanned, not irregular."""
    methane_like = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [3, 2, 4], [3, 2, 5]]
    plan = bn.ConstructionTable(methane_like).plan("scan")
    assert sum(r.irregular_atoms.numel() for r in plan.rounds) == 0
    assert plan.phi_paths[6].tolist() == [6, 5, 4]


def test_gradgradcheck_blocked_scan() -> None:
    table = bn.ConstructionTable.chain(7)
    g = torch.Generator().manual_seed(1)
    ic = [
        (1 + torch.rand(7, generator=g, dtype=torch.float64)).requires_grad_(),
        (0.5 + 2 * torch.rand(7, generator=g, dtype=torch.float64)).requires_grad_(),
        (6 * torch.rand(7, generator=g, dtype=torch.float64) - 3).requires_grad_(),
    ]
    plan = table.plan("scan", block=2)
    fn = lambda b, a, d: build_scan(plan, b, a, d, None)  # noqa: E731
    assert torch.autograd.gradcheck(fn, ic)
    assert torch.autograd.gradgradcheck(fn, ic)


def test_vmap_blocked_scan() -> None:
    table = bn.ConstructionTable.chain(9)
    plan = table.plan("scan", block=3)
    g = torch.Generator().manual_seed(2)
    b, a, d = (1 + torch.rand(4, 9, generator=g, dtype=torch.float64) for _ in range(3))
    out = torch.func.vmap(lambda b, a, d: build_scan(plan, b, a, d, None))(b, a, d)
    torch.testing.assert_close(out, build_scan(plan, b, a, d, None))


def _tree_refs(n: int) -> np.ndarray:
    """A random tree table: atom i hangs from one of the 8 atoms before it (depth ~ n / 4)."""
    g = np.random.default_rng(0)
    refs = np.full((n, 3), -1, dtype=np.int64)
    refs[1, 0], refs[2, :2] = 0, (1, 0)
    for i in range(3, n):
        b = int(g.integers(max(2, i - 8), i))
        a = int(refs[b, 0]) if refs[b, 0] >= 0 else (b - 1)
        d = int(refs[b, 1]) if refs[b, 1] >= 0 else next(k for k in range(i) if k not in (a, b))
        refs[i] = (b, a, d)
    return refs


def _choose(table: bn.ConstructionTable, samples: int) -> str:
    # the rule among the torch engines (compiled builds, machines without numba; fused: test_fused.py)
    return auto_method(table, samples, "cpu", compiled=True)


def test_dispatch_rules() -> None:
    assert _choose(bn.ConstructionTable.chain(4096), 1) == "scan"
    assert _choose(bn.ConstructionTable.chain(3), 1) == "levels"
    assert _choose(data.load("benzene").table, 4096) == "levels"
    alanine = data.load("alanine_dipeptide").table
    assert {_choose(alanine, b) for b in (1, 64, 4096)} == {"levels"}  # shallow: levels at any batch
    chain = bn.ConstructionTable.chain(512)
    assert [_choose(chain, b) for b in (1, 256, 1024, 4096)] == ["scan", "scan", "scan", "levels"]
    tree = bn.ConstructionTable(_tree_refs(512))
    assert [_choose(tree, b) for b in (64, 1024)] == ["scan", "levels"]  # branched: levels from B = 1024
    assert scan_block(512, 1) == 1 and scan_block(4096, 256) == 32


def test_auto_equals_methods(method: str) -> None:
    table = data.load("alanine_dipeptide").table
    g = torch.Generator().manual_seed(3)
    b = 1 + torch.rand(5, 22, generator=g, dtype=torch.float64)
    a = 0.5 + 2 * torch.rand(5, 22, generator=g, dtype=torch.float64)
    d = 6 * torch.rand(5, 22, generator=g, dtype=torch.float64) - 3
    ref = bn.to_cartesian(b, a, d, table, method="levels")
    torch.testing.assert_close(bn.to_cartesian(b, a, d, table, method=method), ref, atol=1e-12, rtol=0)


def test_accumulate_dtype_improves_float32() -> None:
    n = 4096
    table = bn.ConstructionTable.chain(n)
    g = torch.Generator().manual_seed(4)
    b = 1.5 + 0.1 * torch.rand(n, generator=g)
    a = 1.9 + 0.2 * torch.rand(n, generator=g)
    d = 6 * torch.rand(n, generator=g) - 3
    ref = bn.to_cartesian(b.double(), a.double(), d.double(), table)
    plain = bn.to_cartesian(b, a, d, table, method="scan")
    acc = bn.to_cartesian(b, a, d, table, method="scan", accumulate_dtype=torch.float64)
    assert acc.dtype == torch.float32
    err_plain = (plain.double() - ref).abs().max().item()
    err_acc = (acc.double() - ref).abs().max().item()
    assert err_acc < 1e-5 < err_plain
    with pytest.raises(ValueError, match="accumulate_dtype must be a floating dtype"):
        bn.to_cartesian(b, a, d, table, accumulate_dtype=torch.int64)


def test_pack_and_split() -> None:
    mols = [data.load(name) for name in ("alanine_dipeptide", "benzene", "chain_20")]
    tables = [m.table for m in mols]
    packed = bn.pack_tables(tables)
    assert packed.n_atoms == sum(t.n_atoms for t in tables) and packed.n_components == 3
    values = [
        torch.cat([torch.as_tensor(getattr(m, k)) for m in mols]) for k in ("bonds", "angles", "dihedrals")
    ]
    parts = bn.split_atoms(bn.to_cartesian(*values, packed), tables)
    for m, t, x in zip(mols, tables, parts):
        single = bn.to_cartesian(
            *(torch.as_tensor(getattr(m, k)) for k in ("bonds", "angles", "dihedrals")), t
        )
        torch.testing.assert_close(x, single)
    with pytest.raises(ValueError, match="at least one table"):
        bn.pack_tables([])
    with pytest.raises(TypeError, match=r"tables\[1\] must be a ConstructionTable"):
        bn.pack_tables([tables[0], "benzene"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="add up to 3 atoms"):
        bn.split_atoms(torch.zeros(5, 3), [1, 2])


def test_pack_keeps_fixed_atoms() -> None:
    anchored = bn.ConstructionTable([[-1, -1, -1]] * 3 + [[0, 1, 2]], fixed=[0, 1, 2])
    packed = bn.pack_tables([bn.ConstructionTable.chain(4), anchored])
    assert packed.fixed.tolist() == [4, 5, 6]


@pytest.mark.compile
def test_compile_fullgraph_matches_eager() -> None:
    table = bn.ConstructionTable.chain(12).prepare()  # plans are made on first use: ahead of a trace
    g = torch.Generator().manual_seed(5)
    b, a, d = (1 + torch.rand(3, 12, generator=g) for _ in range(3))
    compiled = torch.compile(lambda b, a, d: bn.to_cartesian(b, a, d, table, method="scan"), fullgraph=True)
    torch.testing.assert_close(compiled(b, a, d), bn.to_cartesian(b, a, d, table, method="scan"))


def test_plans_are_cached() -> None:
    table = bn.ConstructionTable.chain(10)
    assert table.plan("scan") is table.plan("scan")
    assert table.plan("scan", block=8) is table.plan("scan", "cpu", 8)
    with pytest.raises(ValueError, match="unknown plan kind"):
        table.plan("fft")
    assert np.array_equal(table.prepare().refs.numpy(), table.refs.numpy())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_and_cuda0_share_plans() -> None:
    table = bn.ConstructionTable.chain(10).prepare("cuda")
    assert table.plan("scan", "cuda") is table.plan("scan", f"cuda:{torch.cuda.current_device()}")


def test_angles_outside_zero_pi_agree() -> None:
    """A sibling or third seed placed with sin(angle) < 0 turns the shared frame by pi."""
    g = torch.Generator().manual_seed(7)
    for refs in (
        IRREGULAR,
        [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [0, 1, 2], [0, 1, 3], [1, 0, 2], [5, 1, 0]],
    ):
        table = bn.ConstructionTable(refs)
        n = table.n_atoms
        b = 1 + torch.rand(4, n, generator=g, dtype=torch.float64)
        # angles in (-pi, 2 pi) away from the singular multiples of pi
        a = (0.2 + 2.7 * torch.rand(4, n, generator=g, dtype=torch.float64)) * torch.where(
            torch.rand(4, n, generator=g) < 0.5, -1.0, 1.0
        ).double()
        d = 6 * torch.rand(4, n, generator=g, dtype=torch.float64) - 3
        ref, outs = _build_all(table, b, a, d)
        for x in outs.values():
            torch.testing.assert_close(x, ref, atol=1e-9, rtol=0)
