"""Fused inverse map: numba (CPU) or Triton (CUDA) kernels behind twice-differentiable autograd Functions.

`internal_from_xyz` computes what `batched_nerf.engines.inverse.internal_from_xyz`
does (the same formulas and singular-geometry rules, see
`cpu.inverse`) in one compiled pass over every (sample, atom)
instead of a chain of torch kernels. Derivatives are kernels too:

* `FusedInternal`: ``xyz -> (bonds, angles, dihedrals)``; its backward is
* `FusedInternalVJP`: ``(xyz, g) -> J^T g``; its backward is
* `FusedInternalSecond`: ``(xyz, g, V) -> (sum_k g_k H_k V, J V)``, whose own
  backward (third order) runs the torch engine's graph through `torch.func`,
  so every order stays exact.

Forward mode: `FusedInternal`'s ``jvp`` is ``J t`` from the second-order
kernel; the ``jvp`` of the other two run the torch engine through
`torch.func.jvp` (``torch.func`` transforms only: plain
``torch.autograd.forward_ad`` cannot nest it).

Each Function has a ``vmap`` staticmethod (vmapped dims moved to the front; the
kernels take any leading shape), so ``torch.func.vmap``, ``jacrev``, ``jacfwd`` and
``hessian`` work. numba is optional (found through `backends`, like the
fused ``to_cartesian`` engine): `available` says whether the kernels can
run, `unavailable_reason` why not. On CUDA the forward and vjp are the
Triton kernels of `cuda.inverse`; the second-order term there is
the torch engine's graph.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..._geometry import batch_shape
from ...runtime import gate
from ...runtime.torch_compat import forward_mode_levels
from .. import backends
from ..function import KernelOp, lead
from ..inverse import InternalCoordinates, InversePlan
from ..inverse import internal_from_xyz as torch_internal_from_xyz
from . import workspace

__all__ = [
    "CALLS",
    "FUSED_INTERNAL",
    "FUSED_INTERNAL_SECOND",
    "FUSED_INTERNAL_VJP",
    "FusedInternal",
    "FusedInternalSecond",
    "FusedInternalVJP",
    "available",
    "internal_from_xyz",
    "unavailable_reason",
    "use_fused",
]

#: Kernel launches by kind (``"forward"``, ``"vjp"``, ``"second"``); tests read it to see the kernels ran.
CALLS = {"forward": 0, "vjp": 0, "second": 0}
#: ``to_internal(method=...)`` names.
METHODS = ("auto", "fused", "torch")
_DTYPES = (torch.float32, torch.float64)


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    if not backends.available("cpu"):
        return None, f"the CPU backend (numba) is not available; install it with {backends.INSTALL}"
    try:
        return importlib.import_module(f"{__package__}.cpu.inverse"), ""
    except ImportError as exc:  # pragma: no cover - numba imports but these kernels do not
        return None, f"the fused inverse kernels do not load ({exc}); install numba with {backends.INSTALL}"


def available() -> bool:
    """Whether the numba kernels can run here."""
    return _load()[0] is not None


#: Run CPU tensors through the Triton kernels (in Triton's interpreter): for tests only.
TRITON_ON_CPU = False


def _triton(xyz: Tensor) -> ModuleType | None:
    """The Triton kernels for ``xyz``'s device (CUDA, or the CPU under `TRITON_ON_CPU`), else None."""
    if xyz.is_cpu and not TRITON_ON_CPU:
        return None
    if not backends.available("cuda"):
        return None
    return importlib.import_module(f"{__package__}.cuda.inverse")


def unavailable_reason() -> str:
    """Why `available` is false (``""`` when it is true)."""
    return _load()[1]


def _kernels() -> ModuleType:
    mod, reason = _load()
    if mod is None:
        raise RuntimeError(reason)
    return mod


_forward_mode_levels = forward_mode_levels


