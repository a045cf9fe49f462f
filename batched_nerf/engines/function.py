"""``torch.autograd.Function`` with a cheaper ``apply``, the base of the engines' Functions.

torch's ``Function.apply`` binds its arguments to ``forward``'s signature with
``inspect.signature`` on every call where ``setup_context`` is defined (to fill
in default arguments): 20-40 us per call on the benchmark machine, more than a
fused kernel takes on small inputs. The engines' Functions take positional
arguments only, without defaults, so where torch's ``apply`` is Python (torch
2.3-2.13) :meth:`Function.apply` goes straight to torch's C implementation
outside ``torch.func`` transforms, as torch's own ``apply`` then does after
binding; inside a transform it is torch's ``apply``. Where torch's ``apply`` is
C and binds there (torch 2.14), each ``forward`` carries its signature
(``__signature__``), so ``inspect.signature`` returns at once (8 of ~13 us).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

try:  # what torch's apply does to the arguments before its C implementation
    from torch._functorch.utils import unwrap_dead_wrappers as _unwrap
except ImportError:  # pragma: no cover - another torch layout: torch's own apply throughout
    _unwrap = None

_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)

__all__ = ["Function", "save"]


class Function(torch.autograd.Function):
    """A ``torch.autograd.Function`` (``forward`` + ``setup_context`` style, positional arguments
    without defaults) whose ``apply`` skips the per-call signature binding."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get("forward")
        if isinstance(forward, staticmethod):
            forward.__func__.__signature__ = inspect.signature(forward.__func__)  # type: ignore[attr-defined]

    @classmethod
    def apply(cls, *args: Any) -> Any:  # type: ignore[override]
        if _unwrap is None or _TRANSFORMS_ACTIVE is None or _TRANSFORMS_ACTIVE():
            return super().apply(*args)
        return super(torch.autograd.Function, cls).apply(*_unwrap(args))  # type: ignore[misc]


def save(ctx: Any, *tensors: Any) -> None:
    """Keep ``tensors`` for the backward (``ctx.saved_tensors``) and for forward mode (``jvp``)."""
    ctx.save_for_backward(*tensors)
    ctx.save_for_forward(*tensors)
