"""The fused build in the pose (``to_cartesian(method="fused", rotation=, translation=)``: the kernels
write each seeded atom as ``R y + t``) against the torch ``apply_pose``: values, NaN for improper
rotations, anchored atoms, broadcasting, first and second derivatives, torch.func, every kernel
layout; and extract_pose's kernel."""

from __future__ import annotations

import math

import pytest
import torch

import batched_nerf as bn
from batched_nerf import apply_pose

pytest.importorskip("numba", reason="the fused pose kernel needs numba (the extra 'fast')")

from batched_nerf.engines.fused.cpu import pose as pose_kernels  # noqa: E402

F64 = torch.float64


def _rotations(n: int, seed: int, dtype: torch.dtype = F64) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, 3, 3, dtype=F64, generator=torch.Generator().manual_seed(seed)))
    return (q * torch.linalg.det(q)[:, None, None]).to(dtype)  # proper rotations


def _tables() -> dict[str, bn.ConstructionTable]:
    chain = bn.ConstructionTable.chain(7)
    anchored = bn.ConstructionTable([[-1, -1, -1]] * 3 + [[0, 1, 2]], fixed=[0, 1, 2])
    return {
        "one component": bn.data.load("alanine_dipeptide").table,
        "three components, one anchored": bn.pack_tables([chain, anchored, bn.ConstructionTable.chain(2)]),
        "interleaved components and anchored atoms": bn.ConstructionTable(_INTERLEAVED, fixed=[1, 3, 5]),
    }


# two seeded components (A: 0 2 4 7 12, B: 8 9 11) and anchored atoms (6, 10) taking turns, so
# that the kernels' runs of atoms of one component are short and every component has several
_INTERLEAVED = [
    [-1, -1, -1], [-1, -1, -1], [0, -1, -1], [-1, -1, -1], [2, 0, -1], [-1, -1, -1], [1, 3, 5],
    [4, 2, 0], [-1, -1, -1], [8, -1, -1], [6, 1, 3], [9, 8, -1], [7, 4, 2],
]  # fmt: skip


