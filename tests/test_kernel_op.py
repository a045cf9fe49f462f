"""`KernelOp` and `linear_pair`: the Function made from a declaration gives the reference's values and
derivatives to every order, forward mode and ``vmap`` (both rules), with inputs not given (None)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import jacfwd, jacrev, vmap

from batched_nerf.engines.function import KernelOp, fold, lead, linear_pair

F64 = torch.float64
CALLS: list[str] = []


def _kernel(x: torch.Tensor, w: torch.Tensor | None, scale: float) -> torch.Tensor:
    """A "compiled" kernel: numpy on plain arrays (no graph), ``scale * sin(x) * w`` (w = 1 without)."""
    CALLS.append("kernel")
    out = np.sin(x.detach().numpy()) * scale
    if w is not None:
        out = out * w.detach().numpy()
    return torch.from_numpy(out)


def _reference(x: torch.Tensor, w: torch.Tensor | None, scale: float) -> torch.Tensor:
    return scale * torch.sin(x) * (1.0 if w is None else w)


def _op(vmap_rule):  # type: ignore[no-untyped-def]
    return KernelOp(
        "SinTimes", kernel=_kernel, reference=_reference, vmap=vmap_rule, module=__name__, doc="test"
    )


FOLD, LEAD = _op(fold()), _op(lead)


@pytest.mark.parametrize("op", [FOLD, LEAD], ids=["fold", "lead"])
@pytest.mark.parametrize("given", [True, False], ids=["w", "no-w"])
def test_a_kernel_op_has_the_references_values_and_derivatives(op: KernelOp, given: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=g, dtype=F64, requires_grad=True)
    w = torch.randn(3, 4, generator=g, dtype=F64, requires_grad=True) if given else None
    CALLS.clear()
    got = op.apply(x, w, 2.0)
    assert CALLS == ["kernel"] and type(got.grad_fn).__name__ == "SinTimesBackward"
    torch.testing.assert_close(got, _reference(x, w, 2.0), rtol=0, atol=1e-15)
    inputs = (x,) if w is None else (x, w)

    def f(*t: torch.Tensor) -> torch.Tensor:
        return op.apply(t[0], t[1] if len(t) > 1 else None, 2.0)

    assert torch.autograd.gradcheck(f, inputs, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, inputs)
    plain = tuple(t.detach() for t in inputs)
    ref = jacrev(lambda *t: _reference(t[0], t[1] if len(t) > 1 else None, 2.0))(*plain)
    for jac in (jacrev, jacfwd):
        torch.testing.assert_close(jac(f)(*plain), ref)


@pytest.mark.parametrize("op", [FOLD, LEAD], ids=["fold", "lead"])
def test_a_kernel_op_vmaps_over_any_input(op: KernelOp) -> None:
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(5, 3, 4, generator=g, dtype=F64), torch.randn(3, 4, generator=g, dtype=F64)
    CALLS.clear()
    got = vmap(lambda t: op.apply(t, w, 0.5))(x)  # w unbatched: expanded by the rule
    assert "kernel" in CALLS
    torch.testing.assert_close(got, _reference(x, w, 0.5))
    got = vmap(lambda t: op.apply(x[0], t, 0.5), in_dims=1)(x.movedim(0, 1))
    torch.testing.assert_close(got, _reference(x[0], x, 0.5))


def test_a_declared_vjp_is_the_backward_and_the_reference_the_rest() -> None:
    seen: list[str] = []

    def vjp(primals, grads, scale):  # type: ignore[no-untyped-def]
        seen.append("vjp")
        x, w = primals
        return (grads[0] * scale * torch.cos(x) * (1.0 if w is None else w), None if w is None else grads[0])

    op = KernelOp("Declared", kernel=_kernel, reference=_reference, vjp=vjp, module=__name__, doc="test")
    x = torch.randn(4, dtype=F64, requires_grad=True)
    (gx,) = torch.autograd.grad(op.apply(x, None, 3.0).sum(), x, create_graph=True)
    assert seen == ["vjp"]
    torch.testing.assert_close(gx, 3.0 * torch.cos(x))
    (ggx,) = torch.autograd.grad(gx.sum(), x)  # the declared vjp is torch: differentiable again
    torch.testing.assert_close(ggx, -3.0 * torch.sin(x))


def test_an_op_without_a_reference_has_no_forward_mode() -> None:
    op = KernelOp("NoReference", kernel=_kernel, module=__name__, doc="test")
    x = torch.randn(4, dtype=F64)
    with pytest.raises(RuntimeError, match="jvp"):
        torch.func.jvp(lambda t: op.apply(t, None, 1.0), (x,), (torch.ones_like(x),))


def test_a_declared_fallback_guards_every_kernel_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fallback=``: a kernel that fails to compile or launch (`KernelError`) gives the reference's
    values where the call may fall back (warning once, then the device is off for later calls), and
    the error where it may not, with a graph (``apply``) and without (``run``)."""
    from batched_nerf.engines import gpu_policy

    monkeypatch.setattr(gpu_policy, "_disabled", {})

    def broken(x: torch.Tensor, w: torch.Tensor | None, scale: float) -> torch.Tensor:
        CALLS.append("kernel")
        raise gpu_policy.KernelError("Triton kernel k failed: RuntimeError: PTXAS error")

    op = KernelOp(
        "Broken",
        kernel=broken,
        reference=_reference,
        fallback=lambda scale: scale > 0,
        module=__name__,
        doc="t",
    )
    x = torch.randn(4, dtype=F64, requires_grad=True)
    with pytest.raises(gpu_policy.KernelError, match="PTXAS"):
        op.run(x, None, -1.0)  # may not fall back: the error
    with pytest.raises(gpu_policy.KernelError, match="PTXAS"):
        op.apply(x, None, -1.0)
    assert gpu_policy.disabled("cpu") is None
    CALLS.clear()
    with pytest.warns(RuntimeWarning, match="PTXAS"):
        got = op.apply(x, None, 2.0)
    torch.testing.assert_close(got, _reference(x, None, 2.0), rtol=0, atol=0)
    assert CALLS == ["kernel"] and "PTXAS" in gpu_policy.disabled("cpu")
    (gx,) = torch.autograd.grad(got.sum(), x)  # the reference's vjp
    torch.testing.assert_close(gx, 2.0 * torch.cos(x))
    CALLS.clear()
    torch.testing.assert_close(op.run(x.detach(), None, 2.0), _reference(x.detach(), None, 2.0))
    assert CALLS == []  # the device is off: no kernel tried, no second warning
    with pytest.raises(TypeError, match="needs a reference"):
        KernelOp("NoReference", kernel=broken, fallback=lambda scale: True, module=__name__, doc="t")


