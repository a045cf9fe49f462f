"""Per-sample CPU kernels of the fused engine (numba).

A work item is ``(sample, unit)`` -- a unit is a run of whole components in
build order (`batched_nerf.engines.fused.build.fused_plan`); thread ``t`` of
``nt`` takes items ``t, t + nt, ...``. Frames and positions are float64 scratch
per thread (``O(unit size)``). The entry points that choose between these and
the blocked kernels are in `build`; the formulas are stated there.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ...._geometry import EPS
from ..rows import (  # the plan's fields and row codes (one definition for every backend)
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


@njit(cache=True)
def _clamp(n: float) -> float:
    return n if n >= EPS else EPS


@njit(inline="always")
def _placement(ct, st, cp, sp):
    """Entries of ``L(theta, phi_eff)`` from its cosines and sines: columns of ``L`` are
    ``(l00, l10, l20)``, ``(l01, l11, l21)``, ``(0, l12, l22)``; columns 2, 3 negated where
    ``sin(theta) < 0``. Inlined by numba (the blocked loops calling it stay vectorised)."""
    fl = -1.0 if st < 0.0 else 1.0
    return -ct, st * cp, st * sp, -st * fl, -cp * ct * fl, -sp * ct * fl, -sp * fl, cp * fl


@njit(inline="always")
def _nerf_frame(u0, u1, u2, v0, v1, v2):
    """The NeRF frame ``M`` (row-major; columns ``e1, e2, e3``) of ``u = x_b - x_a``, ``v = x_a - x_d``."""
    iu = 1.0 / _clamp(math.sqrt(u0 * u0 + u1 * u1 + u2 * u2))  # one division per norm: the
    a0, a1, a2 = u0 * iu, u1 * iu, u2 * iu  # blocked loops are bound by vector division
    w0, w1, w2 = v1 * a2 - v2 * a1, v2 * a0 - v0 * a2, v0 * a1 - v1 * a0
    iw = 1.0 / _clamp(math.sqrt(w0 * w0 + w1 * w1 + w2 * w2))
    c0, c1, c2 = w0 * iw, w1 * iw, w2 * iw
    b0, b1, b2 = c1 * a2 - c2 * a1, c2 * a0 - c0 * a2, c0 * a1 - c1 * a0
    return a0, b0, c0, a1, b1, c1, a2, b2, c2


@njit(cache=True)
def _unit_forward(p, s0, s1, b, bonds, trig, fixed, X, F, T, M):
    """Positions ``X``, out-frames ``F`` (row-major 3 x 3) and ``T = (cos t, sin t, cos p_eff, sin p_eff)``
    of plan rows ``[s0, s1)``, and where ``M`` has rows (the backward's recompute) each row's placement
    frame (row-major 3 x 3), which the reverse walk reads instead of making it again."""
    keep = M.shape[0] > 0
    for k in range(s0, s1):
        i = k - s0
        atom = p[ATOM, k]
        code = p[CODE, k]
        if code == FIXED:
            slot = p[SLOT, k]
            for c in range(3):
                X[i, c] = np.float64(fixed[b, slot, c])
            continue
        if code == ROOT:
            X[i, 0] = 0.0
            X[i, 1] = 0.0
            X[i, 2] = 0.0
            continue
        r = np.float64(bonds[b, atom])
        if r < 0.0:  # outside the domain: NaN for this atom and all built from it
            r = np.nan
        if code == SECOND:  # (r, 0, 0); a NaN bond makes the whole atom NaN
            X[i, 0] = r
            X[i, 1] = 0.0 * r
            X[i, 2] = 0.0 * r
            continue
        ct, st = trig[0, b, atom], trig[2, b, atom]
        cp, sp = (1.0, 0.0) if p[THIRD, k] else (trig[1, b, atom], trig[3, b, atom])
        q = p[PHI_FROM, k]
        if q >= 0:  # phi_eff = phi + phi_eff(sibling): compose the turns
            cq, sq = T[q - s0, 2], T[q - s0, 3]
            cp, sp = cp * cq - sp * sq, sp * cq + cp * sq
        if p[FLIP_ON, k] >= 0 and trig[2, b, p[FLIP_ON, k]] < 0.0:  # + pi
            cp, sp = -cp, -sp
        ib = p[REF_B, k] - s0
        m0, m1, m2, m3, m4, m5, m6, m7, m8 = _frame(p, k, s0, X, F)
        if keep:
            M[i, 0], M[i, 1], M[i, 2], M[i, 3], M[i, 4] = m0, m1, m2, m3, m4
            M[i, 5], M[i, 6], M[i, 7], M[i, 8] = m5, m6, m7, m8
        T[i, 0], T[i, 1], T[i, 2], T[i, 3] = ct, st, cp, sp
        l00, l10, l20, l01, l11, l21, l12, l22 = _placement(ct, st, cp, sp)
        l02 = 0.0
        X[i, 0] = X[ib, 0] + r * (m0 * l00 + m1 * l10 + m2 * l20)
        X[i, 1] = X[ib, 1] + r * (m3 * l00 + m4 * l10 + m5 * l20)
        X[i, 2] = X[ib, 2] + r * (m6 * l00 + m7 * l10 + m8 * l20)
        F[i, 0] = m0 * l00 + m1 * l10 + m2 * l20
        F[i, 1] = m0 * l01 + m1 * l11 + m2 * l21
        F[i, 2] = m0 * l02 + m1 * l12 + m2 * l22
        F[i, 3] = m3 * l00 + m4 * l10 + m5 * l20
        F[i, 4] = m3 * l01 + m4 * l11 + m5 * l21
        F[i, 5] = m3 * l02 + m4 * l12 + m5 * l22
        F[i, 6] = m6 * l00 + m7 * l10 + m8 * l20
        F[i, 7] = m6 * l01 + m7 * l11 + m8 * l21
        F[i, 8] = m6 * l02 + m7 * l12 + m8 * l22


@njit(cache=True)
def _frame(p, k, s0, X, F):
    """Placement frame ``M`` (row-major; columns e1, e2, e3) of plan row ``k``."""
    code = p[CODE, k]
    if code == ANCHOR:
        s = np.float64(p[SIGN, k])
        return s, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, s
    if code == FROM_PARENT:
        q = p[PARENT, k] - s0
        return F[q, 0], F[q, 1], F[q, 2], F[q, 3], F[q, 4], F[q, 5], F[q, 6], F[q, 7], F[q, 8]
    ib, ia, idd = p[REF_B, k] - s0, p[REF_A, k] - s0, p[REF_D, k] - s0
    return _nerf_frame(
        X[ib, 0] - X[ia, 0], X[ib, 1] - X[ia, 1], X[ib, 2] - X[ia, 2],
        X[ia, 0] - X[idd, 0], X[ia, 1] - X[idd, 1], X[ia, 2] - X[idd, 2],
    )  # fmt: skip


@njit(inline="always")
def pose_row(pose, b, slot):
    """The pose row ``(R row-major, t, ok)`` of seeded component ``slot`` in sample ``b`` (``pose``
    ``(B or 1, S, 13)``: one row broadcasts to every sample)."""
    return pose[b if pose.shape[0] > 1 else 0, slot]


@njit(inline="always")
def posed(P, y0, y1, y2):
    """``R y + t`` of pose row ``P``."""
    return (
        P[0] * y0 + P[1] * y1 + P[2] * y2 + P[9],
        P[3] * y0 + P[4] * y1 + P[5] * y2 + P[10],
        P[6] * y0 + P[7] * y1 + P[8] * y2 + P[11],
    )


@njit(cache=True)
def _forward_items(t0, nt, p, starts, bonds, trig, fixed, pose, out, X, F, T):
    n_units = starts.size - 1
    no_frames = np.empty((0, 9))  # the forward keeps no placement frames
    for item in range(t0, bonds.shape[0] * n_units, nt):
        b = item // n_units
        u = item - b * n_units
        s0, s1 = starts[u], starts[u + 1]
        _unit_forward(p, s0, s1, b, bonds, trig, fixed, X, F, T, no_frames)
        for k in range(s0, s1):  # out in the pose: R y + t (anchored atoms as built)
            atom, slot, i = p[ATOM, k], p[POSE, k], k - s0
            if slot < 0:
                for c in range(3):
                    out[b, atom, c] = X[i, c]
            else:
                out[b, atom, 0], out[b, atom, 1], out[b, atom, 2] = posed(
                    pose_row(pose, b, slot), X[i, 0], X[i, 1], X[i, 2]
                )


@njit(cache=True, parallel=True)
def _forward_parallel(p, starts, bonds, trig, fixed, pose, out, nt, width):
    for t in prange(nt):
        X = np.empty((width, 3))
        F = np.empty((width, 9))
        T = np.empty((width, 4))
        _forward_items(t, nt, p, starts, bonds, trig, fixed, pose, out, X, F, T)


@njit(cache=True)
def _unit_backward(p, s0, s1, b, bonds, trig, fixed, pose, gxyz, gb, ga, gd, gf, gpose, S):
    """Reverse walk over plan rows ``[s0, s1)``: input gradients of sample ``b`` (and of its pose, added
    into ``gpose[b]`` where ``gpose`` has rows)."""
    X, F, GX, GO, GP, T, M = S
    _unit_forward(p, s0, s1, b, bonds, trig, fixed, X, F, T, M)  # keeps the placement frames in M
    for k in range(s0, s1):
        i = k - s0
        atom, slot = p[ATOM, k], p[POSE, k]
        g0, g1, g2 = np.float64(gxyz[b, atom, 0]), np.float64(gxyz[b, atom, 1]), np.float64(gxyz[b, atom, 2])
        if slot >= 0:  # x = R y + t: g_y = R^T g, gR += g y^T, gt += g (nothing for an improper R)
            g0, g1, g2 = _pose_adjoint(pose_row(pose, b, slot), g0, g1, g2, X[i], gpose, b, slot)
        GX[i, 0], GX[i, 1], GX[i, 2] = g0, g1, g2
        for c in range(9):
            GO[i, c] = 0.0
        GP[i] = 0.0
    for k in range(s1 - 1, s0 - 1, -1):
        i = k - s0
        atom = p[ATOM, k]
        code = p[CODE, k]
        g0, g1, g2 = GX[i, 0], GX[i, 1], GX[i, 2]
        neg = code >= SECOND and bonds[b, atom] < 0.0  # NaN atom: its bond gets no gradient (torch.where)
        if code <= SECOND:
            gb[b, atom] = g0 + 0.0 * (g1 + g2) if code == SECOND and not neg else 0.0
            ga[b, atom] = 0.0
            gd[b, atom] = 0.0
            if code == FIXED:
                slot = p[SLOT, k]
                gf[b, slot, 0] = g0
                gf[b, slot, 1] = g1
                gf[b, slot, 2] = g2
            continue
        r = np.nan if neg else np.float64(bonds[b, atom])
        m0, m1, m2, m3, m4 = M[i, 0], M[i, 1], M[i, 2], M[i, 3], M[i, 4]  # the frame the forward made
        m5, m6, m7, m8 = M[i, 5], M[i, 6], M[i, 7], M[i, 8]
        ct, st, cp, sp = T[i, 0], T[i, 1], T[i, 2], T[i, 3]
        fl = -1.0 if st < 0.0 else 1.0  # the angle and turn gradients below fold the flip in
        l00, l10, l20, l01, l11, l21, l12, l22 = _placement(ct, st, cp, sp)
        l02 = 0.0
        o0, o1, o2, o3, o4, o5, o6, o7, o8 = (
            GO[i, 0], GO[i, 1], GO[i, 2], GO[i, 3], GO[i, 4], GO[i, 5], GO[i, 6], GO[i, 7], GO[i, 8]
        )  # fmt: skip
        # x = x_b + r M u: dr = g . (M u)
        dr = (
            g0 * (m0 * l00 + m1 * l10 + m2 * l20)
            + g1 * (m3 * l00 + m4 * l10 + m5 * l20)
            + g2 * (m6 * l00 + m7 * l10 + m8 * l20)
        )
        gb[b, atom] = 0.0 if neg else dr
        # gL = M^T gO + r (M^T g) e_1^T
        h0 = r * (m0 * g0 + m3 * g1 + m6 * g2)
        h1 = r * (m1 * g0 + m4 * g1 + m7 * g2)
        h2 = r * (m2 * g0 + m5 * g1 + m8 * g2)
        q00 = m0 * o0 + m3 * o3 + m6 * o6 + h0
        q01 = m0 * o1 + m3 * o4 + m6 * o7
        q10 = m1 * o0 + m4 * o3 + m7 * o6 + h1
        q11 = m1 * o1 + m4 * o4 + m7 * o7
        q12 = m1 * o2 + m4 * o5 + m7 * o8
        q20 = m2 * o0 + m5 * o3 + m8 * o6 + h2
        q21 = m2 * o1 + m5 * o4 + m8 * o7
        q22 = m2 * o2 + m5 * o5 + m8 * o8
        # dL/dtheta, dL/dphi (flip folded into columns 2, 3)
        g_t = (
            q00 * st + q10 * cp * ct + q20 * sp * ct
            + fl * (-q01 * ct + q11 * cp * st + q21 * sp * st)
        )  # fmt: skip
        g_p = (
            -q10 * sp * st + q20 * cp * st
            + fl * (q11 * sp * ct - q21 * cp * ct - q12 * cp - q22 * sp)
        )  # fmt: skip
        ga[b, atom] = g_t
        if p[THIRD, k]:
            gd[b, atom] = 0.0
        else:
            tot = g_p + GP[i]
            gd[b, atom] = tot
            if p[PHI_FROM, k] >= 0:
                GP[p[PHI_FROM, k] - s0] += tot
        ib = p[REF_B, k] - s0
        GX[ib, 0] += g0
        GX[ib, 1] += g1
        GX[ib, 2] += g2
        if code == ANCHOR:
            continue
        # gM = r g u^T + gO L^T
        n00 = r * g0 * l00 + o0 * l00 + o1 * l01 + o2 * l02
        n01 = r * g0 * l10 + o0 * l10 + o1 * l11 + o2 * l12
        n02 = r * g0 * l20 + o0 * l20 + o1 * l21 + o2 * l22
        n10 = r * g1 * l00 + o3 * l00 + o4 * l01 + o5 * l02
        n11 = r * g1 * l10 + o3 * l10 + o4 * l11 + o5 * l12
        n12 = r * g1 * l20 + o3 * l20 + o4 * l21 + o5 * l22
        n20 = r * g2 * l00 + o6 * l00 + o7 * l01 + o8 * l02
        n21 = r * g2 * l10 + o6 * l10 + o7 * l11 + o8 * l12
        n22 = r * g2 * l20 + o6 * l20 + o7 * l21 + o8 * l22
        if code == FROM_PARENT:
            q = p[PARENT, k] - s0
            GO[q, 0] += n00
            GO[q, 1] += n01
            GO[q, 2] += n02
            GO[q, 3] += n10
            GO[q, 4] += n11
            GO[q, 5] += n12
            GO[q, 6] += n20
            GO[q, 7] += n21
            GO[q, 8] += n22
            continue
        _nerf_backward(p, k, s0, X, GX, n00, n10, n20, n01, n11, n21, n02, n12, n22)


@njit(inline="always")  # inlined by numba: a call left to LLVM stays, and the blocked loop is not vectorised
def _nerf_adjoint(u0, u1, u2, v0, v1, v2, ge10, ge11, ge12, ge20, ge21, ge22, ge30, ge31, ge32):
    """Adjoint of the NeRF frame ``(e1, e2, e3)`` of ``u = x_b - x_a``, ``v = x_a - x_d``.

    Column adjoints ``ge1, ge2, ge3`` in; ``(gu, gv)`` out (``x_b += gu``,
    ``x_a += gv - gu``, ``x_d -= gv``). Scalars, shared by both kernel layouts.
    """
    nu = math.sqrt(u0 * u0 + u1 * u1 + u2 * u2)
    iu = 1.0 / _clamp(nu)  # one division per norm (as in _nerf_frame)
    a0, a1, a2 = u0 * iu, u1 * iu, u2 * iu
    w0, w1, w2 = v1 * a2 - v2 * a1, v2 * a0 - v0 * a2, v0 * a1 - v1 * a0
    nw = math.sqrt(w0 * w0 + w1 * w1 + w2 * w2)
    iw = 1.0 / _clamp(nw)
    c0, c1, c2 = w0 * iw, w1 * iw, w2 * iw
    # e2 = e3 x e1: ge3 += e1 x ge2, ge1 += ge2 x e3
    ge30 += a1 * ge22 - a2 * ge21
    ge31 += a2 * ge20 - a0 * ge22
    ge32 += a0 * ge21 - a1 * ge20
    ge10 += ge21 * c2 - ge22 * c1
    ge11 += ge22 * c0 - ge20 * c2
    ge12 += ge20 * c1 - ge21 * c0
    # e3 = w / max(|w|, EPS)
    dot = (c0 * ge30 + c1 * ge31 + c2 * ge32) if nw >= EPS else 0.0
    gw0, gw1, gw2 = (ge30 - dot * c0) * iw, (ge31 - dot * c1) * iw, (ge32 - dot * c2) * iw
    # w = v x e1: gv = e1 x gw, ge1 += gw x v
    gv0, gv1, gv2 = a1 * gw2 - a2 * gw1, a2 * gw0 - a0 * gw2, a0 * gw1 - a1 * gw0
    ge10 += gw1 * v2 - gw2 * v1
    ge11 += gw2 * v0 - gw0 * v2
    ge12 += gw0 * v1 - gw1 * v0
    # e1 = u / max(|u|, EPS)
    dot = (a0 * ge10 + a1 * ge11 + a2 * ge12) if nu >= EPS else 0.0
    gu0, gu1, gu2 = (ge10 - dot * a0) * iu, (ge11 - dot * a1) * iu, (ge12 - dot * a2) * iu
    return gu0, gu1, gu2, gv0, gv1, gv2


@njit(cache=True)
def _nerf_backward(p, k, s0, X, GX, ge10, ge11, ge12, ge20, ge21, ge22, ge30, ge31, ge32):
    """Adjoint of the NeRF frame of row ``k`` (column adjoints ``ge1, ge2, ge3``) into ``GX``."""
    ib, ia, idd = p[REF_B, k] - s0, p[REF_A, k] - s0, p[REF_D, k] - s0
    gu0, gu1, gu2, gv0, gv1, gv2 = _nerf_adjoint(
        X[ib, 0] - X[ia, 0], X[ib, 1] - X[ia, 1], X[ib, 2] - X[ia, 2],
        X[ia, 0] - X[idd, 0], X[ia, 1] - X[idd, 1], X[ia, 2] - X[idd, 2],
        ge10, ge11, ge12, ge20, ge21, ge22, ge30, ge31, ge32,
    )  # fmt: skip
    GX[ib, 0] += gu0
    GX[ib, 1] += gu1
    GX[ib, 2] += gu2
    GX[ia, 0] += gv0 - gu0
    GX[ia, 1] += gv1 - gu1
    GX[ia, 2] += gv2 - gu2
    GX[idd, 0] -= gv0
    GX[idd, 1] -= gv1
    GX[idd, 2] -= gv2


@njit(inline="always")
def affine_adjoint(m, q, g0, g1, g2, y0, y1, y2):
    """For ``x = A y + t`` (``m``: ``A`` row-major, then ``t``) and the adjoint ``g`` of ``x``: adds
    ``g y^T`` and ``g`` into ``q`` (the same 12-entry layout) and returns ``A^T g``."""
    q[0] += g0 * y0
    q[1] += g0 * y1
    q[2] += g0 * y2
    q[3] += g1 * y0
    q[4] += g1 * y1
    q[5] += g1 * y2
    q[6] += g2 * y0
    q[7] += g2 * y1
    q[8] += g2 * y2
    q[9] += g0
    q[10] += g1
    q[11] += g2
    return _transposed(m, g0, g1, g2)


@njit(inline="always")
def _transposed(m, g0, g1, g2):
    """``A^T g`` of the row-major ``A`` in ``m[:9]``."""
    return (
        m[0] * g0 + m[3] * g1 + m[6] * g2,
        m[1] * g0 + m[4] * g1 + m[7] * g2,
        m[2] * g0 + m[5] * g1 + m[8] * g2,
    )


@njit(inline="always")
def _pose_adjoint(P, g0, g1, g2, y, gpose, b, slot):
    """``R^T g`` of pose row ``P`` (0 for an improper rotation, the reference's ``where``), adding
    ``g y^T`` and ``g`` into ``gpose[b, slot]`` where ``gpose`` has rows."""
    if not P[12] > 0.0:
        return 0.0, 0.0, 0.0
    if gpose.shape[0]:
        return affine_adjoint(P, gpose[b, slot], g0, g1, g2, y[0], y[1], y[2])
    return _transposed(P, g0, g1, g2)


@njit(cache=True)
def _backward_items(t0, nt, p, starts, bonds, trig, fixed, pose, gxyz, gb, ga, gd, gf, gpose, S):
    n_units = starts.size - 1
    for item in range(t0, bonds.shape[0] * n_units, nt):
        b = item // n_units
        u = item - b * n_units
        s0, s1 = starts[u], starts[u + 1]
        _unit_backward(p, s0, s1, b, bonds, trig, fixed, pose, gxyz, gb, ga, gd, gf, gpose, S)


@njit(cache=True, parallel=True)
def _backward_parallel(p, starts, bonds, trig, fixed, pose, gxyz, gb, ga, gd, gf, gpose, nt, width):
    for t in prange(nt):
        S = (np.empty((width, 3)), np.empty((width, 9)), np.empty((width, 3)),
             np.empty((width, 9)), np.empty(width), np.empty((width, 4)), np.empty((width, 9)))  # fmt: skip
        _backward_items(t, nt, p, starts, bonds, trig, fixed, pose, gxyz, gb, ga, gd, gf, gpose, S)
