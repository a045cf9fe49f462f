"""Reliability of the core: ring bonds in the clash loss, caches made under inference mode, edge inputs.

Each test here failed on main before the fix it names (see docs/changelog.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf.losses import clash_loss, clash_pairs, committor_loss

F64 = torch.float64


# ------------------------------------------------------------- ring bonds in clash_loss
def _benzene() -> tuple[bn.ZMatrix, torch.Tensor]:
    mol = bn.data.load("benzene")
    return mol, mol.to_cartesian()


def test_benzene_at_its_own_geometry_scores_zero_with_its_bonds() -> None:
    mol, x = _benzene()
    assert mol.connectivity is not None and len(mol.connectivity) == 12  # the ring closure included
    # the ZMatrix brings its own bond graph; an explicit one does the same
    for table, kw in ((mol, {}), (mol.table, {"connectivity": mol.connectivity})):
        assert float(clash_loss(x, table, min_distance=2.5, exclude_14=True, reduction="sum", **kw)) == 0.0
        assert float(clash_loss(x, table, min_distance=2.4, reduction="sum", **kw)) == 0.0
    # with 1-2 and 1-3 pairs excluded only, the six ortho H-H pairs (1-4, 2.48 A) are what scores at 2.5 A
    none = clash_loss(x, mol, min_distance=2.5, reduction="none")
    hits = clash_pairs(mol)[none > 0].tolist()
    assert hits == [[6, 7], [6, 11], [7, 8], [8, 9], [9, 10], [10, 11]]
    assert all(mol.elements[i] == mol.elements[j] == "H" for i, j in hits)
    # without the ring-closure bond (the table's references only) the ring scores
    assert float(clash_loss(x, mol.table, min_distance=2.5, exclude_14=True, reduction="sum")) > 1.0


def test_a_real_clash_still_scores_with_the_bond_graph() -> None:
    mol, x = _benzene()
    far = x.clone()
    far[6] = x[8] + torch.tensor([0.3, 0.0, 0.0], dtype=x.dtype)  # H6 onto H8 (meta, 1-5)
    loss = clash_loss(far, mol, min_distance=2.0, exclude_14=True, reduction="none")
    pairs = clash_pairs(mol, exclude_14=True).tolist()
    assert float(loss[pairs.index([6, 8])]) == pytest.approx((2.0 - 0.3) ** 2)
    # a second benzene on top of the first: every cross pair is non-bonded
    two = bn.pack_tables([mol.table, mol.table])
    conn = np.concatenate([mol.connectivity, mol.connectivity + 12])
    xx = torch.cat([x, x + torch.tensor([0.0, 0.0, 1.0], dtype=x.dtype)])
    assert float(clash_loss(xx, two, connectivity=conn, min_distance=2.0, exclude_14=True)) > 0


def _oracle(xyz: np.ndarray, refs: np.ndarray, conn: np.ndarray, dmin: float, depth: int) -> tuple:
    """Brute force: graph = bond references plus ``conn``, BFS distance per pair."""
    n = len(refs)
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    for i, j in [(i, int(b)) for i, b in enumerate(refs[:, 0]) if b >= 0] + [tuple(p) for p in conn]:
        adj[i].add(j)
        adj[j].add(i)
    pairs, vals = [], []
    for i, j in itertools.combinations(range(n), 2):
        seen, frontier = {i}, {i}
        for _ in range(depth):
            frontier = {v for u in frontier for v in adj[u]} - seen
            seen |= frontier
        if j in seen:
            continue
        pairs.append([i, j])
        vals.append(max(dmin - float(np.linalg.norm(xyz[i] - xyz[j])), 0.0) ** 2)
    return pairs, np.array(vals)


@pytest.mark.parametrize("exclude_14", [False, True])
def test_clash_with_connectivity_matches_brute_force(exclude_14: bool) -> None:
    table = bn.ConstructionTable.chain(12)
    conn = np.array([[0, 5], [6, 11], [3, 4]])  # two ring closures and a bond the references already hold
    xyz = torch.randn(12, 3, dtype=F64, generator=torch.Generator().manual_seed(3)) * 1.2
    pairs, vals = _oracle(xyz.numpy(), table.refs.numpy(), conn, 1.7, 3 if exclude_14 else 2)
    assert clash_pairs(table, connectivity=conn, exclude_14=exclude_14).tolist() == pairs
    got = clash_loss(xyz, table, connectivity=torch.as_tensor(conn), min_distance=1.7, exclude_14=exclude_14)
    assert vals.sum() > 0
    np.testing.assert_allclose(float(got), vals.mean(), rtol=1e-12)
    for chunk in (1, 4, None):
        none = clash_loss(
            xyz, table, connectivity=conn.tolist(), min_distance=1.7, exclude_14=exclude_14,
            reduction="none", chunk_size=chunk,
        )  # fmt: skip
        np.testing.assert_allclose(none.numpy(), vals, rtol=1e-12, atol=1e-14)


def test_clash_skips_the_dummy_rows_of_a_zmatrix() -> None:
    table = bn.ConstructionTable.chain(5)
    real = torch.tensor([True, True, False, True, True])
    z = bn.ZMatrix(table, [0.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 2.0, 2.0, 2.0], [0.0] * 5, real=real)
    pairs = clash_pairs(z).tolist()
    assert pairs == [[0, 3], [0, 4], [1, 4]] and all(2 not in p for p in pairs)
    xyz = torch.zeros(5, 3)
    assert float(clash_loss(xyz, z, min_distance=1.0, reduction="sum")) == 3.0
    # with the ring bond 0-4, 0-3 and 1-4 are 1-3 pairs: nothing is left to score
    assert clash_pairs(z, connectivity=[(0, 4)]).tolist() == []
    assert float(clash_loss(xyz, z, connectivity=[(0, 4)], min_distance=1.0, reduction="sum")) == 0.0
    with pytest.raises(ValueError, match=r"xyz has the 4 real atoms .* pass z.to_cartesian\(dummies=True\)"):
        clash_loss(z.to_cartesian(), z, min_distance=1.0)
    assert clash_loss(z.to_cartesian(dummies=True), z, min_distance=1.0).shape == ()


def test_clash_connectivity_errors() -> None:
    table = bn.ConstructionTable.chain(4)
    xyz = torch.zeros(4, 3)
    with pytest.raises(TypeError, match="table must be a ConstructionTable or a ZMatrix, got list"):
        clash_loss(xyz, [[0, 1]], min_distance=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="table must be a ConstructionTable or a ZMatrix, got NoneType"):
        clash_pairs(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"connectivity\[1\] = \[2, 7\]: atom index out of range \[0, 3\]"):
        clash_loss(xyz, table, connectivity=[(0, 1), (2, 7)], min_distance=1.0)
    with pytest.raises(ValueError, match=r"connectivity\[0\] = \[2, 2\] bonds an atom to itself"):
        clash_pairs(table, connectivity=[(2, 2)])
    with pytest.raises(ValueError, match=r"connectivity must have shape \(E, 2\), got \(3,\)"):
        clash_loss(xyz, table, connectivity=[0, 1, 2], min_distance=1.0)


def test_clash_per_sample_min_distance() -> None:
    table = bn.ConstructionTable.chain(4)
    xyz = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [0.5, 0, 0]]).expand(3, 4, 3)
    dm = torch.tensor([0.4, 1.0, 1.5])
    expected = torch.relu(dm - 0.5) ** 2  # only the pair (0, 3) at 0.5
    torch.testing.assert_close(clash_loss(xyz, table, min_distance=dm, reduction="sum"), expected)
    torch.testing.assert_close(clash_loss(xyz, table, min_distance=dm[:, None], reduction="sum"), expected)
    torch.testing.assert_close(
        clash_loss(xyz, table, min_distance=dm[:, None], reduction="none"), expected[:, None]
    )
    # one conformation, several thresholds: the batch shape is broadcast
    torch.testing.assert_close(clash_loss(xyz[0], table, min_distance=dm, reduction="sum"), expected)
    # differentiable in the threshold, and under vmap
    d = dm.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(clash_loss(xyz, table, min_distance=d, reduction="sum").sum(), d)
    torch.testing.assert_close(g, 2 * torch.relu(dm - 0.5))
    vm = torch.func.vmap(lambda x, m: clash_loss(x, table, min_distance=m, reduction="sum"))(xyz, dm)
    torch.testing.assert_close(vm, expected)
    with pytest.raises(
        ValueError,
        match=r"min_distance must be a scalar or one value per sample.*\(3,\) of xyz, got shape \(2,\)",
    ):
        clash_loss(xyz, table, min_distance=torch.ones(2))
    with pytest.raises(TypeError, match="min_distance must be a real floating tensor"):
        clash_loss(xyz, table, min_distance=torch.ones(3, dtype=torch.bool))


# ------------------------------------------------------------ committor edge cases
def test_committor_empty_batch_is_zero_with_zero_gradient() -> None:
    lin = torch.nn.Linear(6, 1).to(F64)
    x = torch.zeros(0, 2, 3, dtype=F64, requires_grad=True)
    q = torch.sigmoid(lin(x.flatten(1))).squeeze(-1)
    loss = committor_loss(q, x, in_a=torch.zeros(0, dtype=torch.bool), weights=torch.ones(0))
    assert loss.shape == () and float(loss.detach()) == 0.0
    loss.backward()
    assert lin.weight.grad is not None and float(lin.weight.grad.abs().sum()) == 0.0


def test_committor_q_without_a_path_from_x_raises() -> None:
    x = torch.randn(4, 2, 3, dtype=F64, requires_grad=True)
    lin = torch.nn.Linear(6, 1).to(F64)
    msg = r"q does not depend on x \(no autograd path from x to q\)"
    with pytest.raises(ValueError, match=msg):
        committor_loss(torch.sigmoid(lin(x.detach().flatten(1))).squeeze(-1), x)  # a detached copy
    with pytest.raises(ValueError, match=msg):
        committor_loss(torch.full((4,), 0.5, dtype=F64), x)  # a constant
    # q that depends on only part of x is fine: the rest has zero gradient
    q = torch.sigmoid(x[:, 0, 0])
    ref = (q * (1 - q)) ** 2
    torch.testing.assert_close(committor_loss(q, x), ref.mean())


# ------------------------------------------------------- nonbonded_references, split, from_cartesian
def test_nonbonded_references_accepts_a_table_or_a_zmatrix() -> None:
    refs = [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [1, 0, 2]]
    conn = [(0, 1), (0, 2)]
    expected = bn.nonbonded_references(refs, conn)
    table = bn.ConstructionTable(refs)
    np.testing.assert_array_equal(bn.nonbonded_references(table, conn), expected)
    z = bn.ZMatrix(table, [0.0, 1, 1, 3], [0.0, 0, 1.8, 1.5], [0.0, 0, 0, 1], connectivity=conn)
    np.testing.assert_array_equal(bn.nonbonded_references(z), expected)
    np.testing.assert_array_equal(
        bn.nonbonded_references(z, [(0, 1), (0, 2), (1, 3)])[3], [False, False, False]
    )
    mol = bn.data.load("benzene")
    assert not bn.nonbonded_references(mol).any()
    with pytest.raises(TypeError, match=r"needs connectivity, the \(E, 2\) bonded pairs"):
        bn.nonbonded_references(table)
    with pytest.raises(
        TypeError, match=r"needs connectivity, the \(E, 2\) bonded pairs: this ZMatrix has none"
    ):
        bn.nonbonded_references(bn.ZMatrix(table, *([0.0] * 4,) * 3))
    with pytest.raises(TypeError, match=r"refs must be \(N, 3\) integer references, .* got object"):
        bn.nonbonded_references(object(), conn)
    with pytest.raises(ValueError, match=r"refs must be \(N, 3\) integer references, .* got str"):
        bn.nonbonded_references("abc", conn)


def test_split_atoms_takes_numpy_integers() -> None:
    values = torch.arange(21.0).reshape(7, 3)
    parts = bn.split_atoms(values, [np.int64(3), np.int32(4)])
    assert [tuple(p.shape) for p in parts] == [(3, 3), (4, 3)]
    parts = bn.split_atoms(values, np.array([2, 5]))
    assert [tuple(p.shape) for p in parts] == [(2, 3), (5, 3)]
    mixed = bn.split_atoms(values, [bn.ConstructionTable.chain(3), np.int64(4)])
    torch.testing.assert_close(mixed[1], values[3:])
    with pytest.raises(
        TypeError, match="tables\\[1\\] must be a ConstructionTable or an atom count, got float"
    ):
        bn.split_atoms(values, [3, 4.0])  # type: ignore[list-item]
    with pytest.raises(
        TypeError, match="tables\\[0\\] must be a ConstructionTable or an atom count, got bool"
    ):
        bn.split_atoms(values, [True, 6])
    with pytest.raises(ValueError, match=r"tables\[0\] = -1: an atom count must be >= 0"):
        bn.split_atoms(values, [-1, 8])


@pytest.mark.parametrize("make", [torch.tensor, np.array, lambda v: v], ids=["tensor", "numpy", "list"])
def test_from_cartesian_integer_coordinates_become_float64(make: Callable) -> None:
    xyz = [[0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
    z = bn.ZMatrix.from_cartesian(make(xyz), bn.ConstructionTable.chain(4))
    assert z.dtype == F64
    torch.testing.assert_close(z.bonds, torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=F64))
    torch.testing.assert_close(z.to_cartesian(), torch.tensor(xyz, dtype=F64))
    with pytest.raises(TypeError, match="xyz must hold real coordinates, got dtype torch.bool"):
        bn.ZMatrix.from_cartesian(torch.ones(4, 3, dtype=torch.bool), bn.ConstructionTable.chain(4))


# ----------------------------------------------------------------- dtypes never cast down
def _anchored() -> bn.ConstructionTable:
    return bn.ConstructionTable([[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2]], fixed=[0, 1, 2])


def test_fixed_xyz_of_higher_precision_raises_naming_both_dtypes() -> None:
    table = _anchored()
    ic = torch.ones(4), torch.full((4,), 2.0), torch.ones(4)
    with pytest.raises(
        TypeError, match=r"fixed_xyz has dtype torch.float64 but the internal coordinates are torch.float32"
    ):
        bn.to_cartesian(*ic, table, fixed_xyz=torch.eye(3, dtype=F64))
    with pytest.raises(TypeError, match=r"fixed_xyz has dtype torch.float64 .* torch.float16"):
        bn.ZMatrix(table, *(t.half() for t in ic), fixed_xyz=torch.eye(3, dtype=F64))
    # promotion upwards, array-likes and integer tensors take the internal coordinates' dtype
    for fixed in (torch.eye(3, dtype=torch.float16), torch.eye(3).tolist(), np.eye(3), torch.eye(3).long()):
        out = bn.to_cartesian(*(t.double() for t in ic), table, fixed_xyz=fixed)
        assert out.dtype == F64
        torch.testing.assert_close(out[:3], torch.eye(3, dtype=F64))
    with pytest.raises(TypeError, match="fixed_xyz must be a real floating tensor, got dtype torch.bool"):
        bn.to_cartesian(*ic, table, fixed_xyz=torch.ones(3, 3, dtype=torch.bool))


def test_pose_of_higher_precision_raises_naming_both_dtypes() -> None:
    table = bn.ConstructionTable.chain(4)
    xyz = bn.to_cartesian(torch.ones(4), torch.full((4,), 2.0), torch.ones(4), table)
    with pytest.raises(
        TypeError, match=r"rotation has dtype torch.float64 but the coordinates are torch.float32"
    ):
        bn.apply_pose(xyz, table, rotation=torch.eye(3, dtype=F64))
    with pytest.raises(TypeError, match=r"translation has dtype torch.float64 but the coordinates are"):
        bn.apply_pose(xyz, table, translation=torch.zeros(3, dtype=F64))
    with pytest.raises(TypeError, match=r"rotation has dtype torch.float64"):
        bn.to_cartesian(
            torch.ones(4), torch.full((4,), 2.0), torch.ones(4), table, rotation=torch.eye(3, dtype=F64)
        )
    # lower precision, lists and integers are promoted
    out = bn.apply_pose(xyz.double(), table, rotation=torch.eye(3), translation=[0, 0, 1])
    assert out.dtype == F64
    torch.testing.assert_close(out, xyz.double() + torch.tensor([0.0, 0.0, 1.0], dtype=F64))


def test_improper_rotation_gives_nan_for_its_component_only() -> None:
    a = bn.ConstructionTable.chain(4)
    table = bn.pack_tables([a, a])  # two seeded components: one pose each
    ic = torch.ones(8, dtype=F64), torch.full((8,), 2.0, dtype=F64), torch.ones(8, dtype=F64)
    xyz = bn.to_cartesian(*ic, table)
    mirror = torch.diag(torch.tensor([1.0, 1.0, -1.0], dtype=F64))
    rot = torch.stack([torch.eye(3, dtype=F64), mirror])
    out = bn.apply_pose(xyz, table, rotation=rot)
    assert torch.isnan(out[4:]).all() and torch.equal(out[:4], xyz[:4])
    # batched, under vmap and through to_cartesian: never a mirror image
    batch = torch.stack([rot, rot.flip(0)])
    vm = torch.func.vmap(lambda r: bn.apply_pose(xyz, table, rotation=r))(batch)
    assert torch.isnan(vm[0, 4:]).all() and torch.isnan(vm[1, :4]).all()
    assert torch.isfinite(vm[0, :4]).all() and torch.isfinite(vm[1, 4:]).all()
    single = bn.to_cartesian(*(t[:4] for t in ic), a, rotation=-torch.eye(3, dtype=F64))
    assert torch.isnan(single).all()
    # a proper rotation passes, with gradients
    r = bn.rotation_from_angles(torch.tensor([0.3, 0.2, -1.0], dtype=F64)).requires_grad_(True)
    moved = bn.apply_pose(xyz[:4], a, rotation=r)
    assert torch.isfinite(moved).all()
    (g,) = torch.autograd.grad(moved.sum(), r)
    assert torch.isfinite(g).all()


# ------------------------------------------------------------- caches under inference mode
def _ic(n: int, batch: int = 2, grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    b = (1.0 + 0.3 * torch.rand(batch, n, dtype=F64, generator=gen)).requires_grad_(grad)
    a = 1.6 + 0.8 * torch.rand(batch, n, dtype=F64, generator=gen)
    d = 6.0 * torch.rand(batch, n, dtype=F64, generator=gen) - 3.0
    return b, a, d


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _tensors(getattr(obj, f.name))]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    return []


def test_table_cached_values_are_made_outside_inference_mode() -> None:
    table = bn.ConstructionTable.chain(5)
    with torch.inference_mode():
        value = table.cached("test-index", lambda topo: torch.arange(topo.n_atoms))
        assert table.cached("test-index", lambda topo: None) is value
    assert not value.is_inference()
    w = torch.ones(5, requires_grad=True)
    w.index_select(0, value).sum().backward()  # saves the index for backward
    assert w.grad is not None


def test_plans_and_device_copies_made_under_inference_mode_are_normal_tensors() -> None:
    with torch.inference_mode():
        table = bn.ConstructionTable.chain(6)  # CPU plans are built in __init__
        copies = [table.plan(kind, "meta") for kind in ("levels", "scan", "inverse")]
    cpu = [table.plan(kind) for kind in ("levels", "scan", "inverse")]
    for plan in copies + cpu:
        ts = _tensors(plan)
        assert ts and not any(t.is_inference() for t in ts)
    assert all(t.device.type == "meta" for plan in copies for t in _tensors(plan))


def test_lazy_level_plan_of_a_deep_table_made_under_inference_mode() -> None:
    n = 264  # plans are made on first use
    table = bn.ConstructionTable.chain(n)
    with torch.inference_mode():
        bn.to_cartesian(*_ic(n, 1), table, method="levels")  # builds the level plan now
    b, a, d = _ic(n, 1, grad=True)
    bn.to_cartesian(b, a, d, table, method="levels").square().sum().backward()
    assert b.grad is not None and torch.isfinite(b.grad).all()


def test_flow_layer_built_under_inference_mode_trains() -> None:
    with torch.inference_mode():
        flow = bn.InternalCoordinateTransform(bn.ConstructionTable.chain(5), pose=True)
    assert not any(buf.is_inference() for buf in flow.buffers())
    xyz = bn.to_cartesian(*_ic(5), flow.table).requires_grad_(True)
    z = flow(xyz)
    (z.log_det.sum() + z.dihedrals.sum()).backward()
    back, ld = flow.inverse(*(t.detach().requires_grad_(True) for t in (z.bonds, z.angles, z.dihedrals)),
                            z.rotation.detach(), z.translation.detach())  # fmt: skip
    (back.sum() + ld.sum()).backward()
    assert xyz.grad is not None and torch.isfinite(xyz.grad).all()


def _xyz(table: bn.ConstructionTable) -> torch.Tensor:
    return bn.to_cartesian(*_ic(table.n_atoms), table)


class _Q(torch.nn.Module):
    def __init__(self, table: bn.ConstructionTable) -> None:
        super().__init__()
        self.table = table
        self.lin = torch.nn.Linear(2 * table.n_atoms, 1).to(F64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ic = bn.to_internal(x, self.table)
        return torch.sigmoid(self.lin(torch.cat([ic.bonds, torch.cos(ic.dihedrals)], -1))).squeeze(-1)


def _entry_points(method: str) -> dict[str, Callable[[bn.ConstructionTable, torch.Tensor], torch.Tensor]]:
    """Each public entry point as ``(table, xyz) -> scalar``; ``xyz`` requires grad outside inference mode."""

    def flow(table: bn.ConstructionTable, x: torch.Tensor) -> torch.Tensor:
        layer = bn.InternalCoordinateTransform(table, pose=True, method=method)
        z = layer(x)
        back, ld = layer.inverse(z.bonds, z.angles, z.dihedrals, z.rotation, z.translation)
        return z.log_det.sum() + back.sum() + ld.sum()

    def committor(table: bn.ConstructionTable, x: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(0)
        q = _Q(table)(x)  # a validation pass evaluates q only
        if torch.is_inference_mode_enabled():
            return q.sum()
        return committor_loss(q, x, in_a=torch.tensor([True, False]))

    def pose(table: bn.ConstructionTable, x: torch.Tensor) -> torch.Tensor:
        ic, p = bn.to_internal(x, table, return_pose=True)
        rebuilt = bn.to_cartesian(*ic, table, rotation=p.rotation, translation=p.translation, method=method)
        moved = bn.apply_pose(rebuilt, table, rotation=p.rotation, translation=p.translation)
        return rebuilt.sum() + moved.sum() + bn.extract_pose(x, table).rotation.sum()

    return {
        "to_cartesian": lambda t, x: bn.to_cartesian(*bn.to_internal(x, t), t, method=method).sum(),
        "to_internal": lambda t, x: bn.to_internal(x, t).dihedrals.sum(),
        "log_det_jacobian": lambda t, x: bn.log_det_jacobian(*bn.to_internal(x, t), t, pose=True).sum(),
        "pose_log_det": lambda t, x: bn.pose_log_det(*bn.to_internal(x, t), t).sum(),
        "InternalCoordinateTransform": flow,
        "clash_loss": lambda t, x: clash_loss(x, t, min_distance=3.0).sum()
        + clash_loss(x, t, min_distance=3.0, reduction="none").sum(),
        "committor_loss": committor,
        "apply_pose/return_pose": pose,
    }


@pytest.mark.parametrize("entry", list(_entry_points("auto")))
def test_every_entry_point_trains_after_a_first_call_under_inference_mode(entry: str, method: str) -> None:
    """A validation pass under inference_mode on a fresh table, then a training step: backward works."""
    f = _entry_points(method)[entry]
    with torch.inference_mode():
        table = bn.ConstructionTable.chain(7)  # a fresh table, made in the validation pass
        value = f(table, _xyz(table))
    assert torch.isfinite(value)
    x = _xyz(table).requires_grad_(True)
    loss = f(table, x)
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_inference_mode_on_a_table_made_outside_it() -> None:
    """Caches first filled under inference_mode on an old table: pose layout, log-det masks, clash lists."""
    table = bn.ConstructionTable.chain(6)
    with torch.inference_mode():
        x = _xyz(table)
        bn.log_det_jacobian(*bn.to_internal(x, table), table, pose=True)
        bn.apply_pose(x, table, rotation=torch.eye(3, dtype=F64))
        clash_loss(x, table, min_distance=3.0, exclude_14=True)
    x = _xyz(table).requires_grad_(True)
    loss = (
        bn.log_det_jacobian(*bn.to_internal(x, table), table, pose=True).sum()
        + bn.apply_pose(x, table, rotation=torch.eye(3, dtype=F64)).sum()
        + clash_loss(x, table, min_distance=3.0, exclude_14=True).sum()
    )
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert math.isfinite(float(loss.detach()))


def test_clash_loss_protein_table_excludes_ring_bonds() -> None:
    """A protein table brings its ring bonds: Pro, Phe, Tyr, His and Trp ring pairs are not scored."""
    seq = "GPFYHWG"
    pt = bn.protein.protein_table(seq)
    n = len(seq)
    xyz = bn.protein.build(seq, torch.full((n,), -1.2), torch.full((n,), 2.2)).xyz
    with_rings = bn.losses.clash_pairs(pt).tolist()
    without = bn.losses.clash_pairs(pt.table).tolist()
    closures = [[pt.atom(1, "N"), pt.atom(1, "CD")], sorted([pt.atom(2, "CZ"), pt.atom(2, "CE2")])]
    for pair in closures:
        assert sorted(pair) not in with_rings
    assert len(without) > len(with_rings)
    # intra-ring distances (1.3-2.5 A) are not scored: the clash loss at 2.6 A drops
    loss = bn.losses.clash_loss(xyz, pt, min_distance=2.6)
    assert loss < bn.losses.clash_loss(xyz, pt.table, min_distance=2.6)
