"""Triton kernels of the fused engines, against the torch reference (interpreter mode on the CPU)."""

from __future__ import annotations

import pytest
import torch

import batched_nerf as bn

pytest.importorskip(
    "triton",
    minversion="3.0",
    reason="the Triton kernels need triton >= 3 (its interpreter runs them on the CPU)",
)
from batched_nerf.engines.fused.build import fused_plan  # noqa: E402
from batched_nerf.engines.fused.cuda import inverse as kern  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tables() -> list[bn.ConstructionTable]:
    return [
        bn.ConstructionTable.chain(9),
        bn.data.load("alanine_dipeptide").table,
        bn.pack_tables([bn.ConstructionTable.chain(3), bn.data.load("benzene").table]),
    ]


def _plan(table: bn.ConstructionTable) -> tuple[torch.Tensor, torch.Tensor]:
    plan = table.plan("inverse", DEVICE)
    return plan.refs, torch.stack([plan.has_bond, plan.has_angle, plan.has_dihedral], -1)


def _singular(n: int, dtype: torch.dtype) -> torch.Tensor:
    """Random conformers, one with coincident atoms, one with three collinear atoms."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4, n, 3, dtype=dtype, generator=gen)
    x[1, 2] = x[1, 1]
    x[2, 3] = x[2, 2] + 0.5 * (x[2, 2] - x[2, 1])
    x[3] = 0.0  # every atom at the origin
    return x.to(DEVICE)


@pytest.mark.parametrize("table", _tables(), ids=["chain", "alanine", "packed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_forward_matches_torch(table: bn.ConstructionTable, dtype: torch.dtype) -> None:
    refs, has = _plan(table)
    x = _singular(table.n_atoms, dtype)
    # the torch reference in the input's precision, as the kernel computes (the CPU kernels read
    # float32 coordinates as float64, so three atoms collinear in float32 are not collinear there)
    want = bn.to_internal(x, table, method="torch")
    got = kern.triton_internal(refs, has, x)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for g, w in zip(got, want):
        assert g.dtype == dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)


@pytest.mark.parametrize("table", _tables(), ids=["chain", "alanine", "packed"])
def test_vjp_matches_torch(table: bn.ConstructionTable) -> None:
    refs, has = _plan(table)
    x = _singular(table.n_atoms, torch.float64)
    x[2, 3] += 1e-3  # near-collinear keeps the dihedral derivative finite and comparable
    x.requires_grad_(True)
    ic = bn.to_internal(x, table)
    gen = torch.Generator().manual_seed(3)
    cot = [torch.randn(c.shape, dtype=c.dtype, generator=gen).to(DEVICE) for c in ic]
    want = torch.autograd.grad(ic, x, cot)[0]
    got = kern.triton_internal_vjp(refs, has, x, *cot)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


def test_nan_propagates_to_what_reads_it() -> None:
    table = bn.ConstructionTable.chain(6)
    refs, has = _plan(table)
    x = _singular(6, torch.float64)[:1].clone()
    x[0, 2, 1] = float("nan")
    bonds, angles, dihedrals = kern.triton_internal(refs, has, x)
    # atom 2 is read by the bond of 2 and 3, the angle of 2, 3, 4, the dihedral of 3, 4, 5
    assert bonds[0].isnan().nonzero().flatten().tolist() == [2, 3]
    assert angles[0].isnan().nonzero().flatten().tolist() == [2, 3, 4]
    assert dihedrals[0].isnan().nonzero().flatten().tolist() == [3, 4, 5]


def test_empty_batch() -> None:
    table = bn.ConstructionTable.chain(4)
    refs, has = _plan(table)
    x = torch.zeros(0, 4, 3, device=DEVICE)
    assert all(c.shape == (0, 4) for c in kern.triton_internal(refs, has, x))
    assert kern.triton_internal_vjp(refs, has, x, *(torch.zeros(0, 4, device=DEVICE),) * 3).shape == (0, 4, 3)


# ------------------------------------------------------------------ to_cartesian kernels
def _build_tables() -> dict[str, bn.ConstructionTable]:
    return {
        "chain": bn.ConstructionTable.chain(10),
        "alanine": bn.data.load("alanine_dipeptide").table,
        "benzene": bn.data.load("benzene").table,
        "fixed": bn.ConstructionTable(
            [[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2], [3, 0, 1], [4, 3, 0], [4, 3, 5]],
            fixed=[0, 1, 2],
        ),
        "packed": bn.pack_tables(
            [
                bn.ConstructionTable.chain(5),
                bn.data.load("alanine_dipeptide").table,
                bn.ConstructionTable.chain(2),
            ]
        ),
    }


def _internal(table: bn.ConstructionTable, batch: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n = table.n_atoms
    bonds = torch.rand(batch, n, dtype=dtype, generator=gen) + 0.8
    angles = torch.rand(batch, n, dtype=dtype, generator=gen) * 2.0 + 0.5
    dihedrals = (torch.rand(batch, n, dtype=dtype, generator=gen) * 2.0 - 1.0) * torch.pi
    fixed = torch.randn(batch, table.n_fixed, 3, dtype=dtype, generator=gen) if table.n_fixed else None
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return to(bonds), to(angles), to(dihedrals), to(fixed)


@pytest.mark.parametrize("name", list(_build_tables()))
def test_build_and_vjp_match_levels(name: str) -> None:
    from batched_nerf.engines.fused.cuda.build import triton_build, triton_vjp
    from batched_nerf.engines.fused.cuda.rows import device_rows

    table = _build_tables()[name]
    bonds, angles, dihedrals, fixed = _internal(table, 3, torch.float64)
    inputs = [t.requires_grad_() for t in (bonds, angles, dihedrals, fixed) if t is not None]
    want = bn.to_cartesian(bonds, angles, dihedrals, table, fixed_xyz=fixed, method="levels")
    cot = torch.randn(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    grads = torch.autograd.grad(want, inputs, cot)
    plan = device_rows(fused_plan(table.topology), DEVICE)  # the CPU kernels' plan, on the device
    xyz, saved = triton_build(plan, bonds, angles, dihedrals, fixed, return_saved=True)
    torch.testing.assert_close(xyz, want.detach(), atol=1e-12, rtol=0)
    got = triton_vjp(plan, saved, bonds, angles, cot, table.n_fixed)
    for g, w in zip([g for g in got if g is not None], grads):
        torch.testing.assert_close(g, w, atol=1e-11, rtol=1e-11)


def test_build_degenerate_inputs_match_scan() -> None:
    """Zero bonds and angles of 0, pi and beyond pi continue along the frames like the scan engine."""
    from batched_nerf.engines.fused.cuda.build import triton_build
    from batched_nerf.engines.fused.cuda.rows import device_rows

    table = bn.ConstructionTable.chain(10)
    bonds, angles, dihedrals, _ = _internal(table, 4, torch.float64)
    bonds[:, 4] = 0.0
    angles[:, 5] = torch.pi
    angles[:, 6] = 0.0
    angles[:, 7] = 4.0
    want = bn.to_cartesian(bonds, angles, dihedrals, table, method="scan")
    got = triton_build(device_rows(fused_plan(table.topology), DEVICE), bonds, angles, dihedrals, None)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_build_float32_and_nan() -> None:
    from batched_nerf.engines.fused.cuda.build import triton_build
    from batched_nerf.engines.fused.cuda.rows import device_rows

    table = bn.data.load("alanine_dipeptide").table
    bonds, angles, dihedrals, _ = _internal(table, 5, torch.float64)
    want = bn.to_cartesian(bonds, angles, dihedrals, table, method="levels")
    plan = device_rows(fused_plan(table.topology), DEVICE)
    got = triton_build(plan, bonds.float(), angles.float(), dihedrals.float(), None)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=0)
    dihedrals[2, 8] = float("nan")
    got = triton_build(plan, bonds, angles, dihedrals, None)
    later = table.topology.level > table.topology.level[8]
    assert got[2, 8].isnan().all() and torch.isfinite(got[[0, 1, 3, 4]]).all()
    assert torch.isfinite(got[2, ~torch.as_tensor(later) & (torch.arange(table.n_atoms) != 8)]).any()


def test_both_backends_have_one_entry_signature() -> None:
    """The fused engine calls ``build`` / ``build_vjp`` of whichever backend the device has: the same
    parameters on the CPU (numba) and on CUDA (Triton)."""
    import inspect

    pytest.importorskip("numba", reason="the CPU backend needs numba")
    from batched_nerf.engines.fused.cpu import build as cpu
    from batched_nerf.engines.fused.cpu import inverse as cpu_inverse
    from batched_nerf.engines.fused.cuda import build as cuda

    for pair, names in (
        ((cpu, cuda), ("build", "build_vjp")),
        ((cpu_inverse, kern), ("internal", "internal_vjp")),
    ):
        for name in names:
            one, other = (list(inspect.signature(getattr(m, name)).parameters) for m in pair)
            assert one == other, name
    assert (cpu.READS_TRIG, cuda.READS_TRIG) == (True, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_both_backends_read_internal_coordinates_alike(dtype: torch.dtype) -> None:
    """The inverse's entries on the CPU (numba) and on Triton give the same values and vjp on the same
    plan, singular geometry included."""
    pytest.importorskip("numba", reason="the CPU backend needs numba")
    from batched_nerf.engines.fused.cpu import inverse as cpu_inverse

    table = bn.data.load("alanine_dipeptide").table
    plan = table.plan("inverse", "cpu")
    x = _singular(table.n_atoms, dtype).cpu()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for w, g in zip(cpu_inverse.internal(plan, x), kern.internal(plan, x)):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)
    cot = [
        torch.randn(4, table.n_atoms, dtype=dtype, generator=torch.Generator().manual_seed(k))
        for k in range(3)
    ]
    want = cpu_inverse.internal_vjp(plan, x, *cot)
    assert want.shape == x.shape and torch.isfinite(want).all()
    torch.testing.assert_close(kern.internal_vjp(plan, x, *cot), want, atol=100 * tol, rtol=100 * tol)


@pytest.mark.parametrize("improper", [False, True], ids=["proper", "improper"])
def test_both_backends_build_in_a_pose_alike(improper: bool) -> None:
    """The entries on the CPU (the pose inside the kernels) and on Triton (the pose after the build, in
    torch, and its vjp first in the backward) give the same positions, a negative bond's atom NaN,
    and the same gradients of every input, the pose's included (an improper rotation: NaN atoms and
    no gradient for its component)."""
    pytest.importorskip("numba", reason="the CPU backend needs numba")
    from batched_nerf.engines.fused.cpu import build as cpu
    from batched_nerf.engines.fused.cuda import build as cuda

    table = bn.pack_tables([bn.data.load("alanine_dipeptide").table, bn.ConstructionTable.chain(6)])
    plan = fused_plan(table.topology)
    bonds, angles, dihedrals = (t.cpu() for t in _internal(table, 3, torch.float64)[:3])
    bonds[1, 9] = -1.0
    fixed = torch.zeros(3, 0, 3, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    s = table.topology.seed_root.size
    rot = torch.linalg.qr(torch.randn(3, s, 3, 3, dtype=torch.float64, generator=gen))[0]
    rot = rot * torch.linalg.det(rot).sign()[..., None, None]  # proper
    if improper:
        rot[2, 0] = -rot[2, 0]
    tr = torch.randn(3, s, 3, dtype=torch.float64, generator=gen)
    g = torch.randn(3, table.n_atoms, 3, dtype=torch.float64, generator=gen)
    args = (plan, bonds, angles, dihedrals, fixed, rot, tr)
    want, got = cpu.build(*args), cuda.build(*args).cpu()
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0, equal_nan=True)
    assert want[1].isnan().any() and (want[2].isnan().any() == improper)
    g = g.masked_fill(want.isnan(), 0.0)
    grads = cpu.build_vjp(*args, g)
    assert len(grads) == 6 and all(torch.isfinite(w[0]).all() for w in grads)  # sample 0: clean
    for w, v in zip(grads, cuda.build_vjp(*args, g)):
        torch.testing.assert_close(v.cpu(), w, atol=1e-10, rtol=1e-10, equal_nan=True)


# ------------------------------------------------------------------ the fused engines on the Triton kernels
@pytest.fixture
def triton_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route CPU tensors of ``method="fused"`` through the Triton kernels (interpreter mode)."""
    from batched_nerf.engines import backends
    from batched_nerf.engines.fused import inverse as fused_inverse
    from batched_nerf.engines.fused.cuda import build as fused_triton

    monkeypatch.setitem(backends._kernels, "cpu", fused_triton)
    monkeypatch.setattr(fused_inverse, "TRITON_ON_CPU", True)


