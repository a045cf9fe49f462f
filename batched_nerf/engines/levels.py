"""Level engine: place atoms level by level with precomputed index gathers.

One step per dependency level of the table (the longest chain of references):
all atoms whose references are placed are built together with one NeRF call.
Fast for shallow, wide tables (small molecules, large batches); the scan
engine (:mod:`.scan`) takes over for deep ones.

Layout: the batch is flattened to ``B`` and kept innermost, atoms are rows
``(n, 3, B)``. The inputs are transposed once on entry (:mod:`.layout`), the
local offsets of all atoms are computed in one pass, the level loop places
each level with about 11-25 kernels, and the result is transposed once on exit.

The level loop, :class:`LevelLoop`, is an ``autograd.Function``: its forward
keeps each level's frame; its backward walks the levels in reverse, turning
the gradient of each placed atom into gradients of its local offset and of its
three reference positions (reverse accumulation of forces down the reference
tree), in about 27-40 kernels per level instead of the ~90 that autograd
records for the same graph. It serves first derivatives only: when a graph of
the backward is wanted (``create_graph=True``, ``gradgradcheck``) it replays
the plain differentiable loop, so every higher derivative is the plain one;
under ``torch.func`` transforms, forward-mode AD and ``torch.compile`` the
plain loop runs from the start (:func:`level_loop`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.autograd import forward_ad

from .._geometry import EPS
from .._topology import FULL, SECOND, THIRD, Topology
from .base import Engine, Movable, as_long
from .layout import sincos, to_rows, to_xyz
from .seeds import SeedPlan, seed_atoms, seed_plan, seed_positions

__all__ = ["LEVELS", "LevelPlan", "build_levels", "level_plan"]


@dataclass(frozen=True)
class LevelPlan(Movable):
    """Dependency-level plan: atoms whose references are placed are built together.

    The engine works atom-major, ``(n, 3, B)`` with the batch innermost. Block 0
    holds fixed atoms, roots, second and third seed atoms (the order of
    ``seeds.atoms``); block ``k >= 1`` the atoms of level ``k``. Level ``k``
    concatenates ``parts[k]`` (each a whole earlier block, or some of its rows)
    and then, unless ``gathers[k]`` is None, picks the rows ``all d, all a,
    all b`` refs of its atoms from that pool. Every copy is at most a small
    multiple of the level's own size, so a build does linear work in N.
    """

    seeds: SeedPlan
    rows: Tensor  # (S2 + S3 + M,) atoms whose (bond, angle, dihedral) are read: seconds, thirds, full
    full_atoms: Tensor  # (M,) fully referenced atoms in build order
    level_sizes: tuple[int, ...]  # atoms per level, summing to M
    parts: tuple[tuple[tuple[int, Tensor | None], ...], ...]  # per level: (block, rows or None = all)
    gathers: tuple[Tensor | None, ...]  # per level: (3 * n_k,) rows of the pool, or None if in order
    inverse: Tensor  # (N,) position of each atom in cat(all blocks)


def level_plan(topo: Topology, variant: int = 1) -> LevelPlan:
    """Level plan of ``topo``: atoms grouped by dependency level, the pools and gathers per level.

    Whole-array passes over all levels at once: every reference a level reads
    is an *entry* ``(level, source block, slot)``; each ``(level, block)`` pair
    copies the whole block into the level's pool unless fewer than half its
    rows are read, and each entry's row in the pool follows from the pairs'
    offsets. Only the per-level tuples of the plan are assembled in Python.
    """
    seeds = seed_plan(topo)
    refs, level, n_refs = topo.refs, topo.level, topo.kind
    n = len(refs)
    block = np.full(n, -1, dtype=np.int64)
    slot = np.full(n, -1, dtype=np.int64)
    block0 = seed_atoms(topo)
    block[block0] = 0
    slot[block0] = np.arange(block0.size)
    full = np.flatnonzero(n_refs == FULL)
    order = full[np.argsort(level[full], kind="stable")]
    lv = level[order]
    sizes = np.bincount(lv, minlength=int(level.max(initial=0)) + 1)[1:]
    first = np.concatenate([[0], np.cumsum(sizes)])  # start of each level in `order`
    block[order] = lv
    slot[order] = np.arange(order.size) - first[lv - 1]
    block_size = np.concatenate([[block0.size], sizes]).astype(np.int64)
    # entries: level by level, all d, all a, all b refs of its atoms
    lo = first[lv - 1]  # (M,) first atom of each atom's level
    column = np.arange(3)[None, :] * sizes[lv - 1][:, None]
    pos = 3 * lo[:, None] + column + (np.arange(order.size) - lo)[:, None]
    need = np.empty(3 * order.size, dtype=np.int64)
    need[pos] = refs[order][:, ::-1]
    reader = np.repeat(np.arange(1, sizes.size + 1), 3 * sizes)  # level of each entry
    src, src_slot = block[need], slot[need]
    n_blocks = sizes.size + 1
    width = int(block_size.max(initial=1)) + 1
    pair_key = reader * n_blocks + src
    pairs, pair_of = np.unique(pair_key, return_inverse=True)  # sorted by (level, block)
    trips, trip_of = np.unique(pair_key * width + src_slot, return_inverse=True)
    trip_pair = np.searchsorted(pairs, trips // width)
    used = np.bincount(trip_pair, minlength=pairs.size)
    pair_level, pair_block = pairs // n_blocks, pairs % n_blocks
    whole = 2 * used >= block_size[pair_block]  # copy the whole block unless it is mostly unused
    rows = np.where(whole, block_size[pair_block], used)
    before = np.cumsum(rows) - rows  # pool rows before each pair, across levels
    level_pair0 = np.searchsorted(pair_level, np.arange(1, n_blocks))  # first pair of each level
    pair_offset = before - before[np.minimum(level_pair0, max(pairs.size - 1, 0))][pair_level - 1]
    trip0 = np.searchsorted(trip_pair, np.arange(pairs.size))  # first used slot of each pair
    rank = np.arange(trips.size) - trip0[trip_pair]
    flat = pair_offset[pair_of] + np.where(whole[pair_of], src_slot, rank[trip_of])
    pool = np.bincount(pair_level, weights=rows, minlength=n_blocks)[1:]
    in_place = flat == np.arange(need.size) - 3 * first[reader - 1]
    in_order = (np.bincount(reader, weights=~in_place, minlength=n_blocks)[1:] == 0) & (pool == 3 * sizes)
    # views of two index tensors: the used rows of each partly copied pair, each gathered level's rows
    part_rows = iter(as_long((trips % width)[~whole[trip_pair]]).split(used[~whole].tolist()))
    pair_parts = [(s, None if w else next(part_rows)) for s, w in zip(pair_block.tolist(), whole.tolist())]
    bounds = np.concatenate([level_pair0, [pairs.size]]).tolist()
    parts = [tuple(pair_parts[bounds[k] : bounds[k + 1]]) for k in range(sizes.size)]
    level_rows = iter(as_long(flat[~in_order[reader - 1]]).split((3 * sizes[~in_order]).tolist()))
    gathers = [None if keep else next(level_rows) for keep in in_order.tolist()]
    block_start = np.concatenate([[0], np.cumsum(block_size)])
    inverse = block_start[block] + slot
    return LevelPlan(
        seeds=seeds,
        rows=as_long(
            np.concatenate([np.flatnonzero(n_refs == SECOND), np.flatnonzero(n_refs == THIRD), order])
        ),
        full_atoms=as_long(order),
        level_sizes=tuple(int(s) for s in sizes),
        parts=tuple(parts),
        gathers=tuple(gathers),
        inverse=as_long(inverse),
    )


# ------------------------------------------------------------------ level loop
_EPS2 = EPS * EPS


#: Below this many elements ``torch.linalg.cross`` (one kernel, but a slow strided loop) beats the
#: written-out product (7 row kernels); measured on a 2-core CPU, float32.
CROSS_KERNEL_MAX = 2048


def cross(u: Tensor, v: Tensor, dim: int) -> Tensor:
    """Cross product along ``dim`` of batch-innermost arrays.

    ``torch.linalg.cross`` along a strided dimension runs a scalar loop: one
    kernel, fastest for small arrays, tens of times slower than written-out
    row operations (7 kernels on contiguous rows) for large ones. The choice
    depends on shapes only.
    """
    if u.numel() <= CROSS_KERNEL_MAX:
        return torch.linalg.cross(u, v, dim=dim)
    u0, u1, u2 = u.unbind(dim)
    v0, v1, v2 = v.unbind(dim)
    return torch.stack(
        (
            torch.addcmul(u1 * v2, u2, v1, value=-1.0),
            torch.addcmul(u2 * v0, u0, v2, value=-1.0),
            torch.addcmul(u0 * v1, u1, v0, value=-1.0),
        ),
        dim=dim,
    )


def frames(refs: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """NeRF frames of references ``refs = (a, b, c)`` ``(3, n, 3, B)``.

    Returns the unit axes ``en = (e1, e3)`` ``(n, 2, 3, B)`` and ``e2``
    ``(n, 3, B)``, the raw directions ``w = (u, m)`` ``(n, 2, 3, B)``,
    ``v = b - a`` and the inverse norms ``s = rsqrt(max(|w|^2, EPS^2))``
    ``(n, 2, 1, B)``. A collapsed direction (collinear or coincident
    references) gives a zero axis; every derivative stays finite there (the
    squared norm is smooth, and clamped before ``rsqrt``).
    """
    v, u = (refs[1:] - refs[:2]).unbind(0)  # b - a, c - b in one kernel
    w = torch.stack((u, cross(v, u, 1)), dim=1)
    s = torch.rsqrt((w * w).sum(2, keepdim=True).clamp_min(_EPS2))
    en = w * s
    e1, e3 = en.unbind(1)
    return en, cross(e3, e1, 1), w, v, s


def _pool(plan: LevelPlan, k: int, blocks: list[Tensor]) -> Tensor:
    """Reference positions of level ``k + 1``: ``(3 n, 3, B)``, all d, all a, all b."""
    pieces = [blocks[s] if rows is None else blocks[s].index_select(0, rows) for s, rows in plan.parts[k]]
    pool = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    gather = plan.gathers[k]
    return pool if gather is None else pool.index_select(0, gather)


def _levels(plan: LevelPlan, block0: Tensor, loc: Tensor, keep: bool) -> tuple[list[Tensor], list[Any]]:
    blocks = [block0]
    saved = []
    sizes = plan.level_sizes
    # every level's offset components as views, made in three calls rather than one per level
    l1s, l2s, l3s = (x.split(sizes) for x in loc.split(1, dim=1))
    for k, (size, l1, l2, l3) in enumerate(zip(sizes, l1s, l2s, l3s)):
        refs = _pool(plan, k, blocks).unflatten(0, (3, size))
        en, e2, w, v, s = frames(refs)
        c = refs[2]
        e1, e3 = en.unbind(1)
        blocks.append(c.addcmul(l1, e1).addcmul(l2, e2).addcmul(l3, e3))
        if keep:
            saved.append((torch.cat((en[:, :1], e2.unsqueeze(1), en[:, 1:]), dim=1), w, v, s))
    return blocks, saved


def plain_level_loop(plan: LevelPlan, block0: Tensor, loc: Tensor) -> Tensor:
    """The level loop in plain differentiable torch ops: ``(n0, 3, B), (M, 3, B) -> (n0 + M, 3, B)``."""
    blocks, _ = _levels(plan, block0, loc, keep=False)
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks)


#: ``torch.func`` wrapper test (a private torch function): without it every call takes the plain loop.
_IS_FUNCTORCH_WRAPPED = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)


def _needs_plain(*tensors: Tensor) -> bool:
    """True under torch.func transforms, forward-mode AD or torch.compile (the plain loop runs).

    Also True on a torch release without the (private) functorch wrapper test, so
    that a transform can never meet the hand-written backward unnoticed.
    """
    if torch.compiler.is_compiling() or _IS_FUNCTORCH_WRAPPED is None:
        return True
    return any(_IS_FUNCTORCH_WRAPPED(t) or forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def level_loop(plan: LevelPlan, block0: Tensor, loc: Tensor) -> Tensor:
    """Positions of every block, ``(n0 + M, 3, B)`` in block order.

    Args:
        plan: the table's :class:`~batched_nerf.engines.levels.LevelPlan`.
        block0: ``(n0, 3, B)`` positions of fixed, root and seed atoms.
        loc: ``(M, 3, B)`` local offsets ``r (-cos(theta), sin(theta) cos(phi),
            sin(theta) sin(phi))`` of the fully referenced atoms in build order.
    """
    if not plan.level_sizes:
        return block0
    if (
        (block0.requires_grad or loc.requires_grad)
        and torch.is_grad_enabled()
        and not _needs_plain(block0, loc)
    ):
        return LevelLoop.apply(block0, loc, plan)[0]
    return plain_level_loop(plan, block0, loc)


class LevelLoop(torch.autograd.Function):
    """:func:`plain_level_loop` with a hand-written first-order backward."""

    generate_vmap_rule = True

    @staticmethod
    def forward(block0: Tensor, loc: Tensor, plan: LevelPlan) -> tuple[Tensor, ...]:  # type: ignore[override]
        blocks, saved = _levels(plan, block0, loc, keep=True)
        # each level's frame is returned (non-differentiable) so that backward can reuse it
        return (torch.cat(blocks), *(t for level in saved for t in level))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        block0, loc, plan = inputs
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(block0, loc, *output)
        ctx.plan = plan

    @staticmethod
    def backward(ctx: Any, gxyz: Tensor | None, *_: Any) -> tuple[Tensor | None, Tensor | None, None]:  # type: ignore[override]
        block0, loc, xyz, *frames_ = ctx.saved_tensors
        plan = ctx.plan
        if gxyz is None:
            return None, None, None
        if torch.is_grad_enabled():
            # a graph of the backward is wanted: differentiate the plain loop again
            # (torch.func.vjp composes with autograd and with outer torch.func transforms)
            _, vjp = torch.func.vjp(lambda b0, lc: plain_level_loop(plan, b0, lc), block0, loc)
            gb0, glc = vjp(gxyz)
            return gb0, glc, None
        return (*level_loop_vjp(plan, block0, loc, frames_, gxyz), None)


def level_loop_vjp(
    plan: LevelPlan, block0: Tensor, loc: Tensor, saved: list[Tensor], gxyz: Tensor
) -> tuple[Tensor, Tensor]:
    """Reverse accumulation through the levels: gradients of ``block0`` and ``loc``.

    For ``x = c + sum_k l_k e_k`` the adjoint ``g`` of ``x`` gives
    ``dl_k = g . e_k``, ``de_k = l_k g``; through ``e2 = e3 x e1``:
    ``de3 += e1 x de2``, ``de1 += de2 x e3``; through ``e = w s``:
    ``dw = s (de - [|w| > EPS] (e . de) e)``; through ``m = v x u``:
    ``dv = u x dm``, ``du += dm x v``; and ``da = -dv``, ``db = dv - du``,
    ``dc = g + du``, scattered into the reference atoms' adjoints.
    """
    sizes = (block0.shape[0], *plan.level_sizes)
    grads = list(gxyz.split(sizes))
    e_all, w_all, v_all, s_all = (saved[i::4] for i in range(4))
    l_all = loc.split(plan.level_sizes)
    g_loc: list[Tensor] = [loc] * len(plan.level_sizes)
    for k in range(len(plan.level_sizes) - 1, -1, -1):
        g = grads[k + 1]
        e, w, v, s, l_k = e_all[k], w_all[k], v_all[k], s_all[k], l_all[k]
        g_loc[k] = (e * g.unsqueeze(1)).sum(2)
        ge = l_k.unsqueeze(2) * g.unsqueeze(1)  # (n, 3, 3, B): adjoints of e1, e2, e3
        e1, e3 = e[:, 0], e[:, 2]
        ge2 = ge[:, 1]
        # [de2 x e3, e1 x de2]: adjoints of e1, e3 through e2 = e3 x e1
        gen = ge[:, 0::2] + cross(torch.stack((ge2, e1), 1), torch.stack((e3, ge2), 1), 2)
        en = e[:, 0::2]
        keep = (w * w).sum(2, keepdim=True) >= _EPS2  # |w| >= EPS: the norm is not clamped
        dot = torch.where(keep, (en * gen).sum(2, keepdim=True), 0.0)
        gw = s * (gen - dot * en)
        u, gm = w[:, 0], gw[:, 1]
        # [u x dm, dm x v]: adjoints of v, u through m = v x u
        uv = cross(torch.stack((u, gm), 1), torch.stack((gm, v), 1), 2)
        gv = uv[:, 0]
        gu = gw[:, 0] + uv[:, 1]
        g_refs = torch.cat((-gv, gv - gu, g + gu))  # adjoints of all d, all a, all b refs
        _scatter(plan, k, grads, g_refs)
    return grads[0], torch.cat(g_loc)


def _scatter(plan: LevelPlan, k: int, grads: list[Tensor], g_refs: Tensor) -> None:
    """Add the reference adjoints of level ``k + 1`` to the adjoints of the blocks they came from."""
    gather = plan.gathers[k]
    parts = plan.parts[k]
    if gather is not None:
        n_pool = sum(grads[s].shape[0] if rows is None else rows.numel() for s, rows in parts)
        g_refs = g_refs.new_zeros((n_pool, *g_refs.shape[1:])).index_add(0, gather, g_refs)
    start = 0
    for s, rows in parts:
        size = grads[s].shape[0] if rows is None else rows.numel()
        piece = g_refs[start : start + size]
        start += size
        grads[s] = grads[s] + piece if rows is None else grads[s].index_add(0, rows, piece)


# ------------------------------------------------------------------- builder
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
    n2, n3 = plan.seeds.second.numel(), plan.seeds.third.numel()
    r2, r3, t3 = g_seed[:n2, 0], g_seed[n2 : n2 + n3, 0], g_seed[n2 : n2 + n3, 1]
    block0 = seed_positions(plan.seeds, r2, r3, t3, fixed, (n_samples,), rows=True)
    # local offsets r (-cos(theta), sin(theta) cos(phi), sin(theta) sin(phi)) of every full atom at once
    r, tp = g_full.split((1, 2), dim=1)
    cos, sin = sincos(tp)
    cos_t, cos_p = cos.split(1, dim=1)
    sin_t, sin_p = sin.split(1, dim=1)
    rs = r * sin_t
    loc = torch.cat((-r * cos_t, rs * cos_p, rs * sin_p), dim=1)
    xyz = level_loop(plan, block0, loc)
    return to_xyz(xyz, plan.inverse).reshape(*batch, n, 3)


LEVELS = Engine("levels", level_plan, build_levels)
