"""Entry and exit transposes of the level engine, with transposes (not strided scatters) as adjoints.

The level engine works on rows ``(n, 3, B)`` with the batch innermost; users
hold ``(..., N)`` internal coordinates and want ``(..., N, 3)`` positions. Both
changes of layout are linear maps made of a row gather and one 2-D transpose
copy (which torch runs as a blocked transpose). Written as plain ops, autograd
would hand their gradients back as strided views and copy them element by
element; here each map's backward is its adjoint, again one row scatter and
one blocked transpose, and each adjoint's backward is the map itself, so
every order of derivative (and ``jvp``, ``vmap``) stays in the fast layout.
`SinCos` likewise hands back ``cos`` and ``sin`` to its backward instead
of evaluating them again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .function import Function, linear_pair


def _t2(x: Tensor, rows: int, cols: int) -> Tensor:
    """``x`` viewed ``(rows, cols)`` and copied transposed: ``(cols, rows)`` contiguous."""
    return x.reshape(rows, cols).t().contiguous()


def _rows_of(ic: Tensor, rows: Tensor, n: int) -> Tensor:
    batch = ic.shape[-2]
    return _t2(ic, 3 * batch, n).reshape(n, 3, batch).index_select(0, rows)


def _rows_to_ic(g: Tensor, rows: Tensor, n: int) -> Tensor:
    batch = g.shape[-1]
    full = g.new_zeros((n, 3, batch)).index_copy(0, rows, g)
    return _t2(full, n, 3 * batch).reshape(3, batch, n)


# ``(3, B, N)`` internal coordinates -> ``(R, 3, B)`` rows ``rows`` (atoms, each at most once), and back
ToRows, FromRows = linear_pair(("ToRows", "FromRows"), _rows_of, _rows_to_ic, module=__name__)


def _to_xyz(x: Tensor, inverse: Tensor, total: int) -> Tensor:
    n, batch = inverse.numel(), x.shape[-1]
    return _t2(x.index_select(0, inverse), 3 * n, batch).reshape(batch, n, 3)


def _from_xyz(g: Tensor, inverse: Tensor, total: int) -> Tensor:
    batch, n = g.shape[-3], g.shape[-2]
    rows = _t2(g, batch, 3 * n).reshape(n, 3, batch)
    return rows.new_zeros((total, 3, batch)).index_copy(0, inverse, rows)


# ``(T, 3, B)`` engine rows -> ``(B, N, 3)`` positions (row ``inverse[i]`` is atom ``i``), and back
ToXyz, FromXyz = linear_pair(("ToXyz", "FromXyz"), _to_xyz, _from_xyz, module=__name__)


class SinCos(Function):
    """``(cos(x), sin(x))`` whose backward reuses both outputs instead of evaluating them again."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        return torch.cos(x), torch.sin(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
        ctx.save_for_backward(*output)
        ctx.save_for_forward(*output)

    @staticmethod
    def backward(ctx: Any, g_cos: Tensor | None, g_sin: Tensor | None) -> Tensor:  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        if g_cos is None:
            return g_sin * cos
        if g_sin is None:
            return -g_cos * sin
        return torch.addcmul(g_sin * cos, g_cos, sin, value=-1.0)

    @staticmethod
    def jvp(ctx: Any, t: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = ctx.saved_tensors
        return -sin * t, cos * t


def to_rows(ic: Tensor, rows: Tensor) -> Tensor:
    """``(3, B, N)`` -> ``(R, 3, B)``: `ToRows` (plain ops while ``torch.compile`` traces)."""
    if torch.compiler.is_compiling():
        return ic.permute(2, 0, 1).index_select(0, rows)
    return ToRows.apply(ic, rows, ic.shape[-1])


def to_xyz(x: Tensor, inverse: Tensor) -> Tensor:
    """``(T, 3, B)`` -> ``(B, N, 3)``: `ToXyz` (plain ops while ``torch.compile`` traces)."""
    if torch.compiler.is_compiling():
        return x.index_select(0, inverse).permute(2, 0, 1)
    return ToXyz.apply(x, inverse, x.shape[0])


def sincos(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(cos(x), sin(x))``: `SinCos` (plain ops while ``torch.compile`` traces)."""
    if torch.compiler.is_compiling():
        return torch.cos(x), torch.sin(x)
    return SinCos.apply(x)
