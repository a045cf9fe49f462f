"""The per-row formulas of the fused inverse map (numba scalar functions on 3-tuples).

One row ``i`` with references ``(b, a, d)``: its values (bond, ``atan2``
arguments of angle and dihedral), their gradients w.r.t. the row's atoms, and
the tangents of those gradients (forward-over-reverse: ``H V`` and the value's
tangent ``J V``, the ``*_hvp`` formulas, in select form), with the
singular-geometry rules of `batched_nerf._geometry` (see `inverse`).
Shared by the per-sample kernels (`inverse`) and the blocked
ones (`inverse_blocks`), in two compiled forms:

* the module's own names: each formula compiled once (and cached), called by
  the per-sample kernels, whose rows are scalar code anyway;
* `INLINED`: the same formulas, each inlined by numba into its caller
  (``inline="always"``), for loops that must vectorise: left to LLVM, a call
  inside a blocked loop stays a call and the loop is not vectorised.

numba types an inlined body again at every call site: with every formula
inlined, the per-sample inverse kernels took 9.7 s of the committor pattern's cold
compile at one sample (``_row_second`` alone 5.3 s), against 5.8 s calling them
(``benchmarks/first_use.py``'s pattern, one run each), at the same run time to the
noise of the benchmark machine (vjp and second order: alanine dipeptide x 1 and
x 8, chains of 512 x 8 and 8,192 x 4 atoms).
"""

from __future__ import annotations

import math
import types
from typing import Any

import numba

jit = numba.njit(cache=True)


# --------------------------------------------------------------------------
# 3-vector helpers (tuples of float64)
# --------------------------------------------------------------------------


@jit
def _sub(a, b):  # type: ignore[no-untyped-def]
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


@jit
def _add(a, b):  # type: ignore[no-untyped-def]
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


@jit
def _neg(a):  # type: ignore[no-untyped-def]
    return (-a[0], -a[1], -a[2])


@jit
def _scale(a, s):  # type: ignore[no-untyped-def]
    return (a[0] * s, a[1] * s, a[2] * s)


@jit
def _axpy(s, a, b):  # type: ignore[no-untyped-def]
    """``s * a + b``."""
    return (s * a[0] + b[0], s * a[1] + b[1], s * a[2] + b[2])


@jit
def _dot(a, b):  # type: ignore[no-untyped-def]
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


@jit
def _cross(a, b):  # type: ignore[no-untyped-def]
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


_ZERO3 = (0.0, 0.0, 0.0)


# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------


@jit
def _norm(v):  # type: ignore[no-untyped-def]
    """``|v|``: ``0`` at ``v = 0`` (zero gradient there), NaN stays NaN."""
    sq = _dot(v, v)
    return 0.0 if sq == 0.0 else math.sqrt(sq)


@jit
def _atan2_args(y, x):  # type: ignore[no-untyped-def]
    """``(y, x)`` for ``atan2`` with ``safe_atan2``'s rule: ``(0, 0) -> (0, 1)``."""
    return (y, 1.0) if x == 0.0 and y == 0.0 else (y, x)


@jit
def _angle_args(xi, xb, xa):  # type: ignore[no-untyped-def]
    """``(y, x)`` of the angle ``atan2(|u x v|, u . v)``."""
    u = _sub(xi, xb)
    v = _sub(xa, xb)
    return _atan2_args(_norm(_cross(u, v)), _dot(u, v))


@jit
def _dihedral_args(p0, p1, p2, p3):  # type: ignore[no-untyped-def]
    """``(y, x)`` of the dihedral ``atan2(|b1| b0 . n2, n1 . n2)`` (before the ``(-pi, pi]`` wrap)."""
    b0 = _sub(p1, p0)
    b1 = _sub(p2, p1)
    b2 = _sub(p3, p2)
    n2 = _cross(b1, b2)
    return _atan2_args(_norm(b1) * _dot(b0, n2), _dot(_cross(b0, b1), n2))


