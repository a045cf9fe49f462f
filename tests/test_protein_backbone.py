"""Backbones from per-residue angles (batched_nerf.protein.build_backbone / backbone_internal).

Oracles: a float64 per-residue NeRF loop written here from the documented conventions;
``bn.protein.build`` (the same Engh & Huber backbone, made by the residue templates);
FoldingDiff's own ``nerf_build_batch`` from a checkout (optional: ``FOLDINGDIFF_PATH``);
a real structure (MDAnalysisTests' adenylate kinase, optional).
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf.protein import FOLDINGDIFF_FIRST, backbone_internal, build_backbone


def _place(a, b, c, bond, angle, torsion):
    """The atom d with |d-c| = bond, angle(b, c, d) = angle, dihedral(a, b, c, d) = torsion."""
    bc = (c - b) / (c - b).norm(dim=-1, keepdim=True)
    n = torch.linalg.cross(b - a, bc, dim=-1)
    n = n / n.norm(dim=-1, keepdim=True)
    m = torch.stack([bc, torch.linalg.cross(n, bc, dim=-1), n], dim=-1)
    local = torch.stack(
        [
            -bond * torch.cos(angle),
            bond * torch.sin(angle) * torch.cos(torsion),
            bond * torch.sin(angle) * torch.sin(torsion),
        ],
        dim=-1,
    )
    return c + (m @ local[..., None])[..., 0]


def loop_reference(dihedrals, angles, bonds, first):
    """The per-residue loop users write today, in the ``"residue"`` layout: (B, L, 3, 3)."""
    atoms = [first[:, 0], first[:, 1], first[:, 2]]
    for i in range(dihedrals.shape[1] - 1):
        phi, psi, omega = dihedrals[:, i + 1, 0], dihedrals[:, i, 1], dihedrals[:, i, 2]
        atoms.append(_place(atoms[-3], atoms[-2], atoms[-1], bonds[:, i, 2], angles[:, i, 1], psi))
        atoms.append(_place(atoms[-3], atoms[-2], atoms[-1], bonds[:, i + 1, 0], angles[:, i, 2], omega))
        atoms.append(_place(atoms[-3], atoms[-2], atoms[-1], bonds[:, i + 1, 1], angles[:, i + 1, 0], phi))
    return torch.stack(atoms, dim=1).unflatten(1, (-1, 3))


def random_backbone(batch: int, n_res: int, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    dihedrals = (torch.rand(batch, n_res, 3, generator=g, dtype=dtype) * 2 - 1) * math.pi
    angles = torch.deg2rad(torch.tensor([111.0, 116.0, 122.0], dtype=dtype)) + 0.1 * torch.randn(
        batch, n_res, 3, generator=g, dtype=dtype
    )
    bonds = torch.tensor([1.46, 1.52, 1.33], dtype=dtype) + 0.02 * torch.randn(
        batch, n_res, 3, generator=g, dtype=dtype
    )
    first = torch.tensor(FOLDINGDIFF_FIRST, dtype=dtype) + 0.1 * torch.randn(
        batch, 3, 3, generator=g, dtype=dtype
    )
    return dihedrals, angles, bonds, first


@pytest.mark.parametrize("method", ["auto", "levels", "scan"])
def test_matches_the_loop_reference(method):
    d, a, b, first = random_backbone(3, 9)
    want = loop_reference(d, a, b, first)
    got = build_backbone(d, a, b, first=first, method=method)
    assert got.shape == (3, 9, 3, 3)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_default_geometry_is_the_protein_builders():
    """Engh & Huber defaults and the seed frame: the backbone of bn.protein.build of poly-Ala."""
    g = torch.Generator().manual_seed(3)
    phi, psi, omega = (
        (torch.rand(2, 7, generator=g, dtype=torch.float64) * 2 - 1) * math.pi for _ in range(3)
    )
    protein = bn.protein.build("A" * 7, phi, psi, omega)
    table = bn.protein.protein_table("A" * 7)
    rows = [table.atom(i, name) for i in range(7) for name in ("N", "CA", "C")]
    want = protein.xyz[:, rows].unflatten(1, (7, 3))
    got = build_backbone(torch.stack([phi, psi, omega], dim=-1))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("layout", ["residue", "foldingdiff"])
def test_round_trip(layout):
    d, a, b, first = random_backbone(4, 8, seed=1)
    xyz = build_backbone(d, a, b, first=first, layout=layout)
    back = backbone_internal(xyz, layout=layout)
    shift = 1 if layout == "foldingdiff" else 0  # its tau, N:CA, CA:C rows are the next residue's
    torch.testing.assert_close(back.dihedrals[:, 1:, 0], d[:, 1:, 0], atol=1e-10, rtol=0)
    torch.testing.assert_close(back.dihedrals[:, :-1, 1:], d[:, :-1, 1:], atol=1e-10, rtol=0)
    own = slice(0, -1) if shift else slice(1, None)  # "residue": the first residue's own values are first's
    torch.testing.assert_close(back.angles[:, own, 0], a[:, own, 0], atol=1e-10, rtol=0)
    torch.testing.assert_close(back.bonds[:, own, :2], b[:, own, :2], atol=1e-10, rtol=0)
    torch.testing.assert_close(back.angles[:, :-1, 1:], a[:, :-1, 1:], atol=1e-10, rtol=0)
    torch.testing.assert_close(back.bonds[:, :-1, 2], b[:, :-1, 2], atol=1e-10, rtol=0)
    # the entries that do not exist read 0
    assert back.dihedrals[:, 0, 0].eq(0).all() and back.dihedrals[:, -1, 1:].eq(0).all()
    assert back.angles[:, -1, 1:].eq(0).all() and back.bonds[:, -1, 2].eq(0).all()
    if shift:
        assert back.angles[:, -1, 0].eq(0).all() and back.bonds[:, -1, :2].eq(0).all()
    # a rebuild from what was read (and the first residue) is the structure
    torch.testing.assert_close(build_backbone(*back, first=xyz[:, 0], layout=layout), xyz, atol=1e-10, rtol=0)


def test_seed_frame_without_first():
    d, a, b, _ = random_backbone(2, 5, seed=2)
    xyz = build_backbone(d, a, b)
    assert xyz[:, 0, 0].abs().max() == 0  # N at the origin
    assert xyz[:, 0, 1, 1:].abs().max() == 0 and (xyz[:, 0, 1, 0] > 0).all()  # CA on +x
    assert xyz[:, 0, 2, 2].abs().max() == 0 and (xyz[:, 0, 2, 1] > 0).all()  # C in the xy-plane
    back = backbone_internal(xyz)
    torch.testing.assert_close(back.angles[:, 0, 0], a[:, 0, 0])  # the first residue's tau and bonds are used
    torch.testing.assert_close(back.bonds[:, 0, :2], b[:, 0, :2])


def test_mixed_lengths_equal_single_builds_and_ignore_padding():
    d, a, b, first = random_backbone(3, 10, seed=4)
    lengths = torch.tensor([10, 4, 1])
    pad = torch.arange(10)[None, :, None] >= lengths[:, None, None]
    leaves = [torch.where(pad, torch.nan, t).requires_grad_() for t in (d, a, b)]
    xyz = build_backbone(*leaves, first=first, lengths=lengths)
    for k, n in enumerate(lengths.tolist()):
        alone = build_backbone(d[k : k + 1, :n], a[k : k + 1, :n], b[k : k + 1, :n], first=first[k : k + 1])
        torch.testing.assert_close(xyz[k, :n], alone[0], atol=1e-12, rtol=0)
        assert xyz[k, n:].eq(0).all()
    xyz.square().sum().backward()
    for leaf in leaves:
        assert torch.isfinite(leaf.grad).all()
        assert leaf.grad[pad.expand_as(leaf.grad)].eq(0).all()
    back = backbone_internal(xyz, lengths=lengths)
    assert (
        back.dihedrals[1, 4:].eq(0).all()
        and back.angles[1, 3:, 1:].eq(0).all()
        and back.bonds[2, 1:].eq(0).all()
        and back.bonds[2, 0, 2] == 0
    )
    torch.testing.assert_close(back.dihedrals[1, 1:3, 1:], d[1, 1:3, 1:], atol=1e-10, rtol=0)


def test_unused_nan_entries_change_nothing():
    """phi of the first residue, psi and omega of the last (FoldingDiff's NaN) are never read."""
    d, a, b, first = random_backbone(2, 6, seed=5)
    holes = d.clone()
    holes[:, 0, 0] = torch.nan
    holes[:, -1, 1:] = torch.nan
    torch.testing.assert_close(build_backbone(holes, a, b, first=first), build_backbone(d, a, b, first=first))


def test_float32_angles_with_float64_first():
    d, a, b, _ = random_backbone(2, 6, seed=6, dtype=torch.float32)
    xyz = build_backbone(d, a, b, first=np.array(FOLDINGDIFF_FIRST), layout="foldingdiff")
    assert xyz.dtype == torch.float32
    ref = build_backbone(d.double(), a.double(), b.double(), layout="foldingdiff")
    assert (xyz.double() - ref).abs().max() < 1e-4


def test_degrees_and_broadcasting():
    d, a, b, first = random_backbone(1, 5, seed=7)
    rad = build_backbone(d, a, b, first=first[0])
    deg = build_backbone(torch.rad2deg(d), torch.rad2deg(a), b, first=first[0], degrees=True)
    torch.testing.assert_close(rad, deg)
    both = build_backbone(d.expand(2, 3, 5, 3), a[0], b[0])
    assert both.shape == (2, 3, 5, 3, 3)
    back = backbone_internal(rad, degrees=True)
    torch.testing.assert_close(back.dihedrals[0, 1:-1], torch.rad2deg(d[0, 1:-1]))


def test_gradcheck_and_gradgradcheck():
    d, a, b, first = random_backbone(2, 4, seed=8)
    for t in (d, a, b, first):
        t.requires_grad_()
    assert torch.autograd.gradcheck(lambda *x: build_backbone(x[0], x[1], x[2], first=x[3]), (d, a, b, first))
    assert torch.autograd.gradgradcheck(lambda x, y: build_backbone(x, y, first=first.detach()), (d, a))
    xyz = build_backbone(d.detach(), a.detach(), b.detach()).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x: backbone_internal(x).dihedrals, (xyz,))


