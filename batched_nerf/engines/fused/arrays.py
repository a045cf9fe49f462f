"""Tensors handed to the CPU kernels: numpy views, and whether a call may skip autograd.

Shared by the builder (`build`), the pose (`pose`) and their
``torch.autograd.Function``\\ s; nothing here depends on an engine.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..levels import _IS_FUNCTORCH_WRAPPED

__all__ = ["front", "numpy_view", "plain", "unwrapped"]


def numpy_view(t: Tensor) -> np.ndarray:
    """``t`` as a C-contiguous numpy array (a view where ``t`` is contiguous; detached)."""
    return t.detach().contiguous().numpy()


def front(x: Tensor | None, dim: int | None, size: int) -> Tensor | None:
    """``x`` with its vmapped dimension first (expanded when unbatched), the first two dimensions
    flattened into one, contiguous (no aliasing rows); None stays None (a pose not given)."""
    if x is None:
        return None
    x = x.unsqueeze(0).expand(size, *x.shape) if dim is None else x.movedim(dim, 0)
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()


def unwrapped(*tensors: Tensor) -> bool:
    """No torch.func wrapper or forward-mode tangent on any of ``tensors`` (False where this torch
    cannot tell wrapped tensors apart)."""
    if _IS_FUNCTORCH_WRAPPED is None:
        return False
    return not any(
        _IS_FUNCTORCH_WRAPPED(t) or torch.autograd.forward_ad.unpack_dual(t).tangent is not None
        for t in tensors
    )


def plain(*tensors: Tensor) -> bool:
    """No gradient, tangent or torch.func wrapper to serve: the kernel can run directly."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return not grad and unwrapped(*tensors)
