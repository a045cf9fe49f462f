"""Triton kernels of the inverse map (GPU backend of the fused ``to_internal``).

Two kernels over ``(sample, atom)`` pairs, ``BLOCK`` pairs per program:

* `triton_internal`: gathers each atom's three references and writes its
  bond length and the two ``atan2`` arguments of its angle and dihedral (the
  ``atan2`` itself, which Triton has only through CUDA's libdevice, runs as one
  torch op afterwards, so the kernels also run in Triton's interpreter);
* `triton_internal_vjp`: the vector-Jacobian product, each row's 12 coordinate
  derivatives written out and accumulated into its four atoms with atomic adds.

The formulas are those of `batched_nerf._geometry` (``distance``, ``angle``,
``dihedral``), singular cases included: a zero-length vector has norm ``0`` and
zero norm gradient, ``atan2(0, 0)`` reads ``0`` with derivative ``1`` in ``y`` and
``0`` in ``x``, and NaN coordinates give NaN in every value that reads them.
Shapes: ``xyz`` ``(B, N, 3)`` contiguous, values ``(B, N)``; ``refs`` ``(N, 3)``
int32 with ``-1`` replaced by the atom itself and ``has`` ``(N, 3)`` bool masks
(the `InversePlan` fields).

The fused engine's entries, `internal` and `internal_vjp`, take the inverse plan and tensors, with
the same signature as the CPU backend's (`cpu.inverse`).

``TRITON_INTERPRET=1`` runs both kernels on CPU tensors (the tests do).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ...gpu_policy import launch

try:  # optional: the CUDA builds of torch ship Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

__all__ = ["BLOCK", "NUM_WARPS", "internal", "internal_vjp", "triton_internal", "triton_internal_vjp"]

#: Warps per program and ``(sample, atom)`` pairs per program: one pair per thread.
NUM_WARPS = 4
BLOCK = 32 * NUM_WARPS


if triton is not None:

    @triton.jit
    def _cross(ax, ay, az, bx, by, bz):
        return ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx

    @triton.jit
    def _norm(x, y, z):
        sq = x * x + y * y + z * z
        # sqrt(NaN) stays NaN; only an exact zero is replaced (zero gradient there)
        return tl.where(sq == 0.0, 0.0, tl.sqrt(tl.where(sq == 0.0, 1.0, sq)))

    @triton.jit
    def _load3(ptr, row):
        return tl.load(ptr + row * 3), tl.load(ptr + row * 3 + 1), tl.load(ptr + row * 3 + 2)

    @triton.jit
    def _forward_kernel(xyz, refs, has, out, total, n_atoms, BLOCK: tl.constexpr):
        pair = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = pair < total
        pair = tl.where(live, pair, 0)
        atom = pair % n_atoms
        base = pair - atom  # first row of this sample
        rb = tl.load(refs + atom * 3)
        ra = tl.load(refs + atom * 3 + 1)
        rd = tl.load(refs + atom * 3 + 2)
        xi0, xi1, xi2 = _load3(xyz, pair)
        xb0, xb1, xb2 = _load3(xyz, base + rb)
        xa0, xa1, xa2 = _load3(xyz, base + ra)
        xd0, xd1, xd2 = _load3(xyz, base + rd)
        # bond |x_i - x_b|
        bond = _norm(xi0 - xb0, xi1 - xb1, xi2 - xb2)
        # angle x_i-x_b-x_a: atan2(|u x v|, u . v)
        u0, u1, u2 = xi0 - xb0, xi1 - xb1, xi2 - xb2
        v0, v1, v2 = xa0 - xb0, xa1 - xb1, xa2 - xb2
        w0, w1, w2 = _cross(u0, u1, u2, v0, v1, v2)
        s_angle = _norm(w0, w1, w2)
        c_angle = u0 * v0 + u1 * v1 + u2 * v2
        # dihedral (x_d, x_a, x_b, x_i): b0 = a - d, b1 = b - a, b2 = i - b
        p0, p1, p2 = xa0 - xd0, xa1 - xd1, xa2 - xd2
        q0, q1, q2 = xb0 - xa0, xb1 - xa1, xb2 - xa2
        t0, t1, t2 = xi0 - xb0, xi1 - xb1, xi2 - xb2
        n0, n1, n2 = _cross(q0, q1, q2, t0, t1, t2)
        m0, m1, m2 = _cross(p0, p1, p2, q0, q1, q2)
        y_dih = _norm(q0, q1, q2) * (p0 * n0 + p1 * n1 + p2 * n2)
        x_dih = m0 * n0 + m1 * n1 + m2 * n2
        hb = tl.load(has + atom * 3) != 0
        o = out + pair * 5
        tl.store(o, tl.where(hb, bond, 0.0), mask=live)
        tl.store(o + 1, s_angle, mask=live)
        tl.store(o + 2, c_angle, mask=live)
        tl.store(o + 3, y_dih, mask=live)
        tl.store(o + 4, x_dih, mask=live)

    @triton.jit
    def _atan2_grads(y, x, g):
        """``(d/dy, d/dx) atan2(y, x) * g``, with ``(g, 0)`` at ``(0, 0)`` (the safe atan2)."""
        singular = (x == 0.0) & (y == 0.0)
        den = tl.where(singular, 1.0, x * x + y * y)
        gy = tl.where(singular, g, g * x / den)
        gx = tl.where(singular, 0.0, -g * y / den)
        return gy, gx

    @triton.jit
    def _add3(ptr, row, g0, g1, g2, live):
        tl.atomic_add(ptr + row * 3, g0, mask=live)
        tl.atomic_add(ptr + row * 3 + 1, g1, mask=live)
        tl.atomic_add(ptr + row * 3 + 2, g2, mask=live)

    @triton.jit
    def _vjp_kernel(xyz, refs, has, g_bond, g_angle, g_dih, gxyz, total, n_atoms, BLOCK: tl.constexpr):
        pair = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = pair < total
        pair = tl.where(live, pair, 0)
        atom = pair % n_atoms
        base = pair - atom
        rb = tl.load(refs + atom * 3)
        ra = tl.load(refs + atom * 3 + 1)
        rd = tl.load(refs + atom * 3 + 2)
        zero = tl.zeros_like(tl.load(xyz + pair * 3))
        gb = tl.where(tl.load(has + atom * 3) != 0, tl.load(g_bond + pair), zero)
        ga = tl.where(tl.load(has + atom * 3 + 1) != 0, tl.load(g_angle + pair), zero)
        gd = tl.where(tl.load(has + atom * 3 + 2) != 0, tl.load(g_dih + pair), zero)
        xi0, xi1, xi2 = _load3(xyz, pair)
        xb0, xb1, xb2 = _load3(xyz, base + rb)
        xa0, xa1, xa2 = _load3(xyz, base + ra)
        xd0, xd1, xd2 = _load3(xyz, base + rd)

        # bond: g * (x_i - x_b) / |x_i - x_b| (zero at coincidence)
        u0, u1, u2 = xi0 - xb0, xi1 - xb1, xi2 - xb2
        nu = _norm(u0, u1, u2)
        kb = tl.where(nu == 0.0, 0.0, gb / tl.where(nu == 0.0, 1.0, nu))
        gi0, gi1, gi2 = kb * u0, kb * u1, kb * u2
        gb0, gb1, gb2 = -kb * u0, -kb * u1, -kb * u2

        # angle atan2(s, c), s = |u x v|, c = u . v
        v0, v1, v2 = xa0 - xb0, xa1 - xb1, xa2 - xb2
        w0, w1, w2 = _cross(u0, u1, u2, v0, v1, v2)
        s = _norm(w0, w1, w2)
        c = u0 * v0 + u1 * v1 + u2 * v2
        gs, gc = _atan2_grads(s, c, ga)
        ks = tl.where(s == 0.0, 0.0, gs / tl.where(s == 0.0, 1.0, s))
        gw0, gw1, gw2 = ks * w0, ks * w1, ks * w2
        # d(u x v): grad_u = v x gw, grad_v = gw x u; d(u . v): grad_u = v, grad_v = u
        cu0, cu1, cu2 = _cross(v0, v1, v2, gw0, gw1, gw2)
        cv0, cv1, cv2 = _cross(gw0, gw1, gw2, u0, u1, u2)
        gu0, gu1, gu2 = cu0 + gc * v0, cu1 + gc * v1, cu2 + gc * v2
        gv0, gv1, gv2 = cv0 + gc * u0, cv1 + gc * u1, cv2 + gc * u2
        gi0, gi1, gi2 = gi0 + gu0, gi1 + gu1, gi2 + gu2
        ga0, ga1, ga2 = gv0, gv1, gv2
        gb0, gb1, gb2 = gb0 - gu0 - gv0, gb1 - gu1 - gv1, gb2 - gu2 - gv2

        # dihedral atan2(y, x): y = |q| p . n, x = m . n, n = q x t, m = p x q
        p0, p1, p2 = xa0 - xd0, xa1 - xd1, xa2 - xd2
        q0, q1, q2 = xb0 - xa0, xb1 - xa1, xb2 - xa2
        t0, t1, t2 = u0, u1, u2
        n0, n1, n2 = _cross(q0, q1, q2, t0, t1, t2)
        m0, m1, m2 = _cross(p0, p1, p2, q0, q1, q2)
        nq = _norm(q0, q1, q2)
        pn = p0 * n0 + p1 * n1 + p2 * n2
        gy, gx = _atan2_grads(nq * pn, m0 * n0 + m1 * n1 + m2 * n2, gd)
        kq = tl.where(nq == 0.0, 0.0, gy * pn / tl.where(nq == 0.0, 1.0, nq))
        gp0, gp1, gp2 = gy * nq * n0, gy * nq * n1, gy * nq * n2
        gn0, gn1, gn2 = gy * nq * p0 + gx * m0, gy * nq * p1 + gx * m1, gy * nq * p2 + gx * m2
        gm0, gm1, gm2 = gx * n0, gx * n1, gx * n2
        gq0, gq1, gq2 = kq * q0, kq * q1, kq * q2
        # m = p x q
        a0, a1, a2 = _cross(q0, q1, q2, gm0, gm1, gm2)
        gp0, gp1, gp2 = gp0 + a0, gp1 + a1, gp2 + a2
        a0, a1, a2 = _cross(gm0, gm1, gm2, p0, p1, p2)
        gq0, gq1, gq2 = gq0 + a0, gq1 + a1, gq2 + a2
        # n = q x t
        a0, a1, a2 = _cross(t0, t1, t2, gn0, gn1, gn2)
        gq0, gq1, gq2 = gq0 + a0, gq1 + a1, gq2 + a2
        gt0, gt1, gt2 = _cross(gn0, gn1, gn2, q0, q1, q2)
        # p = a - d, q = b - a, t = i - b
        gi0, gi1, gi2 = gi0 + gt0, gi1 + gt1, gi2 + gt2
        gb0, gb1, gb2 = gb0 + gq0 - gt0, gb1 + gq1 - gt1, gb2 + gq2 - gt2
        ga0, ga1, ga2 = ga0 + gp0 - gq0, ga1 + gp1 - gq1, ga2 + gp2 - gq2

        _add3(gxyz, pair, gi0, gi1, gi2, live)
        _add3(gxyz, base + rb, gb0, gb1, gb2, live)
        _add3(gxyz, base + ra, ga0, ga1, ga2, live)
        _add3(gxyz, base + rd, -gp0, -gp1, -gp2, live)


def _check_available() -> None:
    if triton is None:
        raise ImportError("the Triton backend needs triton (shipped with the CUDA builds of torch)")


def _safe_atan2(y: Tensor, x: Tensor) -> Tensor:
    singular = (x == 0) & (y == 0)
    return torch.atan2(y, torch.where(singular, torch.ones_like(x), x))


def triton_internal(refs: Tensor, has: Tensor, xyz: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Bonds, angles and dihedrals ``(B, N)`` each from ``xyz`` ``(B, N, 3)`` (no autograd).

    Args:
        refs: ``(N, 3)`` integer references with ``-1`` replaced by the atom itself.
        has: ``(N, 3)`` bool: the row has a bond / angle / dihedral reference.
        xyz: ``(B, N, 3)`` positions, float32 or float64, on the kernels' device.
    """
    _check_available()
    xyz = xyz.detach().contiguous()
    batch, n = xyz.shape[0], xyz.shape[1]
    out = xyz.new_empty(batch, n, 5)
    total = batch * n
    if total:
        grid = (triton.cdiv(total, BLOCK),)
        launch(
            "_forward_kernel",
            _forward_kernel,
            grid,
            xyz,
            refs.to(torch.int32).contiguous(),
            has.to(torch.int8).contiguous(),
            out,
            total,
            n,
            BLOCK=BLOCK,
            num_warps=NUM_WARPS,
        )
    bonds, s, c, y, x = out.unbind(-1)
    zero = xyz.new_zeros(())
    angles = torch.where(has[:, 1], _safe_atan2(s, c), zero)
    phi = _safe_atan2(y, x)
    dihedrals = torch.where(has[:, 2], torch.where(phi <= -math.pi, phi + 2 * math.pi, phi), zero)
    return bonds, angles, dihedrals


