"""The flow layer's entries and log-det as one numba pass: the torch reference's values and derivatives."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf import InternalCoordinateTransform
from batched_nerf.engines.backends import available, require
from batched_nerf.learning import flow_entries as fe

pytestmark = pytest.mark.skipif(not available("cpu"), reason="numba (the extra 'fast') is not installed")
F64 = torch.float64


def _tables() -> dict[str, bn.ConstructionTable]:
    chain = bn.ConstructionTable.chain(6)
    fixed = bn.ConstructionTable(
        [[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2], [3, 0, 1], [4, 3, 0]], fixed=[0, 1, 2]
    )
    return {
        "alanine dipeptide": bn.data.load("alanine_dipeptide").table,
        "12 molecules (entries by index)": bn.pack_tables([chain] * 12),
        "fixed atoms": fixed,
    }


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often each of the four kernels ran."""
    kernels = require("cpu").entries
    count = dict.fromkeys(("spread", "gather", "spread_grad", "gather_grad"), 0)
    for name in count:
        original = getattr(kernels, name)

        def spy(*args: Any, _name: str = name, _fn: Any = original) -> Any:
            count[_name] += 1
            return _fn(*args)

        monkeypatch.setattr(kernels, name, spy)
    return count


def _reference(flow: InternalCoordinateTransform) -> InternalCoordinateTransform:
    """The same layer on the torch path (no kernel pass)."""
    ref = InternalCoordinateTransform(flow.table, pose=flow.pose, normalize_angles=flow.normalize_angles)
    ref._kernel = None
    return ref