def test_call_routes_by_the_gate_with_the_declared_buffers() -> None:
    """``call``: nothing to differentiate runs the kernel alone (no graph) with the buffers borrowed
    for the call (``keep=False``); a kept gradient, a ``torch.func`` transform or a forward-mode
    tangent take the Function (``keep=True``), whose values and derivatives are the reference's."""
    seen: list[tuple[bool, object]] = []

    def buffers(keep: bool, args: tuple, use):  # type: ignore[no-untyped-def]
        x, w, _ = args
        seen.append((keep, use))
        return use(x, w, 3.0)  # the "buffer": the constant the kernel gets

    op = KernelOp(
        "Buffered", kernel=_kernel, reference=_reference, vmap=lead, buffers=buffers, module=__name__, doc="t"
    )
    x = torch.randn(5, dtype=F64)
    CALLS.clear()
    out = op.call(x, None, 0.0)
    assert seen == [(False, op.run)] and CALLS == ["kernel"] and out.grad_fn is None
    torch.testing.assert_close(out, _reference(x, None, 3.0), rtol=0, atol=0)
    seen.clear()
    xg = x.clone().requires_grad_()
    out = op.call(xg, None, 0.0)
    assert seen == [(True, op.apply)] and type(out.grad_fn).__name__ == "BufferedBackward"
    (g,) = torch.autograd.grad(out.sum(), xg)
    torch.testing.assert_close(g, 3.0 * torch.cos(x))
    with torch.no_grad():
        seen.clear()
        op.call(xg, None, 0.0)  # no graph under no_grad
        assert seen == [(False, op.run)]
    seen.clear()
    jac = torch.func.jacrev(lambda y: op.call(y, None, 0.0))(x)  # a transform: the Function's rules
    assert seen and all(keep for keep, _ in seen)
    torch.testing.assert_close(jac, torch.diag(3.0 * torch.cos(x)))
    seen.clear()
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
        tangent = torch.autograd.forward_ad.unpack_dual(op.call(dual, None, 0.0)).tangent
    assert seen == [(True, op.apply)]
    torch.testing.assert_close(tangent, 3.0 * torch.cos(x))


