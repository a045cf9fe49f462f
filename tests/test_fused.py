"""The fused engine (one compiled kernel per pass): values, derivatives, dispatch and backends.

Values must equal the scan engine's (the frame-tree convention) in float64,
degenerate inputs included; derivatives of every order and every torch.func
transform must work. Skipped, with the reason, where numba is absent (the core
tests then still run every other engine).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import frames_to_cartesian
from test_frame_tree import SIBLINGS
from test_scan import IRREGULAR
from torch.autograd import gradcheck, gradgradcheck

import batched_nerf as bn
from batched_nerf.engines import backends, dispatch
from batched_nerf.testing import construction_tables, fixed_positions, internal_coordinates

pytest.importorskip("numba", reason='the fused engine needs numba: pip install -e ".[fast]"')

F64 = torch.float64
FIXED = bn.ConstructionTable(
    [[-1, -1, -1], [3, 0, 5], [1, 3, 0], [-1, -1, -1], [2, 1, 3], [-1, -1, -1]], fixed=[3, 0, 5]
)


def _ic(table: bn.ConstructionTable, batch: tuple[int, ...] = (3,), seed: int = 0, dtype=F64):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    n = table.n_atoms
    b = 1.0 + 0.5 * torch.rand(*batch, n, generator=g, dtype=F64)
    a = 0.6 + 1.9 * torch.rand(*batch, n, generator=g, dtype=F64)
    d = math.pi * (2 * torch.rand(*batch, n, generator=g, dtype=F64) - 1)
    return tuple(t.to(dtype) for t in (b, a, d))


def _fixed(batch: tuple[int, ...] = (3,), seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.tensor([[0.0, 0.0, 0.0], [1.5, 0.0, 0.0], [2.0, 1.4, 0.0]], dtype=F64)
    return base + 0.2 * torch.randn(*batch, 3, 3, generator=g, dtype=F64)


def _both(table, b, a, d, fixed_xyz=None):  # type: ignore[no-untyped-def]
    fused = bn.to_cartesian(b, a, d, table, method="fused", fixed_xyz=fixed_xyz)
    scan = bn.to_cartesian(b, a, d, table, method="scan", fixed_xyz=fixed_xyz)
    return fused, scan


TABLES = {
    "chain": bn.ConstructionTable.chain(40),
    "irregular": bn.ConstructionTable(IRREGULAR),
    "siblings": bn.ConstructionTable(SIBLINGS),
    "alanine": bn.data.load("alanine_dipeptide").table,
    "benzene": bn.data.load("benzene").table,
    "protein": bn.protein.protein_table("GAWKYC").table,
    "packed": bn.pack_tables([bn.ConstructionTable.chain(5), bn.ConstructionTable(SIBLINGS), FIXED]),
}


# ----------------------------------------------------------------- values
@pytest.mark.parametrize("name", list(TABLES))
def test_equals_scan_and_levels_float64(name: str) -> None:
    table = TABLES[name]
    b, a, d = _ic(table)
    fx = _fixed((3,)) if table.n_fixed else None
    fused, scan = _both(table, b, a, d, fx)
    levels = bn.to_cartesian(b, a, d, table, method="levels", fixed_xyz=fx)
    assert fused.dtype == F64 and fused.shape == (3, table.n_atoms, 3)
    torch.testing.assert_close(fused, scan, atol=1e-10, rtol=0)
    torch.testing.assert_close(fused, levels, atol=1e-10, rtol=0)


@settings(max_examples=25)
@given(data=st.data())
def test_random_tables_equal_scan(data: st.DataObject) -> None:
    table = data.draw(construction_tables(max_atoms=30, max_components=3, fixed=None))
    b, a, d = data.draw(internal_coordinates(table, batch_shape=(2,)))
    fx = data.draw(fixed_positions(table, batch_shape=(2,))) if table.n_fixed else None
    fused, scan = _both(table, b, a, d, fx)
    torch.testing.assert_close(fused, scan, atol=1e-10, rtol=0)


def test_many_components_and_units() -> None:
    """A table of many molecules is split into several work units; every unit is built."""
    table = bn.pack_tables([bn.data.load("alanine_dipeptide").table] * 40)  # 880 atoms, several units
    plan = table.plan("fused")
    assert plan.starts.size - 1 > 1
    b, a, d = _ic(table, (5,))
    fused, scan = _both(table, b, a, d)
    torch.testing.assert_close(fused, scan, atol=1e-10, rtol=0)


@pytest.mark.parametrize("batch", [(), (1,), (2, 3), (4, 1, 2)])
def test_leading_shapes(batch: tuple[int, ...]) -> None:
    table = TABLES["siblings"]
    b, a, d = _ic(table, batch)
    fused, scan = _both(table, b, a, d)
    assert fused.shape == (*batch, table.n_atoms, 3)
    torch.testing.assert_close(fused, scan, atol=1e-10, rtol=0)


def test_broadcast_inputs_and_fixed() -> None:
    b, a, d = _ic(FIXED, (3,))
    fx = _fixed((2, 1))  # broadcasts against (3,) -> (2, 3)
    fused, scan = _both(FIXED, b[0], a, d[:1], fx)
    assert fused.shape == (2, 3, FIXED.n_atoms, 3)
    torch.testing.assert_close(fused, scan, atol=1e-10, rtol=0)
    torch.testing.assert_close(fused[..., [3, 0, 5], :], fx.expand(2, 3, 3, 3))


def test_parallel_kernel_matches_serial() -> None:
    """Enough work for the threaded kernels (forward and backward): same results as small calls."""
    table = TABLES["protein"]
    b, a, d = (t.requires_grad_() for t in _ic(table, (64,)))
    x = bn.to_cartesian(b, a, d, table, method="fused")
    g = torch.randn_like(x)
    grads = torch.autograd.grad(x, (b, a, d), g)
    for k in (0, 63):
        xk = bn.to_cartesian(b[k], a[k], d[k], table, method="fused")
        torch.testing.assert_close(x[k], xk, atol=1e-12, rtol=0)
        gk = torch.autograd.grad(xk, (b, a, d), g[k])
        for full, one in zip(grads, gk):
            torch.testing.assert_close(full[k], one[k], atol=1e-10, rtol=0)


#: Units of several CHUNKs of rows (references across chunk boundaries; the forward's ring of
#: scratch rows wraps around), for the blocked kernels; chain700 is wider than the blocked backward
#: takes (its backward runs per sample). Blocked calls expected over the three batches below.
WIDE = {
    "protein36": bn.protein.protein_table("GAWKYC" * 6).table,
    "chain700": bn.ConstructionTable.chain(700),
}
BLOCKED_CALLS = {"chain700": 3}


@pytest.mark.parametrize("name", [*TABLES, *WIDE])
def test_sample_blocks_equal_scan(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """From BLOCK_MIN samples on: the blocked kernels (SIMD across samples); one short block (spare
    lanes), a full block and a short one, many blocks; units of several chunks of rows."""
    from batched_nerf.engines.fused.cpu import blocks as fused_numba_blocks
    from batched_nerf.engines.fused.cpu import build as fused_numba

    calls: list[bool] = []  # whether each call took the blocked kernels
    choose = fused_numba._blocked
    monkeypatch.setattr(fused_numba, "_blocked", lambda *args: calls.append(choose(*args)) or calls[-1])
    for bound in ("SERIAL_WORK", "TBB_SERIAL_WORK", "WORKQUEUE_SERIAL_WORK"):  # the counts below, any layer
        monkeypatch.setattr(fused_numba, bound, 16384)
    table = {**TABLES, **WIDE}[name]
    if name in WIDE:
        assert 3 * fused_numba_blocks.CHUNK < table.n_atoms <= fused_numba.FORWARD_MAX_WIDTH
    lanes = fused_numba.LANES
    for batch in (fused_numba.BLOCK_MIN, lanes + 5, 9 * lanes + 12):  # degenerate inputs: test_degenerate.py
        b, a, d = _ic(table, (batch,), seed=batch)
        b[4, -1] = -1.0  # a negative bond: NaN for that atom and those built from it
        fx = _fixed((batch,)) if table.n_fixed else None
        leaves = [t.requires_grad_() for t in (b, a, d, *([fx] if fx is not None else []))]
        w = torch.randn(batch, table.n_atoms, 3, dtype=F64, generator=torch.Generator().manual_seed(7))
        got = {}
        for method in ("fused", "scan"):
            x = bn.to_cartesian(b, a, d, table, method=method, fixed_xyz=fx)
            got[method] = (x, *torch.autograd.grad(x.nan_to_num(0.0).mul(w).sum(), leaves))
        for f, want in zip(got["fused"], got["scan"]):  # positions, then gradients of every input
            torch.testing.assert_close(f, want, atol=1e-9, rtol=0, equal_nan=True)
        one = bn.to_cartesian(
            b[-1], a[-1], d[-1], table, method="fused", fixed_xyz=None if fx is None else fx[-1]
        )
        torch.testing.assert_close(got["fused"][0][-1], one, atol=1e-12, rtol=0)  # the per-sample kernel
    # the blocked kernels ran: forward and backward of each batch (the 16 and 21 samples run on the
    # calling thread: below the bound of 16,384; chain700's backward per sample: wider than the blocked one)
    assert calls.count(True) == BLOCKED_CALLS.get(name, 6)


# ------------------------------------------------- the kernels' cos / sin
def test_trig_constants_split_half_pi_exactly() -> None:
    """``h1 + h2 + h3 = pi/2`` to 1e-35 (exact binary sum vs 50 digits of pi); heads of 33 bits."""
    from fractions import Fraction

    from batched_nerf.engines.fused.cpu.trig import PIO2

    pi = Fraction("3.14159265358979323846264338327950288419716939937510")
    assert abs(sum(Fraction(h) for h in PIO2) - pi / 2) < Fraction(1, 10**35)
    for head in PIO2[:2]:
        assert (Fraction(head) * 2 ** (33 - math.frexp(head)[1])).denominator == 1


@pytest.mark.parametrize("scale", [1.0, 4.0, 1e3, 1e5, 1e9])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_trig_within_two_ulp_of_libm(scale: float, dtype: type) -> None:
    """cos and sin of the angles and dihedrals, every quadrant, large values (libm past LIMIT)."""
    from batched_nerf.engines.fused.cpu.trig import trig

    rng = np.random.default_rng(int(scale))
    a, d = (np.ascontiguousarray(scale * (2 * rng.random((64, 300)) - 1), dtype=dtype) for _ in range(2))
    got = trig(a, d)
    want = [f(x.astype(np.float64)) for f in (np.cos, np.sin) for x in (a, d)]
    for g, w in zip(got, want):
        assert np.all(np.abs(g - w) <= 2 * np.spacing(np.maximum(np.abs(w), 0.5)))


def test_trig_special_values() -> None:
    from batched_nerf.engines.fused.cpu.trig import trig

    x = np.array([[0.0, -0.0, math.pi / 2, -math.pi, 1e300, np.inf, -np.inf, np.nan]])
    cos, _, sin, _ = trig(x, x)
    np.testing.assert_array_equal(np.isnan(cos), [[False] * 5 + [True] * 3])
    np.testing.assert_array_equal(np.isnan(sin), [[False] * 5 + [True] * 3])
    np.testing.assert_allclose(cos[0, :5], np.cos(x[0, :5]), rtol=0, atol=4.5e-16)
    np.testing.assert_allclose(sin[0, :5], np.sin(x[0, :5]), rtol=0, atol=4.5e-16)


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gathered_trig_equals_gathering_then_trig(
    threaded: bool, dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pass gathering rows from three value arrays (one of them a single row every sample reads)
    and the constants, constants past each sample's count, with the rows' cos and sin: the bonds and
    the trig array equal numpy's gather followed by `trig`, bit for bit, on this thread and threaded."""
    from batched_nerf.engines.fused.cpu import trig as cpu_trig

    if threaded:
        monkeypatch.setattr(cpu_trig, "SERIAL_VALUES", 0)
        monkeypatch.setattr(cpu_trig, "WORKQUEUE_SERIAL_VALUES", 0)
    rng = np.random.default_rng(5)
    m, k, n = 7, 12, 30
    values = (rng.normal(size=(m, k)), rng.normal(size=(1, k)) * 4.0, rng.normal(size=(m, k)) * 1e6)
    values = tuple(v.astype(dtype) for v in values)
    values[0][2, 3] = np.nan  # NaN read where it is gathered
    consts = rng.normal(size=5).astype(dtype)
    which = rng.integers(0, 4, size=(3, n))
    column = np.where(which == 3, rng.integers(0, 5, size=(3, n)), rng.integers(0, k, size=(3, n)))
    fallback = rng.integers(0, 5, size=(3, n))
    count = np.array([n, 0, 1, 17, n, 29, 5], dtype=np.int64)
    bonds, got = cpu_trig.gathered_trig(values, consts, which, column, count, fallback, m)
    wide = [np.broadcast_to(v, (m, k)) for v in values] + [np.broadcast_to(consts, (m, 5))]
    flat = np.concatenate(wide, axis=1)
    offsets = np.array([0, k, 2 * k, 3 * k])
    rows = flat[:, offsets[which] + column]  # (m, 3, n)
    past = np.arange(n)[None, None, :] >= count[:, None, None]
    rows = np.where(past, consts[fallback][None], rows)
    assert bonds.dtype == dtype and got.dtype == np.float64
    np.testing.assert_array_equal(bonds, rows[:, 0])
    np.testing.assert_array_equal(
        got, cpu_trig.trig(np.ascontiguousarray(rows[:, 1]), np.ascontiguousarray(rows[:, 2]))
    )


