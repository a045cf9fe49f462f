"""Vectorised float64 trigonometry of the CPU kernels (numba): ``cos``/``sin`` and ``atan2``.

**cos, sin** (`trig`, the builder's inputs).

``x = k pi/2 + r`` with ``k = rint(2x / pi)`` and ``|r| <= pi/4``; ``pi/2`` is
split in three (`PIO2`: two 33-bit heads, so ``k * head`` is exact for
``|k| < 2**20``, and the rest), ``r = ((x - k h1) - k h2) - k h3``. ``sin r``
and ``cos r`` are their Taylor series to ``r**17`` and ``r**18`` (truncation
below ``1e-19`` on ``|r| <= pi/4``), and ``k mod 4`` picks the quadrant. Within
2 ulp of libm for ``|x| <= LIMIT`` (checked against ``numpy`` in the tests);
larger ``|x|``, ``inf`` and NaN go to ``math.sin``/``math.cos``.

**atan2** (`angles`, the inverse map's outputs). With ``lo, hi`` the
smaller and larger of ``|x|, |y|``: ``atan(lo / hi)``, or ``pi/4 + atan((lo -
hi) / (lo + hi))`` where ``lo / hi > tan(pi/8)`` (one division either way), a
Taylor series on ``|t| <= tan(pi/8)`` to ``t**43`` (truncation below
``1e-18``); then ``pi/2 - a`` (``|y| > |x|``), ``pi - a`` (``x < 0``) and the
sign of ``y``. ``atan2(0, 0) = 0``; a result that is ``-pi`` in the output
dtype (``y = -0.0`` or a ``y`` just below zero, for ``x < 0``) reads ``+pi``
(the ``(-pi, pi]`` wrap, as ``method="torch"``). Within 2 ulp of libm for finite
arguments (the tests); ``inf`` and NaN go to ``math.atan2``.

Both loops are written out in select form (no helper returning a tuple, no
integer quadrant), which is what lets LLVM vectorise them: about 1 ns per value
on one core here, against ~5 ns for torch's float64 ``sin`` and ``cos``
together and ~1.5 ns for its ``atan2``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from . import threads

__all__ = ["angles", "gathered_trig", "trig"]

#: ``pi/2 = h1 + h2 + h3``: 33-bit ``h1``, ``h2``, then the rest (exact binary values).
PIO2 = tuple(float.fromhex(h) for h in ("0x1.921fb544p+0", "0x1.0b4611a6p-34", "0x1.3198a2e037073p-69"))
#: Beyond this ``|x|`` the reduction leaves its exact range: libm takes over.
LIMIT = 1.0e5
#: Below this many values a call runs on the calling thread (`WORKQUEUE_SERIAL_VALUES` on numba's
#: ``workqueue``, `threads.serial_bound`).
SERIAL_VALUES = 32768
WORKQUEUE_SERIAL_VALUES = 8 * SERIAL_VALUES

_H1, _H2, _H3 = PIO2
_TWO_OVER_PI = 2.0 / math.pi
# Taylor coefficients (-1)^k / (2k + 1)! and (-1)^k / (2k)!, correctly rounded
_S1, _S2, _S3, _S4, _S5, _S6, _S7, _S8 = ((-1) ** k / math.factorial(2 * k + 1) for k in range(1, 9))
_C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8 = ((-1) ** k / math.factorial(2 * k) for k in range(2, 10))
# atan(t) = t + t z sum_k T_k z^(k-1), T_k = (-1)^k / (2k + 1), z = t^2, |t| <= tan(pi/8): to k = 21
# (truncation below 1e-18)
(_T1, _T2, _T3, _T4, _T5, _T6, _T7, _T8, _T9, _T10, _T11, _T12, _T13, _T14, _T15, _T16, _T17, _T18, _T19,
 _T20, _T21) = ((-1) ** k / (2 * k + 1) for k in range(1, 22))  # fmt: skip
_TAN_PI_8 = math.sqrt(2.0) - 1.0


@njit(cache=True, error_model="numpy")
def _sincos(x, cos_out, sin_out):
    """``cos_out[i], sin_out[i] = cos(x[i]), sin(x[i])`` (flat float arrays; a loop from 0, so that
    numba's negative-index wrap-around cannot turn the stores into scatters)."""
    wide = 0
    for i in range(x.size):
        v = np.float64(x[i])
        k = np.rint(v * _TWO_OVER_PI)
        r = ((v - k * _H1) - k * _H2) - k * _H3
        z = r * r
        ps = _S5 + z * (_S6 + z * (_S7 + z * _S8))  # Horner, in two lines
        pc = _C5 + z * (_C6 + z * (_C7 + z * _C8))
        s = r + r * z * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * ps))))
        c = 1.0 - 0.5 * z + z * z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * pc))))
        q = k - 4.0 * np.floor(0.25 * k)  # 0, 1, 2, 3
        swap = (q == 1.0) | (q == 3.0)
        sq = c if swap else s
        cq = s if swap else c
        sin_out[i] = -sq if q >= 2.0 else sq
        cos_out[i] = -cq if (q == 1.0) | (q == 2.0) else cq
        wide += 0 if abs(v) <= LIMIT else 1  # also inf and NaN
    if wide:
        for i in range(x.size):
            v = np.float64(x[i])
            if not abs(v) <= LIMIT:
                sin_out[i] = math.sin(v)
                cos_out[i] = math.cos(v)