def use_fused(method: str, xyz: Tensor) -> bool:
    """Whether ``to_internal(method=method)`` runs the fused kernels on ``xyz``.

    ``"auto"``: on the CPU, for float32/float64, when numba is installed, no
    ``torch.compile`` is tracing (the kernels are opaque to it) and at most one
    ``torch.func`` forward-mode transform encloses the call; ``"torch"``: never;
    ``"fused"``: always, except under ``torch.compile``, which traces the torch engine.

    Measured against the torch engine (float32, CPU; alanine dipeptide x 1 to 4096,
    chains 64 x 1024, 512 x 256, 4096 x 1, a 31,000-atom solvated protein x 1; a
    loaded 2-core machine, interleaved medians, ``benchmarks/fused_rows.py``), the
    kernels were faster on every row and pass of the last run (forward 1.1-25x,
    forward+backward 1.4-30x, committor pass 2-4.7x; earlier, noisier runs had
    one 0.9x, forward+backward of the single 4,096-atom chain), so ``"auto"``
    takes them wherever they run.

    Nested forward mode (``jacfwd(jacfwd(f))``, ``jvp`` of ``jvp``) through an
    autograd.Function silently drops the outer tangents in torch 2.13
    (pytorch/pytorch#197867), so it takes the torch engine.

    Raises:
        ValueError: an unknown ``method``, or ``"fused"`` for inputs it cannot take
            (not on the CPU, another dtype, numba missing, nested forward mode).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "torch" or torch.compiler.is_compiling():
        return False
    kind = gate.device_type(xyz)
    gpu = kind == "cuda" and backends.available("cuda")
    ok = (kind == "cpu" or gpu) and xyz.dtype in _DTYPES
    nested = _forward_mode_levels() > 1
    if method == "auto":
        if kind == "cuda":  # not after a Triton kernel failed here (gpu_policy.fall_back)
            return ok and not nested and backends.auto_may_use("cuda")
        return ok and not nested and available()
    if nested:
        raise ValueError(
            "method='fused' cannot run under nested forward-mode transforms (jacfwd(jacfwd(f)), jvp of "
            "jvp): torch drops the outer tangents of an autograd.Function's jvp (pytorch/pytorch#197867); "
            "use method='auto' or 'torch'"
        )
    if kind != "cpu" and not gpu:
        raise ValueError(
            f"method='fused' runs on the CPU (numba) and on CUDA (triton), got xyz on {xyz.device}"
        )
    if xyz.dtype not in _DTYPES:
        raise ValueError(f"method='fused' takes float32 or float64, got {xyz.dtype}")
    if not gpu and not available():
        raise ValueError(f"method='fused' needs numba: {unavailable_reason()}")
    return True


def internal_from_xyz(plan: InversePlan, xyz: Tensor, fallback: bool = False) -> InternalCoordinates:
    """``(..., N, 3) -> 3 x (..., N)`` with the fused kernels (CPU: numba; CUDA: Triton; float32/float64).

    ``fallback`` (``method="auto"``): a Triton compile or launch error warns once and
    this call, its derivatives and later ``auto`` calls on the device type take the
    torch engine (`gpu_policy`); without it the error is raised.

    Raises:
        KernelError: a Triton kernel failed to compile or launch, without ``fallback``.
    """
    return InternalCoordinates(*FUSED_INTERNAL.call(xyz, plan, fallback, None))


# --------------------------------------------------------------------------
# Kernel calls: flatten the leading shape, run, restore
# --------------------------------------------------------------------------


def _rows(t: Tensor, lead: tuple[int, ...], tail: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """``t`` broadcast to ``lead + tail``, as a contiguous ``(B, *tail)`` tensor of ``dtype`` (detached)."""
    full = t.detach().to(dtype).expand(*lead, *tail)
    return full.reshape(math.prod(lead), *tail).contiguous()


def _flat(t: Tensor, lead: tuple[int, ...], tail: tuple[int, ...], dtype: torch.dtype) -> Any:
    """`_rows` as a numpy array (CPU)."""
    return _rows(t, lead, tail, dtype).numpy()


def _backend(xyz: Tensor) -> ModuleType:
    """The inverse kernels of ``xyz``'s device: every backend's entries (``internal``, ``internal_vjp``)
    take the same arguments (`cpu.inverse`, `cuda.inverse`)."""
    gpu = _triton(xyz)
    return gpu if gpu is not None else _kernels()


def _forward(
    xyz: Tensor, plan: InversePlan, _fallback: bool, scratch: np.ndarray | None
) -> tuple[Tensor, Tensor, Tensor]:
    CALLS["forward"] += 1
    lead, n = tuple(xyz.shape[:-2]), xyz.shape[-2]
    kernels = _backend(xyz)
    x = _rows(xyz, lead, (n, 3), xyz.dtype)
    out = kernels.internal(plan, x, scratch) if xyz.is_cpu else kernels.internal(plan, x)
    return tuple(o.reshape(*lead, n) for o in out)  # type: ignore[return-value]


def _scratch(keep: bool, args: tuple[Any, ...], use: Callable[..., Any]) -> Any:
    """`FUSED_INTERNAL`'s work buffer (`KernelOp`'s ``buffers``): the CPU kernel's ``atan2`` arguments,
    ``4 B N`` float64, borrowed from the table's workspace for the call in either route (only the
    forward kernel reads them; none for ``torch.func`` wrappers, whose rules call with other shapes)."""
    xyz, plan, fallback, _ = args
    if not xyz.is_cpu or (keep and gate.wrapped(xyz)):
        return use(*args)
    with workspace.borrowed(plan.refs, 4 * (xyz.numel() // 3)) as buf:
        return use(xyz, plan, fallback, buf)


def _lead(xyz: Tensor, *per_atom: Tensor) -> tuple[int, ...]:
    return tuple(batch_shape(xyz.shape[:-2], *(g.shape[:-1] for g in per_atom)))


def _vjp(xyz: Tensor, gb: Tensor, ga: Tensor, gd: Tensor, plan: InversePlan, _fallback: bool) -> Tensor:
    CALLS["vjp"] += 1
    lead, n, dt = _lead(xyz, gb, ga, gd), xyz.shape[-2], xyz.dtype
    g = (_rows(t, lead, (n,), dt) for t in (gb, ga, gd))
    out = _backend(xyz).internal_vjp(plan, _rows(xyz, lead, (n, 3), dt), *g)
    return out.reshape(*lead, n, 3)


def _second(
    xyz: Tensor, gb: Tensor, ga: Tensor, gd: Tensor, v: Tensor, plan: InversePlan
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    CALLS["second"] += 1
    if _triton(xyz) is not None:  # no Triton kernel for the second order: the torch engine's graph
        outs = _ref_second(xyz.detach(), gb.detach(), ga.detach(), gd.detach(), v.detach(), plan)
        return tuple(_sum_to(o, t) for o, t in zip(outs, (xyz, gb, ga, gd)))  # type: ignore[return-value]
    lead = tuple(batch_shape(_lead(xyz, gb, ga, gd), v.shape[:-2]))
    n, dt, b = xyz.shape[-2], xyz.dtype, math.prod(lead)
    out = torch.empty(b, n, 3, dtype=dt)
    jv = [torch.empty(b, n, dtype=dt) for _ in range(3)]
    g = [_flat(t, lead, (n,), dt) for t in (gb, ga, gd)]
    x, vv = _flat(xyz, lead, (n, 3), dt), _flat(v, lead, (n, 3), dt)
    kernels = _kernels()
    kernels.second(x, vv, *kernels.plan_arrays(plan), *g, out.numpy(), *(j.numpy() for j in jv))
    jb, ja, jd = (_sum_to(j.reshape(*lead, n), t) for j, t in zip(jv, (gb, ga, gd)))
    return _sum_to(out.reshape(*lead, n, 3), xyz), jb, ja, jd


def _sum_to(t: Tensor, like: Tensor) -> Tensor:
    return t if t.shape == like.shape else t.sum_to_size(like.shape)


# --------------------------------------------------------------------------
# The torch engine's graph: forward mode and third order
# --------------------------------------------------------------------------


def _ref(x: Tensor, plan: InversePlan, *_: Any) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(torch_internal_from_xyz(plan, x))  # type: ignore[return-value]


def _ref_vjp(x: Tensor, gb: Tensor, ga: Tensor, gd: Tensor, plan: InversePlan, *_: Any) -> Tensor:
    lead, n = _lead(x, gb, ga, gd), x.shape[-2]
    _, pull = torch.func.vjp(lambda y: _ref(y, plan), x.expand(*lead, n, 3))
    return pull(tuple(g.expand(*lead, n) for g in (gb, ga, gd)))[0]


def _ref_second(
    x: Tensor, gb: Tensor, ga: Tensor, gd: Tensor, v: Tensor, plan: InversePlan
) -> tuple[Tensor, ...]:
    _, pull = torch.func.vjp(lambda *a: _ref_vjp(*a, plan), x, gb, ga, gd)
    return pull(v)


# --------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------


def _may_fall_back(plan: InversePlan, fallback: bool, *_: Any) -> bool:
    """Whether a failed Triton kernel of this call falls back to the torch engine (``method="auto"``)."""
    return fallback


def _internal_jvp(primals: tuple[Tensor, ...], tangents: tuple[Any, ...], plan: InversePlan, *_: Any) -> Any:
    """``J t`` of `FUSED_INTERNAL`: the second-order kernel's second output, with ``g = 0``."""
    (xyz,), (t,) = primals, tangents
    zero = xyz.new_zeros(()).expand(xyz.shape[:-1])
    return FUSED_INTERNAL_SECOND.apply(xyz, zero, zero, zero, t, plan)[1:]