@pytest.mark.parametrize("scale", [1e-300, 1e-5, 1.0, 1e5, 1e300])
def test_atan2_within_two_ulp_of_libm(scale: float) -> None:
    """Angles and dihedrals from the inverse kernel's atan2 arguments: every octant, zeros."""
    from batched_nerf.engines.fused.cpu.trig import angles

    rng = np.random.default_rng(3)
    args = scale * rng.standard_normal((4, 50, 400))
    args[2:, 0] = 0.0  # x = 0
    args[:2, 1] = 0.0  # y = 0
    args[:2, 2] = args[2:, 2]  # |y| = |x|, pi/4 and its odd multiples
    got = [np.empty((50, 400)), np.empty((50, 400), dtype=np.float32)]
    angles(args, *got)
    for g, want in zip(got, (np.arctan2(args[0], args[2]), np.arctan2(args[1], args[3]))):
        want = np.where(want <= -np.pi, want + 2 * np.pi, want).astype(g.dtype)
        assert np.all(np.abs(g - want) <= 2 * np.spacing(np.maximum(np.abs(want), np.finfo(g.dtype).tiny)))


def test_atan2_special_values() -> None:
    """(0, 0) reads 0 (the engines' rule), -0 for y reads +pi (the (-pi, pi] wrap); inf, NaN."""
    from batched_nerf.engines.fused.cpu.trig import angles

    y = np.array([0.0, 0.0, -0.0, 1.0, np.inf, np.inf, np.nan, 1.0])
    x = np.array([0.0, -1.0, -1.0, -np.inf, np.inf, -np.inf, 1.0, np.nan])
    out = np.empty(8)
    angles(np.stack([y, y, x, x]), out, out.copy())
    np.testing.assert_array_equal(out[:6], [0.0, math.pi, math.pi, math.pi, math.pi / 4, 3 * math.pi / 4])
    assert np.isnan(out[6:]).all()


