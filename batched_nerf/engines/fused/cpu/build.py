"""CPU backend of the fused engine (numba): one compiled loop per pass, and which loop runs.

Imported lazily (numba is the optional extra ``fast``). Two kernel layouts:
per sample (`samples`: work items ``(sample, unit)``, a unit
being a run of whole components in build order,
`batched_nerf.engines.fused.build.fused_plan`) and, from `BLOCK_MIN`
samples on (units of at most `FORWARD_MAX_WIDTH` /
`BACKWARD_MAX_WIDTH` atoms, enough blocks for the threads), blocks of
samples innermost (`blocks`, vectorised across samples), once compiled or cached
(`tiers`: until then the per-sample kernels). Small calls and calls
with a single work item run on the calling thread (a round trip through numba's
thread pool can cost a scheduler time slice on a busy machine). Every frame and
position is kept in float64 scratch per thread (``O(unit size)``); inputs and
outputs keep their dtype (float32 or float64).
The kernels call no transcendental function: the cosines and sines of the
angles and dihedrals come in as one float64 array (`trig`, one
vectorised loop over the values, `trig`), and ``phi_eff``
is composed as a turn ``(cos, sin)``: a sibling's turn multiplied in, ``pi``
a sign change.

Per atom ``j`` (plan row ``k``), with placement frame ``M_j`` and
``L = L(theta, phi_eff)`` (columns: ``u = (-cos t, sin t cos p, sin t sin p)``
and two more; columns 2, 3 negated when ``sin(theta) < 0``, the scan engine's
half turn, whose half-angle test agrees with ``sin(theta) < 0`` for every angle
but negative ones within ``1e-16`` of zero):

```text
x_j = x_b + r_j M_j u_j        O_j = M_j L_j      (out-frame, read by children)
```

The backward kernel recomputes a unit's forward into its scratch, then walks
the unit in reverse: the adjoint of each placement gives the gradients of
``r, theta, phi_eff`` and adds into the adjoints of ``x_b``, of the parent's
out-frame (``PARENT`` rows) or, through the NeRF frame, of the three reference
positions (``POSITIONS`` rows); ``phi_eff``'s adjoint flows on to the sibling
it adds.

The fused engine's entry points are `build` and `build_vjp`, on tensors, with the same
signature as the Triton backend's (`cuda.build`, which walks the same plan rows on device
tensors); `forward` and `backward` below are the kernels they run, on numpy arrays (the
protein and torsion builds call them directly).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numba import njit
from torch import Tensor

from ..arrays import numpy_view as _np
from . import entries, pose, threads, tiers, turns
from .blocks import LANES, _blocks_items, _ring, backward_call, forward_call
from .samples import _backward_items, _backward_parallel, _forward_items, _forward_parallel
from .trig import _gathered_items, gathered_trig, trig

__all__ = [
    "backward",
    "entries",
    "forward",
    "gathered_forward",
    "gathered_trig",
    "pose",
    "trig",
    "turns",
    "zero_past",
]

#: Below this many atom-samples per call a kernel runs on the calling thread (no pool round trip),
#: on GNU OpenMP (`TBB_SERIAL_WORK` on TBB, `WORKQUEUE_SERIAL_WORK` on numba's ``workqueue``;
#: `threads.serial_bound`). Measured on 2 cores, float32, medians of 130 calls, one thread (bound
#: 16,384) / two (bound 4,096), back to back and each after 2 ms of torch matmuls: forward of
#: alanine dipeptide x 512 (11,264 atom-samples) 205-208 / 146-151 us and 307-308 / 263-283 us;
#: its forward+backward 695-731 / 486-487 and 840-878 / 647-648 us; chain 64 x 128 forward
#: 152 / 129-131 and 238-264 / 216-217 us (``to_cartesian(method="fused")``, one process per bound).
SERIAL_WORK = 4096
#: `SERIAL_WORK` on TBB: a launch costs about 2 us there too, but a worker that slept (any call
#: after a few ms of other work, the common case in a training step) takes longer to wake than a
#: small call takes alone. Measured on 2 cores, float32, 64 chains (``build_backbone``), one thread
#: / two, medians of 40 alternating calls, forward right after other work: 189 / 240 us at 4,416
#: atom-samples, 254 / 325 at 8,832, 301 / 354 at 12,288, 473 / 429 at 17,664 (back to back: 209 /
#: 233 at 8,832, 342 / 312 at 17,664; the backward alike).
TBB_SERIAL_WORK = 16384
#: `SERIAL_WORK` on ``workqueue`` (a launch costs 70-80 us). Measured as above, back to back, chains
#: of 64-1,024 atoms, forward / backward, one thread against two: 94 / 209 us against 222 / 330 us
#: at 8,832 atom-samples, 344 / 825 against 259 / 927 at 35,328, 645 / 3,033 against 425 / 1,581
#: at 65,536.
WORKQUEUE_SERIAL_WORK = 32768
#: Both kernels take samples in blocks of LANES (SIMD across samples) from this many samples
#: on, when there are enough blocks for the threads, for units of at most FORWARD_MAX_WIDTH /
#: BACKWARD_MAX_WIDTH atoms. Measured, float32, 2 cores, vs the per-sample kernels: forward
#: 2.0x / 2.0x / 1.9x / 2.4x / 2.2x on 22- / 64- / 512- / 1,024- / 4,096-atom units (256, 1,024,
#: 256, 256, 64 samples; the forward keeps only a ring of scratch rows), 1.0x at 4,096 x 256
#: and 1.2x at 16,384 x 64; backward 2.7x / 2.8x / 1.2x on 22- / 64- / 512-atom units, 0.8x
#: on 1,024 (it keeps every row's scratch for the reverse walk); below 16 samples, or one block
#: on two threads, the per-sample kernels win.
BLOCK_MIN = 16
FORWARD_MAX_WIDTH = 4096
BACKWARD_MAX_WIDTH = 512


def _blocked(n_samples: int, width: int, n_units: int, nt: int, max_width: int) -> bool:
    """Whether a call of ``nt`` threads takes the blocked kernels (SIMD across samples)."""
    items = -(-n_samples // LANES) * n_units
    return n_samples >= BLOCK_MIN and width <= max_width and (nt == 1 or items >= nt)


def _threads(n_samples: int, n_units: int, n_atoms: int) -> int:
    """Threads for one call: 1 for small work, else at most one per work item."""
    work = n_samples * n_atoms
    return threads.count(work, n_samples * n_units, SERIAL_WORK, WORKQUEUE_SERIAL_WORK, TBB_SERIAL_WORK)


def forward(
    index: np.ndarray,
    starts: np.ndarray,
    bonds: np.ndarray,
    trig: np.ndarray,
    fixed: np.ndarray,
    pose: np.ndarray,
    width: int,
    reach: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Positions ``(B, N, 3)`` from ``bonds`` ``(B, N)``, ``trig`` and ``fixed`` ``(B, F, 3)`` (``F``: 0 ok).

    ``trig`` ``(4, B, N)`` float64: ``cos(angles), cos(dihedrals), sin(angles),
    sin(dihedrals)`` (`batched_nerf.engines.fused.build.trig`). ``pose``
    ``(B or 1, S, 13)`` float64: the pose rows of the seeded components
    (`pose.pose_rows`: ``R`` row-major, ``t``, and 1 for a proper
    rotation; the identity's rows where no pose is given): each seeded atom
    is written out as ``R y + t`` of its built position ``y``. ``index``
    ``(12, N)``, ``starts`` ``(U + 1,)``, ``width`` and ``reach`` are the plan's
    (`batched_nerf.engines.fused.build.FusedPlan`); every array C-contiguous,
    ``bonds`` and ``fixed`` of one float dtype, which the output keeps. ``out``: a
    ``(B, N, 3)`` array of that dtype to write the atoms of the plan into (the other
    positions keep their values); default a new one.
    """
    n_samples, n_atoms = bonds.shape
    if out is None:
        out = np.empty((n_samples, n_atoms, 3), dtype=bonds.dtype)
    nt = _threads(n_samples, starts.size - 1, n_atoms)

    def per_sample() -> None:
        if nt > 1:
            _forward_parallel(index, starts, bonds, trig, fixed, pose, out, nt, width)
        else:  # the same loop on this thread: no thread-pool round trip
            X, F, T = np.empty((width, 3)), np.empty((width, 9)), np.empty((width, 4))
            _forward_items(0, 1, index, starts, bonds, trig, fixed, pose, out, X, F, T)

    if _blocked(n_samples, width, starts.size - 1, nt, FORWARD_MAX_WIDTH):  # SIMD across a block
        nt_blocks = min(nt, -(-n_samples // LANES) * (starts.size - 1))
        kernel, blocked_args = forward_call(
            index, starts, bonds, trig, fixed, pose, out, nt_blocks, width, reach
        )
        tiers.run(kernel, blocked_args, bonds.dtype, per_sample)
    else:
        per_sample()
    return out


@njit(cache=True)
def zero_past(x, count):
    """``x[i, j, :] = 0`` for ``j >= count[i]``: ``x`` ``(m, n, k)`` float (any strides), ``count``
    ``(m,)`` int64 (numpy's boolean assignment of the same takes 10-20x longer)."""
    for i in range(x.shape[0]):
        for j in range(max(count[i], 0), x.shape[1]):
            for k in range(x.shape[2]):
                x[i, j, k] = 0.0


#: `_gathered_blocks`'s ``count`` for every row of every sample.
_EVERY = np.zeros(0, dtype=np.int64)


@njit(cache=True)
def _gathered_blocks(values, consts, which, column, count, fallback, first, p, starts, pose, rows, mask, m):
    """`gathered_trig`, the blocked forward and `zero_past`, on the calling thread: one call (no
    Python between the passes, and the arrays made here: every numpy call costs a call right after
    other work tens of microseconds, cold). Returns the ``(m, n, 3)`` positions."""
    n, dtype = which.shape[1], values[0].dtype
    if count.size == 0:  # every row
        count = np.full(m, n, np.int64)
    fixed = np.empty((m, first.shape[0], 3), dtype)
    for i in range(m):
        fixed[i] = first
    bonds, trig_rows, out = np.empty((m, n), dtype), np.empty((4, m, n)), np.empty((m, n, 3), dtype)
    _gathered_items(0, 1, values, consts, which, column, count, fallback, bonds, trig_rows)
    _blocks_items(0, 1, p, starts, bonds, trig_rows, fixed, pose, out, rows, mask)
    zero_past(out, count)
    return out


def gathered_forward(
    values: tuple[np.ndarray, np.ndarray, np.ndarray],
    consts: np.ndarray,
    source: tuple[np.ndarray, np.ndarray, np.ndarray],
    count: np.ndarray | None,
    index: np.ndarray,
    starts: np.ndarray,
    first: np.ndarray,
    pose: np.ndarray,
    width: int,
    reach: int,
    n_samples: int,
) -> np.ndarray:
    """Positions ``(m, N, 3)`` of atom rows gathered from per-sample values: `gathered_trig` (its
    ``values``, ``consts``, ``count``; ``source`` its ``which``, ``column``, ``fallback``) then
    `forward` (the plan's ``index``, ``starts``, ``width``, ``reach``; ``pose``; every sample's
    fixed positions ``first`` ``(F, 3)`` of the values' dtype, ``F`` the plan's fixed atoms, 0 ok),
    the same bits, then the rows at or past ``count`` written as zeros (`zero_past`). ``count``:
    ``(m,)`` int64 rows of each sample, None for all; ``m`` is ``n_samples``. A call that runs on
    the calling thread in the blocked layout takes one compiled call for all three (a call right
    after other work pays for each entry into compiled code and each Python step between them,
    cold)."""
    which, column, fallback = source
    m, n = n_samples, which.shape[1]
    n_units = starts.size - 1

    def separately() -> np.ndarray:  # the two passes: the same bits
        rows = np.full(m, n, dtype=np.int64) if count is None else count
        fixed = np.empty((m, *first.shape), dtype=first.dtype)
        fixed[:] = first
        bonds, trig_rows = gathered_trig(values, consts, which, column, rows, fallback, m)
        built = forward(index, starts, bonds, trig_rows, fixed, pose, width, reach)
        zero_past(built, rows)
        return built

    if _threads(m, n_units, n) > 1 or not _blocked(m, width, n_units, 1, FORWARD_MAX_WIDTH):
        return separately()
    rows, mask = _ring(reach, width)
    every = _EVERY if count is None else count
    args = (values, consts, which, column, every, fallback, first, index, starts, pose, rows, mask, m)
    return tiers.run(_gathered_blocks, args, values[0].dtype, separately)  # until it may run (`tiers`)


def backward(
    index: np.ndarray,
    starts: np.ndarray,
    bonds: np.ndarray,
    trig: np.ndarray,
    fixed: np.ndarray,
    pose: np.ndarray,
    grad_xyz: np.ndarray,
    width: int,
    pose_grad: bool = False,
    out: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(g_bonds, g_angles, g_dihedrals, g_fixed, g_pose)`` of ``sum(grad_xyz * xyz)``.

    Shapes as the inputs of `forward`; ``grad_xyz`` ``(B, N, 3)``; ``pose``
    here keeps an improper rotation's values (its components get no gradient).
    ``g_pose`` ``(B, S, 12)`` float64 (``R`` row-major, ``t``) with ``pose_grad``,
    else ``(0, S, 12)``. ``out``: three C-contiguous ``(B, N)`` arrays of the bonds'
    dtype to write the first three into (scratch a caller reads at once); default new ones.
    """
    n_samples, n_atoms = bonds.shape
    if out is None:
        out = tuple(np.empty((n_samples, n_atoms), dtype=bonds.dtype) for _ in range(3))  # type: ignore[assignment]
    gb, ga, gd = out
    gf = np.empty(fixed.shape, dtype=bonds.dtype)
    gpose = np.zeros((n_samples if pose_grad else 0, pose.shape[1], 12))  # the kernels add into it
    nt = _threads(n_samples, starts.size - 1, n_atoms)
    args = (index, starts, bonds, trig, fixed, pose, grad_xyz, gb, ga, gd, gf, gpose)

    def per_sample() -> None:
        if nt > 1:
            _backward_parallel(*args, nt, width)
        else:
            shapes = ((width, 3), (width, 9), (width, 3), (width, 9), width, (width, 4), (width, 9))
            S = tuple(np.empty(shape) for shape in shapes)
            _backward_items(0, 1, *args, S)

    if _blocked(n_samples, width, starts.size - 1, nt, BACKWARD_MAX_WIDTH):
        nt_blocks = min(nt, -(-n_samples // LANES) * (starts.size - 1))
        kernel, blocked_args = backward_call(*args, nt_blocks, width)
        tiers.run(kernel, blocked_args, bonds.dtype, per_sample)
    else:
        per_sample()
    return gb, ga, gd, gf, gpose


# ------------------------------------------------------------------ the fused engine's entry points
#: The kernels read the cosines and sines of the angles and dihedrals as one array (`trig`), which a
#: caller may make once and keep for the backward (``trig_rows`` of `build` and `build_vjp`).
READS_TRIG = True


def build(
    plan: Any,
    bonds: Tensor,
    angles: Tensor,
    dihedrals: Tensor,
    fixed: Tensor,
    rot: Tensor | None,
    tr: Tensor | None,
    trig_rows: np.ndarray | None = None,
) -> Tensor:
    """``(B, N, 3)`` positions from ``(B, N)`` bonds, angles, dihedrals and ``(B, F, 3)`` fixed positions
    (``F`` may be 0) on the fused plan ``plan`` (`batched_nerf.engines.fused.build.FusedPlan`), each
    seeded component in its pose (``rot`` ``(B, S, 3, 3)``, ``tr`` ``(B, S, 3)``; None: no pose;
    NaN for an improper rotation) and a negative bond's atom NaN, in the inputs' dtype.
    ``trig_rows``: `trig` of ``angles`` and ``dihedrals`` where the caller made it (else made here).
    The same signature as every backend's ``build``."""
    rows, cs = _pose_and_trig(plan, angles, dihedrals, rot, tr, trig_rows, nan=True)
    out = forward(plan.index, plan.starts, _np(bonds), cs, _np(fixed), rows, plan.width, plan.reach)
    return torch.from_numpy(out)


def build_vjp(
    plan: Any,
    bonds: Tensor,
    angles: Tensor,
    dihedrals: Tensor,
    fixed: Tensor,
    rot: Tensor | None,
    tr: Tensor | None,
    grad_xyz: Tensor,
    trig_rows: np.ndarray | None = None,
) -> tuple[Tensor | None, ...]:
    """Gradients of ``sum(grad_xyz * build(...))`` (arguments as `build`'s; ``grad_xyz`` ``(B, N, 3)``
    of the inputs' dtype): ``(g_bonds, g_angles, g_dihedrals)`` ``(B, N)``, ``g_fixed`` ``(B, F, 3)``,
    ``g_rot``, ``g_tr`` (None without a pose; an improper rotation's component gets none). The same
    signature as every backend's ``build_vjp``."""
    rows, cs = _pose_and_trig(plan, angles, dihedrals, rot, tr, trig_rows, nan=False)
    *grads, g_pose = backward(
        plan.index, plan.starts, _np(bonds), cs, _np(fixed), rows, _np(grad_xyz), plan.width, rot is not None
    )
    gb, ga, gd, gf = (torch.from_numpy(x) for x in grads)
    if rot is None or tr is None:
        return gb, ga, gd, gf, None, None
    gp = torch.from_numpy(g_pose).to(bonds.dtype)
    return gb, ga, gd, gf, gp[..., :9].reshape(rot.shape), gp[..., 9:].reshape(tr.shape)


def _pose_and_trig(
    plan: Any,
    angles: Tensor,
    dihedrals: Tensor,
    rot: Tensor | None,
    tr: Tensor | None,
    trig_rows: np.ndarray | None,
    nan: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """What `build` and `build_vjp` hand the kernels besides the plan and the inputs: the pose rows
    (`pose.pose_rows`, ``nan``: the forward's, an improper rotation's component NaN; the identity's
    rows without a pose) and the trig array (``trig_rows`` where the caller kept one)."""
    if rot is None or tr is None:
        rows = pose.identity_rows(plan.topology.seed_root.size)
    else:
        rows = pose.pose_rows(_np(rot), _np(tr), nan)
    return rows, trig(_np(angles), _np(dihedrals)) if trig_rows is None else trig_rows
