"""Blocked vjp and second-order kernels of the fused inverse map (numba): samples innermost, SIMD.

The formulas and singular-geometry rules of :mod:`.fused_inverse_numba`, laid out
for a block of up to ``S`` samples: positions, tangents and cotangents are
gathered into ``(N, 3, S)`` / ``(3, N, S)`` scratch, each row is a few loops over
the block's samples, and the adjoints accumulate per atom with no race (a thread
owns whole blocks). The vjp calls the shared per-row formulas of
:mod:`.fused_inverse_rows`; the second-order loops state the dual-number
formulas of that module's ``_dangle_grad`` / ``_ddihedral_grad`` again, in
select form, because those tuple-returning helpers, inlined, leave the loop
unvectorised (checked in the assembly; one store of theirs vectorises, six do
not). Three rules make LLVM vectorise the loops: at most six stored values per
loop (longer bodies are two loops, the second recomputing), scalar helpers
inlined by numba (``inline="always"``), and ``error_model="numpy"`` (numba's
default ``"python"`` model checks every float division for zero, which stops
vectorisation; every division here has its own guard).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .fused_inverse_rows import _angle_grad, _bond_grad, _datan2_grad, _dihedral_grad

_jit = njit(cache=True, error_model="numpy")
#: Scalar helpers of one sample, inlined into each loop by numba itself (left to LLVM, the
#: call stays and the loop is not vectorised).
_inline = njit(inline="always", error_model="numpy")


@_jit
def _gather(xyz, gb, ga, gd, b0, ns, X, G, GX):
    n = xyz.shape[1]
    for s in range(ns):  # sample by sample: the inputs are read along their rows
        for j in range(n):
            for c in range(3):
                X[j, c, s] = np.float64(xyz[b0 + s, j, c])
                GX[j, c, s] = 0.0
            G[0, j, s] = np.float64(gb[b0 + s, j])
            G[1, j, s] = np.float64(ga[b0 + s, j])
            G[2, j, s] = np.float64(gd[b0 + s, j])


@_jit
def _acc(GX, row, C, k, sign, ns):
    """``GX[row] += sign * C[k:k+3]``."""
    for c in range(3):
        for s in range(ns):
            GX[row, c, s] += sign * C[k + c, s]


@_jit
def _acc_diff(GX, row, C, k1, k2, ns):
    """``GX[row] += C[k1:k1+3] - C[k2:k2+3]``."""
    for c in range(3):
        for s in range(ns):
            GX[row, c, s] += C[k1 + c, s] - C[k2 + c, s]


@_jit
def _scatter_bond(GX, C, i, b, ns):
    """A bond row's ``C[0:3]`` into its atoms ``(i, b)``: ``(+, -)``."""
    _acc(GX, i, C, 0, 1.0, ns)
    _acc(GX, b, C, 0, -1.0, ns)


@_jit
def _scatter_angle(GX, C, i, b, a, ns):
    """An angle row's ``C[0:3] = gu``, ``C[3:6] = gv`` into ``(i, b, a)``: ``(gu, -(gu + gv), gv)``."""
    _acc(GX, i, C, 0, 1.0, ns)
    _acc(GX, b, C, 0, -1.0, ns)
    _acc(GX, b, C, 3, -1.0, ns)
    _acc(GX, a, C, 3, 1.0, ns)


@_jit
def _scatter_dihedral(GX, C, i, b, a, d, ns):
    """Dihedral row ``C = (gb0, gb1, gb2)`` into ``(d, a, b, i)``: ``(-gb0, gb0 - gb1, gb1 - gb2, gb2)``."""
    _acc(GX, d, C, 0, -1.0, ns)
    _acc_diff(GX, a, C, 0, 3, ns)
    _acc_diff(GX, b, C, 3, 6, ns)
    _acc(GX, i, C, 6, 1.0, ns)


@_inline
def _at(X, j, s):
    """Row ``j`` of sample ``s`` as a 3-tuple (the per-row formulas' argument)."""
    return (X[j, 0, s], X[j, 1, s], X[j, 2, s])


