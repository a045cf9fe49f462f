r"""The flow layer's entries (numba): per-atom values <-> compact entries, with the log-det in the same pass.

[`batched_nerf.InternalCoordinateTransform`][batched_nerf.InternalCoordinateTransform] keeps the informative
internal coordinates only, ``(B, E_k)`` per kind ``k`` (bonds, angles,
dihedrals), and needs ``log|det|`` of each direction, a weighted sum over the
bond and angle entries:

```text
log_det = sum_e kb_e log|b_e| + sum_e ka_e log|sin a_e|      (kb, ka: small integers)
```

In torch that is seven passes over the batch (``sin``, ``abs``, two ``log``,
two ``matmul``, an ``add``) plus a ``cat`` of slices per kind, each slow on a
short last dimension: ~0.45 ms of a 0.7 ms build on alanine dipeptide x 4,096.
Here one loop per sample moves the three kinds and accumulates the log-det
as a float64 *product* of ``|b|**kb`` and ``|sin a|**ka``, rescaled by
``10**200`` where it leaves ``(1e-200, 1e200)``, with one ``log`` at the end;
a sample with a factor outside ``(1e-60, 1e60)`` (zero, ``inf``, NaN, or an
extreme value) takes the sum of logs instead (``-inf``, ``inf``, NaN where the
reference gives them). The sines come from the vectorised loop of `trig`.
Measured on alanine dipeptide x 4,096 (float32, 2 threads, one process, best
of 60): the flow layer's inverse 1.53 -> 1.38 ms, its forward 1.63 -> 1.46 ms,
the inverse with its backward 4.18 -> 3.83 ms, against ``to_cartesian`` with
the pose 0.84 ms and ``to_internal`` 0.92 ms.
The kernel pass itself (~0.38 ms) is not at its floor: the product is one
dependent chain per sample and the per-atom moves are gathers.

* `spread`: entries -> ``(B, N)`` values (zero at atoms without an entry) and the log-det;
* `gather`: ``(B, N)`` values -> entries and the log-det;
* `spread_grad` / `gather_grad`: the adjoints of the two, given the log-det's cotangent
  ``g`` ``(B,)``, which adds ``g kb_e / b_e`` and ``g ka_e cos a_e / sin a_e``.

Arrays: ``maps`` ``(3, N)`` int64, the entry of each atom per kind (``-1``: none);
``atoms`` three ``(E_k,)`` int64, the atom of each entry; ``kb`` ``(E_b,)``, ``ka``
``(E_a,)`` int64; values C-contiguous float32 or float64 (outputs in their dtype).
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np
from numba import njit, prange

from . import tiers
from .trig import _sincos

__all__ = ["gather", "gather_grad", "ready", "spread", "spread_grad", "timed"]

#: Below this many values a call runs on the calling thread.
SERIAL_VALUES = 32768
#: Samples per chunk: the sines of a chunk's angle entries are computed in one vectorised loop.
CHUNK = 64
#: A factor outside ``(_LO, _HI)`` sends its sample to the sum of logs; the running product, kept
#: within ``(10**-SCALE, 10**SCALE)``, then stays finite and normal in float64.
_LO, _HI = 1e-60, 1e60
SCALE = 200
_UP, _DOWN = 10.0**SCALE, 10.0**-SCALE
_LN10 = math.log(10.0)


@njit(inline="always")
def _power(v, k):
    """``v**k`` for a small integer ``k >= 1`` (the common weights 1 and 2 as products)."""
    if k == 1:
        return v
    if k == 2:
        return v * v
    return v ** np.float64(k)


@njit(inline="always")
def _times(p, ex, ok, v, k):
    """``p |v|**k`` (``k >= 1``), rescaled by ``10**-SCALE`` into the running decimal exponent ``ex``
    where it leaves ``(10**-SCALE, 10**SCALE)``, and ``ok``: every factor so far lies in ``(_LO, _HI)``."""
    f = _power(abs(np.float64(v)), k)
    ok = ok & (_LO < f) & (f < _HI)
    p *= f
    if p > _UP:
        p *= _DOWN
        ex += SCALE
    elif p < _DOWN:
        p *= _UP
        ex -= SCALE
    return p, ex, ok


@njit(inline="always")
def _slow_log_det(b, sa, i, r, kb, ka):
    """Sample ``i``'s log-det as a sum of logs, its sines ``sa[r]`` (``log 0 = -inf``, NaN stays NaN)."""
    s = 0.0
    for e in range(kb.size):
        if kb[e]:
            s += kb[e] * math.log(abs(np.float64(b[i, e])))
    for e in range(ka.size):
        if ka[e]:
            s += ka[e] * math.log(abs(sa[r, e]))
    return s


