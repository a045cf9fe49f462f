"""Rigid turns of rotatable bonds' moving sides (numba): `bn.update_torsions`'s kernel.

Each bond ``k`` turns the atoms of its moving side by ``tau_k`` about the axis ``x_u - x_v``
through ``x_v`` (right-handed, Rodrigues: ``R = I + sin(tau) [k]_x + (1 - cos(tau)) [k]_x^2``, the
identity for a zero axis); nested sides compose, the inner turn first, both about
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

from .samples import affine_adjoint
from .threads import serial_bound

__all__ = ["turn", "turn_vjp"]

#: Below this many atom-samples a call runs on the calling thread (`WORKQUEUE_SERIAL_WORK` on numba's
#: ``workqueue``, `threads.serial_bound`).
SERIAL_WORK = 4096
WORKQUEUE_SERIAL_WORK = 8 * SERIAL_WORK


@njit(inline="always")
def _local(x, tau, u, v, k, eps, loc):
    """Bond ``k``'s own turn into ``loc`` ``(16,)``: ``R`` row-major, ``t = x_v - R x_v``, the unit axis
    and ``|x_u - x_v|`` (float64)."""
    xv0, xv1, xv2 = np.float64(x[v[k], 0]), np.float64(x[v[k], 1]), np.float64(x[v[k], 2])
    a0, a1, a2 = x[u[k], 0] - xv0, x[u[k], 1] - xv1, x[u[k], 2] - xv2
    n = np.sqrt(a0 * a0 + a1 * a1 + a2 * a2)
    d = eps if n < eps else n  # a NaN norm stays NaN
    k0, k1, k2 = a0 / d, a1 / d, a2 / d
    t = np.float64(tau[k])
    cs, sn = np.cos(t), np.sin(t)
    w = 1.0 - cs
    q = k0 * k0 + k1 * k1 + k2 * k2  # 1, or below it for an axis shorter than eps (0: no turn)
    loc[0], loc[1], loc[2] = 1.0 + w * (k0 * k0 - q), w * k0 * k1 - sn * k2, w * k0 * k2 + sn * k1
    loc[3], loc[4], loc[5] = w * k1 * k0 + sn * k2, 1.0 + w * (k1 * k1 - q), w * k1 * k2 - sn * k0
    loc[6], loc[7], loc[8] = w * k2 * k0 - sn * k1, w * k2 * k1 + sn * k0, 1.0 + w * (k2 * k2 - q)
    for i in range(3):
        loc[9 + i] = (xv0, xv1, xv2)[i] - (loc[3 * i] * xv0 + loc[3 * i + 1] * xv1 + loc[3 * i + 2] * xv2)
    loc[12], loc[13], loc[14], loc[15] = k0, k1, k2, n


@njit(inline="always")
def _compose(x, tau, u, v, order, parent, eps, c, loc):
    """Every bond's own turn (``loc[k]``) and its composed transform (``c[k]``: ``R_p R``,
    ``R_p t + t_p``)."""
    for q in range(order.shape[0]):
        k = order[q]
        lk, ck = loc[k], c[k]
        _local(x, tau, u, v, k, eps, lk)
        p = parent[k]
        if p < 0:
            for i in range(12):
                ck[i] = lk[i]
        else:
            cp = c[p]
            for i in range(3):
                p0, p1, p2 = cp[3 * i], cp[3 * i + 1], cp[3 * i + 2]
                for j in range(3):
                    ck[3 * i + j] = p0 * lk[j] + p1 * lk[3 + j] + p2 * lk[6 + j]
                ck[9 + i] = p0 * lk[9] + p1 * lk[10] + p2 * lk[11] + cp[9 + i]


@njit(inline="always")
def _sample(x, tau, u, v, order, parent, atom_rotor, eps, c, loc, out):
    """One sample: the bonds' composed transforms, then the atoms."""
    _compose(x, tau, u, v, order, parent, eps, c, loc)
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


