"""The global pose of the seeded components as one loop (numba): ``x -> R x + t`` and its vjp.

Per sample ``b`` and atom ``i`` of seeded component ``s = slot[i]``::

    out[b, i] = R[b, s] @ x[b, i] + t[b, s]                         (det R[b, s] >= 0)
    out[b, i] = NaN                                                 (det R[b, s] < 0)
    out[b, i] = x[b, i]                                             (s == S: anchored atoms)

and the vjp of ``sum(g * out)``: ``gx = R^T g``, ``gR = sum_i g x^T``,
``gt = sum_i g`` over the atoms of each component (zero for an improper
rotation's atoms, as the reference's ``where`` gives). One pass over the atoms,
float64 arithmetic, inputs and ``gx`` in the coordinates' dtype, ``gR`` and
``gt`` summed and returned in float64. Samples are split over the threads from
:data:`SERIAL_WORK` atom-samples on. Both loops walk runs of consecutive atoms of
one slot (:func:`_runs`; one run per component in most tables), with the pose and
the run's sums in registers rather than a lookup per atom and a sum in memory
(alanine dipeptide x 4,096, float32, 2 threads: pose 0.14-0.28 -> 0.13-0.20 ms, vjp
0.33-0.63 -> 0.24-0.35 ms).

:func:`extract` is the inverse, the pose of each seeded component from its seed
atoms (:func:`batched_nerf.extract_pose`'s Gram-Schmidt frame), for calls with
nothing to differentiate.

Arrays: ``x``, ``out``, ``g``, ``gx`` ``(B, N, 3)``; ``rot`` ``(B, S, 3, 3)``;
``tr`` ``(B, S, 3)``; ``slot`` ``(N,)`` int64; ``grot`` ``(B, S, 3, 3)`` and
``gtr`` ``(B, S, 3)`` float64; all C-contiguous.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

__all__ = ["extract", "move", "move_vjp"]

#: Below this many atom-samples a call runs on the calling thread.
SERIAL_WORK = 65536


@njit(inline="always")
def _det(r):
    """``det r`` of a ``3 x 3`` array, in float64 (cofactors of the first column)."""
    r00, r01, r02 = np.float64(r[0, 0]), np.float64(r[0, 1]), np.float64(r[0, 2])
    r10, r11, r12 = np.float64(r[1, 0]), np.float64(r[1, 1]), np.float64(r[1, 2])
    r20, r21, r22 = np.float64(r[2, 0]), np.float64(r[2, 1]), np.float64(r[2, 2])
    return r00 * (r11 * r22 - r21 * r12) - r10 * (r01 * r22 - r21 * r02) + r20 * (r01 * r12 - r11 * r02)


@njit(cache=True, error_model="numpy")
def _pose_rows(rot, tr, lo, hi, rows):
    """``rows[b - lo, s] = (R row-major, t)`` in float64 for samples ``lo <= b < hi``: NaN for an
    improper (or NaN) rotation."""
    for b in range(lo, hi):
        for s in range(rot.shape[1]):
            r, q = rot[b, s], rows[b - lo, s]
            nan = 0.0 if _det(r) >= 0.0 else np.nan  # NaN rows for det < 0 and a NaN determinant
            for k in range(9):
                q[k] = r[k // 3, k % 3] + nan
            for k in range(3):
                q[9 + k] = tr[b, s, k] + nan


@njit(cache=True)
def _runs(slot):
    """``(R, 3)`` int64: the maximal runs ``(first, last + 1, slot)`` of consecutive atoms of one slot
    (components are contiguous in most tables: one run each, a tight loop with the pose in registers)."""
    n = slot.shape[0]
    runs = np.empty((n, 3), dtype=np.int64)
    r = 0
    for i in range(n):
        if i == 0 or slot[i] != slot[i - 1]:
            runs[r, 0], runs[r, 2] = i, slot[i]
            if r:
                runs[r - 1, 1] = i
            r += 1
    if r:
        runs[r - 1, 1] = n
    return runs[:r]


@njit(cache=True, error_model="numpy")
def _move_items(t, nt, x, rot, tr, slot, out):
    n_b, s_all = x.shape[0], rot.shape[1]
    lo, hi = n_b * t // nt, n_b * (t + 1) // nt
    rows = np.empty((hi - lo, s_all, 12))
    _pose_rows(rot, tr, lo, hi, rows)
    runs = _runs(slot)
    for b in range(lo, hi):
        xb, ob, rb = x[b], out[b], rows[b - lo]
        for k in range(runs.shape[0]):
            i0, i1, s = runs[k, 0], runs[k, 1], runs[k, 2]
            if s == s_all:  # anchored: copied
                for i in range(i0, i1):
                    ob[i, 0], ob[i, 1], ob[i, 2] = xb[i, 0], xb[i, 1], xb[i, 2]
                continue
            q = rb[s]
            q0, q1, q2, q3, q4, q5, q6, q7, q8 = q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8]
            t0, t1, t2 = q[9], q[10], q[11]
            for i in range(i0, i1):
                x0, x1, x2 = np.float64(xb[i, 0]), np.float64(xb[i, 1]), np.float64(xb[i, 2])
                ob[i, 0] = q0 * x0 + q1 * x1 + q2 * x2 + t0
                ob[i, 1] = q3 * x0 + q4 * x1 + q5 * x2 + t1
                ob[i, 2] = q6 * x0 + q7 * x1 + q8 * x2 + t2


@njit(cache=True, parallel=True)
def _move_parallel(x, rot, tr, slot, out, nt):
    for t in prange(nt):
        _move_items(t, nt, x, rot, tr, slot, out)


@njit(cache=True, error_model="numpy")
def _vjp_items(t, nt, g, x, rot, slot, gx, grot, gtr):
    s_all = rot.shape[1]
    runs = _runs(slot)
    for b in range(x.shape[0] * t // nt, x.shape[0] * (t + 1) // nt):
        gb, xb, rb, gxb, grb, gtb = g[b], x[b], rot[b], gx[b], grot[b], gtr[b]
        grb[:] = 0.0
        gtb[:] = 0.0
        for k in range(runs.shape[0]):
            i0, i1, s = runs[k, 0], runs[k, 1], runs[k, 2]
            if s == s_all:  # anchored: the gradient passes through
                for i in range(i0, i1):
                    gxb[i, 0], gxb[i, 1], gxb[i, 2] = gb[i, 0], gb[i, 1], gb[i, 2]
                continue
            r = rb[s]
            if not _det(r) >= 0.0:  # NaN output there, with zero gradient (the reference's where)
                for i in range(i0, i1):
                    gxb[i, 0], gxb[i, 1], gxb[i, 2] = 0.0, 0.0, 0.0
                continue
            r00, r01, r02 = np.float64(r[0, 0]), np.float64(r[0, 1]), np.float64(r[0, 2])
            r10, r11, r12 = np.float64(r[1, 0]), np.float64(r[1, 1]), np.float64(r[1, 2])
            r20, r21, r22 = np.float64(r[2, 0]), np.float64(r[2, 1]), np.float64(r[2, 2])
            a00, a01, a02, a10, a11, a12, a20, a21, a22 = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            c0, c1, c2 = 0.0, 0.0, 0.0
            for i in range(i0, i1):  # the run's sums in registers
                g0, g1, g2 = np.float64(gb[i, 0]), np.float64(gb[i, 1]), np.float64(gb[i, 2])
                gxb[i, 0] = r00 * g0 + r10 * g1 + r20 * g2
                gxb[i, 1] = r01 * g0 + r11 * g1 + r21 * g2
                gxb[i, 2] = r02 * g0 + r12 * g1 + r22 * g2
                x0, x1, x2 = np.float64(xb[i, 0]), np.float64(xb[i, 1]), np.float64(xb[i, 2])
                a00 += g0 * x0
                a01 += g0 * x1
                a02 += g0 * x2
                a10 += g1 * x0
                a11 += g1 * x1
                a12 += g1 * x2
                a20 += g2 * x0
                a21 += g2 * x1
                a22 += g2 * x2
                c0 += g0
                c1 += g1
                c2 += g2
            q = grb[s]
            q[0, 0] += a00
            q[0, 1] += a01
            q[0, 2] += a02
            q[1, 0] += a10
            q[1, 1] += a11
            q[1, 2] += a12
            q[2, 0] += a20
            q[2, 1] += a21
            q[2, 2] += a22
            gtb[s, 0] += c0
            gtb[s, 1] += c1
            gtb[s, 2] += c2


@njit(cache=True, parallel=True)
def _vjp_parallel(g, x, rot, slot, gx, grot, gtr, nt):
    for t in prange(nt):
        _vjp_items(t, nt, g, x, rot, slot, gx, grot, gtr)


def _threads(x: np.ndarray) -> int:
    if x.shape[0] * x.shape[1] < SERIAL_WORK:
        return 1
    return max(1, min(numba.get_num_threads(), x.shape[0]))


def move(
    x: np.ndarray, rot: np.ndarray, tr: np.ndarray, slot: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """``(B, N, 3)`` posed coordinates (``x``'s dtype); shapes in the module docstring.

    ``out`` may be ``x`` itself (in place: each atom is read before it is written, from its own
    coordinates only); default a new array.
    """
    out = np.empty_like(x) if out is None else out
    nt = _threads(x)
    if nt > 1:
        _move_parallel(x, rot, tr, slot, out, nt)
    else:
        _move_items(0, 1, x, rot, tr, slot, out)
    return out


def move_vjp(
    g: np.ndarray, x: np.ndarray, rot: np.ndarray, slot: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``gx`` (``x``'s dtype), ``grot`` and ``gtr`` (float64) of ``sum(g * move(x, rot, tr))``."""
    gx = np.empty_like(x)
    grot = np.empty(rot.shape)
    gtr = np.empty(rot.shape[:2] + (3,))
    nt = _threads(x)
    if nt > 1:
        _vjp_parallel(g, x, rot, slot, gx, grot, gtr, nt)
    else:
        _vjp_items(0, 1, g, x, rot, slot, gx, grot, gtr)
    return gx, grot, gtr


@njit(inline="always")
def _unit(v0, v1, v2, eps):
    """``v / max(|v|, eps)``; a NaN norm divides every component (NaN stays NaN, as torch's clamp)."""
    n = np.sqrt(v0 * v0 + v1 * v1 + v2 * v2)
    d = eps if n < eps else n
    return v0 / d, v1 / d, v2 / d


@njit(cache=True, error_model="numpy")
def _extract_items(x, seeds, has2, has3, eps, rot, tr):
    """Frame and root of every seeded component of every sample (see :func:`extract`)."""
    n_s = has2.shape[0]
    for b in range(x.shape[0]):
        xb = x[b]
        for s in range(n_s):
            o, p, q = seeds[s], seeds[n_s + s], seeds[2 * n_s + s]
            o0, o1, o2 = np.float64(xb[o, 0]), np.float64(xb[o, 1]), np.float64(xb[o, 2])
            if has2[s]:
                a0, a1, a2 = _unit(xb[p, 0] - o0, xb[p, 1] - o1, xb[p, 2] - o2, eps)
            else:
                a0, a1, a2 = 1.0, 0.0, 0.0
            if has3[s]:
                v0, v1, v2 = xb[q, 0] - o0, xb[q, 1] - o1, xb[q, 2] - o2
            elif has2[s] and abs(a2) < 0.9:  # the lab axis least parallel to e1
                v0, v1, v2 = 0.0, 0.0, 1.0
            else:
                v0, v1, v2 = 0.0, 1.0, 0.0
            k = v0 * a0 + v1 * a1 + v2 * a2
            c0, c1, c2 = _unit(v0 - k * a0, v1 - k * a1, v2 - k * a2, eps)
            r = rot[b, s]
            r[0, 0], r[1, 0], r[2, 0] = a0, a1, a2
            r[0, 1], r[1, 1], r[2, 1] = c0, c1, c2
            r[0, 2], r[1, 2], r[2, 2] = a1 * c2 - a2 * c1, a2 * c0 - a0 * c2, a0 * c1 - a1 * c0
            tr[b, s, 0], tr[b, s, 1], tr[b, s, 2] = o0, o1, o2


def extract(
    x: np.ndarray, seeds: np.ndarray, has2: np.ndarray, has3: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """``rot`` ``(B, S, 3, 3)`` and ``tr`` ``(B, S, 3)`` (``x``'s dtype) of ``x`` ``(B, N, 3)``.

    ``seeds`` ``(3 S,)``: root, second and third seed atom of each component
    (the root where it has fewer); ``has2``, ``has3`` ``(S,)`` bool. Computed in
    float64: ``e1 = (x_s - x_o) / max(|x_s - x_o|, eps)``, ``e2`` the normalised
    part of ``x_t - x_o`` orthogonal to ``e1`` (a lab axis for components without a
    third atom), ``e3 = e1 x e2``; the translation is ``x_o``. One thread: ``O(B S)``.
    """
    rot = np.empty((x.shape[0], has2.shape[0], 3, 3), dtype=x.dtype)
    tr = np.empty((x.shape[0], has2.shape[0], 3), dtype=x.dtype)
    _extract_items(x, seeds, has2, has3, eps, rot, tr)
    return rot, tr
