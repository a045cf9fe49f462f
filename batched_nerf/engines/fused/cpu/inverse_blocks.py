"""Blocked vjp and second-order kernels of the fused inverse map (numba): samples innermost, SIMD.

The formulas and singular-geometry rules of `inverse`, laid out
for a block of ``LANES`` samples in the scratch layout of the builder's blocked
kernels (`blocks`): one scratch row per atom, each field
``LANES`` long at a constant offset (positions, tangents, adjoints: 3 fields;
the cotangents of bond, angle, dihedral and ``J V``: 3), so that every loop is
a constant-trip loop over a few row views that LLVM vectorises without
run-time alias checks. Adjoints accumulate per atom with no race (a thread
owns whole blocks); a short last block computes on finite leftovers in its
spare lanes, never written out. Every loop calls the shared per-row formulas of
`inverse_rows` (the second order's in select form, which vectorises), and the
per-sample kernels of `inverse` add the rows' contributions into the atoms in
this module's order: the two layouts give the same bits (tested), so a call's
result does not depend on which one a process has compiled. Scalar helpers are
inlined by numba (``inline="always"``) and every kernel uses
``error_model="numpy"`` (numba's default checks every float division for zero,
which stops vectorisation; every division here has its own guard).
"""

from __future__ import annotations

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
_angle_grad, _bond_grad, _dihedral_grad, _angle_hvp, _bond_hvp, _dihedral_hvp = (
    INLINED[k]
    for k in ("_angle_grad", "_bond_grad", "_dihedral_grad", "_angle_hvp", "_bond_hvp", "_dihedral_hvp")
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
        c, jv = _bond_hvp(_at(Xi, s), _at(Xb, s), _at(Ti, s), _at(Tb, s), Gi[s])
        C[s], C[L + s], C[2 * L + s] = c[0], c[1], c[2]
        Ji[s] = jv


@_jit
def _angle_second(Xi, Xb, Xa, Ti, Tb, Ta, Gi, C, Ji):
    """``C[0:6] = g_angle (tgu, tgv)``, ``J[i, angle] = J V``."""
    for s in range(L):
        gu, gv, jv = _angle_hvp(
            _at(Xi, s), _at(Xb, s), _at(Xa, s), _at(Ti, s), _at(Tb, s), _at(Ta, s), Gi[L + s]
        )
        for c in range(3):
            C[c * L + s] = gu[c]
            C[(3 + c) * L + s] = gv[c]
        Ji[L + s] = jv


@_jit
def _dihedral_second(Xi, Xb, Xa, Xd, Ti, Tb, Ta, Td, Gi, C, Ji):
    """``C[0:9] = g_dihedral (tgb0, tgb1, tgb2)``, ``J[i, dihedral] = J V``."""
    for s in range(L):
        t0, t1, t2, jv = _dihedral_hvp(
            _at(Xi, s),
            _at(Xb, s),
            _at(Xa, s),
            _at(Xd, s),
            _at(Ti, s),
            _at(Tb, s),
            _at(Ta, s),
            _at(Td, s),
            Gi[2 * L + s],
        )
        for c in range(3):
            C[c * L + s] = t0[c]
            C[(3 + c) * L + s] = t1[c]
            C[(6 + c) * L + s] = t2[c]
        Ji[2 * L + s] = jv


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
