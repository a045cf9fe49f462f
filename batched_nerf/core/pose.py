r"""Global pose (rotation + translation) of the seeded components of a table.

[`to_cartesian`][batched_nerf.to_cartesian] builds every *seeded* component (one with
seed rows, no fixed atoms) in its canonical frame: root at the origin, second
seed atom on ``+x``, third seed atom in the ``xy``-plane with ``y > 0``. The
pose of a seeded component is the rigid motion that carries that canonical
frame into the lab frame:

```text
x_lab = R @ x_canonical + t          (per atom of the component)
```

so that ``t`` is the lab position of the root atom and the columns of ``R``
are the lab directions of the canonical ``x``, ``y`` and ``z`` axes
(Gram-Schmidt of the seed atoms). Anchored components (those with fixed atoms)
are built in the lab frame already and have no pose.

Shapes. ``S`` is the number of seeded components (``pose_components(table)``).
When ``S == 1`` (one molecule, with or without anchored components) a pose is
``rotation (..., 3, 3)`` and ``translation (..., 3)``; when ``S > 1`` it is one
pose per seeded component, ``rotation (..., S, 3, 3)`` and ``translation
(..., S, 3)``, components in the order of ``table.components``. The rule is a
static property of the table, so shapes never depend on data.

Rotation chart. The log-determinants of `batched_nerf.learning.logdet` measure rotations with
the Haar measure ``dR`` of total volume ``8 pi^2``. It is flat in the chart
``u = (yaw, s, roll)`` of [`rotation_from_angles`][batched_nerf.rotation_from_angles],
``R = Rz(yaw) Ry(asin s) Rx(roll)`` with ``s = sin(pitch)`` in ``[-1, 1]``
(the analogue of bgflow's ``cos(beta)`` Euler chart), so densities in that
chart need no extra Jacobian factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._geometry import EPS, batch_shape, cross, dot, pose_atoms, safe_norm, safe_normalize
from ..engines.fused import pose as fused_pose
from ..topology.analysis import Topology
from .checks import as_float, cast_like, check_device, check_table, check_xyz
from .table import ConstructionTable


class Pose(NamedTuple):
    """Rotation ``(..., [S,] 3, 3)`` and translation ``(..., [S,] 3)`` of the seeded components."""

    rotation: Tensor
    translation: Tensor


@dataclass(frozen=True)
class PoseInfo:
    """Static description of a table's seeded components (numpy, CPU)."""

    n_seeded: int
    has_second: np.ndarray  # (S,) bool
    has_third: np.ndarray  # (S,) bool
    slot: np.ndarray  # (N,) seeded-component index of each atom, S for anchored atoms
    third_from_second: np.ndarray  # (S,) bool: the third atom's bond reference is the second atom
    anchored: np.ndarray  # (N,) bool: atom of an anchored component (slot S), never moved by a pose
    any_anchored: bool
    seeds: np.ndarray  # (3 S,) root, second and third seed atom of every component, in that order
    # (second and third: the root where the component has fewer atoms)
    complete: bool  # every seeded component has three seed atoms (no lab-axis helpers needed)
    slot_cpu: Tensor  # slot as a CPU int64 tensor (made once)

    @property
    def squeeze(self) -> bool:
        """One seeded component: poses carry no component axis."""
        return self.n_seeded == 1


def _pose_layout(topo: Topology) -> PoseInfo:
    root = topo.seed_root
    has2 = topo.seed_second >= 0
    has3 = topo.seed_third >= 0
    second = np.where(has2, topo.seed_second, root)
    third = np.where(has3, topo.seed_third, root)
    anchored = topo.seed_slot == root.size
    return PoseInfo(
        n_seeded=int(root.size),
        has_second=has2,
        has_third=has3,
        slot=topo.seed_slot,
        third_from_second=topo.third_from_second,
        anchored=anchored,
        any_anchored=bool(anchored.any()),
        seeds=np.concatenate((root, second, third)),
        complete=bool(has2.all() and has3.all()),
        slot_cpu=_long(topo.seed_slot, torch.device("cpu")),
    )


