"""Scan plan: the frame tree cut into rounds, bands and pointer-jumping steps, once per table.

The planner of the scan engine (`scan`, where the method is described):
numpy work on the table's [`Topology`][batched_nerf.Topology] and its frame tree
(`frame_tree`), made on first use for one band size (the plan variant)
and cached by the table. The result, `ScanPlan`, holds index tensors
and Python values only.

Whole-array numpy, in phases: subtree roots and depths by pointer jumping
(`_forest`), rounds frontier by frontier over the irregular rows'
dependencies (`_round_members`), then one vectorised pass per round
(`_round_plan`, with one step per band depth in `_bands`) and the
dihedral sums column by column (`_finish`). No loop runs over rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from ...topology.analysis import FULL, SECOND, THIRD, Topology
from ...topology.frame_tree import ANCHOR, NONE, PARENT, POSITIONS, FrameTree, frame_tree
from ..base import Movable, as_long
from ..seeds import SeedPlan, seed_atoms, seed_plan
from .path import Take

__all__ = ["RoundPlan", "ScanPlan", "scan_plan"]


@dataclass(frozen=True)
class RoundPlan(Movable):
    """One round: irregular roots and anchors, then pointer jumping over their subtrees.

    Node order: ``[sentinel, anchors, irregular roots, scanned atoms]``. Scanned
    atoms are cut into bands of ``K`` consecutive depths: within a band, frames
    relative to the band's top are composed in ``K`` sequential steps (O(N)
    work); the band tops form a tree ``K`` times shallower, composed by pointer
    jumping; one fix-up pass applies each band top's frame. ``K = 1`` is plain
    pointer jumping over all atoms.
    """

    n_anchor: int
    anchor_origin: Take  # (n_anchor,) rows of the position pool at the anchor origin
    anchor_rot: Tensor  # (n_anchor, 3, 3) constant anchor rotations (float64)
    irregular_atoms: Tensor  # (n_irr,) atom indices
    irregular_refs: Tensor  # (n_irr * 3,) rows of the position pool for (d, a, b)
    scan_atoms: Tensor  # (n_scan,) atom indices (third seeds included), in band-step order
    scan_phi_zero: Tensor  # (n_scan,) bool: dihedral fixed at 0 (third seeds)
    step_sizes: tuple[int, ...]  # scanned nodes per in-band step t = 0..K-1
    step_parent: tuple[Tensor, ...]  # per step t >= 1: row of each node's parent in step t-1
    n_boundary: int  # scanned nodes at the bottom of a band (the last step's nodes)
    band_parent: Tensor  # (n_roots + n_boundary,) boundary tree parent (0 = sentinel)
    jumps: tuple[Tensor, ...]  # pointer jumping over the boundary tree: ptr^(2^k)
    rot_steps: int  # rotation steps needed (fewer than translation steps for K = 1)
    scan_band_root: Tensor  # (n_scan,) boundary node above each scanned node's band
    node_root: Tensor  # (n_roots + n_scan,) index of each node's root among the real roots
    pool_blocks: int  # number of position blocks the irregular gathers read
    path: Take | None = None  # scanned atoms in path order when they form one path below one root


@dataclass(frozen=True)
class ScanPlan(Movable):
    """Everything `build_scan` needs."""

    seeds: SeedPlan
    phi_paths: Tensor  # (N, L) dihedral indices summed into the effective dihedral (N = zero)
    flip_paths: Tensor | None  # (N, L') atoms whose negative angle adds pi to that sum (N = none)
    rounds: tuple[RoundPlan, ...]
    inverse: Tensor  # (N,) row of cat(position blocks) holding each atom
    depth: int  # longest scanned path (for dispatch and reports)
    seed_inputs: Take | None = None  # the inputs' columns that seed_block reads (as few slices)
    seeds_local: SeedPlan | None = None  # `seeds` indexing those columns
    gathers: bool = True  # the build uses index gathers (a compiled CPU backward needs torch >= 2.14.1)
    phi_mask: Tensor | None = None  # (N,) bool: no sibling sums, phi_eff = where(mask, dihedrals, 0)
    assemble: Take | None = None  # `inverse` as slices where it is a few runs


def scan_plan(topo: Topology, block: int = 1) -> ScanPlan:
    """Scan plan of ``topo`` with bands of ``block`` depths (1: plain pointer jumping)."""
    tree = frame_tree(topo)  # the classification is the frame tree's (the definition)
    forest = _forest(topo, tree)
    layout = _Layout.start(topo)
    rounds, depth = [], 0
    for members in _round_members(topo, tree, forest):
        plan, round_depth = _round_plan(topo, tree, forest, layout, members, block)
        rounds.append(plan)
        depth = max(depth, round_depth)
    return _finish(topo, seed_plan(topo), tree, tuple(rounds), layout.row, depth)


# ------------------------------------------------------------------ the forest
@dataclass(frozen=True)
class _Forest:
    """Per-atom view of the frame tree (``-1`` / ``0`` for rows outside it)."""

    eff: np.ndarray  # (N, 3) refs with the effective dihedral reference
    root: np.ndarray  # (N,) the anchor's third seed or the irregular row at the top of each subtree
    depth: np.ndarray  # (N,) parent steps below the root (children of an anchor: 1)


def _forest(topo: Topology, tree: FrameTree) -> _Forest:
    """Roots and depths by pointer jumping along ``PARENT`` links."""
    n = topo.n_atoms
    full = topo.kind == FULL
    eff = np.array(topo.refs, dtype=np.int64).reshape(-1, 3)
    eff[full, 2] = tree.dihedral_ref[full]
    linked = tree.frame == PARENT
    top = np.where(linked, tree.parent, np.arange(n, dtype=np.int64))
    dist = linked.astype(np.int64)  # parent steps from j to top[j]
    active = np.flatnonzero(linked)
    while active.size:  # rows whose top is still a PARENT row
        up = top[active]
        dist[active] += dist[up]
        up = top[up]
        top[active] = up
        active = active[linked[up]]
    anchored = tree.frame[top] == ANCHOR
    root = np.where(anchored, tree.parent[top], np.where(tree.frame == NONE, -1, top))
    return _Forest(eff=eff, root=root, depth=dist + anchored)


def _round_members(topo: Topology, tree: FrameTree, forest: _Forest) -> list[np.ndarray]:
    """Atoms of each round, in index order.

    Anchors are round 0; an irregular row is one round after the latest
    scanned atom it reads (``max(0, round + 1)`` over its fully referenced
    references, whose rounds are those of their roots); its subtree shares its round.
    """
    irr = np.flatnonzero(tree.frame == POSITIONS)
    pos = np.full(topo.n_atoms, -1, dtype=np.int64)
    pos[irr] = np.arange(irr.size)
    reads = forest.eff[irr]
    dep = topo.kind[reads] == FULL  # block-0 rows (seeds, fixed) are readable in round 0
    src = np.broadcast_to(np.arange(irr.size)[:, None], reads.shape)[dep]
    dst_root = forest.root[reads[dep]]
    base = np.zeros(irr.size, dtype=np.int64)
    base[src[tree.frame[dst_root] == ANCHOR]] = 1  # reads an anchored atom (round 0)
    on_irr = tree.frame[dst_root] == POSITIONS
    root_round = _longest_paths(base, src[on_irr], pos[dst_root[on_irr]])
    round_of = np.where(forest.root >= 0, 0, -1)
    below_irr = np.flatnonzero((forest.root >= 0) & (pos[np.maximum(forest.root, 0)] >= 0))
    round_of[below_irr] = root_round[pos[forest.root[below_irr]]]
    atoms = np.flatnonzero(round_of >= 0)
    by_round = atoms[np.argsort(round_of[atoms], kind="stable")]
    counts = np.bincount(round_of[atoms], minlength=0)
    return np.split(by_round, np.cumsum(counts)[:-1]) if counts.size else []


def _longest_paths(base: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``r[i] = max(base[i], 1 + max r[dst] over edges (i, dst))`` on a DAG, frontier by frontier."""
    m = base.size
    indeg = np.bincount(src, minlength=m)
    by_dst = np.argsort(dst, kind="stable")
    ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=m))])
    rnd = base.copy()
    frontier = np.flatnonzero(indeg == 0)
    while frontier.size:
        count = ptr[frontier + 1] - ptr[frontier]
        first = np.repeat(ptr[frontier] - np.cumsum(count) + count, count)
        edges = by_dst[first + np.arange(count.sum())]
        np.maximum.at(rnd, src[edges], rnd[dst[edges]] + 1)
        np.subtract.at(indeg, src[edges], 1)
        frontier = np.unique(src[edges][indeg[src[edges]] == 0])
    return rnd