def test_sample_blocks_float32() -> None:
    """float32 in, float32 out through the blocked kernels, float64 accumulation: as the float64 build."""
    table = TABLES["protein"]
    b, a, d = (t.float().double() for t in _ic(table, (40,), seed=3))  # float32-representable inputs
    x32 = bn.to_cartesian(b.float(), a.float(), d.float(), table, method="fused")
    x64 = bn.to_cartesian(b, a, d, table, method="scan")
    assert x32.dtype == torch.float32
    torch.testing.assert_close(x32.double(), x64, atol=2e-5, rtol=0)
    leaves = [t.float().requires_grad_() for t in (b, a, d)]
    g32 = torch.autograd.grad(bn.to_cartesian(*leaves, table, method="fused").sum(), leaves)
    leaves64 = [t.requires_grad_() for t in (b, a, d)]
    g64 = torch.autograd.grad(bn.to_cartesian(*leaves64, table, method="scan").sum(), leaves64)
    for got, want in zip(g32, g64):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=1e-5)


# ------------------------------------------------- degenerate inputs, NaN
def _degenerate(table: bn.ConstructionTable, seed: int = 0):  # type: ignore[no-untyped-def]
    b, a, d = _ic(table, (4,), seed)
    n = table.n_atoms
    b[0, ::3] = 0.0  # zero bonds
    a[1, ::2] = 0.0  # zero angles
    a[2, 1::2] = math.pi  # straight angles
    b[3, :] = 0.0  # everything coincident
    a[3, ::2] = math.pi
    return b, a, d, n


