"""The global pose of the seeded components (numba): the builder's pose rows, and the pose of
coordinates.

`pose_rows` gives the builder's kernels (`samples`, `blocks`)
the pose of every seeded component in every sample as 13 float64 values:
``R`` row-major, ``t``, and 1.0 for a proper rotation (``det R >= 0``); the
kernels place each component's root at ``t``, its second atom along ``R e_x``
and its anchor frame as ``R diag(s, 1, s)``, so that every atom comes out as
``R y + t`` of its canonical position ``y``, with no per-atom pass. The
forward's rows make an improper (or NaN) rotation's component NaN; the
backward's keep its values and its flag, and the backward gives that
component no gradient (the reference's ``where``).

`extract` is the inverse, the pose of each seeded component from its seed
atoms ([`batched_nerf.extract_pose`][batched_nerf.extract_pose]'s Gram-Schmidt frame), for calls with
nothing to differentiate.

Arrays: ``rot`` ``(B, S, 3, 3)``; ``tr`` ``(B, S, 3)``; ``x`` ``(B, N, 3)``; all
C-contiguous.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

__all__ = ["extract", "identity_rows", "pose_rows"]


@functools.lru_cache(maxsize=64)
def identity_rows(n_seeded: int) -> np.ndarray:
    """``(1, S, 13)`` pose rows of no pose (``R = I``, ``t = 0``, proper), shared by every call (left
    writeable: numba compiles a read-only array's kernels anew; the kernels only read it)."""
    rows = np.zeros((1, n_seeded, 13))
    rows[..., [0, 4, 8, 12]] = 1.0
    return rows


@njit(inline="always")
def _det(r):
    """``det r`` of a ``3 x 3`` array, in float64 (cofactors of the first column)."""
    r00, r01, r02 = np.float64(r[0, 0]), np.float64(r[0, 1]), np.float64(r[0, 2])
    r10, r11, r12 = np.float64(r[1, 0]), np.float64(r[1, 1]), np.float64(r[1, 2])
    r20, r21, r22 = np.float64(r[2, 0]), np.float64(r[2, 1]), np.float64(r[2, 2])
    return r00 * (r11 * r22 - r21 * r12) - r10 * (r01 * r22 - r21 * r02) + r20 * (r01 * r12 - r11 * r02)


@njit(cache=True, error_model="numpy")
def _build_rows(rot, tr, nan, rows):
    """``rows[b, s] = (R row-major, t, ok)`` in float64, ``ok`` 1 for ``det R >= 0``; with ``nan`` the
    values of an improper (or NaN) rotation are NaN."""
    for b in range(rot.shape[0]):
        for s in range(rot.shape[1]):
            r, q = rot[b, s], rows[b, s]
            ok = _det(r) >= 0.0
            bad = np.nan if nan and not ok else 0.0
            for k in range(9):
                q[k] = r[k // 3, k % 3] + bad
            for k in range(3):
                q[9 + k] = tr[b, s, k] + bad
            q[12] = 1.0 if ok else 0.0


def pose_rows(rot: np.ndarray, tr: np.ndarray, nan: bool) -> np.ndarray:
    """``(B, S, 13)`` float64 pose rows for the builder's kernels (`build.forward`) from ``rot``
    ``(B, S, 3, 3)`` and ``tr`` ``(B, S, 3)``: ``R`` row-major, ``t``, and 1.0 where ``det R >= 0`` (else
    0.0); with ``nan`` (the forward's) an improper rotation's ``R`` and ``t`` are NaN, which makes its
    component NaN."""
    rows = np.empty(rot.shape[:2] + (13,))
    _build_rows(rot, tr, nan, rows)
    return rows


@njit(inline="always")
def _unit(v0, v1, v2, eps):
    """``v / max(|v|, eps)``; a NaN norm divides every component (NaN stays NaN, as torch's clamp)."""
    n = np.sqrt(v0 * v0 + v1 * v1 + v2 * v2)
    d = eps if n < eps else n
    return v0 / d, v1 / d, v2 / d


@njit(cache=True, error_model="numpy")
def _extract_items(x, seeds, has2, has3, eps, rot, tr):
    """Frame and root of every seeded component of every sample (see `extract`)."""
    n_s = has2.shape[0]
    for b in range(x.shape[0]):
        xb = x[b]
        for s in range(n_s):
            o, p, q = seeds[s], seeds[n_s + s], seeds[2 * n_s + s]
            o0, o1, o2 = np.float64(xb[o, 0]), np.float64(xb[o, 1]), np.float64(xb[o, 2])
            a0, a1, a2 = xb[p, 0] - o0, xb[p, 1] - o1, xb[p, 2] - o2
            ok1 = has2[s] and not np.sqrt(a0 * a0 + a1 * a1 + a2 * a2) < eps  # NaN stays NaN
            if ok1:
                a0, a1, a2 = _unit(a0, a1, a2, eps)
            else:  # no second atom, or coincident with the root: the lab x axis
                a0, a1, a2 = 1.0, 0.0, 0.0
            v0, v1, v2 = xb[q, 0] - o0, xb[q, 1] - o1, xb[q, 2] - o2
            k = v0 * a0 + v1 * a1 + v2 * a2
            w0, w1, w2 = v0 - k * a0, v1 - k * a1, v2 - k * a2
            if not has3[s] or np.sqrt(w0 * w0 + w1 * w1 + w2 * w2) < eps:
                # no third atom, or one on the seed axis: the lab axis least parallel to e1
                v0, v1, v2 = (0.0, 0.0, 1.0) if ok1 and abs(a2) < 0.9 else (0.0, 1.0, 0.0)
                k = v0 * a0 + v1 * a1 + v2 * a2
                w0, w1, w2 = v0 - k * a0, v1 - k * a1, v2 - k * a2
            c0, c1, c2 = _unit(w0, w1, w2, eps)
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
    float64: ``e1 = (x_s - x_o) / |x_s - x_o|``, ``e2`` the normalised part of
    ``x_t - x_o`` orthogonal to ``e1``, ``e3 = e1 x e2``; the translation is ``x_o``.
    Where a direction is shorter than ``eps`` or its atom is missing, the convention of
    `batched_nerf.extract_pose` completes it (always a proper rotation). One thread: ``O(B S)``.
    """
    rot = np.empty((x.shape[0], has2.shape[0], 3, 3), dtype=x.dtype)
    tr = np.empty((x.shape[0], has2.shape[0], 3), dtype=x.dtype)
    _extract_items(x, seeds, has2, has3, eps, rot, tr)
    return rot, tr
