"""The global pose on the fused engine's side: the torch reference of ``x -> R x + t`` per seeded
component, and the pose of coordinates in one kernel pass.

`reference` is what [`batched_nerf.apply_pose`][batched_nerf.apply_pose] computes for several
components (NaN for an improper rotation, anchored atoms unchanged); the fused
build applies it wherever its own kernels do not build in the pose
(`build.build_fused`: Triton, the reference engines) and differentiates
it for second order. On the CPU the builder's kernels place each seeded
component directly in its pose (`cpu.samples`, `cpu.blocks`).
`extract` is the inverse, for calls with nothing to differentiate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._geometry import cross, dot
from ...runtime import gate
from ..backends import available, require
from .arrays import numpy_view

__all__ = ["extract", "reference"]


def reference(x: Tensor, rot: Tensor, tr: Tensor, slot: Tensor) -> Tensor:
    """``R x + t`` per atom in torch (what [`batched_nerf.apply_pose`][batched_nerf.apply_pose] computes for
    several
    components): ``x`` ``(..., N, 3)``, ``rot`` ``(..., S, 3, 3)`` and ``tr`` ``(..., S, 3)`` of one
    batch shape, ``slot`` ``(N,)`` long (``S``: anchored atom, unchanged) -> ``(..., N, 3)``; NaN
    for the atoms of a component with ``det R < 0``."""
    lead = rot.shape[:-3]
    proper = dot(rot[..., 0], cross(rot[..., 1], rot[..., 2])) >= 0  # (..., S): det as a triple product
    eye = torch.eye(3, dtype=rot.dtype, device=rot.device).expand(*lead, 1, 3, 3)
    r_atom = torch.cat((rot, eye), -3).index_select(-3, slot)  # (..., N, 3, 3)
    t_atom = torch.cat((tr, tr.new_zeros(()).expand(*lead, 1, 3)), -2).index_select(-2, slot)
    ok = torch.cat((proper, proper.new_ones(()).expand(*lead, 1)), -1).index_select(-1, slot)
    out = (r_atom * x.unsqueeze(-2)).sum(-1) + t_atom
    return torch.where(ok.unsqueeze(-1), out, out.new_full((), float("nan")))


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