@pytest.mark.parametrize("name", ["chain", "irregular", "siblings", "alanine", "protein"])
def test_degenerate_inputs_equal_scan(name: str) -> None:
    table = TABLES[name]
    b, a, d, _ = _degenerate(table)
    fused, scan = _both(table, b, a, d)
    assert torch.isfinite(fused).all()
    torch.testing.assert_close(fused, scan, atol=1e-9, rtol=0)
    refs = np.asarray(table.refs)
    for k in range(4):
        ref = frames_to_cartesian(refs, b[k].numpy(), a[k].numpy(), d[k].numpy())
        np.testing.assert_allclose(fused[k].numpy(), ref, atol=1e-9)


def test_singular_geometry_gradients_finite() -> None:
    """Collinear references, coincident atoms, straight angles: finite first and second derivatives."""
    table = TABLES["irregular"]
    b, a, d, _ = _degenerate(table)
    b, a, d = (t.requires_grad_() for t in (b, a, d))
    x = bn.to_cartesian(b, a, d, table, method="fused")
    grads = torch.autograd.grad((x * torch.randn_like(x)).sum(), (b, a, d), create_graph=True)
    assert all(torch.isfinite(g).all() for g in grads)
    second = torch.autograd.grad(sum((g * g).sum() for g in grads), (b, a, d))
    assert all(torch.isfinite(g).all() for g in second)
    xs = bn.to_cartesian(b, a, d, table, method="scan")
    ref = torch.autograd.grad((xs * torch.randn_like(xs)).sum(), (b, a, d))
    assert all(torch.isfinite(g).all() for g in ref)


