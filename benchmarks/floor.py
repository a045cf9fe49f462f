"""Floor probes: plain numba kernels of the library's formulas, the speed the fused engines aim at.

One compiled loop per sample over the atoms (in build order for the forward
map), samples split across the cores (``prange``; one sample runs without a
parallel launch), float32 in and out, float64
arithmetic inside; no autograd, no singular-geometry guards. They are timed in
the same process as the library calls (``benchmarks/fused_rows.py``), so both see
the same machine.

* :func:`cartesian`: position-based NeRF, the conventions of
  :func:`batched_nerf.to_cartesian` (seeds at the origin, on ``+x``, in the
  ``xy``-plane);
* :func:`internal`: bond lengths, atan2 angles and IUPAC dihedrals, the
  conventions of :func:`batched_nerf.to_internal`.

numba is optional: :func:`available` says whether the probes can run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

try:
    import numba
    from numba import prange
except ImportError:  # the probes are skipped with a note
    numba = None  # type: ignore[assignment]
    prange = range


def available() -> bool:
    """Whether numba is installed (the probes can run)."""
    return numba is not None


def _njit(parallel: bool) -> Callable[[Any], Any]:
    if numba is None:
        return lambda fn: fn
    return numba.njit(parallel=parallel, cache=True)


@_njit(parallel=False)
def _cartesian_samples(refs, bonds, angles, dihedrals, out, s0, s1):  # type: ignore[no-untyped-def]
    n = refs.shape[0]
    pos = np.zeros((n, 3))
    for s in range(s0, s1):
        for i in range(n):
            ib, ia, idd = refs[i, 0], refs[i, 1], refs[i, 2]
            r = float(bonds[s, i])
            if ib < 0:
                pos[i, 0] = pos[i, 1] = pos[i, 2] = 0.0
                continue
            if ia < 0:
                pos[i, 0] = pos[ib, 0] + r
                pos[i, 1] = pos[ib, 1]
                pos[i, 2] = pos[ib, 2]
                continue
            c0, c1, c2 = pos[ib, 0], pos[ib, 1], pos[ib, 2]
            b0, b1, b2 = pos[ia, 0], pos[ia, 1], pos[ia, 2]
            if idd < 0:
                a0, a1, a2 = b0, b1 + 1.0, b2
                cd, sd = 1.0, 0.0
            else:
                a0, a1, a2 = pos[idd, 0], pos[idd, 1], pos[idd, 2]
                cd, sd = math.cos(dihedrals[s, i]), math.sin(dihedrals[s, i])
            u0, u1, u2 = c0 - b0, c1 - b1, c2 - b2
            inv = 1.0 / math.sqrt(u0 * u0 + u1 * u1 + u2 * u2)
            u0, u1, u2 = u0 * inv, u1 * inv, u2 * inv
            w0, w1, w2 = b0 - a0, b1 - a1, b2 - a2
            n0, n1, n2 = w1 * u2 - w2 * u1, w2 * u0 - w0 * u2, w0 * u1 - w1 * u0
            inv = 1.0 / math.sqrt(n0 * n0 + n1 * n1 + n2 * n2)
            n0, n1, n2 = n0 * inv, n1 * inv, n2 * inv
            m0, m1, m2 = n1 * u2 - n2 * u1, n2 * u0 - n0 * u2, n0 * u1 - n1 * u0
            ca, sa = math.cos(angles[s, i]), math.sin(angles[s, i])
            d1, d2, d3 = -r * ca, r * sa * cd, r * sa * sd
            pos[i, 0] = c0 + d1 * u0 + d2 * m0 + d3 * n0
            pos[i, 1] = c1 + d1 * u1 + d2 * m1 + d3 * n1
            pos[i, 2] = c2 + d1 * u2 + d2 * m2 + d3 * n2
        for i in range(n):
            out[s, i, 0] = pos[i, 0]
            out[s, i, 1] = pos[i, 1]
            out[s, i, 2] = pos[i, 2]


@_njit(parallel=True)
def _cartesian(refs, bonds, angles, dihedrals, out):  # type: ignore[no-untyped-def]
    for s in prange(bonds.shape[0]):
        _cartesian_samples(refs, bonds, angles, dihedrals, out, s, s + 1)


@_njit(parallel=False)
def _internal_samples(refs, xyz, bonds, angles, dihedrals, s0, s1):  # type: ignore[no-untyped-def]
    n = refs.shape[0]
    for s in range(s0, s1):
        for i in range(n):
            ib, ia, idd = refs[i, 0], refs[i, 1], refs[i, 2]
            r, th, ph = 0.0, 0.0, 0.0
            if ib >= 0:
                u0 = float(xyz[s, i, 0]) - xyz[s, ib, 0]
                u1 = float(xyz[s, i, 1]) - xyz[s, ib, 1]
                u2 = float(xyz[s, i, 2]) - xyz[s, ib, 2]
                r = math.sqrt(u0 * u0 + u1 * u1 + u2 * u2)
                if ia >= 0:
                    v0 = float(xyz[s, ia, 0]) - xyz[s, ib, 0]
                    v1 = float(xyz[s, ia, 1]) - xyz[s, ib, 1]
                    v2 = float(xyz[s, ia, 2]) - xyz[s, ib, 2]
                    c0, c1, c2 = u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0
                    th = math.atan2(math.sqrt(c0 * c0 + c1 * c1 + c2 * c2), u0 * v0 + u1 * v1 + u2 * v2)
                    if idd >= 0:
                        # b0 = x_a - x_d, b1 = x_b - x_a, b2 = x_i - x_b
                        e0 = float(xyz[s, ia, 0]) - xyz[s, idd, 0]
                        e1 = float(xyz[s, ia, 1]) - xyz[s, idd, 1]
                        e2 = float(xyz[s, ia, 2]) - xyz[s, idd, 2]
                        f0, f1, f2 = -v0, -v1, -v2
                        p0, p1, p2 = f1 * u2 - f2 * u1, f2 * u0 - f0 * u2, f0 * u1 - f1 * u0  # b1 x b2
                        q0, q1, q2 = e1 * f2 - e2 * f1, e2 * f0 - e0 * f2, e0 * f1 - e1 * f0  # b0 x b1
                        y = math.sqrt(f0 * f0 + f1 * f1 + f2 * f2) * (e0 * p0 + e1 * p1 + e2 * p2)
                        ph = math.atan2(y, q0 * p0 + q1 * p1 + q2 * p2)
            bonds[s, i] = r
            angles[s, i] = th
            dihedrals[s, i] = ph


@_njit(parallel=True)
def _internal(refs, xyz, bonds, angles, dihedrals):  # type: ignore[no-untyped-def]
    for s in prange(xyz.shape[0]):
        _internal_samples(refs, xyz, bonds, angles, dihedrals, s, s + 1)


def _serial(n_samples: int) -> bool:
    """One sample: no parallel launch (nothing to split, and a launch costs more than it saves)."""
    return n_samples == 1


def cartesian(refs: np.ndarray) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(bonds, angles, dihedrals)`` ``(B, N)`` float32 -> ``xyz`` ``(B, N, 3)``, rows of ``refs``.

    ``refs`` must be in build order (every reference before its atom; see
    :func:`benchmarks.workloads.in_build_order`).

    Raises:
        RuntimeError: numba is not installed.
        ValueError: ``refs`` is not in build order.
    """
    if numba is None:
        raise RuntimeError("the floor probes need numba")
    refs = np.ascontiguousarray(refs, dtype=np.int64)
    if (refs >= np.arange(len(refs))[:, None]).any():
        raise ValueError("floor.cartesian needs refs in build order (every reference before its atom)")

    def build(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        out = torch.empty(*b.shape, 3, dtype=b.dtype)
        args = (refs, b.contiguous().numpy(), a.contiguous().numpy(), d.contiguous().numpy(), out.numpy())
        if _serial(b.shape[0]):
            _cartesian_samples(*args, 0, b.shape[0])
        else:
            _cartesian(*args)
        return out

    return build


def internal(refs: np.ndarray) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``xyz`` ``(B, N, 3)`` float32 -> ``(bonds, angles, dihedrals)`` ``(B, N)`` each, rows in any order.

    Raises:
        RuntimeError: numba is not installed.
    """
    if numba is None:
        raise RuntimeError("the floor probes need numba")
    refs = np.ascontiguousarray(refs, dtype=np.int64)

    def convert(xyz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = [torch.empty(xyz.shape[:-1], dtype=xyz.dtype) for _ in range(3)]
        args = (refs, xyz.contiguous().numpy(), *(o.numpy() for o in out))
        if _serial(xyz.shape[0]):
            _internal_samples(*args, 0, xyz.shape[0])
        else:
            _internal(*args)
        return out[0], out[1], out[2]

    return convert
