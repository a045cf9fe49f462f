"""Blocked vjp and second-order kernels of the fused inverse map (numba): samples innermost, SIMD.

The formulas and singular-geometry rules of `inverse`, laid out
for a block of ``LANES`` samples in the scratch layout of the builder's blocked
kernels (`blocks`): one scratch row per atom, each field
``LANES`` long at a constant offset (positions, tangents, adjoints: 3 fields;
the cotangents of bond, angle, dihedral and ``J V``: 3), so that every loop is
a constant-trip loop over a few row views that LLVM vectorises without
run-time alias checks. Adjoints accumulate per atom with no race (a thread
owns whole blocks); a short last block computes on finite leftovers in its
spare lanes, never written out. The vjp calls the shared per-row formulas of
`inverse_rows`; the second-order loops state the dual-number
formulas of that module's ``_dangle_grad`` / ``_ddihedral_grad`` again, in
select form (those helpers branch on singular geometry, which keeps a loop
scalar). Scalar helpers are inlined by numba (``inline="always"``) and every
kernel uses ``error_model="numpy"`` (numba's default checks every float
division for zero, which stops vectorisation; every division here has its own
guard).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .blocks import LANES, TILE, lanes
from .inverse_rows import INLINED

__all__ = ["second_items", "second_parallel", "vjp_items", "vjp_parallel"]

L = LANES
_jit = njit(cache=True, error_model="numpy")
#: Scalar helpers of one sample, inlined into each loop by numba itself (left to LLVM, the
#: call stays and the loop is not vectorised).
_inline = njit(inline="always", error_model="numpy")
_angle_grad, _bond_grad, _datan2_grad, _dihedral_grad = (
    INLINED[k] for k in ("_angle_grad", "_bond_grad", "_datan2_grad", "_dihedral_grad")
)


@_jit
def _gather3(x, b0, R):
    """``R[j, c * L + s] = x[b0 + s, j, c]`` for the block's samples (in tiles of rows)."""
    n, b1 = x.shape[1], min(b0 + L, x.shape[0])
    for j0 in range(0, n, TILE):
        for b in range(b0, b1):
            s, xb = b - b0, x[b]
            for j in range(j0, min(j0 + TILE, n)):
                R[j, s], R[j, L + s], R[j, 2 * L + s] = xb[j, 0], xb[j, 1], xb[j, 2]


@_jit
def _gather_per_atom(gb, ga, gd, b0, R):
    """``R[j, k * L + s] = (gb, ga, gd)[k][b0 + s, j]``: three ``(B, N)`` arrays, as `_gather3`."""
    n, b1 = gb.shape[1], min(b0 + L, gb.shape[0])
    for j0 in range(0, n, TILE):
        for b in range(b0, b1):
            s, wb, wa, wd = b - b0, gb[b], ga[b], gd[b]
            for j in range(j0, min(j0 + TILE, n)):
                R[j, s], R[j, L + s], R[j, 2 * L + s] = wb[j], wa[j], wd[j]


@_jit
def _gather(xyz, gb, ga, gd, b0, X, G, GX):
    """Positions and the cotangents of bond, angle and dihedral of the block; adjoints zeroed."""
    _gather3(xyz, b0, X)
    _gather_per_atom(gb, ga, gd, b0, G)
    GX[:] = 0.0


@_jit
def _put3(R, b0, out):
    """``out[b0 + s, j, c] = R[j, c * L + s]`` for the block's samples (in tiles of rows)."""
    n, b1 = out.shape[1], min(b0 + L, out.shape[0])
    for j0 in range(0, n, TILE):
        for b in range(b0, b1):
            s, ob = b - b0, out[b]
            for j in range(j0, min(j0 + TILE, n)):
                ob[j, 0], ob[j, 1], ob[j, 2] = R[j, s], R[j, L + s], R[j, 2 * L + s]


