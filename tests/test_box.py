"""Periodic boxes: to_internal(box=...), minimum_image, unwrap, wrap, check_box, box_vectors.

The oracle of the synthetic tests: molecules built whole (float64), every atom moved by random
whole box vectors; ``to_internal(wrapped, box=box)`` must give the internal coordinates of the
whole frames. The real-data tests compare with MDAnalysis (its ``make_whole``, ``wrap``,
``triclinic_vectors``, ``minimize_vectors``) on MDAnalysisTests' wrapped GROMACS AdK system and the
triclinic TIP125 water box.
"""

from __future__ import annotations

import importlib.util
import itertools
import math

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch.func import jacrev, vmap

import batched_nerf as bn

F64 = torch.float64
INVERSE_METHODS = ["torch", "auto", *(["fused"] if importlib.util.find_spec("numba") else [])]
BOXES = {
    "orthorhombic": [20.0, 22.0, 25.0, 90.0, 90.0, 90.0],
    "dodecahedron": [20.0, 20.0, 20.0, 60.0, 60.0, 90.0],  # GROMACS rhombic dodecahedron (xy-square)
    "skewed": [19.0, 21.0, 20.0, 70.0, 80.0, 50.0],
}
BRANCHED = bn.ConstructionTable([[4, -1, -1], [4, 0, 2], [0, 4, -1], [4, 0, 1], [-1, -1, -1], [2, 0, 4]])
#: one component anchored by three fixed atoms: three bond-reference trees joined by angle references
FIXED = bn.ConstructionTable(
    [[-1, -1, -1], [3, 0, 5], [1, 3, 0], [-1, -1, -1], [2, 1, 3], [-1, -1, -1]], fixed=[3, 0, 5]
)


def _ala(batch: int, seed: int = 0) -> tuple[bn.ConstructionTable, torch.Tensor]:
    """Alanine dipeptide frames (float64), whole, randomly rotated and placed in a 30-A cube."""
    g = torch.Generator().manual_seed(seed)
    mol = bn.data.load("alanine_dipeptide")
    n = mol.n_atoms
    b = mol.bonds.to(F64) * (1 + 0.02 * torch.randn(batch, n, generator=g, dtype=F64))
    a = mol.angles.to(F64) + 0.05 * torch.randn(batch, n, generator=g, dtype=F64)
    d = mol.dihedrals.to(F64) + 0.3 * torch.randn(batch, n, generator=g, dtype=F64)
    q = torch.linalg.qr(torch.randn(batch, 3, 3, generator=g, dtype=F64))[0]
    q = q * torch.linalg.det(q)[:, None, None]
    t = 30 * torch.rand(batch, 3, generator=g, dtype=F64)
    return mol.table, bn.to_cartesian(b, a, d, mol.table, rotation=q, translation=t)


