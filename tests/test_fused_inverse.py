"""The fused inverse map (numba kernels) agrees with the torch engine: values and every derivative."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.func import hessian, jacfwd, jacrev, vmap

import batched_nerf as bn
from batched_nerf.engines.fused import inverse as fused_inverse

pytest.importorskip("numba", reason="the fused inverse map needs numba")
testing = pytest.importorskip("batched_nerf.testing", reason="needs hypothesis")
numba_kernels = pytest.importorskip("batched_nerf.engines.fused.cpu.inverse")

F64 = torch.float64
METHODS = ("fused", "torch")
BRANCHED = bn.ConstructionTable([[4, -1, -1], [4, 0, 2], [0, 4, -1], [4, 0, 1], [-1, -1, -1], [2, 0, 4]])
FIXED = bn.ConstructionTable(
    [[-1, -1, -1], [3, 0, 5], [1, 3, 0], [-1, -1, -1], [2, 1, 3], [-1, -1, -1]], fixed=[3, 0, 5]
)


def _tables() -> dict[str, bn.ConstructionTable]:
    return {
        "chain": bn.ConstructionTable.chain(9),
        "branched": BRANCHED,
        "fixed": FIXED,
        "alanine": bn.data.load("alanine_dipeptide").table,
        "protein": bn.protein.protein_table("ACDW").table,
        "packed": bn.pack_tables([bn.ConstructionTable.chain(3), BRANCHED, bn.ConstructionTable.chain(1)]),
    }


TABLES = _tables()


def both(
    x: torch.Tensor, table: bn.ConstructionTable
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    return tuple(bn.to_internal(x, table, method="fused")), tuple(bn.to_internal(x, table, method="torch"))


def close(a: object, b: object, atol: float = 1e-12) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


def random_xyz(table: bn.ConstructionTable, batch: tuple[int, ...] = (3,), seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*batch, table.n_atoms, 3, dtype=F64, generator=g)


def singular_xyz() -> tuple[bn.ConstructionTable, torch.Tensor]:
    """A chain with coincident atoms, collinear triples and straight and zero angles."""
    table = bn.ConstructionTable.chain(9)
    x = torch.tensor(
        [
            [0.0, 0, 0],
            [1, 0, 0],
            [2, 0, 0],  # straight angle
            [3, 0, 0],  # collinear dihedral
            [3, 0, 0],  # coincident with the previous atom
            [3, 1, 0],
            [3, 0, 0],  # zero angle (back onto its angle reference)
            [2, 0, 0],
            [2, 0, 1],
        ],
        dtype=F64,
    )
    return table, x


class Count:
    """Kernel launches between entering and leaving the block."""

    def __enter__(self) -> Count:
        self.start = dict(fused_inverse.CALLS)
        return self

    def __exit__(self, *exc: object) -> None:
        self.ran = {k: v - self.start[k] for k, v in fused_inverse.CALLS.items()}


# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TABLES))
@pytest.mark.parametrize("batch", [(), (4,), (2, 3), (0,)])
def test_values_match_torch_engine(name: str, batch: tuple[int, ...]) -> None:
    table = TABLES[name]
    x = random_xyz(table, batch, seed=len(batch))
    with Count() as c:
        fused, ref = both(x, table)
    assert c.ran["forward"] == 1
    for f, r in zip(fused, ref):
        assert f.shape == (*batch, table.n_atoms)
        close(f, r)


@pytest.mark.parametrize("batch", [1, 3, 8])  # forward: atom ranges of one or of three samples; whole samples
def test_parallel_schedules_match_serial(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    table = TABLES["protein"]
    x = random_xyz(table, (batch,), seed=1).requires_grad_()
    v = random_xyz(table, (batch,), seed=2)

    def run() -> tuple[torch.Tensor, ...]:
        ic = bn.to_internal(x, table, method="fused")
        q = (ic.bonds**2).sum() + ic.angles.sin().sum() + ic.dihedrals.cos().sum()
        (g,) = torch.autograd.grad(q, x, create_graph=True)
        (h,) = torch.autograd.grad(g, x, v)
        return (*ic, g, h)

    serial = run()
    monkeypatch.setattr(numba_kernels, "PARALLEL_ROWS", 0)
    for s, p in zip(serial, run()):
        close(s, p)


@pytest.mark.parametrize("name", list(TABLES))
@pytest.mark.parametrize("batch", [16, 37, 130])  # one short block, two, five
def test_vjp_sample_blocks_match_torch_engine(name: str, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """From BLOCK_MIN samples on: the blocked vjp kernel (SIMD across samples), short blocks, singular."""
    table = TABLES[name]
    g = torch.Generator().manual_seed(batch)
    x0 = random_xyz(table, (batch,), seed=batch)
    x0[: batch // 2] = torch.randint(-1, 2, (batch // 2, table.n_atoms, 3), generator=g).to(
        F64
    )  # singular rows
    x0[-1, 1, 0] = float("nan")  # NaN stays in the entries that read it
    w = [torch.randn(batch, table.n_atoms, generator=g, dtype=F64) for _ in range(3)]
    blocked: list[bool] = []  # whether each call took the blocked kernels
    choose = numba_kernels._blocked
    monkeypatch.setattr(numba_kernels, "_blocked", lambda *args: blocked.append(choose(*args)) or blocked[-1])
    grads = {}
    for method in METHODS:
        x = x0.clone().requires_grad_()
        ic = bn.to_internal(x, table, method=method)
        (grads[method],) = torch.autograd.grad(sum((c * wk).sum() for c, wk in zip(ic, w)), x)
    assert any(blocked)  # the blocked kernel ran
    torch.testing.assert_close(grads["fused"], grads["torch"], rtol=0, atol=1e-10, equal_nan=True)
    monkeypatch.setattr(numba_kernels, "BLOCK_MIN", 10**9)  # the per-sample kernel: the same to rounding
    x = x0.clone().requires_grad_()
    ic = bn.to_internal(x, table, method="fused")
    (per_sample,) = torch.autograd.grad(sum((c * wk).sum() for c, wk in zip(ic, w)), x)
    torch.testing.assert_close(grads["fused"], per_sample, rtol=0, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("name", list(TABLES))
@pytest.mark.parametrize("batch", [16, 37, 130])  # one short block, two, five
def test_second_order_sample_blocks_match_torch_engine(
    name: str, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blocked second-order kernel (``sum g H V`` and ``J V``): committor pattern, grid geometry, NaN."""
    table = TABLES[name]
    g = torch.Generator().manual_seed(batch + 1)
    x0 = random_xyz(table, (batch,), seed=batch + 1)
    x0[: batch // 2] = torch.randint(-1, 2, (batch // 2, table.n_atoms, 3), generator=g).to(F64)
    x0[-1, 1, 0] = float("nan")
    v = torch.randn(batch, table.n_atoms, 3, generator=g, dtype=F64)
    blocked: list[bool] = []  # whether each call took the blocked kernels
    choose = numba_kernels._blocked
    monkeypatch.setattr(numba_kernels, "_blocked", lambda *args: blocked.append(choose(*args)) or blocked[-1])

    def run(method: str) -> tuple[torch.Tensor, ...]:
        x = x0.clone().requires_grad_()
        ic = bn.to_internal(x, table, method=method)
        q = (ic.bonds**2).sum() + ic.angles.sin().sum() + (ic.angles**2).sum() + ic.dihedrals.cos().sum()
        (gx,) = torch.autograd.grad(q, x, create_graph=True)
        (h,) = torch.autograd.grad(gx, x, v)  # through the second-order kernel: H V and J V
        return gx, h

    fused, torch_ = run("fused"), run("torch")
    assert blocked.count(True) >= 3  # vjp, second order (its J V part feeds the second grad) ran blocked
    for f, r in zip(fused, torch_):
        torch.testing.assert_close(f, r, rtol=0, atol=1e-9, equal_nan=True)
    monkeypatch.setattr(numba_kernels, "BLOCK_MIN", 10**9)
    for f, r in zip(fused, run("fused")):  # the per-sample kernels: the same to rounding
        torch.testing.assert_close(f, r, rtol=0, atol=1e-11, equal_nan=True)


def test_row_formulas_are_called_by_the_per_sample_kernels_and_inlined_into_the_blocked_ones() -> None:
    """Two compiled forms of one formula: the module's names compiled once (a cold compile 4 s
    shorter) and ``INLINED`` (each copy calling the other inlined copies), which the blocked and
    the forward loops use so that they vectorise."""
    rows = pytest.importorskip("batched_nerf.engines.fused.cpu.inverse_rows")
    blocked = pytest.importorskip("batched_nerf.engines.fused.cpu.inverse_blocks")
    for name, inlined in rows.INLINED.items():
        called = getattr(rows, name)
        assert called.targetoptions.get("inline", "never") == "never"
        assert type(called._cache).__name__ == "FunctionCache"  # cache=True
        assert inlined.targetoptions["inline"] == "always"
        assert inlined.py_func.__code__ is called.py_func.__code__
        assert inlined.py_func.__globals__["_sub"] is rows.INLINED["_sub"]
    assert {"_dihedral_hvp", "_angle_hvp", "_sub", "_cross"} <= set(rows.INLINED)
    assert numba_kernels._dihedral_hvp is rows._dihedral_hvp  # per sample: a call
    for module, name in (
        (numba_kernels, "_angle_args"),
        (numba_kernels, "_sub"),
        (blocked, "_angle_grad"),
        (blocked, "_dihedral_hvp"),  # the blocked second order: the same formula, inlined
    ):
        assert getattr(module, name) is rows.INLINED[name]


@given(data=st.data())
def test_values_match_on_random_tables(data: st.DataObject) -> None:
    table = data.draw(testing.construction_tables(max_atoms=20, fixed=None))
    ic = data.draw(testing.internal_coordinates(table, batch_shape=(2,)))
    fixed = None
    if table.fixed.numel():
        fixed = data.draw(testing.fixed_positions(table, batch_shape=(2,)))
    x = bn.to_cartesian(*ic, table, fixed_xyz=fixed)
    for f, r in zip(*both(x, table)):
        close(f, r)


def test_float32_in_float32_out() -> None:
    table = TABLES["alanine"]
    x = random_xyz(table, (5,)).float()
    fused, ref = both(x, table)
    for f, r in zip(fused, ref):
        assert f.dtype == torch.float32
        torch.testing.assert_close(f, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [5, 40], ids=["per_sample", "blocked"])
def test_float32_derivatives(batch: int) -> None:
    table = TABLES["alanine"]
    x0 = random_xyz(table, (batch,)).float()
    res = {}
    for method in METHODS:
        x = x0.clone().requires_grad_()
        ic = bn.to_internal(x, table, method=method)
        q = (ic.bonds**2).sum() + ic.angles.sin().sum() + ic.dihedrals.cos().sum()
        (g,) = torch.autograd.grad(q, x, create_graph=True)
        (g**2).sum().backward()
        assert g.dtype == x.grad.dtype == torch.float32
        res[method] = (g, x.grad)
    for f, r in zip(res["fused"], res["torch"]):
        torch.testing.assert_close(f, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [3, 40], ids=["per_sample", "blocked"])
def test_float32_coordinates_are_differentiated_in_float64(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vjp and second-order kernels compute in float64 from float32 coordinates in every layout:
    their float32 results are the float64 reference of the same coordinates, rounded once.

    Nearly straight angles (``n1 = b0 x b1`` small) make float32 arithmetic inside the kernel
    visible: the per-sample kernels read float32 coordinates into float32 tuples (numba's ``float()``
    keeps float32) and were 5-10x further from the reference than one rounding."""
    n = 12
    table = bn.ConstructionTable.chain(n)
    g = torch.Generator().manual_seed(5)
    bonds = torch.full((batch, n), 1.5, dtype=F64)
    angles = math.pi - 10 ** -torch.randint(2, 5, (batch, n), generator=g).to(F64)
    dihedrals = torch.rand(batch, n, generator=g, dtype=F64) * 6 - 3
    x32 = bn.to_cartesian(bonds, angles, dihedrals, table).float()
    w = [torch.randn(batch, n, generator=g).float() for _ in range(3)]  # exact in both dtypes
    v = torch.randn(batch, n, 3, generator=g).float()
    blocked: list[bool] = []  # whether each kernel call took the blocked layout
    choose = numba_kernels._blocked
    monkeypatch.setattr(numba_kernels, "_blocked", lambda *args: blocked.append(choose(*args)) or blocked[-1])

    def run(x0: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor]:
        x = x0.clone().requires_grad_()
        ic = bn.to_internal(x, table, method=method)
        (gx,) = torch.autograd.grad(
            sum((c * wk.to(x.dtype)).sum() for c, wk in zip(ic, w)), x, create_graph=True
        )
        (h,) = torch.autograd.grad(gx, x, v.to(x.dtype))  # the second-order kernel
        return gx, h

    fused = run(x32, "fused")
    assert blocked == [batch > 3] * 2  # the vjp and the second-order kernel, in the layout named
    for got, want in zip(fused, run(x32.double(), "torch")):
        assert got.dtype == torch.float32
        err = (got.double() - want).abs()
        assert (err <= 2.0**-23 * want.abs() + 1e-9 * want.abs().max()).all(), err.max()


def test_dihedral_sign_and_wrap() -> None:
    table = bn.ConstructionTable.chain(4)
    x = torch.tensor([[0.0, 1, 0], [0, 0, 0], [1, 0, 0], [1, -1, 0]], dtype=F64)  # trans: +pi, not -pi
    ic = bn.to_internal(x, table, method="fused")
    assert ic.dihedrals[3].item() == pytest.approx(math.pi)
    x[3] = torch.tensor([1.0, 0, 1])
    assert bn.to_internal(x, table, method="fused").dihedrals[3].item() == pytest.approx(
        bn.to_internal(x, table, method="torch").dihedrals[3].item(), abs=1e-15
    )


def test_singular_geometry_values_and_derivatives() -> None:
    table, x = singular_xyz()
    x = x.requires_grad_()
    w = torch.linspace(0.5, 1.5, 3 * table.n_atoms, dtype=F64).reshape(3, table.n_atoms)
    out = {}
    for method in ("fused", "torch"):
        ic = bn.to_internal(x, table, method=method)
        q = sum((c * wk).sum() for c, wk in zip(ic, w)) + (ic.angles**2).sum()
        (g,) = torch.autograd.grad(q, x, create_graph=True)
        (h,) = torch.autograd.grad((g**2).sum(), x)
        out[method] = (*ic, g, h)
    for f, r in zip(out["fused"], out["torch"]):
        assert torch.isfinite(f).all()
        close(f, r, atol=1e-11)
    assert out["fused"][1][2].item() == pytest.approx(math.pi)  # the straight angle is pi, not nan


@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(["chain", "branched", "protein"]))
def test_grid_geometry_matches_torch_engine(seed: int, name: str) -> None:
    """Atoms on the points of a 3 x 3 x 3 grid: many exactly coincident, collinear and straight rows."""
    table = TABLES[name]
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randint(-1, 2, (2, table.n_atoms, 3), generator=g).to(F64)
    v = torch.randn(2, table.n_atoms, 3, generator=g, dtype=F64)
    out = {}
    for method in METHODS:
        x = x0.clone().requires_grad_()
        ic = bn.to_internal(x, table, method=method)
        q = (ic.bonds**2).sum() + ic.angles.sin().sum() + (ic.angles**2).sum() + ic.dihedrals.cos().sum()
        (gx,) = torch.autograd.grad(q, x, create_graph=True)
        (h,) = torch.autograd.grad(gx, x, v)
        out[method] = (*ic, gx, h)
    for f, r in zip(out["fused"], out["torch"]):
        assert torch.isfinite(f).all()
        close(f, r, atol=1e-10)


def test_nan_propagates_to_the_entries_that_read_it() -> None:
    table = bn.ConstructionTable.chain(6)
    x = random_xyz(table, ())
    x[2, 1] = float("nan")
    ic = bn.to_internal(x, table, method="fused")
    # atom 2 is read by rows 2 (bond on), 3 (bond, angle), 4 (angle, dihedral), 5 (dihedral)
    reads = {"bonds": {2, 3}, "angles": {2, 3, 4}, "dihedrals": {3, 4, 5}}
    for name, rows in reads.items():
        values = getattr(ic, name)
        for i in range(table.n_atoms):
            assert math.isnan(values[i].item()) == (i in rows), (name, i)


def test_nan_matches_the_torch_engine() -> None:
    table = TABLES["alanine"]
    x0 = random_xyz(table, (2,), seed=8)
    x0[0, 5, 2] = float("nan")
    out = {}
    for method in METHODS:
        x = x0.clone().requires_grad_()
        ic = bn.to_internal(x, table, method=method)
        (g,) = torch.autograd.grad(sum(c.sum() for c in ic), x)
        out[method] = (*ic, g)
    for f, r in zip(out["fused"], out["torch"]):
        torch.testing.assert_close(f, r, rtol=0, atol=1e-12, equal_nan=True)
    assert out["fused"][3][1].isfinite().all()  # the other sample is untouched


def test_nan_in_a_seed_atom_leaves_unused_entries_zero() -> None:
    table = bn.ConstructionTable.chain(4)
    x = random_xyz(table, ())
    x[0] = float("nan")
    ic = bn.to_internal(x, table, method="fused")
    assert ic.bonds[0].item() == 0.0 and ic.angles[:2].eq(0).all() and ic.dihedrals[:3].eq(0).all()
    assert math.isnan(ic.bonds[1].item()) and math.isnan(ic.dihedrals[3].item())


# --------------------------------------------------------------------------
# Derivatives
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["chain", "branched", "fixed", "alanine"])
def test_gradcheck_and_gradgradcheck(name: str) -> None:
    table = TABLES[name]
    x = random_xyz(table, (2,), seed=7).requires_grad_()
    fn = lambda x: tuple(bn.to_internal(x, table, method="fused"))  # noqa: E731
    with Count() as c:
        assert torch.autograd.gradcheck(fn, (x,))
        assert torch.autograd.gradgradcheck(fn, (x,))
    assert c.ran["vjp"] > 0 and c.ran["second"] > 0


@pytest.mark.parametrize("name", list(TABLES))
def test_vjp_and_second_order_match_torch_engine(name: str) -> None:
    table = TABLES[name]
    x = random_xyz(table, (3,), seed=11).requires_grad_()
    g = [
        torch.randn(3, table.n_atoms, dtype=F64, generator=torch.Generator().manual_seed(k)) for k in range(3)
    ]
    v = torch.randn(3, table.n_atoms, 3, dtype=F64, generator=torch.Generator().manual_seed(9))
    res = {}
    for method in ("fused", "torch"):
        gs = [t.clone().requires_grad_() for t in g]
        ic = bn.to_internal(x, table, method=method)
        (gx,) = torch.autograd.grad(ic, x, gs, create_graph=True)
        hx, *hg = torch.autograd.grad(gx, [x, *gs], v)
        res[method] = (gx, hx, *hg)
    for f, r in zip(res["fused"], res["torch"]):
        close(f, r, atol=1e-11)


@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("parallel", [False, True])
def test_committor_pattern_matches_torch_engine(
    batch: int, parallel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every kernel schedule: serial, and in parallel by rows (B=1) and by samples (B=64, >= threads)."""
    if parallel:
        monkeypatch.setattr(numba_kernels, "PARALLEL_ROWS", 0)
    table = TABLES["alanine"]
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    x0 = random_xyz(table, (batch,), seed=3)
    grads = {}
    for method in ("fused", "torch"):
        x = x0.clone().requires_grad_()
        mlp.zero_grad()
        ic = bn.to_internal(x, table, method=method)
        a, d = ic.angles, ic.dihedrals
        q = torch.sigmoid(mlp(torch.stack([ic.bonds, a.sin(), a.cos(), d.sin(), d.cos()], -1)).mean((-2, -1)))
        with Count() as c:
            (g,) = torch.autograd.grad(q.sum(), x, create_graph=True)
            (g**2).sum().backward()
        if method == "fused":  # J^T for g, H for x, and J^T again for what g's cotangent does to q's ic
            assert c.ran == {"forward": 0, "vjp": 2, "second": 1}
        grads[method] = (g, x.grad, *(p.grad for p in mlp.parameters()))
    for f, r in zip(grads["fused"], grads["torch"]):
        close(f, r, atol=1e-11)


def test_third_order_is_exact() -> None:
    table = TABLES["branched"]
    x = random_xyz(table, (2,), seed=5).requires_grad_()

    def grad_norm(x: torch.Tensor, method: str) -> torch.Tensor:
        ic = bn.to_internal(x, table, method=method)
        q = (ic.bonds**2).sum() + ic.angles.sin().sum() + ic.dihedrals.cos().sum()
        (g,) = torch.autograd.grad(q, x, create_graph=True)
        return (g**2).sum()

    def third(method: str) -> torch.Tensor:
        (g2,) = torch.autograd.grad(grad_norm(x, method), x, create_graph=True)
        (g3,) = torch.autograd.grad(g2.pow(2).sum(), x)
        return g3

    close(third("fused"), third("torch"), atol=1e-9)
    assert torch.autograd.gradgradcheck(lambda x: grad_norm(x, "fused"), (x,))


def test_torch_func_transforms() -> None:
    table = TABLES["branched"]
    x = random_xyz(table, (), seed=2)
    xs = random_xyz(table, (4,), seed=3)
    vec = {
        m: (lambda x, m=m: torch.cat(tuple(bn.to_internal(x, table, method=m)))) for m in ("fused", "torch")
    }

    def scalar(x: torch.Tensor, m: str) -> torch.Tensor:
        ic = bn.to_internal(x, table, method=m)
        return (ic.bonds**2).sum() + torch.cos(ic.dihedrals).sum() + ic.angles.sum()

    with Count() as c:
        mapped = vmap(lambda x: tuple(bn.to_internal(x, table, method="fused")))(xs)
    assert c.ran["forward"] == 1  # one kernel for the whole vmapped batch
    for m, p in zip(mapped, bn.to_internal(xs, table, method="torch")):
        close(m, p)
    close(jacrev(vec["fused"])(x), jacrev(vec["torch"])(x))
    close(jacfwd(vec["fused"])(x), jacfwd(vec["torch"])(x))
    close(vmap(jacrev(vec["fused"]))(xs), vmap(jacrev(vec["torch"]))(xs))
    with Count() as c:
        h = hessian(lambda x: scalar(x, "fused"))(x)
    assert c.ran["vjp"] > 0
    close(h, hessian(lambda x: scalar(x, "torch"))(x), atol=1e-10)
    close(jacrev(jacrev(lambda x: scalar(x, "fused")))(x), h, atol=1e-10)
    close(jacfwd(jacfwd(lambda x: scalar(x, "auto")))(x), h, atol=1e-10)  # nested forward mode: torch
    close(jacrev(jacfwd(lambda x: scalar(x, "fused")))(x), h, atol=1e-10)
    close(
        vmap(hessian(lambda x: scalar(x, "fused")))(xs),
        vmap(hessian(lambda x: scalar(x, "torch")))(xs),
        atol=1e-10,
    )


def test_forward_mode_autograd() -> None:
    import torch.autograd.forward_ad as fwAD

    table = TABLES["alanine"]
    x = random_xyz(table, (2,), seed=4)
    t = random_xyz(table, (2,), seed=5)
    tangents = {}
    for method in ("fused", "torch"):
        with fwAD.dual_level():
            ic = bn.to_internal(fwAD.make_dual(x, t), table, method=method)
            tangents[method] = [fwAD.unpack_dual(c).tangent for c in ic]
    for f, r in zip(tangents["fused"], tangents["torch"]):
        close(f, r)


# --------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------


def test_auto_runs_fused_on_cpu() -> None:
    table = TABLES["chain"]
    with Count() as c:
        bn.to_internal(random_xyz(table), table)
    assert c.ran["forward"] == 1
    with Count() as c:
        bn.to_internal(random_xyz(table).half(), table)  # a dtype the kernels do not take
        bn.to_internal(random_xyz(table), table, method="torch")
    assert c.ran["forward"] == 0


def test_unknown_method_raises() -> None:
    table = TABLES["chain"]
    with pytest.raises(ValueError, match=r"method must be one of \('auto', 'fused', 'torch'\), got 'numba'"):
        bn.to_internal(random_xyz(table), table, method="numba")  # type: ignore[arg-type]


def test_fused_refuses_other_dtypes() -> None:
    table = TABLES["chain"]
    with pytest.raises(ValueError, match="method='fused' takes float32 or float64, got torch.float16"):
        bn.to_internal(random_xyz(table).half(), table, method="fused")


def test_fused_refuses_other_devices() -> None:
    table = TABLES["chain"]
    match = r"method='fused' runs on the CPU \(numba\) and on CUDA \(triton\), got xyz on meta"
    with pytest.raises(ValueError, match=match):
        bn.to_internal(random_xyz(table).to("meta"), table, method="fused")


def test_fused_without_numba_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_inverse, "_load", lambda: (None, "numba is not importable (test)"))
    table = TABLES["chain"]
    with pytest.raises(ValueError, match=r"method='fused' needs numba: numba is not importable \(test\)"):
        bn.to_internal(random_xyz(table), table, method="fused")
    with Count() as c:
        bn.to_internal(random_xyz(table), table)  # auto falls back to torch
    assert c.ran["forward"] == 0


def test_nested_forward_mode_takes_the_torch_path() -> None:
    """jacfwd(jacfwd) through an autograd.Function loses the outer tangents (pytorch/pytorch#197867)."""
    table = TABLES["chain"]
    x = random_xyz(table, ())
    fn = lambda x: bn.to_internal(x, table, method="fused").angles.sum()  # noqa: E731
    with pytest.raises(ValueError, match=r"method='fused' cannot run under nested forward-mode transforms"):
        jacfwd(jacfwd(fn))(x)
    with Count() as c:
        jacfwd(lambda x: bn.to_internal(x, table).angles)(x)
        jacfwd(jacfwd(lambda x: bn.to_internal(x, table).angles.sum()))(x)
    assert c.ran["forward"] == 1  # only the single forward-mode level ran the kernels


@pytest.mark.compile
def test_compile_traces_the_torch_path() -> None:
    table = TABLES["chain"]
    table.prepare("cpu")
    x = random_xyz(table)
    fn = torch.compile(
        lambda x: bn.to_internal(x, table, method="fused").dihedrals, fullgraph=True, backend="eager"
    )
    with Count() as c:
        out = fn(x)
    assert c.ran["forward"] == 0
    close(out, bn.to_internal(x, table, method="torch").dihedrals)
