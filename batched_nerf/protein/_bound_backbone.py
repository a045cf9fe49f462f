"""The bound backbone build: `build_backbone`'s common call as two compiled passes.

`build_backbone` checks and broadcasts its inputs, gathers each atom row's bond, angle and
dihedral from the per-residue values (``_atom_source``) and calls `to_cartesian` on the chain
table: about 60 torch operations around a kernel of tens of microseconds for 64 chains of 46
residues, and code that has not run for a few milliseconds (a model's own work ran just
before it) runs 2-3x slower. Where the call is plain (CPU float32/float64 tensors of one shape,
no ``first``, numba installed, no ``torch.func`` transform, forward-mode level or
``torch.compile`` trace: `serves`; `build_backbone` asks before its general checks), one
compiled pass gathers the atom rows' bonds, cosines and sines (`cpu.trig.gathered_trig`; a
default or broadcast value is one row every chain reads), and the fused engine's forward kernel
builds them on the table's own fused plan. With nothing to differentiate there is no autograd
node, and where the call runs on the calling thread in the blocked layout the two passes are
one compiled call (`cpu.build.gathered_forward`). The backward is the backward kernel and one
numpy indexing back to the per-residue values (each value feeds one atom row at most). With
``lengths``, the rows past a chain's end read constants and their atoms are written as zeros,
as on the general path. Under ``create_graph=True`` the backward is the general path's (the
torch gather and `to_cartesian`, differentiable to any order): `BACKBONE` is a `KernelOp` with
that path as its reference. Results equal the general path's bit for bit (the same kernels on
the same values).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..core.table import ConstructionTable
from ..engines.backends import available, require
from ..engines.function import KernelOp, with_none
from ..runtime import gate

__all__ = ["BACKBONE", "Bound", "Constants", "bound_build", "serves"]


def serves(*values: Tensor) -> bool:
    """Whether the bound build takes ``values``: non-empty CPU tensors of one float dtype and one
    shape, numba installed, no transform, forward-mode level or trace active."""
    first = values[0]
    return (
        first.numel() > 0
        and all(v.dtype == first.dtype and v.shape == first.shape for v in values[1:])
        and gate.bound_inputs(*values)
        and available("cpu")
    )


class Constants(NamedTuple):
    """What a bound build of one chain length, layout and dtype reads besides its inputs (numpy, read
    only): the chain table, the gather's positions (flat, block, column, fallback: ``(3, 3 L)``
    int64 each), its 7 constants, the default ``(1, 3 L)`` rows of angles and bonds, the fixed
    first residue ``(3, 3)`` (``(0, 3)``: seeds) and the kernels' pose rows (no pose)."""

    table: ConstructionTable
    source: tuple[np.ndarray, ...]
    consts: np.ndarray
    defaults: tuple[np.ndarray, np.ndarray]
    first: np.ndarray
    pose: np.ndarray


class Bound:
    """One call's arrays: the atom rows' bonds and trig array, the fixed atoms, and how to read the
    per-residue gradients back (numpy; kept for the backward)."""

    __slots__ = ("bonds", "fixed", "plan", "pose", "rows", "shape", "source", "trig", "widths")

    def __init__(
        self,
        constants: Constants,
        values: list[np.ndarray],
        fixed: np.ndarray,
        shape: tuple[int, ...],
        count: np.ndarray | None = None,
    ) -> None:
        flat, which, column, fallback = constants.source
        m = math.prod(shape[:-3])
        rows = _atom_rows(constants, m, count)
        self.rows = None if count is None else rows  # atom rows each chain builds; None: all
        self.plan, self.pose = constants.table.plan("fused"), constants.pose
        gathered = require("cpu").gathered_trig(
            tuple(values), constants.consts, which, column, rows, fallback, m
        )
        self.bonds, self.trig = gathered
        self.fixed, self.source, self.shape = fixed, flat, shape
        self.widths = [v.shape[1] for v in values]

    def forward(self) -> np.ndarray:
        """``(m, N, 3)`` positions (the forward kernel)."""
        p = self.plan
        out = require("cpu").forward(
            p.index, p.starts, self.bonds, self.trig, self.fixed, self.pose, p.width, p.reach
        )
        if self.rows is not None:  # atoms past a chain's length: zeros
            require("cpu").zero_past(out, self.rows)
        return out

    def backward(self, g: np.ndarray) -> list[np.ndarray]:
        """Gradients of ``sum(g * xyz)`` with respect to each per-residue value array, ``(m, K)`` each."""
        p, kernels = self.plan, require("cpu")
        if self.rows is not None:  # atoms past a chain's length take no gradient (``g`` may be the caller's)
            g = g.copy()
            kernels.zero_past(g, self.rows)
        gb, ga, gd, _, _ = kernels.backward(
            p.index, p.starts, self.bonds, self.trig, self.fixed, self.pose, g, p.width
        )
        m = g.shape[0]
        grads = np.stack([gb, ga, gd], axis=1)
        if self.rows is not None:  # rows past a chain's length read constants
            kernels.zero_past(grads.transpose(0, 2, 1), self.rows)
        flat = np.zeros((m, sum(self.widths) + 7), dtype=gb.dtype)
        # each value feeds one atom row at most; the constants (the last 7) take every other row
        flat[:, self.source.reshape(-1)] = grads.reshape(m, -1)
        out, at = [], 0
        for k in self.widths:
            out.append(flat[:, at : at + k])
            at += k
        return out


