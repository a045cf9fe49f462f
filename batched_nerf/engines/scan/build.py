"""Scan engine: compose rigid frames along the reference tree in O(log depth) steps.

Frame-tree compilation (once per table and band size, `plan`)
-------------------------------------------------------------------------
Every fully referenced atom ``j`` with references ``(b, a, d)`` is placed from
the frame ``M_j`` spanned by the atoms ``(d, a, b)`` (see
`_geometry.place`). Call ``O_b = M_b L_b`` the *out-frame* of ``b``: the
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
the above: `path` composes ``3 x 3`` rotations in bands of ``K``
(chosen per call from the path length and batch size), jumps across band tops
in float64 and sums bond vectors with ``cumsum``, with the batch innermost and
no index gathers (every take is a slice: see `path.Take`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..._geometry import cross, nerf_frame
from ..base import Engine
from ..compiled import check_compiled_backward
from ..dispatch import BLOCK_LARGE, BLOCK_SMALL, scan_block
from ..seeds import seed_block
from .path import Take, path_band, scan_path, trig_dtype
from .plan import RoundPlan, ScanPlan, scan_plan

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


def _gathers(plan: ScanPlan) -> bool:
    return plan.gathers


#: Planned on first use, one band size at a time (``table.prepare`` builds all three).
SCAN = Engine(
    "scan",
    scan_plan,
    build_scan,
    variants=(1, BLOCK_SMALL, BLOCK_LARGE),
    choose_variant=scan_block,
    gathers=_gathers,
)
