"""Tensors handed to the CPU kernels: numpy views and the vmapped dimension moved first.

Shared by the builder (`build`), the pose (`pose`) and their
``torch.autograd.Function``\\ s; nothing here depends on an engine (whether a call may take a
kernel at all, and how, is `batched_nerf.runtime.gate`'s).
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

__all__ = ["front", "numpy_view"]


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