@njit(cache=True)
def _trig_items(t, nt, angles, dihedrals, out):
    m = angles.size
    lo, hi = m * t // nt, m * (t + 1) // nt
    _sincos(angles[lo:hi], out[0, lo:hi], out[2, lo:hi])
    _sincos(dihedrals[lo:hi], out[1, lo:hi], out[3, lo:hi])


@njit(cache=True, parallel=True)
def _trig_parallel(angles, dihedrals, out, nt):
    for t in prange(nt):
        _trig_items(t, nt, angles, dihedrals, out)


def trig(angles: np.ndarray, dihedrals: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``(4, *shape)`` float64 ``cos(angles), cos(dihedrals), sin(angles), sin(dihedrals)``.

    ``angles`` and ``dihedrals``: C-contiguous float32 or float64 arrays of one
    shape, in radians. ``out``: a C-contiguous float64 array of ``4 * size``
    values to write into (returned reshaped); default a new one.
    """
    out = np.empty((4, *angles.shape)) if out is None else out.reshape(4, *angles.shape)
    _run(_trig_items, _trig_parallel, angles.reshape(-1), dihedrals.reshape(-1), out.reshape(4, -1))
    return out


def _run(items, parallel, *args):  # type: ignore[no-untyped-def]
    """`threads.launch` of a kernel pair over the two inputs' values (``args[0]``: the flat values
    of one of them)."""
    n = args[0].size
    threads.launch(items, parallel, threads.count(2 * n, n, SERIAL_VALUES, WORKQUEUE_SERIAL_VALUES), *args)


@njit(cache=True)
def _gathered_items(t, nt, values, consts, which, column, count, fallback, bonds, out):
    """Samples ``[m t / nt, m (t + 1) / nt)`` of `gathered_trig`."""
    m, n = bonds.shape
    lo, hi = m * t // nt, m * (t + 1) // nt
    x = np.empty((2, n))  # this sample's angles and dihedrals, before their cos and sin
    for i in range(lo, hi):
        for j in range(n):
            past = j >= count[i]
            for k in range(3):
                w, c = which[k, j], column[k, j]
                if past:
                    v = consts[fallback[k, j]]
                elif w == 0:
                    v = values[0][i if values[0].shape[0] > 1 else 0, c]
                elif w == 1:
                    v = values[1][i if values[1].shape[0] > 1 else 0, c]
                elif w == 2:
                    v = values[2][i if values[2].shape[0] > 1 else 0, c]
                else:
                    v = consts[c]
                if k == 0:
                    bonds[i, j] = v
                else:
                    x[k - 1, j] = v
        _sincos(x[0], out[0, i], out[2, i])
        _sincos(x[1], out[1, i], out[3, i])


@njit(cache=True, parallel=True)
def _gathered_parallel(values, consts, which, column, count, fallback, bonds, out, nt):
    for t in prange(nt):
        _gathered_items(t, nt, values, consts, which, column, count, fallback, bonds, out)


def gathered_trig(
    values: tuple[np.ndarray, np.ndarray, np.ndarray],
    consts: np.ndarray,
    which: np.ndarray,
    column: np.ndarray,
    count: np.ndarray,
    fallback: np.ndarray,
    n_samples: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows' bonds ``(m, n)`` and trig ``(4, m, n)`` (as `trig` makes it) gathered from three value
    arrays in one pass.

    Row ``j`` of sample ``i`` takes its bond (``k = 0``), angle (1) and dihedral (2) from
    ``values[which[k, j]][i, column[k, j]]`` (``which`` 0-2; 3 reads ``consts[column[k, j]]``), or
    from ``consts[fallback[k, j]]`` where ``j >= count[i]``. ``values``: three C-contiguous
    ``(m or 1, K_w)`` arrays of one float dtype (a single row is read by every sample), ``m`` being
    ``n_samples``;
    ``consts`` ``(C,)`` of that dtype; ``which``, ``column``, ``fallback`` ``(3, n)`` and ``count``
    ``(m,)`` int64. The bonds keep the values' dtype. Equal bit for bit to gathering the rows and
    calling `trig` on them.
    """
    m, n = n_samples, which.shape[1]
    bonds = np.empty((m, n), dtype=values[0].dtype)
    out = np.empty((4, m, n))
    args = (values, consts, which, column, count, fallback, bonds, out)
    nt = threads.count(2 * m * n, m, SERIAL_VALUES, WORKQUEUE_SERIAL_VALUES)
    threads.launch(_gathered_items, _gathered_parallel, nt, *args)
    return bonds, out