def _kernel(*args: Any) -> Tensor:
    """``(*values, bound, reference)`` -> ``(*shape, L, 3, 3)`` positions."""
    bound = args[-2]
    return torch.from_numpy(bound.forward()).view(bound.shape)


def _vjp(
    values: tuple[Tensor | None, ...],
    grads: tuple[Tensor],
    bound: Bound,
    reference: Callable[..., Tensor],
) -> Any:
    """Gradients of the given per-residue values (None for a value not given): the backward kernel,
    or (``create_graph=True``) the general path's differentiable graph."""
    (g,) = grads
    given = [v for v in values if v is not None]
    if torch.is_grad_enabled():
        _, pull = torch.func.vjp(reference, *given)
        return with_none(pull(g), values)
    m = math.prod(bound.shape[:-3])
    gn = g.detach().to(given[0].dtype).reshape(m, -1, 3).contiguous().numpy()
    out = bound.backward(gn)
    return tuple(
        None if v is None else torch.from_numpy(np.ascontiguousarray(x)).view(v.shape)
        for x, v in zip(out, values)
    )


#: ``(*values, bound, reference)`` -> positions: the bound backbone build (module docstring).
BACKBONE = KernelOp(
    "BackboneFn",
    kernel=_kernel,
    consts=2,
    vjp=_vjp,
    module=__name__,
    doc="The bound backbone build (`BACKBONE`).",
)


def bound_build(
    values: tuple[Tensor | None, Tensor | None, Tensor | None],
    constants: Constants,
    reference: Callable[..., Tensor],
    count: Tensor | None = None,
) -> Tensor:
    """``(*batch, L, 3, 3)`` positions from the per-residue ``(*batch, L, 3)`` dihedrals, angles and
    bonds ``values`` (None: the defaults in ``constants``; the given ones of one shape and dtype),
    through `BACKBONE`; ``count`` ``(*batch)`` residues per chain (the atoms past it built from the
    constants and written as zeros, as the general path does); ``reference(*given values)``: the
    general path, for derivatives the kernels do not serve."""
    like = values[0]
    batch, n_res = like.shape[:-2], like.shape[-2]
    m = math.prod(batch)
    arrays = [constants.defaults[k - 1] if v is None else _rows(v, m) for k, v in enumerate(values)]
    rows = None if count is None else count.reshape(m).numpy().astype(np.int64, copy=False)
    shape = (*batch, n_res, 3, 3)
    if gate.keeps_grad(*values):  # `serves` passed the gate: the gradient test routes the call
        fixed = np.empty((m, *constants.first.shape), dtype=arrays[0].dtype)
        fixed[:] = constants.first
        return BACKBONE.apply(*values, Bound(constants, arrays, fixed, shape, rows), reference)
    # nothing to differentiate: the forward alone (one compiled call where it can, which also makes
    # its arrays), no autograd node
    p = constants.table.plan("fused")
    out = require("cpu").gathered_forward(  # atoms past a chain's length written as zeros
        tuple(arrays), constants.consts, constants.source[1:], None if rows is None else 3 * rows,
        p.index, p.starts, constants.first, constants.pose, p.width, p.reach, m,
    )  # fmt: skip
    return torch.from_numpy(out.reshape(shape))


def _atom_rows(constants: Constants, m: int, count: np.ndarray | None) -> np.ndarray:
    """``(m,)`` atom rows each chain builds from its values: ``3 count``, all without ``count``."""
    if count is None:
        return np.full(m, constants.source[0].shape[1], dtype=np.int64)
    return 3 * count


def _rows(value: Tensor, m: int) -> np.ndarray:
    """``(m, K)`` C-contiguous rows of ``value`` ``(*batch, L, 3)``, or ``(1, K)`` where every sample
    reads the same values (a broadcast: no copy). In numpy from the first step: a torch call right
    after other work costs several times a numpy one, cold."""
    x = value.detach().numpy()
    lead = x.ndim - 2
    if lead and not any(x.strides[:lead]):
        x = x[(0,) * lead]
        m = 1
    return np.ascontiguousarray(x.reshape(m, -1))
