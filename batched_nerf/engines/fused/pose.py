"""The global pose after a fused build: ``x -> R x + t`` per seeded component, as one kernel pass.

:func:`move` is what :func:`batched_nerf.apply_pose` computes (same values, same
NaN for an improper rotation, anchored atoms unchanged) in one numba loop
(:mod:`.cpu.pose`) instead of a batched ``3 x 3`` product, a broadcast add and
a ``where`` over ``(B, N, 3)`` arrays. Derivatives follow the builder's
pattern (:mod:`.build`): :class:`FusedPose` runs the kernel, its backward is
:class:`FusedPoseVJP` (the vjp kernel: ``R^T g`` per atom, ``sum g x^T`` and
``sum g`` per component), and the backward of that, forward mode and
everything beyond are the torch graph of :func:`reference`, so
``gradgradcheck``, ``create_graph=True`` and ``torch.func`` stay exact.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._geometry import cross, dot
from ..backends import available, require
from ..function import Function, save
from .build import _front, _np, _plain

__all__ = ["FusedPose", "FusedPoseVJP", "extract", "kernel_runs", "move", "reference"]


def reference(x: Tensor, rot: Tensor, tr: Tensor, slot: Tensor) -> Tensor:
    """``R x + t`` per atom in torch (what :func:`batched_nerf.apply_pose` computes for several
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


def _reference_vjp(x: Tensor, rot: Tensor, g: Tensor, slot: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    tr = rot.new_zeros(rot.shape[:2] + (3,))
    _, vjp = torch.func.vjp(lambda *a: reference(*a, slot), x, rot, tr)
    return vjp(g)


def _kernel() -> Any:
    return require("cpu").pose


def _move_kernel(x: Tensor, rot: Tensor, tr: Tensor, slot: Tensor, inplace: bool = False) -> Tensor:
    xs = _np(x)
    out = _kernel().move(xs, _np(rot), _np(tr), slot.numpy(), xs if inplace else None)
    return x if inplace else torch.from_numpy(out)


class FusedPose(Function):
    """``(B, N, 3)`` coordinates, ``(B, S, 3, 3)`` rotations, ``(B, S, 3)`` translations -> posed."""

    @staticmethod
    def forward(x: Tensor, rot: Tensor, tr: Tensor, slot: Tensor) -> Tensor:  # type: ignore[override]
        return _move_kernel(x, rot, tr, slot)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        *tensors, ctx.slot = inputs
        save(ctx, *tensors)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, rot, _ = ctx.saved_tensors
        return (*FusedPoseVJP.apply(x, rot, g, ctx.slot), None)

    @staticmethod
    def jvp(ctx: Any, tx: Any, trot: Any, ttr: Any, _: Any) -> Tensor:
        primals = ctx.saved_tensors
        tangents = tuple(torch.zeros_like(p) if t is None else t for p, t in zip(primals, (tx, trot, ttr)))
        return torch.func.jvp(lambda *a: reference(*a, ctx.slot), primals, tangents)[1]

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], *args: Any):  # type: ignore[no-untyped-def]
        *tensors, slot = args
        size = info.batch_size
        out = FusedPose.apply(*(_front(x, dim, size) for x, dim in zip(tensors, in_dims[:3])), slot)
        return out.reshape(size, out.shape[0] // size, *out.shape[1:]), 0


class FusedPoseVJP(Function):
    """The vjp kernel: ``(gx, grot, gtr)`` of ``sum(g * FusedPose(x, rot, tr))``; differentiable."""

    @staticmethod
    def forward(x: Tensor, rot: Tensor, g: Tensor, slot: Tensor) -> tuple[Tensor, ...]:  # type: ignore[override]
        gx, grot, gtr = _kernel().move_vjp(_np(g.to(x.dtype)), _np(x), _np(rot), slot.numpy())
        return torch.from_numpy(gx), torch.from_numpy(grot).to(x.dtype), torch.from_numpy(gtr).to(x.dtype)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        *tensors, ctx.slot = inputs
        save(ctx, *tensors)

    @staticmethod
    def backward(ctx: Any, *gg: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        inputs = ctx.saved_tensors
        _, vjp = torch.func.vjp(lambda *a: _reference_vjp(*a, ctx.slot), *inputs)
        return (*vjp(tuple(gg)), None)

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> tuple[Tensor, ...]:
        primals = ctx.saved_tensors
        tangents = tuple(torch.zeros_like(p) if t is None else t for p, t in zip(primals, tangents[:3]))
        return torch.func.jvp(lambda *a: _reference_vjp(*a, ctx.slot), primals, tangents)[1]

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], *args: Any):  # type: ignore[no-untyped-def]
        *tensors, slot = args
        size = info.batch_size
        out = FusedPoseVJP.apply(*(_front(x, dim, size) for x, dim in zip(tensors, in_dims[:3])), slot)
        return tuple(o.reshape(size, o.shape[0] // size, *o.shape[1:]) for o in out), (0, 0, 0)


def kernel_runs(x: Tensor) -> bool:
    """Whether the pose kernels can take ``x``: a CPU float32/float64 tensor, no ``torch.compile``
    tracing (numba must also be installed: :func:`.backends.available`)."""
    cpu = x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
    return cpu and not torch.compiler.is_compiling()


def move(x: Tensor, rot: Tensor, tr: Tensor, slot: Tensor, inplace: bool = False) -> Tensor:
    """``R x + t`` per seeded component (shapes of :func:`reference`; CPU float32/float64).

    The kernel directly where nothing is to be differentiated, else :class:`FusedPose`.
    ``inplace``: ``x`` is a fresh array nobody else holds (a build's output); where the kernel
    runs directly and ``x`` is contiguous, it is overwritten and returned (no new buffer, whose
    first touch costs page faults: AdK 1-40 with hydrogens x 9,800 frames, with pose / without
    1.18-1.21x -> 1.07-1.11x).
    """
    if _plain(x, rot, tr):
        return _move_kernel(x, rot, tr, slot, inplace and x.is_contiguous())
    return FusedPose.apply(x, rot, tr, slot)


def extract(x: Tensor, seeds: Any, has2: Any, has3: Any, eps: float) -> tuple[Tensor, Tensor] | None:
    """Pose ``(rot (..., S, 3, 3), tr (..., S, 3))`` of ``x`` ``(..., N, 3)`` in one kernel pass, or None.

    None (the caller takes the torch operations) unless the kernel can serve
    the call exactly: a CPU float32/float64 tensor with nothing to
    differentiate (no gradient, tangent or ``torch.func`` wrapper), numba
    installed, not under ``torch.compile``. Arguments: see :func:`.cpu.pose.extract`.
    """
    if not kernel_runs(x) or not available("cpu") or not _plain(x):
        return None
    lead, n = x.shape[:-2], x.shape[-2]
    flat = _np(x.reshape(-1, n, 3))
    rot, tr = _kernel().extract(flat, seeds, has2, has3, eps)
    s = rot.shape[1]
    return torch.from_numpy(rot).reshape(*lead, s, 3, 3), torch.from_numpy(tr).reshape(*lead, s, 3)