# --------------------------------------------------------------------------
# Adjoints (gradients of one row's value w.r.t. its atoms)
# --------------------------------------------------------------------------


@jit
def _atan2_grad(y, x):  # type: ignore[no-untyped-def]
    """``(d/dy, d/dx)`` of `_atan2` (``(1, 0)`` at the origin, as torch's double where)."""
    if x == 0.0 and y == 0.0:
        return 1.0, 0.0
    den = x * x + y * y
    return x / den, -y / den


@jit
def _bond_grad(xi, xb):  # type: ignore[no-untyped-def]
    u = _sub(xi, xb)
    sq = _dot(u, u)
    if sq == 0.0:
        return _ZERO3
    return _scale(u, 1.0 / math.sqrt(sq))


@jit
def _angle_grad(xi, xb, xa):  # type: ignore[no-untyped-def]
    """Gradients for ``(x_i, x_b, x_a)``."""
    u = _sub(xi, xb)
    v = _sub(xa, xb)
    c = _cross(u, v)
    y = _norm(c)
    gy, gx = _atan2_grad(y, _dot(u, v))
    gc = _ZERO3 if y == 0.0 else _scale(c, gy / y)
    gu = _axpy(gx, v, _cross(v, gc))
    gv = _axpy(gx, u, _cross(gc, u))
    return gu, _neg(_add(gu, gv)), gv


@jit
def _dihedral_grad(p0, p1, p2, p3):  # type: ignore[no-untyped-def]
    """Gradients for ``(x_d, x_a, x_b, x_i) = (p0, p1, p2, p3)``."""
    b0 = _sub(p1, p0)
    b1 = _sub(p2, p1)
    b2 = _sub(p3, p2)
    n2 = _cross(b1, b2)
    n1 = _cross(b0, b1)
    nb1 = _norm(b1)
    t = _dot(b0, n2)
    gy, gx = _atan2_grad(nb1 * t, _dot(n1, n2))
    g_t = gy * nb1
    gb1 = _ZERO3 if nb1 == 0.0 else _scale(b1, gy * t / nb1)
    gn2 = _axpy(gx, n1, _scale(b0, g_t))
    gn1 = _scale(n2, gx)
    gb0 = _add(_scale(n2, g_t), _cross(b1, gn1))
    gb1 = _add(gb1, _add(_cross(b2, gn2), _cross(gn1, b0)))
    gb2 = _cross(gn2, b1)
    return _neg(gb0), _sub(gb0, gb1), _sub(gb1, gb2), gb2


# --------------------------------------------------------------------------
# Adjoints on dual numbers: gradient, its tangent (H V) and the value's tangent (J V)
# --------------------------------------------------------------------------


@jit
def _datan2_grad(y, ty, x, tx):  # type: ignore[no-untyped-def]
    """``(gy, tgy, gx, tgx, J V)`` of `_atan2_grad` with tangents ``ty``, ``tx``.

    ``(1, 0, 0, 0, ty)`` at the origin. Selects, not an early return, so that a
    blocked loop calling it still vectorises.
    """
    origin = (x == 0.0) & (y == 0.0)
    den = 1.0 if origin else x * x + y * y
    tden = 2.0 * (x * tx + y * ty)
    gy = 1.0 if origin else x / den
    gx = 0.0 if origin else -y / den
    tgy = 0.0 if origin else tx / den - x * tden / (den * den)
    tgx = 0.0 if origin else -ty / den + y * tden / (den * den)
    return gy, tgy, gx, tgx, (ty if origin else gy * ty + gx * tx)