@njit(inline="always")
def _sample_vjp(x, tau, g, u, v, order, parent, atom_rotor, eps, c, loc, gc, gx, gt):
    """One sample's gradients of ``sum(g * turned)``: ``gx`` ``(T, 3)`` and ``gt`` ``(R,)``.

    Reverse of `_sample`: the atoms give each composed transform's adjoint (``gc[r] += (g x^T,
    g)``) and ``gx = A^T g``; the bonds, inner first, pass ``gc`` to the parent (``dA_p += dA R^T +
    db t^T``, ``db_p += db``) and to their own turn (``dR = A_p^T dA``, ``dt = A_p^T db``); ``t = x_v - R
    x_v`` and ``R = c I + s [k]_x + (1 - c) k k^T`` give ``tau``'s gradient and the axis's, which
    flows through ``k = a / max(|a|, eps)``, ``a = x_u - x_v``."""
    _compose(x, tau, u, v, order, parent, eps, c, loc)
    for k in range(gc.shape[0]):
        for i in range(12):
            gc[k, i] = 0.0
    for i in range(x.shape[0]):
        r = atom_rotor[i]
        g0, g1, g2 = np.float64(g[i, 0]), np.float64(g[i, 1]), np.float64(g[i, 2])
        if r < 0:
            gx[i, 0], gx[i, 1], gx[i, 2] = g0, g1, g2
            continue
        y0, y1, y2 = np.float64(x[i, 0]), np.float64(x[i, 1]), np.float64(x[i, 2])
        gx[i, 0], gx[i, 1], gx[i, 2] = affine_adjoint(c[r], gc[r], g0, g1, g2, y0, y1, y2)
    dr = np.empty(9)
    for qq in range(order.shape[0] - 1, -1, -1):  # inner bonds first
        k = order[qq]
        lk, dk = loc[k], gc[k]
        p = parent[k]
        if p < 0:
            for i in range(9):
                dr[i] = dk[i]
            dt0, dt1, dt2 = dk[9], dk[10], dk[11]
        else:
            cp, dp = c[p], gc[p]
            for i in range(3):
                for j in range(3):  # dA_p += dA R^T + db t^T
                    dp[3 * i + j] += (
                        dk[3 * i] * lk[3 * j] + dk[3 * i + 1] * lk[3 * j + 1] + dk[3 * i + 2] * lk[3 * j + 2]
                        + dk[9 + i] * lk[9 + j]
                    )  # fmt: skip
                dp[9 + i] += dk[9 + i]
            for i in range(3):
                for j in range(3):  # dR = A_p^T dA
                    dr[3 * i + j] = cp[i] * dk[j] + cp[3 + i] * dk[3 + j] + cp[6 + i] * dk[6 + j]
            dt0 = cp[0] * dk[9] + cp[3] * dk[10] + cp[6] * dk[11]
            dt1 = cp[1] * dk[9] + cp[4] * dk[10] + cp[7] * dk[11]
            dt2 = cp[2] * dk[9] + cp[5] * dk[10] + cp[8] * dk[11]
        xv0, xv1, xv2 = np.float64(x[v[k], 0]), np.float64(x[v[k], 1]), np.float64(x[v[k], 2])
        # t = x_v - R x_v: dx_v += dt - R^T dt, dR -= dt x_v^T
        gx[v[k], 0] += dt0 - (lk[0] * dt0 + lk[3] * dt1 + lk[6] * dt2)
        gx[v[k], 1] += dt1 - (lk[1] * dt0 + lk[4] * dt1 + lk[7] * dt2)
        gx[v[k], 2] += dt2 - (lk[2] * dt0 + lk[5] * dt1 + lk[8] * dt2)
        dts = (dt0, dt1, dt2)
        xvs = (xv0, xv1, xv2)
        for i in range(3):
            for j in range(3):
                dr[3 * i + j] -= dts[i] * xvs[j]
        # R = I + s [k]_x + w (k k^T - |k|^2 I)
        k0, k1, k2, n = lk[12], lk[13], lk[14], lk[15]
        t = np.float64(tau[k])
        cs, sn = np.cos(t), np.sin(t)
        w = 1.0 - cs
        kk = (k0, k1, k2)
        trace = dr[0] + dr[4] + dr[8]
        kap0, kap1, kap2 = dr[7] - dr[5], dr[2] - dr[6], dr[3] - dr[1]  # dR . [k]_x = k . kappa
        kdk = 0.0
        for i in range(3):
            for j in range(3):
                kdk += dr[3 * i + j] * kk[i] * kk[j]
        q = k0 * k0 + k1 * k1 + k2 * k2
        gt[k] = -sn * q * trace + cs * (k0 * kap0 + k1 * kap1 + k2 * kap2) + sn * kdk
        s0 = (dr[0] + dr[0]) * k0 + (dr[1] + dr[3]) * k1 + (dr[2] + dr[6]) * k2
        s1 = (dr[3] + dr[1]) * k0 + (dr[4] + dr[4]) * k1 + (dr[5] + dr[7]) * k2
        s2 = (dr[6] + dr[2]) * k0 + (dr[7] + dr[5]) * k1 + (dr[8] + dr[8]) * k2
        s0, s1, s2 = s0 - 2.0 * k0 * trace, s1 - 2.0 * k1 * trace, s2 - 2.0 * k2 * trace  # the -|k|^2 I
        dk0, dk1, dk2 = sn * kap0 + w * s0, sn * kap1 + w * s1, sn * kap2 + w * s2
        if n > eps:  # k = a / |a|
            dot = k0 * dk0 + k1 * dk1 + k2 * dk2
            da0, da1, da2 = (dk0 - k0 * dot) / n, (dk1 - k1 * dot) / n, (dk2 - k2 * dot) / n
        else:  # k = a / eps
            da0, da1, da2 = dk0 / eps, dk1 / eps, dk2 / eps
        gx[u[k], 0] += da0
        gx[u[k], 1] += da1
        gx[u[k], 2] += da2
        gx[v[k], 0] -= da0
        gx[v[k], 1] -= da1
        gx[v[k], 2] -= da2


