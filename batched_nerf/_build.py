"""Level engine: place atoms level by level with precomputed index gathers.

One step per dependency level of the table (the longest chain of references):
all atoms whose references are placed are built together with one NeRF call.
Fast for shallow, wide tables (small molecules, large batches); the scan
engine (:mod:`._scan`) takes over for deep ones.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._geometry import EPS
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


def _normalize(v: Tensor, dim: int) -> Tensor:
    """``v / max(|v|, EPS)`` along ``dim`` as ``v * rsqrt(max(|v|^2, EPS^2))`` (5 kernels).

    Exact for ``|v| >= EPS``; every derivative stays finite at ``v = 0`` (the
    squared norm is smooth, and clamped away from zero before ``rsqrt``).
    """
    return v * torch.rsqrt((v * v).sum(dim, keepdim=True).clamp_min(EPS * EPS))


def _cross(u: Tensor, v: Tensor) -> Tensor:
    """Cross product of atom-major vectors ``(n, 3, B)`` (7 kernels on ``(n, B)`` rows).

    Written out: ``torch.linalg.cross`` along a strided dimension runs a scalar
    loop, tens of times slower than these row operations.
    """
    u0, u1, u2 = u.unbind(1)
    v0, v1, v2 = v.unbind(1)
    return torch.stack(
        (
            torch.addcmul(u1 * v2, u2, v1, value=-1.0),
            torch.addcmul(u2 * v0, u0, v2, value=-1.0),
            torch.addcmul(u0 * v1, u1, v0, value=-1.0),
        ),
        dim=1,
    )


def place_rows(a: Tensor, b: Tensor, c: Tensor, d1: Tensor, d2: Tensor, d3: Tensor) -> Tensor:
    """NeRF placement of atom-major references ``(n, 3, B)`` (14 kernels).

    ``x = c - d1 e1 + d2 e2 + d3 e3`` with ``e1 = (c - b) / |c - b|``,
    ``e3 = ((b - a) x (c - b)) / |(b - a) x (c - b)|``, ``e2 = e3 x e1``
    (the frame of :func:`~batched_nerf._geometry.place`; ``d1 = r cos(theta)``,
    ``d2 = r sin(theta) cos(phi)``, ``d3 = r sin(theta) sin(phi)``, each
    ``(n, 1, B)``). Both directions are normalised in one pass; a collapsed
    direction (collinear or coincident references) gives a zero axis.
    """
    u = c - b
    m = _cross(b - a, u)
    e1, e3 = _normalize(torch.stack((u, m), dim=1), dim=2).unbind(1)
    e2 = _cross(e3, e1)
    return c.addcmul(d1, e1, value=-1.0).addcmul(d2, e2).addcmul(d3, e3)


def _seed_rows(plan: LevelPlan, g: Tensor, fixed: Tensor | None) -> Tensor:
    """Block 0 ``(n0, 3, B)``: fixed atoms, roots, second and third seeds (see :func:`seed_block`)."""
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
    and the result once (as a view) at exit.
    """
    batch = bonds.shape[:-1]
    n = bonds.shape[-1]
    n_samples = math.prod(batch)
    ic = torch.stack((bonds, angles, dihedrals)).reshape(3, n_samples, n)
    g = ic.permute(2, 0, 1).index_select(0, plan.rows)  # (S + M, 3, B): r, theta, phi per row
    fixed = None
    if fixed_xyz is not None:
        fixed = fixed_xyz.reshape(n_samples, -1, 3).permute(1, 2, 0)
    blocks = [_seed_rows(plan, g, fixed)]
    if plan.level_sizes:
        # local offsets of every fully referenced atom at once, then split by level
        n_seed = g.shape[0] - plan.full_atoms.numel()
        r, tp = g[n_seed:, :1], g[n_seed:, 1:]
        cos, sin = torch.cos(tp), torch.sin(tp)
        rs = r * sin[:, :1]
        local = zip(*(x.split(plan.level_sizes) for x in (r * cos[:, :1], rs * cos[:, 1:], rs * sin[:, 1:])))
        for parts, gather, size, (d1, d2, d3) in zip(plan.parts, plan.gathers, plan.level_sizes, local):
            pieces = [blocks[s] if rows is None else blocks[s].index_select(0, rows) for s, rows in parts]
            pool = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
            if gather is not None:
                pool = pool.index_select(0, gather)
            a, b, c = pool.unflatten(0, (3, size)).unbind(0)
            blocks.append(place_rows(a, b, c, d1, d2, d3))
    xyz = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    return xyz.index_select(0, plan.inverse).permute(2, 0, 1).reshape(*batch, n, 3)