def triton_internal_vjp(
    refs: Tensor, has: Tensor, xyz: Tensor, g_bonds: Tensor, g_angles: Tensor, g_dihedrals: Tensor
) -> Tensor:
    """``(B, N, 3)`` gradient of ``sum(g_bonds * bonds + g_angles * angles + g_dihedrals * dihedrals)``.

    Arguments as `triton_internal`; the cotangents are ``(B, N)`` each.
    """
    _check_available()
    xyz = xyz.detach().contiguous()
    batch, n = xyz.shape[0], xyz.shape[1]
    grads = [g.detach().to(xyz.dtype).expand(batch, n).contiguous() for g in (g_bonds, g_angles, g_dihedrals)]
    gxyz = torch.zeros_like(xyz)
    total = batch * n
    if total:
        grid = (triton.cdiv(total, BLOCK),)
        launch(
            "_vjp_kernel",
            _vjp_kernel,
            grid,
            xyz,
            refs.to(torch.int32).contiguous(),
            has.to(torch.int8).contiguous(),
            *grads,
            gxyz,
            total,
            n,
            BLOCK=BLOCK,
            num_warps=NUM_WARPS,
        )
    return gxyz


# ------------------------------------------------------------------ the fused engine's entry points
def _has(plan: Any) -> Tensor:
    return torch.stack([plan.has_bond, plan.has_angle, plan.has_dihedral], -1)


def internal(plan: Any, xyz: Tensor, scratch: Any = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(B, N)`` bonds, angles and dihedrals of ``xyz`` ``(B, N, 3)`` on the inverse plan ``plan``
    (`batched_nerf.engines.inverse.InversePlan`, on ``xyz``'s device): `triton_internal`. The same
    signature as every backend's ``internal`` (``scratch``: unused, the kernel keeps none).

    Raises:
        KernelError: the kernel failed to compile or to launch.
    """
    return triton_internal(plan.refs, _has(plan), xyz)


def internal_vjp(plan: Any, xyz: Tensor, g_bonds: Tensor, g_angles: Tensor, g_dihedrals: Tensor) -> Tensor:
    """``(B, N, 3)`` gradient of ``sum(g_bonds * bonds + g_angles * angles + g_dihedrals * dihedrals)``:
    `triton_internal_vjp`. The same signature as every backend's ``internal_vjp``.

    Raises:
        KernelError: the kernel failed to compile or to launch.
    """
    return triton_internal_vjp(plan.refs, _has(plan), xyz, g_bonds, g_angles, g_dihedrals)
