"""Blocked CPU kernels of the fused engine (numba): samples innermost, SIMD across samples.

A work item is ``(block of up to S samples, unit)``; thread ``t`` of ``nt`` takes
a contiguous run of items. Every row is a few short loops over the block's
samples with few enough arrays each that LLVM vectorises them (AVX-512 here);
array views are avoided inside the row loop (numba reference-counts each view).
Scratch per row and sample: positions (3), out-frame (9), turns (4), bond (1);
the placement frame (9) per block. Same formulas as :mod:`.fused_numba_samples`
(see :mod:`.fused_numba`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .fused_numba_samples import (
    ANCHOR,
    ATOM,
    CODE,
    FIXED,
    FLIP_ON,
    FROM_PARENT,
    PARENT,
    PHI_FROM,
    REF_A,
    REF_B,
    REF_D,
    ROOT,
    SECOND,
    SIGN,
    SLOT,
    THIRD,
    _nerf_adjoint,
    _nerf_frame,
    _placement,
)


@njit(cache=True)
def _block_gather(p, s0, s1, b0, ns, bonds, trig, R, T):
    """Bonds and ``T = (cos t, sin t, cos p_eff, sin p_eff)`` of the block's rows, samples last."""
    for s in range(ns):  # sample by sample: the inputs are read along their rows
        for k in range(s0, s1):
            i, atom = k - s0, p[ATOM, k]
            r = np.float64(bonds[b0 + s, atom])
            R[i, s] = np.nan if r < 0.0 else r
            T[i, 0, s] = trig[0, b0 + s, atom]
            T[i, 1, s] = trig[2, b0 + s, atom]
            T[i, 2, s] = 1.0 if p[THIRD, k] else trig[1, b0 + s, atom]
            T[i, 3, s] = 0.0 if p[THIRD, k] else trig[3, b0 + s, atom]
    for k in range(s0, s1):
        i = k - s0
        q, fo = p[PHI_FROM, k] - s0, p[FLIP_ON, k]
        if q >= 0:  # compose the sibling's turn (an earlier row: composed already)
            for s in range(ns):
                cp, sp, cq, sq = T[i, 2, s], T[i, 3, s], T[q, 2, s], T[q, 3, s]
                T[i, 2, s] = cp * cq - sp * sq
                T[i, 3, s] = sp * cq + cp * sq
        if fo >= 0:  # + pi where sin(angle of atom fo) < 0
            for s in range(ns):
                g = -1.0 if trig[2, b0 + s, fo] < 0.0 else 1.0
                T[i, 2, s] *= g
                T[i, 3, s] *= g


@njit(cache=True)
def _block_nerf_frame(X, ib, ia, idd, M, ns):
    """``M`` (row-major, samples last) = the NeRF frame of rows ``ib, ia, idd``'s positions."""
    for s in range(ns):
        m = _nerf_frame(
            X[ib, 0, s] - X[ia, 0, s], X[ib, 1, s] - X[ia, 1, s], X[ib, 2, s] - X[ia, 2, s],
            X[ia, 0, s] - X[idd, 0, s], X[ia, 1, s] - X[idd, 1, s], X[ia, 2, s] - X[idd, 2, s],
        )  # fmt: skip
        for c in range(9):
            M[c, s] = m[c]


@njit(cache=True)
def _block_place(X, F, T, M, R, i, ib, ns):
    """Row ``i``: ``x = x_b + r M u`` and out-frame column 0 (``M u``).

    Whole arrays and row numbers, not views (a view costs reference counting per
    row), and few enough arrays that LLVM vectorises the loop.
    """
    for s in range(ns):
        l00, l10, l20, _, _, _, _, _ = _placement(T[i, 0, s], T[i, 1, s], T[i, 2, s], T[i, 3, s])
        e0 = M[0, s] * l00 + M[1, s] * l10 + M[2, s] * l20
        e1 = M[3, s] * l00 + M[4, s] * l10 + M[5, s] * l20
        e2 = M[6, s] * l00 + M[7, s] * l10 + M[8, s] * l20
        X[i, 0, s] = X[ib, 0, s] + R[i, s] * e0
        X[i, 1, s] = X[ib, 1, s] + R[i, s] * e1
        X[i, 2, s] = X[ib, 2, s] + R[i, s] * e2
        F[i, 0, s], F[i, 3, s], F[i, 6, s] = e0, e1, e2