#: ``(xyz, plan, fallback, scratch) -> (bonds, angles, dihedrals)`` with the forward kernel
#: (``fallback``: a failed Triton kernel falls back to the torch engine, ``method="auto"``;
#: ``scratch``: its work buffer, `_scratch`); its backward is `FUSED_INTERNAL_VJP`, its forward
#: mode the second-order kernel's ``J t``.
FUSED_INTERNAL = KernelOp(
    "FusedInternal",
    kernel=_forward,
    reference=_ref,
    consts=3,
    vjp=lambda primals, grads, plan, fallback, _: (
        _sum_to(FUSED_INTERNAL_VJP.apply(*primals, *grads, plan, fallback), primals[0]),
    ),
    jvp=_internal_jvp,
    vmap=lead,
    fallback=_may_fall_back,
    buffers=_scratch,
    module=__name__,
    doc="The fused inverse's forward kernel (`FUSED_INTERNAL`).",
)

#: ``(xyz, gb, ga, gd, plan, fallback) -> J^T (gb, ga, gd)`` ``(..., N, 3)`` with the vjp kernel; its
#: backward is `FUSED_INTERNAL_SECOND`.
FUSED_INTERNAL_VJP = KernelOp(
    "FusedInternalVJP",
    kernel=_vjp,
    reference=_ref_vjp,
    consts=2,
    vjp=lambda primals, grads, plan, _: FUSED_INTERNAL_SECOND.apply(*primals, *grads, plan),
    vmap=lead,
    fallback=_may_fall_back,
    module=__name__,
    doc="The fused inverse's vjp kernel (`FUSED_INTERNAL_VJP`).",
)

#: ``(xyz, gb, ga, gd, v, plan) -> (sum_k g_k H_k v, J v)``, outputs ``(..., N, 3)`` (cotangent of
#: ``xyz``) and three ``(..., N)`` (of ``gb, ga, gd``): the backward of `FUSED_INTERNAL_VJP`; its
#: own derivatives are the torch engine's graph.
FUSED_INTERNAL_SECOND = KernelOp(
    "FusedInternalSecond",
    kernel=_second,
    reference=_ref_second,
    vmap=lead,
    module=__name__,
    doc="The fused inverse's second-order kernel (`FUSED_INTERNAL_SECOND`).",
)
FusedInternal = FUSED_INTERNAL.function
FusedInternalVJP = FUSED_INTERNAL_VJP.function
FusedInternalSecond = FUSED_INTERNAL_SECOND.function
