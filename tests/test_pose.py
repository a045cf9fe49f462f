"""Global pose: apply_pose / extract_pose round trips, shapes, gradients, errors."""

from __future__ import annotations

import math

import pytest
import torch

import batched_nerf as bn
from batched_nerf import (
    apply_pose,
    extract_pose,
    pose_components,
    rotation_angles,
    rotation_from_angles,
)

F64 = torch.float64


def _random_rotation(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(*shape, 3, dtype=F64, generator=gen)
    u = u * torch.tensor([2 * math.pi, 2.0, 2 * math.pi], dtype=F64) - torch.tensor(
        [math.pi, 1.0, math.pi], dtype=F64
    )
    return rotation_from_angles(u)


def _roundtrip(table: bn.ConstructionTable, xyz: torch.Tensor, fixed_xyz: torch.Tensor | None = None) -> None:
    ic = bn.to_internal(xyz, table)
    pose = extract_pose(xyz, table)
    rebuilt = apply_pose(
        bn.to_cartesian(*ic, table, fixed_xyz=fixed_xyz),
        table,
        rotation=pose.rotation,
        translation=pose.translation,
    )
    torch.testing.assert_close(rebuilt, xyz, rtol=0, atol=1e-10)


def test_single_component_roundtrip_and_shapes() -> None:
    table = bn.ConstructionTable.chain(7)
    xyz = torch.randn(4, 2, 7, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    pose = extract_pose(xyz, table)
    assert pose.rotation.shape == (4, 2, 3, 3) and pose.translation.shape == (4, 2, 3)
    eye = torch.eye(3, dtype=F64).expand(4, 2, 3, 3)
    torch.testing.assert_close(pose.rotation.transpose(-1, -2) @ pose.rotation, eye)
    torch.testing.assert_close(torch.linalg.det(pose.rotation), torch.ones(4, 2, dtype=F64))
    _roundtrip(table, xyz)


def test_canonical_frame_has_identity_pose() -> None:
    table = bn.ConstructionTable.chain(5)
    gen = torch.Generator().manual_seed(1)
    xyz = bn.to_cartesian(
        1 + torch.rand(5, dtype=F64, generator=gen),
        1 + torch.rand(5, dtype=F64, generator=gen),
        torch.randn(5, dtype=F64, generator=gen),
        table,
    )
    pose = extract_pose(xyz, table)
    torch.testing.assert_close(pose.rotation, torch.eye(3, dtype=F64))
    torch.testing.assert_close(pose.translation, torch.zeros(3, dtype=F64))


def test_apply_then_extract_recovers_pose() -> None:
    table = bn.ConstructionTable.chain(5)
    gen = torch.Generator().manual_seed(2)
    y = bn.to_cartesian(
        1 + torch.rand(3, 5, dtype=F64, generator=gen),
        1 + torch.rand(3, 5, dtype=F64, generator=gen),
        torch.randn(3, 5, dtype=F64, generator=gen),
        table,
    )
    rot = _random_rotation((3,), seed=3)
    t = torch.randn(3, 3, dtype=F64, generator=gen)
    pose = extract_pose(apply_pose(y, table, rotation=rot, translation=t), table)
    torch.testing.assert_close(pose.rotation, rot)
    torch.testing.assert_close(pose.translation, t)


def test_multi_component_per_component_poses() -> None:
    # components of 4, 3, 2 and 1 atoms
    table = bn.ConstructionTable(
        [
            [-1, -1, -1],
            [0, -1, -1],
            [1, 0, -1],
            [2, 1, 0],
            [-1, -1, -1],
            [4, -1, -1],
            [4, 5, -1],
            [-1, -1, -1],
            [7, -1, -1],
            [-1, -1, -1],
        ]
    )
    assert pose_components(table) == 4
    xyz = torch.randn(5, 10, 3, dtype=F64, generator=torch.Generator().manual_seed(4))
    pose = extract_pose(xyz, table)
    assert pose.rotation.shape == (5, 4, 3, 3) and pose.translation.shape == (5, 4, 3)
    _roundtrip(table, xyz)
    # the single atom gets the identity
    torch.testing.assert_close(pose.rotation[:, 3], torch.eye(3, dtype=F64).expand(5, 3, 3))


def test_anchored_components_untouched() -> None:
    table = bn.ConstructionTable(
        [
            [-1, -1, -1],
            [-1, -1, -1],
            [-1, -1, -1],
            [0, 1, 2],
            [-1, -1, -1],
            [4, -1, -1],
            [5, 4, -1],
            [6, 5, 4],
        ],
        fixed=[0, 1, 2],
    )
    assert pose_components(table) == 1
    xyz = torch.randn(2, 8, 3, dtype=F64, generator=torch.Generator().manual_seed(5))
    _roundtrip(table, xyz, fixed_xyz=xyz[:, :3])
    moved = apply_pose(xyz, table, rotation=_random_rotation((), 6), translation=torch.ones(3, dtype=F64))
    torch.testing.assert_close(moved[:, :4], xyz[:, :4])
    assert not torch.allclose(moved[:, 4:], xyz[:, 4:])


def test_rotation_chart_roundtrip() -> None:
    gen = torch.Generator().manual_seed(7)
    u = torch.rand(50, 3, dtype=F64, generator=gen) * torch.tensor([6.0, 1.9, 6.0], dtype=F64) - torch.tensor(
        [3.0, 0.95, 3.0], dtype=F64
    )
    rot = rotation_from_angles(u)
    torch.testing.assert_close(rot @ rot.transpose(-1, -2), torch.eye(3, dtype=F64).expand(50, 3, 3))
    torch.testing.assert_close(rotation_angles(rot), u)


def test_gradient_safe_at_degenerate_seeds() -> None:
    table = bn.ConstructionTable.chain(4)
    # coincident first two atoms and collinear third
    xyz = torch.tensor([[0.0, 0, 0], [0.0, 0, 0], [2.0, 0, 0], [2.0, 1, 0]], dtype=F64, requires_grad=True)
    pose = extract_pose(xyz, table)
    (g,) = torch.autograd.grad(pose.rotation.sum() + pose.translation.sum(), xyz)
    assert torch.isfinite(pose.rotation).all() and torch.isfinite(g).all()
    # second-order too
    (g2,) = torch.autograd.grad(
        torch.autograd.grad(extract_pose(xyz, table).rotation.square().sum(), xyz, create_graph=True)[
            0
        ].sum(),
        xyz,
    )
    assert torch.isfinite(g2).all()


def test_torch_func_compatible() -> None:
    table = bn.ConstructionTable.chain(5)
    xyz = torch.randn(3, 5, 3, dtype=F64, generator=torch.Generator().manual_seed(8))
    vm = torch.func.vmap(lambda x: extract_pose(x, table).rotation)(xyz)
    torch.testing.assert_close(vm, extract_pose(xyz, table).rotation)
    jac = torch.func.jacrev(lambda x: extract_pose(x, table).rotation)(xyz[0])
    assert jac.shape == (3, 3, 5, 3) and torch.isfinite(jac).all()


def test_errors() -> None:
    table = bn.ConstructionTable.chain(4)
    xyz = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"xyz must have shape \(\.\.\., N, 3\) with N = 4"):
        extract_pose(torch.zeros(3, 3), table)
    with pytest.raises(TypeError, match="table must be a ConstructionTable"):
        apply_pose(xyz, None, rotation=torch.eye(3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="table must be a ConstructionTable"):
        pose_components(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"rotation must have shape \(\.\.\., 3, 3\)"):
        apply_pose(xyz, table, rotation=torch.eye(2))
    with pytest.raises(ValueError, match=r"translation must have shape \(\.\.\., 3\)"):
        apply_pose(xyz, table, translation=torch.zeros(2))
    two = bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [-1, -1, -1], [2, -1, -1]])
    with pytest.raises(ValueError, match=r"rotation must have shape \(\.\.\., 2, 3, 3\)"):
        apply_pose(torch.zeros(4, 3), two, rotation=torch.eye(3))
    with pytest.raises(ValueError, match=r"translation must have shape \(\.\.\., 2, 3\)"):
        apply_pose(torch.zeros(4, 3), two, translation=torch.zeros(3))
    with pytest.raises(ValueError, match="do not broadcast"):
        apply_pose(torch.zeros(2, 4, 3), table, rotation=torch.eye(3).expand(3, 3, 3))
    anchored = bn.ConstructionTable([[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2]], fixed=[0, 1, 2])
    with pytest.raises(ValueError, match="no seeded component"):
        extract_pose(xyz, anchored)
    with pytest.raises(ValueError, match="no seeded component"):
        apply_pose(xyz, anchored, translation=torch.zeros(3))
    with pytest.raises(ValueError, match=r"angles must have shape \(\.\.\., 3\)"):
        rotation_from_angles(torch.zeros(2))
    with pytest.raises(ValueError, match=r"rotation must have shape \(\.\.\., 3, 3\)"):
        rotation_angles(torch.zeros(3))
    # no pose at all: unchanged
    assert apply_pose(xyz, table) is not None