@njit(inline="always")
def _log_det(b, sa, i, r, kb, ka):
    """Sample ``i``'s log-det from its bond entries ``b[i]`` and angle sines ``sa[r]``: one float64
    product (a sum of logs where a factor lies outside ``(_LO, _HI)``: zero, inf, NaN, extremes)."""
    p, ex, ok = 1.0, 0, True
    for e in range(kb.size):
        if kb[e]:
            p, ex, ok = _times(p, ex, ok, b[i, e], kb[e])
    for e in range(ka.size):
        if ka[e]:
            p, ex, ok = _times(p, ex, ok, sa[r, e], ka[e])
    return math.log(p) + ex * _LN10 if ok else _slow_log_det(b, sa, i, r, kb, ka)


@njit(inline="always")
def _chunk_log_det(b, sa, c, end, kb, ka, ld):
    """``ld[c:end]`` from the bond entries ``b[c:end]`` and the sines ``sa`` ``(end - c, E_a)`` of the
    chunk's angle entries."""
    for i in range(c, end):
        ld[i] = _log_det(b, sa, i, i - c, kb, ka)


@njit(inline="always")
def _sines(a, lo, hi):
    """``cos`` and ``sin`` of rows ``lo:hi`` of ``a`` ``(B, E)``, each ``(hi - lo, E)`` float64."""
    c, s = np.empty((hi - lo, a.shape[1])), np.empty((hi - lo, a.shape[1]))
    _sincos(a[lo:hi].reshape(-1), c.reshape(-1), s.reshape(-1))
    return c, s


@njit(cache=True, error_model="numpy")
def _spread_items(t, nt, b, a, d, maps, kb, ka, ob, oa, od, ld):
    n_b = b.shape[0]
    lo, hi = n_b * t // nt, n_b * (t + 1) // nt
    n = maps.shape[1]
    for c in range(lo, hi, CHUNK):
        end = min(c + CHUNK, hi)
        _, sa = _sines(a, c, end)
        _chunk_log_det(b, sa, c, end, kb, ka, ld)
        for i in range(c, end):
            for j in range(n):
                mb, ma, md = maps[0, j], maps[1, j], maps[2, j]
                ob[i, j] = b[i, mb] if mb >= 0 else 0.0
                oa[i, j] = a[i, ma] if ma >= 0 else 0.0
                od[i, j] = d[i, md] if md >= 0 else 0.0


@njit(cache=True, error_model="numpy")
def _gather_items(t, nt, b, a, d, atoms_b, atoms_a, atoms_d, kb, ka, ob, oa, od, ld):
    n_b = b.shape[0]
    lo, hi = n_b * t // nt, n_b * (t + 1) // nt
    n_a = atoms_a.size
    for c in range(lo, hi, CHUNK):
        end = min(c + CHUNK, hi)
        for i in range(c, end):
            for e in range(atoms_b.size):
                ob[i, e] = b[i, atoms_b[e]]
            for e in range(n_a):
                oa[i, e] = a[i, atoms_a[e]]
            for e in range(atoms_d.size):
                od[i, e] = d[i, atoms_d[e]]
        _, sa = _sines(oa, c, end)
        _chunk_log_det(ob, sa, c, end, kb, ka, ld)


