"""Tensors handed to the CPU kernels: numpy views.

Shared by the builder (`build`), the pose (`pose`) and their
``torch.autograd.Function``\\ s; nothing here depends on an engine (whether a call may take a
kernel at all, and how, is `batched_nerf.runtime.gate`'s).
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

__all__ = ["numpy_view"]


def numpy_view(t: Tensor) -> np.ndarray:
    """``t`` as a C-contiguous numpy array (a view where ``t`` is contiguous; detached)."""
    return t.detach().contiguous().numpy()