def _xyz(table: bn.ConstructionTable, batch: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return (1.5 * torch.randn(*batch, table.n_atoms, 3, generator=gen, dtype=F64)).to(dtype)


@pytest.mark.parametrize("name", list(_tables()))
@pytest.mark.parametrize("pose", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("batch", [(), (2, 3)])
def test_kernel_pass_matches_the_torch_reference(
    name: str, pose: bool, dtype: torch.dtype, batch: tuple[int, ...], calls: dict[str, int]
) -> None:
    table = _tables()[name]
    if pose and table.n_fixed:
        pytest.skip("pose=True needs a seeded component")
    flow = InternalCoordinateTransform(table, pose=pose, normalize_angles=True)
    ref = _reference(flow)
    tol = {"rtol": 0, "atol": 1e-10} if dtype == F64 else {"rtol": 1e-5, "atol": 1e-4}
    x = _xyz(table, batch, dtype).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    z, z_ref = flow(x), ref(x_ref)
    for got, want in zip(z, z_ref):
        if want is not None:
            torch.testing.assert_close(got, want, **tol)
    loss = z.log_det.square().sum() + z.bonds.sum() + z.angles.square().sum() + z.dihedrals.sin().sum()
    loss_ref = z_ref.log_det.square().sum() + z_ref.bonds.sum() + z_ref.angles.square().sum()
    loss_ref = loss_ref + z_ref.dihedrals.sin().sum()
    loss.backward()
    loss_ref.backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **tol)
    assert calls["gather"] == 1 and calls["gather_grad"] == 1

    extra = [z.rotation, z.translation] if pose else []
    leaves = [v.detach().clone().requires_grad_() for v in (z.bonds, z.angles, z.dihedrals, *extra)]
    leaves_ref = [v.detach().clone().requires_grad_() for v in leaves]
    fixed = {"fixed_xyz": z.fixed_xyz.detach()} if table.n_fixed else {}
    (back, ld), (back_ref, ld_ref) = flow.inverse(*leaves, **fixed), ref.inverse(*leaves_ref, **fixed)
    torch.testing.assert_close(back, back_ref, **tol)
    torch.testing.assert_close(ld, ld_ref, **tol)
    w = torch.randn(back.shape, generator=torch.Generator().manual_seed(2), dtype=F64).to(dtype)
    ((back * w).sum() + ld.square().sum()).backward()
    ((back_ref * w).sum() + ld_ref.square().sum()).backward()
    for got, want in zip(leaves, leaves_ref):
        torch.testing.assert_close(got.grad, want.grad, **tol)
    assert calls["spread"] == 1 and calls["spread_grad"] == 1


def test_log_det_at_extreme_values_is_the_sum_of_logs() -> None:
    """Zero, tiny, huge, infinite, NaN and negative bonds, angles at 0 and pi, and a long chain (a
    product of thousands of factors): each sample's log-det is ``sum k log|b| + sum k log|sin a|``."""
    table = bn.ConstructionTable.chain(6)
    flow = InternalCoordinateTransform(table, pose=True)
    values = [0.0, 1e-40, 1e40, 1e-200, 1e200, math.inf, math.nan, -1.3]
    bonds = torch.full((len(values) + 2, 5), 1.5, dtype=F64)
    angles = torch.full((len(values) + 2, 4), 1.9, dtype=F64)
    bonds[: len(values), 2] = torch.tensor(values, dtype=F64)
    angles[len(values), 1], angles[len(values) + 1, 3] = 0.0, math.pi
    dihedrals = torch.zeros(len(values) + 2, 3, dtype=F64)
    _, _, _, ld = fe.spread_log_det(bonds, angles, dihedrals, flow._kernel)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = 2 * np.log(np.abs(bonds.numpy())).sum(-1) + np.log(np.abs(np.sin(angles.numpy()))).sum(-1)
    np.testing.assert_allclose(ld.numpy(), want, rtol=1e-14, atol=1e-12)
    assert math.isnan(ld[6]) and ld[0] == -math.inf and ld[5] == math.inf

    long = bn.ConstructionTable.chain(3000)
    flow = InternalCoordinateTransform(long, pose=True)
    gen = torch.Generator().manual_seed(1)
    b = 0.5 + 3.0 * torch.rand(2, flow.n_bonds, generator=gen, dtype=F64)
    a = 0.01 + 3.1 * torch.rand(2, flow.n_angles, generator=gen, dtype=F64)
    d = torch.zeros(2, flow.n_dihedrals, dtype=F64)
    _, _, _, ld = fe.spread_log_det(b, a, d, flow._kernel)
    want = 2 * b.log().sum(-1) + a.sin().log().sum(-1)
    torch.testing.assert_close(ld, want, rtol=1e-13, atol=0)


def test_second_order_and_torch_func_take_the_reference(calls: dict[str, int]) -> None:
    """create_graph=True differentiates the reference (gradgradcheck); torch.func and forward mode
    run it directly."""
    table = bn.data.load("alanine_dipeptide").table
    flow = InternalCoordinateTransform(table, pose=True)
    z = flow(_xyz(table, (2,), F64))
    leaves = tuple(v.detach().requires_grad_() for v in (z.bonds, z.angles, z.dihedrals))

    def inverse(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return flow.inverse(b, a, d, z.rotation, z.translation)

    assert torch.autograd.gradcheck(inverse, leaves)
    assert torch.autograd.gradgradcheck(inverse, leaves)
    assert calls["spread"] > 0
    x = _xyz(table, (2,), F64).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x: flow(x).log_det, (x,))

    calls.update(dict.fromkeys(calls, 0))
    jac = torch.func.jacrev(lambda b: inverse(b, *leaves[1:])[1])(leaves[0].detach())
    want = 2.0 / leaves[0].detach()  # d/db of sum 2 log b, per sample
    torch.testing.assert_close(torch.diagonal(jac, dim1=0, dim2=1).T, want)
    tangent = torch.ones_like(leaves[0])
    _, jvp = torch.func.jvp(lambda b: inverse(b, *leaves[1:])[1], (leaves[0].detach(),), (tangent,))
    torch.testing.assert_close(jvp, want.sum(-1))
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(leaves[0].detach(), tangent)
        ld = inverse(dual, *(v.detach() for v in leaves[1:]))[1]
        torch.testing.assert_close(torch.autograd.forward_ad.unpack_dual(ld).tangent, want.sum(-1))
    assert sum(calls.values()) == 0


def test_tiered_calls_run_the_reference_until_the_kernels_are_ready(
    monkeypatch: pytest.MonkeyPatch, calls: dict[str, int]
) -> None:
    kernels = require("cpu").entries
    charged: list[Any] = []
    monkeypatch.setattr(kernels, "ready", lambda dtype: False)
    monkeypatch.setattr(kernels, "timed", lambda dtype, run: charged.append(dtype) or run())
    table = bn.data.load("alanine_dipeptide").table
    flow = InternalCoordinateTransform(table, pose=True)
    x = _xyz(table, (3,), torch.float32)
    torch.testing.assert_close(flow(x).log_det, _reference(flow)(x).log_det)
    assert sum(calls.values()) == 0 and charged == [np.float32]
