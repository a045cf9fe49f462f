"""``torch.autograd.Function`` with a cheaper ``apply``, the base of the engines' Functions.

torch's ``Function.apply`` binds its arguments to ``forward``'s signature with
``inspect.signature`` on every call where ``setup_context`` is defined (to fill
in default arguments), and on torch 2.14 does so inside its C ``apply``: 20-40 us
per call on the benchmark machine (50-100 us on a loaded one), more than a fused
kernel takes on small inputs, against 5-10 us for a Function in the older style
(``forward(ctx, ...)``, no ``setup_context``). The engines' Functions are written
in the ``setup_context`` style, which ``torch.func`` needs, with positional
arguments only, without defaults. Outside ``torch.func`` transforms
`Function.apply` runs them through a twin in the older style, made once per
class (`_eager_twin`: its ``forward`` calls the class's ``forward`` and then
its ``setup_context`` on the same ``ctx``, its ``backward`` and ``jvp`` are the
class's), which is what torch's own ``apply`` does after binding; inside a
transform it is torch's ``apply`` (each ``forward`` carries its signature,
``__signature__``, so that ``inspect.signature`` returns at once there).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..runtime.gate import transformed
from ..runtime.torch_compat import UNWRAP_DEAD_WRAPPERS as _unwrap
from ..runtime.torch_compat import forward_ad_level, forward_grad_on

__all__ = ["Function", "jvp", "save"]


def _eager_twin(impl: type) -> type:
    """A ``forward(ctx, *args)``-style Function doing what ``impl`` (``setup_context`` style) does."""

    def forward(ctx: Any, *args: Any) -> Any:
        out = impl.forward(*args)
        impl.setup_context(ctx, args, out)
        return out

    def backward(ctx: Any, *grads: Any) -> Any:
        return impl.backward(ctx, *grads)

    def jvp(ctx: Any, *tangents: Any) -> Any:
        return impl.jvp(ctx, *tangents)

    attrs = {"forward": staticmethod(forward), "backward": staticmethod(backward), "jvp": staticmethod(jvp)}
    # the same name, so that a graph's nodes read as the class's (``FusedBuildBackward``)
    return type(
        impl.__name__, (torch.autograd.Function,), {**attrs, "__qualname__": f"{impl.__qualname__}.eager"}
    )


class Function(torch.autograd.Function):
    """A ``torch.autograd.Function`` (``forward`` + ``setup_context`` style, positional arguments
    without defaults) whose ``apply`` skips the per-call signature binding outside ``torch.func``."""

    _eager: type

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get("forward")
        if isinstance(forward, staticmethod):
            forward.__func__.__signature__ = inspect.signature(forward.__func__)  # type: ignore[attr-defined]
        cls._eager = _eager_twin(cls)

    @classmethod
    def apply(cls, *args: Any) -> Any:  # type: ignore[override]
        if _unwrap is None or transformed():
            return super().apply(*args)
        return cls._eager.apply(*_unwrap(args))


def jvp(fn: Any, primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> Any:
    """Tangent(s) of ``fn`` at ``primals`` along ``tangents`` (tensors; ``fn`` returns a tensor or a
    tuple of them), for a Function's ``jvp`` through a differentiable reference.

    Under ``torch.func`` (``jvp``, ``jacfwd``, ``hessian``) this is `torch.func.jvp`, which nests.
    Under the older ``torch.autograd.forward_ad`` API a nested level is not allowed ("Nested forward
    mode AD is not supported"), so the reference runs on dual tensors of the level already open.
    """
    level = forward_ad_level()
    if level < 0 or transformed():
        return torch.func.jvp(fn, primals, tangents)[1]
    fw = torch.autograd.forward_ad
    with forward_grad_on():  # a Function's jvp runs with forward grad mode off
        # fresh copies: a primal saved for forward mode carries its own tangent at this level
        plain = (fw.unpack_dual(p, level=level).primal.clone() for p in primals)
        out = fn(*(fw.make_dual(p, t.clone(), level=level) for p, t in zip(plain, tangents)))

        def tangent(o: Any) -> Any:
            t = fw.unpack_dual(o, level=level).tangent
            return (
                torch.zeros_like(o).detach() if t is None else fw.unpack_dual(t, level=level).primal.clone()
            )

        return tuple(tangent(o) for o in out) if isinstance(out, tuple) else tangent(out)


def save(ctx: Any, *tensors: Any) -> None:
    """Keep ``tensors`` for the backward (``ctx.saved_tensors``) and for forward mode (``jvp``)."""
    ctx.save_for_backward(*tensors)
    ctx.save_for_forward(*tensors)
