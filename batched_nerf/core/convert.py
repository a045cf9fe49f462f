"""Public conversion functions: argument checks, broadcasting and dispatch."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

from .. import engines
from .._geometry import batch_shape, nan_negative_bonds
from ..engines.dispatch import auto_method
from ..engines.fused import inverse as fused_inverse
from ..engines.inverse import InternalCoordinates
from .box import _matrix, _whole
from .checks import DEG, as_box, broadcast_fixed, broadcast_internal, check_device, check_table, check_xyz
from .pose import Pose, extract_pose, move, pose_inputs
from .table import ConstructionTable

__all__ = ["InternalCoordinates", "InverseMethod", "Method", "to_cartesian", "to_internal"]

Method = Literal["auto", "levels", "scan", "fused"]
InverseMethod = Literal["auto", "fused", "torch"]
_METHODS = ("auto", *engines.METHODS)


def to_cartesian(
    bonds: Any,
    angles: Any,
    dihedrals: Any,
    table: ConstructionTable,
    *,
    degrees: bool = False,
    fixed_xyz: Tensor | None = None,
    method: Method = "auto",
    rotation: Tensor | None = None,
    translation: Tensor | None = None,
    accumulate_dtype: torch.dtype | None = None,
) -> Tensor:
    r"""Cartesian coordinates from internal coordinates, for a whole batch at once.

    Atom ``i`` with references ``(b, a, d)`` is placed with the natural
    extension reference frame (NeRF):

    ```text
    e1 = (x_b - x_a) / |x_b - x_a|
    e3 = ((x_a - x_d) x e1) / |(x_a - x_d) x e1|
    e2 = e3 x e1
    x_i = x_b + r (-cos(theta) e1 + sin(theta) cos(phi) e2 + sin(theta) sin(phi) e3)
    ```

    so that ``|x_i - x_b| = r = bonds[..., i]``, the angle ``x_i-x_b-x_a`` is
    ``theta = angles[..., i]`` and the IUPAC dihedral ``(x_i, x_b, x_a, x_d)`` is
    ``phi = dihedrals[..., i]``. Seed atoms of each component are placed at the
    origin, on ``+x`` and in the ``xy``-plane (``y > 0``); fixed atoms are copied
    from ``fixed_xyz``. Entries a seed atom does not use get zero gradient.

    Differentiable to any order, compatible with ``torch.func`` (``vmap``,
    ``jacrev``, ``jacfwd``, ``hessian``) and ``torch.compile``; finite gradients
    at straight angles and collinear references (see
    [`batched_nerf.EPS`][batched_nerf.EPS]). For a compiled builder use
    [`compile_builder`][batched_nerf.compile_builder] (forward everywhere; forward+backward of chains on any
    torch, of other tables on CUDA or CPU torch >= 2.14.1; see
    ``docs/benchmarks.md``).

    Args:
        bonds: ``(..., N)`` bond lengths ``>= 0``, any length unit (a negative
            bond gives NaN for its atom and every atom built from it).
        angles: ``(..., N)`` bond angles, usually in ``[0, pi]``, any real value
            accepted (radians, or degrees with ``degrees=True``). Zero bonds and
            angles of ``0`` or ``pi`` follow ``docs/conventions.md`` ("Degenerate
            inputs"): every engine gives the same result.
        dihedrals: ``(..., N)`` IUPAC dihedrals (radians, or degrees).
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable] of the ``N`` atoms.
        degrees: read angles and dihedrals in degrees.
        fixed_xyz: ``(..., F, 3)`` positions of ``table.fixed`` atoms, in that
            order; required when the table has fixed atoms.
        method: ``"levels"`` (one step per dependency level), ``"scan"``
            (log-depth composition of frames), ``"fused"`` (one compiled kernel
            per pass; CPU, needs numba: ``pip install -e ".[fast]"``) or
            ``"auto"`` (chosen from the table's shape, batch size, device and
            the installed backends: the fused engine on the CPU when numba
            imports; on CUDA the Triton kernels when the call has at least
            4,096 ``(component, sample)`` lanes and no component above 512
            atoms, see [`backends`][batched_nerf.backends] and
            `batched_nerf.engines.gpu_policy`). Under ``"auto"`` a Triton
            compile or launch error warns once and the call (and later ones on
            that device type) takes the scan or level engine; under
            ``"fused"`` it raises.
        rotation: optional global rotation ``(..., 3, 3)`` of each seeded
            component (``(..., S, 3, 3)`` for ``S > 1`` seeded components), applied
            about the component's root atom (see [`apply_pose`][batched_nerf.apply_pose]; an
            improper one, ``det < 0``, gives NaN rather than a mirror image).
        translation: optional ``(..., 3)`` (or ``(..., S, 3)``) position of each
            seeded component's root atom. With ``rotation`` this makes the map
            bijective; [`to_internal`][batched_nerf.to_internal] with ``return_pose=True`` inverts it.
        accumulate_dtype: build in this dtype (e.g. ``torch.float64`` for
            float32 inputs) and cast the result back to the inputs' dtype;
            gradients flow through both casts. Improves float32 accuracy of very
            long chains (see ``docs/benchmarks.md``) at the price of float64
            arithmetic. The fused engine accumulates in float64 whatever the
            inputs (None); ``torch.float32`` makes its GPU (Triton) kernels
            accumulate in float32, for GPUs whose float64 is slow (consumer
            cards: 1/32-1/64 of float32), at errors like the scan engine's in
            float32 (max 7e-7 Angstrom for alanine dipeptide, 2e-4 for a
            1,000-atom chain, 1.3e-3 for 10,000 atoms; ``docs/architecture.md``);
            its CPU kernels accumulate in float64 always.

    Returns:
        ``(..., N, 3)`` with the broadcast leading shape of the inputs, atoms in
        the row order of ``table``; dtype and device of the inputs.

    Raises:
        TypeError: ``table`` is not a ConstructionTable, a non-real dtype, or a
            ``fixed_xyz``, ``rotation`` or ``translation`` tensor of a higher
            precision than the internal coordinates (naming both dtypes).
        ValueError: the last dimension is not ``N``, the inputs do not
            broadcast, ``fixed_xyz`` is missing or not ``(..., F, 3)``, or an
            unknown ``method``.
        RuntimeError: ``method="fused"`` without a backend for the device.
        KernelError: ``method="fused"`` on CUDA and a Triton kernel failed to
            compile or launch (a ``RuntimeError``;
            `batched_nerf.engines.gpu_policy.KernelError`).

    Example:
        >>> import torch, batched_nerf as bn
        >>> table = bn.ConstructionTable.chain(4)
        >>> bonds = torch.full((2, 4), 1.5)
        >>> angles = torch.full((2, 4), 109.5)
        >>> dihedrals = torch.tensor([[0.0, 0.0, 0.0, 60.0], [0.0, 0.0, 0.0, -60.0]])
        >>> xyz = bn.to_cartesian(bonds, angles, dihedrals, table, degrees=True)
        >>> xyz.shape
        torch.Size([2, 4, 3])
        >>> bn.to_internal(xyz, table, degrees=True).dihedrals[:, 3]
        tensor([ 60.0000, -60.0000])
    """
    table = check_table(table)
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    b, a, d = broadcast_internal(bonds, angles, dihedrals, table, degrees)
    check_device({"rotation": rotation, "translation": translation}, b.device)
    fixed = broadcast_fixed(fixed_xyz, table, b)
    if fixed is not None:
        batch = batch_shape(b.shape[:-1], fixed.shape[:-2])
        b, a, d = (t.expand(*batch, t.shape[-1]) for t in (b, a, d))
        fixed = fixed.expand(*batch, *fixed.shape[-2:])
    out_dtype = b.dtype
    if accumulate_dtype is not None:
        if not accumulate_dtype.is_floating_point:
            raise ValueError(f"accumulate_dtype must be a floating dtype, got {accumulate_dtype}")
        b, a, d = (t.to(accumulate_dtype) for t in (b, a, d))
        fixed = None if fixed is None else fixed.to(accumulate_dtype)
    pose = None
    if rotation is not None or translation is not None:  # checked before any work
        pose = pose_inputs(b, b.shape[:-1], table, rotation, translation)
    samples = math.prod(b.shape[:-1])
    auto = method == "auto"
    if auto:
        method = auto_method(table, samples, b.device.type)
    engine = engines.get(method)
    if not engine.nan_bonds:
        b = nan_negative_bonds(b)
    in_kernel = pose is not None and engine.takes_pose(b)  # built in the pose (the fused CPU kernels)
    pose_arg = {}
    if in_kernel:  # the kernels take one batch shape: the inputs and the pose broadcast to it
        rot, tr, batch = pose  # type: ignore[misc]
        b, a, d = (t.expand(*batch, t.shape[-1]) for t in (b, a, d))
        fixed = None if fixed is None else fixed.expand(*batch, *fixed.shape[-2:])
        samples = math.prod(batch)
        pose_arg = {"pose": (rot.expand(*batch, *rot.shape[-3:]), tr.expand(*batch, *tr.shape[-2:]))}
    variant = engine.choose_variant(table.n_atoms, samples)
    plan = engine.configure(table.plan(method, b.device, variant), accumulate_dtype, auto)
    xyz = engine.build(plan, b, a, d, fixed, **pose_arg)
    if pose is not None and not in_kernel:
        xyz = move(xyz, table, pose, rotation is not None)
    return xyz.to(out_dtype)


def to_internal(
    xyz: Any,
    table: ConstructionTable,
    *,
    degrees: bool = False,
    return_pose: bool = False,
    method: InverseMethod = "auto",
    box: Any = None,
) -> InternalCoordinates | tuple[InternalCoordinates, Pose]:
    r"""Internal coordinates of every atom from Cartesian coordinates.

    For atom ``i`` with references ``(b, a, d)``:

    ```text
    bonds[..., i]     = |x_i - x_b|
    angles[..., i]    = atan2(|u x v|, u . v),  u = x_i - x_b, v = x_a - x_b    in [0, pi]
    dihedrals[..., i] = IUPAC dihedral of (x_d, x_a, x_b, x_i)                   in (-pi, pi]
    ```

    Entries an atom does not use (seed and fixed atoms) are ``0``. Finite, with
    finite derivatives, at straight angles, collinear and coincident atoms
    (undefined angles and dihedrals read ``0`` there).

    Args:
        xyz: ``(..., N, 3)`` Cartesian coordinates.
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable] of the ``N`` atoms.
        degrees: return angles and dihedrals in degrees.
        return_pose: also return the global [`Pose`][batched_nerf.Pose] ``(rotation,
            translation)`` of the seeded components, such that
            ``to_cartesian(*ic, table, rotation=R, translation=t)`` reproduces
            ``xyz``.
        method: ``"fused"`` (numba kernels on the CPU, float32/float64; their
            first and second derivatives are kernels too), ``"torch"`` (torch
            operations, any device and dtype) or ``"auto"`` (``"fused"`` where it
            can run, else ``"torch"``). Both give the same values and derivatives
            to rounding; under ``torch.compile`` and nested forward mode
            (``jacfwd(jacfwd(f))``) ``"auto"`` takes the torch operations. The first
            fused call in a new environment compiles the kernels (seconds; cached
            on disk afterwards). On CUDA the forward and vjp are Triton kernels;
            under ``"auto"`` a Triton compile or launch error warns once and the
            torch operations take over (``"fused"`` raises it).
        box: a periodic box, for coordinates wrapped into it (MD trajectories):
            ``(..., 6)`` ``[a, b, c, alpha, beta, gamma]`` (MDAnalysis's
            ``dimensions``: lengths in the unit of ``xyz``, angles in degrees) or
            ``(..., 3, 3)`` box vectors ``H`` in rows (mdtraj / OpenMM), per frame
            (leading dimensions broadcasting against those of ``xyz``) or shared.
            The molecules are made whole first ([`unwrap`][batched_nerf.unwrap]: each atom moved by
            whole box vectors to the minimum image of its bond reference, along the
            table's bond-reference tree), then converted as above; every method
            takes the whole coordinates, and derivatives in ``xyz`` and ``box`` are
            exact (the image shifts are piecewise constant). Limitation: a
            reference vector is recovered only when it is shorter than half the
            smallest perpendicular box width ``min_k |det H| / |h_l x h_m|``
            (half the shortest edge of a rectangular box); a longer one is
            indistinguishable from its shorter image. [`check_box`][batched_nerf.check_box] names the
            rows where the coordinates show it. An impossible box (a length
            ``<= 0``, MDAnalysis's all-zero "no box", a singular matrix) gives
            NaN for its frames.

    Returns:
        [`InternalCoordinates`][batched_nerf.InternalCoordinates] ``(bonds, angles, dihedrals)``, each
        ``(..., N)`` (the broadcast leading shape of ``xyz`` and ``box``); with
        ``return_pose=True`` the pair ``(ic, pose)`` (the pose of the whole
        molecules: root atoms where they are in ``xyz``).

    Raises:
        TypeError: ``table`` is not a ConstructionTable, a non-real dtype, or a
            ``box`` tensor of a higher precision than ``xyz``.
        ValueError: ``xyz`` is not ``(..., N, 3)``, an unknown ``method``,
            ``method="fused"`` off the CPU, for another dtype, without numba or
            under nested forward mode, or a ``box`` whose shape is neither
            ``(..., 6)`` nor ``(..., 3, 3)``, whose leading dimensions do not
            broadcast with those of ``xyz``, or on another device.
        KernelError: ``method="fused"`` on CUDA and a Triton kernel failed to
            compile or launch (a ``RuntimeError``).

    Example:
        >>> import torch, batched_nerf as bn
        >>> xyz = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
        >>> ic = bn.to_internal(xyz, bn.ConstructionTable.chain(4), degrees=True)
        >>> ic.angles.tolist(), ic.dihedrals[3].item()
        ([0.0, 0.0, 90.0, 90.0], 90.0)
        >>> # atom 3 wrapped
        >>> wrapped = xyz - torch.tensor([[0.0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 5]])
        >>> bn.to_internal(wrapped, bn.ConstructionTable.chain(4), box=[5.0, 5, 5, 90, 90, 90]).bonds.tolist()
        [0.0, 1.0, 1.0, 1.0]
    """
    x = check_xyz(xyz, check_table(table))
    if box is not None:
        x = _whole(x, _matrix(as_box(box, x)), table)
    plan = table.plan("inverse", x.device)
    if fused_inverse.use_fused(method, x):
        ic = fused_inverse.internal_from_xyz(plan, x, fallback=method == "auto")
    else:
        ic = engines.get("inverse").build(plan, x)
    if degrees:
        ic = InternalCoordinates(ic.bonds, ic.angles / DEG, ic.dihedrals / DEG)
    if return_pose:
        return ic, extract_pose(x, table)
    return ic
