"""Numba kernels of the fused inverse map (imported only when numba is installed).

One row ``i`` with references ``(b, a, d)`` reads four atoms and gives:

```text
bond     = |x_i - x_b|
angle    = atan2(|u x v|, u . v),              u = x_i - x_b, v = x_a - x_b
dihedral = atan2(|b1| b0 . n2, n1 . n2),       b0 = x_a - x_d, b1 = x_b - x_a, b2 = x_i - x_b,
                                               n1 = b0 x b1, n2 = b1 x b2
```

exactly the operations of `batched_nerf._geometry` (``safe_norm``: ``0`` with
zero derivatives at a zero vector, NaN for NaN; ``safe_atan2``: ``atan2(0, 1)`` at
``(0, 0)``; ``(-pi, pi]`` wrap), so values and derivatives agree with the torch
engine also at singular geometry. Three kernels, all in float64 internally and
writing the caller's dtype:

* `forward`: the bonds and the ``atan2`` arguments of the angles and
  dihedrals, parallel over every (sample, atom) (the caller takes the ``atan2``);
* `vjp`: ``J^T g``, the reverse-mode adjoint of each row, scatter-added into
  its four atoms;
* `second`: the backward of `vjp`: for a cotangent ``V`` of ``J^T g``,
  ``sum_k g_k H_k V`` (cotangent of the coordinates) and ``J V`` (cotangent of
  ``g``). The adjoint code is run on dual numbers with tangent ``V``
  (forward-over-reverse), so it is the exact derivative of the adjoint, branch
  for branch.

Calls of fewer than `PARALLEL_ROWS` rows run on one thread. Scatters never
race: with at least as many samples as threads a thread owns whole samples (atoms
in sequence); with fewer, the rows' contributions are computed in parallel into a
buffer and summed per sample afterwards. From `BLOCK_MIN` samples on (and
enough blocks for the threads), the vjp and second-order kernels run blocked,
samples innermost (`inverse_blocks`, vectorised across
samples), once compiled or cached (`tiers`). The per-row
formulas both layouts share are in `inverse_rows`.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch
from numba import njit, prange
from torch import Tensor

from ..arrays import numpy_view
from . import inverse_blocks as blocks
from . import tiers
from .inverse_rows import (
    _ZERO3,
    INLINED,
    _add,
    _angle_grad,
    _angle_hvp,
    _axpy,
    _bond_grad,
    _bond_hvp,
    _dihedral_grad,
    _dihedral_hvp,
    _neg,
    _scale,
)
from .trig import angles

# the forward's loop inlines its formulas (compiled separately, each call would stay a call)
_angle_args, _dihedral_args, _norm, _sub = (
    INLINED[k] for k in ("_angle_args", "_dihedral_args", "_norm", "_sub")
)

__all__ = ["angles", "forward", "internal", "internal_vjp", "plan_arrays", "second", "vjp"]

jit = numba.njit(cache=True)
#: a row's accumulation, inlined into its sample loop (called, the 15 arguments of a call per row cost
#: 2.5x in the second order)
_inline = numba.njit(inline="always")
pjit = numba.njit(parallel=True, cache=True)


@jit
def _load(x, s, j):  # type: ignore[no-untyped-def]
    # np.float64, not float(): numba's float() of a float32 stays float32
    return (np.float64(x[s, j, 0]), np.float64(x[s, j, 1]), np.float64(x[s, j, 2]))


# --------------------------------------------------------------------------
# Per-row work shared by the kernels
# --------------------------------------------------------------------------


@jit
def _row_vjp(xyz, s, i, refs, hb, ha, hd, gb, ga, gd):  # type: ignore[no-untyped-def]
    """Contributions of row ``i`` of sample ``s`` to ``J^T g`` at atoms ``(i, b, a, d)``."""
    ci, cb, ca, cd = _ZERO3, _ZERO3, _ZERO3, _ZERO3
    if not hb[i]:
        return ci, cb, ca, cd
    xi = _load(xyz, s, i)
    xb = _load(xyz, s, refs[i, 0])
    g = _bond_grad(xi, xb)
    w = np.float64(gb[s, i])
    ci = _scale(g, w)
    cb = _scale(g, -w)
    if not ha[i]:
        return ci, cb, ca, cd
    xa = _load(xyz, s, refs[i, 1])
    w = np.float64(ga[s, i])
    g0, g1, g2 = _angle_grad(xi, xb, xa)
    ci = _axpy(w, g0, ci)
    cb = _axpy(w, g1, cb)
    ca = _scale(g2, w)
    if not hd[i]:
        return ci, cb, ca, cd
    xd = _load(xyz, s, refs[i, 2])
    w = np.float64(gd[s, i])
    h0, h1, h2, h3 = _dihedral_grad(xd, xa, xb, xi)
    cd = _scale(h0, w)
    ca = _axpy(w, h1, ca)
    cb = _axpy(w, h2, cb)
    ci = _axpy(w, h3, ci)
    return ci, cb, ca, cd


@jit
def _row_second(xyz, v, s, i, refs, hb, ha, hd, gb, ga, gd):  # type: ignore[no-untyped-def]
    """Row ``i`` of sample ``s``: contributions of ``sum_k g_k H_k V`` at ``(i, b, a, d)`` and ``J V``."""
    ci, cb, ca, cd = _ZERO3, _ZERO3, _ZERO3, _ZERO3
    jb, ja, jd = 0.0, 0.0, 0.0
    if not hb[i]:
        return ci, cb, ca, cd, jb, ja, jd
    xi, ti = _load(xyz, s, i), _load(v, s, i)
    xb, tb = _load(xyz, s, refs[i, 0]), _load(v, s, refs[i, 0])
    ci, jb = _bond_hvp(xi, xb, ti, tb, np.float64(gb[s, i]))
    cb = _neg(ci)
    if not ha[i]:
        return ci, cb, ca, cd, jb, ja, jd
    xa, ta = _load(xyz, s, refs[i, 1]), _load(v, s, refs[i, 1])
    gu, gv, ja = _angle_hvp(xi, xb, xa, ti, tb, ta, np.float64(ga[s, i]))
    ci = _add(ci, gu)
    cb = _sub(cb, _add(gu, gv))
    ca = gv
    if not hd[i]:
        return ci, cb, ca, cd, jb, ja, jd
    xd, td = _load(xyz, s, refs[i, 2]), _load(v, s, refs[i, 2])
    t0, t1, t2, jd = _dihedral_hvp(xi, xb, xa, xd, ti, tb, ta, td, np.float64(gd[s, i]))
    cd = _neg(t0)
    ca = _add(ca, _sub(t0, t1))
    cb = _add(cb, _sub(t1, t2))
    ci = _add(ci, t2)
    return ci, cb, ca, cd, jb, ja, jd


@_inline
def _vjp_into(buf, xyz, s, i, refs, hb, ha, hd, gb, ga, gd):  # type: ignore[no-untyped-def]
    """Row ``i`` of sample ``s`` added into its atoms' adjoints ``buf`` ``(N, 3)``, contribution by
    contribution in the order of the blocked kernel (`inverse_blocks`): the same bits."""
    if not hb[i]:
        return
    rb = refs[i, 0]
    xi, xb = _load(xyz, s, i), _load(xyz, s, rb)
    c = _scale(_bond_grad(xi, xb), np.float64(gb[s, i]))
    _acc(buf, i, c)
    _acc(buf, rb, _neg(c))
    if not ha[i]:
        return
    ra = refs[i, 1]
    xa = _load(xyz, s, ra)
    gi, _, gv = _angle_grad(xi, xb, xa)
    w = np.float64(ga[s, i])
    cu, cv = _scale(gi, w), _scale(gv, w)
    _acc(buf, i, cu)
    _acc(buf, rb, _neg(cu))
    _acc(buf, rb, _neg(cv))
    _acc(buf, ra, cv)
    if not hd[i]:
        return
    rd = refs[i, 2]
    h0, h1, h2, h3 = _dihedral_grad(_load(xyz, s, rd), xa, xb, xi)
    w = np.float64(gd[s, i])
    _acc(buf, rd, _scale(h0, w))
    _acc(buf, ra, _scale(h1, w))
    _acc(buf, rb, _scale(h2, w))
    _acc(buf, i, _scale(h3, w))


@_inline
def _second_into(buf, xyz, v, s, i, refs, hb, ha, hd, gb, ga, gd, jb, ja, jd):  # type: ignore[no-untyped-def]
    """Row ``i`` of sample ``s``: ``sum_k g_k H_k V`` added into ``buf`` in the blocked kernel's order
    (`inverse_blocks`), ``J V`` written to ``jb, ja, jd``."""
    if not hb[i]:
        return
    rb = refs[i, 0]
    xi, ti = _load(xyz, s, i), _load(v, s, i)
    xb, tb = _load(xyz, s, rb), _load(v, s, rb)
    c, jv = _bond_hvp(xi, xb, ti, tb, np.float64(gb[s, i]))
    jb[s, i] = jv
    _acc(buf, i, c)
    _acc(buf, rb, _neg(c))
    if not ha[i]:
        return
    ra = refs[i, 1]
    xa, ta = _load(xyz, s, ra), _load(v, s, ra)
    gu, gv, jv = _angle_hvp(xi, xb, xa, ti, tb, ta, np.float64(ga[s, i]))
    ja[s, i] = jv
    _acc(buf, i, gu)
    _acc(buf, rb, _neg(gu))
    _acc(buf, rb, _neg(gv))
    _acc(buf, ra, gv)
    if not hd[i]:
        return
    rd = refs[i, 2]
    xd, td = _load(xyz, s, rd), _load(v, s, rd)
    t0, t1, t2, jv = _dihedral_hvp(xi, xb, xa, xd, ti, tb, ta, td, np.float64(gd[s, i]))
    jd[s, i] = jv
    _acc(buf, rd, _neg(t0))
    _acc(buf, ra, _sub(t0, t1))
    _acc(buf, rb, _sub(t1, t2))
    _acc(buf, i, t2)


@_inline
def _acc(buf, j, c):  # type: ignore[no-untyped-def]
    buf[j, 0] += c[0]
    buf[j, 1] += c[1]
    buf[j, 2] += c[2]


@jit
def _put(out, s, j, c):  # type: ignore[no-untyped-def]
    out[s, j, 0] = c[0]
    out[s, j, 1] = c[1]
    out[s, j, 2] = c[2]


@jit
def _scatter_sample(out, s, buf):  # type: ignore[no-untyped-def]
    for j in range(buf.shape[0]):
        _put(out, s, j, (buf[j, 0], buf[j, 1], buf[j, 2]))


@jit
def _store_row(rows, s, i, ci, cb, ca, cd):  # type: ignore[no-untyped-def]
    for k in range(3):
        rows[s, i, 0, k] = ci[k]
        rows[s, i, 1, k] = cb[k]
        rows[s, i, 2, k] = ca[k]
        rows[s, i, 3, k] = cd[k]


# --------------------------------------------------------------------------
# Kernels: serial loops over a range of rows or samples, and parallel drivers
# --------------------------------------------------------------------------

#: Below this many rows (samples x atoms) a call runs on one thread: a parallel
#: launch costs more than it saves (and much more on a loaded machine).
PARALLEL_ROWS = 4096


def _chunks() -> int:
    return 4 * numba.get_num_threads()


@njit(cache=True, error_model="numpy")
def _forward_block(xyz, refs, hb, ha, hd, bonds, args, s0, s1, i0, i1):  # type: ignore[no-untyped-def]
    """Rows ``i0 <= i < i1`` of samples ``s0 <= s < s1`` (atoms innermost: no index division per row,
    measured 1.6x faster than one loop over flattened (sample, atom) rows)."""
    for s in range(s0, s1):
        for i in range(i0, i1):
            r, ya, xa_, yd, xd_ = 0.0, 0.0, 1.0, 0.0, 1.0  # rows without an angle / dihedral: atan2(0, 1) = 0
            if hb[i]:
                xi = _load(xyz, s, i)
                xb = _load(xyz, s, refs[i, 0])
                r = _norm(_sub(xi, xb))
                if ha[i]:
                    xa = _load(xyz, s, refs[i, 1])
                    ya, xa_ = _angle_args(xi, xb, xa)
                    if hd[i]:
                        yd, xd_ = _dihedral_args(_load(xyz, s, refs[i, 2]), xa, xb, xi)
            bonds[s, i] = r
            args[0, s, i] = ya
            args[1, s, i] = yd
            args[2, s, i] = xa_
            args[3, s, i] = xd_


@pjit
def _forward_par(xyz, refs, hb, ha, hd, bonds, args, n_chunks):  # type: ignore[no-untyped-def]
    """``n_chunks`` ranges of whole samples, or with fewer samples than chunks ranges of atoms
    (``n_chunks // B`` per sample)."""
    b, n = xyz.shape[0], xyz.shape[1]
    if b >= n_chunks:
        for c in prange(n_chunks):
            s0, s1 = b * c // n_chunks, b * (c + 1) // n_chunks
            _forward_block(xyz, refs, hb, ha, hd, bonds, args, s0, s1, 0, n)
    else:
        per = n_chunks // b
        for k in prange(b * per):
            s, c = k // per, k % per
            _forward_block(xyz, refs, hb, ha, hd, bonds, args, s, s + 1, n * c // per, n * (c + 1) // per)


@njit(cache=True, error_model="numpy")
def _vjp_samples(xyz, refs, hb, ha, hd, gb, ga, gd, out, s0, s1):  # type: ignore[no-untyped-def]
    n = xyz.shape[1]
    buf = np.zeros((n, 3))
    for s in range(s0, s1):
        buf[:] = 0.0
        for i in range(n):
            _vjp_into(buf, xyz, s, i, refs, hb, ha, hd, gb, ga, gd)
        _scatter_sample(out, s, buf)


@pjit
def _vjp_by_sample(xyz, refs, hb, ha, hd, gb, ga, gd, out, n_chunks):  # type: ignore[no-untyped-def]
    b = xyz.shape[0]
    for c in prange(n_chunks):
        _vjp_samples(xyz, refs, hb, ha, hd, gb, ga, gd, out, b * c // n_chunks, b * (c + 1) // n_chunks)


@pjit
def _vjp_rows(xyz, refs, hb, ha, hd, gb, ga, gd, rows):  # type: ignore[no-untyped-def]
    n_samples, n = xyz.shape[0], xyz.shape[1]
    for k in prange(n_samples * n):
        s = k // n
        i = k - s * n
        ci, cb, ca, cd = _row_vjp(xyz, s, i, refs, hb, ha, hd, gb, ga, gd)
        _store_row(rows, s, i, ci, cb, ca, cd)


@njit(cache=True, error_model="numpy")  # every division of the formulas has its own guard
def _second_samples(xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, s0, s1):  # type: ignore[no-untyped-def]
    n = xyz.shape[1]
    buf = np.zeros((n, 3))
    jb[s0:s1] = 0.0
    ja[s0:s1] = 0.0
    jd[s0:s1] = 0.0
    for s in range(s0, s1):
        buf[:] = 0.0
        for i in range(n):
            _second_into(buf, xyz, v, s, i, refs, hb, ha, hd, gb, ga, gd, jb, ja, jd)
        _scatter_sample(out, s, buf)


@pjit
def _second_by_sample(xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, n_chunks):  # type: ignore[no-untyped-def]
    b = xyz.shape[0]
    for c in prange(n_chunks):
        s0, s1 = b * c // n_chunks, b * (c + 1) // n_chunks
        _second_samples(xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd, s0, s1)


@pjit
def _second_rows(xyz, v, refs, hb, ha, hd, gb, ga, gd, rows, jb, ja, jd):  # type: ignore[no-untyped-def]
    n_samples, n = xyz.shape[0], xyz.shape[1]
    for k in prange(n_samples * n):
        s = k // n
        i = k - s * n
        ci, cb, ca, cd, vb, va, vd = _row_second(xyz, v, s, i, refs, hb, ha, hd, gb, ga, gd)
        _store_row(rows, s, i, ci, cb, ca, cd)
        jb[s, i] = vb
        ja[s, i] = va
        jd[s, i] = vd


@jit
def _scatter_rows(rows, refs, out, s0, s1):  # type: ignore[no-untyped-def]
    """``out[s]`` = row contributions ``rows`` ``(B, N, 4, 3)`` summed into their atoms."""
    n = rows.shape[1]
    buf = np.zeros((n, 3))
    for s in range(s0, s1):
        buf[:] = 0.0
        for i in range(n):
            _acc(buf, i, (rows[s, i, 0, 0], rows[s, i, 0, 1], rows[s, i, 0, 2]))
            for k in range(3):
                _acc(buf, refs[i, k], (rows[s, i, k + 1, 0], rows[s, i, k + 1, 1], rows[s, i, k + 1, 2]))
        _scatter_sample(out, s, buf)


@pjit
def _scatter_rows_par(rows, refs, out):  # type: ignore[no-untyped-def]
    for s in prange(rows.shape[0]):
        _scatter_rows(rows, refs, out, s, s + 1)


def _schedule(n_samples: int, n_atoms: int) -> str:
    """``"serial"`` (small calls), ``"samples"`` (a thread owns whole samples) or ``"rows"``."""
    if n_samples * n_atoms < PARALLEL_ROWS:
        return "serial"
    return "samples" if n_samples >= numba.get_num_threads() else "rows"


def forward(xyz, refs, hb, ha, hd, bonds, args):  # type: ignore[no-untyped-def]
    """``xyz`` ``(B, N, 3)`` -> ``bonds`` ``(B, N)`` and the ``atan2`` arguments ``args`` ``(4, B, N)``
    float64 (``y`` of the angles, of the dihedrals, then their ``x``), written in place.

    `angles` takes the ``atan2`` and wraps the dihedrals into ``(-pi,
    pi]`` (a vectorised loop over the values: a scalar libm call per row was
    three quarters of this kernel's time).
    """
    if xyz.shape[0] * xyz.shape[1] < PARALLEL_ROWS:
        _forward_block(xyz, refs, hb, ha, hd, bonds, args, 0, xyz.shape[0], 0, xyz.shape[1])
    else:
        _forward_par(xyz, refs, hb, ha, hd, bonds, args, _chunks())


def _scatter(rows, refs, out):  # type: ignore[no-untyped-def]
    if rows.shape[0] == 1:
        _scatter_rows(rows, refs, out, 0, 1)
    else:
        _scatter_rows_par(rows, refs, out)


#: The vjp and the second-order term take samples in blocks of ``LANES`` (SIMD across samples,
#: :mod:`.inverse_blocks`) from this many samples on, for at most BLOCK_MAX_ATOMS
#: atoms per sample, when there are enough blocks for the threads (measured, float32, 2 cores,
#: vs the per-sample kernels at 64 samples: vjp 5.7x / 5.5x / 3.8x / 3.2x, second order 4.0x /
#: 2.8x / 2.9x / 2.5x on 22- / 64- / 512- / 2,048-atom molecules; one block on two threads, or
#: 8 samples of 512 atoms, 0.5-0.8x).
BLOCK_MIN = 16
BLOCK_MAX_ATOMS = 4096


def _blocked(n_samples: int, n_atoms: int, nt: int) -> bool:
    """Whether a call of ``nt`` threads takes the blocked kernels."""
    n_blocks = -(-n_samples // blocks.LANES)
    return n_samples >= BLOCK_MIN and n_atoms <= BLOCK_MAX_ATOMS and (nt == 1 or n_blocks >= nt)


def vjp(xyz, refs, hb, ha, hd, gb, ga, gd, out):  # type: ignore[no-untyped-def]
    """``out`` ``(B, N, 3)`` = ``J^T (gb, ga, gd)`` (each ``g`` ``(B, N)``)."""
    n_samples, n_atoms = xyz.shape[0], xyz.shape[1]
    how = _schedule(n_samples, n_atoms)
    nt = 1 if how == "serial" else numba.get_num_threads()
    args = (xyz, refs, hb, ha, hd, gb, ga, gd, out)

    def per_sample() -> None:
        if how == "serial":
            _vjp_samples(*args, 0, xyz.shape[0])
        elif how == "samples":
            _vjp_by_sample(*args, min(_chunks(), xyz.shape[0]))
        else:
            rows = np.empty((xyz.shape[0], xyz.shape[1], 4, 3))
            _vjp_rows(xyz, refs, hb, ha, hd, gb, ga, gd, rows)
            _scatter(rows, refs, out)

    if _blocked(n_samples, n_atoms, nt):
        kernel, blocked_args = (
            (blocks.vjp_parallel, (*args, nt)) if nt > 1 else (blocks.vjp_items, (0, 1, *args))
        )
        tiers.run(kernel, blocked_args, xyz.dtype, per_sample)
    else:
        per_sample()


def second(xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd):  # type: ignore[no-untyped-def]
    """``out`` = ``sum_k g_k H_k v`` ``(B, N, 3)``; ``jb, ja, jd`` = ``J v`` ``(B, N)`` each."""
    n_samples, n_atoms = xyz.shape[0], xyz.shape[1]
    how = _schedule(n_samples, n_atoms)
    nt = 1 if how == "serial" else numba.get_num_threads()
    args = (xyz, v, refs, hb, ha, hd, gb, ga, gd, out, jb, ja, jd)

    def per_sample() -> None:
        if how == "serial":
            _second_samples(*args, 0, xyz.shape[0])
        elif how == "samples":
            _second_by_sample(*args, min(_chunks(), xyz.shape[0]))
        else:
            rows = np.empty((xyz.shape[0], xyz.shape[1], 4, 3))
            _second_rows(xyz, v, refs, hb, ha, hd, gb, ga, gd, rows, jb, ja, jd)
            _scatter(rows, refs, out)

    if _blocked(n_samples, n_atoms, nt):
        kernel, blocked_args = (
            (blocks.second_parallel, (*args, nt)) if nt > 1 else (blocks.second_items, (0, 1, *args))
        )
        tiers.run(kernel, blocked_args, xyz.dtype, per_sample)
    else:
        per_sample()


# ------------------------------------------------------------------ the fused engine's entry points
def plan_arrays(plan: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The inverse plan's ``refs``, ``has_bond``, ``has_angle``, ``has_dihedral`` as the kernels read
    them (numpy views)."""
    return plan.refs.numpy(), plan.has_bond.numpy(), plan.has_angle.numpy(), plan.has_dihedral.numpy()


def internal(plan: Any, xyz: Tensor, scratch: np.ndarray | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(B, N)`` bonds, angles and dihedrals (each in its own memory, ``xyz``'s dtype) of ``xyz``
    ``(B, N, 3)`` on the inverse plan ``plan`` (`batched_nerf.engines.inverse.InversePlan`): `forward`
    then `angles`. ``scratch``: a float64 array of at least ``4 B N`` values for the ``atan2``
    arguments (else a new one). The same signature as every backend's ``internal``."""
    m, n = xyz.shape[0], xyz.shape[1]
    bonds, angles_, dihedrals = (torch.empty(m, n, dtype=xyz.dtype) for _ in range(3))
    args = np.empty((4, m, n)) if scratch is None else scratch[: 4 * m * n].reshape(4, m, n)
    forward(numpy_view(xyz), *plan_arrays(plan), bonds.numpy(), args)
    angles(args, angles_.numpy(), dihedrals.numpy())  # vectorised atan2, wrapped into (-pi, pi]
    return bonds, angles_, dihedrals


def internal_vjp(plan: Any, xyz: Tensor, g_bonds: Tensor, g_angles: Tensor, g_dihedrals: Tensor) -> Tensor:
    """``(B, N, 3)`` gradient of ``sum(g_bonds * bonds + g_angles * angles + g_dihedrals * dihedrals)``
    (`vjp`); the cotangents ``(B, N)`` each, of ``xyz``'s dtype. The same signature as every
    backend's ``internal_vjp``."""
    out = torch.empty(xyz.shape, dtype=xyz.dtype)
    g = (numpy_view(t) for t in (g_bonds, g_angles, g_dihedrals))
    vjp(numpy_view(xyz), *plan_arrays(plan), *g, out.numpy())
    return out