def _internal(table: bn.ConstructionTable, batch: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    n = table.n_atoms
    b = (1.0 + 0.5 * torch.rand(batch, n, generator=gen, dtype=F64)).to(dtype)
    a = (1.7 + 0.6 * torch.rand(batch, n, generator=gen, dtype=F64)).to(dtype)
    d = (2 * math.pi * torch.rand(batch, n, generator=gen, dtype=F64) - math.pi).to(dtype)
    fixed = None
    if len(table.fixed):
        fixed = torch.randn(batch, len(table.fixed), 3, generator=gen, dtype=F64).to(dtype)
    return b, a, d, fixed


def _pose(table: bn.ConstructionTable, batch: int, dtype: torch.dtype, seed: int):
    s = bn.pose_components(table)
    rot = _rotations(batch * s, seed, dtype).reshape(batch, s, 3, 3)
    tr = torch.randn(batch, s, 3, dtype=F64, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return (rot[:, 0], tr[:, 0]) if s == 1 else (rot, tr)


@pytest.mark.parametrize("name", list(_tables()))
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_fused_pose_equals_the_torch_pose(name: str, dtype: torch.dtype) -> None:
    table = _tables()[name]
    b, a, d, fixed = _internal(table, 6, dtype, 1)
    rot, tr = _pose(table, 6, dtype, 2)
    rot = rot.clone()
    rot[3] = -rot[3]  # sample 3: improper, NaN for its moved atoms only
    got = bn.to_cartesian(b, a, d, table, fixed_xyz=fixed, method="fused", rotation=rot, translation=tr)
    bare = bn.to_cartesian(b, a, d, table, fixed_xyz=fixed, method="fused")
    want = apply_pose(bare, table, rotation=rot, translation=tr)
    assert torch.equal(got.isnan(), want.isnan()) and got[3].isnan().any()
    assert got[[0, 1, 2, 4, 5]].isfinite().all()
    tol = 1e-12 if dtype == F64 else 2e-6
    torch.testing.assert_close(got, want, rtol=0, atol=tol, equal_nan=True)
    # a rotation or translation alone, and one shared by the whole batch (broadcast)
    for kw in ({"rotation": rot[0]}, {"translation": tr[0]}, {"rotation": rot[:1], "translation": tr}):
        got = bn.to_cartesian(b, a, d, table, fixed_xyz=fixed, method="fused", **kw)
        torch.testing.assert_close(got, apply_pose(bare, table, **kw), rtol=0, atol=tol)


def test_fused_to_cartesian_builds_in_the_pose(monkeypatch: pytest.MonkeyPatch) -> None:
    """method="fused" hands the pose to the builder's kernels (rows made once per pass: the forward's
    with NaN for improper rotations, the backward's without) and runs no torch pose; "scan" does not."""
    calls = []
    real = pose_kernels.pose_rows
    monkeypatch.setattr(pose_kernels, "pose_rows", lambda r, t, nan: calls.append(nan) or real(r, t, nan))
    from batched_nerf.core import pose as core_pose
    from batched_nerf.engines.fused import build as fused_build

    for module in (fused_build, core_pose):  # where the torch pose (`_geometry.pose_atoms`) may run
        monkeypatch.setattr(module, "pose_atoms", lambda *a: pytest.fail("the torch pose ran"))
    table = _tables()["one component"]
    b, a, d, _ = _internal(table, 4, torch.float32, 3)
    rot, tr = _pose(table, 4, torch.float32, 4)
    b.requires_grad_(True)
    rot.requires_grad_(True)
    bn.to_cartesian(b, a, d, table, method="fused", rotation=rot, translation=tr).sum().backward()
    assert calls == [True, False] and rot.grad is not None
    monkeypatch.undo()
    bn.to_cartesian(b, a, d, table, method="scan", rotation=rot, translation=tr)
    assert calls == [True, False]


@pytest.mark.parametrize("name", list(_tables()))
@pytest.mark.parametrize("layout", ["per sample", "blocked", "threaded"])
def test_every_kernel_layout_builds_in_the_pose(name: str, layout: str, monkeypatch) -> None:
    """Per-sample, blocked (samples innermost) and threaded kernels: values and first and second
    derivatives (the pose's too) as apply_pose after the bare build; a pose of more samples than the
    internal coordinates broadcasts them."""
    from batched_nerf.engines.fused.cpu import build as cpu_build

    if layout == "per sample":
        monkeypatch.setattr(cpu_build, "BLOCK_MIN", 10**9)
    if layout == "threaded":
        monkeypatch.setattr(cpu_build, "SERIAL_WORK", 0)
        monkeypatch.setattr(cpu_build, "TBB_SERIAL_WORK", 0)
    table = _tables()[name]
    b, a, d, fixed = _internal(table, 40, F64, 21)
    rot, tr = _pose(table, 40, F64, 22)
    w = torch.randn(40, table.n_atoms, 3, dtype=F64, generator=torch.Generator().manual_seed(23))

    def grads(method: str) -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_(True) for t in (b, a, d, rot, tr)]
        out = bn.to_cartesian(*leaves[:3], table, fixed_xyz=fixed, method=method, rotation=leaves[3],
                              translation=leaves[4])  # fmt: skip
        first = torch.autograd.grad((out * w).sum(), leaves, create_graph=True)
        second = torch.autograd.grad(sum(g.square().sum() for g in first), leaves, allow_unused=True)
        return (out, *first, *(torch.zeros_like(x) if g is None else g for x, g in zip(leaves, second)))

    for got, want in zip(grads("fused"), grads("scan")):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    with torch.no_grad():  # the ICs of one sample, the pose of 40
        wide = bn.to_cartesian(b[0], a[0], d[0], table, fixed_xyz=fixed, method="fused", rotation=rot,
                               translation=tr)  # fmt: skip
    bare = bn.to_cartesian(b[0], a[0], d[0], table, fixed_xyz=fixed, method="scan")
    torch.testing.assert_close(
        wide, apply_pose(bare, table, rotation=rot, translation=tr), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("name", list(_tables()))
def test_fused_pose_derivatives(name: str) -> None:
    """gradcheck and gradgradcheck in the internal coordinates, the rotation and the translation."""
    table = _tables()[name]
    b, a, d, fixed = _internal(table, 2, F64, 5)
    rot, tr = _pose(table, 2, F64, 6)
    inputs = tuple(t.clone().requires_grad_(True) for t in (d, rot, tr))

    def f(d: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return bn.to_cartesian(b, a, d, table, fixed_xyz=fixed, method="fused", rotation=r, translation=t)

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


@pytest.mark.parametrize("batch", [3, 40])  # the per-sample and the blocked kernels
def test_an_improper_rotation_gives_nan_and_no_gradient(batch: int) -> None:
    """Its component is NaN, and it gets no gradient, first or second order (the reference's where)."""
    table = _tables()["three components, one anchored"]
    b, a, d, fixed = _internal(table, batch, F64, 7)
    rot, tr = _pose(table, batch, F64, 8)
    rot = rot.clone()
    rot[1, 0] = -rot[1, 0]  # sample 1, component 0: improper
    w = torch.randn(batch, table.n_atoms, 3, dtype=F64, generator=torch.Generator().manual_seed(9))
    slot = torch.tensor(bn.core.pose.pose_info(table).slot)

    def grads(method: str) -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_(True) for t in (b, a, d, rot, tr)]
        out = bn.to_cartesian(*leaves[:3], table, fixed_xyz=fixed, method=method, rotation=leaves[3],
                              translation=leaves[4])  # fmt: skip
        first = torch.autograd.grad((out.nan_to_num() * w).sum(), leaves, create_graph=True)
        second = torch.autograd.grad(sum(g.square().sum() for g in first), leaves, allow_unused=True)
        return (out, *first, *(torch.zeros_like(x) if g is None else g for x, g in zip(leaves, second)))

    got, want = grads("fused"), grads("scan")
    assert torch.equal(got[0].isnan(), (slot == 0).expand(batch, -1).clone().index_fill_(0, torch.tensor(
        [i for i in range(batch) if i != 1]), False).unsqueeze(-1).expand(-1, -1, 3))  # fmt: skip
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-10, equal_nan=True)
    g_b, g_rot = got[1], got[4]
    assert g_rot[1, 0].eq(0).all() and g_b[1][slot == 0].eq(0).all() and g_b.isfinite().all()


def test_fused_pose_under_torch_func() -> None:
    table = _tables()["one component"]
    b, a, d, _ = _internal(table, 3, F64, 9)
    rot, tr = _pose(table, 3, F64, 10)

    def f(method: str):
        def build(d1: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
            return bn.to_cartesian(b[0], a[0], d1, table, method=method, rotation=r, translation=tr[0])

        return build

    for transform in (torch.func.jacrev, torch.func.jacfwd):
        got = transform(f("fused"), argnums=(0, 1))(d[0], rot[0])
        want = transform(f("scan"), argnums=(0, 1))(d[0], rot[0])
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r, rtol=0, atol=1e-10)
    got = torch.func.vmap(f("fused"))(d, rot)
    torch.testing.assert_close(got, torch.func.vmap(f("scan"))(d, rot), rtol=0, atol=1e-12)


def test_flow_inverse_with_pose_takes_the_kernel_and_inverts_the_forward() -> None:
    table = _tables()["one component"]
    flow = bn.InternalCoordinateTransform(table, pose=True, method="fused")
    b, a, d, _ = _internal(table, 5, F64, 13)
    x = bn.to_cartesian(b, a, d, table, rotation=_rotations(5, 14), translation=torch.randn(5, 3, dtype=F64))
    z = flow(x)
    back, ld_inv = flow.inverse(z.bonds, z.angles, z.dihedrals, z.rotation, z.translation)
    torch.testing.assert_close(back, x, rtol=0, atol=1e-10)
    torch.testing.assert_close(z.log_det + ld_inv, torch.zeros_like(ld_inv), rtol=0, atol=1e-10)


def test_a_table_first_posed_under_inference_mode_trains_afterwards() -> None:
    """The pose's cached slot tensor is made outside inference mode (a validation pass first)."""
    table = bn.ConstructionTable.chain(5)
    b, a, d, _ = _internal(table, 2, F64, 15)
    rot, tr = _pose(table, 2, F64, 16)
    with torch.inference_mode():
        bn.to_cartesian(b, a, d, table, method="fused", rotation=rot, translation=tr)
    r = rot.clone().requires_grad_(True)
    for method in ("fused", "scan"):
        out = bn.to_cartesian(b, a, d, table, method=method, rotation=r, translation=tr)
        (g,) = torch.autograd.grad(out.square().sum(), r, create_graph=True)
        g.square().sum().backward()


# ------------------------------------------------------------------ extract_pose's kernel
def _extract_cases() -> dict[str, bn.ConstructionTable]:
    one, two = bn.ConstructionTable([[-1, -1, -1]]), bn.ConstructionTable([[-1, -1, -1], [0, -1, -1]])
    short = bn.pack_tables([one, bn.ConstructionTable.chain(4), two])
    return {**_tables(), "one- and two-atom components": short}


@pytest.mark.parametrize("name", list(_extract_cases()))
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_extract_pose_kernel_equals_the_torch_frame(name: str, dtype: torch.dtype, monkeypatch) -> None:
    """Without anything to differentiate extract_pose is one kernel pass: the torch frame's values,
    NaN where a seed is NaN, zero frames at coincident seeds, lab axes for short components."""
    table = _extract_cases()[name]
    x = torch.randn(3, 2, table.n_atoms, 3, dtype=F64, generator=torch.Generator().manual_seed(5)).to(dtype)
    x[0, 0, 1] = x[0, 0, 0]  # coincident root and second seed
    x[1, 0] = 0.0  # every atom at the origin
    x[2, 1, :, 0] = float("nan")  # every seed's x NaN: every translation's x, every frame of 2+ atoms
    calls = []
    kernel = pose_kernels.extract
    monkeypatch.setattr(pose_kernels, "extract", lambda *a: calls.append(1) or kernel(*a))
    fast = bn.extract_pose(x, table)
    assert calls == [1]
    slow = bn.extract_pose(x.clone().requires_grad_(True), table)  # the torch operations
    assert calls == [1]
    tol = {"atol": 1e-6, "rtol": 0} if dtype == torch.float32 else {"atol": 1e-14, "rtol": 0}
    torch.testing.assert_close(fast.rotation, slow.rotation.detach(), equal_nan=True, **tol)
    torch.testing.assert_close(fast.translation, slow.translation.detach(), equal_nan=True, atol=0, rtol=0)
    assert fast.rotation.dtype == dtype and fast.rotation.shape == slow.rotation.shape
    assert fast.translation[2, 1][..., 0].isnan().all() and fast.rotation[2, 1].isnan().any()
    assert not fast.rotation[2, 0].isnan().any()


def test_extract_pose_takes_the_torch_frame_whenever_something_is_differentiated(monkeypatch) -> None:
    table = bn.data.load("alanine_dipeptide").table
    x = torch.randn(4, table.n_atoms, 3, dtype=F64)
    monkeypatch.setattr(pose_kernels, "extract", lambda *a: pytest.fail("the kernel ran"))
    leaf = x.clone().requires_grad_(True)
    bn.extract_pose(leaf, table).rotation.sum().backward()  # a gradient
    assert leaf.grad is not None and leaf.grad.abs().sum() > 0
    jac = torch.func.jacrev(lambda y: bn.extract_pose(y, table).rotation)(x[0])  # a torch.func wrapper
    assert jac.shape == (3, 3, table.n_atoms, 3)
    with torch.autograd.forward_ad.dual_level():  # a tangent
        dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
        tangent = torch.autograd.forward_ad.unpack_dual(bn.extract_pose(dual, table).translation).tangent
    assert tangent is not None and torch.equal(tangent, torch.ones(4, 3, dtype=F64))
