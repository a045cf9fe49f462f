"""Scan engine: compose rigid frames along the reference tree in O(log depth) steps.

Frame-tree compilation (done once per table, in :func:`scan_plan`)
-------------------------------------------------------------------
Every fully referenced atom ``j`` with references ``(b, a, d)`` is placed from
the frame ``M_j`` spanned by the atoms ``(d, a, b)`` (see
:func:`._geometry.place`). Call ``O_b = M_b L_b`` the *out-frame* of ``b``: the
frame spanned by ``(a_b, b_b, b)``, where ``L(theta, phi)`` is the rotation that
carries ``M_b`` to it. Then:

* *primary* rows ``(b, a, d) = (b, bond_ref(b), angle_ref(b))`` have ``M_j = O_b``;
* *sibling* rows, whose dihedral reference ``d`` has the same bond and angle
  references ``(b, a)``, share ``d``'s frame with the dihedral offset
  ``phi_j + phi_d`` (dihedrals about one axis add), followed transitively;
* the third seed atom ``T`` of a component hangs from a constant *anchor* frame
  (``e1 = +-e_x, e2 = e_y``) at its bond reference, with dihedral ``0``; rows that
  are siblings of ``T`` share that anchor.

Each such atom has a rigid local transform ``T_j = (L_j, r_j u_j)`` with
``u = (-cos theta, sin theta cos phi, sin theta sin phi)``, and its world frame
is ``F_j = F_parent * T_j``. Every other row is *irregular*: it is placed from
the positions of its references (a level pass) and becomes the root of the
subtree below it. Irregular rows are grouped into rounds by their dependencies
(most tables have one round).

Log-depth composition
---------------------
Within a round, ``F_j`` is the product of the transforms along the path from
its root, computed by pointer jumping: ``A_j <- A_parent(j) * A_j`` with the
parent pointers doubled each step, so ``ceil(log2(depth + 1))`` steps build a
chain of any length. All pointers are static, precomputed on the CPU. Rotation
products are written out elementwise (no ``matmul``), so TF32 settings cannot
change results.

Paths
-----
A round whose scanned atoms form one path below one root (a chain) skips all of
the above: :mod:`._scan_path` composes ``3 x 3`` rotations in bands of ``K``
(chosen per call from the path length and batch size), jumps across band tops
in float64 and sums bond vectors with ``cumsum``, with the batch innermost and
no index gathers (every take is a slice: see :class:`._scan_path.Take`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from .._geometry import cross, nerf_frame
from .._topology import FULL, THIRD, Topology
from .base import Engine, Movable, as_long
from .compiled import check_compiled_backward
from .dispatch import BLOCK_LARGE, BLOCK_SMALL, scan_block
from .frame_tree import ANCHOR, PARENT, frame_tree
from .scan_path import Take, path_band, scan_path, trig_dtype
from .seeds import SeedPlan, seed_atoms, seed_block, seed_plan


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


# ---------------------------------------------------------------- compute path
# Quaternions and vectors are component-major here: ``(4, ..., n)`` and
# ``(3, ..., n)``, so that every elementwise operation runs on contiguous memory
# and every gather is a single ``index_select`` on the last dimension.


def _qmul(p: Tensor, q: Tensor) -> Tensor:
    """Hamilton product of component-major quaternions ``(4, ...)`` (``w, x, y, z``)."""
    pw, px, py, pz = p.unbind(0)
    qw, qx, qy, qz = q.unbind(0)
    return torch.stack(
        (
            pw * qw - px * qx - py * qy - pz * qz,
            pw * qx + px * qw + py * qz - pz * qy,
            pw * qy - px * qz + py * qw + pz * qx,
            pw * qz + px * qy - py * qx + pz * qw,
        )
    )


def _qrotate(q: Tensor, v: Tensor) -> Tensor:
    """Rotate ``v`` ``(3, ...)`` by the unit quaternion ``q`` ``(4, ...)``."""
    w, u = q[0], q[1:]
    t = 2.0 * cross(u, v, 0)
    return v + w * t + cross(u, t, 0)


def _qnormalize(q: Tensor) -> Tensor:
    return q / torch.sqrt((q * q).sum(0))


def local_transform(r: Tensor, theta: Tensor, phi: Tensor) -> tuple[Tensor, Tensor]:
    """Rigid step from the frame that places an atom to the frame of its children.

    Rotation ``L(theta, phi) = R_x(phi) R_z(pi - theta)`` as a quaternion
    ``(4, ...)``: its first column is the bond direction
    ``u = (-cos theta, sin theta cos phi, sin theta sin phi)``; for
    ``sin theta < 0`` a half turn about ``x`` follows, so that the frame matches
    the position-based placement for any angle. Translation ``r u`` ``(3, ...)``.
    Everything comes from the four half-angle sines and cosines.
    """
    half_p = 0.5 * phi
    half_t = 0.5 * (torch.pi - theta)
    ca, sa, cb, sb = torch.cos(half_p), torch.sin(half_p), torch.cos(half_t), torch.sin(half_t)
    q = torch.stack((ca * cb, sa * cb, -sa * sb, ca * sb))
    sin_t = 2.0 * sb * cb
    flipped = torch.stack((-q[1], q[0], q[3], -q[2]))
    q = torch.where(sin_t < 0, flipped, q)
    rs = r * sin_t
    tau = torch.stack((r * (cb * cb - sb * sb), rs * (ca * ca - sa * sa), rs * (2.0 * sa * ca)))
    return q, tau


def _matvec3(a: Tensor, v: Tensor) -> Tensor:
    """``a @ v`` for ``(..., 3, 3), (..., 3)``, elementwise (no TF32 matmul)."""
    return (a * v.unsqueeze(-2)).sum(-1)


def _rotation_matrix(q: Tensor) -> Tensor:
    """Component-major unit quaternions ``(4, ...)`` to matrices ``(..., 3, 3)``."""
    w, x, y, z = q.unbind(0)
    rows = (
        (1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)),
        (2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)),
        (2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)),
    )
    return torch.stack([torch.stack(r, dim=-1) for r in rows], dim=-2)


def _compose_bands(rp: RoundPlan, q: Tensor, tau: Tensor) -> tuple[Tensor, Tensor]:
    """Phase 1: frames relative to each band's top, ``K`` sequential steps.

    Returns the rotations of the band-bottom nodes ``(4, ..., n_boundary)`` and
    the translations of all scanned nodes ``(3, ..., n_scan)``.
    """
    sizes = rp.step_sizes
    if len(sizes) == 1:
        return q, tau
    qs = q.split(sizes, dim=-1)
    ts = tau.split(sizes, dim=-1)
    rot, trans = qs[0], ts[0]
    out = [trans]
    for q_t, t_t, parent in zip(qs[1:], ts[1:], rp.step_parent):
        rot_p = rot.index_select(-1, parent)
        trans = trans.index_select(-1, parent) + _qrotate(_qnormalize(rot_p), t_t)
        rot = _qmul(rot_p, q_t)
        out.append(trans)
    return rot, torch.cat(out, dim=-1)


def _compose_tree(rp: RoundPlan, rot: Tensor, trans: Tensor) -> tuple[Tensor, Tensor]:
    """Phase 2: pointer jumping over the band tops; frames relative to the root.

    ``rot`` ``(4, ..., n_b)`` and ``trans`` ``(3, ..., n_b)`` are the transforms
    of the boundary tree's nodes relative to their parents (identity for roots).
    """
    for ptr in rp.jumps[: rp.rot_steps]:
        rot = _qmul(rot.index_select(-1, ptr), rot)
    rot = _qnormalize(rot)
    trans = _qrotate(rot.index_select(-1, rp.band_parent), trans)
    for ptr in rp.jumps:
        trans = trans.index_select(-1, ptr) + trans
    return rot, trans


def build_scan(
    plan: ScanPlan,
    bonds: Tensor,
    angles: Tensor,
    dihedrals: Tensor,
    fixed_xyz: Tensor | None,
) -> Tensor:
    """Cartesian coordinates ``(..., N, 3)`` from broadcast ``(..., N)`` inputs.

    Per round: root frames ``G`` (anchors: constant; irregular atoms: from the
    positions of their references); rotations (unit quaternions) and offsets
    relative to the root, composed in bands and across band tops by pointer
    jumping; finally ``x = origin + G s``.
    """
    check_compiled_backward(plan.gathers, bonds.device, bonds, angles, dihedrals, fixed_xyz)
    batch = bonds.shape[:-1]
    dtype = bonds.dtype
    # position blocks, each a list of pieces (..., n, 3) concatenated only where read
    if plan.seed_inputs is not None and plan.seed_inputs.runs is not None:
        seeds = seed_block(
            plan.seeds_local, plan.seed_inputs(bonds, -1), plan.seed_inputs(angles, -1), fixed_xyz
        )
    else:
        seeds = seed_block(plan.seeds, bonds, angles, fixed_xyz)
    blocks: list[list[Tensor]] = [[seeds]]
    if plan.phi_mask is not None:
        phi_eff = torch.where(plan.phi_mask, dihedrals, 0.0)
    elif plan.phi_paths.shape[-1] == 1:
        padded = torch.cat((dihedrals, dihedrals.new_zeros((*batch, 1))), dim=-1)
        phi_eff = padded.index_select(-1, plan.phi_paths[:, 0])
    else:
        padded = torch.cat((dihedrals, dihedrals.new_zeros((*batch, 1))), dim=-1)
        phi_eff = padded.index_select(-1, plan.phi_paths.reshape(-1)).unflatten(-1, plan.phi_paths.shape)
        phi_eff = phi_eff.sum(-1)
    if plan.phi_mask is None and plan.flip_paths is not None:
        flipped = (torch.sin(angles) < 0).to(dtype) * torch.pi  # pi in the inputs' dtype
        flipped = torch.cat((flipped, flipped.new_zeros((*batch, 1))), dim=-1)
        flips = flipped.index_select(-1, plan.flip_paths.reshape(-1)).unflatten(-1, plan.flip_paths.shape)
        phi_eff = phi_eff + flips.sum(-1)
    for rp in plan.rounds:
        pool = _cat([p for blk in blocks[: rp.pool_blocks] for p in blk])
        frames, origins = [], []
        if rp.n_anchor:
            frames.append(rp.anchor_rot.to(dtype).expand(*batch, rp.n_anchor, 3, 3))
            origins.append(rp.anchor_origin(pool, -2))
        if rp.irregular_atoms.numel():
            a, b, c = pool.index_select(-2, rp.irregular_refs).unflatten(-2, (-1, 3)).unbind(-2)
            frame = torch.stack(nerf_frame(c, b, a), dim=-1)  # columns e1, e2, e3
            idx = rp.irregular_atoms
            r, t, p = bonds.index_select(-1, idx), angles.index_select(-1, idx), phi_eff.index_select(-1, idx)
            q_local, tau = local_transform(r, t, p)
            origins.append(c + _matvec3(frame, tau.movedim(0, -1)))
            local = _rotation_matrix(q_local)
            frames.append((frame.unsqueeze(-1) * local.unsqueeze(-3)).sum(-2))
        n_roots = 1 + rp.n_anchor + rp.irregular_atoms.numel()
        frame = torch.cat(frames, dim=-3) if len(frames) > 1 else frames[0]
        origin = torch.cat(origins, dim=-2) if len(origins) > 1 else origins[0]
        if rp.path is not None:
            blocks.append(_build_path(rp, rp.path, bonds, angles, phi_eff, frame, origin))
            continue
        elif rp.scan_atoms.numel():
            idx = rp.scan_atoms
            r, t, p = bonds.index_select(-1, idx), angles.index_select(-1, idx), phi_eff.index_select(-1, idx)
            p = torch.where(rp.scan_phi_zero, torch.zeros_like(p), p)
            rot_b, trans = _compose_bands(rp, *local_transform(r, t, p))
            ident = torch.tensor((1.0, 0.0, 0.0, 0.0), dtype=dtype, device=bonds.device)
            ident = ident.reshape(4, *([1] * (len(batch) + 1))).expand(4, *batch, n_roots)
            rot_tree = torch.cat((ident, rot_b), dim=-1)
            trans_b = trans[..., trans.shape[-1] - rp.n_boundary :]
            trans_tree = torch.cat((trans.new_zeros((3, *batch, n_roots)), trans_b), dim=-1)
            rot_tree, s_tree = _compose_tree(rp, rot_tree, trans_tree)
            if len(rp.step_sizes) == 1:
                s = s_tree
            else:  # phase 3: apply each band top's frame
                top = rp.scan_band_root
                s_scan = s_tree.index_select(-1, top) + _qrotate(rot_tree.index_select(-1, top), trans)
                s = torch.cat((s_tree[..., :n_roots], s_scan), dim=-1)
            g = frame.index_select(-3, rp.node_root)
            x = origin.index_select(-2, rp.node_root) + _matvec3(g, s.movedim(0, -1))
        else:
            x = torch.cat((origin.new_zeros((*batch, 1, 3)), origin), dim=-2)
        blocks.append([x])
    pieces = [p for blk in blocks for p in blk]
    if plan.assemble is not None and plan.assemble.runs is not None:
        return _cat(_narrow_runs(pieces, plan.assemble.runs))
    return _cat(pieces).index_select(-2, plan.inverse)


def _cat(pieces: list[Tensor]) -> Tensor:
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-2)


def _narrow_runs(pieces: list[Tensor], runs: tuple[tuple[int, int], ...]) -> list[Tensor]:
    """Rows ``[start, start + n)`` of ``cat(pieces, -2)`` for each run, without the ``cat``."""
    bounds = []
    offset = 0
    for p in pieces:
        bounds.append((offset, offset + p.shape[-2], p))
        offset += p.shape[-2]
    out = []
    for start, n in runs:
        stop = start + n
        for lo, hi, p in bounds:
            a, b = max(lo, start), min(hi, stop)
            if a < b:
                out.append(p if (a, b) == (lo, hi) else p.narrow(-2, a - lo, b - a))
    return out


def _build_path(
    rp: RoundPlan, path: Take, bonds: Tensor, angles: Tensor, phi: Tensor, frame: Tensor, origin: Tensor
) -> list[Tensor]:
    """Node rows (sentinel, root, path: ``(..., 1 | 1 | D, 3)``) of a round that is one path."""
    batch = bonds.shape[:-1]
    m = math.prod(batch)
    r, t, p = (path(v, -1) for v in (bonds, angles, phi))
    p = torch.where(rp.scan_phi_zero, 0.0, p)
    n = r.shape[-1]
    band = path_band(n, m, compiled=torch.compiler.is_compiling())
    pad = -n % band
    # batch innermost: (3, D, M), zero-padded to whole bands
    rtp = torch.stack((r, t, p)).reshape(3, m, n).transpose(1, 2)
    rtp = torch.cat((rtp, rtp.new_zeros((3, pad, m))), dim=1) if pad else rtp.contiguous()
    g = frame.reshape(m, 3, 3).permute(1, 2, 0)
    o = origin.reshape(m, 3).t()
    x = scan_path(rtp, g, o, band, trig_dtype(n, m, rtp.dtype))[:, :n].permute(2, 1, 0).reshape(*batch, n, 3)
    return [origin.new_zeros((*batch, 1, 3)), origin, x]


SCAN = Engine(
    "scan", scan_plan, build_scan, variants=(1, BLOCK_SMALL, BLOCK_LARGE), choose_variant=scan_block
)