@_jit
def _bond(X, G, C, i, b, ns):
    """``C[0:3] = g_bond * d bond / d x_i`` (``-`` that at ``b``)."""
    for s in range(ns):
        g = _bond_grad(_at(X, i, s), _at(X, b, s))
        w = G[0, i, s]
        C[0, s], C[1, s], C[2, s] = w * g[0], w * g[1], w * g[2]


@_jit
def _angle(X, G, C, i, b, a, ns):
    """``C[0:3], C[3:6] = g_angle * (d/dx_i, d/dx_a)``; ``d/dx_b`` is minus their sum."""
    for s in range(ns):
        gi, _, ga = _angle_grad(_at(X, i, s), _at(X, b, s), _at(X, a, s))
        w = G[1, i, s]
        C[0, s], C[1, s], C[2, s] = w * gi[0], w * gi[1], w * gi[2]
        C[3, s], C[4, s], C[5, s] = w * ga[0], w * ga[1], w * ga[2]


@_jit
def _dihedral_da(X, G, C, i, b, a, d, ns):
    """``C[0:6] = g_dihedral * (d/dx_d, d/dx_a)`` (one loop per six stores: see the module doc)."""
    for s in range(ns):
        hd, ha, _, _ = _dihedral_grad(_at(X, d, s), _at(X, a, s), _at(X, b, s), _at(X, i, s))
        w = G[2, i, s]
        C[0, s], C[1, s], C[2, s] = w * hd[0], w * hd[1], w * hd[2]
        C[3, s], C[4, s], C[5, s] = w * ha[0], w * ha[1], w * ha[2]


@_jit
def _dihedral_bi(X, G, C, i, b, a, d, ns):
    """``C[6:12] = g_dihedral * (d/dx_b, d/dx_i)``."""
    for s in range(ns):
        _, _, hb, hi = _dihedral_grad(_at(X, d, s), _at(X, a, s), _at(X, b, s), _at(X, i, s))
        w = G[2, i, s]
        C[6, s], C[7, s], C[8, s] = w * hb[0], w * hb[1], w * hb[2]
        C[9, s], C[10, s], C[11, s] = w * hi[0], w * hi[1], w * hi[2]


@_jit
def _block_vjp(xyz, refs, hb, ha, hd, gb, ga, gd, out, b0, ns, X, G, GX, C):
    _gather(xyz, gb, ga, gd, b0, ns, X, G, GX)
    n = xyz.shape[1]
    for i in range(n):
        rb, ra, rd = refs[i, 0], refs[i, 1], refs[i, 2]
        if hb[i]:
            _bond(X, G, C, i, rb, ns)
            _scatter_bond(GX, C, i, rb, ns)
        if hb[i] and ha[i]:
            _angle(X, G, C, i, rb, ra, ns)
            _scatter_angle(GX, C, i, rb, ra, ns)
        if hb[i] and ha[i] and hd[i]:
            _dihedral_da(X, G, C, i, rb, ra, rd, ns)
            _dihedral_bi(X, G, C, i, rb, ra, rd, ns)
            for k, row in enumerate((rd, ra, rb, i)):  # the four atoms' gradients, in C's order
                _acc(GX, row, C, 3 * k, 1.0, ns)
    for s in range(ns):
        for j in range(n):
            for c in range(3):
                out[b0 + s, j, c] = GX[j, c, s]