def test_torch_func():
    d, a, b, first = random_backbone(2, 4, seed=9)
    jac = torch.func.jacrev(lambda x: build_backbone(x, a[0], b[0], first=first[0]))(d[0])
    assert jac.shape == (4, 3, 3, 4, 3) and torch.isfinite(jac).all()
    v = torch.func.vmap(lambda x: build_backbone(x, a[0], b[0]))(d)
    torch.testing.assert_close(v, build_backbone(d, a[0], b[0]))


def test_nan_in_nan_out():
    d, a, b, first = random_backbone(1, 6, seed=10)
    d[0, 3, 1] = torch.nan  # psi of residue 3 places residue 4 onwards
    xyz = build_backbone(d, a, b, first=first)
    assert torch.isfinite(xyz[0, :4]).all() and torch.isnan(xyz[0, 4:]).all()


def test_bad_input():
    d, a, b, first = random_backbone(2, 5)
    with pytest.raises(ValueError, match=r"dihedrals must be \(\.\.\., L, 3\), got shape \(2, 5\)"):
        build_backbone(d[..., 0])
    with pytest.raises(ValueError, match=r"angles must be \(\.\.\., 5, 3\), got shape \(2, 4, 3\)"):
        build_backbone(d, a[:, :4])
    with pytest.raises(ValueError, match=r"bonds must be \(\.\.\., 5, 3\), got shape \(2, 5, 2\)"):
        build_backbone(d, a, b[..., :2])
    with pytest.raises(ValueError, match="at least one residue"):
        build_backbone(d[:, :0])
    with pytest.raises(ValueError, match=r"first must be \(\.\.\., 3, 3\).*got shape \(2, 3\)"):
        build_backbone(d, first=first[:, 0])
    with pytest.raises(ValueError, match=r"do not broadcast: dihedrals \(2, 5, 3\), angles \(3, 5, 3\)"):
        build_backbone(d, torch.cat([a, a[:1]]))
    with pytest.raises(ValueError, match=r"lengths must be in \[1, 5\].*got 6 for protein \(1,\)"):
        build_backbone(d, lengths=[5, 6])
    with pytest.raises(ValueError, match=r"lengths must be in \[1, 5\].*got 0 for protein \(0,\)"):
        backbone_internal(build_backbone(d), lengths=[0, 2])
    with pytest.raises(
        ValueError, match=r"lengths of shape \(3,\) do not broadcast to the batch shape \(2,\)"
    ):
        build_backbone(d, lengths=[5, 5, 5])
    with pytest.raises(TypeError, match="lengths must hold integers, got dtype torch.float32"):
        build_backbone(d, lengths=torch.tensor([5.0, 5.0]))
    with pytest.raises(TypeError, match="dihedrals must be a floating tensor"):
        build_backbone(torch.ones(2, 5, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="layout must be one of"):
        build_backbone(d, layout="chroma")
    with pytest.raises(ValueError, match="layout must be one of"):
        backbone_internal(build_backbone(d), layout="chroma")
    with pytest.raises(
        ValueError, match=r"xyz must be \(\.\.\., L, 3, 3\).*got shape \(2, 15, 3\).*unflatten"
    ):
        backbone_internal(build_backbone(d).flatten(1, 2))


# --- outside checks -------------------------------------------------------------------------------


def _foldingdiff_nerf():
    root = os.environ.get("FOLDINGDIFF_PATH")
    if not root or not (Path(root) / "foldingdiff" / "nerf.py").is_file():
        pytest.skip("set FOLDINGDIFF_PATH to a checkout of microsoft/foldingdiff (benchmarks/PEERS.md)")
    spec = importlib.util.spec_from_file_location("foldingdiff_nerf", Path(root) / "foldingdiff" / "nerf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _real_backbone():
    """N, CA, C of adenylate kinase (214 residues) from MDAnalysisTests: (L, 3, 3) float64."""
    mda = pytest.importorskip("MDAnalysis", reason="MDAnalysis is an optional test dependency")
    data = pytest.importorskip(
        "MDAnalysisTests.datafiles", reason="MDAnalysisTests is an optional test dependency"
    )
    u = mda.Universe(data.PDB)
    protein = u.select_atoms("protein and name N CA C")
    xyz = protein.positions.astype(np.float64).reshape(-1, 3, 3)
    assert [a.name for a in protein.atoms[:3]] == ["N", "CA", "C"]
    return torch.from_numpy(xyz)


def test_real_structure_round_trip():
    """The measured values of a real backbone rebuild it, from its first residue, exactly."""
    xyz = _real_backbone()
    for layout in ("residue", "foldingdiff"):
        back = backbone_internal(xyz, layout=layout)
        rebuilt = build_backbone(*back, first=xyz[0], layout=layout)
        assert (rebuilt - xyz).abs().max() < 1e-9


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-8), (torch.float32, 1e-4)])
def test_foldingdiff_nerf_build_batch(dtype, tol):
    """FoldingDiff's nerf_build_batch on the angles of real structures, with its defaults and NaN ends."""
    nerf = _foldingdiff_nerf()
    xyz = _real_backbone()
    back = backbone_internal(xyz, layout="foldingdiff")
    batch = 3
    g = torch.Generator().manual_seed(0)
    d = (
        back.dihedrals + 0.05 * torch.randn(batch, *back.dihedrals.shape, generator=g, dtype=torch.float64)
    ).to(dtype)
    a = (back.angles + 0.02 * torch.randn(batch, *back.angles.shape, generator=g, dtype=torch.float64)).to(
        dtype
    )
    d[:, 0, 0] = torch.nan  # FoldingDiff's phi[0], psi[-1], omega[-1]
    d[:, -1, 1:] = torch.nan
    d.requires_grad_()
    a.requires_grad_()
    # its default lengths become float32 tensors (torch.tensor(1.46)): given here in the angles' dtype
    lengths = [torch.full(d.shape[:-1], v, dtype=dtype) for v in (1.46, 1.54, 1.34)]
    theirs = nerf.nerf_build_batch(d[..., 0], d[..., 1], d[..., 2], a[..., 0], a[..., 1], a[..., 2], *lengths)
    ours = build_backbone(d, a, layout="foldingdiff").flatten(1, 2)  # FoldingDiff's default lengths
    assert theirs.dtype == torch.float64  # its 1CRN start is float64 and promotes
    assert (ours.double() - theirs).abs().max() <= tol
    if dtype == torch.float64:
        weights = torch.randn(theirs.shape, generator=g, dtype=dtype)
        g_theirs = torch.autograd.grad((theirs * weights).sum(), (d, a))
        g_ours = torch.autograd.grad((ours * weights).sum(), (d, a))
        for x, y in zip(g_ours, g_theirs):
            torch.testing.assert_close(x.nan_to_num(), y.nan_to_num(), atol=1e-8, rtol=0)
        # with lengths (bond lengths given too) and mixed lengths
        bonds = back.bonds.expand(batch, -1, -1)
        lengths = torch.tensor([xyz.shape[0], 120, 46])
        mixed = build_backbone(d.detach(), a.detach(), bonds, lengths=lengths, layout="foldingdiff")
        for k, n in enumerate(lengths.tolist()):
            columns = (*d.detach().unbind(-1), *a.detach().unbind(-1), *bonds.unbind(-1))
            t = nerf.nerf_build_batch(*(x[k : k + 1, :n] for x in columns))
            assert (mixed[k, :n].flatten(0, 1) - t[0]).abs().max() <= tol


@pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="the bound build runs the numba kernels"
)
@pytest.mark.parametrize("layout", ["foldingdiff", "residue"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_bound_build_equals_the_general_path_bit_for_bit(layout, dtype):
    """The common call (no lengths, no first) takes the bound build (one gather, the compiled passes):
    the same positions and gradients, bit for bit, as the general path (to_cartesian on the chain table,
    reached here through a ``torch.func`` transform, which the bound build leaves to it)."""
    torch.manual_seed(3)
    d = ((torch.rand(5, 9, 3) * 2 - 1) * math.pi).to(dtype).requires_grad_()
    a = (1.9 + 0.1 * torch.randn(5, 9, 3)).to(dtype).requires_grad_()
    b = (1.4 + 0.1 * torch.rand(5, 9, 3)).to(dtype).requires_grad_()
    w = torch.randn(5, 9, 3, 3, dtype=dtype)
    xyz = build_backbone(d, a, b, layout=layout)
    assert type(xyz.grad_fn).__name__ == "BackboneFnBackward"  # the bound build ran
    grads = torch.autograd.grad((xyz * w).sum(), (d, a, b))

    def general(d, a, b):
        return build_backbone(d, a, b, layout=layout)

    ref = torch.func.vjp(general, d.detach(), a.detach(), b.detach())  # under a transform: the general path
    assert torch.equal(xyz.detach(), ref[0])
    for g, r in zip(grads, ref[1](w)):
        assert torch.equal(g, r)
    default = build_backbone(d, a, layout=layout)  # default bonds: given to the kernels as constants
    assert torch.equal(
        default.detach(), torch.func.vjp(lambda x, y: build_backbone(x, y, layout=layout), d, a)[0]
    )


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="the bound build needs numba")
@pytest.mark.parametrize(("batch", "n_res"), [(3, 9), (16, 9), (40, 30), (64, 128), (128, 128)])
@pytest.mark.parametrize("lengths", [False, True])
def test_the_forward_alone_equals_the_differentiable_build(batch, n_res, lengths, monkeypatch):
    """Nothing to differentiate: the forward alone (one compiled call for the gather and the blocked
    build where a call runs on this thread, else the two passes), the same bits as the build that
    keeps a graph, mixed lengths included."""
    from batched_nerf.engines.fused.cpu import build as cpu_build
    from batched_nerf.protein._backbone import backbone_table

    n_units = backbone_table(n_res, True).plan("fused").starts.size - 1
    serial = cpu_build._threads(batch, n_units, 3 * n_res) == 1  # below the serial bound, or 1 thread
    one_call = serial and batch >= cpu_build.BLOCK_MIN  # else per sample, or threaded: two passes
    calls = []
    one = cpu_build._gathered_blocks
    monkeypatch.setattr(cpu_build, "_gathered_blocks", lambda *args: calls.append(1) or one(*args))
    g = torch.Generator().manual_seed(batch)
    d = (torch.rand(batch, n_res, 3, generator=g) * 2 - 1) * math.pi
    a = 1.9 + 0.1 * torch.rand(batch, n_res, 3, generator=g)
    count = torch.randint(1, n_res + 1, (batch,), generator=g) if lengths else None
    with torch.no_grad():
        alone = build_backbone(d, a, layout="foldingdiff", lengths=count)
    kept = build_backbone(d, a.requires_grad_(), layout="foldingdiff", lengths=count)
    assert type(kept.grad_fn).__name__ == "BackboneFnBackward"
    assert torch.equal(alone, kept.detach())
    assert len(calls) == (1 if one_call else 0)


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="the bound build needs numba")
@pytest.mark.parametrize("case", ["angles broadcast", "angles default", "bonds broadcast", "one chain"])
def test_the_bound_build_of_defaults_and_broadcasts_equals_the_general_path(case):
    """Defaults and broadcast values reach the kernels as one row every chain reads (not copied):
    positions and gradients (summed over the broadcast) equal the general path's, bit for bit."""
    torch.manual_seed(4)
    d = ((torch.rand(6, 8, 3) * 2 - 1) * math.pi).requires_grad_()
    a = (1.9 + 0.1 * torch.randn(8, 3)).requires_grad_()  # one chain's angles for every chain
    b = (1.4 + 0.1 * torch.rand(6, 8, 3)).requires_grad_()
    args = {
        "angles broadcast": (d, a, b),
        "angles default": (d, None, b),
        "bonds broadcast": (d, None, b.detach()[0].requires_grad_()),
        "one chain": (d.detach()[0].requires_grad_(), a, b.detach()[0].requires_grad_()),
    }[case]
    leaves = [t for t in args if t is not None]
    xyz = build_backbone(*args, layout="foldingdiff")
    assert type(xyz.grad_fn).__name__ == "BackboneFnBackward"  # the bound build ran
    w = torch.randn(xyz.shape)
    grads = torch.autograd.grad((xyz * w).sum(), leaves)

    def general(*values):
        it = iter(values)
        return build_backbone(*(None if t is None else next(it) for t in args), layout="foldingdiff")

    out, pull = torch.func.vjp(general, *(t.detach() for t in leaves))  # the general path
    assert torch.equal(xyz.detach(), out)
    for g, r in zip(grads, pull(w)):
        assert torch.equal(g, r)


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="the bound build needs numba")
def test_the_bound_build_of_mixed_lengths_equals_the_general_path():
    """Mixed lengths (NaN padding past each chain's end) through the bound build: positions and
    gradients equal the general path's, zeros past each length, no NaN anywhere."""
    d, a, b, _ = random_backbone(4, 7, seed=5)
    lengths = torch.tensor([7, 3, 1, 5])
    pad = torch.arange(7)[None, :, None] >= lengths[:, None, None]
    d, a = (
        d.masked_fill(pad, float("nan")).requires_grad_(),
        a.masked_fill(pad, float("nan")).requires_grad_(),
    )
    # the caller's output gradient, NaN past each length (where the output is zeros): it reaches no
    # input gradient, and the backward leaves the caller's tensor as it was
    w = torch.randn(4, 7, 3, 3, dtype=torch.float64).masked_fill(pad[..., None], float("nan"))
    given = w.clone()
    xyz = build_backbone(d, a, layout="foldingdiff", lengths=lengths)
    assert type(xyz.grad_fn).__name__ == "BackboneFnBackward"
    grads = torch.autograd.grad(xyz, (d, a), grad_outputs=w)
    assert torch.equal(w.nan_to_num(), given.nan_to_num()) and torch.equal(w.isnan(), given.isnan())
    out, pull = torch.func.vjp(lambda x, y: build_backbone(x, y, layout="foldingdiff", lengths=lengths), d, a)
    assert torch.equal(xyz.detach(), out) and not xyz.isnan().any()
    assert bool((xyz[pad[..., 0]] == 0).all())
    for g, r in zip(grads, pull(w)):
        assert torch.equal(g, r) and not g.isnan().any()


