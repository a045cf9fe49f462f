"""Level engine: place atoms level by level with precomputed index gathers.

One step per dependency level of the table (the longest chain of references):
all atoms whose references are placed are built together with one NeRF call.
Fast for shallow, wide tables (small molecules, large batches); the scan
engine (:mod:`._scan`) takes over for deep ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._geometry import place0
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


def build_levels(
    plan: LevelPlan,
    bonds: Tensor,
    angles: Tensor,
    dihedrals: Tensor,
    fixed_xyz: Tensor | None,
) -> Tensor:
    """Cartesian coordinates ``(..., N, 3)`` from broadcast ``(..., N)`` inputs."""
    # component-major blocks (3, ..., n_k): every elementwise op runs on contiguous data
    blocks = [seed_block(plan.seeds, bonds, angles, fixed_xyz).movedim(-1, 0)]
    if plan.level_sizes:
        # local offsets of every fully referenced atom at once, then split by level
        r = bonds.index_select(-1, plan.full_atoms)
        t = angles.index_select(-1, plan.full_atoms)
        p = dihedrals.index_select(-1, plan.full_atoms)
        rs = r * torch.sin(t)
        local = (-r * torch.cos(t), rs * torch.cos(p), rs * torch.sin(p))
        locals_ = zip(*(x.split(plan.level_sizes, dim=-1) for x in local))
        for src, gather, size, loc in zip(plan.sources, plan.gathers, plan.level_sizes, locals_):
            pool = blocks[src[0]] if len(src) == 1 else torch.cat([blocks[s] for s in src], dim=-1)
            a, b, c = pool.index_select(-1, gather).unflatten(-1, (3, size)).unbind(-2)
            blocks.append(place0(a, b, c, loc))
    xyz = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)
    return xyz.index_select(-1, plan.inverse).movedim(0, -1)
