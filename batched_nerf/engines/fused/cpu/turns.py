"""Rigid turns of rotatable bonds' moving sides (numba): `bn.update_torsions`'s kernel.

Each bond ``k`` turns the atoms of its moving side by ``tau_k`` about the axis ``x_u - x_v``
through ``x_v`` (right-handed, Rodrigues); nested sides compose, the inner turn first, both about
the input's axes (the same as the peers' sequential loop over bonds). Per sample, the bonds are
walked outer first (``order``), each one's transform composed onto its parent's
(``parent``), then every atom moved by the transform of the innermost bond that turns it
(``atom_rotor``, ``-1``: the atom stays, copied). Transforms are float64; inputs and outputs keep
their dtype. The torch version, which every derivative goes through, is
`batched_nerf.torsion_space.turns.turned`.

Arrays: ``x`` ``(B, T, 3)``, ``tau`` ``(B, R)``, ``out`` ``(B, T, 3)``, C-contiguous; the plan's
``(R,)`` / ``(T,)`` ``int64`` arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["turn"]

#: Below this many atom-samples a call runs on the calling thread.
SERIAL_WORK = 4096


@njit(inline="always")
def _sample(x, tau, u, v, order, parent, atom_rotor, eps, c, out):
    """One sample: the bonds' composed transforms into ``c`` ``(R, 12)``, then the atoms."""
    for q in range(order.shape[0]):
        k = order[q]
        xv0, xv1, xv2 = np.float64(x[v[k], 0]), np.float64(x[v[k], 1]), np.float64(x[v[k], 2])
        a0, a1, a2 = x[u[k], 0] - xv0, x[u[k], 1] - xv1, x[u[k], 2] - xv2
        n = np.sqrt(a0 * a0 + a1 * a1 + a2 * a2)
        d = eps if n < eps else n  # a NaN norm stays NaN
        k0, k1, k2 = a0 / d, a1 / d, a2 / d
        t = np.float64(tau[k])
        cs, sn = np.cos(t), np.sin(t)
        w = 1.0 - cs
        r00, r01, r02 = cs + w * k0 * k0, w * k0 * k1 - sn * k2, w * k0 * k2 + sn * k1
        r10, r11, r12 = w * k1 * k0 + sn * k2, cs + w * k1 * k1, w * k1 * k2 - sn * k0
        r20, r21, r22 = w * k2 * k0 - sn * k1, w * k2 * k1 + sn * k0, cs + w * k2 * k2
        t0 = xv0 - (r00 * xv0 + r01 * xv1 + r02 * xv2)
        t1 = xv1 - (r10 * xv0 + r11 * xv1 + r12 * xv2)
        t2 = xv2 - (r20 * xv0 + r21 * xv1 + r22 * xv2)
        ck = c[k]
        p = parent[k]
        if p < 0:
            ck[0], ck[1], ck[2], ck[3], ck[4], ck[5] = r00, r01, r02, r10, r11, r12
            ck[6], ck[7], ck[8], ck[9], ck[10], ck[11] = r20, r21, r22, t0, t1, t2
        else:  # parent o this: R_p R, R_p t + t_p
            cp = c[p]
            for i in range(3):
                p0, p1, p2 = cp[3 * i], cp[3 * i + 1], cp[3 * i + 2]
                ck[3 * i] = p0 * r00 + p1 * r10 + p2 * r20
                ck[3 * i + 1] = p0 * r01 + p1 * r11 + p2 * r21
                ck[3 * i + 2] = p0 * r02 + p1 * r12 + p2 * r22
                ck[9 + i] = p0 * t0 + p1 * t1 + p2 * t2 + cp[9 + i]
    for i in range(x.shape[0]):
        r = atom_rotor[i]
        if r < 0:
            out[i, 0], out[i, 1], out[i, 2] = x[i, 0], x[i, 1], x[i, 2]
        else:
            m = c[r]
            y0, y1, y2 = np.float64(x[i, 0]), np.float64(x[i, 1]), np.float64(x[i, 2])
            out[i, 0] = m[0] * y0 + m[1] * y1 + m[2] * y2 + m[9]
            out[i, 1] = m[3] * y0 + m[4] * y1 + m[5] * y2 + m[10]
            out[i, 2] = m[6] * y0 + m[7] * y1 + m[8] * y2 + m[11]


@njit(cache=True, error_model="numpy")
def _serial(x, tau, u, v, order, parent, atom_rotor, eps, out):
    c = np.empty((order.shape[0], 12))
    for b in range(x.shape[0]):
        _sample(x[b], tau[b], u, v, order, parent, atom_rotor, eps, c, out[b])


@njit(cache=True, parallel=True, error_model="numpy")
def _parallel(x, tau, u, v, order, parent, atom_rotor, eps, out):
    for b in prange(x.shape[0]):
        c = np.empty((order.shape[0], 12))
        _sample(x[b], tau[b], u, v, order, parent, atom_rotor, eps, c, out[b])


def turn(
    x: np.ndarray,
    tau: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
    order: np.ndarray,
    parent: np.ndarray,
    atom_rotor: np.ndarray,
    eps: float,
) -> np.ndarray:
    """``(B, T, 3)`` coordinates with every bond's moving side turned (see the module docstring)."""
    out = np.empty_like(x)
    run = _serial if x.shape[0] * x.shape[1] < SERIAL_WORK else _parallel
    run(x, tau, u, v, order, parent, atom_rotor, eps, out)
    return out