def test_nan_propagates() -> None:
    table = TABLES["chain"]
    b, a, d = _ic(table, (2,))
    b[0, 10] = float("nan")
    d[1, 20] = float("nan")
    fused, scan = _both(table, b, a, d)
    assert torch.equal(torch.isnan(fused), torch.isnan(scan))
    assert torch.isnan(fused[0, 10:]).all() and not torch.isnan(fused[0, :10]).any()
    assert torch.isnan(fused[1, 20:]).all() and not torch.isnan(fused[1, :20]).any()


# --------------------------------------------------------- derivatives
@pytest.mark.parametrize("name", ["irregular", "siblings", "packed"])
def test_gradcheck_and_gradgradcheck(name: str) -> None:
    table = TABLES[name]
    inputs = [t.requires_grad_() for t in _ic(table, (2,))]
    if table.n_fixed:
        inputs.append(_fixed((2,)).requires_grad_())

    def fn(b, a, d, *fx):  # type: ignore[no-untyped-def]
        return bn.to_cartesian(b, a, d, table, method="fused", fixed_xyz=fx[0] if fx else None)

    assert gradcheck(fn, inputs, fast_mode=True)
    assert gradgradcheck(fn, inputs, fast_mode=True)


def test_gradients_equal_scan() -> None:
    table = TABLES["protein"]
    b, a, d = (t.requires_grad_() for t in _ic(table, (3,)))
    g = torch.randn(3, table.n_atoms, 3, dtype=F64)
    fused, scan = _both(table, b, a, d)
    gf = torch.autograd.grad(fused, (b, a, d), g)
    gs = torch.autograd.grad(scan, (b, a, d), g)
    for x, y in zip(gf, gs):
        torch.testing.assert_close(x, y, atol=1e-9, rtol=0)