def pose_info(table: ConstructionTable) -> PoseInfo:
    """Seeded-component layout of ``table`` (computed once per table, cached)."""
    return table.cached(_pose_layout, _pose_layout)


def pose_components(table: ConstructionTable) -> int:
    """Number ``S`` of seeded components of ``table`` (components that have a pose).

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf import pose_components
        >>> pose_components(bn.ConstructionTable.chain(5))
        1
    """
    return pose_info(check_table(table)).n_seeded


def _long(a: np.ndarray, device: torch.device) -> Tensor:
    return torch.tensor(a, dtype=torch.long, device=device)  # a copy: topology arrays are read-only


def _pose_shapes(info: PoseInfo) -> tuple[str, str]:
    if info.squeeze:
        return "(..., 3, 3)", "(..., 3)"
    return f"(..., {info.n_seeded}, 3, 3)", f"(..., {info.n_seeded}, 3)"


def apply_pose(
    xyz: Tensor,
    table: ConstructionTable,
    *,
    rotation: Tensor | None = None,
    translation: Tensor | None = None,
) -> Tensor:
    r"""Move each seeded component of ``xyz`` by its pose: ``x -> R x + t``.

    Atoms of anchored components (those containing fixed atoms) are returned
    unchanged. ``to_cartesian(ic, table)`` followed by ``apply_pose`` with the
    output of [`extract_pose`][batched_nerf.extract_pose] reproduces the original coordinates.

    Args:
        xyz: ``(..., N, 3)`` coordinates (any length unit).
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable] of the ``N`` atoms.
        rotation: ``(..., 3, 3)`` (one seeded component) or ``(..., S, 3, 3)``
            rotation matrices applied as ``R @ x``; ``None`` means identity.
            Not checked for orthogonality, but a matrix with ``det R < 0``
            (an improper rotation: a reflection would turn an L molecule into
            its D mirror image) gives NaN for every atom of its component
            (no data-dependent check, so this holds under ``torch.func`` and
            ``torch.compile`` too, without a device synchronisation).
        translation: ``(..., 3)`` or ``(..., S, 3)``; ``None`` means zero.

    Returns:
        ``(..., N, 3)``, batch shape broadcast over ``xyz`` and the pose; dtype
        of ``xyz``.

    Raises:
        TypeError: ``table`` is not a ConstructionTable, or ``rotation`` /
            ``translation`` is a floating tensor of a higher precision than
            ``xyz`` (naming both dtypes; it is not cast down silently), or
            complex or boolean.
        ValueError: ``xyz`` is not ``(..., N, 3)``, the pose has the wrong
            shape, shapes do not broadcast, or the table has no seeded
            component but a pose was given.

    Example:
        >>> import math, torch, batched_nerf as bn
        >>> from batched_nerf import apply_pose
        >>> table = bn.ConstructionTable.chain(3)
        >>> xyz = bn.to_cartesian(torch.ones(3), torch.full((3,), math.pi / 2), torch.zeros(3), table)
        >>> rz = torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
        >>> apply_pose(xyz, table, rotation=rz, translation=torch.tensor([0.0, 0.0, 5.0]))
        tensor([[ 0.,  0.,  5.],
                [ 0.,  1.,  5.],
                [-1.,  1.,  5.]])
    """
    return posed(xyz, table, rotation, translation)


