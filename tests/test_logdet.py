"""Closed-form log-determinants against slogdet of jacrev of the square maps (float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf import apply_pose, log_det_jacobian, pose_log_det, rotation_from_angles

F64 = torch.float64

TABLES = {
    "chain6": (lambda: bn.ConstructionTable.chain(6)),
    "branched": (
        lambda: bn.ConstructionTable(
            [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [0, 1, 2], [1, 0, 2], [3, 0, 1], [1, 0, 3]]
        )
    ),
    "third_from_second": (lambda: bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]])),
    "two_molecules": (
        lambda: bn.ConstructionTable(
            [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [-1, -1, -1], [4, -1, -1], [5, 4, -1]]
        )
    ),
    "with_small_components": (
        lambda: bn.ConstructionTable(
            [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [-1, -1, -1], [4, -1, -1]]
        )
    ),
}


def _fixed_table() -> tuple[bn.ConstructionTable, torch.Tensor]:
    table = bn.ConstructionTable(
        [[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2], [3, 0, 1], [4, 3, 0], [3, 4, 5]],
        fixed=[0, 1, 2],
    )
    gen = torch.Generator().manual_seed(3)
    return table, torch.randn(3, 3, dtype=F64, generator=gen)


def _random_ic(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    b = 0.8 + torch.rand(n, dtype=F64, generator=gen)
    a = 0.5 + 2.0 * torch.rand(n, dtype=F64, generator=gen)
    d = (2.0 * torch.rand(n, dtype=F64, generator=gen) - 1.0) * 3.0
    return b, a, d


def _square_map(table, b, a, d, fixed_xyz=None, pose=False):
    """q -> x for the documented square map, and the point q."""
    refs = table.refs.numpy()
    idx = [torch.as_tensor(np.flatnonzero(refs[:, k] >= 0)) for k in range(3)]
    sizes = [len(i) for i in idx]
    topo = table.topology
    s = topo.seeded.size
    has_third = topo.seed_third >= 0
    fixed = set(table.fixed.tolist())
    nonfixed = torch.as_tensor([i for i in range(len(refs)) if i not in fixed])
    n_refs = (refs >= 0).sum(1)
    # free canonical coordinates (x of second, x,y of third, xyz of full atoms), in atom order
    free_rows, free_cols = [], []
    for i in range(len(refs)):
        if i in fixed:
            continue
        for c in range({0: 0, 1: 1, 2: 2, 3: 3}[int(n_refs[i])]):
            free_rows.append(i)
            free_cols.append(c)
    free_rows_t, free_cols_t = torch.as_tensor(free_rows), torch.as_tensor(free_cols)
    # two-atom seeded components have no roll
    has3 = torch.as_tensor(has_third)

    def f(q):
        parts = list(q[: sum(sizes)].split(sizes))
        bb = b.index_put((idx[0],), parts[0])
        aa = a.index_put((idx[1],), parts[1])
        dd = d.index_put((idx[2],), parts[2])
        x = bn.to_cartesian(bb, aa, dd, table, fixed_xyz=fixed_xyz)
        if not pose:
            return x[free_rows_t, free_cols_t]
        rest = q[sum(sizes) :]
        t = rest[: 3 * s].reshape(s, 3)
        u_flat = rest[3 * s :]
        # per component: yaw, s, and roll only when the component has a third atom
        us, k = [], 0
        for c in range(s):
            if bool(has3[c]):
                us.append(u_flat[k : k + 3])
                k += 3
            else:
                us.append(torch.stack((u_flat[k], u_flat[k + 1], u_flat.new_zeros(()))))
                k += 2
        rot = rotation_from_angles(torch.stack(us))
        if s == 1:
            rot, t = rot[0], t[0]
        x = apply_pose(x, table, rotation=rot, translation=t)
        return x[nonfixed].reshape(-1)

    q = torch.cat([b[idx[0]], a[idx[1]], d[idx[2]]])
    if pose:
        gen = torch.Generator().manual_seed(11)
        n_rot = int(sum(3 if h else 2 for h in has_third.tolist()))
        u = (torch.rand(n_rot, dtype=F64, generator=gen) - 0.5) * 1.6
        q = torch.cat([q, torch.randn(3 * s, dtype=F64, generator=gen), u])
    f(q)  # build plans outside the transform
    return f, q


@pytest.mark.parametrize("name", list(TABLES))
@pytest.mark.parametrize("pose", [False, True], ids=["canonical", "pose"])
def test_log_det_matches_slogdet(name: str, pose: bool) -> None:
    table = TABLES[name]()
    b, a, d = _random_ic(table.n_atoms, seed=len(name))
    f, q = _square_map(table, b, a, d, pose=pose)
    jac = torch.func.jacrev(f)(q)
    assert jac.shape[0] == jac.shape[1]
    sign, expected = torch.linalg.slogdet(jac)
    assert sign != 0
    got = log_det_jacobian(b, a, d, table, pose=pose)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_log_det_with_fixed_atoms() -> None:
    table, fixed_xyz = _fixed_table()
    b, a, d = _random_ic(table.n_atoms, seed=5)
    f, q = _square_map(table, b, a, d, fixed_xyz=fixed_xyz)
    assert q.numel() == 3 * (table.n_atoms - 3)
    _, expected = torch.linalg.slogdet(torch.func.jacrev(f)(q))
    torch.testing.assert_close(log_det_jacobian(b, a, d, table), expected, rtol=1e-10, atol=1e-10)
    # pose of a table without seeded components contributes nothing
    torch.testing.assert_close(pose_log_det(b, a, d, table), torch.zeros((), dtype=F64))


def test_pose_log_det_is_the_difference() -> None:
    table = TABLES["branched"]()
    b, a, d = _random_ic(table.n_atoms, seed=1)
    torch.testing.assert_close(
        log_det_jacobian(b, a, d, table, pose=True),
        log_det_jacobian(b, a, d, table) + pose_log_det(b, a, d, table),
    )


def test_closed_form_per_atom() -> None:
    table = bn.ConstructionTable.chain(5)
    b = torch.tensor([0.0, 1.1, 1.2, 1.3, 1.4], dtype=F64)
    a = torch.tensor([0.0, 0.0, 1.9, 2.0, 2.1], dtype=F64)
    d = torch.zeros(5, dtype=F64)
    expected = math.log(1.2) + sum(
        2 * math.log(r) + math.log(math.sin(t)) for r, t in ((1.3, 2.0), (1.4, 2.1))
    )
    assert math.isclose(float(log_det_jacobian(b, a, d, table)), expected, rel_tol=1e-12)
    expected_pose = expected + 2 * math.log(1.1) + math.log(1.2 * math.sin(1.9))
    assert math.isclose(float(log_det_jacobian(b, a, d, table, pose=True)), expected_pose, rel_tol=1e-12)


def test_degrees_adds_measure_change() -> None:
    table = bn.ConstructionTable.chain(5)
    b, a, d = _random_ic(5, seed=2)
    rad = log_det_jacobian(b, a, d, table)
    deg = log_det_jacobian(b, torch.rad2deg(a), torch.rad2deg(d), table, degrees=True)
    n_angular = 3 + 2
    torch.testing.assert_close(deg, rad + n_angular * math.log(math.pi / 180))


def test_batched_vmap_and_grad() -> None:
    table = bn.ConstructionTable.chain(6)
    gen = torch.Generator().manual_seed(0)
    b = 1.0 + torch.rand(4, 6, dtype=F64, generator=gen)
    a = 0.5 + 2 * torch.rand(4, 6, dtype=F64, generator=gen)
    d = torch.randn(4, 6, dtype=F64, generator=gen)
    out = log_det_jacobian(b, a, d, table, pose=True)
    assert out.shape == (4,)
    vm = torch.func.vmap(lambda bb, aa, dd: log_det_jacobian(bb, aa, dd, table, pose=True))(b, a, d)
    torch.testing.assert_close(vm, out)
    b.requires_grad_(True)
    a.requires_grad_(True)
    (gb, ga) = torch.autograd.grad(log_det_jacobian(b, a, d, table).sum(), (b, a))
    assert torch.isfinite(gb).all() and torch.isfinite(ga).all()
    # d/d r of 2 log r is 2 / r for full atoms; unused entries get exactly zero
    torch.testing.assert_close(gb[:, 3:], 2 / b[:, 3:].detach())
    assert (gb[:, :2] == 0).all() and (ga[:, :3] == 0).all()


@pytest.mark.parametrize("pose", [False, True])
def test_second_order_and_forward_mode(pose: bool) -> None:
    """The log-det's own backward (one node: ``w / b``, ``w / tan a``) against autograd through the
    plain formula, to second order, in forward mode and under ``vmap``."""
    table = bn.ConstructionTable.chain(6)
    gen = torch.Generator().manual_seed(3)
    b = (1.0 + torch.rand(2, 6, dtype=F64, generator=gen)).requires_grad_()
    a = (0.5 + 2 * torch.rand(2, 6, dtype=F64, generator=gen)).requires_grad_()
    d = torch.randn(2, 6, dtype=F64, generator=gen)

    def ld(bb: torch.Tensor, aa: torch.Tensor) -> torch.Tensor:
        return log_det_jacobian(bb, aa, d, table, pose=pose)

    def plain(bb: torch.Tensor, aa: torch.Tensor) -> torch.Tensor:  # sum w log|b| + v log|sin a|
        full = slice(3, None)  # atoms 3-5: 2 log r + log|sin a|; the third seed (atom 2): log r
        out = 2 * bb[..., full].abs().log().sum(-1) + aa[..., full].sin().abs().log().sum(-1)
        out = out + bb[..., 2].log()
        if pose:
            out = out + 2 * bb[..., 1].log() + bb[..., 2].log() + aa[..., 2].sin().abs().log()
        return out

    torch.testing.assert_close(ld(b, a), plain(b, a))
    assert torch.autograd.gradcheck(ld, (b, a))
    assert torch.autograd.gradgradcheck(ld, (b, a))
    hess = torch.func.hessian(lambda x: ld(x[0], x[1]).sum())(torch.stack([b, a]).detach())
    want = torch.func.hessian(lambda x: plain(x[0], x[1]).sum())(torch.stack([b, a]).detach())
    torch.testing.assert_close(hess, want)
    jf = torch.func.jacfwd(ld, argnums=(0, 1))(b.detach(), a.detach())
    jr = torch.func.jacrev(plain, argnums=(0, 1))(b.detach(), a.detach())
    for x, y in zip(jf, jr):
        torch.testing.assert_close(x, y)


def test_errors() -> None:
    table = bn.ConstructionTable.chain(4)
    with pytest.raises(ValueError, match=r"bonds must have shape \(\.\.\., N\) with N = 4"):
        log_det_jacobian(torch.ones(3), torch.ones(4), torch.ones(4), table)
    with pytest.raises(TypeError, match="table must be a ConstructionTable"):
        log_det_jacobian(torch.ones(4), torch.ones(4), torch.ones(4), "table")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="do not broadcast"):
        pose_log_det(torch.ones(2, 4), torch.ones(3, 4), torch.ones(4), table)
