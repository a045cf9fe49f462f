"""InternalCoordinateTransform: bijection, log-dets, normalisation, fixed atoms, devices."""

from __future__ import annotations

import math

import pytest
import torch

import batched_nerf as bn
from batched_nerf import InternalCoordinateTransform, rotation_angles, rotation_from_angles

F64 = torch.float64


def _xyz(n: int, batch: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, n, 3, dtype=F64, generator=torch.Generator().manual_seed(seed)) * 1.5


@pytest.mark.parametrize("pose", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_roundtrip_and_log_dets_cancel(pose: bool, normalize: bool) -> None:
    table = bn.ConstructionTable.chain(7)
    flow = InternalCoordinateTransform(table, pose=pose, normalize_angles=normalize)
    xyz = _xyz(7)
    if not pose:  # without pose the round trip is exact in the canonical frame
        xyz = bn.to_cartesian(*bn.to_internal(xyz, table), table)
    z = flow(xyz)
    assert z.bonds.shape == (6, 6) and z.angles.shape == (6, 5) and z.dihedrals.shape == (6, 4)
    assert z.fixed_xyz is None
    if normalize:
        assert (z.angles >= 0).all() and (z.angles <= 1).all()
        assert (z.dihedrals >= 0).all() and (z.dihedrals <= 1).all()
    back, ld = flow.inverse(z.bonds, z.angles, z.dihedrals, z.rotation, z.translation)
    torch.testing.assert_close(back, xyz, rtol=0, atol=1e-10)
    torch.testing.assert_close(ld + z.log_det, torch.zeros(6, dtype=F64), rtol=0, atol=1e-10)


def test_normalisation_constants() -> None:
    table = bn.ConstructionTable.chain(6)
    xyz = _xyz(6)
    plain = InternalCoordinateTransform(table)(xyz)
    norm = InternalCoordinateTransform(table, normalize_angles=True)(xyz)
    torch.testing.assert_close(norm.angles, plain.angles / math.pi)
    torch.testing.assert_close(norm.dihedrals, (plain.dihedrals + math.pi) / (2 * math.pi))
    torch.testing.assert_close(
        norm.log_det, plain.log_det - 4 * math.log(math.pi) - 3 * math.log(2 * math.pi)
    )


def test_forward_log_det_matches_jacobian_with_pose() -> None:
    """Forward log-det = slogdet of d(z)/d(x) with the rotation in the Haar-flat chart."""
    table = bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1], [0, 1, 2], [1, 0, 2], [3, 0, 1]])
    flow = InternalCoordinateTransform(table, pose=True, normalize_angles=True)
    x0 = _xyz(6, batch=1, seed=3)[0]
    flow(x0)

    def f(x: torch.Tensor) -> torch.Tensor:
        z = flow(x.reshape(6, 3))
        return torch.cat([z.bonds, z.angles, z.dihedrals, z.translation, rotation_angles(z.rotation)])

    jac = torch.func.jacrev(f)(x0.reshape(-1))
    _, expected = torch.linalg.slogdet(jac)
    torch.testing.assert_close(flow(x0).log_det, expected, rtol=1e-9, atol=1e-9)


def test_inverse_log_det_matches_jacobian() -> None:
    table = bn.ConstructionTable.chain(5)
    flow = InternalCoordinateTransform(table, pose=True)
    z = flow(_xyz(5, batch=1, seed=4)[0])
    u0 = rotation_angles(z.rotation)
    q0 = torch.cat([z.bonds, z.angles, z.dihedrals, z.translation, u0])

    def g(q: torch.Tensor) -> torch.Tensor:
        b, a, d, t, u = q.split([4, 3, 2, 3, 3])
        return flow.inverse(b, a, d, rotation_from_angles(u), t)[0].reshape(-1)

    _, expected = torch.linalg.slogdet(torch.func.jacrev(g)(q0))
    torch.testing.assert_close(
        flow.inverse(z.bonds, z.angles, z.dihedrals, z.rotation, z.translation)[1], expected
    )


def test_fixed_atoms_pass_through() -> None:
    table = bn.ConstructionTable(
        [[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2], [3, 0, 1], [4, 3, 0]], fixed=[0, 1, 2]
    )
    flow = InternalCoordinateTransform(table, normalize_angles=True)
    xyz = _xyz(6)
    z = flow(xyz)
    torch.testing.assert_close(z.fixed_xyz, xyz[:, :3])
    assert z.bonds.shape == (6, 3) and z.rotation is None
    back, ld = flow.inverse(z.bonds, z.angles, z.dihedrals, fixed_xyz=z.fixed_xyz)
    torch.testing.assert_close(back, xyz, rtol=0, atol=1e-10)
    torch.testing.assert_close(ld, -z.log_det)

    # the log-det of the map ICs -> non-fixed Cartesian coordinates (fixed atoms given)
    def f(x: torch.Tensor) -> torch.Tensor:
        full = torch.cat([xyz[0, :3], x.reshape(3, 3)])
        out = flow(full)
        return torch.cat([out.bonds, out.angles, out.dihedrals])

    _, expected = torch.linalg.slogdet(torch.func.jacrev(f)(xyz[0, 3:].reshape(-1)))
    torch.testing.assert_close(z.log_det[0], expected)