def test_call_bound_routes_by_the_gradient_test_alone() -> None:
    """``call_bound`` (inputs that passed `gate.bound_inputs`): the kernel alone, buffers borrowed,
    where no gradient is kept (also with ``None`` inputs and under ``no_grad``); the Function, buffers
    kept, where one is."""
    seen: list[tuple[bool, object]] = []

    def buffers(keep: bool, args: tuple, use):  # type: ignore[no-untyped-def]
        seen.append((keep, use))
        return use(*args)

    op = KernelOp("Bound", kernel=_kernel, reference=_reference, buffers=buffers, module=__name__, doc="t")
    x = torch.randn(4, dtype=F64)
    out = op.call_bound(x, None, 2.0)
    assert seen == [(False, op.run)] and out.grad_fn is None
    xg = x.clone().requires_grad_()
    out = op.call_bound(x, xg, 2.0)  # the gradient kept through the second input
    assert seen[1:] == [(True, op.apply)] and type(out.grad_fn).__name__ == "BoundBackward"
    (g,) = torch.autograd.grad(out.sum(), xg)
    torch.testing.assert_close(g, 2.0 * torch.sin(x))
    with torch.no_grad():
        op.call_bound(xg, None, 2.0)
    assert seen[2:] == [(False, op.run)]


def test_call_with_transforms_reference_runs_the_reference_under_transforms() -> None:
    """``transforms="reference"``: under a ``torch.func`` transform or a forward-mode tangent `call`
    runs the reference itself (no kernel, no Function); the other routes as before."""
    op = KernelOp(
        "Direct", kernel=_kernel, reference=_reference, transforms="reference", module=__name__, doc="t"
    )
    x = torch.randn(4, dtype=F64)
    CALLS.clear()
    jac = torch.func.jacrev(lambda y: op.call(y, None, 2.0))(x)
    torch.testing.assert_close(jac, torch.diag(2.0 * torch.cos(x)))
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
        tangent = torch.autograd.forward_ad.unpack_dual(op.call(dual, None, 2.0)).tangent
    torch.testing.assert_close(tangent, 2.0 * torch.cos(x))
    assert CALLS == []  # the reference both times
    out = op.call(x.requires_grad_(), None, 2.0)
    assert CALLS == ["kernel"] and type(out.grad_fn).__name__ == "DirectBackward"
    for bad in ({"transforms": "torch"}, {"transforms": "reference", "reference": None}):
        kwargs = {"kernel": _kernel, "reference": _reference, "module": __name__, "doc": "t", **bad}
        with pytest.raises(TypeError, match="transforms must be 'function' or 'reference'"):
            KernelOp("Bad", **kwargs)  # type: ignore[arg-type]


def _take(x: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    return x.index_select(-1, index)


def _put(g: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    return g.new_zeros((*g.shape[:-1], n)).index_copy(-1, index, g)


TAKE, PUT = linear_pair(("Take", "Put"), _take, _put, module=__name__)


def test_a_linear_pair_is_each_others_backward_to_every_order() -> None:
    index = torch.tensor([3, 0, 2])
    x = torch.randn(2, 5, dtype=F64, requires_grad=True)
    y = torch.randn(2, 3, dtype=F64, requires_grad=True)
    for fn, t in ((lambda v: TAKE.apply(v, index, 5), x), (lambda v: PUT.apply(v, index, 5), y)):
        assert torch.autograd.gradcheck(fn, (t,), check_forward_ad=True)
        assert torch.autograd.gradgradcheck(fn, (t,))
    (gx,) = torch.autograd.grad((TAKE.apply(x, index, 5) * y).sum(), x, create_graph=True)
    assert type(gx.grad_fn).__name__ == "PutBackward"  # the adjoint of y, recorded
    torch.testing.assert_close(gx, _put(y, index, 5))
    # <A x, y> == <x, A^T y>
    torch.testing.assert_close((TAKE.apply(x, index, 5) * y).sum(), (x * PUT.apply(y, index, 5)).sum())
    torch.testing.assert_close(vmap(lambda v: TAKE.apply(v, index, 5))(x), x[:, index])
