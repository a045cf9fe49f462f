r"""The flow layer's entries and log-det in one kernel pass (CPU, numba), with the torch reference around it.

[`InternalCoordinateTransform`][batched_nerf.InternalCoordinateTransform] moves between ``(..., N)``
per-atom internal coordinates and its compact entries, and sums the log-det
over the entries (`batched_nerf.learning.logdet.entries_log_det`):

```text
log_det = sum_e kb_e log|b_e| + sum_e ka_e log|sin a_e|
```

`spread_log_det` (the inverse's: entries -> per-atom values and the
log-det) and `gather_log_det` (the forward's: per-atom values -> entries
and the log-det) compute that reference: on CPU float32/float64 tensors with
numba installed, as one loop per sample (`engines.fused.cpu.entries`),
its backward one more loop; under ``create_graph=True``, ``torch.func``,
forward-mode AD or ``torch.compile``, and without numba, the torch reference
itself (`batched_nerf.learning.entries.gather`/``spread`` and
`entries_log_det`). Both give the same values
(the kernel accumulates in float64 and rounds once) and the same derivatives,
to every order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..engines.backends import available, require
from ..engines.function import Function, jvp, save
from ..engines.fused.arrays import numpy_view as _np
from ..engines.fused.arrays import unwrapped
from .entries import EntryLayout, gather, spread
from .logdet import entries_log_det

__all__ = ["EntryKernel", "gather_log_det", "spread_log_det"]


@dataclass(frozen=True, eq=False)
class EntryKernel:
    """The three kinds' `EntryLayout`\\ s, the log-det terms (the two
    `entry_weights`), and the same as the kernels read them: ``maps``
    ``(3, N)`` (entry of each atom, ``-1``: none), ``atoms`` (atom of each entry), ``kb``, ``ka`` (each
    entry's integer weight; ``None``: a weight is not a small integer, the torch reference runs)."""

    layouts: tuple[EntryLayout, EntryLayout, EntryLayout]
    terms: tuple[Any, Any]
    maps: np.ndarray
    atoms: tuple[np.ndarray, np.ndarray, np.ndarray]
    kb: np.ndarray | None
    ka: np.ndarray | None

    @classmethod
    def of(cls, layouts: tuple[EntryLayout, EntryLayout, EntryLayout], terms: tuple[Any, Any]) -> EntryKernel:
        """The kernel's arrays of ``layouts`` (CPU indices) and ``terms``."""
        n = layouts[0].n_atoms
        atoms = tuple(np.ascontiguousarray(lay.atoms.cpu().numpy(), dtype=np.int64) for lay in layouts)
        maps = np.full((3, n), -1, dtype=np.int64)
        for k, at in enumerate(atoms):
            maps[k, at] = np.arange(at.size)
        kb, ka = (_integer_weights(t, at.size) for t, at in zip(terms, atoms[:2]))
        return cls(layouts, terms, maps, atoms, kb, ka)  # type: ignore[arg-type]


def _integer_weights(term: tuple[np.ndarray | None, np.ndarray], n_entries: int) -> np.ndarray | None:
    """Each entry's weight as an int64 ``(E,)`` (0: no term), or None unless all are integers in
    ``0..8`` (the kernel multiplies a factor in that many times)."""
    rows, weights = term
    k = np.zeros(n_entries)
    k[slice(None) if rows is None else rows] = weights
    if not (np.all(k == np.round(k)) and np.all((k >= 0) & (k <= 8))):
        return None
    return k.astype(np.int64)


def _kernel_runs(spec: EntryKernel, *tensors: Tensor) -> bool:
    """The numba pass may serve these inputs: CPU float32/float64 of one dtype, no ``torch.func``
    wrapper or forward-mode tangent, not traced, integer weights, numba installed."""
    t0 = tensors[0]
    if spec.kb is None or spec.ka is None:
        return False
    if t0.dtype not in (torch.float32, torch.float64) or torch.compiler.is_compiling():
        return False
    if any(t.device.type != "cpu" or t.dtype != t0.dtype for t in tensors):
        return False
    return unwrapped(*tensors) and available("cpu")


_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def _tensors(*arrays: np.ndarray, dtype: torch.dtype) -> tuple[Tensor, ...]:
    return tuple(torch.from_numpy(a).to(dtype) for a in arrays)


# ------------------------------------------------------------------ references
def _spread_reference(b: Tensor, a: Tensor, d: Tensor, spec: EntryKernel) -> tuple[Tensor, ...]:
    full = tuple(spread(v, lay) for v, lay in zip((b, a, d), spec.layouts))
    return (*full, entries_log_det(b, a, spec.terms))


def _gather_reference(b: Tensor, a: Tensor, d: Tensor, spec: EntryKernel) -> tuple[Tensor, ...]:
    entries = tuple(gather(v, lay) for v, lay in zip((b, a, d), spec.layouts))
    return (*entries, entries_log_det(entries[0], entries[1], spec.terms))


# ------------------------------------------------------------------ kernels
def _spread_kernel(b: Tensor, a: Tensor, d: Tensor, spec: EntryKernel) -> tuple[Tensor, ...]:
    out = require("cpu").entries.spread(_np(b), _np(a), _np(d), spec.maps, spec.kb, spec.ka)
    return _tensors(*out, dtype=b.dtype)


def _gather_kernel(b: Tensor, a: Tensor, d: Tensor, spec: EntryKernel) -> tuple[Tensor, ...]:
    out = require("cpu").entries.gather(_np(b), _np(a), _np(d), spec.atoms, spec.kb, spec.ka)
    return _tensors(*out, dtype=b.dtype)


def _backward(ctx: Any, grads: tuple[Tensor, ...], reference: Any, kernel: Any) -> tuple[Tensor | None, ...]:
    """The backward of both Functions: under ``create_graph`` the differentiable vjp of ``reference`` at
    the saved inputs, else ``kernel(cotangents, b, a)``: the cotangents as numpy arrays of the inputs'
    dtype, ``b``, ``a`` the first two saved inputs."""
    b, a, d = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph: the reference's differentiable vjp
        _, vjp = torch.func.vjp(lambda *x: reference(*x, ctx.spec), b, a, d)
        return (*vjp(grads), None)
    out = kernel([_np(x.to(b.dtype)) for x in grads], b, a)
    return (*_tensors(*out, dtype=b.dtype), None)


class _SpreadLogDet(Function):
    """``(B, E_k)`` entries -> ``(B, N)`` bonds, angles, dihedrals and the ``(B,)`` log-det."""

    @staticmethod
    def forward(b: Tensor, a: Tensor, d: Tensor, spec: EntryKernel) -> tuple[Tensor, ...]:  # type: ignore[override]
        return _spread_kernel(b, a, d, spec)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        *entries, ctx.spec = inputs
        save(ctx, *entries)

    @staticmethod
    def backward(ctx: Any, gb: Tensor, ga: Tensor, gd: Tensor, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        spec = ctx.spec
        return _backward(
            ctx,
            (gb, ga, gd, g),
            _spread_reference,
            lambda cot, b, a: require("cpu").entries.spread_grad(
                *cot, _np(b), _np(a), spec.atoms, spec.kb, spec.ka
            ),
        )

    @staticmethod
    def jvp(ctx: Any, tb: Tensor, ta: Tensor, td: Tensor, _: None) -> tuple[Tensor, ...]:
        return jvp(lambda *x: _spread_reference(*x, ctx.spec), ctx.saved_tensors, (tb, ta, td))


class _GatherLogDet(Function):
    """``(B, N)`` bonds, angles, dihedrals -> ``(B, E_k)`` entries and the ``(B,)`` log-det."""

    @staticmethod
    def forward(b: Tensor, a: Tensor, d: Tensor, spec: EntryKernel) -> tuple[Tensor, ...]:  # type: ignore[override]
        return _gather_kernel(b, a, d, spec)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        *full, ctx.spec = inputs
        save(ctx, *full)
        ctx.entries = (output[0].detach(), output[1].detach())  # the log-det's derivative reads them

    @staticmethod
    def backward(ctx: Any, gb: Tensor, ga: Tensor, gd: Tensor, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        spec, (eb, ea) = ctx.spec, ctx.entries
        return _backward(
            ctx,
            (gb, ga, gd, g),
            _gather_reference,
            lambda cot, *_: require("cpu").entries.gather_grad(
                *cot, _np(eb), _np(ea), spec.maps, spec.kb, spec.ka
            ),
        )

    @staticmethod
    def jvp(ctx: Any, tb: Tensor, ta: Tensor, td: Tensor, _: None) -> tuple[Tensor, ...]:
        return jvp(lambda *x: _gather_reference(*x, ctx.spec), ctx.saved_tensors, (tb, ta, td))


def _apply(fn: type, kernel: Any, reference: Any, values: tuple[Tensor, ...], spec: EntryKernel) -> Any:
    """``values`` ``(..., K)`` each (one batch shape) through ``fn``'s kernel, or ``reference``."""
    if not _kernel_runs(spec, *values):
        return reference(*values, spec)
    kernels = require("cpu").entries
    dtype = _NUMPY[values[0].dtype]
    if not kernels.ready(dtype):  # tiered: the reference until the kernels are cached or pay
        return kernels.timed(dtype, lambda: reference(*values, spec))
    batch = values[0].shape[:-1]
    flat = tuple(v.reshape(-1, v.shape[-1]) for v in values)
    if torch.is_grad_enabled() and any(v.requires_grad for v in values):
        out = fn.apply(*flat, spec)
    else:
        out = kernel(*flat, spec)
    return tuple(o.reshape(batch + o.shape[1:]) for o in out)


def spread_log_det(b: Tensor, a: Tensor, d: Tensor, spec: EntryKernel) -> tuple[Tensor, ...]:
    """Entries ``(..., E_b)``, ``(..., E_a)``, ``(..., E_d)`` (one batch shape, one dtype) -> ``(..., N)``
    bonds, angles, dihedrals (zero at atoms without an entry) and the ``(...)`` log-det."""
    return _apply(_SpreadLogDet, _spread_kernel, _spread_reference, (b, a, d), spec)


def gather_log_det(b: Tensor, a: Tensor, d: Tensor, spec: EntryKernel) -> tuple[Tensor, ...]:
    """``(..., N)`` bonds, angles, dihedrals -> their entries ``(..., E_k)`` and the ``(...)`` log-det."""
    return _apply(_GatherLogDet, _gather_kernel, _gather_reference, (b, a, d), spec)
