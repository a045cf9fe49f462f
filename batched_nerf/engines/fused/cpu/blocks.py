"""Blocked CPU kernels of the fused engine (numba): samples innermost, SIMD across samples.

A work item is ``(block of LANES samples, unit)``; thread ``t`` of ``nt`` takes
a contiguous run of items. Every row is a few loops of ``LANES`` iterations
over the block's samples (in a short last block the spare lanes compute on
finite leftovers and are never written out). The forward's inputs and outputs
move between the ``(B, N, ...)`` arrays and the scratch in tiles
(`TILE`); the backward's row by row, through strided views of the
block's samples (``x[b0:b1, atom]``), which measured faster there.

Scratch layout, chosen so that LLVM vectorises those loops without runtime
alias checks: one row of scratch per plan row, ``Z[i]`` (positions 3,
out-frame 9, turns 4, bond 1) and in the backward ``Y[i]`` (position adjoint 3,
out-frame adjoint 9, turn given back by siblings 1, gradients of bond, angle
and turn 3), each field ``LANES`` long at a constant offset; the placement
frame ``M`` and its adjoint ``N`` (9 fields) per block. A loop indexes a few row
views with constant offsets and a constant trip count, so its accesses to one
view provably do not overlap and only the few views need comparing. (With
``(rows, fields, samples)`` arrays numba's run-time strides made LLVM emit one
alias check per pair of accessed fields, ~50 per loop, which cost more than
the 32-sample loop itself.) The forward gathers, builds and writes out
`CHUNK` rows at a time into a ring of scratch rows just long enough for
the farthest reference back (`_ring`), so wide units stay in the caches;
the backward keeps every row's scratch for its reverse walk. Same formulas as
`samples` (see `build`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..rows import (
    ANCHOR,
    ATOM,
    CODE,
    FIXED,
    FLIP_ON,
    FROM_PARENT,
    PARENT,
    PHI_FROM,
    POSE,
    REF_A,
    REF_B,
    REF_D,
    ROOT,
    SECOND,
    SIGN,
    SLOT,
    THIRD,
)
from .samples import _nerf_adjoint, _nerf_frame, _placement, pose_row

__all__ = ["LANES", "backward_call", "forward_call", "lanes"]

#: Samples per block: the trip count of every loop (a compile-time constant; 16 / 32 / 64
#: measured, 32 the fastest on 22- to 512-atom units).
LANES = 32
L = LANES
# fields of a forward scratch row: position, out-frame (row-major), turn (cos t, sin t, cos p, sin p), bond
_X, _F, _T, _R, FORWARD_FIELDS = 0, 3, 12, 16, 17
# fields of a backward scratch row: adjoints of position and out-frame, the turn's adjoint given
# back by the siblings that add it, gradients of bond, angle and turn
_GX, _GO, _GP, _G, BACKWARD_FIELDS = 0, 3, 12, 13, 16
#: The forward's inputs and outputs move in tiles of this many rows, sample by sample within a
#: tile, through the sample's row view (``x[b]``): whole cache lines of a row at a time. A
#: row's strided view of the block's samples thrashed the cache where the stride is a power
#: of two (512-atom chains: 4-8x slower); indexing the whole arrays pays numba's
#: negative-index wrap-around on every index (2x slower).
TILE = 16
#: The forward gathers, builds and scatters this many rows at a time, the backward's reverse
#: walk hands back its gradients this many rows at a time: fewer passes over the scratch
#: (which falls out of the caches on wide units).
CHUNK = 64
#: The index mask of a scratch holding every row of a unit (the backward's): a typed int64, so
#: that calls with it share the forward's compiled specialisations (a literal ``-1`` is a type
#: of its own to numba, and compiled again: 3 kernels, seconds on a cold cache).
_WHOLE = np.int64(-1)
#: No pose: ``R = I``, ``t = 0``.
_IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)


@njit(cache=True)
def lanes(row, fields):
    """``LANES``, read from a scratch row's length at run time, for the trip count of short loops:
    LLVM unrolls a constant-trip loop of a few operations completely, and the straight-line
    code is not vectorised (it cannot check the arrays for overlap there)."""
    return row.size // fields


# ------------------------------------------------------------------ forward
@njit(cache=True)
def _block_gather(p, s0, c0, c1, b0, bonds, trig, Z, mask):
    """Bonds (NaN if negative) and turns of rows ``[c0, c1)`` of the unit from row ``s0`` (the spare
    lanes of a short last block keep what they held: finite values, never written out)."""
    b1 = min(b0 + L, bonds.shape[0])
    for k0 in range(c0, c1, TILE):
        for b in range(b0, b1):
            s, r_b, t_b = b - b0, bonds[b], trig[:, b]
            for k in range(k0, min(k0 + TILE, c1)):
                i, atom, third = (k - s0) & mask, p[ATOM, k], p[THIRD, k]
                r = np.float64(r_b[atom])
                Z[i, _R * L + s] = np.nan if r < 0.0 else r
                Z[i, _T * L + s] = t_b[0, atom]
                Z[i, (_T + 1) * L + s] = t_b[2, atom]
                Z[i, (_T + 2) * L + s] = 1.0 if third else t_b[1, atom]
                Z[i, (_T + 3) * L + s] = 0.0 if third else t_b[3, atom]
    for k in range(c0, c1):
        Zi, q, fo = Z[(k - s0) & mask], p[PHI_FROM, k], p[FLIP_ON, k]
        if q >= 0:  # compose the sibling's turn (an earlier row: composed already)
            _compose(Zi, Z[(q - s0) & mask])
        if fo >= 0:  # + pi where sin(angle of atom fo) < 0
            sin_fo = trig[2, b0:b1, fo]
            for s in range(b1 - b0):
                g = -1.0 if sin_fo[s] < 0.0 else 1.0
                Zi[(_T + 2) * L + s] *= g
                Zi[(_T + 3) * L + s] *= g


@njit(cache=True)
def _compose(Zi, Zq):
    """Row ``i``'s turn times row ``q``'s: ``phi_eff(i) = phi(i) + phi_eff(q)``."""
    for s in range(L):
        cp, sp = Zi[(_T + 2) * L + s], Zi[(_T + 3) * L + s]
        cq, sq = Zq[(_T + 2) * L + s], Zq[(_T + 3) * L + s]
        Zi[(_T + 2) * L + s] = cp * cq - sp * sq
        Zi[(_T + 3) * L + s] = sp * cq + cp * sq


@njit(cache=True)
def _block_nerf_frame(Zb, Za, Zd, M):
    """``M`` (row-major) = the NeRF frame of the positions of rows ``b, a, d``."""
    for s in range(L):
        m = _nerf_frame(
            Zb[s] - Za[s], Zb[L + s] - Za[L + s], Zb[2 * L + s] - Za[2 * L + s],
            Za[s] - Zd[s], Za[L + s] - Zd[L + s], Za[2 * L + s] - Zd[2 * L + s],
        )  # fmt: skip
        for c in range(9):
            M[c * L + s] = m[c]


@njit(cache=True)
def _block_frame(p, k, s0, Z, M, mask):
    """The placement frame of row ``k`` into ``M`` (anchor, the parent's out-frame or NeRF)."""
    code = p[CODE, k]
    if code == ANCHOR:
        sg = np.float64(p[SIGN, k])
        for s in range(L):
            M[s], M[L + s], M[2 * L + s] = sg, 0.0, 0.0
            M[3 * L + s], M[4 * L + s], M[5 * L + s] = 0.0, 1.0, 0.0
            M[6 * L + s], M[7 * L + s], M[8 * L + s] = 0.0, 0.0, sg
    elif code == FROM_PARENT:
        Zq = Z[(p[PARENT, k] - s0) & mask]
        n = lanes(M, 9)  # a short loop: see lanes
        for c in range(9):
            for s in range(n):
                M[c * L + s] = Zq[(_F + c) * L + s]
    else:
        ib, ia, idd = (p[REF_B, k] - s0) & mask, (p[REF_A, k] - s0) & mask, (p[REF_D, k] - s0) & mask
        _block_nerf_frame(Z[ib], Z[ia], Z[idd], M)


@njit(cache=True)
def _block_place(Zi, Zb, M):
    """``x = x_b + r M u`` and the out-frame ``M L`` (``L`` columns 2, 3 negated where ``sin(theta) < 0``)."""
    for s in range(L):
        l00, l10, l20, l01, l11, l21, l12, l22 = _placement(
            Zi[_T * L + s], Zi[(_T + 1) * L + s], Zi[(_T + 2) * L + s], Zi[(_T + 3) * L + s]
        )
        m0, m1, m2, m3, m4, m5 = M[s], M[L + s], M[2 * L + s], M[3 * L + s], M[4 * L + s], M[5 * L + s]
        m6, m7, m8, r = M[6 * L + s], M[7 * L + s], M[8 * L + s], Zi[_R * L + s]
        e0 = m0 * l00 + m1 * l10 + m2 * l20
        e1 = m3 * l00 + m4 * l10 + m5 * l20
        e2 = m6 * l00 + m7 * l10 + m8 * l20
        Zi[s] = Zb[s] + r * e0
        Zi[L + s] = Zb[L + s] + r * e1
        Zi[2 * L + s] = Zb[2 * L + s] + r * e2
        Zi[_F * L + s] = e0
        Zi[(_F + 1) * L + s] = m0 * l01 + m1 * l11 + m2 * l21
        Zi[(_F + 2) * L + s] = m0 * 0.0 + m1 * l12 + m2 * l22  # L[0, 2] = 0 (NaN stays NaN)
        Zi[(_F + 3) * L + s] = e1
        Zi[(_F + 4) * L + s] = m3 * l01 + m4 * l11 + m5 * l21
        Zi[(_F + 5) * L + s] = m3 * 0.0 + m4 * l12 + m5 * l22
        Zi[(_F + 6) * L + s] = e2
        Zi[(_F + 7) * L + s] = m6 * l01 + m7 * l11 + m8 * l21
        Zi[(_F + 8) * L + s] = m6 * 0.0 + m7 * l12 + m8 * l22


@njit(cache=True)
def _block_rows(p, s0, c0, c1, b0, bonds, trig, fixed, Z, M, mask):
    """Positions, out-frames and turns of rows ``[c0, c1)`` (of the unit from row ``s0``) for samples
    ``b0, b0 + 1, ...`` into ``Z``."""
    _block_gather(p, s0, c0, c1, b0, bonds, trig, Z, mask)
    b1 = min(b0 + L, bonds.shape[0])
    for k in range(c0, c1):
        i, code = (k - s0) & mask, p[CODE, k]
        Zi = Z[i]
        if code == FIXED:
            f = fixed[b0:b1, p[SLOT, k]]
            for c in range(3):
                for s in range(b1 - b0):
                    Zi[c * L + s] = np.float64(f[s, c])
        elif code == ROOT or code == SECOND:  # (0, 0, 0), (r, 0, 0); a NaN bond makes the atom NaN
            for s in range(L):
                r = Zi[_R * L + s] if code == SECOND else 0.0
                Zi[s], Zi[L + s], Zi[2 * L + s] = r, 0.0 * r, 0.0 * r
        else:
            _block_frame(p, k, s0, Z, M, mask)
            _block_place(Zi, Z[(p[REF_B, k] - s0) & mask], M)


def _ring(reach: int, width: int) -> tuple[int, int]:
    """Scratch rows the forward needs and their index mask: a power of two covering ``reach``
    (the farthest reference back) plus a chunk, rows wrapping around it (wide units stay in the
    caches); or ``width`` rows, mask ``-1``, where that is no shorter."""
    size = 1
    while size < reach + CHUNK:
        size *= 2
    return (size, size - 1) if size < width else (width, -1)


@njit(cache=True)
def _blocks_items(t, nt, p, starts, bonds, trig, fixed, pose, out, rows, mask):
    """Thread ``t`` of ``nt``: a contiguous run of the (block, unit) items."""
    n_units, n_samples = starts.size - 1, bonds.shape[0]
    total = -(-n_samples // L) * n_units
    Z, M = np.zeros((rows, FORWARD_FIELDS * L)), np.empty(9 * L)  # zeros: finite spare lanes
    for item in range(total * t // nt, total * (t + 1) // nt):
        b0, u = (item // n_units) * L, item % n_units
        s0, s1 = starts[u], starts[u + 1]
        for c0 in range(s0, s1, CHUNK):  # in, build, out: a chunk of rows at a time
            c1 = min(c0 + CHUNK, s1)
            _block_rows(p, s0, c0, c1, b0, bonds, trig, fixed, Z, M, mask)
            _block_out(p, s0, c0, c1, b0, pose, Z, out, mask)


@njit(cache=True)
def _block_out(p, s0, c0, c1, b0, pose, Z, out, mask):
    """Rows ``[c0, c1)`` from the scratch into ``out``, in tiles (as the inputs came in): an atom of a
    seeded component as ``R y + t``, the pose held in registers while the rows stay in its
    component; anchored atoms as built."""
    for k0 in range(c0, c1, TILE):
        for b in range(b0, min(b0 + L, out.shape[0])):
            s, o, held = b - b0, out[b], -1
            r0, r1, r2, r3, r4, r5, r6, r7, r8, t0, t1, t2 = _IDENTITY
            for k in range(k0, min(k0 + TILE, c1)):
                i, atom, slot = (k - s0) & mask, p[ATOM, k], p[POSE, k]
                y0, y1, y2 = Z[i, s], Z[i, L + s], Z[i, 2 * L + s]
                if slot >= 0:
                    if slot != held:
                        P, held = pose_row(pose, b, slot), slot
                        r0, r1, r2, r3, r4, r5, r6, r7, r8 = (
                            P[0],
                            P[1],
                            P[2],
                            P[3],
                            P[4],
                            P[5],
                            P[6],
                            P[7],
                            P[8],
                        )
                        t0, t1, t2 = P[9], P[10], P[11]
                    y0, y1, y2 = (
                        r0 * y0 + r1 * y1 + r2 * y2 + t0,
                        r3 * y0 + r4 * y1 + r5 * y2 + t1,
                        r6 * y0 + r7 * y1 + r8 * y2 + t2,
                    )
                o[atom, 0], o[atom, 1], o[atom, 2] = y0, y1, y2


@njit(cache=True, parallel=True)
def _blocks_parallel(p, starts, bonds, trig, fixed, pose, out, nt, rows, mask):
    for t in prange(nt):
        _blocks_items(t, nt, p, starts, bonds, trig, fixed, pose, out, rows, mask)


def forward_call(p, starts, bonds, trig, fixed, pose, out, nt, width, reach):  # type: ignore[no-untyped-def]
    """``(kernel, args)``: ``kernel(*args)`` writes the positions into ``out`` on ``nt`` threads
    (arguments as `build.forward`'s)."""
    rows, mask = _ring(reach, width)
    if nt > 1:
        return _blocks_parallel, (p, starts, bonds, trig, fixed, pose, out, nt, rows, mask)
    return _blocks_items, (0, 1, p, starts, bonds, trig, fixed, pose, out, rows, mask)  # no pool round trip


# ------------------------------------------------------------------ backward
# The reverse walk of samples._unit_backward, row by row, each step a
# loop over the block's samples.


@njit(cache=True)
def _block_place_adjoint(Yi, Zi, M):
    """Row ``i``: ``dr = g . (M u)``, angle and turn gradients through ``gL = M^T gO + r (M^T g) e_1^T``."""
    for s in range(L):
        g0, g1, g2 = Yi[s], Yi[L + s], Yi[2 * L + s]
        m0, m1, m2, m3, m4, m5 = M[s], M[L + s], M[2 * L + s], M[3 * L + s], M[4 * L + s], M[5 * L + s]
        m6, m7, m8, r = M[6 * L + s], M[7 * L + s], M[8 * L + s], Zi[_R * L + s]
        o0, o1, o2 = Yi[_GO * L + s], Yi[(_GO + 1) * L + s], Yi[(_GO + 2) * L + s]
        o3, o4, o5 = Yi[(_GO + 3) * L + s], Yi[(_GO + 4) * L + s], Yi[(_GO + 5) * L + s]
        o6, o7, o8 = Yi[(_GO + 6) * L + s], Yi[(_GO + 7) * L + s], Yi[(_GO + 8) * L + s]
        ct, st, cp, sp = Zi[_T * L + s], Zi[(_T + 1) * L + s], Zi[(_T + 2) * L + s], Zi[(_T + 3) * L + s]
        fl = -1.0 if st < 0.0 else 1.0  # the angle and turn gradients below fold the flip in
        l00, l10, l20, _, _, _, _, _ = _placement(ct, st, cp, sp)
        Yi[_G * L + s] = (
            g0 * (m0 * l00 + m1 * l10 + m2 * l20)
            + g1 * (m3 * l00 + m4 * l10 + m5 * l20)
            + g2 * (m6 * l00 + m7 * l10 + m8 * l20)
        )
        q00 = m0 * o0 + m3 * o3 + m6 * o6 + r * (m0 * g0 + m3 * g1 + m6 * g2)
        q10 = m1 * o0 + m4 * o3 + m7 * o6 + r * (m1 * g0 + m4 * g1 + m7 * g2)
        q20 = m2 * o0 + m5 * o3 + m8 * o6 + r * (m2 * g0 + m5 * g1 + m8 * g2)
        q01 = m0 * o1 + m3 * o4 + m6 * o7
        q11 = m1 * o1 + m4 * o4 + m7 * o7
        q12 = m1 * o2 + m4 * o5 + m7 * o8
        q21 = m2 * o1 + m5 * o4 + m8 * o7
        q22 = m2 * o2 + m5 * o5 + m8 * o8
        Yi[(_G + 1) * L + s] = (
            q00 * st + q10 * cp * ct + q20 * sp * ct
            + fl * (-q01 * ct + q11 * cp * st + q21 * sp * st)
        )  # fmt: skip
        Yi[(_G + 2) * L + s] = (
            -q10 * sp * st + q20 * cp * st
            + fl * (q11 * sp * ct - q21 * cp * ct - q12 * cp - q22 * sp)
        )  # fmt: skip


@njit(cache=True)
def _block_frame_adjoint(Yi, Zi, N):
    """``N = gM = r g u^T + gO L^T`` of row ``i`` (row-major)."""
    for s in range(L):
        l00, l10, l20, l01, l11, l21, l12, l22 = _placement(
            Zi[_T * L + s], Zi[(_T + 1) * L + s], Zi[(_T + 2) * L + s], Zi[(_T + 3) * L + s]
        )
        r = Zi[_R * L + s]
        for c in range(3):
            rg = r * Yi[c * L + s]
            o = (_GO + 3 * c) * L + s
            o0, o1, o2 = Yi[o], Yi[o + L], Yi[o + 2 * L]
            N[3 * c * L + s] = rg * l00 + o0 * l00 + o1 * l01 + o2 * 0.0  # L[0, 2] = 0 (NaN stays NaN)
            N[(3 * c + 1) * L + s] = rg * l10 + o0 * l10 + o1 * l11 + o2 * l12
            N[(3 * c + 2) * L + s] = rg * l20 + o0 * l20 + o1 * l21 + o2 * l22


@njit(cache=True)
def _block_nerf_adjoint(Zb, Za, Zd, Yb, Ya, Yd, N):
    """Adjoint of the NeRF frame of rows ``b, a, d`` (frame adjoint ``N``, row-major) into ``Y``.

    ``(gu, gv)`` overwrite ``N[0:6]``, then one loop adds them into the three atoms.
    """
    for s in range(L):
        gu0, gu1, gu2, gv0, gv1, gv2 = _nerf_adjoint(
            Zb[s] - Za[s],
            Zb[L + s] - Za[L + s],
            Zb[2 * L + s] - Za[2 * L + s],
            Za[s] - Zd[s],
            Za[L + s] - Zd[L + s],
            Za[2 * L + s] - Zd[2 * L + s],
            N[s],
            N[3 * L + s],
            N[6 * L + s],
            N[L + s],
            N[4 * L + s],
            N[7 * L + s],
            N[2 * L + s],
            N[5 * L + s],
            N[8 * L + s],
        )  # fmt: skip  (column adjoints of M = (e1, e2, e3), M row-major)
        N[s], N[L + s], N[2 * L + s], N[3 * L + s], N[4 * L + s], N[5 * L + s] = gu0, gu1, gu2, gv0, gv1, gv2
    for c in range(3):
        for s in range(L):
            gu, gv = N[c * L + s], N[(3 + c) * L + s]
            Yb[c * L + s] += gu
            Ya[c * L + s] += gv - gu
            Yd[c * L + s] -= gv


@njit(cache=True)
def _block_adjoint_start(p, s0, s1, b0, gxyz, pose, Z, Y, gpose, Q):
    """The position adjoints into ``Y``: ``g``, or ``R^T g`` in a seeded component (0 for an improper
    rotation, the reference's ``where``); the pose gradients ``sum g y^T``, ``sum g`` into ``gpose``
    where it has rows (summed in ``Q`` while the rows stay in one component)."""
    Y[: s1 - s0, : _G * L] = 0.0  # spare lanes too: their adjoints stay 0
    b1 = min(b0 + L, gxyz.shape[0])
    ns, want, held = b1 - b0, gpose.shape[0] > 0, -1  # held: the component summed in Q
    for k in range(s0, s1):
        g, Yi, Zi, slot = gxyz[b0:b1, p[ATOM, k]], Y[k - s0], Z[k - s0], p[POSE, k]
        if slot < 0:
            for c in range(3):
                for s in range(ns):
                    Yi[c * L + s] = np.float64(g[s, c])
            continue
        if want and slot != held:
            _flush(Q, gpose, b0, ns, held)
            held = slot
        for s in range(ns):
            g0, g1, g2 = np.float64(g[s, 0]), np.float64(g[s, 1]), np.float64(g[s, 2])
            P = pose_row(pose, b0 + s, slot)
            if not P[12] > 0.0:
                g0, g1, g2 = 0.0, 0.0, 0.0
            Yi[s] = P[0] * g0 + P[3] * g1 + P[6] * g2
            Yi[L + s] = P[1] * g0 + P[4] * g1 + P[7] * g2
            Yi[2 * L + s] = P[2] * g0 + P[5] * g1 + P[8] * g2
            if want:
                y0, y1, y2 = Zi[s], Zi[L + s], Zi[2 * L + s]
                Q[s] += g0 * y0
                Q[L + s] += g0 * y1
                Q[2 * L + s] += g0 * y2
                Q[3 * L + s] += g1 * y0
                Q[4 * L + s] += g1 * y1
                Q[5 * L + s] += g1 * y2
                Q[6 * L + s] += g2 * y0
                Q[7 * L + s] += g2 * y1
                Q[8 * L + s] += g2 * y2
                Q[9 * L + s] += g0
                Q[10 * L + s] += g1
                Q[11 * L + s] += g2
    if want:
        _flush(Q, gpose, b0, ns, held)


@njit(cache=True)
def _flush(Q, gpose, b0, ns, slot):
    """Add the sums in ``Q`` (12 fields of LANES) into ``gpose[b0:b0 + ns, slot]`` and zero them (none
    for ``slot < 0``)."""
    if slot >= 0:
        for s in range(ns):
            q = gpose[b0 + s, slot]
            for c in range(12):
                q[c] += Q[c * L + s]
    Q[:] = 0.0


@njit(cache=True)
def _block_row_adjoint(p, k, s0, b0, ns, Z, M, Y, N, gf):
    """Row ``k``'s step of the reverse walk: its gradients into ``Y[i]``'s last fields, its adjoints
    into its references' rows (and the fixed positions' gradients into ``gf``)."""
    i, code = k - s0, p[CODE, k]
    Yi = Y[i]
    if code <= SECOND:  # a SECOND atom is (r, 0, 0): dr = g_x (NaN in g stays NaN)
        for s in range(L):
            Yi[_G * L + s] = Yi[s] + 0.0 * (Yi[L + s] + Yi[2 * L + s]) if code == SECOND else 0.0
            Yi[(_G + 1) * L + s], Yi[(_G + 2) * L + s] = 0.0, 0.0
        if code == FIXED:
            for s in range(ns):
                for c in range(3):
                    gf[b0 + s, p[SLOT, k], c] = Yi[c * L + s]
        return
    Zi = Z[i]
    _block_frame(p, k, s0, Z, M, _WHOLE)
    _block_place_adjoint(Yi, Zi, M)
    third = p[THIRD, k]
    for s in range(L):  # the turn's gradient: its own plus what siblings built on it gave back
        Yi[(_G + 2) * L + s] = 0.0 if third else Yi[(_G + 2) * L + s] + Yi[_GP * L + s]
    n = lanes(Yi, BACKWARD_FIELDS)  # the short loops: see lanes
    if p[PHI_FROM, k] >= 0:
        Yq = Y[p[PHI_FROM, k] - s0]
        for s in range(n):
            Yq[_GP * L + s] += Yi[(_G + 2) * L + s]
    ib = p[REF_B, k] - s0
    Yb = Y[ib]
    for c in range(3):
        for s in range(n):
            Yb[c * L + s] += Yi[c * L + s]
    if code == ANCHOR:
        return
    _block_frame_adjoint(Yi, Zi, N)
    if code == FROM_PARENT:
        Yq = Y[p[PARENT, k] - s0]
        for c in range(9):
            for s in range(n):
                Yq[(_GO + c) * L + s] += N[c * L + s]
    else:
        ia, idd = p[REF_A, k] - s0, p[REF_D, k] - s0
        _block_nerf_adjoint(Z[ib], Z[ia], Z[idd], Yb, Y[ia], Y[idd], N)


@njit(cache=True)
def _block_grads_out(p, s0, c0, c1, b0, ns, bonds, Y, gb, ga, gd):
    """The gradients of rows ``[c0, c1)`` out; none for an out-of-domain (negative) bond."""
    b1 = b0 + ns
    for k in range(c0, c1):
        atom, domain, Yi = p[ATOM, k], p[CODE, k] >= SECOND, Y[k - s0]
        r, db, da, dd = bonds[b0:b1, atom], gb[b0:b1, atom], ga[b0:b1, atom], gd[b0:b1, atom]
        for s in range(ns):
            db[s] = 0.0 if domain and r[s] < 0.0 else Yi[_G * L + s]
            da[s] = Yi[(_G + 1) * L + s]
            dd[s] = Yi[(_G + 2) * L + s]


@njit(cache=True)
def _block_backward(p, s0, s1, b0, bonds, pose, gxyz, gb, ga, gd, gf, gpose, Z, M, Y, N):
    """Input gradients of rows ``[s0, s1)``, samples from ``b0``: walk back over the forward in ``Z``
    (a row's gradients are final once the walk has passed it: out a chunk at a time)."""
    _block_adjoint_start(p, s0, s1, b0, gxyz, pose, Z, Y, gpose, N)  # N: free until the walk
    ns = min(L, bonds.shape[0] - b0)
    for c1 in range(s1, s0, -CHUNK):
        c0 = max(c1 - CHUNK, s0)
        for k in range(c1 - 1, c0 - 1, -1):
            _block_row_adjoint(p, k, s0, b0, ns, Z, M, Y, N, gf)
        _block_grads_out(p, s0, c0, c1, b0, ns, bonds, Y, gb, ga, gd)


@njit(cache=True)
def _blocks_backward_items(t, nt, p, starts, bonds, trig, fixed, pose, gxyz, gb, ga, gd, gf, gpose, width):
    """Thread ``t`` of ``nt``: a contiguous run of the (block, unit) items (forward recomputed)."""
    n_units, n_samples = starts.size - 1, bonds.shape[0]
    total = -(-n_samples // L) * n_units
    Z, M = np.zeros((width, FORWARD_FIELDS * L)), np.empty(9 * L)  # zeros: finite spare lanes
    Y, N = np.empty((width, BACKWARD_FIELDS * L)), np.empty(12 * L)  # N: 9 fields, 12 for the pose sums
    whole = _WHOLE  # every row its own scratch row (no ring); an int64, not the literal -1, so
    # that _block_rows and what it calls are the forward's specialisations (not compiled again)
    for item in range(total * t // nt, total * (t + 1) // nt):
        b0, u = (item // n_units) * L, item % n_units
        s0, s1 = starts[u], starts[u + 1]
        for c0 in range(s0, s1, CHUNK):
            _block_rows(p, s0, c0, min(c0 + CHUNK, s1), b0, bonds, trig, fixed, Z, M, whole)
        _block_backward(p, s0, s1, b0, bonds, pose, gxyz, gb, ga, gd, gf, gpose, Z, M, Y, N)


@njit(cache=True, parallel=True)
def _blocks_backward_parallel(p, starts, bonds, trig, fixed, pose, gxyz, gb, ga, gd, gf, gpose, nt, width):
    for t in prange(nt):
        _blocks_backward_items(t, nt, p, starts, bonds, trig, fixed, pose, gxyz, gb, ga, gd, gf, gpose, width)


def backward_call(p, starts, bonds, trig, fixed, pose, gxyz, gb, ga, gd, gf, gpose, nt, width):  # type: ignore[no-untyped-def]
    """``(kernel, args)``: ``kernel(*args)`` writes the input gradients into ``gb, ga, gd, gf`` (and
    ``gpose``) on ``nt`` threads (arguments as `build.backward`'s)."""
    args = (p, starts, bonds, trig, fixed, pose, gxyz, gb, ga, gd, gf, gpose)
    if nt > 1:
        return _blocks_backward_parallel, (*args, nt, width)
    return _blocks_backward_items, (0, 1, *args, width)
