"""Level engine: place atoms level by level with precomputed index gathers.

One step per dependency level of the table (the longest chain of references):
all atoms whose references are placed are built together with one NeRF call.
Fast for shallow, wide tables (small molecules, large batches); the scan
engine (:mod:`._scan`) takes over for deep ones.

Layout: the batch is flattened to ``B`` and kept innermost, atoms are rows
``(n, 3, B)``. The inputs are transposed once on entry (:mod:`._levels_layout`),
the local offsets of all atoms are computed in one pass, the level loop
(:mod:`._levels_autograd`, with its hand-written backward) places each level
with about 15-25 kernels, and the result is transposed once on exit.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._levels_autograd import level_loop
from ._levels_layout import sincos, to_rows, to_xyz
from ._plan import LevelPlan, SeedPlan


def seed_block(plan: SeedPlan, bonds: Tensor, angles: Tensor, fixed_xyz: Tensor | None) -> Tensor:
    """Positions of block 0 (fixed atoms, roots, seed atoms): ``(..., n0, 3)``.

    Roots sit at the origin, second atoms at ``(r, 0, 0)``, third atoms in the
    ``xy``-plane with ``y > 0``: ``x_b + r (s cos(theta), sin(theta), 0)`` with
    ``s = +1`` when the bond reference is the root and ``-1`` when it is the
    second atom (whose position is ``(r_b, 0, 0)``).

    Args:
        bonds, angles: ``(..., N)`` with the batch shape already broadcast.
        fixed_xyz: ``(..., F, 3)`` broadcast to the same batch shape, or None.
    """
    batch = bonds.shape[:-1]
    zero = bonds.new_zeros(())
    parts = []
    if plan.n_fixed:
        parts.append(fixed_xyz)
    if plan.n_roots:
        parts.append(bonds.new_zeros((*batch, plan.n_roots, 3)))
    if plan.second.numel():
        r2 = bonds.index_select(-1, plan.second)
        z2 = zero.expand_as(r2)
        parts.append(torch.stack((r2, z2, z2), dim=-1))
    if plan.third.numel():
        r3 = bonds.index_select(-1, plan.third)
        t3 = angles.index_select(-1, plan.third)
        rb = bonds.index_select(-1, plan.second.index_select(0, plan.third_second_slot))
        xb = torch.where(plan.third_from_second, rb, zero)
        sign = torch.where(plan.third_from_second, -1.0, 1.0).to(r3.dtype)
        parts.append(
            torch.stack((xb + sign * r3 * torch.cos(t3), r3 * torch.sin(t3), zero.expand_as(r3)), dim=-1)
        )
    if not parts:
        return bonds.new_zeros((*batch, 0, 3))
    return torch.cat(parts, dim=-2)


def _seed_rows(plan: LevelPlan, g: Tensor, fixed: Tensor | None) -> Tensor:
    """Block 0 ``(n0, 3, B)`` from seed rows ``g`` ``(S, 3, B)`` (r, theta, phi of seconds, thirds).

    Fixed atoms, roots, second and third seed atoms, placed as in :func:`seed_block`.
    """
    seeds = plan.seeds
    n2, n3 = seeds.second.numel(), seeds.third.numel()
    batch = g.shape[-1]
    parts = []
    if seeds.n_fixed:
        parts.append(fixed)
    if seeds.n_roots:
        parts.append(g.new_zeros((seeds.n_roots, 3, batch)))
    r2 = g[:n2, 0]
    if n2:
        zero = g.new_zeros(()).expand_as(r2)
        parts.append(torch.stack((r2, zero, zero), dim=1))
    if n3:
        r3, t3 = g[n2 : n2 + n3, 0], g[n2 : n2 + n3, 1]
        rc = r3 * torch.cos(t3)
        xb = r2.index_select(0, seeds.third_second_slot)
        x0 = torch.where(seeds.third_from_second.unsqueeze(-1), xb - rc, rc)
        parts.append(torch.stack((x0, r3 * torch.sin(t3), g.new_zeros(()).expand_as(r3)), dim=1))
    if not parts:
        return g.new_zeros((0, 3, batch))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


def build_levels(
    plan: LevelPlan,
    bonds: Tensor,
    angles: Tensor,
    dihedrals: Tensor,
    fixed_xyz: Tensor | None,
) -> Tensor:
    """Cartesian coordinates ``(..., N, 3)`` from broadcast ``(..., N)`` inputs.

    Works atom-major with the batch flattened and innermost, ``(n, 3, B)``: every
    reference gather copies whole rows of ``B`` values and every elementwise
    kernel runs on contiguous rows. The inputs are transposed once at entry
    and the result (contiguous) once at exit.
    """
    batch = bonds.shape[:-1]
    n = bonds.shape[-1]
    n_samples = math.prod(batch)
    ic = torch.stack((bonds, angles, dihedrals)).reshape(3, n_samples, n)
    g = to_rows(ic, plan.rows)  # (S + M, 3, B): r, theta, phi per row
    fixed = None
    if fixed_xyz is not None:
        fixed = fixed_xyz.reshape(n_samples, -1, 3).permute(1, 2, 0)
    # split, not sliced: autograd joins the pieces' gradients with one cat, where
    # the backward of each slice would fill a zero tensor of the whole size
    g_seed, g_full = g.split((g.shape[0] - plan.full_atoms.numel(), plan.full_atoms.numel()))
    block0 = _seed_rows(plan, g_seed, fixed)
    # local offsets r (-cos(theta), sin(theta) cos(phi), sin(theta) sin(phi)) of every full atom at once
    r, tp = g_full.split((1, 2), dim=1)
    cos, sin = sincos(tp)
    cos_t, cos_p = cos.split(1, dim=1)
    sin_t, sin_p = sin.split(1, dim=1)
    rs = r * sin_t
    loc = torch.cat((-r * cos_t, rs * cos_p, rs * sin_p), dim=1)
    xyz = level_loop(plan, block0, loc)
    return to_xyz(xyz, plan.inverse).reshape(*batch, n, 3)