@njit(cache=True, error_model="numpy")
def _atan2(y, x, out):
    """``out[i] = atan2(y[i], x[i])`` in ``(-pi, pi]``, in ``out``'s dtype (flat float arrays)."""
    wide = 0
    for i in range(y.size):
        vy, vx = y[i], x[i]
        ay, ax = abs(vy), abs(vx)
        swap = ay > ax
        lo, hi = (ax, ay) if swap else (ay, ax)
        big = lo > _TAN_PI_8 * hi  # atan(lo / hi) = pi/4 + atan((lo - hi) / (lo + hi))
        t = 0.0 if hi == 0.0 else ((lo - hi) if big else lo) / ((lo + hi) if big else hi)
        z = t * t
        w = z * z  # four Horner chains in v = z^4 (one chain of 21 was latency-bound: 3x slower)
        v = w * w
        pa = _T1 + v * (_T5 + v * (_T9 + v * (_T13 + v * (_T17 + v * _T21))))
        pb = _T2 + v * (_T6 + v * (_T10 + v * (_T14 + v * _T18)))
        pc = _T3 + v * (_T7 + v * (_T11 + v * (_T15 + v * _T19)))
        pd = _T4 + v * (_T8 + v * (_T12 + v * (_T16 + v * _T20)))
        p = (pa + z * pb) + w * (pc + z * pd)
        a = t + t * z * p + (0.25 * math.pi if big else 0.0)
        a = 0.5 * math.pi - a if swap else a
        a = math.pi - a if vx < 0.0 else a
        out[i] = -a if vy < 0.0 else a
        # (-pi, pi]: a y just below zero gives -pi once rounded (in out's dtype): read as +pi
        out[i] = -out[i] if out[i] <= -math.pi else out[i]
        wide += 0 if hi <= 1.0e300 else 1  # inf and NaN (hi is NaN where either is)
    if wide:
        for i in range(y.size):
            if not max(abs(y[i]), abs(x[i])) <= 1.0e300:
                a = math.atan2(y[i], x[i])
                out[i] = a + 2.0 * math.pi if a <= -math.pi else a


@njit(cache=True)
def _angles_items(t, nt, angles, dihedrals, args):
    m = angles.size
    lo, hi = m * t // nt, m * (t + 1) // nt
    _atan2(args[0, lo:hi], args[2, lo:hi], angles[lo:hi])
    _atan2(args[1, lo:hi], args[3, lo:hi], dihedrals[lo:hi])


@njit(cache=True, parallel=True)
def _angles_parallel(angles, dihedrals, args, nt):
    for t in prange(nt):
        _angles_items(t, nt, angles, dihedrals, args)


def angles(args: np.ndarray, angles: np.ndarray, dihedrals: np.ndarray) -> None:
    """Angles and dihedrals (in ``(-pi, pi]``) into ``angles`` and ``dihedrals`` (C-contiguous, one
    shape ``S``, float32 or float64) from ``args`` ``(4, *S)`` float64: the ``atan2`` arguments
    ``y_angle, y_dihedral, x_angle, x_dihedral``."""
    _run(_angles_items, _angles_parallel, angles.reshape(-1), dihedrals.reshape(-1), args.reshape(4, -1))
