"""torch.func compatibility: vmap, jacrev, jacfwd, hessian agree with plain calls and autograd."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd.functional import hessian as ag_hessian
from torch.autograd.functional import jacobian as ag_jacobian
from torch.func import hessian, jacfwd, jacrev, vmap

import batched_nerf as bn

F64 = torch.float64
BRANCHED = bn.ConstructionTable(
    [[4, -1, -1], [4, 0, 2], [0, 4, -1], [4, 0, 1], [-1, -1, -1], [2, 0, 4]]
)  # shuffled, branched
FIXED = bn.ConstructionTable(
    [[-1, -1, -1], [3, 0, 5], [1, 3, 0], [-1, -1, -1], [2, 1, 3], [-1, -1, -1]], fixed=[3, 0, 5]
)
TABLES = {"chain": bn.ConstructionTable.chain(5), "branched": BRANCHED}


def ics(table: bn.ConstructionTable, batch: tuple[int, ...] = (), seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    n = table.n_atoms
    return (
        1.0 + 0.5 * torch.rand(*batch, n, generator=g, dtype=F64),
        0.6 + 1.9 * torch.rand(*batch, n, generator=g, dtype=F64),
        math.pi * (2 * torch.rand(*batch, n, generator=g, dtype=F64) - 1),
    )


def fixed_xyz(batch: tuple[int, ...] = ()) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    base = torch.tensor([[0.0, 0.0, 0.0], [1.5, 0.0, 0.0], [2.0, 1.4, 0.0]], dtype=F64)
    return base + 0.2 * torch.randn(*batch, 3, 3, generator=g, dtype=F64)


@pytest.fixture(autouse=True)
def _warm_plans(method: str) -> None:
    """Build every plan outside the transforms (see test_plan_built_inside_transform for the other case)."""
    for table in TABLES.values():
        bn.to_cartesian(*ics(table), table, method=method)
        bn.to_internal(torch.zeros(table.n_atoms, 3), table)
    bn.to_cartesian(*ics(FIXED), FIXED, fixed_xyz=fixed_xyz(), method=method)
    bn.to_internal(torch.zeros(6, 3), FIXED)


@pytest.mark.parametrize("name", list(TABLES))
def test_vmap_to_cartesian(name: str, method: str) -> None:
    table = TABLES[name]
    b, a, d = ics(table, batch=(4,))
    plain = bn.to_cartesian(b, a, d, table, method=method)
    mapped = vmap(lambda b, a, d: bn.to_cartesian(b, a, d, table, method=method))(b, a, d)
    torch.testing.assert_close(mapped, plain, rtol=0, atol=1e-12)
    # only some inputs mapped, nested vmap
    nested = vmap(
        vmap(lambda b, a: bn.to_cartesian(b, a, d[0], table, method=method), in_dims=(None, 0)), (0, None)
    )(b, a)
    assert nested.shape == (4, 4, table.n_atoms, 3)
    torch.testing.assert_close(nested[2, 3], bn.to_cartesian(b[2], a[3], d[0], table, method=method))


def test_vmap_fixed_xyz(method: str) -> None:
    b, a, d = ics(FIXED)
    f = fixed_xyz(batch=(3,))
    mapped = vmap(lambda f: bn.to_cartesian(b, a, d, FIXED, fixed_xyz=f, method=method))(f)
    torch.testing.assert_close(mapped, bn.to_cartesian(b, a, d, FIXED, fixed_xyz=f, method=method))


@pytest.mark.parametrize("name", [*TABLES, "fixed"])
def test_vmap_to_internal(name: str) -> None:
    table = TABLES.get(name, FIXED)
    x = torch.randn(4, table.n_atoms, 3, dtype=F64, generator=torch.Generator().manual_seed(2))
    plain = bn.to_internal(x, table)
    mapped = vmap(lambda x: tuple(bn.to_internal(x, table)))(x)
    for m, p in zip(mapped, plain):
        torch.testing.assert_close(m, p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list(TABLES))
def test_jacobians_to_cartesian(name: str, method: str) -> None:
    table = TABLES[name]
    inputs = ics(table)
    fn = lambda b, a, d: bn.to_cartesian(b, a, d, table, method=method)  # noqa: E731
    ref = ag_jacobian(fn, inputs)
    for transform in (jacrev, jacfwd):
        jac = transform(fn, argnums=(0, 1, 2))(*inputs)
        for j, r in zip(jac, ref):
            torch.testing.assert_close(j, r, rtol=1e-10, atol=1e-12)
    # batched Jacobians: vmap(jacrev) over a batch
    batch = ics(table, batch=(3,), seed=5)
    vj = vmap(jacrev(fn, argnums=1))(*batch)
    torch.testing.assert_close(vj[1], ag_jacobian(lambda a: fn(batch[0][1], a, batch[2][1]), batch[1][1]))


def test_jacobians_fixed_xyz(method: str) -> None:
    b, a, d = ics(FIXED)
    fn = lambda f: bn.to_cartesian(b, a, d, FIXED, fixed_xyz=f, method=method)  # noqa: E731
    f = fixed_xyz()
    ref = ag_jacobian(fn, f)
    torch.testing.assert_close(jacrev(fn)(f), ref)
    torch.testing.assert_close(jacfwd(fn)(f), ref)


@pytest.mark.parametrize("name", list(TABLES))
def test_hessian_to_cartesian(name: str, method: str) -> None:
    table = TABLES[name]
    inputs = ics(table)
    w = torch.randn(table.n_atoms, 3, dtype=F64, generator=torch.Generator().manual_seed(4))

    def scalar(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        x = bn.to_cartesian(b, a, d, table, method=method)
        return (w * x).sum() + (x**2).sum()

    ref = ag_hessian(scalar, inputs)
    got = hessian(scalar, argnums=(0, 1, 2))(*inputs)
    for i in range(3):
        for j in range(3):
            torch.testing.assert_close(got[i][j], ref[i][j], rtol=1e-9, atol=1e-10)
    # the forward-over-reverse and reverse-over-reverse Hessians agree too
    rr = jacrev(jacrev(scalar, argnums=2), argnums=2)(*inputs)
    torch.testing.assert_close(rr, ref[2][2], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", [*TABLES, "fixed"])
def test_jacobian_hessian_to_internal(name: str) -> None:
    table = TABLES.get(name, FIXED)
    x = torch.randn(table.n_atoms, 3, dtype=F64, generator=torch.Generator().manual_seed(3))
    fn = lambda x: torch.cat(tuple(bn.to_internal(x, table)))  # noqa: E731
    ref = ag_jacobian(fn, x)
    torch.testing.assert_close(jacrev(fn)(x), ref)
    torch.testing.assert_close(jacfwd(fn)(x), ref)

    def scalar(x: torch.Tensor) -> torch.Tensor:
        ic = bn.to_internal(x, table)
        return (ic.bonds**2).sum() + torch.cos(ic.dihedrals).sum() + ic.angles.sum()

    torch.testing.assert_close(hessian(scalar)(x), ag_hessian(scalar, x), rtol=1e-9, atol=1e-10)


def test_vmap_hessian_singular_geometry(method: str) -> None:
    """Batched Hessians stay finite when angles are exactly 0 or pi."""
    table = TABLES["chain"]
    b, a, d = ics(table, batch=(3,))
    a[0] = math.pi
    a[1] = 0.0
    scalar = lambda b, a, d: bn.to_cartesian(b, a, d, table, method=method).pow(2).sum()  # noqa: E731
    h = vmap(hessian(scalar, argnums=(0, 1, 2)))(b, a, d)
    assert all(torch.isfinite(t).all() for row in h for t in row)
    line = torch.zeros(2, 5, 3, dtype=F64)
    line[..., 0] = torch.arange(5.0)
    hi = vmap(hessian(lambda x: sum(v.sum() for v in bn.to_internal(x, table))))(line)
    assert torch.isfinite(hi).all()


# ---------------------------------------------------------------------------
# Plans are built lazily and cached on the table; a table's first call may well
# happen inside a transform (e.g. a fresh table in a jacrev'd loss).
@pytest.mark.parametrize("transform", ["jacrev", "jacfwd", "hessian", "vmap"])
def test_plan_built_inside_transform(transform: str, method: str) -> None:
    fns = {"jacrev": jacrev, "jacfwd": jacfwd, "hessian": hessian, "vmap": vmap}
    b, a, d = ics(TABLES["chain"], batch=(2,) if transform == "vmap" else ())
    x = torch.randn(*b.shape, 3, dtype=F64)
    for _ in range(2):  # the plan cached by the first call must work for the second
        table = bn.ConstructionTable.chain(5)
        for _ in range(2):
            out = fns[transform](
                lambda b, t=table: bn.to_cartesian(b, a, d, t, method=method).sum(-1).sum(-1)
            )(b)
            assert torch.isfinite(out).all()
            out = fns[transform](lambda x, t=table: bn.to_internal(x, t).dihedrals.sum(-1))(x)
            assert torch.isfinite(out).all()


@pytest.mark.slow
def test_deep_table_lazy_plan_inside_transform(method: str) -> None:
    """Tables deeper than the eager-planning limit build some plans lazily: inside a transform too."""
    n = 300
    b, a, d = ics(bn.ConstructionTable.chain(n))
    for _ in range(2):
        table = bn.ConstructionTable.chain(n)
        out = jacfwd(lambda s, t=table: bn.to_cartesian(b * s, a, d, t, method=method))(
            torch.tensor(1.0, dtype=F64)
        )
        assert out.shape == (n, 3) and torch.isfinite(out).all()


@pytest.mark.parametrize("method", ["scan", "fused"])  # (levels runs Functions on deep tables only)
def test_function_apply_skips_signature_binding(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines' Functions skip torch's per-call ``inspect.signature`` outside transforms (20-40 us
    a call), and keep torch's own ``apply`` inside them: values and derivatives as before."""
    if method == "fused":
        pytest.importorskip("numba", reason='the fused engine needs numba: pip install -e ".[fast]"')
    table = TABLES["branched"]
    b, a, d = (t.requires_grad_() for t in ics(table, (3,)))
    want = bn.to_cartesian(b, a, d, table, method=method)
    (g_want,) = torch.autograd.grad(want.square().sum(), d, create_graph=True)
    vm_want = vmap(lambda d: bn.to_cartesian(b, a, d, table, method=method))(d)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("inspect.signature called outside a torch.func transform")

    from batched_nerf.engines import layout  # (scan's Function: layout.SinCos)
    from batched_nerf.engines.fused import build as fused

    c_apply = torch.autograd.Function.__dict__.get("apply") is torch._C._FunctionBase.__dict__.get("apply")
    if c_apply:  # torch 2.14+: torch's C apply binds; the forwards carry their signature for it
        for function in (fused.FusedBuild, fused.FusedVJP, layout.SinCos):
            assert "__signature__" in vars(function.forward)
    else:
        monkeypatch.setattr(torch.autograd.function.inspect, "signature", refuse)
    got = bn.to_cartesian(b, a, d, table, method=method)
    (g_got,) = torch.autograd.grad(got.square().sum(), d, create_graph=True)
    monkeypatch.undo()  # (before assert_close, whose first call imports more of torch)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(g_got, g_want, rtol=0, atol=0)
    vm_got = vmap(lambda d: bn.to_cartesian(b, a, d, table, method=method))(d)  # torch's apply
    torch.testing.assert_close(vm_got, vm_want, rtol=0, atol=0)
