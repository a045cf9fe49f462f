"""Level engine: place atoms level by level with precomputed index gathers.

One step per dependency level of the table (the longest chain of references):
all atoms whose references are placed are built together with one NeRF call.
Fast for shallow, wide tables (small molecules, large batches); the scan
engine (:mod:`.scan`) takes over for deep ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._geometry import place
from .._topology import FULL, Topology
from .base import Engine, Movable, as_long
from .seeds import SeedPlan, seed_atoms, seed_block, seed_plan

__all__ = ["LEVELS", "LevelPlan", "build_levels", "level_plan"]


@dataclass(frozen=True)
class LevelPlan(Movable):
    """Dependency-level plan: atoms whose references are placed are built together."""

    seeds: SeedPlan
    full_atoms: Tensor  # (M,) fully referenced atoms in build order
    level_sizes: tuple[int, ...]  # atoms per level, summing to M
    sources: tuple[tuple[int, ...], ...]  # per level: blocks (0 = seeds, k = level k) gathered
    gathers: tuple[Tensor, ...]  # per level: (3 * n_k,) columns of cat(sources): all d, all a, all b
    inverse: Tensor  # (N,) position of each atom in cat(all blocks)


def level_plan(topo: Topology, variant: int = 1) -> LevelPlan:
    """Level plan of ``topo``: atoms grouped by dependency level, gathers per level."""
    refs = topo.refs
    level = topo.level
    n_refs = topo.kind
    block = np.full(len(refs), -1, dtype=np.int64)
    slot = np.full(len(refs), -1, dtype=np.int64)
    block0 = seed_atoms(topo)
    block[block0] = 0
    slot[block0] = np.arange(block0.size)
    full = np.flatnonzero(n_refs == FULL)
    order = full[np.argsort(level[full], kind="stable")]
    sizes = np.bincount(level[order], minlength=int(level.max(initial=0)) + 1)[1:]
    sources: list[tuple[int, ...]] = []
    gathers: list[Tensor] = []
    start = 0
    for k, size in enumerate(sizes.tolist(), start=1):
        atoms = order[start : start + size]
        start += size
        block[atoms] = k
        slot[atoms] = np.arange(size)
        need = refs[atoms][:, ::-1].T  # rows: all d, all a, all b refs
        src = tuple(sorted(set(block[need].ravel().tolist())))
        offsets = {}
        offset = 0
        for s in src:
            offsets[s] = offset
            offset += block0.size if s == 0 else int(sizes[s - 1])
        flat = np.array([offsets[int(b)] for b in block[need].ravel()]) + slot[need].ravel()
        sources.append(src)
        gathers.append(as_long(flat))
    block_start = np.concatenate([[0, block0.size], block0.size + np.cumsum(sizes)])
    inverse = block_start[block] + slot
    return LevelPlan(
        seeds=seed_plan(topo),
        full_atoms=as_long(order),
        level_sizes=tuple(int(s) for s in sizes),
        sources=tuple(sources),
        gathers=tuple(gathers),
        inverse=as_long(inverse),
    )


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
            blocks.append(place(c, b, a, loc, dim=0))
    xyz = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)
    return xyz.index_select(-1, plan.inverse).movedim(0, -1)


LEVELS = Engine("levels", level_plan, build_levels)