# ------------------------------------------------------------------ the layout
@dataclass
class _Layout:
    """Position blocks: 0 = seed block; ``r + 1`` = nodes of round ``r``, concatenated."""

    row: np.ndarray  # (N,) row of cat(blocks) holding each placed atom (-1: not yet)
    n_rows: int  # rows of the blocks so far
    n_blocks: int
    row_in_step: np.ndarray  # (N,) scratch for the round being planned: row of an atom in its step

    @classmethod
    def start(cls, topo: Topology) -> _Layout:
        seed_rows = seed_atoms(topo)
        row = np.full(topo.n_atoms, -1, dtype=np.int64)
        row[seed_rows] = np.arange(seed_rows.size)
        return cls(row, int(seed_rows.size), 1, np.zeros(topo.n_atoms, dtype=np.int64))

    def place(self, atoms: np.ndarray, slots: np.ndarray, n_nodes: int) -> None:
        """Append a block of ``n_nodes`` rows, ``atoms`` at rows ``slots`` of it."""
        self.row[atoms] = self.n_rows + slots
        self.n_rows += n_nodes
        self.n_blocks += 1


# ------------------------------------------------------------------ one round
def _round_plan(
    topo: Topology,
    tree: FrameTree,
    forest: _Forest,
    layout: _Layout,
    members: np.ndarray,
    block: int,
) -> tuple[RoundPlan, int]:
    """The plan of the next round (its atoms ``members``, in index order) and its depth.

    Nodes: ``[sentinel, anchors, irregular roots, scanned atoms]``; scanned
    atoms in bands of ``K = min(block, depth)`` depths (see `RoundPlan`).
    """
    kind = topo.kind
    irr = members[tree.frame[members] == POSITIONS]
    scanned = members[tree.frame[members] != POSITIONS]
    anchors = scanned[kind[scanned] == THIRD]
    roots = np.concatenate([anchors, irr])
    depth = forest.depth[scanned]
    round_depth = int(depth.max(initial=0))
    n_roots = 1 + roots.size
    is_path = roots.size == 1 and scanned.size == round_depth > 0  # one path below one root
    k_band = max(1, min(block, round_depth))
    row = layout.row_in_step  # scratch: first each root's rank among the roots
    row[roots] = np.arange(roots.size)
    bands = _bands(tree.parent, row, scanned, depth, row[forest.root[scanned]], n_roots, k_band)
    n_boundary = bands.order.size - int(bands.step_start[-2])
    band_parent = np.concatenate(
        [np.zeros(n_roots, dtype=np.int64), bands.top[bands.order.size - n_boundary :]]
    )
    node_root = np.concatenate([[0], np.arange(n_roots - 1), bands.root_rank])
    steps, rot_steps = _jump_steps(round_depth, k_band)
    path_order = scanned[np.argsort(depth, kind="stable")] if is_path else None
    plan = RoundPlan(
        n_anchor=int(anchors.size),
        anchor_origin=_take(layout.row[topo.refs[anchors, 0]]),
        anchor_rot=torch.tensor(_anchor_rot(topo, anchors)),
        irregular_atoms=as_long(irr),
        irregular_refs=as_long(layout.row[forest.eff[irr][:, ::-1].reshape(-1)]),
        scan_atoms=as_long(bands.order),
        scan_phi_zero=torch.as_tensor(kind[bands.order] == THIRD),
        step_sizes=tuple(int(s) for s in np.diff(bands.step_start)),
        step_parent=tuple(as_long(p) for p in bands.step_parent),
        n_boundary=n_boundary,
        band_parent=as_long(band_parent),
        jumps=_jumps(band_parent, steps),
        rot_steps=rot_steps,
        scan_band_root=as_long(bands.top),
        node_root=as_long(node_root),
        pool_blocks=layout.n_blocks,
        path=None if path_order is None else _take(path_order),
    )
    # this round's block holds its node rows (sentinel and anchors included, never
    # read); third seeds keep their block-0 position; a path's block is in path order
    nodes = bands.order if path_order is None else path_order
    keep = kind[nodes] != THIRD
    layout.place(
        np.concatenate([irr, nodes[keep]]),
        np.concatenate([1 + anchors.size + np.arange(irr.size), n_roots + np.flatnonzero(keep)]),
        n_roots + bands.order.size,
    )
    return plan, round_depth


