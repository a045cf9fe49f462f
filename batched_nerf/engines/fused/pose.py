"""The pose of coordinates in one kernel pass, on the fused engine's side.

The pose itself, ``x -> R x + t`` per seeded component, is `batched_nerf._geometry.pose_atoms` in
torch (what the reference engines and the Triton backend apply after the build, and what second
order differentiates); the CPU builder's kernels place each seeded component directly in its pose
(`cpu.samples`, `cpu.blocks`). `extract` is the inverse, for calls with nothing to differentiate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...runtime import gate
from ..backends import available, require
from .arrays import numpy_view

__all__ = ["extract"]


def extract(x: Tensor, seeds: Any, has2: Any, has3: Any, eps: float) -> tuple[Tensor, Tensor] | None:
    """Pose ``(rot (..., S, 3, 3), tr (..., S, 3))`` of ``x`` ``(..., N, 3)`` in one kernel pass, or None.

    None (the caller takes the torch operations) unless the kernel can serve
    the call exactly: a CPU float32/float64 tensor with nothing to
    differentiate (no gradient, tangent or ``torch.func`` wrapper), numba
    installed, not under ``torch.compile``. Arguments: see `cpu.pose.extract`.
    """
    # inside a torch.func transform even a view of an unwrapped constant comes back wrapped, without
    # storage for numpy (jacrev of a function of other inputs over constant coordinates)
    if not gate.kernel_inputs(x) or not gate.plain(x) or gate.transformed() or not available("cpu"):
        return None
    lead, n = x.shape[:-2], x.shape[-2]
    flat = numpy_view(x.reshape(-1, n, 3))
    rot, tr = require("cpu").pose.extract(flat, seeds, has2, has3, eps)
    s = rot.shape[1]
    return torch.from_numpy(rot).reshape(*lead, s, 3, 3), torch.from_numpy(tr).reshape(*lead, s, 3)