@njit(cache=True)
def _block_out_frame(F, T, M, i, ns):
    """Out-frame columns 1, 2 of row ``i``: ``M L`` (``L`` columns 2, 3 negated where ``sin(theta) < 0``)."""
    for s in range(ns):
        _, _, _, l01, l11, l21, l12, l22 = _placement(T[i, 0, s], T[i, 1, s], T[i, 2, s], T[i, 3, s])
        F[i, 1, s] = M[0, s] * l01 + M[1, s] * l11 + M[2, s] * l21
        F[i, 2, s] = M[0, s] * 0.0 + M[1, s] * l12 + M[2, s] * l22  # L[0, 2] = 0 (NaN stays NaN)
        F[i, 4, s] = M[3, s] * l01 + M[4, s] * l11 + M[5, s] * l21
        F[i, 5, s] = M[3, s] * 0.0 + M[4, s] * l12 + M[5, s] * l22
        F[i, 7, s] = M[6, s] * l01 + M[7, s] * l11 + M[8, s] * l21
        F[i, 8, s] = M[6, s] * 0.0 + M[7, s] * l12 + M[8, s] * l22


@njit(cache=True)
def _block_frame(p, k, s0, ns, X, F, M):
    """The placement frame of row ``k`` into ``M`` (anchor, the parent's out-frame or NeRF)."""
    code = p[CODE, k]
    if code == ANCHOR:
        sg = np.float64(p[SIGN, k])
        for s in range(ns):
            M[0, s], M[1, s], M[2, s] = sg, 0.0, 0.0
            M[3, s], M[4, s], M[5, s] = 0.0, 1.0, 0.0
            M[6, s], M[7, s], M[8, s] = 0.0, 0.0, sg
    elif code == FROM_PARENT:
        q = p[PARENT, k] - s0
        for c in range(9):
            for s in range(ns):
                M[c, s] = F[q, c, s]
    else:
        _block_nerf_frame(X, p[REF_B, k] - s0, p[REF_A, k] - s0, p[REF_D, k] - s0, M, ns)


@njit(cache=True)
def _block_rows(p, s0, s1, b0, ns, bonds, trig, fixed, X, F, T, R, M):
    """Positions ``X``, out-frames ``F`` and turns ``T`` of rows ``[s0, s1)``, samples ``[b0, b0 + ns)``."""
    _block_gather(p, s0, s1, b0, ns, bonds, trig, R, T)
    for k in range(s0, s1):
        i, code = k - s0, p[CODE, k]
        if code == FIXED:
            for c in range(3):
                for s in range(ns):
                    X[i, c, s] = np.float64(fixed[b0 + s, p[SLOT, k], c])
        elif code == ROOT or code == SECOND:  # (0, 0, 0), (r, 0, 0); a NaN bond makes the atom NaN
            for s in range(ns):
                r = R[i, s] if code == SECOND else 0.0
                X[i, 0, s], X[i, 1, s], X[i, 2, s] = r, 0.0 * r, 0.0 * r
        else:
            _block_frame(p, k, s0, ns, X, F, M)
            _block_place(X, F, T, M, R, i, p[REF_B, k] - s0, ns)
            _block_out_frame(F, T, M, i, ns)


@njit(cache=True)
def _block_forward(p, s0, s1, b0, ns, bonds, trig, fixed, out, X, F, T, R, M):
    """Rows ``[s0, s1)`` of samples ``[b0, b0 + ns)`` into ``out``."""
    _block_rows(p, s0, s1, b0, ns, bonds, trig, fixed, X, F, T, R, M)
    for s in range(ns):
        for k in range(s0, s1):
            atom = p[ATOM, k]
            for c in range(3):
                out[b0 + s, atom, c] = X[k - s0, c, s]