@njit(cache=True, error_model="numpy")
def _spread_grad_items(t, nt, gb, ga, gd, g, b, a, atoms_b, atoms_a, atoms_d, kb, ka, ob, oa, od):
    """Entry gradients: the per-atom cotangents ``gb, ga, gd`` ``(B, N)`` at the entries' atoms, plus
    the log-det's ``g`` ``(B,)`` times its derivative at the entries ``b``, ``a``."""
    n_b = b.shape[0]
    lo, hi = n_b * t // nt, n_b * (t + 1) // nt
    for c in range(lo, hi, CHUNK):
        end = min(c + CHUNK, hi)
        ca, sa = _sines(a, c, end)
        for i in range(c, end):
            gi = np.float64(g[i])
            for e in range(atoms_b.size):
                ob[i, e] = gb[i, atoms_b[e]] + (gi * kb[e] / np.float64(b[i, e]) if kb[e] else 0.0)
            for e in range(atoms_a.size):
                r = i - c
                oa[i, e] = ga[i, atoms_a[e]] + (gi * ka[e] * ca[r, e] / sa[r, e] if ka[e] else 0.0)
            for e in range(atoms_d.size):
                od[i, e] = gd[i, atoms_d[e]]


@njit(cache=True, error_model="numpy")
def _gather_grad_items(t, nt, gb, ga, gd, g, b, a, maps, kb, ka, ob, oa, od):
    """Per-atom gradients: the entry cotangents ``gb, ga, gd`` ``(B, E_k)``, plus the log-det's ``g``
    ``(B,)`` times its derivative at the entries ``b``, ``a``, at their atoms (zero elsewhere)."""
    n_b = b.shape[0]
    lo, hi = n_b * t // nt, n_b * (t + 1) // nt
    n = maps.shape[1]
    for c in range(lo, hi, CHUNK):
        end = min(c + CHUNK, hi)
        ca, sa = _sines(a, c, end)
        for i in range(c, end):
            gi = np.float64(g[i])
            for j in range(n):
                mb, ma, md = maps[0, j], maps[1, j], maps[2, j]
                if mb >= 0:
                    ob[i, j] = gb[i, mb] + (gi * kb[mb] / np.float64(b[i, mb]) if kb[mb] else 0.0)
                else:
                    ob[i, j] = 0.0
                if ma >= 0:
                    r = i - c
                    oa[i, j] = ga[i, ma] + (gi * ka[ma] * ca[r, ma] / sa[r, ma] if ka[ma] else 0.0)
                else:
                    oa[i, j] = 0.0
                od[i, j] = gd[i, md] if md >= 0 else 0.0


@njit(cache=True, parallel=True)
def _spread_parallel(b, a, d, maps, kb, ka, ob, oa, od, ld, nt):
    for t in prange(nt):
        _spread_items(t, nt, b, a, d, maps, kb, ka, ob, oa, od, ld)


@njit(cache=True, parallel=True)
def _gather_parallel(b, a, d, atoms_b, atoms_a, atoms_d, kb, ka, ob, oa, od, ld, nt):
    for t in prange(nt):
        _gather_items(t, nt, b, a, d, atoms_b, atoms_a, atoms_d, kb, ka, ob, oa, od, ld)


@njit(cache=True, parallel=True)
def _spread_grad_parallel(gb, ga, gd, g, b, a, atoms_b, atoms_a, atoms_d, kb, ka, ob, oa, od, nt):
    for t in prange(nt):
        _spread_grad_items(t, nt, gb, ga, gd, g, b, a, atoms_b, atoms_a, atoms_d, kb, ka, ob, oa, od)


@njit(cache=True, parallel=True)
def _gather_grad_parallel(gb, ga, gd, g, b, a, maps, kb, ka, ob, oa, od, nt):
    for t in prange(nt):
        _gather_grad_items(t, nt, gb, ga, gd, g, b, a, maps, kb, ka, ob, oa, od)