def _scatter(xyz: torch.Tensor, h: torch.Tensor, seed: int = 1, reach: int = 2) -> torch.Tensor:
    """Every atom moved by its own random whole box vectors ``n H``, ``n`` in ``[-reach, reach]^3``."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(-reach, reach + 1, xyz.shape, generator=g).to(xyz.dtype)
    return xyz + n @ h


def _close_ic(got: bn.InternalCoordinates, want: bn.InternalCoordinates, atol: float) -> None:
    torch.testing.assert_close(got.bonds, want.bonds, rtol=0, atol=atol)
    torch.testing.assert_close(got.angles, want.angles, rtol=0, atol=atol)
    turn = torch.remainder(got.dihedrals - want.dihedrals + math.pi, 2 * math.pi) - math.pi
    torch.testing.assert_close(turn, torch.zeros_like(turn), rtol=0, atol=atol)


# ----------------------------------------------------------------------------- synthetic frames
@pytest.mark.parametrize("method", INVERSE_METHODS)
@pytest.mark.parametrize("fmt", ["lengths_angles", "matrix"])
@pytest.mark.parametrize("per_frame", [False, True], ids=["shared", "per_frame"])
@pytest.mark.parametrize("kind", list(BOXES))
def test_wrapped_frames_give_the_internal_coordinates_of_whole_ones(
    kind: str, per_frame: bool, fmt: str, method: str
) -> None:
    table, xyz = _ala(6)
    box = torch.tensor(BOXES[kind], dtype=F64)
    if per_frame:  # a different box in every frame
        scale = torch.linspace(0.9, 1.4, 6, dtype=F64)[:, None]
        box = torch.cat([box[:3] * scale, box[3:].expand(6, 3)], -1)
    h = bn.box_vectors(box)
    wrapped = _scatter(bn.wrap(xyz, box), h)
    assert bn.to_internal(wrapped, table).bonds.max() > 5  # the wrapped frames are broken
    arg = box if fmt == "lengths_angles" else h
    got = bn.to_internal(wrapped, table, box=arg, method=method)
    _close_ic(got, bn.to_internal(xyz, table, method="torch"), 1e-10)
    bn.check_box(wrapped, table, arg)


def test_general_box_matrix_not_lower_triangular() -> None:
    """A rotated lattice (rows of H not in MDAnalysis's reduced form) and rotated coordinates."""
    table, xyz = _ala(4)
    q = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(3), dtype=F64))[0]
    h = bn.box_vectors(torch.tensor(BOXES["skewed"], dtype=F64)) @ q
    assert (h.triu(1).abs() > 1).any()
    wrapped = _scatter(xyz @ q, h)
    _close_ic(bn.to_internal(wrapped, table, box=h), bn.to_internal(xyz, table), 1e-10)


def test_degrees_and_return_pose_with_a_box() -> None:
    table, xyz = _ala(3)
    box = torch.tensor(BOXES["dodecahedron"], dtype=F64)
    wrapped = _scatter(xyz, bn.box_vectors(box))
    ic, pose = bn.to_internal(wrapped, table, box=box, degrees=True, return_pose=True)
    _close_ic(ic, bn.to_internal(xyz, table, degrees=True), 1e-9)
    rebuilt = bn.to_cartesian(*ic, table, degrees=True, rotation=pose.rotation, translation=pose.translation)
    torch.testing.assert_close(rebuilt, bn.unwrap(wrapped, table, box), rtol=0, atol=1e-9)


def test_unwrap_makes_a_long_chain_whole_across_many_boxes() -> None:
    """A 300-atom chain (9 pointer jumps) spanning ~10 small boxes comes back whole, exactly."""
    n = 300
    table = bn.ConstructionTable.chain(n)
    g = torch.Generator().manual_seed(5)
    ic = (
        torch.full((n,), 1.5, dtype=F64),
        torch.full((n,), 2.0, dtype=F64),
        0.2 + 0.1 * torch.rand(n, generator=g, dtype=F64),
    )
    xyz = bn.to_cartesian(*ic, table)
    box = torch.tensor([9.0, 10.0, 11.0, 80.0, 100.0, 70.0], dtype=F64)
    h = bn.box_vectors(box)
    wrapped = bn.wrap(xyz, box)
    assert (xyz.max(0).values - xyz.min(0).values).max() > 50
    assert len(table.cached(bn.core.box._tree, bn.core.box._tree).jumps) == math.ceil(math.log2(n - 1))
    whole = bn.unwrap(wrapped, table, box)
    shift = (whole - xyz) @ torch.linalg.inv(h)  # one lattice vector for the whole chain
    torch.testing.assert_close(shift, shift[:1].round().expand_as(shift), rtol=0, atol=1e-10)
    _close_ic(bn.to_internal(wrapped, table, box=box), bn.to_internal(xyz, table), 1e-10)