def pose_inputs(
    like: Tensor,
    batch: torch.Size,
    table: ConstructionTable,
    rotation: Tensor | None,
    translation: Tensor | None,
) -> tuple[Tensor, Tensor, torch.Size]:
    """The checked pose of coordinates like ``like`` (its dtype and device) of batch shape ``batch``:
    ``(rot (..., S, 3, 3), tr (..., S, 3), broadcast batch shape)``; the identity or zero for the one
    not given (at least one is).

    Raises:
        ValueError: the table has no seeded component, the pose has the wrong shape, or the shapes do
            not broadcast.
        TypeError: see [`apply_pose`][batched_nerf.apply_pose].
    """
    info = pose_info(table)
    rot_shape, tr_shape = _pose_shapes(info)
    if info.n_seeded == 0:
        raise ValueError(
            "the table has no seeded component (all are anchored by fixed atoms); it has no pose"
        )
    s = info.n_seeded
    dev = like.device
    check_device(
        {k: v for k, v in (("rotation", rotation), ("translation", translation)) if isinstance(v, Tensor)},
        dev,
    )
    if rotation is not None:
        rot = cast_like(rotation, "rotation", like, "the coordinates are")
        if info.squeeze:
            if rot.ndim < 2 or tuple(rot.shape[-2:]) != (3, 3):
                raise ValueError(f"rotation must have shape {rot_shape}, got {tuple(rot.shape)}")
            rot = rot.unsqueeze(-3)
        elif rot.ndim < 3 or tuple(rot.shape[-3:]) != (s, 3, 3):
            raise ValueError(f"rotation must have shape {rot_shape}, got {tuple(rot.shape)}")
    else:
        rot = torch.eye(3, dtype=like.dtype, device=dev).expand(s, 3, 3)
    if translation is not None:
        tr = cast_like(translation, "translation", like, "the coordinates are")
        if info.squeeze:
            if tr.ndim < 1 or tr.shape[-1] != 3:
                raise ValueError(f"translation must have shape {tr_shape}, got {tuple(tr.shape)}")
            tr = tr.unsqueeze(-2)
        elif tr.ndim < 2 or tuple(tr.shape[-2:]) != (s, 3):
            raise ValueError(f"translation must have shape {tr_shape}, got {tuple(tr.shape)}")
    else:
        tr = like.new_zeros((s, 3))
    try:
        batch = batch_shape(batch, rot.shape[:-3], tr.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"xyz {(*batch, table.n_atoms, 3)}, rotation {tuple(rot.shape)} and translation "
            f"{tuple(tr.shape)} do not broadcast"
        ) from None
    return rot, tr, batch


def posed(
    xyz: Tensor, table: ConstructionTable, rotation: Tensor | None, translation: Tensor | None
) -> Tensor:
    """[`apply_pose`][batched_nerf.apply_pose] (the torch operations; the fused CPU build places the
    components in their
    pose itself, `engines.fused.build`)."""
    x = check_xyz(xyz, check_table(table))
    if rotation is None and translation is None:
        return x
    return move(x, table, pose_inputs(x, x.shape[:-2], table, rotation, translation), rotation is not None)


def move(
    x: Tensor, table: ConstructionTable, pose: tuple[Tensor, Tensor, torch.Size], rotated: bool
) -> Tensor:
    """``x`` ``(..., N, 3)`` moved by a checked pose (`pose_inputs`' ``(rot, tr, batch)``) in torch;
    ``rotated``: a rotation was given (an improper one gives NaN; the identity needs no check)."""
    rot, tr, batch = pose
    info = pose_info(table)
    s, dev = info.n_seeded, x.device
    if not info.squeeze:  # R_c x + t_c per atom, NaN for an improper R_c (the kernel's reference)
        rot, tr = rot.expand(*batch, s, 3, 3), tr.expand(*batch, s, 3)
        return pose_atoms(x, rot, tr, _slot(info, dev))
    out = _move_one(x, rot.squeeze(-3), tr.squeeze(-2), info)
    if not rotated:
        return out
    # an improper rotation (det < 0) would mirror its component: NaN, not a silent reflection
    proper = dot(rot[..., 0], cross(rot[..., 1], rot[..., 2])) >= 0  # (..., 1): det as a triple product
    # anchored atoms stay as they are
    ok = proper | torch.as_tensor(info.anchored, device=dev) if info.any_anchored else proper
    return torch.where(ok.unsqueeze(-1), out, out.new_full((), float("nan")))


