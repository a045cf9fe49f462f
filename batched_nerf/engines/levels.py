"""Level engine: place atoms level by level with precomputed index gathers.

One step per dependency level of the table (the longest chain of references):
all atoms whose references are placed are built together. Fast for shallow,
wide tables (small molecules, large batches); the scan engine (`scan`)
takes over for deep ones.

Frames follow the frame tree (`frame_tree`, the definition every engine
shares): each level takes the placement frames ``M`` of its ``PARENT`` and
``ANCHOR`` rows from the out-frames ``O = M L`` of earlier levels (and the
third seeds' anchors), builds NeRF frames from reference positions only for
its ``POSITIONS`` rows, places ``x = x_b + M l`` and, where a later level reads
them, keeps its own out-frames. Zero bonds and straight angles therefore
continue smoothly, exactly as in the scan engine.

Layout: the batch is flattened to ``B`` and kept innermost, atoms are rows
``(n, 3, B)``, frames ``(n, 3, 3, B)``. The inputs are transposed once on entry
(`layout`), the local offsets and rotations of all atoms are computed in
one pass, the level loop places each level with a few kernels (more for
``POSITIONS`` rows), and the result is transposed once on exit.

The level loop, `LevelLoop`, is an ``autograd.Function``: its forward
keeps each level's frames; its backward walks the levels in reverse, turning
the gradient of each placed atom and out-frame into gradients of its local
offset and rotation, of its bond reference's position and of the frame it was
placed in (reverse accumulation down the reference tree), in far fewer
kernels than autograd records for the same graph. It serves first derivatives
only: when a graph of the backward is wanted (``create_graph=True``,
``gradgradcheck``) it replays the plain differentiable loop, so every higher
derivative is the plain one; under ``torch.func`` transforms, forward-mode AD
and ``torch.compile`` the plain loop runs from the start (`level_loop`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from .._geometry import EPS
from ..runtime import gate
from ..topology.analysis import FULL, SECOND, THIRD, Topology
from ..topology.frame_tree import ANCHOR, PARENT, POSITIONS, frame_tree
from .base import Engine, Movable, as_long
from .function import Function
from .layout import sincos, to_rows, to_xyz
from .seeds import SeedPlan, seed_atoms, seed_plan, seed_positions

__all__ = ["LEVELS", "LevelPlan", "build_levels", "level_plan"]


@dataclass(frozen=True)
class LevelPlan(Movable):
    """Dependency-level plan: atoms whose references are placed are built together.

    The engine works atom-major, ``(n, 3, B)`` with the batch innermost. Block 0
    holds fixed atoms, roots, second and third seed atoms (the order of
    ``seeds.atoms``); block ``k >= 1`` the atoms of level ``k``, the
    ``POSITIONS`` rows of the frame tree first. Level ``k`` concatenates
    ``parts[k]`` (each a whole earlier block, or some of its rows) and then,
    unless ``gathers[k]`` is None, picks the rows ``d, a, b`` of its
    ``POSITIONS`` rows and ``b`` of its other rows from that pool. Frames
    ``(n, 3, 3, B)`` (columns ``e1, e2, e3``) live in frame blocks: block 0 the
    anchor frames and out-frames of the third seeds, block ``k`` the out-frames
    of level ``k`` (made only where ``frame_used[k]``); ``frame_parts[k]`` and
    ``frame_gathers[k]`` pick the placement frames of the level's ``PARENT`` and
    ``ANCHOR`` rows. Per level the atoms are ordered: ``POSITIONS`` rows whose
    out-frame is unused, those whose out-frame is read, the other rows whose
    out-frame is read, the rest; so the out-frames made (``n_read[k]``, from
    ``read_start[k]``) are one slice. Every copy is at most a small multiple of
    the level's own size, so a build does linear work in N.
    """

    seeds: SeedPlan
    rows: Tensor  # (S2 + S3 + M,) atoms whose (bond, angle, dihedral) are read: seconds, thirds, full
    full_atoms: Tensor  # (M,) fully referenced atoms in build order (per level: POSITIONS rows first)
    level_sizes: tuple[int, ...]  # atoms per level, summing to M
    n_positions: tuple[int, ...]  # per level: POSITIONS rows (placed from reference positions)
    parts: tuple[tuple[tuple[int, Tensor | None], ...], ...]  # per level: (block, rows or None = all)
    gathers: tuple[Tensor | None, ...]  # per level: rows of the pool, or None if in order
    frame_parts: tuple[tuple[tuple[int, Tensor | None], ...], ...]  # per level: (frame block, rows)
    frame_gathers: tuple[Tensor | None, ...]  # per level: rows of the frame pool, or None
    frame_used: tuple[bool, ...]  # per frame block (0: seeds, k: level k): read by a later level
    read_start: tuple[int, ...]  # per level: first atom whose out-frame a later level reads
    n_read: tuple[int, ...]  # per level: atoms whose out-frame is read (contiguous from read_start)
    read_rows: Tensor  # (R,) rows of `full_atoms` whose out-frame is read (their rotations are built)
    inverse: Tensor  # (N,) position of each atom in cat(all blocks)
    third_sign: Tensor  # (S3,) +1 where a third seed's bond reference is the second seed, else -1
    phi_paths: Tensor | None = None  # (M, W) rows of cat(dihedral rows, 0) summed into phi_eff
    flip_paths: Tensor | None = None  # (M, W') rows of cat(angles[flip_rows], 0) whose sin < 0 adds pi
    flip_rows: Tensor | None = None  # (F,) the rows (of `rows`) whose angle can turn a frame


def _pool_plans(
    reader: np.ndarray, need_block: np.ndarray, need_slot: np.ndarray, block_size: list[int], n_levels: int
) -> tuple[list[tuple[tuple[int, Tensor | None], ...]], list[Tensor | None]]:
    """Each level's pool (blocks, whole or the rows used, concatenated) and gather from it.

    Entry ``e`` (rows of ``reader``, ``need_block``, ``need_slot``, grouped by
    level in the order each level reads them) is the row ``need_slot[e]`` of
    block ``need_block[e]`` that level ``reader[e]`` reads. Each ``(level,
    block)`` pair copies the whole block or the rows it uses (sorted); an
    entry's pool row is its pair's offset in the level plus its row in the copy.
    Only the per-level tuples are assembled in Python.
    """
    sizes = np.asarray(block_size, dtype=np.int64)
    n_blocks = sizes.size
    width = int(sizes.max(initial=0)) + 1
    pair_key = reader * n_blocks + need_block
    pairs, pair_of = np.unique(pair_key, return_inverse=True)  # sorted by (level, block)
    trips, trip_of = np.unique(pair_key * width + need_slot, return_inverse=True)
    trip_pair = np.searchsorted(pairs, trips // width)
    used = np.bincount(trip_pair, minlength=pairs.size)
    pair_level, pair_block = pairs // n_blocks, pairs % n_blocks
    whole = 2 * used >= sizes[pair_block]  # copy the whole block unless it is mostly unused
    rows = np.where(whole, sizes[pair_block], used)
    before = np.cumsum(rows) - rows  # pool rows before each pair, across levels
    level_pair0 = np.searchsorted(pair_level, np.arange(n_levels + 1))  # first pair of each level
    pair_offset = before - before[level_pair0[pair_level]]
    trip0 = np.searchsorted(trip_pair, np.arange(pairs.size))  # first used row of each pair
    rank = np.arange(trips.size) - trip0[trip_pair]
    flat = pair_offset[pair_of] + np.where(whole[pair_of], need_slot, rank[trip_of])
    count = np.bincount(reader, minlength=n_levels)
    entry0 = np.concatenate([[0], np.cumsum(count)])
    pool = np.bincount(pair_level, weights=rows, minlength=n_levels)
    in_place = flat == np.arange(flat.size) - entry0[reader]
    in_order = (np.bincount(reader, weights=~in_place, minlength=n_levels) == 0) & (pool == count)
    # views of two index tensors: the rows of each partly copied pair, each gathered level's rows
    part_rows = iter(as_long((trips % width)[~whole[trip_pair]]).split(used[~whole].tolist()))
    pair_parts = [(b, None if w else next(part_rows)) for b, w in zip(pair_block.tolist(), whole.tolist())]
    bounds = level_pair0.tolist()
    parts = [tuple(pair_parts[bounds[k] : bounds[k + 1]]) for k in range(n_levels)]
    level_rows = iter(as_long(flat[~in_order[reader]]).split(count[~in_order].tolist()))
    gathers = [None if keep else next(level_rows) for keep in in_order.tolist()]
    return parts, gathers


def _link_paths(link: np.ndarray, start: np.ndarray, row: np.ndarray, pad: int) -> np.ndarray:
    """``(M, W)`` rows of ``start, link[start], link[link[start]], ...`` (``pad`` past a chain's end)."""
    cols = []
    cur = start
    while (cur >= 0).any():
        cols.append(np.where(cur >= 0, row[np.maximum(cur, 0)], pad))
        cur = np.where(cur >= 0, link[np.maximum(cur, 0)], -1)
    return np.stack(cols, axis=1) if cols else np.zeros((start.size, 0), dtype=np.int64)


def level_plan(topo: Topology, variant: int = 1) -> LevelPlan:
    """Level plan of ``topo``: atoms grouped by dependency level, the pools and gathers per level."""
    seeds = seed_plan(topo)
    tree = frame_tree(topo)
    refs = topo.refs
    level = topo.level
    n_refs = topo.kind
    n = len(refs)
    block = np.full(n, -1, dtype=np.int64)
    slot = np.full(n, -1, dtype=np.int64)
    block0 = seed_atoms(topo)
    block[block0] = 0
    slot[block0] = np.arange(block0.size)
    full = np.flatnonzero(n_refs == FULL)
    is_pos = tree.frame == POSITIONS
    is_read = np.zeros(n, dtype=bool)
    is_read[tree.parent[tree.frame == PARENT]] = True
    group = np.where(is_pos, np.where(is_read, 1, 0), np.where(is_read, 2, 3))
    order = full[np.lexsort((full, group[full], level[full]))]
    sizes = np.bincount(level[order], minlength=int(level.max(initial=0)) + 1)[1:].tolist()
    second, third = np.flatnonzero(n_refs == SECOND), np.flatnonzero(n_refs == THIRD)
    n3 = third.size
    # out-frame of each atom (frame block, slot); third seeds' anchors are slots 0..S3-1 of block 0
    fblock = np.full(n, -1, dtype=np.int64)
    fslot = np.full(n, -1, dtype=np.int64)
    anchor_slot = np.full(n, -1, dtype=np.int64)
    fblock[third], fslot[third], anchor_slot[third] = 0, n3 + np.arange(n3), np.arange(n3)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    lv = level[order]  # (M,) level of each atom in build order
    rank = np.arange(order.size) - starts[lv - 1]  # position of each atom in its level
    n_levels = len(sizes)
    block[order] = fblock[order] = lv
    slot[order] = rank
    # out-frames made per level: the atoms a later level reads, one slice from read_start
    read_start_of = np.bincount(lv - 1, weights=group[order] == 0, minlength=n_levels).astype(np.int64)
    n_read_of = np.bincount(lv - 1, weights=is_read[order], minlength=n_levels).astype(np.int64)
    fslot[order] = rank - read_start_of[lv - 1]
    read_start, n_read = read_start_of.tolist(), n_read_of.tolist()
    read_rows = np.flatnonzero(is_read[order])  # groups 1 and 2: contiguous within each level
    block_size = [int(block0.size), *sizes]
    fblock_size = [2 * n3, *n_read]
    # position pool entries, per level: d, a, b of its POSITIONS rows, then b of its other rows
    pos = is_pos[order]
    n_pos = np.bincount(lv[pos] - 1, minlength=n_levels)
    n_pos_of = n_pos[lv - 1]
    entry0 = np.concatenate([[0], np.cumsum(2 * n_pos + np.asarray(sizes, dtype=np.int64))])
    at = entry0[lv - 1] + 2 * n_pos_of + rank  # the bond reference's entry
    need = np.empty(entry0[-1], dtype=np.int64)
    need[at] = refs[order, 0]  # b (POSITIONS rows: the last of their three columns)
    need[at[pos] - 2 * n_pos_of[pos]] = tree.dihedral_ref[order[pos]]
    need[at[pos] - n_pos_of[pos]] = refs[order[pos], 1]
    reader = np.repeat(np.arange(n_levels), np.diff(entry0))
    parts, gathers = _pool_plans(reader, block[need], slot[need], block_size, n_levels)
    n_positions = n_pos.tolist()
    # frame pool entries, per level: the placement frames of its PARENT and ANCHOR rows
    framed = order[~pos]
    p = tree.parent[framed]
    anchored = tree.frame[framed] == ANCHOR
    fb = np.where(anchored, 0, fblock[p])
    fs = np.where(anchored, anchor_slot[p], fslot[p])
    frame_used = np.zeros(len(fblock_size), dtype=bool)
    frame_used[fb] = True
    frame_parts, frame_gathers = _pool_plans(lv[~pos] - 1, fb, fs, fblock_size, n_levels)
    block_start = np.concatenate([[0], np.cumsum(block_size)])
    inverse = block_start[block] + slot
    rows = np.concatenate([second, third, order])
    row = np.full(n, -1, dtype=np.int64)
    row[rows] = np.arange(rows.size)
    phi = _link_paths(tree.phi_from, order, row, rows.size)
    flip = _link_paths(tree.flip_on, tree.flip_on[order], row, rows.size)
    # compact: only the angles that can turn a frame are read (the pad becomes the last row)
    flip_rows = np.unique(flip[flip < rows.size])
    compact = np.full(rows.size + 1, flip_rows.size, dtype=np.int64)
    compact[flip_rows] = np.arange(flip_rows.size)
    flip = compact[flip]
    plain_phi = phi.shape[1] <= 1 and flip.shape[1] == 0
    return LevelPlan(
        seeds=seeds,
        rows=as_long(rows),
        full_atoms=as_long(order),
        level_sizes=tuple(sizes),
        n_positions=tuple(n_positions),
        parts=tuple(parts),
        gathers=tuple(gathers),
        frame_parts=tuple(frame_parts),
        frame_gathers=tuple(frame_gathers),
        frame_used=tuple(bool(u) for u in frame_used),
        read_start=tuple(read_start),
        n_read=tuple(n_read),
        read_rows=as_long(read_rows),
        inverse=as_long(inverse),
        third_sign=torch.as_tensor(
            np.where(topo.refs[third, 0] == topo.seed_second[topo.seed_slot[third]], 1, -1)
        ),
        phi_paths=None if plain_phi else as_long(phi),
        flip_paths=None if flip.shape[1] == 0 else as_long(flip),
        flip_rows=None if flip.shape[1] == 0 else as_long(flip_rows),
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


def _take(parts: tuple[tuple[int, Tensor | None], ...], gather: Tensor | None, blocks: list[Any]) -> Tensor:
    """The pool of ``parts`` (whole blocks or some of their rows), gathered if ``gather`` is given."""
    pieces = [blocks[s] if rows is None else blocks[s].index_select(0, rows) for s, rows in parts]
    pool = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    return pool if gather is None else pool.index_select(0, gather)


def _levels(
    plan: LevelPlan, block0: Tensor, frame0: Tensor, loc: Tensor, rot: Tensor, keep: bool
) -> tuple[list[Tensor], list[Tensor]]:
    blocks = [block0]
    fblocks: list[Tensor | None] = [frame0]
    saved: list[Tensor] = []
    sizes = plan.level_sizes
    locs, rots = loc.split(sizes), rot.split(plan.n_read)
    for k, (size, l_k) in enumerate(zip(sizes, locs)):
        n_pos = plan.n_positions[k]
        pool = _take(plan.parts[k], plan.gathers[k], blocks)
        frames_k = []
        if n_pos:  # POSITIONS rows: NeRF frames of the reference positions
            en, e2, w, v, s = frames(pool[: 3 * n_pos].unflatten(0, (3, n_pos)))
            e1, e3 = en.unbind(1)
            frames_k.append(torch.stack((e1, e2, e3), dim=2))
        if size > n_pos:  # PARENT and ANCHOR rows: out-frames and anchors
            frames_k.append(_take(plan.frame_parts[k], plan.frame_gathers[k], fblocks))
        m = frames_k[0] if len(frames_k) == 1 else torch.cat(frames_k)
        xb = pool[2 * n_pos :]
        blocks.append(
            xb.addcmul(m[:, :, 0], l_k[:, 0:1])
            .addcmul(m[:, :, 1], l_k[:, 1:2])
            .addcmul(m[:, :, 2], l_k[:, 2:3])
        )
        if plan.n_read[k]:  # out-frames O = M L of the atoms a later level reads
            r_k = rots[k]
            mr = m.narrow(0, plan.read_start[k], plan.n_read[k])
            o = (
                (mr[:, :, 0:1] * r_k[:, 0:1])
                .addcmul(mr[:, :, 1:2], r_k[:, 1:2])
                .addcmul(mr[:, :, 2:3], r_k[:, 2:3])
            )
            fblocks.append(o)
        else:
            fblocks.append(None)
        if keep:
            if not n_pos:
                w = v = s = m.new_zeros(0)
            saved.extend((m, w, v, s))
    return blocks, saved


def plain_level_loop(plan: LevelPlan, block0: Tensor, frame0: Tensor, loc: Tensor, rot: Tensor) -> Tensor:
    """The level loop in plain differentiable torch ops: ``(n0, 3, B), ..., (M, 3, B) -> (n0 + M, 3, B)``."""
    blocks, _ = _levels(plan, block0, frame0, loc, rot, keep=False)
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks)


def _needs_plain(*tensors: Tensor) -> bool:
    """True under torch.func transforms, forward-mode AD or torch.compile (the plain loop runs; also
    on a torch release without the functorch wrapper test, so that a transform can never meet the
    hand-written backward unnoticed): the gate's `REFERENCE`."""
    return gate.route(*tensors) == gate.REFERENCE


def level_loop(plan: LevelPlan, block0: Tensor, frame0: Tensor, loc: Tensor, rot: Tensor) -> Tensor:
    """Positions of every block, ``(n0 + M, 3, B)`` in block order.

    Args:
        plan: the table's `LevelPlan`.
        block0: ``(n0, 3, B)`` positions of fixed, root and seed atoms.
        frame0: ``(2 S3, 3, 3, B)`` anchor frames, then out-frames, of the third
            seeds (`seed_frames`; ``(0, 3, 3, B)`` when no row reads them).
        loc: ``(M, 3, B)`` local offsets ``r (-cos(theta), sin(theta) cos(phi),
            sin(theta) sin(phi))`` of the fully referenced atoms in build order.
        rot: ``(M, 3, 3, B)`` their local rotations ``L(theta, phi)`` (`local_frames`).
    """
    if not plan.level_sizes:
        return block0
    inputs = (block0, frame0, loc, rot)
    if any(t.requires_grad for t in inputs) and torch.is_grad_enabled() and not _needs_plain(*inputs):
        return LevelLoop.apply(*inputs, plan)[0]
    return plain_level_loop(plan, *inputs)


class LevelLoop(Function):
    """`plain_level_loop` with a hand-written first-order backward."""

    generate_vmap_rule = True

    @staticmethod
    def forward(
        block0: Tensor, frame0: Tensor, loc: Tensor, rot: Tensor, plan: LevelPlan
    ) -> tuple[Tensor, ...]:  # type: ignore[override]
        blocks, saved = _levels(plan, block0, frame0, loc, rot, keep=True)
        # each level's frames are returned (non-differentiable) so that backward can reuse them
        return (torch.cat(blocks), *saved)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        *tensors, plan = inputs
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*tensors, *output[1:])
        ctx.plan = plan

    @staticmethod
    def backward(ctx: Any, gxyz: Tensor | None, *_: Any) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        block0, frame0, loc, rot, *saved = ctx.saved_tensors
        plan = ctx.plan
        if gxyz is None:
            return None, None, None, None, None
        if torch.is_grad_enabled():
            # a graph of the backward is wanted: differentiate the plain loop again
            # (torch.func.vjp composes with autograd and with outer torch.func transforms)
            _, vjp = torch.func.vjp(lambda *t: plain_level_loop(plan, *t), block0, frame0, loc, rot)
            return (*vjp(gxyz), None)
        return (*level_loop_vjp(plan, block0, frame0, loc, rot, saved, gxyz), None)


