"""The one gate: may a compiled kernel serve a call, and how, decided from the call's tensors only.

Every kernel call of the package asks the same questions, here and nowhere else:

* `kernel_inputs`: can the kernels take these tensors at all (float32/float64 tensors of one
  dtype on the backend's device type, no ``torch.compile`` trace: the kernels are opaque to it)?
* `route`: how: `REFERENCE` (a ``torch.func`` wrapper or a forward-mode tangent on an input, a
  ``torch.compile`` trace, or a torch release on which wrappers cannot be told apart: the torch
  reference runs, which every transform and every order of derivative understands),
  `FUNCTION` (a gradient to keep: the kernel inside its ``autograd.Function``, whose backward
  is a kernel too and whose double backward is the reference's graph) or `PLAIN` (nothing to
  differentiate: the kernel on the arrays, no graph);
* `transformed`, `forward_ad_active`, `wrapped`: the facts `route` reads, for the callers that
  must also refuse constants inside a transform (a view of an unwrapped constant comes back
  wrapped there) or any open forward-mode level.

The private torch probes behind them live in `runtime.torch_compat` (with the releases they were
checked on). Whether the backend itself is installed, or has failed on a GPU, is the engines'
question (`batched_nerf.engines.backends`); which engine ``method="auto"`` picks is
`batched_nerf.engines.dispatch`'s.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .torch_compat import IS_FUNCTORCH_WRAPPED, TRANSFORMS_ACTIVE, forward_ad_level

__all__ = [
    "FLOATS",
    "FUNCTION",
    "PLAIN",
    "REFERENCE",
    "bound_inputs",
    "device_type",
    "forward_ad_active",
    "keeps_grad",
    "kernel_inputs",
    "plain",
    "route",
    "transformed",
    "wrapped",
]

#: The dtypes the kernels take.
FLOATS = (torch.float32, torch.float64)
#: `route`'s answers.
PLAIN, FUNCTION, REFERENCE = "plain", "function", "reference"


def device_type(t: Tensor) -> str:
    """``t.device.type``, at the cost of ``t.is_cpu`` for CPU tensors (10x cheaper: every kernel
    call asks)."""
    return "cpu" if t.is_cpu else t.device.type


def kernel_inputs(*tensors: Tensor, device_type: str = "cpu") -> bool:
    """Whether the kernels of ``device_type`` can take ``tensors``: float32/float64 of one dtype, all on
    that device type, and no ``torch.compile`` trace."""
    dtype = tensors[0].dtype
    if dtype not in FLOATS or torch.compiler.is_compiling():
        return False
    cpu = device_type == "cpu"
    for t in tensors:  # a loop, not all(...): this runs on every call; is_cpu: 10x faster than device.type
        if t.dtype != dtype or not (t.is_cpu if cpu else t.device.type == device_type):
            return False
    return True


def bound_inputs(*tensors: Tensor) -> bool:
    """Whether a bound build (numpy arrays into the CPU kernels, a `KernelOp` without forward mode)
    may take ``tensors``: `kernel_inputs` on the CPU, and no ``torch.func`` transform or forward-mode
    level active (those take the general path, which serves them)."""
    return kernel_inputs(*tensors) and not transformed() and not forward_ad_active()


def wrapped(*tensors: Tensor) -> bool:
    """A ``torch.func`` wrapper (grad, vmap, jvp levels) on one of ``tensors``; True where this torch
    cannot tell."""
    return IS_FUNCTORCH_WRAPPED is None or any(IS_FUNCTORCH_WRAPPED(t) for t in tensors)


def transformed() -> bool:
    """A ``torch.func`` transform encloses the call (True where this torch cannot tell)."""
    return TRANSFORMS_ACTIVE is None or TRANSFORMS_ACTIVE()


def forward_ad_active() -> bool:
    """A ``torch.autograd.forward_ad`` level is open (``dual_level``, ``jvp`` of the older API)."""
    return forward_ad_level() >= 0


def route(*tensors: Tensor) -> str:
    """`REFERENCE`, `FUNCTION` or `PLAIN` for a kernel call on ``tensors`` (module docstring).

    Example:
        >>> import torch
        >>> from batched_nerf.runtime.gate import route
        >>> x = torch.ones(3)
        >>> route(x), route(x.requires_grad_())
        ('plain', 'function')
        >>> torch.func.grad(lambda y: torch.tensor(len(route(y))) * y.sum())(torch.ones(2)).tolist()
        [9.0, 9.0]
    """
    if IS_FUNCTORCH_WRAPPED is None or torch.compiler.is_compiling():
        return REFERENCE
    # a tangent lives only while its forward-mode level is open (closing it clears every tangent):
    # with none open, no tensor is asked (unpack_dual costs 0.6 us a tensor)
    dual = forward_ad_active()
    unpack = torch.autograd.forward_ad.unpack_dual
    for t in tensors:  # one loop (this runs on every kernel call)
        if IS_FUNCTORCH_WRAPPED(t) or (dual and unpack(t).tangent is not None):
            return REFERENCE
    if torch.is_grad_enabled():
        for t in tensors:
            if t.requires_grad:
                return FUNCTION
    return PLAIN


def keeps_grad(*tensors: Tensor | None) -> bool:
    """Whether a gradient is kept through one of ``tensors`` (None: an input not given). On inputs
    that passed `bound_inputs` (no transform, forward-mode level or trace) this alone routes a call:
    `FUNCTION` where it holds, else `PLAIN`."""
    if torch.is_grad_enabled():
        for t in tensors:  # a loop, not any(...): this runs on every call
            if t is not None and t.requires_grad:
                return True
    return False


def plain(*tensors: Tensor) -> bool:
    """``route(*tensors) == PLAIN``, at the cost of the gradient test alone where a gradient is kept
    (the callers whose Function serves both other routes ask this, on every call)."""
    return not keeps_grad(*tensors) and route(*tensors) == PLAIN