def test_module_buffers_and_vmap() -> None:
    table = bn.ConstructionTable.chain(5)
    flow = InternalCoordinateTransform(table, pose=True).to(F64)
    names = {n for n, _ in flow.named_buffers()}
    assert names == {"bond_atoms", "angle_atoms", "dihedral_atoms", "fixed_atoms"}
    assert list(flow.parameters()) == []
    assert flow.n_bonds == 4 and flow.n_angles == 3 and flow.n_dihedrals == 2
    assert "pose=True" in repr(flow)
    xyz = _xyz(5)
    vm = torch.func.vmap(lambda x: flow(x).log_det)(xyz)
    torch.testing.assert_close(vm, flow(xyz).log_det)
    if torch.cuda.is_available():  # pragma: no cover - device-only
        cu = flow.to("cuda")
        assert cu.bond_atoms.device.type == "cuda"
        torch.testing.assert_close(cu(xyz.cuda()).log_det.cpu(), flow.to("cpu")(xyz).log_det)


def test_errors() -> None:
    table = bn.ConstructionTable.chain(5)
    flow = InternalCoordinateTransform(table)
    z = flow(_xyz(5))
    with pytest.raises(ValueError, match=r"bonds must have shape \(\.\.\., 4\)"):
        flow.inverse(z.bonds[:, :3], z.angles, z.dihedrals)
    with pytest.raises(ValueError, match=r"angles must have shape \(\.\.\., 3\)"):
        flow.inverse(z.bonds, z.bonds, z.dihedrals)
    with pytest.raises(ValueError, match=r"dihedrals must have shape \(\.\.\., 2\), got \(6, 1\)"):
        flow.inverse(z.bonds, z.angles, z.dihedrals[:, :1])
    with pytest.raises(TypeError, match=r"^dihedrals must be a torch.Tensor, got list"):
        flow.inverse(z.bonds, z.angles, [0.0, 1.0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pose=False: inverse takes no rotation"):
        flow.inverse(z.bonds, z.angles, z.dihedrals, torch.eye(3), torch.zeros(3))
    with pytest.raises(ValueError, match="do not broadcast"):
        flow.inverse(z.bonds, z.angles[:2], z.dihedrals)
    with pytest.raises(ValueError, match="pose=True: inverse needs rotation and translation"):
        InternalCoordinateTransform(table, pose=True).inverse(z.bonds, z.angles, z.dihedrals)
    anchored = bn.ConstructionTable([[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2]], fixed=[0, 1, 2])
    with pytest.raises(ValueError, match="pose=True needs a seeded component"):
        InternalCoordinateTransform(anchored, pose=True)
    with pytest.raises(TypeError, match="table must be a ConstructionTable"):
        InternalCoordinateTransform("chain")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"xyz must have shape \(\.\.\., N, 3\)"):
        flow(torch.zeros(4, 3))


def _entry_layout_tables() -> dict[str, bn.ConstructionTable]:
    chain = bn.ConstructionTable.chain(6)
    return {
        "one run (chain)": chain,
        "a few runs (alanine dipeptide, seeds inside)": bn.data.load("alanine_dipeptide").table,
        "more runs than are sliced (12 molecules)": bn.pack_tables([chain] * 12),
    }


@pytest.mark.parametrize("name", list(_entry_layout_tables()))
@pytest.mark.parametrize("pose", [False, True])
def test_entries_and_log_det_equal_the_per_atom_functions(name: str, pose: bool) -> None:
    """Entries sliced/concatenated (few runs of atoms) or gathered (many), the log-det summed over
    the entries: the same values and gradients as indexing the per-atom arrays and
    ``log_det_jacobian`` of them."""
    table = _entry_layout_tables()[name]
    flow = bn.InternalCoordinateTransform(table, pose=pose)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, table.n_atoms, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    z = flow(x)
    ic = bn.to_internal(x, table)
    for got, full, atoms in zip(z[:3], ic, (flow.bond_atoms, flow.angle_atoms, flow.dihedral_atoms)):
        torch.testing.assert_close(got, full[..., atoms], rtol=0, atol=0)
    want = -bn.log_det_jacobian(*ic, table, pose=pose)
    torch.testing.assert_close(z.log_det, want, rtol=0, atol=1e-12)
    (g,) = torch.autograd.grad(z.log_det.sum() + z.dihedrals.sin().sum(), x)
    (g_want,) = torch.autograd.grad(want.sum() + ic.dihedrals[..., flow.dihedral_atoms].sin().sum(), x)
    torch.testing.assert_close(g, g_want, rtol=0, atol=1e-10)
    # inverse: entries back into per-atom arrays, zeros elsewhere
    pose_args = (z.rotation, z.translation) if pose else ()
    back, ld = flow.inverse(z.bonds, z.angles, z.dihedrals, *pose_args)
    torch.testing.assert_close(back, x if pose else bn.to_cartesian(*ic, table), rtol=0, atol=1e-10)
    torch.testing.assert_close(ld, -z.log_det, rtol=0, atol=1e-10)