def test_public_keywords_round_trip(method: str) -> None:
    """`to_internal(..., return_pose=True)` and `to_cartesian(..., rotation=, translation=)` invert."""
    mol = bn.data.load("alanine_dipeptide")
    table = mol.table
    xyz = mol.to_cartesian() @ _random_rotation((), 11).T + torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    ic, pose = bn.to_internal(xyz, table, return_pose=True)
    rebuilt = bn.to_cartesian(*ic, table, method=method, rotation=pose.rotation, translation=pose.translation)
    torch.testing.assert_close(rebuilt, xyz, rtol=0, atol=1e-10)
    # degrees and pose together
    ic_deg, pose_deg = bn.to_internal(xyz, table, degrees=True, return_pose=True)
    torch.testing.assert_close(pose_deg.rotation, pose.rotation)
    back = bn.to_cartesian(
        *ic_deg, table, degrees=True, rotation=pose_deg.rotation, translation=pose_deg.translation
    )
    torch.testing.assert_close(back, xyz, rtol=0, atol=1e-10)


def test_one_component_pose_equals_per_atom_formula() -> None:
    """The one-component path (one batched ``x @ R^T``) against ``R_atom x + t`` written per atom.

    Anchored atoms stay put, an improper rotation gives NaN for the moved atoms of its sample
    only, and first and second derivatives (rotation, translation, xyz) agree.
    """
    table = bn.ConstructionTable(
        [
            [-1, -1, -1],
            [-1, -1, -1],
            [-1, -1, -1],
            [0, 1, 2],
            [-1, -1, -1],
            [4, -1, -1],
            [5, 4, -1],
            [6, 5, 4],
        ],
        fixed=[0, 1, 2],
    )
    moved_atoms = torch.tensor([False] * 4 + [True] * 4)
    gen = torch.Generator().manual_seed(11)
    xyz = torch.randn(3, 8, 3, dtype=F64, generator=gen, requires_grad=True)
    rot = _random_rotation((3,), 12)
    rot = torch.cat((rot[:2], -rot[2:])).requires_grad_(True)  # sample 2: improper
    tr = torch.randn(3, 3, dtype=F64, generator=gen, requires_grad=True)

    def per_atom(x, r, t):
        moved = torch.einsum("bij,bnj->bni", r, x) + t.unsqueeze(-2)
        return torch.where(moved_atoms.unsqueeze(-1), moved, x)

    got = apply_pose(xyz, table, rotation=rot, translation=tr)
    want = per_atom(xyz, rot, tr)
    assert torch.isnan(got[2, 4:]).all() and torch.isfinite(got[2, :4]).all()
    torch.testing.assert_close(got[:2], want[:2], rtol=0, atol=1e-14)
    torch.testing.assert_close(got[2, :4], xyz[2, :4], rtol=0, atol=0)
    w = torch.randn(2, 8, 3, dtype=F64, generator=gen)
    g_got = torch.autograd.grad((got[:2] * w).sum(), (xyz, rot, tr), create_graph=True)
    g_want = torch.autograd.grad((want[:2] * w).sum(), (xyz, rot, tr), create_graph=True)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    assert torch.isfinite(g_got[1]).all()  # the improper sample gets a zero gradient, not NaN
    gg_got = torch.autograd.grad(g_got[0].square().sum(), rot)
    gg_want = torch.autograd.grad(g_want[0].square().sum(), rot)
    for a, b in zip(gg_got, gg_want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


# ---------------------------------------------------------- the chart's domain
def _formula(u: torch.Tensor) -> torch.Tensor:
    """The chart's matrix written out (float64 oracle), without any domain check."""
    yaw, s, roll = u.unbind(-1)
    c = torch.sqrt(1.0 - s * s)
    cy, sy, cr, sr = yaw.cos(), yaw.sin(), roll.cos(), roll.sin()
    rows = (
        (cy * c, cy * s * sr - sy * cr, cy * s * cr + sy * sr),
        (sy * c, sy * s * sr + cy * cr, sy * s * cr - cy * sr),
        (-s, c * sr, c * cr),
    )
    return torch.stack([torch.stack(r, dim=-1) for r in rows], dim=-2)


@pytest.mark.parametrize("s", [1.5, -1.0000001, 7.0, -math.inf, math.inf, math.nan])
def test_rotation_from_angles_outside_the_chart_is_nan(s: float) -> None:
    """``|s| > 1`` once gave a matrix with det 2.25 (s = 1.5): now every entry is NaN, not a non-rotation."""
    for dtype in (torch.float32, F64):
        r = rotation_from_angles(torch.tensor([0.4, s, -1.2], dtype=dtype))
        assert r.shape == (3, 3) and r.isnan().all(), r


def test_rotation_from_angles_edges_of_the_chart_are_rotations() -> None:
    for s in (1.0, -1.0, 0.0):
        r = rotation_from_angles(torch.tensor([0.4, s, -1.2], dtype=F64))
        torch.testing.assert_close(r @ r.T, torch.eye(3, dtype=F64), rtol=0, atol=1e-15)
        assert torch.linalg.det(r).item() == pytest.approx(1.0, abs=1e-15)


def test_rotation_from_angles_outside_the_chart_under_vmap_and_in_a_batch() -> None:
    """Elementwise: only the samples outside the chart are NaN, in a batch and under vmap alike."""
    u = torch.tensor([[0.3, 0.2, 1.0], [0.3, 1.5, 1.0], [-2.0, -0.9, 0.1], [1.0, -3.0, 2.0]], dtype=F64)
    outside = torch.tensor([False, True, False, True])
    batched = rotation_from_angles(u)
    vmapped = torch.func.vmap(rotation_from_angles)(u)
    for r in (batched, vmapped):
        assert r[outside].isnan().all() and not r[~outside].isnan().any()
        torch.testing.assert_close(r[~outside], _formula(u[~outside]), rtol=0, atol=1e-15)
    torch.testing.assert_close(vmapped, batched, equal_nan=True)
    compiled = torch.compile(rotation_from_angles, backend="eager", fullgraph=True)(u)
    torch.testing.assert_close(compiled, batched, equal_nan=True)


def test_rotation_from_angles_gradients_inside_the_chart_are_the_formulas() -> None:
    gen = torch.Generator().manual_seed(12)
    u = (torch.rand(6, 3, dtype=F64, generator=gen) * 2 - 1) * torch.tensor([3.0, 0.95, 3.0], dtype=F64)
    u.requires_grad_(True)
    assert torch.autograd.gradcheck(rotation_from_angles, (u,))
    assert torch.autograd.gradgradcheck(rotation_from_angles, (u,))
    w = torch.randn(6, 3, 3, dtype=F64, generator=gen)
    (g,) = torch.autograd.grad((rotation_from_angles(u) * w).sum(), u)
    (g_ref,) = torch.autograd.grad((_formula(u) * w).sum(), u)
    torch.testing.assert_close(g, g_ref, rtol=0, atol=1e-14)
    jac = torch.func.vmap(torch.func.jacrev(rotation_from_angles))(u.detach())
    torch.testing.assert_close(jac, torch.func.vmap(torch.func.jacrev(_formula))(u.detach()))


def test_one_component_pose_broadcasts_like_the_general_path() -> None:
    """A table whose one seeded component holds every atom takes one matmul; same values as R x + t."""
    table = bn.ConstructionTable.chain(6)
    anchored = bn.pack_tables([table, bn.ConstructionTable([[-1, -1, -1]], fixed=[0])])  # anchored atom kept
    gen = torch.Generator().manual_seed(3)
    rot = _random_rotation((4,), 3)
    tr = torch.randn(4, 3, dtype=F64, generator=gen)
    for x in (torch.randn(6, 3, dtype=F64, generator=gen), torch.randn(4, 6, 3, dtype=F64, generator=gen)):
        out = apply_pose(x, table, rotation=rot, translation=tr)
        expected = (
            torch.einsum("fij,...nj->f...ni", rot, x).reshape(4, 6, 3) + tr[:, None]
            if x.ndim == 2
            else (torch.einsum("fij,fnj->fni", rot, x) + tr[:, None])
        )
        assert out.shape == (4, 6, 3)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
        xa = torch.cat((x, x.new_zeros(x.shape[:-2] + (1, 3))), -2)
        general = apply_pose(xa, anchored, rotation=rot, translation=tr)
        torch.testing.assert_close(general[..., :6, :], out, rtol=0, atol=1e-12)
    mirror = rot.clone()
    mirror[1, :, 2] *= -1  # frame 1 improper: NaN there, frame 0 untouched
    bad = apply_pose(x, table, rotation=mirror, translation=tr)
    assert bad[1].isnan().all() and bad[0].isfinite().all()
    xg = x[:1].clone().requires_grad_(True)
    rg = rot[:1].clone().requires_grad_(True)
    assert torch.autograd.gradgradcheck(
        lambda a, r: apply_pose(a, table, rotation=r, translation=tr[:1]), (xg, rg)
    )


def _acetonitrile() -> tuple[bn.ConstructionTable, torch.Tensor]:
    """CH3-C#N built N, C1, C2 first: the seed triple N-C1-C2 lies on one axis (a nitrile)."""
    table = bn.ConstructionTable(
        [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [2, 1, 3], [2, 1, 3]],
    )
    c = math.cos(math.radians(109.5))
    ic = (
        torch.tensor([0.0, 1.16, 1.46, 1.09, 1.09, 1.09], dtype=F64),
        torch.tensor([0.0, 0.0, math.pi, math.acos(-c), math.acos(-c), math.acos(-c)], dtype=F64),
        torch.tensor([0.0, 0.0, 0.0, 0.0, 2 * math.pi / 3, -2 * math.pi / 3], dtype=F64),
    )
    canonical = bn.to_cartesian(*ic, table)
    rot = _random_rotation((), seed=11)
    return table, canonical @ rot.T + torch.tensor([0.5, -1.0, 2.0], dtype=F64)


@pytest.mark.parametrize("grad", [False, True], ids=["kernel", "torch"])
def test_collinear_seed_triple_gives_a_proper_rotation_that_round_trips(grad: bool) -> None:
    """A nitrile's seed triple N-C-C on one axis: det R = +1 and the methyl H rebuilt 1.09 A from C
    (was det 0, the hydrogens 0.36 A from their carbon)."""
    table, xyz = _acetonitrile()
    x = xyz.clone().requires_grad_(grad)
    ic, pose = bn.to_internal(x, table, return_pose=True)
    torch.testing.assert_close(torch.linalg.det(pose.rotation), torch.tensor(1.0, dtype=F64))
    torch.testing.assert_close(pose.rotation @ pose.rotation.T, torch.eye(3, dtype=F64))
    rebuilt = bn.to_cartesian(*ic, table, rotation=pose.rotation, translation=pose.translation)
    _same_molecule_on_the_same_axis(rebuilt.detach(), xyz)


def _same_molecule_on_the_same_axis(rebuilt: torch.Tensor, xyz: torch.Tensor) -> None:
    """The seed atoms where they were and every distance kept (the methyl's azimuth about the
    N-C-C axis is the one thing left open: row 3's dihedral references are collinear)."""
    torch.testing.assert_close(rebuilt[:3], xyz[:3], rtol=0, atol=1e-9)
    torch.testing.assert_close(torch.cdist(rebuilt, rebuilt), torch.cdist(xyz, xyz), rtol=0, atol=1e-9)
    bond_h = (rebuilt[3:] - rebuilt[2]).norm(dim=-1)
    torch.testing.assert_close(bond_h, torch.full((3,), 1.09, dtype=F64))


def test_collinear_seeds_kernel_and_torch_paths_agree() -> None:
    """One convention for every path: the numba pass and the torch operations give one frame."""
    table, xyz = _acetonitrile()
    plain = extract_pose(xyz, table).rotation
    traced = extract_pose(xyz.clone().requires_grad_(True), table).rotation.detach()
    torch.testing.assert_close(plain, traced, rtol=0, atol=1e-12)


def test_collinear_seeds_in_the_flow_layer_round_trip() -> None:
    table, xyz = _acetonitrile()
    flow = bn.InternalCoordinateTransform(table, pose=True)
    z = flow(xyz.unsqueeze(0))
    back, _ = flow.inverse(z.bonds, z.angles, z.dihedrals, z.rotation, z.translation)
    _same_molecule_on_the_same_axis(back[0], xyz)


def test_nan_seed_coordinates_give_a_nan_pose() -> None:
    table = bn.ConstructionTable.chain(4)
    xyz = torch.randn(4, 3, dtype=F64, generator=torch.Generator().manual_seed(3))
    xyz[1, 0] = math.nan
    for x in (xyz, xyz.clone().requires_grad_(True)):
        assert extract_pose(x, table).rotation.isnan().any()