def _run(items, parallel, values: int, *args) -> None:  # type: ignore[no-untyped-def]
    """``items`` on this thread below `SERIAL_VALUES` values (or one chunk), else ``parallel``."""
    nt = 1 if values < SERIAL_VALUES else min(numba.get_num_threads(), -(-args[0].shape[0] // CHUNK))
    if nt > 1:
        parallel(*args, nt)
    else:
        items(0, 1, *args)


@functools.cache
def _probe(dtype: np.dtype) -> tuple[object, ...]:
    """Arguments of `_spread_items`'s signature for ``dtype`` values (tiny arrays, made once per
    dtype: `ready` is asked on every call)."""
    v, i = np.zeros((1, 1), dtype=dtype), np.zeros((3, 1), dtype=np.int64)
    k, ld = np.zeros(1, dtype=np.int64), np.zeros(1)
    return (0, 1, v, v, v, i, k, k, v, v, v, ld)


def ready(dtype: np.dtype) -> bool:
    """Whether this family's kernels may run on ``dtype`` values now: compiled or cached, or the
    torch reference has run long enough on their calls (`tiers`, with `timed`); until
    then the flow layer takes the reference, so a short script does not pay their cold compile
    (~5 s per dtype on the 2-core benchmark machine)."""
    return tiers.ready(_spread_items, _probe(np.dtype(dtype)), str(np.dtype(dtype)))


def timed(dtype: np.dtype, run):  # type: ignore[no-untyped-def]
    """``run()`` (the reference, on a call this family was not `ready` for), its time charged
    to the family's tier."""
    return tiers.timed(_spread_items, str(np.dtype(dtype)), run)


def _outputs(like: np.ndarray, *widths: int) -> tuple[np.ndarray, ...]:
    return tuple(np.empty((like.shape[0], w), dtype=like.dtype) for w in widths)


def spread(b, a, d, maps, kb, ka):  # type: ignore[no-untyped-def]
    """Entries ``(B, E_k)`` -> ``(B, N)`` bonds, angles, dihedrals (zero at atoms without an entry) and
    the log-det ``(B,)`` (float64)."""
    n = maps.shape[1]
    ob, oa, od = _outputs(b, n, n, n)
    ld = np.empty(b.shape[0])
    _run(_spread_items, _spread_parallel, 3 * b.shape[0] * n, b, a, d, maps, kb, ka, ob, oa, od, ld)
    return ob, oa, od, ld


def gather(b, a, d, atoms, kb, ka):  # type: ignore[no-untyped-def]
    """``(B, N)`` bonds, angles, dihedrals -> their entries ``(B, E_k)`` and the log-det ``(B,)``
    (float64)."""
    ob, oa, od = _outputs(b, *(x.size for x in atoms))
    ld = np.empty(b.shape[0])
    _run(_gather_items, _gather_parallel, 3 * b.size, b, a, d, *atoms, kb, ka, ob, oa, od, ld)
    return ob, oa, od, ld


def spread_grad(gb, ga, gd, g, b, a, atoms, kb, ka):  # type: ignore[no-untyped-def]
    """The adjoint of `spread` at entries ``b``, ``a``: ``(B, N)`` cotangents and the log-det's
    ``g`` ``(B,)`` -> entry gradients ``(B, E_k)``."""
    ob, oa, od = _outputs(gb, *(x.size for x in atoms))
    args = (gb, ga, gd, g, b, a, *atoms, kb, ka, ob, oa, od)
    _run(_spread_grad_items, _spread_grad_parallel, 3 * gb.size, *args)
    return ob, oa, od


def gather_grad(gb, ga, gd, g, b, a, maps, kb, ka):  # type: ignore[no-untyped-def]
    """The adjoint of `gather` at entries ``b``, ``a``: entry cotangents ``(B, E_k)`` and the
    log-det's ``g`` ``(B,)`` -> ``(B, N)`` gradients."""
    n = maps.shape[1]
    ob, oa, od = _outputs(gb, n, n, n)
    args = (gb, ga, gd, g, b, a, maps, kb, ka, ob, oa, od)
    _run(_gather_grad_items, _gather_grad_parallel, 3 * gb.shape[0] * n, *args)
    return ob, oa, od
