"""First and second derivatives: gradcheck, gradgradcheck, singular geometry, committor-style losses."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import batched_nerf as bn

F64 = torch.float64

#: isobutane-like branched table, rows shuffled (build order 4, 0, 2, 1, 3, 5)
BRANCHED = bn.ConstructionTable(
    [
        [4, -1, -1],  # 0: second seed
        [4, 0, 2],  # 1
        [0, 4, -1],  # 2: third seed (bond ref is the second atom)
        [4, 0, 1],  # 3: improper-style reference to the sibling 1
        [-1, -1, -1],  # 4: root
        [2, 0, 4],  # 5
    ]
)
#: anchored component: atoms 0, 3, 5 fixed, the others built from them
FIXED = bn.ConstructionTable(
    [[-1, -1, -1], [3, 0, 5], [1, 3, 0], [-1, -1, -1], [2, 1, 3], [-1, -1, -1]], fixed=[3, 0, 5]
)


def random_ic(table: bn.ConstructionTable, batch: tuple[int, ...] = (2,), seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    n = table.n_atoms
    b = 1.0 + 0.5 * torch.rand(*batch, n, generator=g, dtype=F64)
    a = 0.6 + 1.9 * torch.rand(*batch, n, generator=g, dtype=F64)
    d = math.pi * (2 * torch.rand(*batch, n, generator=g, dtype=F64) - 1)
    return b, a, d


def fixed_xyz(batch: tuple[int, ...] = (2,), seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.tensor([[0.0, 0.0, 0.0], [1.5, 0.0, 0.0], [2.0, 1.4, 0.0]], dtype=F64)
    return base + 0.2 * torch.randn(*batch, 3, 3, generator=g, dtype=F64)


TABLES = {"chain": bn.ConstructionTable.chain(6), "branched": BRANCHED}


# ---------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("name", list(TABLES))
def test_gradcheck_to_cartesian(name: str, method: str) -> None:
    table = TABLES[name]
    inputs = tuple(t.requires_grad_() for t in random_ic(table))
    fn = lambda b, a, d: bn.to_cartesian(b, a, d, table, method=method)  # noqa: E731
    assert gradcheck(fn, inputs, fast_mode=True)
    assert gradgradcheck(fn, inputs, fast_mode=True)


def test_gradcheck_to_cartesian_fixed(method: str) -> None:
    inputs = (*random_ic(FIXED), fixed_xyz())
    inputs = tuple(t.requires_grad_() for t in inputs)
    fn = lambda b, a, d, f: bn.to_cartesian(b, a, d, FIXED, fixed_xyz=f, method=method)  # noqa: E731
    assert gradcheck(fn, inputs, fast_mode=True)
    assert gradgradcheck(fn, inputs, fast_mode=True)


@pytest.mark.parametrize("name", [*TABLES, "fixed"])
def test_gradcheck_to_internal(name: str) -> None:
    table = TABLES.get(name, FIXED)
    fx = fixed_xyz() if name == "fixed" else None
    x = bn.to_cartesian(*random_ic(table), table, fixed_xyz=fx)
    x = (
        x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    ).requires_grad_()
    fn = lambda x: tuple(bn.to_internal(x, table))  # noqa: E731
    assert gradcheck(fn, (x,), fast_mode=True)
    assert gradgradcheck(fn, (x,), fast_mode=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TABLES))
def test_full_gradgradcheck(name: str, method: str) -> None:
    """Slow mode: every entry of the Jacobian and of the second derivative."""
    table = TABLES[name]
    inputs = tuple(t.requires_grad_() for t in random_ic(table, batch=(1,)))
    fn = lambda b, a, d: bn.to_cartesian(b, a, d, table, method=method)  # noqa: E731
    assert gradgradcheck(fn, inputs)
    x = fn(*inputs).detach().requires_grad_()
    assert gradgradcheck(lambda x: tuple(bn.to_internal(x, table)), (x,))


def test_gradcheck_to_internal_degrees() -> None:
    table = TABLES["chain"]
    x = bn.to_cartesian(*random_ic(table), table).requires_grad_()
    assert gradcheck(lambda x: tuple(bn.to_internal(x, table, degrees=True)), (x,))


def test_gradcheck_to_cartesian_broadcast_inputs(method: str) -> None:
    """Gradients flow back to inputs of different (broadcast) shapes."""
    table = TABLES["chain"]
    b, a, d = random_ic(table, batch=(3,))
    b = b[0].requires_grad_()  # (N,)
    a = a[:, None].requires_grad_()  # (3, 1, N)
    d = d.requires_grad_()  # (3, N) -> output (3, 3, N, 3)
    fn = lambda b, a, d: bn.to_cartesian(b, a, d, table, method=method)  # noqa: E731
    assert fn(b, a, d).shape == (3, 3, 6, 3)
    assert gradcheck(fn, (b, a, d), fast_mode=True)


# --------------------------------------------------- unused entries, fixed atoms
def test_unused_entries_get_zero_gradient(method: str) -> None:
    table = bn.ConstructionTable(
        [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [-1, -1, -1], [4, -1, -1], [-1, -1, -1]]
    )
    b, a, d = (t.requires_grad_() for t in random_ic(table))
    x = bn.to_cartesian(b, a, d, table, method=method)
    gb, ga, gd = torch.autograd.grad((x * torch.randn_like(x)).sum(), (b, a, d))
    refs = table.refs
    for grad, col in ((gb, 0), (ga, 1), (gd, 2)):
        unused = refs[:, col] < 0
        assert torch.all(grad[..., unused] == 0)
        assert torch.all(grad[..., ~unused] != 0)


def test_fixed_atoms_gradient(method: str) -> None:
    b, a, d = (t.requires_grad_() for t in random_ic(FIXED))
    f = fixed_xyz().requires_grad_()
    x = bn.to_cartesian(b, a, d, FIXED, fixed_xyz=f, method=method)
    w = torch.randn_like(x)
    gb, ga, gd, gf = torch.autograd.grad((x * w).sum(), (b, a, d, f), retain_graph=True)
    fixed = FIXED.fixed
    # internal coordinates of fixed atoms are unused
    for g in (gb, ga, gd):
        assert torch.all(g[..., fixed] == 0)
    # a fixed atom passes its own weight straight through, plus what the atoms built on it add
    only_fixed = torch.autograd.grad(x[..., fixed, :].mul(w[..., fixed, :]).sum(), f)[0]
    torch.testing.assert_close(only_fixed, w[..., fixed, :])
    assert torch.all(gf != 0)


# ---------------------------------------------------------- singular geometry
def _finite_derivatives(fn, *inputs: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    """Values, gradients and Hessian-vector products of ``sum(w * fn(...))`` are finite."""
    inputs = tuple(t.detach().clone().requires_grad_() for t in inputs)
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    assert all(torch.isfinite(o).all() for o in outs)
    g = torch.Generator().manual_seed(0)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() + (o**2).sum() for o in outs)
    grads = torch.autograd.grad(loss, inputs, create_graph=True, allow_unused=True)
    grads = [gr if gr is not None else torch.zeros_like(t) for gr, t in zip(grads, inputs)]
    assert all(torch.isfinite(gr).all() for gr in grads)
    vs = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in inputs]
    hvp = torch.autograd.grad(sum((gr * v).sum() for gr, v in zip(grads, vs)), inputs, allow_unused=True)
    assert all(h is None or torch.isfinite(h).all() for h in hvp)


@pytest.mark.parametrize("value", [0.0, math.pi], ids=["zero", "pi"])
def test_to_cartesian_straight_and_zero_angles(value: float, method: str, dtype: torch.dtype) -> None:
    table = TABLES["chain"]
    b, a, d = (t.to(dtype) for t in random_ic(table))
    a[0, 2:4] = value  # atoms 3, 4 then have collinear references
    a[1, :] = value  # every atom on one line
    _finite_derivatives(lambda b, a, d: bn.to_cartesian(b, a, d, table, method=method), b, a, d)


def test_to_cartesian_collinear_fixed_references(method: str) -> None:
    f = torch.tensor([[0.0, 0, 0], [1, 0, 0], [2, 0, 0]], dtype=F64)
    b, a, d = random_ic(FIXED)
    _finite_derivatives(
        lambda b, a, d, f: bn.to_cartesian(b, a, d, FIXED, fixed_xyz=f, method=method), b, a, d, f
    )
    # coincident fixed atoms too
    _finite_derivatives(
        lambda b, a, d, f: bn.to_cartesian(b, a, d, FIXED, fixed_xyz=f, method=method),
        b,
        a,
        d,
        torch.zeros(3, 3, dtype=F64),
    )


def test_to_cartesian_zero_bonds(method: str) -> None:
    table = TABLES["branched"]
    b, a, d = random_ic(table)
    b[:] = 0.0
    _finite_derivatives(lambda b, a, d: bn.to_cartesian(b, a, d, table, method=method), b, a, d)


def test_to_internal_singular_geometry(dtype: torch.dtype) -> None:
    table = TABLES["chain"]
    line = torch.zeros(6, 3, dtype=dtype)
    line[:, 0] = torch.arange(6, dtype=dtype)  # all angles pi, dihedrals undefined
    zigzag = line.clone()
    zigzag[2] = zigzag[0]  # angle 0 (atom 2 on top of atom 0)
    coincident = line.clone()
    coincident[3] = coincident[2]  # zero bond
    origin = torch.zeros(6, 3, dtype=dtype)  # everything coincident
    x = torch.stack([line, zigzag, coincident, origin])
    ic = bn.to_internal(x, table)
    assert ic.angles[0, 2:].eq(math.pi).all() or torch.allclose(
        ic.angles[0, 2:], torch.full((4,), math.pi, dtype=dtype)
    )
    assert ic.angles[1, 2] == 0
    assert ic.bonds[2, 3] == 0 and ic.bonds[3].eq(0).all()
    _finite_derivatives(lambda x: tuple(bn.to_internal(x, table)), x)


# ---------------------------------------------------- committor-style losses
class Net(torch.nn.Module):
    def __init__(self, n_in: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin1 = torch.nn.Linear(n_in, 8, dtype=F64)
        self.lin2 = torch.nn.Linear(8, 1, dtype=F64)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.lin2(torch.tanh(self.lin1(f))).squeeze(-1)


def pair_features(x: torch.Tensor) -> torch.Tensor:
    i, j = torch.triu_indices(x.shape[-2], x.shape[-2], 1)
    return (x[..., i, :] - x[..., j, :]).pow(2).sum(-1).add(0.1).sqrt()


def ic_features(x: torch.Tensor, table: bn.ConstructionTable) -> torch.Tensor:
    ic = bn.to_internal(x, table)
    return torch.cat([ic.bonds, ic.angles, torch.cos(ic.dihedrals), torch.sin(ic.dihedrals)], dim=-1)


def _check_param_grads(net: Net, loss_fn) -> None:  # type: ignore[no-untyped-def]
    net.zero_grad()
    loss_fn().backward()
    for p in (net.lin1.weight, net.lin2.weight, net.lin1.bias):
        for idx in [(0,) * p.ndim, tuple(s - 1 for s in p.shape)]:
            h = 1e-6
            with torch.no_grad():
                p[idx] += h
            up = loss_fn().item()
            with torch.no_grad():
                p[idx] -= 2 * h
            down = loss_fn().item()
            with torch.no_grad():
                p[idx] += h
            fd = (up - down) / (2 * h)
            assert p.grad[idx].item() == pytest.approx(fd, rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("leaf", [False, True], ids=["through_ics", "leaf_x"])
def test_committor_loss_cartesian_features(leaf: bool, method: str) -> None:
    table = TABLES["branched"]
    b, a, d = (t.requires_grad_() for t in random_ic(table, batch=(4,)))
    net = Net(table.n_atoms * (table.n_atoms - 1) // 2)

    def loss() -> torch.Tensor:
        x = bn.to_cartesian(b, a, d, table, method=method)
        if leaf:
            x = x.detach().requires_grad_()
        q = net(pair_features(x))
        g = torch.autograd.grad(q.sum(), x, create_graph=True)[0]
        return (g**2).sum()

    _check_param_grads(net, loss)


def test_committor_loss_gradient_wrt_internal_coordinates(method: str) -> None:
    """Gradient penalty in internal coordinates: needs second derivatives of to_cartesian."""
    table = TABLES["branched"]
    ic = tuple(t.requires_grad_() for t in random_ic(table, batch=(4,)))
    net = Net(table.n_atoms * (table.n_atoms - 1) // 2)

    def loss() -> torch.Tensor:
        q = net(pair_features(bn.to_cartesian(*ic, table, method=method)))
        gs = torch.autograd.grad(q.sum(), ic, create_graph=True)
        return sum((g**2).sum() for g in gs)  # type: ignore[return-value]

    _check_param_grads(net, loss)
    # and the loss gradient wrt the inputs themselves (third-order path) against finite differences
    b = ic[0]
    b.grad = None
    loss().backward()
    h = 1e-6
    with torch.no_grad():
        b[1, 3] += h
    up = loss().item()
    with torch.no_grad():
        b[1, 3] -= 2 * h
    down = loss().item()
    with torch.no_grad():
        b[1, 3] += h
    assert b.grad[1, 3].item() == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-8)


def test_committor_loss_internal_features() -> None:
    table = TABLES["branched"]
    x = bn.to_cartesian(*random_ic(table, batch=(4,)), table).detach().requires_grad_()
    net = Net(4 * table.n_atoms)

    def loss() -> torch.Tensor:
        q = net(ic_features(x, table))
        g = torch.autograd.grad(q.sum(), x, create_graph=True)[0]
        return (g**2).sum()

    _check_param_grads(net, loss)


def test_committor_loss_internal_features_round_trip(method: str) -> None:
    """x built from ICs, features = to_internal(x): both maps inside the double backward."""
    table = TABLES["chain"]
    ic = tuple(t.requires_grad_() for t in random_ic(table, batch=(3,)))
    net = Net(4 * table.n_atoms)

    def loss() -> torch.Tensor:
        x = bn.to_cartesian(*ic, table, method=method)
        q = net(ic_features(x, table))
        g = torch.autograd.grad(q.sum(), x, create_graph=True)[0]
        return (g**2).sum()

    _check_param_grads(net, loss)