def _slot(info: PoseInfo, device: torch.device) -> Tensor:
    if device.type == "cpu":
        return info.slot_cpu
    return _long(info.slot, device)


def _move_one(x: Tensor, rot: Tensor, tr: Tensor, info: PoseInfo) -> Tensor:
    """``R x + t`` for the one seeded component: ``x (..., N, 3)``, ``rot (..., 3, 3)``, ``tr (..., 3)``.

    One batched ``3 x 3`` product (``x @ R^T``), no per-atom matrices; atoms of
    anchored components (slot ``S``) are kept as they are.
    """
    out = torch.matmul(x, rot.transpose(-1, -2)) + tr.unsqueeze(-2)
    if not info.any_anchored:
        return out
    return torch.where(torch.as_tensor(info.anchored, device=x.device).unsqueeze(-1), x, out)


def _frame(x0: Tensor, x1: Tensor, x2: Tensor, has2: Tensor | None, has3: Tensor | None) -> Tensor:
    """Gram-Schmidt frame ``(..., S, 3, 3)`` (columns e1, e2, e3) of seed positions ``(..., S, 3)``.

    Always a proper rotation: where a direction is undefined (coincident seed atoms, a third atom
    on the line of the first two, or a missing seed atom: ``has2``/``has3`` False, None for all
    True) it is completed with the lab axis least parallel to ``e1`` (``z`` unless ``|e1_z| >= 0.9``,
    then ``y``); ``e1`` falls back to ``x``, and then ``e2`` to ``y`` (a single atom: the identity).
    """
    ex = torch.tensor([1.0, 0.0, 0.0], dtype=x0.dtype, device=x0.device)
    ey = torch.tensor([0.0, 1.0, 0.0], dtype=x0.dtype, device=x0.device)
    ez = torch.tensor([0.0, 0.0, 1.0], dtype=x0.dtype, device=x0.device)
    u = x1 - x0
    ok1 = ~(safe_norm(u) < EPS)  # NaN stays on the formula's side: NaN in, NaN out
    if has2 is not None:
        ok1 = ok1 & has2
    e1 = torch.where(ok1.unsqueeze(-1), safe_normalize(u, EPS), ex)
    v = x2 - x0
    w = v - dot(v, e1).unsqueeze(-1) * e1
    ok2 = ~(safe_norm(w) < EPS)
    if has3 is not None:
        ok2 = ok2 & has3
    helper = torch.where(ok1.unsqueeze(-1) & (e1[..., 2:3].abs() < 0.9), ez, ey)
    h = helper - dot(helper, e1).unsqueeze(-1) * e1  # |h| > 0.43: never degenerate
    e2 = torch.where(ok2.unsqueeze(-1), safe_normalize(w, EPS), safe_normalize(h, EPS))
    e3 = cross(e1, e2)
    return torch.stack((e1, e2, e3), dim=-1)