@dataclass(frozen=True)
class _Bands:
    """A round's scanned atoms in band-step order and the links between their nodes."""

    order: np.ndarray  # (n_scan,) atoms by (step, depth, index)
    step_start: np.ndarray  # (K + 1,) first row of each in-band step in `order`
    step_parent: tuple[np.ndarray, ...]  # per step t >= 1: row of each node's parent in step t-1
    top: np.ndarray  # (n_scan,) node above each atom's band: a root or a boundary node
    root_rank: np.ndarray  # (n_scan,) rank of each atom's root among the round's roots


def _bands(
    parent: np.ndarray,
    row: np.ndarray,
    scanned: np.ndarray,
    depth: np.ndarray,
    root_rank: np.ndarray,
    n_roots: int,
    k: int,
) -> _Bands:
    """Step ``t = (depth - 1) % k`` of each scanned atom; tops step by step (``row``: scratch)."""
    step = (depth - 1) % k
    by_step = _stable_argsort(step * (int(depth.max(initial=0)) + 1) + depth)  # scanned: index order
    order, step, depth, root_rank = scanned[by_step], step[by_step], depth[by_step], root_rank[by_step]
    step_start = np.concatenate([[0], np.cumsum(np.bincount(step, minlength=k))])
    row[order] = np.arange(order.size) - step_start[step]  # row within its step
    up = parent[order]
    step_parent = tuple(row[up[step_start[t] : step_start[t + 1]]] for t in range(1, k))
    # step 0 hangs from a root (depth 1) or a boundary node; step t shares its parent's top
    top = np.empty(order.size, dtype=np.int64)
    first = slice(0, int(step_start[1]))
    top[first] = np.where(depth[first] == 1, 1 + root_rank[first], n_roots + row[up[first]])
    for t in range(1, k):
        top[step_start[t] : step_start[t + 1]] = top[step_start[t - 1] + step_parent[t - 1]]
    return _Bands(order=order, step_start=step_start, step_parent=step_parent, top=top, root_rank=root_rank)


