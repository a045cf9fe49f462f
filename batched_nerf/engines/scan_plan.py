"""Scan plan: the frame tree cut into rounds, bands and pointer-jumping steps, once per table.

The planner of the scan engine (:mod:`.scan`, where the method is described):
numpy work on the table's :class:`~batched_nerf.Topology` and its frame tree
(:mod:`.frame_tree`), made on first use for one band size (the plan variant)
and cached by the table. The result, :class:`ScanPlan`, holds index tensors
and Python values only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from .._topology import FULL, THIRD, Topology
from .base import Movable, as_long
from .frame_tree import ANCHOR, PARENT, frame_tree
from .scan_path import Take
from .seeds import SeedPlan, seed_atoms, seed_plan

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
    """Everything :func:`build_scan` needs."""

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
    refs = topo.refs
    n = len(refs)
    n_refs = topo.kind
    seeds = seed_plan(topo)
    seed_second = np.flatnonzero(n_refs == 1)
    seed_third = np.flatnonzero(n_refs == 2)
    second_atoms = set(seed_second.tolist())
    # the classification is the frame tree's (engines/frame_tree.py, the definition)
    tree = frame_tree(topo)
    full = np.flatnonzero(n_refs == FULL).tolist()
    eff = refs.copy()
    eff[full, 2] = tree.dihedral_ref[full]
    third = set(np.flatnonzero(n_refs == THIRD).tolist())
    # parent in the frame tree: ("atom", b) / ("anchor", T) / None (irregular)
    parent: dict[int, tuple[str, int]] = {}
    for j in np.flatnonzero(tree.frame == PARENT).tolist():
        parent[j] = ("atom", int(tree.parent[j]))
    for j in np.flatnonzero(tree.frame == ANCHOR).tolist():
        parent[j] = ("anchor", int(tree.parent[j]))
    # dihedrals summed into phi_eff (j, then its sibling links) and the atoms whose flip adds pi
    paths = [_chain(tree.phi_from, j, [j]) if n_refs[j] == FULL else [] for j in range(n)]
    flips = [_chain(tree.flip_on, j, []) for j in range(n)]

    # rounds: anchors and seed-fed irregulars are round 0; an irregular atom is
    # one round after the latest scanned atom it reads.
    round_of = np.full(n, -1, dtype=np.int64)
    block0 = set(seed_atoms(topo).tolist())
    children: dict[int, list[int]] = {}
    for j, (kind, p) in parent.items():
        if kind == "atom":
            children.setdefault(p, []).append(j)
    root_of: dict[int, tuple[str, int]] = {}

    def assign(root_key: tuple[str, int], start: list[int], rnd: int) -> None:
        stack = list(start)
        while stack:
            j = stack.pop()
            round_of[j] = rnd
            root_of[j] = root_key
            stack.extend(children.get(j, []))

    for t in sorted(third):
        assign(("anchor", t), [t] + [j for j, pk in parent.items() if pk == ("anchor", t) and j != t], 0)
    # in dependency-level order every reference is assigned before it is read:
    # a scanned reference's root is a frame-tree ancestor, of lower level
    level = topo.level
    for j in sorted((j for j in full if j not in parent), key=lambda j: (level[j], j)):
        # third seeds are in block 0 as positions: readable in round 0
        rnd = max([0] + [int(round_of[r]) + 1 for r in eff[j].tolist() if r not in block0])
        assign(("irregular", j), [j], rnd)
    n_rounds = int(round_of.max()) + 1 if (round_of >= 0).any() else 0
    by_round: list[list[int]] = [[] for _ in range(n_rounds)]
    for j in np.flatnonzero(round_of >= 0).tolist():
        by_round[round_of[j]].append(j)

    # position blocks: 0 = seed block; r + 1 = atoms placed in round r
    block_of = np.full(n, -1, dtype=np.int64)
    slot_of = np.full(n, -1, dtype=np.int64)
    seed_rows = seed_atoms(topo)
    block_of[seed_rows] = 0
    slot_of[seed_rows] = np.arange(seed_rows.size)
    block_sizes = [seed_rows.size]
    rounds: list[RoundPlan] = []
    max_depth = 0
    for rnd in range(n_rounds):
        members = by_round[rnd]
        anchors = sorted(t for t in third if round_of[t] == rnd)
        irr = sorted(j for j in members if root_of[j] == ("irregular", j))
        irr_set = set(irr)
        scanned = [j for j in members if j not in irr_set]
        # depth below the round's roots; bands of `block` depths
        depth = _depths(scanned, parent)
        round_depth = max(depth.values(), default=0)
        max_depth = max(max_depth, round_depth)
        # one path below one root: blocked scan of _scan_path, bands chosen per call
        is_path = len(anchors) + len(irr) == 1 and len(scanned) == round_depth > 0
        k_band = max(1, min(block, round_depth))
        path_order = sorted(scanned, key=lambda j: depth[j]) if is_path else []
        steps_nodes = [
            sorted((j for j in scanned if (depth[j] - 1) % k_band == t), key=lambda j: (depth[j], j))
            for t in range(k_band)
        ]
        order = [j for step in steps_nodes for j in step]
        n_roots = 1 + len(anchors) + len(irr)
        root_key = [("sentinel", -1)] + [("anchor", t) for t in anchors] + [("atom", j) for j in irr]
        boundary = steps_nodes[-1]
        bindex = {key: k for k, key in enumerate(root_key)}
        for k, j in enumerate(boundary):
            bindex[("atom", j)] = n_roots + k
        row_in_step = {j: k for step in steps_nodes for k, j in enumerate(step)}

        step_parent = [as_long([row_in_step[parent[j][1]] for j in step]) for step in steps_nodes[1:]]
        band_parent = np.zeros(n_roots + len(boundary), dtype=np.int64)
        node_root = np.zeros(n_roots + len(order), dtype=np.int64)
        node_root[1:n_roots] = np.arange(n_roots - 1)
        top_of = {j: bindex[_band_top(j, depth, k_band, parent)] for j in order}
        for k, j in enumerate(boundary):
            band_parent[n_roots + k] = top_of[j]
        root_of_b = np.zeros(n_roots + len(boundary), dtype=np.int64)
        root_of_b[:n_roots] = node_root[:n_roots]
        for k in range(n_roots, n_roots + len(boundary)):  # parents come first
            root_of_b[k] = root_of_b[band_parent[k]]
        for k, j in enumerate(order):
            node_root[n_roots + k] = root_of_b[top_of[j]]
        b_depth = -(-round_depth // k_band)  # boundary tree depth: ceil(depth / K)
        steps = int(np.ceil(np.log2(b_depth))) if b_depth > 1 else 0
        if k_band == 1:  # only parents' rotations are needed
            rot_steps = int(np.ceil(np.log2(b_depth - 1))) if b_depth > 2 else 0
        else:  # every band top's rotation is needed by the fix-up
            rot_steps = steps
        jumps = []
        cur = band_parent
        for _ in range(steps):
            jumps.append(as_long(cur))
            cur = cur[cur]
        node_index = {("anchor", t): 1 + k for k, t in enumerate(anchors)}
        for k, j in enumerate(irr):
            node_index[("atom", j)] = 1 + len(anchors) + k
        # a path's block lists its atoms in path order (see _build_path)
        for k, j in enumerate(path_order if is_path else order):
            node_index[("atom", j)] = n_roots + k
        n_nodes = n_roots + len(order)
        # irregular gathers read blocks 0..rnd
        offsets = np.concatenate([[0], np.cumsum(block_sizes)])
        pool_row = offsets[np.maximum(block_of, 0)] + slot_of  # valid for placed atoms
        anchor_origin = [int(pool_row[refs[t, 0]]) for t in anchors]
        anchor_rot = []
        for t in anchors:
            sign = 1.0 if refs[t, 0] in second_atoms else -1.0
            # columns e1 = sign * e_x, e2 = e_y, e3 = e1 x e2 = sign * e_z
            anchor_rot.append([[sign, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, sign]])
        irr_refs = [int(pool_row[r]) for j in irr for r in eff[j][::-1]]
        rounds.append(
            RoundPlan(
                n_anchor=len(anchors),
                anchor_origin=Take.of(anchor_origin),
                anchor_rot=torch.tensor(anchor_rot, dtype=torch.float64).reshape(-1, 3, 3),
                irregular_atoms=as_long(irr),
                irregular_refs=as_long(irr_refs),
                scan_atoms=as_long(order),
                scan_phi_zero=torch.as_tensor(np.array([j in third for j in order], dtype=bool)),
                step_sizes=tuple(len(step) for step in steps_nodes),
                step_parent=tuple(step_parent),
                n_boundary=len(boundary),
                band_parent=as_long(band_parent),
                jumps=tuple(jumps),
                rot_steps=rot_steps,
                scan_band_root=as_long([top_of[j] for j in order]),
                node_root=as_long(node_root),
                pool_blocks=len(block_sizes),
                path=Take.of(path_order) if is_path else None,
            )
        )
        # this round's block: node rows (sentinel and anchors included, never read)
        for j in irr + order:
            if j in third:
                continue  # third seeds keep their closed-form block-0 position
            block_of[j] = rnd + 1
            slot_of[j] = node_index[("atom", j)]
        block_sizes.append(n_nodes)

    offsets = np.concatenate([[0], np.cumsum(block_sizes)])
    inverse = offsets[block_of] + slot_of
    width = max([len(p) for p in paths] + [1])
    phi_paths = np.full((n, width), n, dtype=np.int64)
    for j, p in enumerate(paths):
        phi_paths[j, : len(p)] = p
    # a sibling placed with sin(angle) < 0 sits on the far side of the axis: its
    # frame is turned by pi, so the offset gains pi (third seeds included)
    flip_width = max(len(f) for f in flips) if flips else 0
    flip_paths = None
    if flip_width:
        flip_paths = np.full((n, flip_width), n, dtype=np.int64)
        for j, f in enumerate(flips):
            flip_paths[j, : len(f)] = f
    # seed_block reads a few columns: take them as slices first (an index_select's
    # backward is an index_add, which torch 2.13's CPU inductor miscompiles)
    used = sorted(set(seed_second.tolist()) | set(seed_third.tolist()))
    local = {a: k for k, a in enumerate(used)}
    seeds_local = replace(
        seeds,
        second=as_long([local[a] for a in seed_second.tolist()]),
        third=as_long([local[a] for a in seed_third.tolist()]),
    )
    phi_mask = (
        torch.as_tensor(np.array([p == [j] for j, p in enumerate(paths)], dtype=bool))
        if width == 1 and flip_paths is None and all(p in ([], [j]) for j, p in enumerate(paths))
        else None
    )
    assemble = Take.of(inverse)
    slices_only = (
        phi_mask is not None
        and assemble.runs is not None
        and (not used or Take.of(used).runs is not None)
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
        seed_inputs=Take.of(used) if used else None,
        seeds_local=seeds_local if used else None,
        phi_mask=phi_mask,
        assemble=assemble,
        seeds=seeds,
        phi_paths=as_long(phi_paths),
        flip_paths=None if flip_paths is None else as_long(flip_paths),
        rounds=tuple(rounds),
        inverse=as_long(inverse),
        depth=max_depth,
    )


def _chain(link: np.ndarray, j: int, start: list[int]) -> list[int]:
    """``start`` followed by ``link[j], link[link[j]], ...`` up to the first ``-1``."""
    out = start
    k = int(link[j])
    while k >= 0:
        out.append(k)
        k = int(link[k])
    return out


def _band_top(
    j: int, depth: dict[int, int], k_band: int, parent: dict[int, tuple[str, int]]
) -> tuple[str, int]:
    """Key of the node above ``j``'s band: ``(depth - 1) % K + 1`` parents up."""
    key: tuple[str, int] = ("atom", j)
    for _ in range((depth[j] - 1) % k_band + 1):
        key = parent[key[1]]
    return key


def _depths(scanned: list[int], parent: dict[int, tuple[str, int]]) -> dict[int, int]:
    """Depth of each scanned atom below its root (children of an anchor or root: 1)."""
    depth: dict[int, int] = {}
    for j in scanned:
        path = []
        node = j
        while node not in depth:
            kind, p = parent.get(node, ("root", node))
            if kind == "root":  # an irregular root
                depth[node] = 0
                break
            path.append(node)
            if kind == "anchor":
                depth[node] = 1
                path.pop()
                break
            node = p
        base = depth[node]
        for k, a in enumerate(reversed(path), start=1):
            depth[a] = base + k
    return depth
