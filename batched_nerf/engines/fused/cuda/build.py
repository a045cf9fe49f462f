"""Triton kernel of the fused build (GPU backend of ``method="fused"``).

One launch builds every sample: each lane is one ``(component, sample)`` pair and
walks that component's rows of the fused plan (`batched_nerf.engines.fused.rows`: the
array the CPU kernels read, as an ``int32`` device copy, `rows.device_rows`), keeping each
row's position and out-frame in a batch-innermost scratch (``(N, 3, B)`` and
``(N, 9, B)``, by row), so that consecutive lanes read consecutive memory. Row by row it follows the frame
convention of ``docs/conventions.md`` (`frame_tree`): a placement frame
``M_j`` from the parent's out-frame, a seed's anchor or the reference positions,
the effective dihedral with its sibling offsets, ``x_j = x_b + r_j M_j u`` and
``O_j = M_j L(theta_j, phi_j)`` (``L`` of `scan.path.local_rotations`).

``TRITON_INTERPRET=1`` runs the kernel on CPU tensors (the tests do).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...._geometry import EPS, nan_negative_bonds, pose_atoms
from ...gpu_policy import launch
from .. import rows as R
from .rows import DeviceRows, device_rows

try:  # optional: the CUDA builds of torch ship Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

__all__ = [
    "BLOCK",
    "NUM_WARPS",
    "READS_TRIG",
    "build",
    "build_vjp",
    "triton_build",
    "triton_vjp",
]

#: Warps per program, and lanes per program: one lane per thread. One warp per program spreads
#: few lanes over the most SMs (4,096 lanes: 128 programs on an H100's 132 SMs); residency is
#: bound by registers (~124 a thread here), not by the 32 programs an SM may hold.
NUM_WARPS = 1
BLOCK = 32 * NUM_WARPS
#: Accumulation dtypes of the scratch (frames, positions): float64 unless asked (``accumulate_dtype``).
ACCUMULATE = (torch.float64, torch.float32)


if triton is not None:
    # the plan's fields and the row code they are measured from (`rows`), as kernel constants
    _ATOM = tl.constexpr(R.ATOM)
    _CODE = tl.constexpr(R.CODE)
    _REF_B = tl.constexpr(R.REF_B)
    _REF_A = tl.constexpr(R.REF_A)
    _REF_D = tl.constexpr(R.REF_D)
    _PARENT = tl.constexpr(R.PARENT)
    _PHI_FROM = tl.constexpr(R.PHI_FROM)
    _FLIP_ON = tl.constexpr(R.FLIP_ON)
    _SLOT = tl.constexpr(R.SLOT)
    _SIGN = tl.constexpr(R.SIGN)
    _THIRD = tl.constexpr(R.THIRD)
    _ANCHOR = tl.constexpr(R.ANCHOR)

    @triton.jit
    def _safe_norm(x, y, z):
        sq = x * x + y * y + z * z
        # sqrt(NaN) stays NaN; only an exact zero is replaced
        return tl.where(sq == 0.0, 0.0, tl.sqrt(tl.where(sq == 0.0, 1.0, sq)))

    @triton.jit
    def _unit(x, y, z, eps):
        inv = 1.0 / tl.maximum(_safe_norm(x, y, z), eps)
        return x * inv, y * inv, z * inv

    @triton.jit
    def _ld(ptr, row, width, lane, live):
        return tl.load(ptr + row * width + lane, mask=live, other=0.0)

    @triton.jit
    def _row(rows, n_rows, k):
        """Row ``k`` of the plan: atom, mode, bond/angle/dihedral reference rows, parent row,
        sibling row, flip atom, fixed slot, anchor sign.

        The mode is the row code with the third seed split off ``ANCHOR`` (its dihedral is 0):
        fixed 0, root 1, second seed 2, third seed 3, anchored 4, from the parent's out-frame 5,
        from the reference positions 6.
        """
        code = tl.load(rows + _CODE * n_rows + k)
        third = tl.load(rows + _THIRD * n_rows + k)
        mode = tl.where(third != 0, 3, tl.where(code >= _ANCHOR, code + 1, code))
        return (
            tl.load(rows + _ATOM * n_rows + k),
            mode,
            tl.load(rows + _REF_B * n_rows + k),
            tl.load(rows + _REF_A * n_rows + k),
            tl.load(rows + _REF_D * n_rows + k),
            tl.load(rows + _PARENT * n_rows + k),
            tl.load(rows + _PHI_FROM * n_rows + k),
            tl.load(rows + _FLIP_ON * n_rows + k),
            tl.load(rows + _SLOT * n_rows + k),
            tl.load(rows + _SIGN * n_rows + k),
        )

    @triton.jit
    def _refs(pos, j, b, a, d, batch, sample, mask):
        """Positions of the bond, angle and dihedral references (row ``j`` itself where one is missing)."""
        bb = tl.where(b >= 0, b, j)
        aa = tl.where(a >= 0, a, j)
        dd = tl.where(d >= 0, d, j)
        return (
            _ld(pos, 3 * bb, batch, sample, mask),
            _ld(pos, 3 * bb + 1, batch, sample, mask),
            _ld(pos, 3 * bb + 2, batch, sample, mask),
            _ld(pos, 3 * aa, batch, sample, mask),
            _ld(pos, 3 * aa + 1, batch, sample, mask),
            _ld(pos, 3 * aa + 2, batch, sample, mask),
            _ld(pos, 3 * dd, batch, sample, mask),
            _ld(pos, 3 * dd + 1, batch, sample, mask),
            _ld(pos, 3 * dd + 2, batch, sample, mask),
        )

    @triton.jit
    def _nerf(xb0, xb1, xb2, xa0, xa1, xa2, xd0, xd1, xd2, eps):
        """NeRF frame of positions: ``e1 = unit(xb - xa)``, ``e3 = unit((xa - xd) x e1)``, ``e2 = e3 x e1``.

        Also returns the intermediates the backward needs: ``v = xb - xa``, ``|v|``,
        ``w = xa - xd``, ``c = w x e1`` and ``|c|``.
        """
        v0, v1, v2 = xb0 - xa0, xb1 - xa1, xb2 - xa2
        nv = _safe_norm(v0, v1, v2)
        e10, e11, e12 = _unit(v0, v1, v2, eps)
        w0, w1, w2 = xa0 - xd0, xa1 - xd1, xa2 - xd2
        c0, c1, c2 = w1 * e12 - w2 * e11, w2 * e10 - w0 * e12, w0 * e11 - w1 * e10
        nc = _safe_norm(c0, c1, c2)
        e30, e31, e32 = _unit(c0, c1, c2, eps)
        e20, e21, e22 = e31 * e12 - e32 * e11, e32 * e10 - e30 * e12, e30 * e11 - e31 * e10
        return (e10, e11, e12, e20, e21, e22, e30, e31, e32, v0, v1, v2, nv, w0, w1, w2, c0, c1, c2, nc)

    @triton.jit
    def _placement(frames, par, md, sgn, e10, e11, e12, e20, e21, e22, e30, e31, e32, batch, sample, mask):
        """Placement frame ``M`` (row-major): the parent's out-frame, the anchor ``diag(s, 1, s)`` or NeRF."""
        pp = tl.maximum(par, 0)
        use = mask & (md == 5)
        p0 = tl.load(frames + (9 * pp + 0) * batch + sample, mask=use, other=0.0)
        p1 = tl.load(frames + (9 * pp + 1) * batch + sample, mask=use, other=0.0)
        p2 = tl.load(frames + (9 * pp + 2) * batch + sample, mask=use, other=0.0)
        p3 = tl.load(frames + (9 * pp + 3) * batch + sample, mask=use, other=0.0)
        p4 = tl.load(frames + (9 * pp + 4) * batch + sample, mask=use, other=0.0)
        p5 = tl.load(frames + (9 * pp + 5) * batch + sample, mask=use, other=0.0)
        p6 = tl.load(frames + (9 * pp + 6) * batch + sample, mask=use, other=0.0)
        p7 = tl.load(frames + (9 * pp + 7) * batch + sample, mask=use, other=0.0)
        p8 = tl.load(frames + (9 * pp + 8) * batch + sample, mask=use, other=0.0)
        anchor = (md == 3) | (md == 4)
        return (
            tl.where(md == 5, p0, tl.where(anchor, sgn, e10)),
            tl.where(md == 5, p1, tl.where(anchor, 0.0, e20)),
            tl.where(md == 5, p2, tl.where(anchor, 0.0, e30)),
            tl.where(md == 5, p3, tl.where(anchor, 0.0, e11)),
            tl.where(md == 5, p4, tl.where(anchor, 1.0, e21)),
            tl.where(md == 5, p5, tl.where(anchor, 0.0, e31)),
            tl.where(md == 5, p6, tl.where(anchor, 0.0, e12)),
            tl.where(md == 5, p7, tl.where(anchor, 0.0, e22)),
            tl.where(md == 5, p8, tl.where(anchor, sgn, e32)),
        )

    @triton.jit
    def _local(theta, phi):
        """``cos, sin`` of both angles, ``g = sign(sin theta)`` and ``L(theta, phi)`` (row-major).

        Columns of ``L``: ``u = (-c, s cp, s sp)``, ``-g (s, c cp, c sp)``, ``g (0, -sp, cp)``.
        """
        c = tl.cos(theta)
        s = tl.sin(theta)
        cp = tl.cos(phi)
        sp = tl.sin(phi)
        g = tl.where(s < 0.0, -1.0, 1.0)
        return (
            c,
            s,
            cp,
            sp,
            g,
            -c,
            -g * s,
            0.0 * c,
            s * cp,
            -g * c * cp,
            -g * sp,
            s * sp,
            -g * c * sp,
            g * cp,
        )

    @triton.jit
    def _lanes(unit_start, unit_len, n_units, batch, BLOCK: tl.constexpr):
        """This program's lanes, one per (unit, sample): each lane's sample, its unit's first row and
        length (0 for a lane past the last unit)."""
        lane = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live_lane = lane < n_units * batch
        unit = tl.where(live_lane, lane // batch, 0)
        length = tl.where(live_lane, tl.load(unit_len + unit), 0)
        return lane % batch, tl.load(unit_start + unit), length

    @triton.jit
    def _build_kernel(
        rows, unit_start, unit_len, bonds, angles, dihedrals, fixed, pos, frames, phis,
        n_rows, n_units, batch, max_len, eps, BLOCK: tl.constexpr,
    ):  # fmt: skip
        sample, start, length = _lanes(unit_start, unit_len, n_units, batch, BLOCK)
        pi = 3.141592653589793
        for step in range(0, max_len):
            live = step < length
            k = tl.where(live, start + step, 0)
            j, md, b, a, d, par, phi_from, flip_on, slot, sgn = _row(rows, n_rows, k)
            sgn = sgn.to(bonds.dtype.element_ty)
            # inputs and outputs by atom (j), scratch by row (k)
            r = tl.load(bonds + j * batch + sample, mask=live, other=0.0)
            theta = tl.load(angles + j * batch + sample, mask=live, other=0.0)
            phi = tl.load(dihedrals + j * batch + sample, mask=live, other=0.0)
            # effective dihedral: sibling offsets, a half turn per negative sine
            phi += tl.load(
                phis + tl.maximum(phi_from, 0) * batch + sample, mask=live & (phi_from >= 0), other=0.0
            )
            t_flip = tl.load(
                angles + tl.maximum(flip_on, 0) * batch + sample, mask=live & (flip_on >= 0), other=1.0
            )
            phi += tl.where((flip_on >= 0) & (tl.sin(t_flip) < 0.0), pi, 0.0)
            phi = tl.where(md == 3, 0.0, phi)
            xb0, xb1, xb2, xa0, xa1, xa2, xd0, xd1, xd2 = _refs(pos, k, b, a, d, batch, sample, live)
            (e10, e11, e12, e20, e21, e22, e30, e31, e32, _, _, _, _, _, _, _, _, _, _, _) = _nerf(
                xb0, xb1, xb2, xa0, xa1, xa2, xd0, xd1, xd2, eps
            )
            m00, m01, m02, m10, m11, m12, m20, m21, m22 = _placement(
                frames, par, md, sgn, e10, e11, e12, e20, e21, e22, e30, e31, e32, batch, sample, live
            )
            c, s, cp, sp, g, l00, l01, l02, l10, l11, l12, l20, l21, l22 = _local(theta, phi)
            # x = xb + r M u
            x0 = xb0 + r * (m00 * l00 + m01 * l10 + m02 * l20)
            x1 = xb1 + r * (m10 * l00 + m11 * l10 + m12 * l20)
            x2 = xb2 + r * (m20 * l00 + m21 * l10 + m22 * l20)
            # seeds and fixed atoms
            f0 = tl.load(fixed + (3 * tl.maximum(slot, 0)) * batch + sample, mask=live & (md == 0), other=0.0)
            f1 = tl.load(
                fixed + (3 * tl.maximum(slot, 0) + 1) * batch + sample, mask=live & (md == 0), other=0.0
            )
            f2 = tl.load(
                fixed + (3 * tl.maximum(slot, 0) + 2) * batch + sample, mask=live & (md == 0), other=0.0
            )
            x0 = tl.where(md == 0, f0, tl.where(md == 1, 0.0, tl.where(md == 2, r, x0)))
            x1 = tl.where(md == 0, f1, tl.where(md <= 2, 0.0, x1))
            x2 = tl.where(md == 0, f2, tl.where(md <= 2, 0.0, x2))
            tl.store(pos + (3 * k) * batch + sample, x0, mask=live)
            tl.store(pos + (3 * k + 1) * batch + sample, x1, mask=live)
            tl.store(pos + (3 * k + 2) * batch + sample, x2, mask=live)
            tl.store(phis + k * batch + sample, phi, mask=live)
            # out-frame O = M L (row-major)
            keep = live & (md >= 3)
            tl.store(frames + (9 * k + 0) * batch + sample, m00 * l00 + m01 * l10 + m02 * l20, mask=keep)
            tl.store(frames + (9 * k + 1) * batch + sample, m00 * l01 + m01 * l11 + m02 * l21, mask=keep)
            tl.store(frames + (9 * k + 2) * batch + sample, m00 * l02 + m01 * l12 + m02 * l22, mask=keep)
            tl.store(frames + (9 * k + 3) * batch + sample, m10 * l00 + m11 * l10 + m12 * l20, mask=keep)
            tl.store(frames + (9 * k + 4) * batch + sample, m10 * l01 + m11 * l11 + m12 * l21, mask=keep)
            tl.store(frames + (9 * k + 5) * batch + sample, m10 * l02 + m11 * l12 + m12 * l22, mask=keep)
            tl.store(frames + (9 * k + 6) * batch + sample, m20 * l00 + m21 * l10 + m22 * l20, mask=keep)
            tl.store(frames + (9 * k + 7) * batch + sample, m20 * l01 + m21 * l11 + m22 * l21, mask=keep)
            tl.store(frames + (9 * k + 8) * batch + sample, m20 * l02 + m21 * l12 + m22 * l22, mask=keep)

    @triton.jit
    def _unit_vjp(v0, v1, v2, e0, e1, e2, n, g0, g1, g2, eps):
        """Gradient of ``e = v / max(|v|, eps)``: ``(g - e (e . g)) / |v|``, or ``g / eps`` below ``eps``."""
        big = n > eps
        den = tl.where(big, n, eps)
        dot = tl.where(big, e0 * g0 + e1 * g1 + e2 * g2, 0.0)
        return (g0 - e0 * dot) / den, (g1 - e1 * dot) / den, (g2 - e2 * dot) / den

    @triton.jit
    def _acc(ptr, row, batch, sample, g, live):
        at = ptr + row * batch + sample
        tl.store(at, tl.load(at, mask=live, other=0.0) + g, mask=live)

    @triton.jit
    def _acc3(ptr, row, batch, sample, g0, g1, g2, live):
        at = ptr + (3 * row) * batch + sample
        tl.store(at, tl.load(at, mask=live, other=0.0) + g0, mask=live)
        tl.store(at + batch, tl.load(at + batch, mask=live, other=0.0) + g1, mask=live)
        tl.store(at + 2 * batch, tl.load(at + 2 * batch, mask=live, other=0.0) + g2, mask=live)

    @triton.jit
    def _vjp_kernel(
        rows, unit_start, unit_len, bonds, angles, pos, frames, phis, gpos, gframes, gphis,
        g_bonds, g_angles, g_dihedrals, g_fixed, n_rows, n_units, batch, max_len, eps, BLOCK: tl.constexpr,
    ):  # fmt: skip
        sample, start, length = _lanes(unit_start, unit_len, n_units, batch, BLOCK)
        for step in range(0, max_len):
            back = max_len - 1 - step
            live = back < length
            k = tl.where(live, start + back, 0)
            j, md, b, a, d, par, phi_from, _, slot, sgn = _row(rows, n_rows, k)
            sgn = sgn.to(bonds.dtype.element_ty)
            # inputs and gradients by atom (j), scratch and its adjoints by row (k)
            r = tl.load(bonds + j * batch + sample, mask=live, other=0.0)
            theta = tl.load(angles + j * batch + sample, mask=live, other=0.0)
            phi = tl.load(phis + k * batch + sample, mask=live, other=0.0)
            gx0 = _ld(gpos, 3 * k, batch, sample, live)
            gx1 = _ld(gpos, 3 * k + 1, batch, sample, live)
            gx2 = _ld(gpos, 3 * k + 2, batch, sample, live)
            placed = live & (md >= 3)
            # fixed atoms and seeds
            fslot = tl.maximum(slot, 0)
            tl.store(g_fixed + (3 * fslot) * batch + sample, gx0, mask=live & (md == 0))
            tl.store(g_fixed + (3 * fslot + 1) * batch + sample, gx1, mask=live & (md == 0))
            tl.store(g_fixed + (3 * fslot + 2) * batch + sample, gx2, mask=live & (md == 0))
            # recompute the placement frame
            bb = tl.where(b >= 0, b, k)
            aa = tl.where(a >= 0, a, k)
            dd = tl.where(d >= 0, d, k)
            xb0, xb1, xb2, xa0, xa1, xa2, xd0, xd1, xd2 = _refs(pos, k, b, a, d, batch, sample, placed)
            (e10, e11, e12, e20, e21, e22, e30, e31, e32, v0, v1, v2, nv, w0, w1, w2, c0, c1, c2, nc) = _nerf(
                xb0, xb1, xb2, xa0, xa1, xa2, xd0, xd1, xd2, eps
            )
            m00, m01, m02, m10, m11, m12, m20, m21, m22 = _placement(
                frames, par, md, sgn, e10, e11, e12, e20, e21, e22, e30, e31, e32, batch, sample, placed
            )
            c, s, cp, sp, g, l00, l01, l02, l10, l11, l12, l20, l21, l22 = _local(theta, phi)
            # adjoints of the out-frame O = M L (zero where no row reads it)
            q00 = _ld(gframes, 9 * k + 0, batch, sample, placed)
            q01 = _ld(gframes, 9 * k + 1, batch, sample, placed)
            q02 = _ld(gframes, 9 * k + 2, batch, sample, placed)
            q10 = _ld(gframes, 9 * k + 3, batch, sample, placed)
            q11 = _ld(gframes, 9 * k + 4, batch, sample, placed)
            q12 = _ld(gframes, 9 * k + 5, batch, sample, placed)
            q20 = _ld(gframes, 9 * k + 6, batch, sample, placed)
            q21 = _ld(gframes, 9 * k + 7, batch, sample, placed)
            q22 = _ld(gframes, 9 * k + 8, batch, sample, placed)
            # x = xb + r M u, u = L[:, 0]
            mu0 = m00 * l00 + m01 * l10 + m02 * l20
            mu1 = m10 * l00 + m11 * l10 + m12 * l20
            mu2 = m20 * l00 + m21 * l10 + m22 * l20
            g_r = tl.where(md == 2, gx0, tl.where(md >= 3, gx0 * mu0 + gx1 * mu1 + gx2 * mu2, 0.0))
            # gM = r gx u^T + gO L^T
            rg0, rg1, rg2 = r * gx0, r * gx1, r * gx2
            gm00 = rg0 * l00 + q00 * l00 + q01 * l01 + q02 * l02
            gm01 = rg0 * l10 + q00 * l10 + q01 * l11 + q02 * l12
            gm02 = rg0 * l20 + q00 * l20 + q01 * l21 + q02 * l22
            gm10 = rg1 * l00 + q10 * l00 + q11 * l01 + q12 * l02
            gm11 = rg1 * l10 + q10 * l10 + q11 * l11 + q12 * l12
            gm12 = rg1 * l20 + q10 * l20 + q11 * l21 + q12 * l22
            gm20 = rg2 * l00 + q20 * l00 + q21 * l01 + q22 * l02
            gm21 = rg2 * l10 + q20 * l10 + q21 * l11 + q22 * l12
            gm22 = rg2 * l20 + q20 * l20 + q21 * l21 + q22 * l22
            # gL = M^T (r gx e0^T + gO)
            h00 = rg0 + q00
            h10 = rg1 + q10
            h20 = rg2 + q20
            gl00 = m00 * h00 + m10 * h10 + m20 * h20
            gl10 = m01 * h00 + m11 * h10 + m21 * h20
            gl20 = m02 * h00 + m12 * h10 + m22 * h20
            gl01 = m00 * q01 + m10 * q11 + m20 * q21
            gl11 = m01 * q01 + m11 * q11 + m21 * q21
            gl21 = m02 * q01 + m12 * q11 + m22 * q21
            gl12 = m01 * q02 + m11 * q12 + m21 * q22
            gl22 = m02 * q02 + m12 * q12 + m22 * q22
            # dL/dtheta and dL/dphi
            g_t = (
                gl00 * s + gl10 * c * cp + gl20 * c * sp
                - gl01 * g * c + gl11 * g * s * cp + gl21 * g * s * sp
            )  # fmt: skip
            g_p = (
                -gl10 * s * sp + gl20 * s * cp + gl11 * g * c * sp - gl21 * g * c * cp
                - gl12 * g * cp - gl22 * g * sp
            )  # fmt: skip
            g_p += _ld(gphis, k, batch, sample, placed)
            g_p = tl.where(md >= 4, g_p, 0.0)
            tl.store(g_bonds + j * batch + sample, g_r, mask=live)
            tl.store(g_angles + j * batch + sample, tl.where(md >= 3, g_t, 0.0), mask=live)
            tl.store(g_dihedrals + j * batch + sample, g_p, mask=live)
            _acc(gphis, tl.maximum(phi_from, 0), batch, sample, g_p, live & (phi_from >= 0))
            # the frame: parent out-frame, or positions
            for_par = live & (md == 5)
            pp = tl.maximum(par, 0)
            _acc(gframes, 9 * pp + 0, batch, sample, gm00, for_par)
            _acc(gframes, 9 * pp + 1, batch, sample, gm01, for_par)
            _acc(gframes, 9 * pp + 2, batch, sample, gm02, for_par)
            _acc(gframes, 9 * pp + 3, batch, sample, gm10, for_par)
            _acc(gframes, 9 * pp + 4, batch, sample, gm11, for_par)
            _acc(gframes, 9 * pp + 5, batch, sample, gm12, for_par)
            _acc(gframes, 9 * pp + 6, batch, sample, gm20, for_par)
            _acc(gframes, 9 * pp + 7, batch, sample, gm21, for_par)
            _acc(gframes, 9 * pp + 8, batch, sample, gm22, for_par)
            # positions frame: columns e1 = gm[:, 0], e2 = gm[:, 1], e3 = gm[:, 2]
            ge10, ge11, ge12 = gm00, gm10, gm20
            ge20, ge21, ge22 = gm01, gm11, gm21
            ge30, ge31, ge32 = gm02, gm12, gm22
            # e2 = e3 x e1: ge3 += e1 x ge2, ge1 += ge2 x e3
            ge30 += e11 * ge22 - e12 * ge21
            ge31 += e12 * ge20 - e10 * ge22
            ge32 += e10 * ge21 - e11 * ge20
            ge10 += ge21 * e32 - ge22 * e31
            ge11 += ge22 * e30 - ge20 * e32
            ge12 += ge20 * e31 - ge21 * e30
            gc0, gc1, gc2 = _unit_vjp(c0, c1, c2, e30, e31, e32, nc, ge30, ge31, ge32, eps)
            # c = w x e1: gw = e1 x gc, ge1 += gc x w
            gw0, gw1, gw2 = e11 * gc2 - e12 * gc1, e12 * gc0 - e10 * gc2, e10 * gc1 - e11 * gc0
            ge10 += gc1 * w2 - gc2 * w1
            ge11 += gc2 * w0 - gc0 * w2
            ge12 += gc0 * w1 - gc1 * w0
            gv0, gv1, gv2 = _unit_vjp(v0, v1, v2, e10, e11, e12, nv, ge10, ge11, ge12, eps)
            use_pos = live & (md == 6)
            gv0 = tl.where(md == 6, gv0, 0.0)
            gv1 = tl.where(md == 6, gv1, 0.0)
            gv2 = tl.where(md == 6, gv2, 0.0)
            _acc3(gpos, bb, batch, sample, gx0 + gv0, gx1 + gv1, gx2 + gv2, placed)
            _acc3(gpos, aa, batch, sample, gw0 - gv0, gw1 - gv1, gw2 - gv2, use_pos)
            _acc3(gpos, dd, batch, sample, -gw0, -gw1, -gw2, use_pos)


def triton_build(
    plan: DeviceRows,
    bonds: Tensor,
    angles: Tensor,
    dihedrals: Tensor,
    fixed_xyz: Tensor | None,
    return_saved: bool = False,
    accumulate: torch.dtype = torch.float64,
) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """``(B, N, 3)`` positions from ``(B, N)`` internal coordinates (radians), no autograd.

    ``plan``: the fused plan's `DeviceRows` on the inputs' device. ``fixed_xyz`` is
    ``(B, F, 3)`` or None. Frames and positions are computed in ``accumulate`` (float64
    by default, or float32: see `ACCUMULATE`); the result has the inputs' dtype.

    Raises:
        ImportError: triton is not installed.
        ValueError: ``accumulate`` is not float32 or float64.
        KernelError: the kernel failed to compile or to launch.
    """
    if triton is None:
        raise ImportError("the Triton backend needs triton (shipped with the CUDA builds of torch)")
    if accumulate not in ACCUMULATE:
        raise ValueError(f"the Triton kernels accumulate in float64 or float32, got {accumulate}")
    batch, n = bonds.shape
    # frames and positions accumulate in float64 unless asked otherwise (float32 in, float32 out)
    dtype, device = accumulate, bonds.device
    cols = [t.detach().to(dtype).t().contiguous() for t in (bonds, angles, dihedrals)]
    fixed = (
        fixed_xyz.detach().to(dtype).reshape(batch, -1).t().contiguous()
        if fixed_xyz is not None and fixed_xyz.shape[-2]
        else torch.zeros(3, batch, dtype=dtype, device=device)
    )
    pos = torch.zeros(3 * n, batch, dtype=dtype, device=device)  # by row
    frames = torch.zeros(9 * n, batch, dtype=dtype, device=device)
    phis = torch.zeros(n, batch, dtype=dtype, device=device)
    lanes = plan.n_units * batch
    if lanes and plan.max_len:
        launch(
            "_build_kernel", _build_kernel, (triton.cdiv(lanes, BLOCK),),
            plan.rows, plan.run_start, plan.run_len, *cols, fixed, pos, frames, phis,
            n, plan.n_units, batch, plan.max_len, EPS, BLOCK=BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip
    by_row = pos.reshape(n, 3, batch).permute(2, 0, 1)
    xyz = by_row.index_select(1, plan.row_of_atom).to(bonds.dtype)
    return (xyz, (pos, frames, phis)) if return_saved else xyz


def triton_vjp(
    plan: DeviceRows,
    saved: tuple[Tensor, Tensor, Tensor],
    bonds: Tensor,
    angles: Tensor,
    grad_xyz: Tensor,
    n_fixed: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients ``(g_bonds, g_angles, g_dihedrals)`` ``(B, N)`` and ``g_fixed`` ``(B, F, 3)`` (or None).

    ``saved`` is the scratch ``(pos, frames, phis)`` of `triton_build` with
    ``return_saved=True`` (its dtype is the accumulation dtype); one reverse walk per
    lane, no atomics.

    Raises:
        KernelError: the kernel failed to compile or to launch.
    """
    pos, frames, phis = saved
    batch, n = bonds.shape
    dtype, device = pos.dtype, pos.device
    cols = [t.detach().to(dtype).t().contiguous() for t in (bonds, angles)]
    by_row = grad_xyz.detach().to(dtype).index_select(1, plan.atom_of_row)  # the scratch's adjoint: by row
    gpos = by_row.permute(1, 2, 0).reshape(3 * n, batch).contiguous()
    gframes = torch.zeros_like(frames)
    gphis = torch.zeros_like(phis)
    grads = [torch.zeros(n, batch, dtype=dtype, device=device) for _ in range(3)]
    g_fixed = torch.zeros(3 * max(n_fixed, 1), batch, dtype=dtype, device=device)
    lanes = plan.n_units * batch
    if lanes and plan.max_len:
        launch(
            "_vjp_kernel", _vjp_kernel, (triton.cdiv(lanes, BLOCK),),
            plan.rows, plan.run_start, plan.run_len, *cols, pos, frames, phis, gpos, gframes, gphis,
            *grads, g_fixed, n, plan.n_units, batch, plan.max_len, EPS, BLOCK=BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip
    out = bonds.dtype
    gb, ga, gd = (t.t().to(out) for t in grads)
    gf = g_fixed.reshape(-1, 3, batch).permute(2, 0, 1)[:, :n_fixed].to(out) if n_fixed else None
    return gb, ga, gd, gf


# ------------------------------------------------------------------ the fused engine's entry points
#: The kernels take the angles and dihedrals themselves (their cosines and sines inside): a kept
#: trig array (``trig_rows`` of `build` and `build_vjp`) is not read.
READS_TRIG = False


def build(
    plan: Any,
    bonds: Tensor,
    angles: Tensor,
    dihedrals: Tensor,
    fixed: Tensor,
    rot: Tensor | None,
    tr: Tensor | None,
    trig_rows: Any = None,
) -> Tensor:
    """``(B, N, 3)`` positions from ``(B, N)`` bonds, angles, dihedrals and ``(B, F, 3)`` fixed positions
    (``F`` may be 0) on the fused plan ``plan`` (`batched_nerf.engines.fused.build.FusedPlan`; its
    ``accumulate`` dtype), each seeded component then moved by its pose (``rot`` ``(B, S, 3, 3)``,
    ``tr`` ``(B, S, 3)``; None: no pose; `_geometry.pose_atoms`, NaN for an improper rotation) and
    a negative bond's atom NaN. The same signature as every backend's ``build`` (``trig_rows``:
    unused, `READS_TRIG`).

    Raises:
        KernelError: the kernel failed to compile or to launch.
    """
    rows = device_rows(plan, bonds.device)
    x = triton_build(rows, nan_negative_bonds(bonds), angles, dihedrals, fixed, accumulate=plan.accumulate)
    return x if rot is None or tr is None else pose_atoms(x, rot, tr, rows.seed_slot)  # type: ignore[arg-type]


def build_vjp(
    plan: Any,
    bonds: Tensor,
    angles: Tensor,
    dihedrals: Tensor,
    fixed: Tensor,
    rot: Tensor | None,
    tr: Tensor | None,
    grad_xyz: Tensor,
    trig_rows: Any = None,
) -> tuple[Tensor | None, ...]:
    """Gradients of ``sum(grad_xyz * build(...))`` (arguments as `build`'s): ``(g_bonds, g_angles,
    g_dihedrals)`` ``(B, N)``, ``g_fixed`` ``(B, F, 3)``, ``g_rot``, ``g_tr`` (None without a pose).
    One forward walk (the scratch it saves), the pose's vjp in torch where there is one, one reverse
    walk; a negative bond's own gradient is zero (as through ``torch.where``). The same signature as
    every backend's ``build_vjp``.

    Raises:
        KernelError: a kernel failed to compile or to launch.
    """
    rows = device_rows(plan, bonds.device)
    b = nan_negative_bonds(bonds)
    y, saved = triton_build(rows, b, angles, dihedrals, fixed, return_saved=True, accumulate=plan.accumulate)  # type: ignore[misc]
    g_rot = g_tr = None
    if rot is not None and tr is not None:  # x = R y + t per component: the pose's vjp first
        _, pull = torch.func.vjp(lambda y_, r, t: pose_atoms(y_, r, t, rows.seed_slot), y, rot, tr)
        grad_xyz, g_rot, g_tr = pull(grad_xyz)
    gb, ga, gd, gf = triton_vjp(rows, saved, b, angles, grad_xyz, fixed.shape[-2])
    gf = (gf if gf is not None else fixed.new_zeros(fixed.shape)).to(bonds.dtype)
    return torch.where(bonds < 0, 0.0, gb), ga, gd, gf, g_rot, g_tr