def test_the_bound_build_is_twice_differentiable():
    """gradcheck through the backward kernel; gradgradcheck (``create_graph=True``) through the general
    path's graph, the bound build's reference."""
    d, a, _, _ = random_backbone(2, 5)
    d, a = d.requires_grad_(), a.requires_grad_()
    assert type(build_backbone(d, a, layout="foldingdiff").grad_fn).__name__ == "BackboneFnBackward"
    assert torch.autograd.gradcheck(lambda x, y: build_backbone(x, y, layout="foldingdiff"), (d, a))
    assert torch.autograd.gradgradcheck(lambda x, y: build_backbone(x, y, layout="foldingdiff"), (d, a))


def test_constants_made_under_inference_mode_serve_later_gradients():
    """The layout's cached constants (FoldingDiff's first residue, default angles and bonds) are made
    outside inference mode: a first call inside ``torch.inference_mode()`` (a validation pass) must not
    break a later backward, on the bound build, under a transform, or to second order."""
    from batched_nerf.protein._backbone import _constants

    _constants.cache_clear()
    d, a, _, _ = random_backbone(2, 5)
    with torch.inference_mode():
        build_backbone(d, a, layout="foldingdiff")
    x = d.clone().requires_grad_()
    grad = torch.autograd.grad(build_backbone(x, a, layout="foldingdiff").sum(), x, create_graph=True)[0]
    grad.sum().backward()
    torch.func.vjp(lambda t: build_backbone(t, a, layout="foldingdiff"), d)[1](torch.ones(2, 5, 3, 3))