@pytest.mark.parametrize("name", ["alanine", "fixed", "packed"])
def test_fused_to_cartesian_on_triton_matches_levels(triton_on_cpu: None, name: str) -> None:
    table = _build_tables()[name]
    bonds, angles, dihedrals, fixed = _internal(table, 2, torch.float64)
    want = bn.to_cartesian(bonds, angles, dihedrals, table, fixed_xyz=fixed, method="levels")
    got = bn.to_cartesian(bonds, angles, dihedrals, table, fixed_xyz=fixed, method="fused")
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_fused_to_cartesian_on_triton_derivatives(triton_on_cpu: None) -> None:
    """gradcheck of the Triton backward kernel, jacrev (vmap of it) and a create_graph loss (order two)."""
    table = bn.ConstructionTable.chain(4)
    inputs = tuple(t.requires_grad_() for t in _internal(table, 1, torch.float64)[:3])

    def build(*x: torch.Tensor, method: str = "fused") -> torch.Tensor:
        return bn.to_cartesian(*x, table, method=method)

    assert torch.autograd.gradcheck(build, inputs)
    rest = tuple(t.detach() for t in inputs[1:])
    jac = torch.func.jacrev(lambda b: build(b, *rest))(inputs[0].detach())
    want = torch.func.jacrev(lambda b: build(b, *rest, method="levels"))(inputs[0].detach())
    torch.testing.assert_close(jac, want, atol=1e-10, rtol=1e-10)

    def second(method: str) -> torch.Tensor:
        xyz = build(*inputs, method=method)
        (g,) = torch.autograd.grad(xyz.square().sum(), inputs[2], create_graph=True)
        return torch.autograd.grad(g.square().sum(), inputs[0])[0]

    torch.testing.assert_close(second("fused"), second("levels"), atol=1e-10, rtol=1e-10)


def test_fused_to_internal_on_triton_committor(triton_on_cpu: None) -> None:
    """The committor pattern |dq/dx|^2 through the Triton forward and vjp (second order: torch's graph)."""
    table = bn.data.load("alanine_dipeptide").table
    x = _singular(table.n_atoms, torch.float64)[:1].clone()
    x += 0.01 * torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(5))

    def loss(method: str) -> tuple[torch.Tensor, torch.Tensor]:
        xx = x.clone().requires_grad_()
        ic = bn.to_internal(xx, table, method=method)
        q = (ic.dihedrals.sin() * ic.bonds + ic.angles.cos()).sum()
        (g,) = torch.autograd.grad(q, xx, create_graph=True)
        (g**2).sum().backward()
        return q.detach(), xx.grad

    got, want = loss("fused"), loss("torch")
    torch.testing.assert_close(got[0], want[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-8, rtol=1e-8)
