"""Work-efficient blocked scan along one path of the frame tree (chains).

When the scanned atoms of a round form a single path below one root (a linear
chain, the backbone of a polymer built atom after atom), the frame of atom
``j`` is the product ``R_j = G L_1 L_2 ... L_j`` of its predecessors' local
rotations (see `local_rotations`), and its position is a plain prefix sum

    x_j = o + sum_{i <= j} r_i R_i e_1

(the bond of atom ``i`` points along the first column of its own frame). So a
path needs a prefix *product* of ``3 x 3`` rotations and a prefix *sum*; both
are computed in blocks:

1. bands of ``K`` consecutive atoms: ``K - 1`` sequential products inside all
   bands at once (``Q_{b,t} = L_{b,0} ... L_{b,t}``, O(N) work, two kernels a
   step: one broadcast multiply and one sum, exact, no TF32 ``matmul``), and
   in-band displacements ``d_{b,t} = sum_{s <= t} r_{b,s} Q_{b,s} e_1`` (one
   ``cumsum``);
2. the band-start frames ``E_b = G Q_{0,K-1} ... Q_{b-1,K-1}`` by pointer
   jumping over the ``N / K`` band totals (a shift is a slice and a ``cat``),
   and the band-start positions ``S_b = o + sum_{c < b} E_c d_{c,K-1}`` by a
   ``cumsum``; this part is O(N / K) work and runs in float64, so that rounding
   does not accumulate along the chain;
3. one fix-up ``x_{b,t} = S_b + E_b d_{b,t}``.

Layout: everything is ``(components..., bands, K, M)`` with the flattened batch
``M`` contiguous and innermost. No gathers, no scatters (the backward of a slice
is a pad), which also keeps ``torch.compile`` on the CPU away from the inductor
scatter defects of torch 2.13 (see ``docs/benchmarks.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..base import Movable

#: Atom-samples up to which float32 paths are scanned in float64 (:func:`path_dtype`).
SMALL_WORK = 1 << 16
#: Longest band tried; the band is chosen by :func:`path_band`.
MAX_BAND = 64
#: Longest band under ``torch.compile`` (compile time grows with the band).
MAX_BAND_COMPILED = 8  # chain 512 x 256: compile 34 s (K = 17: 218 s), run time 0.97x
#: Cost model of :func:`path_band` (seconds, 2-core CPU, float32): per kernel
#: launch, per atom-sample of a band step, per band-top element of a jump step.
KERNEL_S = 6e-6
ELEMENT_S = 3e-9
TREE_ELEMENT_S = 6e-9


def path_band(length: int, samples: int, compiled: bool = False) -> int:
    """Band length ``K`` for a path of ``length`` atoms and ``samples`` batch elements.

    Minimises ``kernels(K) * KERNEL_S + work(K)``: ``2 (K - 1)`` kernels for the
    in-band products and ``3 ceil(log2(length / K))`` for the jumps across bands;
    the jumps redo ``log2(length / K)`` products on ``length / K`` band tops
    (in float64). Long bands win for large batches, short ones for a single chain.
    Under ``torch.compile`` (``compiled=True``) bands are at most
    ``MAX_BAND_COMPILED``: every band step is unrolled in the graph, and compile
    time grows with the band, never with ``length``.
    """
    best, best_cost = 1, math.inf
    for k in range(1, min(MAX_BAND_COMPILED if compiled else MAX_BAND, max(length, 1)) + 1):
        nb = -(-length // k)
        steps = math.ceil(math.log2(nb)) if nb > 1 else 0
        cost = KERNEL_S * (2 * (k - 1) + 3 * steps) + samples * (
            ELEMENT_S * nb * k + TREE_ELEMENT_S * nb * steps
        )
        if cost < best_cost:
            best, best_cost = k, cost
    return best


def trig_dtype(length: int, samples: int, dtype: torch.dtype) -> torch.dtype:
    """Dtype of the local rotations' trigonometry: float64 for float32 inputs when the work is small.

    The rounding error of every local rotation (about ``eps`` per entry, more
    with float32 ``sin``/``cos``) is what limits a long chain's float32 accuracy
    (error grows like ``eps sqrt(N) extent``); computed in float64 and rounded
    once, it is about 7x smaller (chain of 4,096 atoms: 1.2e-4 instead of
    9.4e-4). Below ``SMALL_WORK`` atom-samples a build is launch-bound and this
    costs nearly nothing; larger builds keep ``dtype``.
    """
    if dtype in (torch.float16, torch.bfloat16, torch.float32) and length * samples <= SMALL_WORK:
        return torch.float64
    return dtype


def local_rotations(r: Tensor, theta: Tensor, phi: Tensor) -> tuple[Tensor, Tensor]:
    """Local rotations ``L = R_x(phi) R_z(pi - theta)`` as ``(3, 3, ...)`` and bond lengths.

    Columns of ``L`` are the child frame in the parent frame; the first column
    is the bond direction ``u = (-cos theta, sin theta cos phi, sin theta sin phi)``.
    For ``sin theta < 0`` the second and third columns change sign (a half turn
    about the bond), so that the frame matches the position-based placement for
    any angle:

    ```text
    L = [[-c,      -g s,      0      ],
         [ s cp,   -g c cp,  -g sp   ],
         [ s sp,   -g c sp,   g cp   ]]
    ```

    with ``c, s = cos(theta), sin(theta)``, ``cp, sp = cos(phi), sin(phi)`` and
    ``g = sign(s)`` (``+1`` at ``s = 0``).

    Args:
        r, theta, phi: ``(...)`` bond lengths, angles and dihedrals (radians).

    Returns:
        ``(L, r)``: ``(3, 3, ...)`` and ``r`` unchanged.
    """
    c, s = torch.cos(theta), torch.sin(theta)
    cp, sp = torch.cos(phi), torch.sin(phi)
    g = torch.copysign(torch.ones_like(s), s)  # sign(s), +1 at +0
    nc = -c
    ngc = g * nc
    zero = s.new_zeros(()).expand_as(s)
    # -g s (not -|s|): the same value, and at s = 0 the derivative of the branch taken, as in every engine
    entries = (nc, -g * s, zero, cp * s, cp * ngc, -g * sp, sp * s, sp * ngc, g * cp)
    return torch.stack(entries).unflatten(0, (3, 3)), r


def _mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for ``(3, 3, ...)`` matrices (rows, columns first): one multiply, one sum."""
    return (a.unsqueeze(2) * b.unsqueeze(0)).sum(1)