@jit
def _bond_hvp(xi, xb, ti, tb, g):  # type: ignore[no-untyped-def]
    """``(g H V at x_i, J V)`` of a bond row with cotangent ``g`` and tangents ``ti, tb``; at ``x_b``
    it is minus that. Select form (no early return), as every formula below: a blocked loop calling
    it still vectorises, and both layouts run the same operations."""
    u0, u1, u2 = xi[0] - xb[0], xi[1] - xb[1], xi[2] - xb[2]
    t0, t1, t2 = ti[0] - tb[0], ti[1] - tb[1], ti[2] - tb[2]
    sq = u0 * u0 + u1 * u1 + u2 * u2
    zero = sq == 0.0
    r = 1.0 if zero else math.sqrt(sq)
    tr = 0.0 if zero else (u0 * t0 + u1 * t1 + u2 * t2) / r
    f = 0.0 if zero else g / r
    c0 = 0.0 if zero else f * (t0 - tr / r * u0)  # exact zeros at u = 0, as the vjp
    c1 = 0.0 if zero else f * (t1 - tr / r * u1)
    c2 = 0.0 if zero else f * (t2 - tr / r * u2)
    return (c0, c1, c2), tr


@jit
def _angle_hvp(xi, xb, xa, ti, tb, ta, k):  # type: ignore[no-untyped-def]
    """``(k tgu, k tgv, J V)`` of an angle row with cotangent ``k``: the tangents of its gradients
    at ``x_i`` and ``x_a`` (at ``x_b`` minus their sum)."""
    u0, u1, u2 = xi[0] - xb[0], xi[1] - xb[1], xi[2] - xb[2]
    v0, v1, v2 = xa[0] - xb[0], xa[1] - xb[1], xa[2] - xb[2]
    tu0, tu1, tu2 = ti[0] - tb[0], ti[1] - tb[1], ti[2] - tb[2]
    tv0, tv1, tv2 = ta[0] - tb[0], ta[1] - tb[1], ta[2] - tb[2]
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
    w = 0.0 if y == 0.0 else gy / y
    tw = 0.0 if y == 0.0 else tgy / y - gy * ty / (y * y)
    g0, g1, g2 = c0 * w, c1 * w, c2 * w
    flat = y == 0.0  # gc and its tangent exactly 0
    h0 = 0.0 if flat else tw * c0 + w * tc0  # tangent of gc
    h1 = 0.0 if flat else tw * c1 + w * tc1
    h2 = 0.0 if flat else tw * c2 + w * tc2
    # tgu = tgx v + gx tv + tv x gc + v x tgc;  tgv = tgx u + gx tu + tgc x u + gc x tu
    gu = (
        k * (tgx * v0 + gx * tv0 + (tv1 * g2 - tv2 * g1) + (v1 * h2 - v2 * h1)),
        k * (tgx * v1 + gx * tv1 + (tv2 * g0 - tv0 * g2) + (v2 * h0 - v0 * h2)),
        k * (tgx * v2 + gx * tv2 + (tv0 * g1 - tv1 * g0) + (v0 * h1 - v1 * h0)),
    )
    gv = (
        k * (tgx * u0 + gx * tu0 + (h1 * u2 - h2 * u1) + (g1 * tu2 - g2 * tu1)),
        k * (tgx * u1 + gx * tu1 + (h2 * u0 - h0 * u2) + (g2 * tu0 - g0 * tu2)),
        k * (tgx * u2 + gx * tu2 + (h0 * u1 - h1 * u0) + (g0 * tu1 - g1 * tu0)),
    )
    return gu, gv, jv


