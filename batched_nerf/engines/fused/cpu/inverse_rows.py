"""The per-row formulas of the fused inverse map (numba scalar functions on 3-tuples).

One row ``i`` with references ``(b, a, d)``: its values (bond, ``atan2``
arguments of angle and dihedral), their gradients w.r.t. the row's atoms, and
those gradients on dual numbers (forward-over-reverse: the gradient, its
tangent ``H V`` and the value's tangent ``J V``), with the singular-geometry
rules of `batched_nerf._geometry` (see `inverse`).
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


@jit
def _dcross(a, ta, b, tb):  # type: ignore[no-untyped-def]
    """``(a x b, d(a x b))`` for tangents ``ta``, ``tb``."""
    return _cross(a, b), _add(_cross(ta, b), _cross(a, tb))


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
def _dnorm(v, tv):  # type: ignore[no-untyped-def]
    """``(|v|, d|v|)`` for the tangent ``tv``, with `_norm`'s rule at ``v = 0``."""
    n = _norm(v)
    return n, (0.0 if n == 0.0 else _dot(v, tv) / n)


@jit
def _dscaled(v, tv, g, tg, n, tn):  # type: ignore[no-untyped-def]
    """``((g / n) v, d((g / n) v))`` for tangents ``tv, tg, tn``; exact zeros at ``n = 0`` (the
    gradient of ``n = |v|``'s argument, zero there as `_norm`'s)."""
    if n == 0.0:
        return _ZERO3, _ZERO3
    w = g / n
    tw = tg / n - g * tn / (n * n)
    return _scale(v, w), _axpy(tw, v, _scale(tv, w))


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
def _dbond_grad(xi, ti, xb, tb):  # type: ignore[no-untyped-def]
    """``(g_i, H V_i, J V)``; ``g_b = -g_i``."""
    u = _sub(xi, xb)
    tu = _sub(ti, tb)
    sq = _dot(u, u)
    if sq == 0.0:
        return _ZERO3, _ZERO3, 0.0
    r = math.sqrt(sq)
    tr = _dot(u, tu) / r
    return _scale(u, 1.0 / r), _scale(_axpy(-tr / r, u, tu), 1.0 / r), tr


@jit
def _dangle_grad(xi, ti, xb, tb, xa, ta):  # type: ignore[no-untyped-def]
    """``((g_i, g_b, g_a), (HV_i, HV_b, HV_a), J V)``."""
    u = _sub(xi, xb)
    tu = _sub(ti, tb)
    v = _sub(xa, xb)
    tv = _sub(ta, tb)
    c, tc = _dcross(u, tu, v, tv)
    y, ty = _dnorm(c, tc)
    x = _dot(u, v)
    tx = _dot(tu, v) + _dot(u, tv)
    gy, tgy, gx, tgx, jv = _datan2_grad(y, ty, x, tx)
    gc, tgc = _dscaled(c, tc, gy, tgy, y, ty)
    gu = _axpy(gx, v, _cross(v, gc))
    tgu = _axpy(tgx, v, _axpy(gx, tv, _add(_cross(tv, gc), _cross(v, tgc))))
    gv = _axpy(gx, u, _cross(gc, u))
    tgv = _axpy(tgx, u, _axpy(gx, tu, _add(_cross(tgc, u), _cross(gc, tu))))
    grads = (gu, _neg(_add(gu, gv)), gv)
    hvps = (tgu, _neg(_add(tgu, tgv)), tgv)
    return grads, hvps, jv


@jit
def _ddihedral_grad(p0, q0, p1, q1, p2, q2, p3, q3):  # type: ignore[no-untyped-def]
    """``((g_0..g_3), (HV_0..HV_3), J V)`` for ``(x_d, x_a, x_b, x_i)`` with tangents ``q``."""
    b0, tb0 = _sub(p1, p0), _sub(q1, q0)
    b1, tb1 = _sub(p2, p1), _sub(q2, q1)
    b2, tb2 = _sub(p3, p2), _sub(q3, q2)
    n2, tn2 = _dcross(b1, tb1, b2, tb2)
    n1, tn1 = _dcross(b0, tb0, b1, tb1)
    nb1, tnb1 = _dnorm(b1, tb1)
    t = _dot(b0, n2)
    tt = _dot(tb0, n2) + _dot(b0, tn2)
    y = nb1 * t
    ty = tnb1 * t + nb1 * tt
    x = _dot(n1, n2)
    tx = _dot(tn1, n2) + _dot(n1, tn2)
    gy, tgy, gx, tgx, jv = _datan2_grad(y, ty, x, tx)
    g_nb1, tg_nb1 = gy * t, tgy * t + gy * tt
    g_t, tg_t = gy * nb1, tgy * nb1 + gy * tnb1
    gb1, tgb1 = _dscaled(b1, tb1, g_nb1, tg_nb1, nb1, tnb1)
    gn2 = _axpy(gx, n1, _scale(b0, g_t))
    tgn2 = _axpy(tgx, n1, _axpy(gx, tn1, _axpy(tg_t, b0, _scale(tb0, g_t))))
    gn1 = _scale(n2, gx)
    tgn1 = _axpy(tgx, n2, _scale(tn2, gx))
    gb0 = _add(_scale(n2, g_t), _cross(b1, gn1))
    tgb0 = _add(_axpy(tg_t, n2, _scale(tn2, g_t)), _add(_cross(tb1, gn1), _cross(b1, tgn1)))
    gb1 = _add(gb1, _add(_cross(b2, gn2), _cross(gn1, b0)))
    tgb1 = _add(
        tgb1,
        _add(_add(_cross(tb2, gn2), _cross(b2, tgn2)), _add(_cross(tgn1, b0), _cross(gn1, tb0))),
    )
    gb2 = _cross(gn2, b1)
    tgb2 = _add(_cross(tgn2, b1), _cross(gn2, tb1))
    grads = (_neg(gb0), _sub(gb0, gb1), _sub(gb1, gb2), gb2)
    hvps = (_neg(tgb0), _sub(tgb0, tgb1), _sub(tgb1, tgb2), tgb2)
    return grads, hvps, jv


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