def test_anchored_component_with_several_fixed_atoms() -> None:
    """Fixed atoms in different images are joined through the angle references between their trees."""
    g = torch.Generator().manual_seed(2)
    xyz = torch.tensor(
        [[0.0, 0, 0], [1.4, 0.9, 0.1], [2.5, 1.6, -0.5], [1.5, -0.3, 0.2], [3.1, 2.8, 0.3], [-0.8, 1.2, 0.4]],
        dtype=F64,
    ) + 3 * torch.rand(4, 1, 3, generator=g, dtype=F64)
    box = torch.tensor(BOXES["skewed"], dtype=F64)
    h = bn.box_vectors(box)
    wrapped = _scatter(xyz, h, reach=3)
    _close_ic(bn.to_internal(wrapped, FIXED, box=box), bn.to_internal(xyz, FIXED), 1e-10)
    whole = bn.unwrap(wrapped, FIXED, box)
    shift = (whole - xyz) @ torch.linalg.inv(h)
    torch.testing.assert_close(shift, shift[:, :1].round().expand_as(shift), rtol=0, atol=1e-10)
    torch.testing.assert_close(whole[:, 0], wrapped[:, 0], rtol=0, atol=0)  # the first fixed atom stays


def test_box_leading_dimensions_broadcast_against_xyz() -> None:
    table, xyz = _ala(3)
    box = torch.tensor(BOXES["dodecahedron"], dtype=F64)
    boxes = torch.stack([box, torch.cat([box[:3] * 1.2, box[3:]])])  # (2, 6)
    want = bn.to_internal(xyz, table)
    # one frame, several boxes: the boxes' batch (a whole molecule is whole in any large box)
    one = bn.to_internal(xyz[0], table, box=boxes)
    assert one.bonds.shape == (2, table.n_atoms)
    _close_ic(one, bn.InternalCoordinates(*(t[0].expand(2, -1) for t in want)), 1e-10)
    # boxes (2, 1) against frames (3,): (2, 3)
    both = bn.to_internal(xyz, table, box=boxes[:, None].expand(2, 1, 6).clone())
    assert both.bonds.shape == (2, 3, table.n_atoms)
    _close_ic(both, bn.InternalCoordinates(*(t.expand(2, -1, -1) for t in want)), 1e-10)


def test_impossible_box_gives_nan_for_its_frame_only() -> None:
    table, xyz = _ala(3)
    box = torch.tensor([BOXES["orthorhombic"], [0.0, 0.0, 0.0, 90.0, 90.0, 90.0], [20, 20, 20, 10, 10, 100]])
    h = bn.box_vectors(box.to(F64))
    assert torch.isfinite(h[0]).all() and h[1:].isnan().all()
    used = table.refs[:, 0] >= 0  # the seed's entry is 0 whatever the coordinates
    ic = bn.to_internal(xyz, table, box=box.to(F64))
    assert torch.isfinite(ic.bonds[0]).all() and ic.bonds[1:, used].isnan().all()
    singular = torch.eye(3, dtype=F64).expand(3, 3, 3).clone()
    singular[1, 2] = singular[1, 1]
    ic = bn.to_internal(xyz, table, box=10 * singular)
    assert torch.isfinite(ic.bonds[[0, 2]]).all() and ic.bonds[1, used].isnan().all()


def test_float32_frames() -> None:
    table, xyz = _ala(4)
    box = torch.tensor(BOXES["dodecahedron"])
    wrapped = _scatter(bn.wrap(xyz, box.to(F64)), bn.box_vectors(box.to(F64))).float()
    got = bn.to_internal(wrapped, table, box=box)
    assert got.bonds.dtype == torch.float32
    _close_ic(got, bn.to_internal(xyz.float(), table), 1e-4)


# ------------------------------------------------------------------------------- derivatives
def _small_frames() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    xyz = bn.to_cartesian(
        1.0 + 0.5 * torch.rand(2, 6, generator=g, dtype=F64),
        0.8 + 1.5 * torch.rand(2, 6, generator=g, dtype=F64),
        math.pi * (2 * torch.rand(2, 6, generator=g, dtype=F64) - 1),
        BRANCHED,
        translation=torch.tensor([[4.0, 5.0, 6.0], [-3.0, 2.0, 9.0]], dtype=F64),
    )
    box = torch.tensor(BOXES["skewed"], dtype=F64) / 3  # ~6.5 A: every atom wraps somewhere
    return bn.wrap(xyz, box), box