def extract_pose(xyz: Tensor, table: ConstructionTable) -> Pose:
    r"""Pose of every seeded component of ``xyz``, the inverse of [`apply_pose`][batched_nerf.apply_pose].

    For a seeded component with root ``o``, second seed atom ``s`` and third
    seed atom ``t`` (Gram-Schmidt, differentiable):

    ```text
    translation = x_o
    e1 = (x_s - x_o) / |x_s - x_o|
    e2 = normalise((x_t - x_o) - ((x_t - x_o) . e1) e1)
    e3 = e1 x e2
    rotation = [e1 | e2 | e3]          (columns; det = +1)
    ```

    so that ``apply_pose(to_cartesian(to_internal(xyz)), rotation, translation)``
    reproduces ``xyz``. The rotation is always proper (``det = +1``): where a
    direction is undefined it is completed by a fixed convention, the same on
    every engine. Where ``|x_s - x_o| < EPS`` (coincident atoms, or no second
    seed atom) ``e1`` is the lab ``x`` axis (and a missing ``e2`` then ``y``:
    a single atom gets the identity); where the part of ``x_t - x_o``
    orthogonal to ``e1`` is shorter than ``EPS`` (a third seed atom on the
    line of the first two, as in a nitrile ``N#C-C``, or no third atom),
    ``e2`` is the part orthogonal to ``e1`` of the lab axis least parallel to
    ``e1`` (``z``, or ``y`` where ``|e1_z| >= 0.9``). The round trip then
    keeps the seed atoms and every distance; only the turn about the seed
    axis of the atoms whose own dihedral references are collinear is left to
    rounding (their dihedral is undefined). Values and gradients stay finite
    (``EPS = 1e-8``), and NaN coordinates give a NaN pose. Where nothing is
    differentiated (no gradient, tangent or ``torch.func`` transform), CPU
    float32/float64 inputs take one numba pass that computes the frame in
    float64 (with numba installed); otherwise the torch operations run in the
    input dtype.

    Args:
        xyz: ``(..., N, 3)`` Cartesian coordinates.
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable] of the ``N`` atoms.

    Returns:
        [`Pose`][batched_nerf.Pose] ``(rotation, translation)``: ``(..., 3, 3)`` and
        ``(..., 3)`` when the table has one seeded component, else
        ``(..., S, 3, 3)`` and ``(..., S, 3)``.

    Raises:
        TypeError: ``table`` is not a ConstructionTable.
        ValueError: ``xyz`` is not ``(..., N, 3)`` or the table has no seeded
            component.

    Example:
        >>> import torch, batched_nerf as bn
        >>> from batched_nerf import apply_pose, extract_pose
        >>> table = bn.ConstructionTable.chain(5)
        >>> xyz = torch.randn(2, 5, 3, dtype=torch.float64)
        >>> ic = bn.to_internal(xyz, table)
        >>> pose = extract_pose(xyz, table)
        >>> pose.rotation.shape, pose.translation.shape
        (torch.Size([2, 3, 3]), torch.Size([2, 3]))
        >>> rebuilt = apply_pose(bn.to_cartesian(*ic, table), table, rotation=pose.rotation,
        ...                      translation=pose.translation)
        >>> torch.allclose(rebuilt, xyz)
        True
    """
    x = check_xyz(xyz, check_table(table))
    info = pose_info(table)
    if info.n_seeded == 0:
        raise ValueError(
            "the table has no seeded component (all are anchored by fixed atoms); it has no pose"
        )
    s = info.n_seeded
    kernel = fused_pose.extract(x, info.seeds, info.has_second, info.has_third, EPS)
    if kernel is not None:  # nothing to differentiate: one numba pass instead of ~35 small torch ops
        rot, x0 = kernel
        return Pose(rot.squeeze(-3), x0.squeeze(-2)) if info.squeeze else Pose(rot, x0)
    if info.squeeze:  # one component: three views, no gather (index_select on dim -2 costs ~70 us)
        x0, x1, x2 = (x.narrow(-2, k, 1) for k in info.seeds.tolist())
    else:
        x0, x1, x2 = x.index_select(-2, _long(info.seeds, x.device)).split(s, dim=-2)  # (..., S, 3) each
    if info.complete:  # every component has its three seed atoms: no missing-atom masks
        rot = _frame(x0, x1, x2, None, None)
    else:
        has2 = torch.as_tensor(info.has_second, device=x.device)
        has3 = torch.as_tensor(info.has_third, device=x.device)
        rot = _frame(x0, x1, x2, has2, has3)
    if info.squeeze:
        return Pose(rot.squeeze(-3), x0.squeeze(-2))
    return Pose(rot, x0)