@jit
def _dihedral_hvp(xi, xb, xa, xd, ti, tb, ta, td, k):  # type: ignore[no-untyped-def]
    """``(k tgb0, k tgb1, k tgb2, J V)`` of a dihedral row with cotangent ``k``: the tangents of the
    gradients w.r.t. ``b0 = x_a - x_d``, ``b1 = x_b - x_a``, ``b2 = x_i - x_b``."""
    b00, b01, b02 = xa[0] - xd[0], xa[1] - xd[1], xa[2] - xd[2]
    b10, b11, b12 = xb[0] - xa[0], xb[1] - xa[1], xb[2] - xa[2]
    b20, b21, b22 = xi[0] - xb[0], xi[1] - xb[1], xi[2] - xb[2]
    q00, q01, q02 = ta[0] - td[0], ta[1] - td[1], ta[2] - td[2]
    q10, q11, q12 = tb[0] - ta[0], tb[1] - ta[1], tb[2] - ta[2]
    q20, q21, q22 = ti[0] - tb[0], ti[1] - tb[1], ti[2] - tb[2]
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
    # tgb2 = tgn2 x b1 + gn2 x tb1
    tgb2 = (
        k * ((hn21 * b12 - hn22 * b11) + (gn21 * q12 - gn22 * q11)),
        k * ((hn22 * b10 - hn20 * b12) + (gn22 * q10 - gn20 * q12)),
        k * ((hn20 * b11 - hn21 * b10) + (gn20 * q11 - gn21 * q10)),
    )
    g_nb1, tg_nb1 = gy * t, tgy * t + gy * tt
    w = 0.0 if nb1 == 0.0 else g_nb1 / nb1
    tw = 0.0 if nb1 == 0.0 else tg_nb1 / nb1 - g_nb1 * tnb1 / (nb1 * nb1)
    gn10, gn11, gn12 = gx * n20, gx * n21, gx * n22
    hn10, hn11, hn12 = tgx * n20 + gx * m20, tgx * n21 + gx * m21, tgx * n22 + gx * m22
    # tgb0 = tg_t n2 + g_t tn2 + tb1 x gn1 + b1 x tgn1
    tgb0 = (
        k * (tg_t * n20 + g_t * m20 + (q11 * gn12 - q12 * gn11) + (b11 * hn12 - b12 * hn11)),
        k * (tg_t * n21 + g_t * m21 + (q12 * gn10 - q10 * gn12) + (b12 * hn10 - b10 * hn12)),
        k * (tg_t * n22 + g_t * m22 + (q10 * gn11 - q11 * gn10) + (b10 * hn11 - b11 * hn10)),
    )
    # tgb1 = tw b1 + w tb1 + (tb2 x gn2 + b2 x tgn2) + (tgn1 x b0 + gn1 x tb0)
    e0 = 0.0 if nb1 == 0.0 else tw * b10 + w * q10  # tangent of gb1's own part (0 at b1 = 0)
    e1 = 0.0 if nb1 == 0.0 else tw * b11 + w * q11
    e2 = 0.0 if nb1 == 0.0 else tw * b12 + w * q12
    tgb1 = (
        k * (
            e0 + ((q21 * gn22 - q22 * gn21) + (b21 * hn22 - b22 * hn21))
            + ((hn11 * b02 - hn12 * b01) + (gn11 * q02 - gn12 * q01))
        ),
        k * (
            e1 + ((q22 * gn20 - q20 * gn22) + (b22 * hn20 - b20 * hn22))
            + ((hn12 * b00 - hn10 * b02) + (gn12 * q00 - gn10 * q02))
        ),
        k * (
            e2 + ((q20 * gn21 - q21 * gn20) + (b20 * hn21 - b21 * hn20))
            + ((hn10 * b01 - hn11 * b00) + (gn10 * q01 - gn11 * q00))
        ),
    )  # fmt: skip
    return tgb0, tgb1, tgb2, jv


# --------------------------------------------------------------------------
# The same formulas, inlined by numba into their callers
# --------------------------------------------------------------------------


def _inlined() -> dict[str, Any]:
    """Every formula of this module again (a copy of its code), ``inline="always"``, each calling
    the inlined copies of the others: name -> dispatcher."""
    namespace, inlined = dict(globals()), {}
    for name, value in globals().items():
        func = getattr(value, "py_func", None)
        if func is not None and func.__module__ == __name__:
            copy = types.FunctionType(func.__code__, namespace, func.__name__, func.__defaults__)
            namespace[name] = inlined[name] = numba.njit(inline="always")(copy)
    return inlined


#: name -> the formula inlined by numba into its caller (for vectorised loops).
INLINED = _inlined()