@_jit
def _put_per_atom(R, b0, ob, oa, od):
    """``(ob, oa, od)[k][b0 + s, j] = R[j, k * L + s]``: the transpose of `_gather_per_atom`."""
    n, b1 = ob.shape[1], min(b0 + L, ob.shape[0])
    for j0 in range(0, n, TILE):
        for b in range(b0, b1):
            s, wb, wa, wd = b - b0, ob[b], oa[b], od[b]
            for j in range(j0, min(j0 + TILE, n)):
                wb[j], wa[j], wd[j] = R[j, s], R[j, L + s], R[j, 2 * L + s]


@_inline
def _acc(GXr, C, k, sign):
    """``GX[row] += sign * C[k:k+3]`` (a run-time trip count: see `blocks.lanes`)."""
    n = lanes(GXr, 3)
    for c in range(3):
        for s in range(n):
            GXr[c * L + s] += sign * C[(k + c) * L + s]


@_inline
def _acc_diff(GXr, C, k1, k2):
    """``GX[row] += C[k1:k1+3] - C[k2:k2+3]``."""
    n = lanes(GXr, 3)
    for c in range(3):
        for s in range(n):
            GXr[c * L + s] += C[(k1 + c) * L + s] - C[(k2 + c) * L + s]


@_inline
def _scatter_bond(GX, C, i, b):
    """A bond row's ``C[0:3]`` into its atoms ``(i, b)``: ``(+, -)``."""
    _acc(GX[i], C, 0, 1.0)
    _acc(GX[b], C, 0, -1.0)


@_inline
def _scatter_angle(GX, C, i, b, a):
    """An angle row's ``C[0:3] = gu``, ``C[3:6] = gv`` into ``(i, b, a)``: ``(gu, -(gu + gv), gv)``."""
    _acc(GX[i], C, 0, 1.0)
    _acc(GX[b], C, 0, -1.0)
    _acc(GX[b], C, 3, -1.0)
    _acc(GX[a], C, 3, 1.0)


@_inline
def _scatter_dihedral(GX, C, i, b, a, d):
    """Dihedral row ``C = (gb0, gb1, gb2)`` into ``(d, a, b, i)``: ``(-gb0, gb0 - gb1, gb1 - gb2, gb2)``."""
    _acc(GX[d], C, 0, -1.0)
    _acc_diff(GX[a], C, 0, 3)
    _acc_diff(GX[b], C, 3, 6)
    _acc(GX[i], C, 6, 1.0)


@_inline
def _at(R, s):
    """Lane ``s`` of a scratch row as a 3-tuple (the per-row formulas' argument)."""
    return (R[s], R[L + s], R[2 * L + s])


@_jit
def _bond(Xi, Xb, Gi, C):
    """``C[0:3] = g_bond * d bond / d x_i`` (``-`` that at ``b``)."""
    for s in range(L):
        g = _bond_grad(_at(Xi, s), _at(Xb, s))
        w = Gi[s]
        C[s], C[L + s], C[2 * L + s] = w * g[0], w * g[1], w * g[2]


@_jit
def _angle(Xi, Xb, Xa, Gi, C):
    """``C[0:3], C[3:6] = g_angle * (d/dx_i, d/dx_a)``; ``d/dx_b`` is minus their sum."""
    for s in range(L):
        gi, _, ga = _angle_grad(_at(Xi, s), _at(Xb, s), _at(Xa, s))
        w = Gi[L + s]
        C[s], C[L + s], C[2 * L + s] = w * gi[0], w * gi[1], w * gi[2]
        C[3 * L + s], C[4 * L + s], C[5 * L + s] = w * ga[0], w * ga[1], w * ga[2]


@_jit
def _dihedral(Xi, Xb, Xa, Xd, Gi, C):
    """``C[0:12] = g_dihedral * (d/dx_d, d/dx_a, d/dx_b, d/dx_i)``."""
    for s in range(L):
        hd, ha, hb, hi = _dihedral_grad(_at(Xd, s), _at(Xa, s), _at(Xb, s), _at(Xi, s))
        w = Gi[2 * L + s]
        for c in range(3):
            C[c * L + s] = w * hd[c]
            C[(3 + c) * L + s] = w * ha[c]
            C[(6 + c) * L + s] = w * hb[c]
            C[(9 + c) * L + s] = w * hi[c]


