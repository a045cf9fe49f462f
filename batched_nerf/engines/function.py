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
from typing import Any, Callable

import torch
from torch import Tensor

from ..runtime import gate
from ..runtime.gate import transformed
from ..runtime.torch_compat import UNWRAP_DEAD_WRAPPERS as _unwrap
from ..runtime.torch_compat import forward_ad_level, forward_grad_on
from .gpu_policy import guarded

__all__ = ["Function", "KernelOp", "fold", "jvp", "lead", "linear_pair", "save", "with_none"]


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


_reference_jvp = jvp  # (KernelOp's own ``jvp`` argument hides the name)


def save(ctx: Any, *tensors: Any) -> None:
    """Keep ``tensors`` for the backward (``ctx.saved_tensors``) and for forward mode (``jvp``)."""
    ctx.save_for_backward(*tensors)
    ctx.save_for_forward(*tensors)


def linear_pair(
    names: tuple[str, str], forward: Callable[..., Tensor], adjoint: Callable[..., Tensor], *, module: str
) -> tuple[type[Function], type[Function]]:
    """Functions named ``names`` for a linear map ``forward(x, *consts)`` and
    its adjoint ``adjoint(g, *consts)`` (the same constants: index arrays, sizes, layouts).

    Each one's backward is the other and its ``jvp`` is itself (the map is linear), so every order of
    derivative, forward mode and ``vmap`` (generated) stay in these two maps; a plain op's
    autograd would hand back strided views or a differently ordered scatter instead.
    """
    pair: list[type[Function]] = []

    def function(fn: Callable[..., Tensor], other: int, cls_name: str) -> type[Function]:
        def forward_(x: Tensor, *consts: Any) -> Tensor:
            return fn(x, *consts)

        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
            ctx.consts = inputs[1:]

        def backward(ctx: Any, g: Tensor) -> tuple[Any, ...]:
            return (pair[other].apply(g, *ctx.consts), *(None,) * len(ctx.consts))

        def jvp(ctx: Any, t: Tensor, *_: Any) -> Tensor:
            return fn(t, *ctx.consts)

        attrs = {
            "__doc__": f"``{fn.__name__}`` (linear); its backward is ``{names[other]}``.",
            "__module__": module,
            "__qualname__": cls_name,
            "generate_vmap_rule": True,
            "forward": staticmethod(forward_),
            "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward),
            "jvp": staticmethod(jvp),
        }
        return type(cls_name, (Function,), attrs)

    pair += [function(forward, 1, names[0]), function(adjoint, 0, names[1])]
    return pair[0], pair[1]