def _stable_argsort(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` for keys ``>= 0``: radix passes over 16-bit digits."""
    if key.size == 0 or key.max() >= 2**32:
        return np.argsort(key, kind="stable")
    order = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
    if key.max() >= 2**16:
        order = order[np.argsort((key[order] >> 16).astype(np.uint16), kind="stable")]
    return order


def _jump_steps(round_depth: int, k_band: int) -> tuple[int, int]:
    """Pointer-jumping steps over the boundary tree, and those that rotations need."""
    b_depth = -(-round_depth // k_band)  # boundary tree depth: ceil(depth / K)
    steps = int(np.ceil(np.log2(b_depth))) if b_depth > 1 else 0
    if k_band == 1:  # only parents' rotations are needed
        return steps, int(np.ceil(np.log2(b_depth - 1))) if b_depth > 2 else 0
    return steps, steps  # every band top's rotation is needed by the fix-up


def _jumps(band_parent: np.ndarray, steps: int) -> tuple[Tensor, ...]:
    """``ptr^(2^k)`` for ``k < steps``."""
    jumps = []
    cur = band_parent
    for _ in range(steps):
        jumps.append(as_long(cur))
        cur = cur[cur]
    return tuple(jumps)


def _anchor_rot(topo: Topology, anchors: np.ndarray) -> np.ndarray:
    """``(n_anchor, 3, 3)`` columns ``e1 = s e_x, e2 = e_y, e3 = e1 x e2 = s e_z``."""
    sign = np.where(topo.kind[topo.refs[anchors, 0]] == SECOND, 1.0, -1.0)
    rot = np.zeros((anchors.size, 3, 3))
    rot[:, 0, 0] = sign
    rot[:, 1, 1] = 1.0
    rot[:, 2, 2] = sign
    return rot


# ------------------------------------------------------------------ the whole table
def _finish(
    topo: Topology,
    seeds: SeedPlan,
    tree: FrameTree,
    rounds: tuple[RoundPlan, ...],
    inverse: np.ndarray,
    depth: int,
) -> ScanPlan:
    """Dihedral sums, the seed columns and the slices-only decision."""
    n = topo.n_atoms
    full = topo.kind == FULL
    # dihedrals summed into phi_eff (j, then its sibling links) and the atoms whose flip adds pi
    phi_paths = _chains(np.where(full, np.arange(n), -1), tree.phi_from, n)
    if phi_paths is None:
        phi_paths = np.full((n, 1), n, dtype=np.int64)
    # a sibling placed with sin(angle) < 0 sits on the far side of the axis: its
    # frame is turned by pi, so the offset gains pi (third seeds included)
    flip_paths = _chains(np.array(tree.flip_on), tree.flip_on, n)
    # seed_block reads a few columns: take them as slices first (an index_select's
    # backward is an index_add, which torch 2.13's CPU inductor miscompiles)
    second, third = np.flatnonzero(topo.kind == SECOND), np.flatnonzero(topo.kind == THIRD)
    used = np.sort(np.concatenate([second, third]))
    local = np.zeros(n, dtype=np.int64)
    local[used] = np.arange(used.size)
    seeds_local = replace(seeds, second=as_long(local[second]), third=as_long(local[third]))
    phi_mask = torch.as_tensor(full) if phi_paths.shape[1] == 1 and flip_paths is None else None
    assemble = _take(inverse)
    slices_only = (
        phi_mask is not None
        and assemble.runs is not None
        and (not used.size or _take(used).runs is not None)
        and all(
            r.path is not None
            and r.path.runs is not None
            and r.irregular_atoms.numel() == 0
            and (r.n_anchor == 0 or r.anchor_origin.runs is not None)
            for r in rounds
        )
    )
    return ScanPlan(
        gathers=not slices_only,
        seed_inputs=_take(used) if used.size else None,
        seeds_local=seeds_local if used.size else None,
        phi_mask=phi_mask,
        assemble=assemble,
        seeds=seeds,
        phi_paths=as_long(phi_paths),
        flip_paths=None if flip_paths is None else as_long(flip_paths),
        rounds=rounds,
        inverse=as_long(inverse),
        depth=depth,
    )


def _chains(start: np.ndarray, link: np.ndarray, n: int) -> np.ndarray | None:
    """``(n, L)``: ``start[j], link[start[j]], ...`` up to the first ``-1``, padded with ``n``.

    None when every chain is empty. One vectorised step per column.
    """
    columns = []
    cur = start
    while (cur >= 0).any():
        columns.append(np.where(cur >= 0, cur, n))
        cur = np.where(cur >= 0, link[np.maximum(cur, 0)], -1)
    return np.stack(columns, axis=1) if columns else None


def _take(index: np.ndarray, max_runs: int = 4) -> Take:
    """`Take.of` without the loop over entries: the runs from the breaks of ``index``."""
    idx = np.array(index, dtype=np.int64).reshape(-1)
    breaks = np.flatnonzero(idx[1:] != idx[:-1] + 1) + 1
    if idx.size == 0 or breaks.size >= max_runs:  # Take.of keeps 1 to max_runs runs
        return Take(torch.as_tensor(idx), None)
    bounds = [0, *breaks.tolist(), idx.size]
    runs = tuple((int(idx[s]), e - s) for s, e in zip(bounds[:-1], bounds[1:]))
    return Take(torch.as_tensor(idx), runs)