def test_committor_create_graph_and_third_order() -> None:
    """A loss of the gradient (create_graph=True), then one more derivative: equal to scan's."""
    table = TABLES["siblings"]
    out = []
    for method in ("fused", "scan"):
        b, a, d = (t.requires_grad_() for t in _ic(table, (2,), seed=4))
        x = bn.to_cartesian(b, a, d, table, method=method)
        q = torch.sigmoid((x[..., -1, :] - x[..., 0, :]).sum(-1)).sum()
        (gd,) = torch.autograd.grad(q, (d,), create_graph=True)
        loss = (gd * gd).sum()
        (g2,) = torch.autograd.grad(loss, (d,), create_graph=True)
        (g3,) = torch.autograd.grad(g2.sum(), (b,))
        out.append((gd.detach(), g2.detach(), g3))
    for x, y in zip(*out):
        torch.testing.assert_close(x, y, atol=1e-8, rtol=0)


def test_torch_func_transforms() -> None:
    table = TABLES["siblings"]
    b, a, d = _ic(table, (2,))

    def f(b, a, d):  # type: ignore[no-untyped-def]
        return bn.to_cartesian(b, a, d, table, method="fused")

    def s(b, a, d):  # type: ignore[no-untyped-def]
        return bn.to_cartesian(b, a, d, table, method="scan")

    torch.testing.assert_close(torch.func.vmap(f)(b, a, d), s(b, a, d))
    torch.testing.assert_close(torch.func.vmap(f, in_dims=(0, None, 0))(b, a[0], d), s(b, a[0], d))
    for jac in (torch.func.jacrev, torch.func.jacfwd):
        torch.testing.assert_close(jac(f, argnums=2)(b[0], a[0], d[0]), jac(s, argnums=2)(b[0], a[0], d[0]))

    def energy(fn):  # type: ignore[no-untyped-def]
        return lambda d: (fn(b[0], a[0], d) ** 2).sum()

    torch.testing.assert_close(torch.func.grad(energy(f))(d[0]), torch.func.grad(energy(s))(d[0]))
    torch.testing.assert_close(torch.func.hessian(energy(f))(d[0]), torch.func.hessian(energy(s))(d[0]))
    per_sample = torch.func.vmap(torch.func.grad(energy(f)))(d)
    assert per_sample.shape == d.shape