# ---------------------------------------------------------------------------- kernel ops
def with_none(values: Any, like: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` (one per non-None entry of ``like``) placed back among ``like``'s Nones."""
    it = iter(values)
    return tuple(None if x is None else next(it) for x in like)


class KernelOp:
    """A compiled kernel declared with its differentiable torch reference; the ``autograd.Function``
    (`Function`, so with the eager fast path) made from them in one place.

    Arguments of every call: tensors first (some may be None: an input not given), then ``consts``
    non-tensor arguments (plans, kept arrays). ``kernel(*tensors, *consts)`` computes the outputs
    from plain tensors; ``reference(*tensors, *consts)`` computes the same outputs in differentiable
    torch (the oracle, and every derivative the op does not declare a kernel for).

    * backward: ``vjp(primals, grads, *consts)`` -> a gradient per tensor (None where not given),
      usually another op's ``apply`` (a kernel, itself differentiable); without it, the vjp of
      ``reference`` through ``torch.func.vjp``.
    * forward mode: ``jvp(primals, tangents, *consts)``; without it, the ``jvp`` of ``reference``
      (missing tangents zero, each primal in its own memory: a dual tensor of an expanded view
      cannot be made).
    * ``vmap``: a rule ``(op, info, in_dims, tensors, consts) -> (outputs, out_dims)``, `fold`
      (kernels taking a ``(B, ...)`` batch: the vmapped dimension folded into it) or `lead`
      (kernels taking any leading shape: the vmapped dimension moved first).
    * the GPU fallback: with ``fallback(*consts)`` (whether the call may fall back: ``method="auto"``),
      every kernel call, with or without a graph (`run`), goes through `gpu_policy.guarded`: a
      kernel that fails to compile or launch (`KernelError`) gives ``reference``'s outputs (warning
      once) where the call may fall back, and the error where it may not.
    * the gate and the work buffers: `call` routes a call by the one gate (`gate.route`): nothing to
      differentiate runs `run` (no graph), a gradient to keep `apply` (the Function), and a
      ``torch.func`` transform (around the call or on an input) or a forward-mode tangent `apply`
      too (the rules above serve it) or, with ``transforms="reference"``, the reference itself.
      ``buffers(keep, args, use)`` declares the work buffers: it returns ``use(*args')``, ``args'``
      the call's arguments with its buffers among the constants, borrowed for the length of the
      call where ``keep`` is False (`run`) or kept with the graph where it is True (`apply`).

    An op without ``reference`` or ``jvp`` has no forward mode, and one without ``vmap`` no vmap
    rule (torch says so when asked).
    """

    def __init__(
        self,
        name: str,
        *,
        kernel: Callable[..., Any],
        reference: Callable[..., Any] | None = None,
        consts: int = 1,
        vjp: Callable[..., tuple[Any, ...]] | None = None,
        jvp: Callable[..., Any] | None = None,
        vmap: Callable[..., Any] | None = None,
        fallback: Callable[..., bool] | None = None,
        buffers: Callable[..., Any] | None = None,
        transforms: str = "function",
        module: str,
        doc: str,
    ) -> None:
        self.name, self.kernel, self.reference, self.consts = name, kernel, reference, consts
        if fallback is not None and reference is None:
            raise TypeError(f"KernelOp {name}: a fallback needs a reference to fall back to")
        if transforms not in ("function", "reference") or (transforms == "reference" and reference is None):
            raise TypeError(
                f"KernelOp {name}: transforms must be 'function' or 'reference' (with a reference), "
                f"got {transforms!r}"
            )
        direct = transforms == "reference"
        #: ``run(*tensors, *consts)``: the op's outputs without a graph (the kernel, GPU fallback applied)
        self.run = run = _guarded_run(kernel, reference, fallback, consts)
        #: the ``autograd.Function`` of this op (a graph's nodes read ``<name>Backward``)
        self.function: type[Function] = _function(self, run, vjp, jvp, vmap, module, doc)
        #: ``apply(*tensors, *consts)``: the op, recorded for autograd where a gradient is kept
        self.apply = apply = self.function.apply
        #: ``call(*tensors, *consts)``: the op routed by the gate, with its work buffers (class docstring)
        self.call = _routed(run, apply, reference if direct else None, consts, buffers)
        #: ``call_bound(*tensors, *consts)``: `call` for tensors that passed `gate.bound_inputs` (no
        #: transform, forward-mode level or trace), which the gradient test alone routes
        self.call_bound = _bound_routed(run, apply, consts, buffers)

    def __repr__(self) -> str:
        return f"KernelOp({self.name})"


def _guarded_run(
    kernel: Callable[..., Any],
    reference: Callable[..., Any] | None,
    fallback: Callable[..., bool] | None,
    consts: int,
) -> Callable[..., Any]:
    """`KernelOp.run`: the kernel itself where no GPU fallback is declared (no wrapper on every call),
    else the kernel through `gpu_policy.guarded`."""
    if fallback is None:
        return kernel

    def run(*args: Any) -> Any:
        first = next(t for t in args if isinstance(t, Tensor))
        return guarded(
            gate.device_type(first),
            fallback(*args[len(args) - consts :]),
            lambda: kernel(*args),
            lambda: reference(*args),  # type: ignore[misc]
        )

    return run


def _function(
    op: KernelOp,
    run: Callable[..., Any],
    vjp: Callable[..., tuple[Any, ...]] | None,
    jvp: Callable[..., Any] | None,
    vmap: Callable[..., Any] | None,
    module: str,
    doc: str,
) -> type[Function]:
    """`KernelOp.function`: the ``autograd.Function`` of ``op`` (forward ``run``; the tensors saved for
    both modes; backward ``vjp`` or the reference's; forward mode ``jvp`` or the reference's;
    ``vmap``'s rule where given)."""
    reference, consts = op.reference, op.consts

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        k = len(inputs) - consts
        given = [t for t in inputs[:k] if t is not None]
        ctx.consts = inputs[k:]
        # which inputs were given: None where all were (the common case, on every call)
        ctx.given = None if len(given) == k else tuple(t is not None for t in inputs[:k])
        ctx.save_for_backward(*given)
        ctx.save_for_forward(*given)

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        primals = _primals(ctx)
        if vjp is not None:
            out = vjp(primals, grads, *ctx.consts)
        else:
            _, pull = torch.func.vjp(
                lambda *x: reference(*with_none(x, primals), *ctx.consts),  # type: ignore[misc]
                *(p for p in primals if p is not None),
            )
            out = with_none(pull(grads if len(grads) > 1 else grads[0]), primals)
        return (*out, *(None,) * consts)

    def forward_mode(ctx: Any, *tangents: Any) -> Any:
        primals = _primals(ctx)
        tangents = tangents[: len(primals)]
        if jvp is not None:
            return jvp(primals, tangents, *ctx.consts)
        given = tuple(p.contiguous() for p in primals if p is not None)
        dense = tuple(
            (torch.zeros_like(p) if t is None else t).contiguous()
            for p, t in zip(primals, tangents)
            if p is not None
        )
        return _reference_jvp(lambda *x: reference(*with_none(x, primals), *ctx.consts), given, dense)  # type: ignore[misc]

    def vmap_rule(info: Any, in_dims: tuple[Any, ...], *args: Any) -> Any:
        k = len(args) - consts
        return vmap(op, info, in_dims[:k], args[:k], args[k:])  # type: ignore[misc]

    attrs: dict[str, Any] = {
        "__doc__": doc,
        "__module__": module,
        "__qualname__": op.name,
        "forward": staticmethod(run),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
    }
    if reference is not None or jvp is not None:
        attrs["jvp"] = staticmethod(forward_mode)
    if vmap is not None:
        attrs["vmap"] = staticmethod(vmap_rule)
    return type(op.name, (Function,), attrs)


def _routed(
    run: Callable[..., Any],
    apply: Callable[..., Any],
    reference: Callable[..., Any] | None,
    consts: int,
    buffers: Callable[..., Any] | None,
) -> Callable[..., Any]:
    """`KernelOp.call`: ``run`` or ``apply`` as the gate routes the call, through ``buffers`` where
    declared; ``reference`` (an op declared ``transforms="reference"``) serves the reference route."""

    def call(*args: Any) -> Any:
        tensors = [t for t in args[: len(args) - consts] if t is not None]
        if reference is not None:  # the reference under transforms: the whole route
            route = gate.route(*tensors)
            if route == gate.REFERENCE:
                return reference(*args)
            plain = route == gate.PLAIN
        else:  # the Function serves both other routes: the gradient test alone where one is kept;
            # inside a transform the Function too (torch's apply sees to tensors it wrapped)
            plain = gate.plain(*tensors) and not transformed()
        use = run if plain else apply
        return use(*args) if buffers is None else buffers(not plain, args, use)

    return call


def _bound_routed(
    run: Callable[..., Any], apply: Callable[..., Any], consts: int, buffers: Callable[..., Any] | None
) -> Callable[..., Any]:
    """`KernelOp.call_bound`: ``run`` or ``apply`` as the gradient test alone routes the call
    (`gate.keeps_grad`), through ``buffers`` where declared."""

    def call_bound(*args: Any) -> Any:
        # the grad mode first: no slice of the arguments under no_grad
        keep = torch.is_grad_enabled() and gate.keeps_grad(*args[: len(args) - consts])
        use = apply if keep else run
        return use(*args) if buffers is None else buffers(keep, args, use)

    return call_bound


def _primals(ctx: Any) -> tuple[Any, ...]:
    """A `KernelOp` call's saved tensors, with None where an input was not given."""
    if ctx.given is None:
        return ctx.saved_tensors
    return with_none(ctx.saved_tensors, tuple(True if g else None for g in ctx.given))


def fold(
    consts: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None,
) -> Callable[..., Any]:
    """A `KernelOp` ``vmap`` rule for kernels taking a ``(B, ...)`` batch: each tensor's vmapped
    dimension first (expanded where unbatched) and folded into its batch, every output unfolded
    back to ``(size, B, ...)``. ``consts``: the constants to run with instead (state kept for
    the unbatched shapes, made anew)."""

    def rule(
        op: KernelOp, info: Any, in_dims: tuple[Any, ...], tensors: tuple[Any, ...], cs: tuple[Any, ...]
    ) -> Any:
        size = info.batch_size
        folded = (_fold(x, dim, size) for x, dim in zip(tensors, in_dims))
        out = op.apply(*folded, *(cs if consts is None else consts(cs)))
        if isinstance(out, tuple):
            return tuple(o.reshape(size, o.shape[0] // size, *o.shape[1:]) for o in out), (0,) * len(out)
        return out.reshape(size, out.shape[0] // size, *out.shape[1:]), 0

    return rule


def _fold(x: Tensor | None, dim: int | None, size: int) -> Tensor | None:
    """``x`` with its vmapped dimension first (expanded when unbatched), the first two dimensions
    flattened into one, contiguous (no aliasing rows); None stays None (an input not given)."""
    if x is None:
        return None
    x = x.unsqueeze(0).expand(size, *x.shape) if dim is None else x.movedim(dim, 0)
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()


def lead(
    op: KernelOp, info: Any, in_dims: tuple[Any, ...], tensors: tuple[Any, ...], cs: tuple[Any, ...]
) -> Any:
    """A `KernelOp` ``vmap`` rule for kernels taking any leading shape: each tensor's vmapped
    dimension moved first (expanded where unbatched); every output batched along its first."""
    moved = (
        x.movedim(d, 0) if d is not None else x.expand(info.batch_size, *x.shape)
        for x, d in zip(tensors, in_dims)
    )
    out = op.apply(*moved, *cs)
    return out, ((0,) * len(out) if isinstance(out, tuple) else 0)