@pytest.mark.parametrize("method", INVERSE_METHODS)
@pytest.mark.parametrize("fmt", ["lengths_angles", "matrix"])
def test_gradcheck_and_gradgradcheck_in_xyz_and_box(method: str, fmt: str) -> None:
    wrapped, box = _small_frames()
    arg = (box if fmt == "lengths_angles" else bn.box_vectors(box)).clone().requires_grad_(True)
    x = wrapped.clone().requires_grad_(True)

    def fn(x: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ic = bn.to_internal(x, BRANCHED, box=b, method=method)
        return ic.bonds, ic.angles, torch.cos(ic.dihedrals), torch.sin(ic.dihedrals)

    assert gradcheck(fn, (x, arg))
    assert gradgradcheck(fn, (x, arg))


def test_box_gradient_equals_known_image_shifts() -> None:
    """d/dbox of to_internal(wrapped, box) is that of to_internal(wrapped + N H(box)) with the true N."""
    table, xyz = _ala(3)
    box = torch.tensor(BOXES["skewed"], dtype=F64)
    g = torch.Generator().manual_seed(4)
    n = torch.randint(-2, 3, xyz.shape, generator=g).to(F64)
    wrapped = xyz + n @ bn.box_vectors(box)
    b1 = box.clone().requires_grad_(True)
    b2 = box.clone().requires_grad_(True)
    w = torch.randn(3, table.n_atoms, generator=g, dtype=F64)
    (bn.to_internal(wrapped, table, box=b1).bonds * w).sum().backward()
    (bn.to_internal(wrapped - n @ bn.box_vectors(b2), table).bonds * w).sum().backward()
    assert b1.grad.abs().max() > 1e-3
    torch.testing.assert_close(b1.grad, b2.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", INVERSE_METHODS)
def test_vmap_and_jacrev_with_per_frame_boxes(method: str) -> None:
    wrapped, box = _small_frames()
    boxes = torch.stack([box, box * torch.tensor([1.1, 1.2, 0.9, 1, 1, 1], dtype=F64)])
    plain = bn.to_internal(wrapped, BRANCHED, box=boxes, method=method)
    mapped = vmap(lambda x, b: bn.to_internal(x, BRANCHED, box=b, method=method))(wrapped, boxes)
    for p, m in zip(plain, mapped):
        torch.testing.assert_close(m, p, rtol=0, atol=1e-12)

    def bonds(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return bn.to_internal(x, BRANCHED, box=b, method=method).bonds

    jx, jb = vmap(jacrev(bonds, argnums=(0, 1)))(wrapped, boxes)
    for k in range(2):
        x = wrapped[k].clone().requires_grad_(True)
        b = boxes[k].clone().requires_grad_(True)
        ax, ab = torch.autograd.functional.jacobian(bonds, (x, b))
        torch.testing.assert_close(jx[k], ax, rtol=0, atol=1e-12)
        torch.testing.assert_close(jb[k], ab, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- minimum image
def _shortest_by_brute_force(v: torch.Tensor, h: torch.Tensor, reach: int = 3) -> torch.Tensor:
    r = range(-reach, reach + 1)
    offsets = torch.tensor(list(itertools.product(r, r, r)), dtype=F64)
    images = v[:, None, :] + (offsets @ h)[None]
    return images[torch.arange(len(v)), images.norm(dim=-1).argmin(1)]


@pytest.mark.parametrize("kind", list(BOXES))
def test_minimum_image_is_exact_below_half_the_smallest_width(kind: str) -> None:
    h = bn.box_vectors(torch.tensor(BOXES[kind], dtype=F64))
    half = float(bn.core.box._widths(h).min()) / 2
    g = torch.Generator().manual_seed(8)
    direction = torch.nn.functional.normalize(torch.randn(2000, 3, generator=g, dtype=F64), dim=-1)
    v = direction * (0.999 * half * torch.rand(2000, 1, generator=g, dtype=F64))
    n = torch.randint(-4, 5, v.shape, generator=g).to(F64)
    torch.testing.assert_close(bn.minimum_image(v + n @ h, h), v, rtol=0, atol=1e-11)


@pytest.mark.parametrize("kind", ["orthorhombic", "dodecahedron"])
def test_minimum_image_is_the_shortest_image_in_reduced_boxes(kind: str) -> None:
    h = bn.box_vectors(torch.tensor(BOXES[kind], dtype=F64))
    v = 60 * torch.rand(3000, 3, generator=torch.Generator().manual_seed(9), dtype=F64) - 30
    got = bn.minimum_image(v, h)
    torch.testing.assert_close(
        got.norm(dim=-1), _shortest_by_brute_force(v, h).norm(dim=-1), rtol=0, atol=1e-12
    )
    shift = (got - v) @ torch.linalg.inv(h)
    torch.testing.assert_close(shift, shift.round(), rtol=0, atol=1e-10)


def test_box_vectors_exact_right_angles_and_gradient() -> None:
    h = bn.box_vectors(torch.tensor([10.0, 11.0, 12.0, 90.0, 90.0, 90.0], dtype=F64))
    assert torch.equal(h, torch.diag(torch.tensor([10.0, 11.0, 12.0], dtype=F64)))
    box = torch.tensor([10.0, 11.0, 12.0, 90.0, 75.0, 90.0], dtype=F64, requires_grad=True)
    assert gradcheck(bn.box_vectors, (box,))
    h = bn.box_vectors(box)
    a, b, c = h.detach()  # the lengths and angles come back
    assert torch.allclose(torch.stack([a.norm(), b.norm(), c.norm()]), box[:3].detach())
    beta = torch.rad2deg(torch.arccos(a @ c / (a.norm() * c.norm())))
    assert abs(float(beta) - 75.0) < 1e-12


# ---------------------------------------------------------------------------------- wrapping
def test_wrap_per_atom_lands_in_the_box() -> None:
    table, xyz = _ala(4)
    box = torch.tensor(BOXES["skewed"], dtype=F64)
    h = bn.box_vectors(box)
    out = bn.wrap(_scatter(xyz, h, reach=4), box)
    s = out @ torch.linalg.inv(h)
    assert (s >= 0).all() and (s < 1).all()
    shift = (out - xyz) @ torch.linalg.inv(h)
    torch.testing.assert_close(shift, shift.round(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("center", ["first", "centroid"])
def test_wrap_whole_molecules(center: str) -> None:
    tables, frames = zip(*(_ala(3, seed=k) for k in range(2)))
    table = bn.pack_tables(list(tables))
    xyz = torch.cat(frames, -2) + torch.tensor([0.0, 0.0, 40.0], dtype=F64)  # both molecules outside
    box = torch.tensor(BOXES["dodecahedron"], dtype=F64)
    h = bn.box_vectors(box)
    out = bn.wrap(xyz, box, table, center=center)
    n = 22
    for part in (slice(0, n), slice(n, 2 * n)):
        moved = out[:, part] - xyz[:, part]
        torch.testing.assert_close(moved, moved[:, :1].expand_as(moved), rtol=0, atol=1e-12)  # rigid
        ref = out[:, part][:, 0] if center == "first" else out[:, part].mean(1)
        s = ref @ torch.linalg.inv(h)
        assert (s >= -1e-12).all() and (s < 1).all()
    _close_ic(bn.to_internal(out, table), bn.to_internal(xyz, table), 1e-10)


def test_wrap_is_differentiable_and_vmap_safe() -> None:
    wrapped, box = _small_frames()
    x = (wrapped + 7.0).requires_grad_(True)
    b = box.clone().requires_grad_(True)
    assert gradcheck(lambda x, b: bn.wrap(x, b, BRANCHED, center="centroid"), (x, b))
    assert gradcheck(lambda x, b: bn.wrap(x, b), (x, b))
    mapped = vmap(lambda x: bn.wrap(x, box, BRANCHED, center="centroid"))(x.detach())
    torch.testing.assert_close(mapped, bn.wrap(x.detach(), box, BRANCHED, center="centroid"), rtol=0, atol=0)


# ------------------------------------------------------------------------------------ check_box
def test_check_box_names_a_tree_edge_without_a_short_image() -> None:
    xyz = torch.tensor([[0.0, 0, 0], [1.5, 0, 0], [1.5, 1.5, 0], [4.0, 4.0, 0]], dtype=F64)
    table = bn.ConstructionTable.chain(4)
    bn.check_box(xyz, table, [10.0, 10.0, 10.0, 90.0, 90.0, 90.0])
    frames = torch.stack([xyz, xyz, xyz])
    frames[0, 3] = torch.tensor([3.0, 1.5, 0.0], dtype=F64)
    with pytest.raises(
        ValueError,
        match=r"row 3: reference vector x_3 - x_2 \(atoms 3, 2\) is 3.53553 long in frame \(1,\), "
        r"not shorter than 2.5, half the smallest perpendicular box width; it cannot be told from its "
        r"periodic images \(1 row in all: \[3\]\); use a larger box",
    ):
        bn.check_box(frames, table, [5.0, 5.0, 5.0, 90.0, 90.0, 90.0])


def test_check_box_names_a_long_reference_off_the_tree() -> None:
    """Row 3's dihedral reference vector x_a - x_d = x_1 - x_2 joins two branches: not a tree edge."""
    table = bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1], [0, 1, 2], [2, 0, 1]])
    xyz = torch.tensor([[0.0, 0, 0], [-2.9, 0, 0], [2.9, 0.1, 0], [0.3, 0.3, 1.0], [3.9, 1.0, 0]], dtype=F64)
    box = torch.tensor([10.0, 10.0, 10.0, 90.0, 90.0, 90.0], dtype=F64)
    with pytest.raises(
        ValueError,
        match=r"row 3: reference vector x_1 - x_2 \(atoms 1, 2\) is 5.80086 long, not shorter than 5,",
    ) as err:
        bn.check_box(xyz, table, box)
    assert "(1 row in all: [3])" in str(err.value)
    bn.check_box(xyz, table, box * torch.tensor([1.2, 1.2, 1.2, 1, 1, 1], dtype=F64))
    # wrapped atom by atom, the same
    with pytest.raises(ValueError, match=r"row 3: reference vector x_1 - x_2 \(atoms 1, 2\) is 5.80086 long"):
        bn.check_box(bn.wrap(xyz, box), table, box)


def test_check_box_ignores_nan_coordinates() -> None:
    table, xyz = _ala(2)
    xyz[1, 5] = math.nan
    bn.check_box(xyz, table, BOXES["orthorhombic"])


@pytest.mark.parametrize(
    ("box", "message"),
    [
        (
            [0.0, 0.0, 0.0, 90.0, 90.0, 90.0],
            r"box is not a periodic cell: \[0.0, 0.0, 0.0, 90.0, 90.0, 90.0\] ",
        ),
        (
            [[20, 20, 20, 90, 90, 90], [20, 20, 20, 10, 10, 100]],
            r"box of frame \(1,\) is not a periodic cell: .*close",
        ),
        (
            [20.0, 20.0, 20.0, 90.0, 190.0, 90.0],
            r"\[20.0, 20.0, 20.0, 90.0, 190.0, 90.0\] \(.*angles in \(0, 180\) that close a cell\)$",
        ),
        ([[10, 0, 0], [0, 10, 0], [10, 10, 0]], r"box vectors must be finite and linearly independent"),
        ([[10, 0, 0], [0, 10, 0], [0, 0, math.inf]], r"box vectors must be finite and linearly independent"),
    ],
)
def test_check_box_rejects_impossible_boxes(box: list, message: str) -> None:
    table, xyz = _ala(2)
    with pytest.raises(ValueError, match=message):
        bn.check_box(xyz, table, torch.tensor(box, dtype=F64))


# ---------------------------------------------------------------------------- argument errors
def test_box_argument_errors() -> None:
    table, xyz = _ala(2)
    with pytest.raises(
        ValueError, match=r"box must have shape \(\.\.\., 6\) \(\[a, b, c, alpha, beta, gamma\].*got \(3,\)"
    ):
        bn.to_internal(xyz, table, box=[10.0, 10.0, 10.0])
    with pytest.raises(
        ValueError, match=r"box must have shape .*or \(\.\.\., 3, 3\) \(box vectors in rows\), got \(2, 3\)"
    ):
        bn.unwrap(xyz, table, torch.ones(2, 3, dtype=F64))
    with pytest.raises(
        ValueError,
        match=r"box of shape \(3, 6\) \(one box per leading index \(3,\)\) does not broadcast with "
        r"coordinates of shape \(2, 22, 3\) \(frames \(2,\)\)",
    ):
        bn.to_internal(xyz, table, box=torch.ones(3, 6, dtype=F64))
    with pytest.raises(
        TypeError, match=r"box has dtype torch.float64 but xyz torch.float32: casting box down"
    ):
        bn.to_internal(xyz.float(), table, box=torch.tensor(BOXES["orthorhombic"], dtype=F64))
    with pytest.raises(TypeError, match=r"box must be a real floating tensor, got dtype torch.complex128"):
        bn.wrap(xyz, torch.ones(6, dtype=torch.complex128))
    with pytest.raises(ValueError, match=r"box is on device meta but the inputs are on cpu"):
        bn.check_box(xyz, table, torch.ones(6, dtype=F64, device="meta"))
    with pytest.raises(ValueError, match=r"vectors must have shape \(\.\.\., M, 3\), got \(3,\)"):
        bn.minimum_image([1.0, 2.0, 3.0], BOXES["orthorhombic"])
    with pytest.raises(ValueError, match=r"xyz must have shape \(\.\.\., M, 3\), got \(2, 22\)"):
        bn.wrap(xyz[..., 0], BOXES["orthorhombic"])
    with pytest.raises(
        ValueError, match=r"xyz must have shape \(\.\.\., N, 3\) with N = 22, got \(2, 21, 3\)"
    ):
        bn.wrap(xyz[:, 1:], BOXES["orthorhombic"], table)
    with pytest.raises(ValueError, match=r"center must be one of \('atom', 'first', 'centroid'\), got 'com'"):
        bn.wrap(xyz, BOXES["orthorhombic"], table, center="com")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"center='centroid' wraps whole molecules and needs their table"):
        bn.wrap(xyz, BOXES["orthorhombic"], center="centroid")
    with pytest.raises(TypeError, match=r"table must be a ConstructionTable, got list"):
        bn.unwrap(xyz, [[-1, -1, -1]], BOXES["orthorhombic"])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- real data
def _universe(*files: str):
    mda = pytest.importorskip(
        "MDAnalysis", reason="the real-data tests read MDAnalysisTests' files with MDAnalysis"
    )
    data = pytest.importorskip("MDAnalysisTests.datafiles", reason="MDAnalysisTests holds the trajectories")
    return mda.Universe(*(getattr(data, f) for f in files))


def _whole_by_mdanalysis(universe, atoms, frames) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from MDAnalysis.lib.mdamath import make_whole

    wrapped, whole, dims = [], [], []
    for ts in universe.trajectory[frames]:
        wrapped.append(atoms.positions.astype(np.float64))
        dims.append(ts.dimensions.astype(np.float64))
        for fragment in atoms.fragments:
            if fragment.n_atoms > 1:
                make_whole(fragment)
        whole.append(atoms.positions.astype(np.float64))
    return np.array(wrapped), np.array(whole), np.array(dims)


def _compare_with_mdanalysis(table: bn.ConstructionTable, wrapped, whole, dims) -> None:
    xw, xm, box = (torch.from_numpy(a) for a in (wrapped, whole, dims))
    assert bn.to_internal(xw, table).bonds.max() > 70  # wrapped per atom: broken molecules
    ours = bn.to_internal(xw, table, box=box)
    assert ours.bonds.max() < 2.0  # every chemical bond whole
    # MDAnalysis's whole frames are ours moved by whole box vectors (one per fragment) ...
    h = bn.box_vectors(box)
    mine = bn.unwrap(xw, table, box)
    shift = torch.linalg.solve(h.transpose(-1, -2)[:, None], (xm - mine)[..., None])[..., 0]
    assert (shift - shift.round()).abs().max() < 1e-5
    # ... so with MDAnalysis's image shifts (not its float32 positions) the internal coordinates agree
    _close_ic(bn.to_internal(mine + shift.round() @ h, table), ours, 1e-6)
    # and with them, to float32 rounding of positions up to 130 A (7.6e-6 A; measured: 1.5e-5 rad)
    _close_ic(ours, bn.to_internal(xm, table), 1e-4)
    bn.check_box(xw, table, box)


def test_gromacs_adk_protein_in_a_wrapped_dodecahedron() -> None:
    """MDAnalysisTests' TPR/TRR: AdK (OPLS-AA) in a rhombic dodecahedron, wrapped atom by atom."""
    u = _universe("TPR", "TRR")
    protein = u.atoms.fragments[0]
    n = protein.n_atoms
    assert n == 3341 and protein.indices.max() == n - 1 and u.dimensions[3] == 60.0
    pairs = u.bonds.indices
    table = bn.ConstructionTable.from_connectivity(pairs[(pairs < n).all(1)], n)
    _compare_with_mdanalysis(table, *_whole_by_mdanalysis(u, protein, slice(0, 10, 3)))


@pytest.mark.slow
def test_gromacs_adk_whole_system() -> None:
    """All 47,681 atoms (protein, 14,780 waters, ions; one seed triple per molecule), all 10 frames."""
    u = _universe("TPR", "TRR")
    table = bn.ConstructionTable.from_connectivity(u.bonds.indices, u.atoms.n_atoms, link_fragments=False)
    assert table.n_components == len(u.atoms.fragments) == 22173
    _compare_with_mdanalysis(table, *_whole_by_mdanalysis(u, u.atoms, slice(None)))


@pytest.mark.filterwarnings("ignore:DCDReader currently makes independent timesteps:DeprecationWarning")
def test_triclinic_water_box_wrapped_by_mdanalysis() -> None:
    """TIP125 in a strongly skewed cell (angles 91, 62, 44 degrees): MDAnalysis wraps it atom by atom."""
    u = _universe("PSF_TRICLINIC", "DCD_TRICLINIC")
    from MDAnalysis.lib.distances import minimize_vectors
    from MDAnalysis.lib.mdamath import triclinic_vectors

    table = bn.ConstructionTable.from_connectivity(u.bonds.indices, u.atoms.n_atoms, link_fragments=False)
    whole, wrapped, dims = [], [], []
    for ts in u.trajectory[:4]:
        whole.append(u.atoms.positions.astype(np.float64))
        dims.append(ts.dimensions.astype(np.float64))
        wrapped.append(u.atoms.wrap(compound="atoms").astype(np.float64))
    xm, xw, box = (torch.from_numpy(np.array(a)) for a in (whole, wrapped, dims))
    assert bn.to_internal(xw, table).bonds.max() > 10
    _close_ic(bn.to_internal(xw, table, box=box), bn.to_internal(xm, table), 1e-5)
    bn.check_box(xw, table, box)
    # the box matrices are MDAnalysis's, and so are the minimum images of vectors below the bound
    # (beyond it MDAnalysis can miss the shortest image here: docs/repro/repro_mdanalysis_minimize_vectors.py)
    for k, d in enumerate(dims):
        h = bn.box_vectors(torch.from_numpy(d))
        torch.testing.assert_close(
            h, torch.from_numpy(triclinic_vectors(d, dtype=np.float64)), rtol=0, atol=1e-12
        )
        v = (xw[k, 1:] - xw[k, :-1]).numpy()
        ours = bn.minimum_image(torch.from_numpy(v), h)
        below = ours.norm(dim=-1) < float(bn.core.box._widths(h).min()) / 2
        assert below.sum() > 100
        want = torch.from_numpy(minimize_vectors(v, d))
        torch.testing.assert_close(ours[below], want[below], rtol=0, atol=2e-5)  # float32 inside