@njit(cache=True)
def _blocks_items(t, nt, p, starts, bonds, trig, fixed, out, width, size):
    """Thread ``t`` of ``nt``: a contiguous run of the (block, unit) items."""
    n_units, n_samples = starts.size - 1, bonds.shape[0]
    total = -(-n_samples // size) * n_units
    X, F, T = np.empty((width, 3, size)), np.empty((width, 9, size)), np.empty((width, 4, size))
    R, M = np.empty((width, size)), np.empty((9, size))
    for item in range(total * t // nt, total * (t + 1) // nt):
        blk, u = item // n_units, item % n_units
        b0 = blk * size
        ns = min(size, n_samples - b0)
        _block_forward(p, starts[u], starts[u + 1], b0, ns, bonds, trig, fixed, out, X, F, T, R, M)


@njit(cache=True, parallel=True)
def _blocks_parallel(p, starts, bonds, trig, fixed, out, nt, width, size):
    for t in prange(nt):
        _blocks_items(t, nt, p, starts, bonds, trig, fixed, out, width, size)


# ------------------------------------------------------------------ backward
# The reverse walk of fused_numba_samples._unit_backward, row by row, each step a
# loop over the block's samples. Adjoints: GX (positions, 3), GO (out-frames, 9),
# GP (turns added to siblings, 1); G (3): the gradients of bond, angle and dihedral
# of each row; N (9): the placement frame's adjoint of the current row.


@njit(cache=True)
def _block_adjoint_start(p, s0, s1, b0, ns, gxyz, GX, GO, GP):
    for s in range(ns):
        for k in range(s0, s1):
            atom = p[ATOM, k]
            for c in range(3):
                GX[k - s0, c, s] = np.float64(gxyz[b0 + s, atom, c])
    GO[: s1 - s0, :, :ns] = 0.0
    GP[: s1 - s0, :ns] = 0.0


@njit(cache=True)
def _block_place_adjoint(GX, GO, T, M, R, G, i, ns):
    """Row ``i``: ``dr = g . (M u)``, angle and turn gradients through ``gL = M^T gO + r (M^T g) e_1^T``."""
    for s in range(ns):
        g0, g1, g2 = GX[i, 0, s], GX[i, 1, s], GX[i, 2, s]
        m0, m1, m2, m3, m4, m5 = M[0, s], M[1, s], M[2, s], M[3, s], M[4, s], M[5, s]
        m6, m7, m8, r = M[6, s], M[7, s], M[8, s], R[i, s]
        o0, o1, o2, o3, o4 = GO[i, 0, s], GO[i, 1, s], GO[i, 2, s], GO[i, 3, s], GO[i, 4, s]
        o5, o6, o7, o8 = GO[i, 5, s], GO[i, 6, s], GO[i, 7, s], GO[i, 8, s]
        ct, st, cp, sp = T[i, 0, s], T[i, 1, s], T[i, 2, s], T[i, 3, s]
        fl = -1.0 if st < 0.0 else 1.0  # the angle and turn gradients below fold the flip in
        l00, l10, l20, _, _, _, _, _ = _placement(ct, st, cp, sp)
        G[0, i, s] = (
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
        G[1, i, s] = (
            q00 * st + q10 * cp * ct + q20 * sp * ct
            + fl * (-q01 * ct + q11 * cp * st + q21 * sp * st)
        )  # fmt: skip
        G[2, i, s] = (
            -q10 * sp * st + q20 * cp * st
            + fl * (q11 * sp * ct - q21 * cp * ct - q12 * cp - q22 * sp)
        )  # fmt: skip


@njit(cache=True)
def _block_frame_adjoint(GX, GO, T, R, N, i, ns):
    """``N = gM = r g u^T + gO L^T`` of row ``i`` (row-major)."""
    for c in range(3):  # a row of N per loop: three stores each, so that the loop vectorises
        for s in range(ns):
            l00, l10, l20, l01, l11, l21, l12, l22 = _placement(
                T[i, 0, s], T[i, 1, s], T[i, 2, s], T[i, 3, s]
            )
            rg = R[i, s] * GX[i, c, s]
            o0, o1, o2 = GO[i, 3 * c, s], GO[i, 3 * c + 1, s], GO[i, 3 * c + 2, s]
            N[3 * c, s] = rg * l00 + o0 * l00 + o1 * l01 + o2 * 0.0  # L[0, 2] = 0 (NaN stays NaN)
            N[3 * c + 1, s] = rg * l10 + o0 * l10 + o1 * l11 + o2 * l12
            N[3 * c + 2, s] = rg * l20 + o0 * l20 + o1 * l21 + o2 * l22


@njit(cache=True)
def _block_nerf_adjoint(X, GX, N, ib, ia, idd, ns):
    """Adjoint of the NeRF frame of rows ``ib, ia, idd`` (frame adjoint ``N``, row-major) into ``GX``.

    ``(gu, gv)`` overwrite ``N[0:6]`` in the vectorised loop (six stores), then
    three short loops add them into the atoms.
    """
    for s in range(ns):
        gu0, gu1, gu2, gv0, gv1, gv2 = _nerf_adjoint(
            X[ib, 0, s] - X[ia, 0, s],
            X[ib, 1, s] - X[ia, 1, s],
            X[ib, 2, s] - X[ia, 2, s],
            X[ia, 0, s] - X[idd, 0, s],
            X[ia, 1, s] - X[idd, 1, s],
            X[ia, 2, s] - X[idd, 2, s],
            N[0, s],
            N[3, s],
            N[6, s],
            N[1, s],
            N[4, s],
            N[7, s],
            N[2, s],
            N[5, s],
            N[8, s],
        )  # fmt: skip  (column adjoints of M = (e1, e2, e3), M row-major)
        N[0, s], N[1, s], N[2, s], N[3, s], N[4, s], N[5, s] = gu0, gu1, gu2, gv0, gv1, gv2
    for c in range(3):
        for s in range(ns):
            GX[ib, c, s] += N[c, s]
    for c in range(3):
        for s in range(ns):
            GX[ia, c, s] += N[3 + c, s] - N[c, s]
    for c in range(3):
        for s in range(ns):
            GX[idd, c, s] -= N[3 + c, s]


@njit(cache=True)
def _block_backward(p, s0, s1, b0, ns, bonds, trig, fixed, gxyz, gb, ga, gd, gf, S):
    """Input gradients of rows ``[s0, s1)``, samples ``[b0, b0 + ns)``: recompute, then walk back."""
    X, F, T, R, M, GX, GO, GP, G, N = S
    _block_rows(p, s0, s1, b0, ns, bonds, trig, fixed, X, F, T, R, M)
    _block_adjoint_start(p, s0, s1, b0, ns, gxyz, GX, GO, GP)
    for k in range(s1 - 1, s0 - 1, -1):
        i, code, atom = k - s0, p[CODE, k], p[ATOM, k]
        if code <= SECOND:
            for s in range(ns):  # a SECOND atom is (r, 0, 0): dr = g_x (NaN in g stays NaN)
                G[0, i, s] = GX[i, 0, s] + 0.0 * (GX[i, 1, s] + GX[i, 2, s]) if code == SECOND else 0.0
                G[1, i, s], G[2, i, s] = 0.0, 0.0
            if code == FIXED:
                for s in range(ns):
                    for c in range(3):
                        gf[b0 + s, p[SLOT, k], c] = GX[i, c, s]
            continue
        _block_frame(p, k, s0, ns, X, F, M)
        _block_place_adjoint(GX, GO, T, M, R, G, i, ns)
        q = p[PHI_FROM, k] - s0
        for s in range(ns):  # the turn's gradient: its own plus what siblings built on it gave back
            G[2, i, s] = 0.0 if p[THIRD, k] else G[2, i, s] + GP[i, s]
        if q >= 0:
            for s in range(ns):
                GP[q, s] += G[2, i, s]
        ib = p[REF_B, k] - s0
        for c in range(3):
            for s in range(ns):
                GX[ib, c, s] += GX[i, c, s]
        if code == ANCHOR:
            continue
        _block_frame_adjoint(GX, GO, T, R, N, i, ns)
        if code == FROM_PARENT:
            q = p[PARENT, k] - s0
            for c in range(9):
                for s in range(ns):
                    GO[q, c, s] += N[c, s]
        else:
            _block_nerf_adjoint(X, GX, N, ib, p[REF_A, k] - s0, p[REF_D, k] - s0, ns)
    for s in range(ns):  # out, sample by sample; no gradient for an out-of-domain (negative) bond
        for k in range(s0, s1):
            i, atom = k - s0, p[ATOM, k]
            neg = p[CODE, k] >= SECOND and bonds[b0 + s, atom] < 0.0
            gb[b0 + s, atom] = 0.0 if neg else G[0, i, s]
            ga[b0 + s, atom] = G[1, i, s]
            gd[b0 + s, atom] = G[2, i, s]


@njit(cache=True)
def _blocks_backward_items(t, nt, p, starts, bonds, trig, fixed, gxyz, gb, ga, gd, gf, width, size):
    """Thread ``t`` of ``nt``: a contiguous run of the (block, unit) items."""
    n_units, n_samples = starts.size - 1, bonds.shape[0]
    total = -(-n_samples // size) * n_units
    S = (
        np.empty((width, 3, size)), np.empty((width, 9, size)), np.empty((width, 4, size)),
        np.empty((width, size)), np.empty((9, size)), np.empty((width, 3, size)),
        np.empty((width, 9, size)), np.empty((width, size)), np.empty((3, width, size)),
        np.empty((9, size)),
    )  # fmt: skip
    for item in range(total * t // nt, total * (t + 1) // nt):
        blk, u = item // n_units, item % n_units
        b0 = blk * size
        ns = min(size, n_samples - b0)
        _block_backward(p, starts[u], starts[u + 1], b0, ns, bonds, trig, fixed, gxyz, gb, ga, gd, gf, S)


@njit(cache=True, parallel=True)
def _blocks_backward_parallel(p, starts, bonds, trig, fixed, gxyz, gb, ga, gd, gf, nt, width, size):
    for t in prange(nt):
        _blocks_backward_items(t, nt, p, starts, bonds, trig, fixed, gxyz, gb, ga, gd, gf, width, size)