def level_loop_vjp(
    plan: LevelPlan,
    block0: Tensor,
    frame0: Tensor,
    loc: Tensor,
    rot: Tensor,
    saved: list[Tensor],
    gxyz: Tensor,
) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
    """Reverse accumulation through the levels: gradients of ``block0``, ``frame0``, ``loc``, ``rot``.

    For ``x = x_b + M l`` and ``O = M L`` the adjoints ``g`` of ``x`` and ``G`` of
    ``O`` give ``dl = M^T g``, ``dM = g l^T + G L^T``, ``dL = M^T G``, ``dx_b = g``;
    ``dM`` goes to the out-frame it was read from, or, for ``POSITIONS`` rows,
    through the NeRF frame: with ``e2 = e3 x e1``: ``de3 += e1 x de2``,
    ``de1 += de2 x e3``; through ``e = w s``: ``dw = s (de - [|w| > EPS] (e . de) e)``;
    through ``m = v x u``: ``dv = u x dm``, ``du += dm x v``; and ``da = -dv``,
    ``db = dv - du``, ``dc = du``, scattered into the reference atoms' adjoints.
    """
    sizes = plan.level_sizes
    grads: list[Tensor | None] = list(gxyz.split((block0.shape[0], *sizes)))
    fgrads: list[Tensor | None] = [None] * (len(sizes) + 1)
    block_size = (block0.shape[0], *sizes)
    fblock_size = (frame0.shape[0], *plan.n_read)
    locs, rots = loc.split(sizes), rot.split(plan.n_read)
    g_loc: list[Tensor] = [loc] * len(sizes)
    g_rot: list[Tensor] = [rot] * len(sizes)
    for k in range(len(sizes) - 1, -1, -1):
        g = cast(Tensor, grads[k + 1])  # every level's adjoint is a piece of gxyz
        m, w, v, s = saved[4 * k : 4 * k + 4]
        l_k, r_k, n_pos = locs[k], rots[k], plan.n_positions[k]
        g_loc[k] = (m * g.unsqueeze(2)).sum(1)
        gm = g.unsqueeze(2) * l_k.unsqueeze(1)  # (n, 3, 3, B): adjoint of M through x
        go = fgrads[k + 1]
        if go is None:
            g_rot[k] = r_k.new_zeros(r_k.shape)
        else:  # through O = M L of the atoms whose out-frame is read
            mr = m.narrow(0, plan.read_start[k], plan.n_read[k])
            gmr = gm.narrow(0, plan.read_start[k], plan.n_read[k])  # a view: updated in place
            for j in range(3):
                gmr.addcmul_(go[:, :, j : j + 1], r_k[:, :, j].unsqueeze(1))
            gr = mr[:, 0].unsqueeze(2) * go[:, 0].unsqueeze(1)
            g_rot[k] = gr.addcmul(mr[:, 1].unsqueeze(2), go[:, 1].unsqueeze(1)).addcmul(
                mr[:, 2].unsqueeze(2), go[:, 2].unsqueeze(1)
            )
        if n_pos:
            e1, e2, e3 = m[:n_pos].unbind(2)
            ge = gm[:n_pos]
            ge2 = ge[:, :, 1]
            # [de2 x e3, e1 x de2]: adjoints of e1, e3 through e2 = e3 x e1
            gen = torch.stack((ge[:, :, 0], ge[:, :, 2]), 1) + cross(
                torch.stack((ge2, e1), 1), torch.stack((e3, ge2), 1), 2
            )
            en = torch.stack((e1, e3), 1)
            keep = (w * w).sum(2, keepdim=True) >= _EPS2  # |w| >= EPS: the norm is not clamped
            dot = torch.where(keep, (en * gen).sum(2, keepdim=True), 0.0)
            gw = s * (gen - dot * en)
            u, gmm = w[:, 0], gw[:, 1]
            # [u x dm, dm x v]: adjoints of v, u through m = v x u
            uv = cross(torch.stack((u, gmm), 1), torch.stack((gmm, v), 1), 2)
            gv = uv[:, 0]
            gu = gw[:, 0] + uv[:, 1]
            g_refs = torch.cat(
                (-gv, gv - gu, g[:n_pos] + gu, g[n_pos:])
            )  # d, a, b of POSITIONS rows, b of others
        else:
            g_refs = g
        _scatter(plan.parts[k], plan.gathers[k], grads, block_size, g_refs)
        if sizes[k] > n_pos:
            _scatter(plan.frame_parts[k], plan.frame_gathers[k], fgrads, fblock_size, gm[n_pos:])
    return grads[0], fgrads[0], torch.cat(g_loc), torch.cat(g_rot)  # type: ignore[return-value]