# --------------------------------------------------------- float32 accuracy
@pytest.mark.parametrize(
    ("n", "bound"),
    [(4096, 4.4e-4), (30_000, 2.2e-3), pytest.param(100_000, 1e-2, marks=pytest.mark.slow)],
)
def test_float32_accuracy(n: int, bound: float) -> None:
    """Float32 inputs, float64 accumulation inside: error against a float64 build, in Angstrom."""
    table = bn.ConstructionTable.chain(n)
    g = torch.Generator().manual_seed(0)
    b = (1.4 + 0.2 * torch.rand(n, generator=g, dtype=F64)).float()
    a = (1.8 + 0.4 * torch.rand(n, generator=g, dtype=F64)).float()
    d = (math.pi * (2 * torch.rand(n, generator=g, dtype=F64) - 1)).float()
    x32 = bn.to_cartesian(b, a, d, table, method="fused")
    x64 = bn.to_cartesian(b.double(), a.double(), d.double(), table, method="fused")
    assert x32.dtype == torch.float32
    err = (x32.double() - x64).norm(dim=-1).max().item()
    assert err <= bound


# ---------------------------------------------------- dispatch, backends
def test_auto_picks_fused_when_available() -> None:
    assert dispatch.choose_method(509, True, 256, "cpu", fused=True) == "fused"
    assert dispatch.choose_method(6, False, 1024, "cpu", fused=True) == "fused"
    assert dispatch.choose_method(6, False, 4096, "cpu", fused=True) == "fused"  # every batch size
    assert dispatch.choose_method(509, True, 256, "cpu") == "scan"
    assert dispatch.auto_method(TABLES["chain"], 4, "cpu") == "fused"
    assert dispatch.auto_method(TABLES["chain"], 4, "cpu", compiled=True) != "fused"


def test_backends_report() -> None:
    info = bn.backends()
    assert info["numba"] is not None and info["fused"]["cpu"] and info["auto"]["cpu"]
    assert info["install"] == 'pip install "numba>=0.59" scipy (from a clone: pip install -e ".[fast]")'


def test_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    """No backend: auto never picks fused, everything else works, fused names the install command."""
    monkeypatch.setitem(backends._kernels, "cpu", None)
    monkeypatch.setitem(backends._errors, "cpu", "ModuleNotFoundError: No module named 'numba'")
    table = TABLES["chain"]
    b, a, d = _ic(table, (2,))
    assert dispatch.auto_method(table, 2, "cpu") == "scan"
    scan = bn.to_cartesian(b, a, d, table, method="scan")
    torch.testing.assert_close(bn.to_cartesian(b, a, d, table), scan)
    with pytest.raises(RuntimeError, match=r"needs numba on cpu .*" + re.escape(backends.INSTALL)):
        bn.to_cartesian(b, a, d, table, method="fused")
    assert not bn.backends()["fused"]["cpu"]


def test_gpu_backend_is_triton_or_a_clear_error() -> None:
    try:
        import triton  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="needs triton on cuda"):
            backends.require("cuda")
    else:
        assert backends.require("cuda").__name__ == "batched_nerf.engines.fused.cuda.build"
    with pytest.raises(RuntimeError, match="no fused backend exists for device type 'mps'"):
        backends.require("mps")


def test_forward_mode_of_broadcast_inputs():
    """``torch.func.jvp`` through the fused build with expanded (broadcast) inputs: the reference's
    dual tensors are made of dense copies (an expanded view cannot be a dual tensor)."""
    table = bn.ConstructionTable.chain(6)
    bonds = torch.full((6,), 1.5, dtype=torch.float64).expand(3, 6)
    angles = torch.full((3, 6), 1.9, dtype=torch.float64)
    dihedrals = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    tangent = torch.ones_like(dihedrals)

    def jvp(method):
        return torch.func.jvp(
            lambda d: bn.to_cartesian(bonds, angles, d, table, method=method), (dihedrals,), (tangent,)
        )[1]

    torch.testing.assert_close(jvp("fused"), jvp("scan"), rtol=0, atol=1e-10)
