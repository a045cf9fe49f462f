"""Fused engine: compiled kernels per pass (CPU: numba; CUDA: Triton), frames composed along the frame tree.

Every other engine runs tens to hundreds of small torch kernels per call; this
one runs one compiled loop over the atoms in build order for each
``(sample, unit)`` work item (a *unit* is a run of whole components; on the
CPU, from 8 samples on, a block of samples per item, vectorised across them:
`cpu.build`), split over the CPU's threads. Its values follow the frame tree
(`frame_tree`) exactly like the scan engine's, degenerate inputs
included: ``x_j = x_b + r_j M_j u_j``, ``O_j = M_j L_j``, with ``M_j`` the
anchor frame, the parent's out-frame or the NeRF frame of the references'
positions. Frames and positions are accumulated in float64 whatever the input
dtype (float32 in, float32 out). On CUDA tensors the same walk runs as Triton
kernels (`cuda.build`: a lane per ``(component, sample)``), accumulating
in float64 too unless the call asks for float32 (``accumulate_dtype``, see
`configure`); under ``method="auto"`` a Triton compile or launch error
falls back to the reference engine with one warning (`gpu_policy`).

Plan (`fused_plan`, vectorised numpy, once per table): a ``(12, N)``
integer array over the atoms in work order (fields and codes in `rows`:
atom, row code, bond/angle/dihedral reference rows, parent row, sibling row,
flip atom, fixed slot, anchor sign, third-seed flag, pose slot), the unit
boundaries (CPU work items) and the component runs (GPU lanes); both backends
read it.

The CPU kernels read the angles' and dihedrals' ``cos``/``sin`` from `trig`
(one vectorised float64 loop); the forward's array is kept for the backward
(`Turns`).

Derivatives: `FusedBuild` runs the forward kernel; its backward is
`FusedVJP`, the fused backward kernel (reverse accumulation, one pass);
the backward of that, forward-mode AD (``jvp``) and everything beyond are the
torch graph of a reference engine (the same values and derivatives: the level
engine for shallow tables, ``depth <= 8``, else the scan engine), so
``gradgradcheck``, ``create_graph=True`` losses, third order and ``torch.func``
(``vmap`` rules on both functions) stay exact. Under
``torch.compile`` and for dtypes other than float32/float64 the reference
engine builds directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..._geometry import nan_negative_bonds, pose_atoms
from ...runtime import gate
from ...runtime.torch_compat import no_functorch
from ...topology.analysis import SECOND, THIRD, Topology
from ...topology.frame_tree import ANCHOR, PARENT, POSITIONS, frame_tree
from ..backends import available, require
from ..base import Engine, Movable
from ..dispatch import SHALLOW_DEPTH, scan_block
from ..function import KernelOp, fold, with_none
from ..levels import LevelPlan, build_levels, level_plan
from ..scan.build import build_scan, scan_plan
from . import rows as R
from . import workspace
from .arrays import numpy_view as _np

__all__ = [
    "FUSED",
    "FUSED_BUILD",
    "FUSED_VJP",
    "FusedBuild",
    "FusedPlan",
    "FusedVJP",
    "build_fused",
    "configure",
    "fused_plan",
    "trig",
]

#: Work units hold whole components, at least this many atoms (unless fewer exist) ...
UNIT_MIN_ATOMS = 256
#: ... and a table has at most about this many units (enough to share one sample over the threads).
UNITS_MAX = 64


@dataclass(frozen=True)
class FusedPlan(Movable):
    """Atoms in work order with everything the kernels read.

    Attributes:
        index: ``(12, N)`` ``int64``, one column per atom in work order, its fields and row
            codes defined in `rows` (atom, row code, bond/angle/dihedral reference row,
            parent row, sibling row whose ``phi_eff`` is added, atom whose ``sin(angle) < 0``
            adds ``pi``, fixed slot, anchor sign, third-seed flag, pose slot). Every backend
            reads this array: numba as it is, Triton as an ``int32`` device copy (`cuda`).
        starts: ``(U + 1,)`` ``int64`` first row of each work unit (the CPU kernels' work items).
        runs: ``(C + 1,)`` ``int64`` first row of each component (the Triton kernels' lanes).
        topology: the table's topology (the reference engine's plan is made from it on demand).
        width: atoms of the widest unit (at least 1): the kernels' scratch rows.
        reach: the farthest any row's references lie back (rows; 0 for none): the
            blocked forward keeps a ring of scratch rows that long plus a chunk.
        accumulate: the GPU kernels' scratch dtype (float64, or float32 when a call
            asks; the CPU kernels always accumulate in float64). Set per call by
            `configure`.
        fallback: a Triton kernel error falls back to the reference engine with a
            warning (``method="auto"``) instead of raising (``method="fused"``).
    """

    index: np.ndarray
    starts: np.ndarray
    runs: np.ndarray
    topology: Topology
    width: int
    reach: int
    _reference: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    accumulate: torch.dtype = torch.float64
    fallback: bool = False
    _configured: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def reference(self, n_samples: int, device: torch.device) -> Any:
        """The reference plan on ``device``: levels for shallow tables, else scan (band for ``n_samples``)."""
        block = 0 if self.topology.depth <= SHALLOW_DEPTH else scan_block(self.topology.n_atoms, n_samples)
        key = (block, device)
        plan = self._reference.get(key)
        if plan is None and torch.compiler.is_compiling():
            raise RuntimeError(
                "method='fused' cannot be traced by torch.compile (its kernels are compiled already): "
                "compile method='scan' or 'auto' (bn.compile_builder does), or call the fused build "
                "once eagerly with gradients first"
            )
        if plan is None:
            plan = self._reference.get((block, torch.device("cpu")))
            if plan is None:
                with _no_functorch():  # made inside a transform, its tensors would escape it
                    plan = level_plan(self.topology) if block == 0 else scan_plan(self.topology, block)
                self._reference[(block, torch.device("cpu"))] = plan
            if device.type != "cpu":
                plan = plan.to(device)
            self._reference[key] = plan
        return plan


def configure(plan: FusedPlan, accumulate_dtype: torch.dtype | None, auto: bool) -> FusedPlan:
    """``plan`` with one call's options (made once per option pair and kept on the plan).

    ``accumulate_dtype`` (``to_cartesian``'s keyword; None: float64) sets the GPU
    kernels' scratch dtype; other dtypes than float32 build with the reference
    engine anyway. ``auto``: a Triton kernel error falls back instead of raising.
    """
    accumulate = torch.float32 if accumulate_dtype == torch.float32 else torch.float64
    if (accumulate, auto) == (plan.accumulate, plan.fallback):
        return plan
    key = (accumulate, auto)
    made = plan._configured.get(key)
    if made is None:
        made = plan._configured[key] = replace(plan, accumulate=accumulate, fallback=auto)
    return made


_no_functorch = no_functorch


def _units(topo: Topology) -> np.ndarray:
    """Work unit of each component: consecutive components, ``>= UNIT_MIN_ATOMS`` atoms each."""
    sizes = np.bincount(topo.component, minlength=topo.n_components)
    target = max(UNIT_MIN_ATOMS, -(-topo.n_atoms // UNITS_MAX))
    first = np.cumsum(sizes) - sizes
    return np.unique(first // target, return_inverse=True)[1].reshape(-1)


def fused_plan(topo: Topology, variant: int = 1) -> FusedPlan:
    """The fused plan of ``topo`` (see `FusedPlan`); numpy only, no loop over atoms."""
    n = topo.n_atoms
    refs = np.asarray(topo.refs)
    kind = np.asarray(topo.kind)
    tree = frame_tree(topo)
    unit = _units(topo)[topo.component] if n else np.zeros(0, dtype=np.int64)
    # by component (units are runs of consecutive components), in build order inside each
    component = topo.component[topo.order]
    atoms = topo.order[np.argsort(component, kind="stable")]
    row = np.empty(n, dtype=np.int64)
    row[atoms] = np.arange(n)

    def rows_of(atom_index: np.ndarray) -> np.ndarray:
        return np.where(atom_index >= 0, row[np.maximum(atom_index, 0)], -1)

    code = np.full(n, R.ROOT, dtype=np.int64)
    code[kind == SECOND] = R.SECOND
    code[tree.frame == ANCHOR] = R.ANCHOR
    code[tree.frame == PARENT] = R.FROM_PARENT
    code[tree.frame == POSITIONS] = R.POSITIONS
    code[topo.fixed] = R.FIXED
    slot = np.full(n, -1, dtype=np.int64)
    slot[topo.fixed] = np.arange(topo.n_fixed)
    # anchor e1 = +e_x when the third seed's bond reference is the second seed atom, else -e_x
    third_of = np.maximum(tree.parent, 0)
    sign = np.where(kind[np.maximum(refs[third_of, 0], 0)] == SECOND, 1, -1)
    sign = np.where(tree.frame == ANCHOR, sign, 0)
    fields = (  # in the order of `rows` (ATOM ... POSE)
        np.arange(n),
        code,
        rows_of(refs[:, 0]),
        rows_of(refs[:, 1]),
        rows_of(np.where(tree.frame == POSITIONS, tree.dihedral_ref, -1)),
        rows_of(np.where(tree.frame == PARENT, tree.parent, -1)),
        rows_of(tree.phi_from),
        np.asarray(tree.flip_on),
        slot,
        sign,
        (kind == THIRD).astype(np.int64),
        np.where(topo.seed_slot < topo.seed_root.size, topo.seed_slot, -1),
    )
    index = np.ascontiguousarray(np.stack(fields)[:, atoms], dtype=np.int64)
    counts = np.bincount(unit, minlength=int(unit.max(initial=-1)) + 1)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    sizes = np.bincount(topo.component, minlength=topo.n_components)
    runs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rows, refs = np.arange(n), index[R.REF_B : R.PHI_FROM + 1]  # bond, angle, dihedral, parent, sibling
    reach = int((rows - np.where(refs >= 0, refs, rows)).max(initial=0))
    width = int(counts.max(initial=1))
    return FusedPlan(index=index, starts=starts, runs=runs, topology=topo, width=width, reach=reach)


# ------------------------------------------------------------------ autograd
def trig(angles: Tensor, dihedrals: Tensor, out: np.ndarray | None = None) -> np.ndarray:
    """``(4, B, N)`` float64 ``cos(angles), cos(dihedrals), sin(angles), sin(dihedrals)`` for the CPU kernels.

    One vectorised numba loop over the values (`cpu.trig`, within
    2 ulp of libm) instead of a scalar libm call per atom inside the kernels:
    the forward kernel's transcendental functions were a third of its time.
    ``out``: ``4 B N`` float64 values to write into (`workspace`).
    """
    return require("cpu").trig(_np(angles), _np(dihedrals), out)


class Turns:
    """The `trig` array of a forward call, kept for its backward (a non-tensor argument, so
    autograd and ``torch.func`` pass it through untouched); ``cs`` is None where it was not made.
    ``lease``: the `workspace.Lease` whose buffer ``cs`` is written in, returned to its table
    when this object (the graph holding it) is freed."""

    __slots__ = ("cs", "lease")

    def __init__(self, cs: np.ndarray | None, lease: workspace.Lease | None = None) -> None:
        self.cs, self.lease = cs, lease

    @classmethod
    def kept(cls, owner: object, angles: Any, dihedrals: Any) -> Turns:
        """The trig array of ``angles`` and ``dihedrals`` (C-contiguous numpy arrays of one shape), written
        into a buffer leased from ``owner``'s (a topology's) workspace where one serves."""
        held = workspace.lease(owner, 4 * angles.size)
        cs = require("cpu").trig(angles, dihedrals, None if held is None else held.array)
        return cls(cs, held)


#: No trig array: the kernels make their own.
NO_TURNS = Turns(None)


def with_turns(
    keep: bool, owner: object, angles: Any, dihedrals: Any, use: Callable[..., Tensor], args: tuple[Any, ...]
) -> Tensor:
    """``use(*args[:-1], turns)`` (a `KernelOp` call whose last constant is its `Turns`) with the trig
    array of ``angles`` and ``dihedrals`` (C-contiguous numpy arrays of one shape): kept for a
    backward (``keep``: leased from ``owner``'s workspace to the graph, `Turns.kept`) or borrowed for
    the call (a new array where no buffer serves). The work buffer of every op that hands its kernels
    a trig array (`KernelOp`'s ``buffers``)."""
    if keep:
        return use(*args[:-1], Turns.kept(owner, angles, dihedrals))
    with workspace.borrowed(owner, 4 * angles.size) as buf:  # nothing keeps it
        return use(*args[:-1], Turns(require("cpu").trig(angles, dihedrals, buf)))


def _forward_kernel(
    b: Tensor,
    a: Tensor,
    d: Tensor,
    f: Tensor,
    rot: Tensor | None,
    tr: Tensor | None,
    plan: FusedPlan,
    turns: Turns = NO_TURNS,
) -> Tensor:
    """The forward kernel of the inputs' device: its backend's ``build`` (every backend takes the same
    arguments: `cpu.build.build`, `cuda.build.build`)."""
    if b.is_cpu:  # the CPU backend reads numpy views, which detach: no torch call per input here
        return require("cpu").build(plan, b, a, d, f, rot, tr, turns.cs)
    return require(gate.device_type(b)).build(plan, *_detached(b, a, d, f, rot, tr), turns.cs)


def _backward_kernel(
    b: Tensor,
    a: Tensor,
    d: Tensor,
    f: Tensor,
    rot: Tensor | None,
    tr: Tensor | None,
    g: Tensor,
    plan: FusedPlan,
    turns: Turns = NO_TURNS,
) -> tuple[Tensor | None, ...]:
    """The backward kernel of the inputs' device (its backend's ``build_vjp``): gradients of
    ``sum(g * xyz)`` with respect to ``b, a, d, f`` and, where a pose is given, ``rot, tr``."""
    grads = require(gate.device_type(b)).build_vjp(
        plan, *_detached(b, a, d, f, rot, tr), g.detach().to(b.dtype), turns.cs
    )
    return grads if rot is not None else grads[:4]


def _detached(*tensors: Tensor | None) -> tuple[Any, ...]:
    return tuple(None if t is None else t.detach() for t in tensors)


def _posed(plan: FusedPlan, x: Tensor, rot: Tensor | None, tr: Tensor | None) -> Tensor:
    """``x`` moved by ``(B, S, 3, 3)`` rotations and ``(B, S, 3)`` translations (torch; ``x`` itself
    without)."""
    if rot is None or tr is None:
        return x
    slot = plan._reference.get(("slot", x.device))
    if slot is None:
        with _no_functorch():
            slot = torch.tensor(plan.topology.seed_slot, dtype=torch.long, device=x.device)
        plan._reference[("slot", x.device)] = slot
    return pose_atoms(x, rot, tr, slot)


def _reference_build(
    b: Tensor,
    a: Tensor,
    d: Tensor,
    f: Tensor,
    rot: Tensor | None,
    tr: Tensor | None,
    plan: FusedPlan,
    turns: Turns = NO_TURNS,
) -> Tensor:
    """The reference engine's build of ``(B, N)`` inputs (``f``: ``(B, F, 3)``), then the pose where
    given: differentiable torch."""
    ref = plan.reference(b.shape[0], b.device)
    build = build_levels if isinstance(ref, LevelPlan) else build_scan
    return _posed(plan, build(ref, nan_negative_bonds(b), a, d, f if f.shape[-2] else None), rot, tr)


def _reference_vjp(
    b: Tensor,
    a: Tensor,
    d: Tensor,
    f: Tensor,
    rot: Tensor | None,
    tr: Tensor | None,
    g: Tensor,
    plan: FusedPlan,
    turns: Turns = NO_TURNS,
) -> tuple[Tensor | None, ...]:
    """Gradients of ``sum(g * build)`` with respect to ``b, a, d, f`` (and ``rot, tr`` where given)."""
    tensors = (b, a, d, f, rot, tr)
    _, vjp = torch.func.vjp(
        lambda *x: _reference_build(*with_none(x, tensors), plan), *(t for t in tensors if t is not None)
    )
    return vjp(g)


def _trig_buffer(keep: bool, args: tuple[Any, ...], use: Callable[..., Tensor]) -> Tensor:
    """`FUSED_BUILD`'s work buffer: the `trig` array of the angles and dihedrals, where the device's
    kernels read one (`KernelOp`'s ``buffers``). Kept for the backward (``keep``: leased from the
    table's workspace to the graph; none for ``torch.func`` wrappers, whose rules make their own),
    else borrowed for the call."""
    b, a, d, f, rot, tr, plan, _ = args
    if not require(gate.device_type(b)).READS_TRIG or (keep and gate.wrapped(a, d)):
        return use(*args)
    return with_turns(keep, plan.topology, _np(a), _np(d), use, args)


def _no_turns(consts: tuple[Any, ...]) -> tuple[Any, ...]:
    """The constants of a vmapped call: the kept trig array was for the unbatched shapes."""
    return (consts[0], NO_TURNS)


#: ``(B, N)`` bonds, angles, dihedrals, ``(B, F, 3)`` fixed positions and the pose (``(B, S, 3, 3)``
#: rotations and ``(B, S, 3)`` translations, or None), then the plan and the kept trig array ->
#: ``(B, N, 3)``; its backward is `FUSED_VJP`.
FUSED_BUILD = KernelOp(
    "FusedBuild",
    kernel=_forward_kernel,
    reference=_reference_build,
    consts=2,
    vjp=lambda primals, grads, plan, turns: with_none(
        FUSED_VJP.apply(*primals, *grads, plan, turns), primals
    ),
    vmap=fold(_no_turns),
    fallback=lambda plan, turns: plan.fallback,
    buffers=_trig_buffer,
    module=__name__,
    doc="The fused forward kernel (`FUSED_BUILD`).",
)

#: The fused backward kernel: ``(b, a, d, f, rot, tr, g, plan, turns)`` -> the input gradients of
#: ``sum(g * FusedBuild(...))`` (of ``b, a, d, f`` and, where given, of the pose); its own
#: derivatives are the reference's graph.
FUSED_VJP = KernelOp(
    "FusedVJP",
    kernel=_backward_kernel,
    reference=_reference_vjp,
    consts=2,
    vmap=fold(_no_turns),
    fallback=lambda plan, turns: plan.fallback,
    module=__name__,
    doc="The fused backward kernel (`FUSED_VJP`).",
)
FusedBuild, FusedVJP = FUSED_BUILD.function, FUSED_VJP.function


# ------------------------------------------------------------------- builder
def build_fused(
    plan: FusedPlan,
    bonds: Tensor,
    angles: Tensor,
    dihedrals: Tensor,
    fixed_xyz: Tensor | None,
    pose: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Cartesian coordinates ``(..., N, 3)`` from broadcast ``(..., N)`` inputs (fused kernels).

    ``pose``: ``(rotation (..., S, 3, 3), translation (..., S, 3))`` of the seeded components, of the
    inputs' batch shape and dtype (checked by the caller): each component is built in its pose, ``x =
    R y + t`` for every atom of a seeded component, NaN where ``det R < 0`` (the CPU kernels write
    it out that way; elsewhere `_geometry.pose_atoms` follows the build).

    Raises:
        RuntimeError: numba is not installed, or the device has no fused backend.
    """
    batch = bonds.shape[:-1]
    n = bonds.shape[-1]
    if not gate.kernel_inputs(bonds, device_type=gate.device_type(bonds)):  # traced, or another dtype
        ref = plan.reference(math.prod(batch), bonds.device)
        build = build_levels if isinstance(ref, LevelPlan) else build_scan
        x = build(ref, nan_negative_bonds(bonds), angles, dihedrals, fixed_xyz)
        return x if pose is None else _posed(plan, x, *pose)
    m = math.prod(batch)
    b, a, d = (t.reshape(m, n) for t in (bonds, angles, dihedrals))
    if fixed_xyz is None:
        f = bonds.new_zeros((m, 0, 3))
    else:
        f = fixed_xyz.to(bonds.dtype).reshape(m, -1, 3)
    rot = tr = None
    if pose is not None:
        s = plan.topology.seed_root.size
        rot, tr = pose[0].reshape(m, s, 3, 3), pose[1].reshape(m, s, 3)
    return FUSED_BUILD.call(b, a, d, f, rot, tr, plan, NO_TURNS).reshape(*batch, n, 3)


def _takes_pose(bonds: Tensor) -> bool:
    """The CPU kernels build in the pose (float32/float64 CPU tensors, numba installed, not traced)."""
    return gate.kernel_inputs(bonds) and available("cpu")


FUSED = Engine("fused", fused_plan, build_fused, nan_bonds=True, configure=configure, takes_pose=_takes_pose)
