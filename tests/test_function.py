"""The engines' Function base: outside ``torch.func`` its twin in the older style runs, with the same
values, gradients to second order and forward mode; inside ``torch.func`` torch's own ``apply``."""

from __future__ import annotations

from typing import ClassVar

import torch

import batched_nerf as bn
from batched_nerf.engines.function import Function, save

F64 = torch.float64


class Cube(Function):
    """``x ** 3``, its backward ``3 x^2 g`` in torch operations (so differentiable again)."""

    calls: ClassVar[list[str]] = []

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x**3

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
        Cube.calls.append("eager" if not torch._C._are_functorch_transforms_active() else "transform")
        save(ctx, inputs[0])

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def,override]
        (x,) = ctx.saved_tensors
        return 3 * x**2 * g

    @staticmethod
    def jvp(ctx, t: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def,override]
        (x,) = ctx.saved_tensors
        return 3 * x**2 * t

    @staticmethod
    def vmap(info, in_dims, x):  # type: ignore[no-untyped-def]
        return Cube.apply(x), in_dims[0]


def test_outside_transforms_the_twin_runs_with_the_same_derivatives() -> None:
    x = torch.linspace(-1.0, 2.0, 5, dtype=F64, requires_grad=True)
    Cube.calls.clear()
    y = Cube.apply(x)
    assert Cube._eager is not Cube
    assert type(y.grad_fn)._forward_cls is Cube._eager  # the twin ran, not torch's apply of Cube
    assert type(y.grad_fn).__name__ == "CubeBackward"  # and the graph reads as the class's
    torch.testing.assert_close(y, x.detach() ** 3)
    assert torch.autograd.gradcheck(Cube.apply, (x,))
    assert torch.autograd.gradgradcheck(Cube.apply, (x,))
    (g,) = torch.autograd.grad(Cube.apply(x).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(gg, 6 * x.detach())
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x.detach(), torch.ones_like(x))
        tangent = torch.autograd.forward_ad.unpack_dual(Cube.apply(dual)).tangent
    torch.testing.assert_close(tangent, 3 * x.detach() ** 2)
    assert set(Cube.calls) == {"eager"}


def test_inside_transforms_torch_apply_runs() -> None:
    x = torch.linspace(-1.0, 2.0, 5, dtype=F64)
    Cube.calls.clear()
    torch.testing.assert_close(torch.func.grad(lambda v: Cube.apply(v).sum())(x), 3 * x**2)
    torch.testing.assert_close(torch.func.jacfwd(Cube.apply)(x), torch.diag(3 * x**2))
    torch.testing.assert_close(torch.func.vmap(Cube.apply)(x.reshape(5, 1)), x.reshape(5, 1) ** 3)
    torch.testing.assert_close(torch.func.hessian(lambda v: Cube.apply(v).sum())(x), torch.diag(6 * x))
    assert "transform" in Cube.calls


def test_forward_ad_api_through_the_fused_functions():
    """``torch.autograd.forward_ad`` (one dual level, no nesting) through the fused build and the
    fused inverse: the tangents of the torch engines (it raised "Nested forward mode AD is not
    supported" when the Functions' jvp opened a level of its own)."""
    fw = torch.autograd.forward_ad
    g = torch.Generator().manual_seed(0)
    table = bn.ConstructionTable.chain(7)
    b = 1.5 + 0.1 * torch.rand(2, 7, dtype=torch.float64, generator=g)
    a = 1.9 + 0.1 * torch.rand(2, 7, dtype=torch.float64, generator=g)
    d = torch.randn(2, 7, dtype=torch.float64, generator=g)
    t_d = torch.randn(2, 7, dtype=torch.float64, generator=g)

    def tangents(build, inverse):
        with fw.dual_level():
            dual = fw.make_dual(d, t_d)
            x = bn.to_cartesian(b, a, dual, table, method=build)
            ic = bn.to_internal(x, table, method=inverse)
            return (
                fw.unpack_dual(x).tangent,
                fw.unpack_dual(ic.angles).tangent,
                fw.unpack_dual(ic.dihedrals).tangent,
            )

    for got, want in zip(tangents("fused", "fused"), tangents("scan", "torch")):
        assert got is not None and want is not None
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