def _mv(a: Tensor, v: Tensor) -> Tensor:
    """``a @ v`` for ``(3, 3, ...)`` and ``(3, ...)``."""
    return (a * v.unsqueeze(0)).sum(1)


def scan_path(
    rtp: Tensor, frame: Tensor, origin: Tensor, band: int, trig_dtype: torch.dtype | None = None
) -> Tensor:
    """Positions of the atoms of one path below a root frame.

    Args:
        rtp: ``(3, D, M)`` bond lengths, angles and dihedrals (radians) of the
            path's atoms in path order, ``M`` the flattened batch (innermost);
            ``D`` a multiple of ``band`` (pad the end with zeros: atoms after
            the last real one change nothing before it).
        frame: ``(3, 3, M)`` the root's rotation ``G`` (columns: frame axes).
        origin: ``(3, M)`` the root's position ``o``.
        band: band length ``K``.
        trig_dtype: dtype of the trigonometry and the local rotations before
            they are rounded to ``rtp``'s dtype (default: ``rtp``'s dtype).

    Returns:
        ``(3, D, M)`` positions.
    """
    _, length, samples = rtp.shape
    k = band
    nb = length // k
    dtype = rtp.dtype
    trig_dtype = dtype if trig_dtype is None else trig_dtype
    r, theta, phi = rtp.unbind(0)
    rot, _ = local_rotations(r, theta.to(trig_dtype), phi.to(trig_dtype))
    rot = rot.to(dtype)
    rot = rot.unflatten(2, (nb, k))  # (3, 3, nb, K, M)
    r = r.unflatten(0, (nb, k))  # (nb, K, M)
    steps = rot.unbind(3)  # one backward stack, not K zero-filled selects
    q = steps[0]
    cols = [q[:, 0]]
    for t in range(1, k):
        q = _mm(q, steps[t])
        cols.append(q[:, 0])
    # in-band displacements relative to the band's start frame
    d = (torch.stack(cols, dim=2) * r).cumsum(2)  # (3, nb, K, M)
    # band starts in float64: E_b = G Q_0 ... Q_{b-1}, S_b = o + sum_{c<b} E_c d_c
    wide = torch.float64 if dtype in (torch.float16, torch.bfloat16, torch.float32) else dtype
    e = torch.cat((frame.unsqueeze(2), q[:, :, :-1]), dim=2).to(wide)  # (3, 3, nb, M)
    shift = 1
    while shift < nb:
        e = torch.cat((e[:, :, :shift], _mm(e[:, :, :-shift], e[:, :, shift:])), dim=2)
        shift *= 2
    moves = _mv(e[:, :, :-1], d[:, :, k - 1, :][:, :-1].to(wide))  # (3, nb - 1, M) band displacements
    start = torch.cat((origin.unsqueeze(1).to(wide), moves), dim=1).cumsum(1)
    e, start = e.to(dtype), start.to(dtype)
    x = (e.unsqueeze(3) * d.unsqueeze(0)).sum(1) + start.unsqueeze(2)  # (3, nb, K, M)
    return x.flatten(1, 2)


@dataclass(frozen=True)
class Take(Movable):
    """``x.index_select(dim, index)``, as slices when ``index`` is a few contiguous runs.

    Slices and their ``cat`` have no scatter in their backward (an
    ``index_select``'s backward is an ``index_add``), which is faster in eager
    mode and keeps compiled backward passes clear of scatter kernels.
    """

    index: Tensor  # (n,) indices
    runs: tuple[tuple[int, int], ...] | None  # (start, length) of each run, or None

    @classmethod
    def of(cls, index: Any, max_runs: int = 4) -> Take:
        """Plan a take of ``index`` (1-D integer array-like)."""
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        runs: list[tuple[int, int]] = []
        for i in idx.tolist():
            if runs and runs[-1][0] + runs[-1][1] == i:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((i, 1))
        keep = 0 < len(runs) <= max_runs
        return cls(torch.as_tensor(idx), tuple(runs) if keep else None)

    def __call__(self, x: Tensor, dim: int) -> Tensor:
        if self.runs is None:
            return x.index_select(dim, self.index)
        if len(self.runs) == 1 and self.runs[0] == (0, x.shape[dim]):
            return x
        parts = [x.narrow(dim, start, n) for start, n in self.runs]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)