def _scatter(
    parts: tuple[tuple[int, Tensor | None], ...],
    gather: Tensor | None,
    grads: list[Tensor | None],
    block_size: tuple[int, ...],
    g_pool: Tensor,
) -> None:
    """Add the adjoints of a pool to the adjoints of the blocks it was taken from (None: zero)."""
    if gather is not None:
        n_pool = sum(block_size[s] if rows is None else rows.numel() for s, rows in parts)
        g_pool = g_pool.new_zeros((n_pool, *g_pool.shape[1:])).index_add(0, gather, g_pool)
    start = 0
    for s, rows in parts:
        size = block_size[s] if rows is None else rows.numel()
        piece = g_pool[start : start + size]
        start += size
        cur = grads[s]
        if rows is None:
            grads[s] = piece if cur is None else cur + piece
        else:
            if cur is None:
                cur = piece.new_zeros((block_size[s], *piece.shape[1:]))
            grads[s] = cur.index_add(0, rows, piece)


# ------------------------------------------------------------------- builder
def local_frames(r: Tensor, tp: Tensor, read: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Local offsets ``(M, 3, B)`` and rotations ``(R, 3, 3, B)`` from bonds ``(M, 1, B)`` and
    angles and dihedrals ``tp`` ``(M, 2, B)`` (rotations of the rows ``read``, default all).

    ``l = r u`` with ``u = (-cos t, sin t cos p, sin t sin p)``, and
    ``L(t, p) = R_x(p) R_z(pi - t)`` (first column ``u``), followed by a half turn
    ``R_x(pi)`` where ``sin t < 0`` (the scan engine's local transform):

    ```text
    L = [[-c,      -g s,      0      ],
         [ s cp,   -g c cp,  -g sp   ],
         [ s sp,   -g c sp,   g cp   ]]      g = sign(s) (+1 at s = 0)
    ```
    """
    cos, sin = sincos(tp)
    ct, cp = cos.unbind(1)
    st, sp = sin.unbind(1)
    loc = torch.stack((-ct, st * cp, st * sp), dim=1) * r
    if read is not None and read.numel() != tp.shape[0]:
        (ct, cp), (st, sp) = (v.index_select(0, read).unbind(1) for v in (cos, sin))
    ng = 2.0 * (st < 0).to(st.dtype) - 1.0  # -g
    nct = -ct
    ngc = ng * nct  # g c
    entries = (nct, ng * st, torch.zeros_like(ct), st * cp, -ngc * cp, ng * sp, st * sp, -ngc * sp, -ng * cp)
    return loc, torch.stack(entries, dim=1).unflatten(1, (3, 3))


def seed_frames(plan: LevelPlan, theta3: Tensor) -> Tensor:
    """Anchor frames, then out-frames ``O_T = A L(theta_T, 0)``, of the third seeds: ``(2 S3, 3, 3, B)``.

    The anchor of third seed ``T`` is ``A = diag(s, 1, s)``, ``s = plan.third_sign``.
    """
    n3, batch = theta3.shape
    if not (plan.frame_used[0] and n3):
        return theta3.new_zeros((0, 3, 3, batch))
    s = plan.third_sign.to(theta3.dtype).unsqueeze(-1).expand(n3, batch)
    ct, st = torch.cos(theta3), torch.sin(theta3)
    g = 1.0 - 2.0 * (st < 0).to(st.dtype)
    zero, one = torch.zeros_like(ct), torch.ones_like(ct)
    sct = s * ct
    out = (-sct, -s * (g * st), zero, st, -g * ct, zero, zero, zero, s * g)
    anchor = (s, zero, zero, zero, one, zero, zero, zero, s)
    return torch.stack(anchor + out, dim=1).unflatten(1, (2, 3, 3)).transpose(0, 1).flatten(0, 1)


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
    and the result (contiguous) once at exit. Placement frames follow the frame
    tree (`frame_tree`), as in every engine.
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
    r, tp = g_full.split((1, 2), dim=1)
    if plan.phi_paths is not None:  # effective dihedrals: sibling offsets and flips
        pad = g.new_zeros((1, n_samples))
        dih = torch.cat((g[:, 2], pad))
        phi = dih.index_select(0, plan.phi_paths.reshape(-1)).unflatten(0, plan.phi_paths.shape).sum(1)
        if plan.flip_paths is not None:
            turned = torch.sin(g[:, 1].index_select(0, plan.flip_rows)) < 0
            flipped = torch.cat((turned.to(g.dtype) * torch.pi, pad))
            flips = flipped.index_select(0, plan.flip_paths.reshape(-1)).unflatten(0, plan.flip_paths.shape)
            phi = phi + flips.sum(1)
        tp = torch.stack((tp[:, 0], phi), dim=1)
    loc, rot = local_frames(r, tp, plan.read_rows)
    xyz = level_loop(plan, block0, seed_frames(plan, t3), loc, rot)
    return to_xyz(xyz, plan.inverse).reshape(*batch, n, 3)


LEVELS = Engine("levels", level_plan, build_levels)
