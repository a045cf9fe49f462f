"""The one gate (`batched_nerf.runtime.gate`): kernel or reference, decided from the call's tensors."""

from __future__ import annotations

import pytest
import torch

from batched_nerf.runtime import gate


def test_route_reads_gradients_wrappers_and_tangents() -> None:
    x = torch.ones(3)
    assert gate.route(x) == gate.PLAIN
    assert gate.route(x, x.clone().requires_grad_()) == gate.FUNCTION
    with torch.no_grad():
        assert gate.route(x.clone().requires_grad_()) == gate.PLAIN  # nothing to keep
    seen: list[str] = []

    def record(y: torch.Tensor) -> torch.Tensor:
        seen.append(gate.route(y))
        return y.sum()

    torch.func.grad(record)(x)
    torch.func.vmap(record)(torch.ones(2, 3))
    torch.func.jvp(record, (x,), (x,))
    assert seen == [gate.REFERENCE] * 3
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, x)
        assert gate.route(dual) == gate.REFERENCE
        assert gate.forward_ad_active()
    assert not gate.forward_ad_active()
    # closing the level clears every tangent (why route asks a tensor only while a level is open)
    assert torch.autograd.forward_ad.unpack_dual(dual).tangent is None
    assert gate.route(dual) == gate.PLAIN


def test_transformed_is_true_inside_any_transform_also_for_constants() -> None:
    constant = torch.ones(3)
    inside: list[bool] = []

    def f(y: torch.Tensor) -> torch.Tensor:
        inside.append(gate.transformed() and not gate.wrapped(constant))
        return y.sum()

    assert not gate.transformed()
    torch.func.grad(f)(torch.ones(2))
    assert inside == [True]  # the constant is not wrapped, the call is still inside a transform


@pytest.mark.parametrize(
    ("tensors", "device_type", "takes"),
    [
        ((torch.ones(2),), "cpu", True),
        ((torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)), "cpu", True),
        ((torch.ones(2), torch.ones(2, dtype=torch.float64)), "cpu", False),  # mixed dtypes
        ((torch.ones(2, dtype=torch.float16),), "cpu", False),
        ((torch.ones(2, dtype=torch.int64),), "cpu", False),
        ((torch.ones(2),), "cuda", False),  # the tensors are on another device type
    ],
)
def test_kernel_inputs(tensors: tuple[torch.Tensor, ...], device_type: str, takes: bool) -> None:
    assert gate.kernel_inputs(*tensors, device_type=device_type) is takes


def test_a_compile_trace_takes_the_reference() -> None:
    pytest.importorskip("torch._dynamo", reason="torch.compile")
    seen: list[tuple[str, bool]] = []

    @torch.compile(backend="eager")
    def f(y: torch.Tensor) -> torch.Tensor:
        seen.append((gate.route(y), gate.kernel_inputs(y)))
        return y * 2

    f(torch.ones(3))
    assert seen == [(gate.REFERENCE, False)]


def test_keeps_grad_asks_each_given_tensor_under_grad_mode() -> None:
    x, w = torch.zeros(3), torch.zeros(3, requires_grad=True)
    assert not gate.keeps_grad(x, None)
    assert gate.keeps_grad(None, x, w)
    with torch.no_grad():
        assert not gate.keeps_grad(w)
    assert gate.plain(x) and not gate.plain(x, w)


def test_bound_inputs_refuses_transforms_forward_mode_and_other_devices() -> None:
    """The bound builds (torsions, backbones) take plain CPU float tensors only: a ``torch.func``
    transform or a forward-mode level sends the call to the general path."""
    import torch.autograd.forward_ad as fwAD

    x = torch.zeros(3)
    assert gate.bound_inputs(x, x.double().float())
    assert not gate.bound_inputs(x.long())
    assert not gate.bound_inputs(x, x.double())  # two dtypes
    seen = []
    torch.func.vmap(lambda t: seen.append(gate.bound_inputs(x)) or t)(torch.zeros(2, 1))
    assert seen == [False]
    with fwAD.dual_level():
        assert not gate.bound_inputs(x)