@_jit
def vjp_items(t, nt, xyz, refs, hb, ha, hd, gb, ga, gd, out, size):
    """Thread ``t`` of ``nt``: a contiguous run of the blocks of ``size`` samples."""
    n_samples, n = xyz.shape[0], xyz.shape[1]
    n_blocks = -(-n_samples // size)
    X, GX = np.empty((n, 3, size)), np.empty((n, 3, size))
    G, C = np.empty((3, n, size)), np.empty((12, size))
    for blk in range(n_blocks * t // nt, n_blocks * (t + 1) // nt):
        b0 = blk * size
        _block_vjp(xyz, refs, hb, ha, hd, gb, ga, gd, out, b0, min(size, n_samples - b0), X, G, GX, C)


@njit(cache=True, parallel=True)
def vjp_parallel(xyz, refs, hb, ha, hd, gb, ga, gd, out, nt, size):
    for t in prange(nt):
        vjp_items(t, nt, xyz, refs, hb, ha, hd, gb, ga, gd, out, size)


# ------------------------------------------------------------ second order
# The backward of the vjp: for a cotangent V of J^T g, sum_k g_k H_k V (into the
# atoms, like the vjp) and J V (per row), the tangent of the adjoint code of
# fused_inverse_numba (forward-over-reverse), one loop of at most six stores each.


@_jit
def _gather_tangents(v, b0, ns, TV):
    n = v.shape[1]
    for s in range(ns):
        for j in range(n):
            for c in range(3):
                TV[j, c, s] = np.float64(v[b0 + s, j, c])


@_jit
def _bond_second(X, TV, G, C, J, i, b, ns):
    """``C[0:3] = g_bond * H V`` at atom ``i`` (``-`` that at ``b``), ``J[0, i] = J V``."""
    for s in range(ns):
        u0, u1, u2 = X[i, 0, s] - X[b, 0, s], X[i, 1, s] - X[b, 1, s], X[i, 2, s] - X[b, 2, s]
        t0, t1, t2 = TV[i, 0, s] - TV[b, 0, s], TV[i, 1, s] - TV[b, 1, s], TV[i, 2, s] - TV[b, 2, s]
        sq = u0 * u0 + u1 * u1 + u2 * u2
        zero = sq == 0.0
        r = 1.0 if zero else math.sqrt(sq)
        tr = 0.0 if zero else (u0 * t0 + u1 * t1 + u2 * t2) / r
        f = 0.0 if zero else G[0, i, s] / r
        C[0, s] = 0.0 if zero else f * (t0 - tr / r * u0)  # exact zeros at u = 0, as the vjp
        C[1, s] = 0.0 if zero else f * (t1 - tr / r * u1)
        C[2, s] = 0.0 if zero else f * (t2 - tr / r * u2)
        J[0, i, s] = tr


@_inline
def _angle_second_at(X, TV, G, C, J, i, b, a, s, part):
    """Sample ``s``: ``part`` 0 ``C[0:6] = g_angle (tgu, tgv)``, 1 ``J[1, i] = J V``."""
    u0, u1, u2 = X[i, 0, s] - X[b, 0, s], X[i, 1, s] - X[b, 1, s], X[i, 2, s] - X[b, 2, s]
    v0, v1, v2 = X[a, 0, s] - X[b, 0, s], X[a, 1, s] - X[b, 1, s], X[a, 2, s] - X[b, 2, s]
    tu0, tu1, tu2 = TV[i, 0, s] - TV[b, 0, s], TV[i, 1, s] - TV[b, 1, s], TV[i, 2, s] - TV[b, 2, s]
    tv0, tv1, tv2 = TV[a, 0, s] - TV[b, 0, s], TV[a, 1, s] - TV[b, 1, s], TV[a, 2, s] - TV[b, 2, s]
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
    if part == 1:
        J[1, i, s] = jv
        return
    w = 0.0 if y == 0.0 else gy / y
    tw = 0.0 if y == 0.0 else tgy / y - gy * ty / (y * y)
    g0, g1, g2 = c0 * w, c1 * w, c2 * w
    flat = y == 0.0  # gc and its tangent exactly 0
    h0 = 0.0 if flat else tw * c0 + w * tc0  # tangent of gc
    h1 = 0.0 if flat else tw * c1 + w * tc1
    h2 = 0.0 if flat else tw * c2 + w * tc2
    k = G[1, i, s]
    # tgu = tgx v + gx tv + tv x gc + v x tgc;  tgv = tgx u + gx tu + tgc x u + gc x tu
    C[0, s] = k * (tgx * v0 + gx * tv0 + (tv1 * g2 - tv2 * g1) + (v1 * h2 - v2 * h1))
    C[1, s] = k * (tgx * v1 + gx * tv1 + (tv2 * g0 - tv0 * g2) + (v2 * h0 - v0 * h2))
    C[2, s] = k * (tgx * v2 + gx * tv2 + (tv0 * g1 - tv1 * g0) + (v0 * h1 - v1 * h0))
    C[3, s] = k * (tgx * u0 + gx * tu0 + (h1 * u2 - h2 * u1) + (g1 * tu2 - g2 * tu1))
    C[4, s] = k * (tgx * u1 + gx * tu1 + (h2 * u0 - h0 * u2) + (g2 * tu0 - g0 * tu2))
    C[5, s] = k * (tgx * u2 + gx * tu2 + (h0 * u1 - h1 * u0) + (g0 * tu1 - g1 * tu0))


@_jit
def _angle_second(X, TV, G, C, J, i, b, a, ns, part):
    """The loop of :func:`_angle_second_at`, one per ``part`` (the branch folds away)."""
    if part == 0:
        for s in range(ns):
            _angle_second_at(X, TV, G, C, J, i, b, a, s, 0)
    else:
        for s in range(ns):
            _angle_second_at(X, TV, G, C, J, i, b, a, s, 1)


@_inline
def _dihedral_second_at(X, TV, G, C, J, i, b, a, d, s, part):
    """Sample ``s``: ``part`` 0 ``C[0:6] = g_dihedral (tgb0, tgb1)``, 1 ``C[6:9]`` (``tgb2``) and ``J``."""
    b00, b01, b02 = X[a, 0, s] - X[d, 0, s], X[a, 1, s] - X[d, 1, s], X[a, 2, s] - X[d, 2, s]
    b10, b11, b12 = X[b, 0, s] - X[a, 0, s], X[b, 1, s] - X[a, 1, s], X[b, 2, s] - X[a, 2, s]
    b20, b21, b22 = X[i, 0, s] - X[b, 0, s], X[i, 1, s] - X[b, 1, s], X[i, 2, s] - X[b, 2, s]
    q00, q01, q02 = TV[a, 0, s] - TV[d, 0, s], TV[a, 1, s] - TV[d, 1, s], TV[a, 2, s] - TV[d, 2, s]
    q10, q11, q12 = TV[b, 0, s] - TV[a, 0, s], TV[b, 1, s] - TV[a, 1, s], TV[b, 2, s] - TV[a, 2, s]
    q20, q21, q22 = TV[i, 0, s] - TV[b, 0, s], TV[i, 1, s] - TV[b, 1, s], TV[i, 2, s] - TV[b, 2, s]
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
    k = G[2, i, s]
    if part == 1:  # tgb2 = tgn2 x b1 + gn2 x tb1
        C[6, s] = k * ((hn21 * b12 - hn22 * b11) + (gn21 * q12 - gn22 * q11))
        C[7, s] = k * ((hn22 * b10 - hn20 * b12) + (gn22 * q10 - gn20 * q12))
        C[8, s] = k * ((hn20 * b11 - hn21 * b10) + (gn20 * q11 - gn21 * q10))
        J[2, i, s] = jv
        return
    g_nb1, tg_nb1 = gy * t, tgy * t + gy * tt
    w = 0.0 if nb1 == 0.0 else g_nb1 / nb1
    tw = 0.0 if nb1 == 0.0 else tg_nb1 / nb1 - g_nb1 * tnb1 / (nb1 * nb1)
    gn10, gn11, gn12 = gx * n20, gx * n21, gx * n22
    hn10, hn11, hn12 = tgx * n20 + gx * m20, tgx * n21 + gx * m21, tgx * n22 + gx * m22
    # tgb0 = tg_t n2 + g_t tn2 + tb1 x gn1 + b1 x tgn1
    C[0, s] = k * (tg_t * n20 + g_t * m20 + (q11 * gn12 - q12 * gn11) + (b11 * hn12 - b12 * hn11))
    C[1, s] = k * (tg_t * n21 + g_t * m21 + (q12 * gn10 - q10 * gn12) + (b12 * hn10 - b10 * hn12))
    C[2, s] = k * (tg_t * n22 + g_t * m22 + (q10 * gn11 - q11 * gn10) + (b10 * hn11 - b11 * hn10))
    # tgb1 = tw b1 + w tb1 + (tb2 x gn2 + b2 x tgn2) + (tgn1 x b0 + gn1 x tb0)
    e0 = 0.0 if nb1 == 0.0 else tw * b10 + w * q10  # tangent of gb1's own part (0 at b1 = 0)
    e1 = 0.0 if nb1 == 0.0 else tw * b11 + w * q11
    e2 = 0.0 if nb1 == 0.0 else tw * b12 + w * q12
    C[3, s] = k * (
        e0 + ((q21 * gn22 - q22 * gn21) + (b21 * hn22 - b22 * hn21))
        + ((hn11 * b02 - hn12 * b01) + (gn11 * q02 - gn12 * q01))
    )  # fmt: skip
    C[4, s] = k * (
        e1 + ((q22 * gn20 - q20 * gn22) + (b22 * hn20 - b20 * hn22))
        + ((hn12 * b00 - hn10 * b02) + (gn12 * q00 - gn10 * q02))
    )  # fmt: skip
    C[5, s] = k * (
        e2 + ((q20 * gn21 - q21 * gn20) + (b20 * hn21 - b21 * hn20))
        + ((hn10 * b01 - hn11 * b00) + (gn10 * q01 - gn11 * q00))
    )  # fmt: skip


@_jit
def _dihedral_second(X, TV, G, C, J, i, b, a, d, ns, part):
    """The loop of :func:`_dihedral_second_at`, one per ``part`` (the branch folds away)."""
    if part == 0:
        for s in range(ns):
            _dihedral_second_at(X, TV, G, C, J, i, b, a, d, s, 0)
    else:
        for s in range(ns):
            _dihedral_second_at(X, TV, G, C, J, i, b, a, d, s, 1)


@_jit
def _block_second(xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, b0, ns, X, TV, G, GX, C, J):
    _gather(xyz, gb, ga, gd, b0, ns, X, G, GX)
    _gather_tangents(v, b0, ns, TV)
    n = xyz.shape[1]
    J[:, :, :ns] = 0.0
    for i in range(n):
        rb, ra, rd = refs[i, 0], refs[i, 1], refs[i, 2]
        if hb[i]:
            _bond_second(X, TV, G, C, J, i, rb, ns)
            _scatter_bond(GX, C, i, rb, ns)
        if hb[i] and ha[i]:
            _angle_second(X, TV, G, C, J, i, rb, ra, ns, 0)
            _angle_second(X, TV, G, C, J, i, rb, ra, ns, 1)
            _scatter_angle(GX, C, i, rb, ra, ns)
        if hb[i] and ha[i] and hd[i]:
            _dihedral_second(X, TV, G, C, J, i, rb, ra, rd, ns, 0)
            _dihedral_second(X, TV, G, C, J, i, rb, ra, rd, ns, 1)
            _scatter_dihedral(GX, C, i, rb, ra, rd, ns)
    for s in range(ns):
        for j in range(n):
            for c in range(3):
                out[b0 + s, j, c] = GX[j, c, s]
            jb[b0 + s, j] = J[0, j, s]
            ja[b0 + s, j] = J[1, j, s]
            jd[b0 + s, j] = J[2, j, s]


@_jit
def second_items(t, nt, xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, size):
    """Thread ``t`` of ``nt``: a contiguous run of the blocks of ``size`` samples."""
    n_samples, n = xyz.shape[0], xyz.shape[1]
    n_blocks = -(-n_samples // size)
    X, TV, GX = np.empty((n, 3, size)), np.empty((n, 3, size)), np.empty((n, 3, size))
    G, J, C = np.empty((3, n, size)), np.empty((3, n, size)), np.empty((9, size))
    for blk in range(n_blocks * t // nt, n_blocks * (t + 1) // nt):
        b0 = blk * size
        ns = min(size, n_samples - b0)
        _block_second(xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, b0, ns, X, TV, G, GX, C, J)


@njit(cache=True, parallel=True)
def second_parallel(xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, nt, size):
    for t in prange(nt):
        second_items(t, nt, xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, size)