@_jit
def _block_vjp(xyz, refs, hb, ha, hd, gb, ga, gd, out, b0, X, G, GX, C):
    _gather(xyz, gb, ga, gd, b0, X, G, GX)
    for i in range(xyz.shape[1]):
        rb, ra, rd = refs[i, 0], refs[i, 1], refs[i, 2]
        if hb[i]:
            _bond(X[i], X[rb], G[i], C)
            _scatter_bond(GX, C, i, rb)
        if hb[i] and ha[i]:
            _angle(X[i], X[rb], X[ra], G[i], C)
            _scatter_angle(GX, C, i, rb, ra)
        if hb[i] and ha[i] and hd[i]:
            _dihedral(X[i], X[rb], X[ra], X[rd], G[i], C)
            for k, row in enumerate((rd, ra, rb, i)):  # the four atoms' gradients, in C's order
                _acc(GX[row], C, 3 * k, 1.0)
    _put3(GX, b0, out)


@_jit
def vjp_items(t, nt, xyz, refs, hb, ha, hd, gb, ga, gd, out):
    """Thread ``t`` of ``nt``: a contiguous run of the blocks of ``LANES`` samples."""
    n_samples, n = xyz.shape[0], xyz.shape[1]
    n_blocks = -(-n_samples // L)
    X, GX, G = np.zeros((n, 3 * L)), np.empty((n, 3 * L)), np.zeros((n, 3 * L))  # zeros: finite spare lanes
    C = np.empty(12 * L)
    for blk in range(n_blocks * t // nt, n_blocks * (t + 1) // nt):
        _block_vjp(xyz, refs, hb, ha, hd, gb, ga, gd, out, blk * L, X, G, GX, C)


@njit(cache=True, parallel=True)
def vjp_parallel(xyz, refs, hb, ha, hd, gb, ga, gd, out, nt):
    for t in prange(nt):
        vjp_items(t, nt, xyz, refs, hb, ha, hd, gb, ga, gd, out)


# ------------------------------------------------------------ second order
# The backward of the vjp: for a cotangent V of J^T g, sum_k g_k H_k V (into the
# atoms, like the vjp) and J V (per row), the tangent of the adjoint code of
# cpu.inverse (forward-over-reverse), one loop per row kind.


@_jit
def _bond_second(Xi, Xb, Ti, Tb, Gi, C, Ji):
    """``C[0:3] = g_bond * H V`` at atom ``i`` (``-`` that at ``b``), ``J[i, bond] = J V``."""
    for s in range(L):
        u0, u1, u2 = Xi[s] - Xb[s], Xi[L + s] - Xb[L + s], Xi[2 * L + s] - Xb[2 * L + s]
        t0, t1, t2 = Ti[s] - Tb[s], Ti[L + s] - Tb[L + s], Ti[2 * L + s] - Tb[2 * L + s]
        sq = u0 * u0 + u1 * u1 + u2 * u2
        zero = sq == 0.0
        r = 1.0 if zero else math.sqrt(sq)
        tr = 0.0 if zero else (u0 * t0 + u1 * t1 + u2 * t2) / r
        f = 0.0 if zero else Gi[s] / r
        C[s] = 0.0 if zero else f * (t0 - tr / r * u0)  # exact zeros at u = 0, as the vjp
        C[L + s] = 0.0 if zero else f * (t1 - tr / r * u1)
        C[2 * L + s] = 0.0 if zero else f * (t2 - tr / r * u2)
        Ji[s] = tr


@_inline
def _angle_second_at(Xi, Xb, Xa, Ti, Tb, Ta, Gi, C, Ji, s):
    """Sample ``s``: ``C[0:6] = g_angle (tgu, tgv)``, ``J[i, angle] = J V``."""
    u0, u1, u2 = Xi[s] - Xb[s], Xi[L + s] - Xb[L + s], Xi[2 * L + s] - Xb[2 * L + s]
    v0, v1, v2 = Xa[s] - Xb[s], Xa[L + s] - Xb[L + s], Xa[2 * L + s] - Xb[2 * L + s]
    tu0, tu1, tu2 = Ti[s] - Tb[s], Ti[L + s] - Tb[L + s], Ti[2 * L + s] - Tb[2 * L + s]
    tv0, tv1, tv2 = Ta[s] - Tb[s], Ta[L + s] - Tb[L + s], Ta[2 * L + s] - Tb[2 * L + s]
    c0, c1, c2 = u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0
    tc0 = (tu1 * v2 - tu2 * v1) + (u1 * tv2 - u2 * tv1)
    tc1 = (tu2 * v0 - tu0 * v2) + (u2 * tv0 - u0 * tv2)
    tc2 = (tu0 * v1 - tu1 * v0) + (u0 * tv1 - u1 * tv0)
    sq = c0 * c0 + c1 * c1 + c2 * c2
    y = 0.0 if sq == 0.0 else math.sqrt(sq)
    ty = 0.0 if y == 0.0 else (c0 * tc0 + c1 * tc1 + c2 * tc2) / y
    x = u0 * v0 + u1 * v1 + u2 * v2
    tx = (tu0 * v0 + tu1 * v1 + tu2 * v2) + (u0 * tv0 + u1 * tv1 + u2 * tv2)
    gy, tgy, gx, tgx, jv = _datan2_grad(y, ty, x, tx)
    Ji[L + s] = jv
    w = 0.0 if y == 0.0 else gy / y
    tw = 0.0 if y == 0.0 else tgy / y - gy * ty / (y * y)
    g0, g1, g2 = c0 * w, c1 * w, c2 * w
    flat = y == 0.0  # gc and its tangent exactly 0
    h0 = 0.0 if flat else tw * c0 + w * tc0  # tangent of gc
    h1 = 0.0 if flat else tw * c1 + w * tc1
    h2 = 0.0 if flat else tw * c2 + w * tc2
    k = Gi[L + s]
    # tgu = tgx v + gx tv + tv x gc + v x tgc;  tgv = tgx u + gx tu + tgc x u + gc x tu
    C[s] = k * (tgx * v0 + gx * tv0 + (tv1 * g2 - tv2 * g1) + (v1 * h2 - v2 * h1))
    C[1 * L + s] = k * (tgx * v1 + gx * tv1 + (tv2 * g0 - tv0 * g2) + (v2 * h0 - v0 * h2))
    C[2 * L + s] = k * (tgx * v2 + gx * tv2 + (tv0 * g1 - tv1 * g0) + (v0 * h1 - v1 * h0))
    C[3 * L + s] = k * (tgx * u0 + gx * tu0 + (h1 * u2 - h2 * u1) + (g1 * tu2 - g2 * tu1))
    C[4 * L + s] = k * (tgx * u1 + gx * tu1 + (h2 * u0 - h0 * u2) + (g2 * tu0 - g0 * tu2))
    C[5 * L + s] = k * (tgx * u2 + gx * tu2 + (h0 * u1 - h1 * u0) + (g0 * tu1 - g1 * tu0))


@_jit
def _angle_second(Xi, Xb, Xa, Ti, Tb, Ta, Gi, C, Ji):
    """The loop of `_angle_second_at`."""
    for s in range(L):
        _angle_second_at(Xi, Xb, Xa, Ti, Tb, Ta, Gi, C, Ji, s)


@_inline
def _dihedral_second_at(Xi, Xb, Xa, Xd, Ti, Tb, Ta, Td, Gi, C, Ji, s):
    """Sample ``s``: ``C[0:9] = g_dihedral (tgb0, tgb1, tgb2)``, ``J[i, dihedral] = J V``."""
    b00, b01, b02 = Xa[s] - Xd[s], Xa[L + s] - Xd[L + s], Xa[2 * L + s] - Xd[2 * L + s]
    b10, b11, b12 = Xb[s] - Xa[s], Xb[L + s] - Xa[L + s], Xb[2 * L + s] - Xa[2 * L + s]
    b20, b21, b22 = Xi[s] - Xb[s], Xi[L + s] - Xb[L + s], Xi[2 * L + s] - Xb[2 * L + s]
    q00, q01, q02 = Ta[s] - Td[s], Ta[L + s] - Td[L + s], Ta[2 * L + s] - Td[2 * L + s]
    q10, q11, q12 = Tb[s] - Ta[s], Tb[L + s] - Ta[L + s], Tb[2 * L + s] - Ta[2 * L + s]
    q20, q21, q22 = Ti[s] - Tb[s], Ti[L + s] - Tb[L + s], Ti[2 * L + s] - Tb[2 * L + s]
    n20, n21, n22 = b11 * b22 - b12 * b21, b12 * b20 - b10 * b22, b10 * b21 - b11 * b20
    m20 = (q11 * b22 - q12 * b21) + (b11 * q22 - b12 * q21)  # tangent of n2
    m21 = (q12 * b20 - q10 * b22) + (b12 * q20 - b10 * q22)
    m22 = (q10 * b21 - q11 * b20) + (b10 * q21 - b11 * q20)
    n10, n11, n12 = b01 * b12 - b02 * b11, b02 * b10 - b00 * b12, b00 * b11 - b01 * b10
    m10 = (q01 * b12 - q02 * b11) + (b01 * q12 - b02 * q11)  # tangent of n1
    m11 = (q02 * b10 - q00 * b12) + (b02 * q10 - b00 * q12)
    m12 = (q00 * b11 - q01 * b10) + (b00 * q11 - b01 * q10)
    sq = b10 * b10 + b11 * b11 + b12 * b12
    nb1 = 0.0 if sq == 0.0 else math.sqrt(sq)
    tnb1 = 0.0 if nb1 == 0.0 else (b10 * q10 + b11 * q11 + b12 * q12) / nb1
    t = b00 * n20 + b01 * n21 + b02 * n22
    tt = (q00 * n20 + q01 * n21 + q02 * n22) + (b00 * m20 + b01 * m21 + b02 * m22)
    y = nb1 * t
    ty = tnb1 * t + nb1 * tt
    x = n10 * n20 + n11 * n21 + n12 * n22
    tx = (m10 * n20 + m11 * n21 + m12 * n22) + (n10 * m20 + n11 * m21 + n12 * m22)
    gy, tgy, gx, tgx, jv = _datan2_grad(y, ty, x, tx)
    g_t, tg_t = gy * nb1, tgy * nb1 + gy * tnb1
    gn20, gn21, gn22 = gx * n10 + g_t * b00, gx * n11 + g_t * b01, gx * n12 + g_t * b02
    hn20 = tgx * n10 + gx * m10 + tg_t * b00 + g_t * q00  # tangent of gn2
    hn21 = tgx * n11 + gx * m11 + tg_t * b01 + g_t * q01
    hn22 = tgx * n12 + gx * m12 + tg_t * b02 + g_t * q02
    k = Gi[2 * L + s]
    # tgb2 = tgn2 x b1 + gn2 x tb1
    C[6 * L + s] = k * ((hn21 * b12 - hn22 * b11) + (gn21 * q12 - gn22 * q11))
    C[7 * L + s] = k * ((hn22 * b10 - hn20 * b12) + (gn22 * q10 - gn20 * q12))
    C[8 * L + s] = k * ((hn20 * b11 - hn21 * b10) + (gn20 * q11 - gn21 * q10))
    Ji[2 * L + s] = jv
    g_nb1, tg_nb1 = gy * t, tgy * t + gy * tt
    w = 0.0 if nb1 == 0.0 else g_nb1 / nb1
    tw = 0.0 if nb1 == 0.0 else tg_nb1 / nb1 - g_nb1 * tnb1 / (nb1 * nb1)
    gn10, gn11, gn12 = gx * n20, gx * n21, gx * n22
    hn10, hn11, hn12 = tgx * n20 + gx * m20, tgx * n21 + gx * m21, tgx * n22 + gx * m22
    # tgb0 = tg_t n2 + g_t tn2 + tb1 x gn1 + b1 x tgn1
    C[s] = k * (tg_t * n20 + g_t * m20 + (q11 * gn12 - q12 * gn11) + (b11 * hn12 - b12 * hn11))
    C[L + s] = k * (tg_t * n21 + g_t * m21 + (q12 * gn10 - q10 * gn12) + (b12 * hn10 - b10 * hn12))
    C[2 * L + s] = k * (tg_t * n22 + g_t * m22 + (q10 * gn11 - q11 * gn10) + (b10 * hn11 - b11 * hn10))
    # tgb1 = tw b1 + w tb1 + (tb2 x gn2 + b2 x tgn2) + (tgn1 x b0 + gn1 x tb0)
    e0 = 0.0 if nb1 == 0.0 else tw * b10 + w * q10  # tangent of gb1's own part (0 at b1 = 0)
    e1 = 0.0 if nb1 == 0.0 else tw * b11 + w * q11
    e2 = 0.0 if nb1 == 0.0 else tw * b12 + w * q12
    C[3 * L + s] = k * (
        e0 + ((q21 * gn22 - q22 * gn21) + (b21 * hn22 - b22 * hn21))
        + ((hn11 * b02 - hn12 * b01) + (gn11 * q02 - gn12 * q01))
    )  # fmt: skip
    C[4 * L + s] = k * (
        e1 + ((q22 * gn20 - q20 * gn22) + (b22 * hn20 - b20 * hn22))
        + ((hn12 * b00 - hn10 * b02) + (gn12 * q00 - gn10 * q02))
    )  # fmt: skip
    C[5 * L + s] = k * (
        e2 + ((q20 * gn21 - q21 * gn20) + (b20 * hn21 - b21 * hn20))
        + ((hn10 * b01 - hn11 * b00) + (gn10 * q01 - gn11 * q00))
    )  # fmt: skip


@_jit
def _dihedral_second(Xi, Xb, Xa, Xd, Ti, Tb, Ta, Td, Gi, C, Ji):
    """The loop of `_dihedral_second_at`."""
    for s in range(L):
        _dihedral_second_at(Xi, Xb, Xa, Xd, Ti, Tb, Ta, Td, Gi, C, Ji, s)


@_jit
def _block_second(xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, b0, X, TV, G, GX, C, J):
    _gather(xyz, gb, ga, gd, b0, X, G, GX)
    _gather3(v, b0, TV)
    J[:] = 0.0
    for i in range(xyz.shape[1]):
        rb, ra, rd = refs[i, 0], refs[i, 1], refs[i, 2]
        if hb[i]:
            _bond_second(X[i], X[rb], TV[i], TV[rb], G[i], C, J[i])
            _scatter_bond(GX, C, i, rb)
        if hb[i] and ha[i]:
            _angle_second(X[i], X[rb], X[ra], TV[i], TV[rb], TV[ra], G[i], C, J[i])
            _scatter_angle(GX, C, i, rb, ra)
        if hb[i] and ha[i] and hd[i]:
            _dihedral_second(X[i], X[rb], X[ra], X[rd], TV[i], TV[rb], TV[ra], TV[rd], G[i], C, J[i])
            _scatter_dihedral(GX, C, i, rb, ra, rd)
    _put3(GX, b0, out)
    _put_per_atom(J, b0, jb, ja, jd)


@_jit
def second_items(t, nt, xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd):
    """Thread ``t`` of ``nt``: a contiguous run of the blocks of ``LANES`` samples."""
    n_samples, n = xyz.shape[0], xyz.shape[1]
    n_blocks = -(-n_samples // L)
    X, TV, G = np.zeros((n, 3 * L)), np.zeros((n, 3 * L)), np.zeros((n, 3 * L))  # zeros: finite spare lanes
    GX, J, C = np.empty((n, 3 * L)), np.empty((n, 3 * L)), np.empty(9 * L)
    for blk in range(n_blocks * t // nt, n_blocks * (t + 1) // nt):
        _block_second(xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, blk * L, X, TV, G, GX, C, J)


@njit(cache=True, parallel=True)
def second_parallel(xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, nt):
    for t in prange(nt):
        second_items(t, nt, xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd)