@njit(cache=True, error_model="numpy")
def _serial(x, tau, u, v, order, parent, atom_rotor, eps, out):
    c, loc = np.empty((order.shape[0], 12)), np.empty((order.shape[0], 16))
    for b in range(x.shape[0]):
        _sample(x[b], tau[b], u, v, order, parent, atom_rotor, eps, c, loc, out[b])


@njit(cache=True, parallel=True, error_model="numpy")
def _parallel(x, tau, u, v, order, parent, atom_rotor, eps, out):
    for b in prange(x.shape[0]):
        c, loc = np.empty((order.shape[0], 12)), np.empty((order.shape[0], 16))
        _sample(x[b], tau[b], u, v, order, parent, atom_rotor, eps, c, loc, out[b])


@njit(cache=True, error_model="numpy")
def _serial_vjp(x, tau, g, u, v, order, parent, atom_rotor, eps, gx, gt):
    r = order.shape[0]
    c, loc, gc = np.empty((r, 12)), np.empty((r, 16)), np.empty((r, 12))
    for b in range(x.shape[0]):
        _sample_vjp(x[b], tau[b], g[b], u, v, order, parent, atom_rotor, eps, c, loc, gc, gx[b], gt[b])


@njit(cache=True, parallel=True, error_model="numpy")
def _parallel_vjp(x, tau, g, u, v, order, parent, atom_rotor, eps, gx, gt):
    r = order.shape[0]
    for b in prange(x.shape[0]):
        c, loc, gc = np.empty((r, 12)), np.empty((r, 16)), np.empty((r, 12))
        _sample_vjp(x[b], tau[b], g[b], u, v, order, parent, atom_rotor, eps, c, loc, gc, gx[b], gt[b])


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
    serial = x.shape[0] * x.shape[1] < serial_bound(SERIAL_WORK, WORKQUEUE_SERIAL_WORK)
    run = _serial if serial else _parallel
    run(x, tau, u, v, order, parent, atom_rotor, eps, out)
    return out


def turn_vjp(
    x: np.ndarray,
    tau: np.ndarray,
    g: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
    order: np.ndarray,
    parent: np.ndarray,
    atom_rotor: np.ndarray,
    eps: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of ``sum(g * turn(x, tau, ...))``: float64 ``(B, T, 3)`` of ``x``, ``(B, R)`` of ``tau``."""
    gx, gt = np.empty(x.shape), np.empty(tau.shape)
    serial = x.shape[0] * x.shape[1] < serial_bound(SERIAL_WORK, WORKQUEUE_SERIAL_WORK)
    run = _serial_vjp if serial else _parallel_vjp
    run(x, tau, g, u, v, order, parent, atom_rotor, eps, gx, gt)
    return gx, gt
