"""bn.losses: committor loss (gradients, invariance) and clash loss (values, exclusions, chunks)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf.losses import clash_loss, clash_pairs, committor_loss

F64 = torch.float64


# ------------------------------------------------------------------ committor
class _Net(torch.nn.Module):
    """q = sigmoid(MLP(cos/sin of dihedrals, angles, bonds)) of x, internal coordinates only."""

    def __init__(self, table: bn.ConstructionTable) -> None:
        super().__init__()
        self.table = table
        n = table.n_atoms
        torch.manual_seed(0)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(4 * n, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(
            F64
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ic = bn.to_internal(x, self.table)
        feats = torch.cat([ic.bonds, ic.angles, torch.cos(ic.dihedrals), torch.sin(ic.dihedrals)], -1)
        return torch.sigmoid(self.mlp(feats)).squeeze(-1)


def _samples(n: int = 6, batch: int = 5) -> torch.Tensor:
    table = bn.ConstructionTable.chain(n)
    gen = torch.Generator().manual_seed(1)
    b = 1.0 + 0.2 * torch.rand(batch, n, dtype=F64, generator=gen)
    a = 1.7 + 0.5 * torch.rand(batch, n, dtype=F64, generator=gen)
    d = 6.0 * torch.rand(batch, n, dtype=F64, generator=gen) - 3.0
    return bn.to_cartesian(b, a, d, table)


def _loss(net: _Net, x: torch.Tensor, **kw) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    return committor_loss(net(x), x, **kw)


def test_committor_parameter_gradient_matches_finite_differences() -> None:
    table = bn.ConstructionTable.chain(6)
    net = _Net(table)
    x = _samples()
    kw = dict(
        masses=torch.tensor([12.0, 1.0, 14.0, 16.0, 1.0, 12.0], dtype=F64),
        weights=torch.tensor([1.0, 0.5, 2.0, 1.0, 0.1], dtype=F64),
        in_a=torch.tensor([True, False, False, False, False]),
        in_b=torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0], dtype=F64),
        boundary_weight=3.0,
    )
    loss = _loss(net, x, **kw)
    params = list(net.parameters())
    grads = torch.autograd.grad(loss, params)
    h = 1e-6
    for p, g in zip(params, grads):
        flat = p.data.view(-1)
        for k in range(0, flat.numel(), max(1, flat.numel() // 5)):
            old = float(flat[k])
            flat[k] = old + h
            up = float(_loss(net, x, **kw).detach())
            flat[k] = old - h
            down = float(_loss(net, x, **kw).detach())
            flat[k] = old
            assert abs((up - down) / (2 * h) - float(g.view(-1)[k])) < 1e-6 * (1 + abs(float(g.view(-1)[k])))


def test_committor_gradient_orthogonal_to_rigid_motions() -> None:
    table = bn.ConstructionTable.chain(6)
    net = _Net(table)
    x = _samples().requires_grad_(True)
    (g,) = torch.autograd.grad(net(x).sum(), x)
    torch.testing.assert_close(g.sum(-2), torch.zeros(5, 3, dtype=F64), rtol=0, atol=1e-10)
    torch.testing.assert_close(
        torch.linalg.cross(x.detach(), g).sum(-2), torch.zeros(5, 3, dtype=F64), rtol=0, atol=1e-10
    )
    # and so is the loss: invariant under a rigid motion of the samples
    rot = torch.linalg.matrix_exp(
        torch.tensor([[0.0, -0.3, 0.2], [0.3, 0.0, -0.1], [-0.2, 0.1, 0.0]], dtype=F64)
    )
    moved = x.detach() @ rot.T + torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    torch.testing.assert_close(_loss(net, moved), _loss(net, x.detach()))


def test_committor_loss_value() -> None:
    x = torch.tensor([[[0.0, 0, 0], [1.0, 2.0, 0]], [[0.0, 0, 0], [3.0, 0, 0]]], requires_grad=True)
    q = 0.1 * x[:, 1, 0] + 0.2 * x[:, 1, 1]  # grad: 0.1, 0.2 on atom 1
    m = torch.tensor([1.0, 4.0])
    loss = committor_loss(
        q,
        x,
        masses=m,
        weights=torch.tensor([1.0, 3.0]),
        in_a=torch.tensor([True, False]),
        in_b=torch.tensor([False, True]),
        boundary_weight=2.0,
    )
    kin = (0.01 + 0.04) / 4.0
    q0, q1 = 0.1 + 0.4, 0.3
    expected = kin + 2.0 * (1.0 * q0**2 + 3.0 * (1 - q1) ** 2) / 4.0
    assert abs(float(loss.detach()) - expected) < 1e-6
    # flat (B, D) input and (B, 1) q
    xf = torch.tensor([[1.0, 2.0]], requires_grad=True)
    assert abs(float(committor_loss((xf * torch.tensor([0.5, 1.0])).sum(-1, keepdim=True), xf)) - 1.25) < 1e-6


def test_committor_errors() -> None:
    x = torch.zeros(3, 2, 3, requires_grad=True)
    q = x.sum((-1, -2))
    with pytest.raises(ValueError, match=r"q must have shape \(B,\) or \(B, 1\)"):
        committor_loss(q.reshape(1, 3), x)
    with pytest.raises(ValueError, match=r"x must have shape \(B, \.\.\.\) with B = 3"):
        committor_loss(q, torch.zeros(2, 2, 3, requires_grad=True))
    with pytest.raises(ValueError, match="x must require grad"):
        committor_loss(q, torch.zeros(3, 2, 3))
    with pytest.raises(ValueError, match=r"masses must have shape \(2,\)"):
        committor_loss(q, x, masses=torch.ones(3))
    with pytest.raises(ValueError, match=r"weights must have shape \(B,\) = \(3,\)"):
        committor_loss(q, x, weights=torch.ones(2))
    with pytest.raises(ValueError, match=r"in_a must have shape \(B,\) = \(3,\)"):
        committor_loss(q, x, in_a=torch.ones(2))
    with pytest.raises(ValueError, match=r"in_b must have shape \(B,\) = \(3,\)"):
        committor_loss(q, x, in_b=torch.ones(4))
    with pytest.raises(TypeError, match=r"^q must be a torch.Tensor, got list; convert it with torch"):
        committor_loss([0.0], x)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- clash
def _brute_force(xyz: np.ndarray, refs: np.ndarray, dmin: np.ndarray, tol: float, power: float, depth: int):
    n = len(refs)
    adj = {i: set() for i in range(n)}
    for i, b in enumerate(refs[:, 0]):
        if b >= 0:
            adj[i].add(int(b))
            adj[int(b)].add(i)
    # graph distances by BFS
    out = []
    pairs = []
    for i, j in itertools.combinations(range(n), 2):
        dist, frontier, seen = 0, {i}, {i}
        while frontier and j not in seen and dist < depth:
            frontier = {v for u in frontier for v in adj[u]} - seen
            seen |= frontier
            dist += 1
        if j in seen:
            continue
        pairs.append((i, j))
        d = np.linalg.norm(xyz[..., i, :] - xyz[..., j, :], axis=-1)
        out.append(np.maximum(dmin[i, j] - tol - d, 0.0) ** power)
    return np.stack(out, -1), pairs


def _branched() -> bn.ConstructionTable:
    return bn.ConstructionTable(
        [
            [-1, -1, -1],
            [0, -1, -1],
            [1, 0, -1],
            [2, 1, 0],
            [1, 0, 2],
            [4, 1, 0],
            [3, 2, 1],
            [6, 3, 2],
            [7, 6, 3],
            [5, 4, 1],
            [-1, -1, -1],
            [10, -1, -1],
            [11, 10, -1],
        ]
    )


@pytest.mark.parametrize("exclude_14", [False, True])
@pytest.mark.parametrize("use_radii", [False, True])
def test_clash_matches_brute_force(exclude_14: bool, use_radii: bool) -> None:
    table = _branched()
    n = table.n_atoms
    xyz = torch.randn(3, n, 3, dtype=F64, generator=torch.Generator().manual_seed(0)) * 1.5
    radii = torch.linspace(0.6, 1.2, n, dtype=F64)
    kw = dict(radii=radii, scale=0.9) if use_radii else dict(min_distance=1.6)
    dmin = (0.9 * (radii[:, None] + radii[None, :])).numpy() if use_radii else np.full((n, n), 1.6)
    expected, pairs = _brute_force(xyz.numpy(), table.refs.numpy(), dmin, 0.1, 2.0, 3 if exclude_14 else 2)
    assert clash_pairs(table, exclude_14=exclude_14).tolist() == [list(p) for p in pairs]
    none = clash_loss(xyz, table, tolerance=0.1, exclude_14=exclude_14, reduction="none", **kw)
    np.testing.assert_allclose(none.numpy(), expected, rtol=1e-12, atol=1e-14)
    assert expected.sum() > 0
    np.testing.assert_allclose(
        clash_loss(xyz, table, tolerance=0.1, exclude_14=exclude_14, reduction="sum", **kw).numpy(),
        expected.sum(-1),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        clash_loss(xyz, table, tolerance=0.1, exclude_14=exclude_14, **kw).numpy(),
        expected.mean(-1),
        rtol=1e-12,
    )


def test_clash_exclusions_chain() -> None:
    table = bn.ConstructionTable.chain(6)
    assert clash_pairs(table).tolist() == [[0, 3], [0, 4], [0, 5], [1, 4], [1, 5], [2, 5]]
    assert clash_pairs(table, exclude_14=True).tolist() == [[0, 4], [0, 5], [1, 5]]
    # all atoms on top of each other: only non-excluded pairs count
    xyz = torch.zeros(6, 3)
    assert float(clash_loss(xyz, table, min_distance=1.0, reduction="sum")) == pytest.approx(6.0, rel=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [1, 3, 5, "auto"])
def test_clash_chunked_equals_unchunked(reduction: str, chunk) -> None:
    table = _branched()
    xyz = torch.randn(
        2, 4, table.n_atoms, 3, dtype=F64, generator=torch.Generator().manual_seed(2), requires_grad=True
    )
    ref = clash_loss(xyz, table, min_distance=1.5, reduction=reduction, chunk_size=None)
    got = clash_loss(xyz, table, min_distance=1.5, reduction=reduction, chunk_size=chunk)
    torch.testing.assert_close(got, ref)
    (g_ref,) = torch.autograd.grad(ref.sum(), xyz)
    (g_got,) = torch.autograd.grad(got.sum(), xyz)
    torch.testing.assert_close(g_got, g_ref)


def test_clash_gradient_finite_at_coincident_atoms() -> None:
    table = bn.ConstructionTable.chain(5)
    xyz = torch.tensor(
        [[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]], dtype=F64, requires_grad=True
    )
    loss = clash_loss(xyz, table, min_distance=1.2, reduction="sum")
    (g,) = torch.autograd.grad(loss, xyz, create_graph=True)
    assert torch.isfinite(g).all()
    (h,) = torch.autograd.grad(g.square().sum(), xyz)
    assert torch.isfinite(h).all()
    # and the penalty pushes apart atoms that overlap partially
    xyz2 = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [0.5, 0, 0]], dtype=F64, requires_grad=True)
    (g2,) = torch.autograd.grad(
        clash_loss(xyz2, bn.ConstructionTable.chain(4), min_distance=1.0, reduction="sum"), xyz2
    )
    assert g2[3, 0] < 0 and g2[0, 0] > 0


def test_clash_vmap_and_gradcheck() -> None:
    table = bn.ConstructionTable.chain(6)
    xyz = torch.randn(3, 6, 3, dtype=F64, generator=torch.Generator().manual_seed(5)) * 0.8
    vm = torch.func.vmap(lambda x: clash_loss(x, table, min_distance=1.5))(xyz)
    torch.testing.assert_close(vm, clash_loss(xyz, table, min_distance=1.5))
    assert torch.autograd.gradcheck(
        lambda x: clash_loss(x, table, min_distance=1.5, reduction="sum"), (xyz.clone().requires_grad_(True),)
    )


def test_clash_errors() -> None:
    table = bn.ConstructionTable.chain(4)
    xyz = torch.zeros(4, 3)
    with pytest.raises(TypeError, match="table must be a ConstructionTable"):
        clash_loss(xyz, None, min_distance=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="table must be a ConstructionTable"):
        clash_pairs(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"xyz must have shape \(\.\.\., N, 3\) with N = 4"):
        clash_loss(torch.zeros(5, 3), table, min_distance=1.0)
    with pytest.raises(ValueError, match="give exactly one of min_distance"):
        clash_loss(xyz, table)
    with pytest.raises(ValueError, match="give exactly one of min_distance"):
        clash_loss(xyz, table, min_distance=1.0, radii=torch.ones(4))
    with pytest.raises(ValueError, match=r"radii must have shape \(N,\) = \(4,\)"):
        clash_loss(xyz, table, radii=torch.ones(3))
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none'"):
        clash_loss(xyz, table, min_distance=1.0, reduction="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        clash_loss(xyz, table, min_distance=1.0, chunk_size=0)
    with pytest.raises(ValueError, match="power must be >= 1"):
        clash_loss(xyz, table, min_distance=1.0, power=0.5)


# ------------------------------------------------------------- periodic clash
def _triclinic_boxes() -> torch.Tensor:
    """Two per-frame triclinic boxes (vectors in rows), widths above twice the clash distance."""
    return torch.tensor(
        [
            [[7.0, 0.0, 0.0], [1.5, 6.5, 0.0], [-1.0, 2.0, 6.8]],
            [[6.6, 0.0, 0.0], [3.3, 5.7, 0.0], [3.3, 1.9, 5.4]],  # a rhombic dodecahedron
        ],
        dtype=F64,
    )


def _periodic_brute_force(xyz: torch.Tensor, h: torch.Tensor, pairs: list, dmin: float) -> torch.Tensor:
    """Penalties with |x_i - x_j| the shortest of the images n H, n in {-8..8}^3 (float64 oracle)."""
    shifts = torch.tensor(list(itertools.product(range(-8, 9), repeat=3)), dtype=F64)
    out = []
    for f in range(xyz.shape[0]):
        images = shifts @ h[f]  # (125, 3)
        row = []
        for i, j in pairs:
            d = (xyz[f, i] - xyz[f, j] + images).norm(dim=-1).min()
            row.append(torch.relu(dmin - d) ** 2)
        out.append(torch.stack(row))
    return torch.stack(out)


def test_clash_periodic_matches_all_images() -> None:
    table = _branched()
    h = _triclinic_boxes()
    gen = torch.Generator().manual_seed(7)
    # atoms spread over more than one box and wrapped anywhere: only the nearest image counts
    xyz = torch.randn(2, table.n_atoms, 3, dtype=F64, generator=gen) * 4.0
    pairs = [tuple(p) for p in clash_pairs(table).tolist()]
    expected = _periodic_brute_force(xyz, h, pairs, 2.2)
    got = clash_loss(xyz, table, min_distance=2.2, reduction="none", box=h)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    assert (expected > 0).sum() > 3
    assert not torch.allclose(got, clash_loss(xyz, table, min_distance=2.2, reduction="none"))
    # shifting any atom by whole box vectors changes nothing; the [a, b, c, alpha, beta, gamma] form agrees
    lattice = torch.randint(-3, 4, (2, table.n_atoms, 3), generator=gen).to(F64)
    moved = xyz + lattice @ h
    torch.testing.assert_close(clash_loss(moved, table, min_distance=2.2, reduction="none", box=h), got)
    ortho = torch.tensor([6.0, 6.5, 7.0, 90.0, 90.0, 90.0], dtype=F64)
    h_ortho = torch.diag(ortho[:3]).expand(2, 3, 3)
    torch.testing.assert_close(
        clash_loss(xyz, table, min_distance=2.2, reduction="sum", box=ortho),
        _periodic_brute_force(xyz, h_ortho, pairs, 2.2).sum(-1),
    )


def test_clash_periodic_gradients_vmap_and_batch() -> None:
    table = bn.ConstructionTable.chain(6)
    h = _triclinic_boxes()
    xyz = torch.randn(2, 6, 3, dtype=F64, generator=torch.Generator().manual_seed(3)) * 3.0

    def loss(x: torch.Tensor, box: torch.Tensor) -> torch.Tensor:
        return clash_loss(x, table, min_distance=2.5, reduction="sum", box=box)

    assert float(loss(xyz, h).sum()) > 0
    x = xyz.clone().requires_grad_(True)
    box = h.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(loss, (x, box))
    assert torch.autograd.gradgradcheck(loss, (x, box))
    torch.testing.assert_close(torch.func.vmap(loss)(xyz, h), loss(xyz, h))
    # one box shared by a (3, 2) batch; per-frame boxes broadcast against it
    many = xyz.expand(3, 2, 6, 3)
    torch.testing.assert_close(loss(many, h[0]), loss(xyz, h[0]).expand(3, 2))
    torch.testing.assert_close(loss(many, h), loss(xyz, h).expand(3, 2))
    # a box that adds a batch dimension
    assert loss(xyz[0], h).shape == (2,)


def test_clash_periodic_errors() -> None:
    table = bn.ConstructionTable.chain(4)
    xyz = torch.zeros(2, 4, 3)
    with pytest.raises(ValueError, match=r"box must have shape \(\.\.\., 6\).*got \(2, 5\)"):
        clash_loss(xyz, table, min_distance=1.0, box=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"box of shape \(3, 6\).*does not broadcast.*\(2, 4, 3\)"):
        clash_loss(xyz, table, min_distance=1.0, box=torch.ones(3, 6))
    with pytest.raises(TypeError, match="box"):
        clash_loss(xyz, table, min_distance=1.0, box=torch.ones(6, dtype=torch.bool))