def rotation_from_angles(angles: Tensor) -> Tensor:
    r"""Rotation matrices from the Haar-flat chart ``(yaw, s, roll)``.

    ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)`` with ``pitch = asin(s)``. The Haar
    measure of rotations is ``dR = d(yaw) ds d(roll)`` in this chart (total
    volume ``2 pi * 2 * 2 pi = 8 pi^2``), which is the measure the pose
    log-determinants of [`pose_log_det`][batched_nerf.pose_log_det] refer to.

    Outside the chart, ``|s| > 1`` (``asin(s)`` undefined), the whole matrix is
    ``NaN``: never a matrix that is no rotation (the formula would give one
    with ``det != 1``); likewise ``NaN`` in any angle gives a ``NaN`` matrix.
    The check is elementwise (``torch.where``, no Python ``if`` on values), so
    it holds under ``vmap`` and ``torch.compile``, and inside the chart values
    and gradients are those of the formula. Squash an unconstrained ``s``
    first (e.g. ``torch.tanh``); ``s = -R[2, 0]`` of
    [`rotation_angles`][batched_nerf.rotation_angles] may leave ``[-1, 1]`` by rounding at gimbal lock
    (``|s| = 1``), so clamp it there.

    Args:
        angles: ``(..., 3)``: yaw in ``(-pi, pi]``, ``s = sin(pitch)`` in
            ``[-1, 1]``, roll in ``(-pi, pi]`` (radians).

    Returns:
        ``(..., 3, 3)`` proper rotation matrices (``NaN`` where ``|s| > 1``).

    Raises:
        ValueError: ``angles`` is not ``(..., 3)``.

    Example:
        >>> import torch
        >>> from batched_nerf import rotation_angles, rotation_from_angles
        >>> u = torch.tensor([0.3, -0.4, 2.0], dtype=torch.float64)
        >>> torch.allclose(rotation_angles(rotation_from_angles(u)), u)
        True
        >>> rotation_from_angles(torch.tensor([0.0, 1.5, 0.0])).isnan().all().item()
        True
    """
    a = as_float(angles, "angles")
    if a.ndim < 1 or a.shape[-1] != 3:
        raise ValueError(f"angles must have shape (..., 3), got {tuple(a.shape)}")
    yaw, s, roll = a.unbind(-1)
    # outside the chart every entry is NaN (each one reads s or c); inside, s itself (gradient 1)
    s = torch.where(s.abs() <= 1.0, s, math.nan)
    c = torch.sqrt((1.0 - s * s).clamp_min(0.0))
    cy, sy, cr, sr = torch.cos(yaw), torch.sin(yaw), torch.cos(roll), torch.sin(roll)
    rows = (
        (cy * c, cy * s * sr - sy * cr, cy * s * cr + sy * sr),
        (sy * c, sy * s * sr + cy * cr, sy * s * cr - cy * sr),
        (-s, c * sr, c * cr),
    )
    return torch.stack([torch.stack(r, dim=-1) for r in rows], dim=-2)


def rotation_angles(rotation: Tensor) -> Tensor:
    r"""Inverse of [`rotation_from_angles`][batched_nerf.rotation_from_angles]: ``(..., 3, 3) -> (..., 3)``
    ``(yaw, s, roll)``.

    ``yaw = atan2(R10, R00)``, ``s = -R20``, ``roll = atan2(R21, R22)``;
    undefined (gimbal lock) at ``s = +-1``.

    Raises:
        ValueError: ``rotation`` is not ``(..., 3, 3)``.

    Example:
        >>> import torch
        >>> from batched_nerf import rotation_angles
        >>> rotation_angles(torch.eye(3))
        tensor([0., -0., 0.])
    """
    r = as_float(rotation, "rotation")
    if r.ndim < 2 or tuple(r.shape[-2:]) != (3, 3):
        raise ValueError(f"rotation must have shape (..., 3, 3), got {tuple(r.shape)}")
    yaw = torch.atan2(r[..., 1, 0], r[..., 0, 0])
    s = -r[..., 2, 0]
    roll = torch.atan2(r[..., 2, 1], r[..., 2, 2])
    return torch.stack((yaw, s, roll), dim=-1)
