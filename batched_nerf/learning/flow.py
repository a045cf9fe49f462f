r"""Internal-coordinate layer for normalising flows (a bijection with exact log-det).

[`InternalCoordinateTransform`][batched_nerf.InternalCoordinateTransform] maps Cartesian coordinates to the
informative internal coordinates of a [`ConstructionTable`][batched_nerf.ConstructionTable]
(plus, optionally, the global pose and the fixed atoms) and back, with the
log-determinant of each direction computed in closed form (`batched_nerf.learning.logdet`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from .._geometry import batch_shape
from ..core.checks import check_table, check_tensor
from ..core.convert import to_cartesian, to_internal
from ..core.pose import pose_info
from ..core.table import ConstructionTable
from .entries import EntryLayout, gather, spread
from .logdet import _masks, entries_log_det, entry_weights, log_det_jacobian

_LOG_PI = math.log(math.pi)
_LOG_2PI = math.log(2.0 * math.pi)
_KINDS = ("bond", "angle", "dihedral")


class FlowCoordinates(NamedTuple):
    """Output of [`InternalCoordinateTransform.forward`][batched_nerf.InternalCoordinateTransform.forward].

    ``bonds (..., n_bonds)``, ``angles (..., n_angles)``, ``dihedrals
    (..., n_dihedrals)`` (entries ordered by atom index, see the transform's
    ``bond_atoms`` etc.), ``rotation``/``translation`` (``None`` unless
    ``pose=True``; shapes as in [`batched_nerf.core.pose.extract_pose`][batched_nerf.extract_pose]),
    ``fixed_xyz (..., F, 3)`` (``None`` without fixed atoms) and ``log_det
    (...)`` = ``log|det d(outputs)/d(xyz)|``.
    """

    bonds: Tensor
    angles: Tensor
    dihedrals: Tensor
    rotation: Tensor | None
    translation: Tensor | None
    fixed_xyz: Tensor | None
    log_det: Tensor


class InternalCoordinateTransform(nn.Module):
    r"""Bijection Cartesian <-> internal coordinates with exact log-determinants.

    Forward (``xyz -> z``, like bgflow's ``_forward``):

    ```text
    z = (bonds, angles, dihedrals [, rotation, translation] [, fixed_xyz])
    log_det = log|det dz/dx| = -log_det_jacobian(ic, pose=pose) - normalisation
    ```

    Inverse (``z -> xyz``) returns ``log|det dx/dz|``; for the same point the two
    log-dets sum to zero. Only informative entries are kept: ``bonds`` of
    atoms with a bond reference, ``angles`` of atoms with an angle reference,
    ``dihedrals`` of atoms with a dihedral reference (``3 n - 6`` numbers for a
    seeded component of ``n`` atoms), each ordered by atom index.

    * ``pose=True``: the global pose of each seeded component is part of the
      bijection (``3 N`` Cartesian coordinates of non-fixed atoms in, ``3 N``
      numbers out); the rotation is a matrix and its measure the Haar
      measure, flat in the chart of [`batched_nerf.core.pose.rotation_angles`][batched_nerf.rotation_angles].
    * ``pose=False``: the 6 rigid-body degrees of freedom per seeded
      component are dropped; ``log_det`` is that of the square map between
      the ICs and the free coordinates of the canonical frame (exact when
      ``xyz`` is in that frame, e.g. the output of ``inverse``).
    * fixed atoms pass through unchanged (log-det contribution 0) as
      ``fixed_xyz``.
    * ``normalize_angles=True``: ``angles / pi`` in ``[0, 1]`` and
      ``(dihedrals + pi) / (2 pi)`` in ``(0, 1]``, adding ``-log(pi)`` per
      angle and ``-log(2 pi)`` per dihedral to the forward log-det (bgflow's
      convention).

    Index buffers (``bond_atoms``, ``angle_atoms``, ``dihedral_atoms``,
    ``fixed_atoms``) move with ``.to()``; there are no parameters. Pure
    tensor code: works under ``torch.func`` (``vmap``, ``jacrev``). The
    buffers are made outside ``torch.inference_mode`` even when the layer is
    built inside it, so a layer made during a validation pass still trains.

    Args:
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable].
        pose: include the global pose (needs a seeded component).
        normalize_angles: map angles and dihedrals into ``(0, 1)``.
        method: engine of [`to_cartesian`][batched_nerf.to_cartesian].

    Raises:
        TypeError: ``table`` is not a ConstructionTable.
        ValueError: ``pose=True`` for a table without a seeded component.

    Example:
        >>> import torch, batched_nerf as bn
        >>> from batched_nerf import InternalCoordinateTransform
        >>> flow = InternalCoordinateTransform(bn.ConstructionTable.chain(5), pose=True)
        >>> xyz = torch.randn(8, 5, 3, dtype=torch.float64)
        >>> z = flow(xyz)
        >>> z.bonds.shape, z.angles.shape, z.dihedrals.shape, z.rotation.shape
        (torch.Size([8, 4]), torch.Size([8, 3]), torch.Size([8, 2]), torch.Size([8, 3, 3]))
        >>> back, log_det = flow.inverse(z.bonds, z.angles, z.dihedrals, z.rotation, z.translation)
        >>> torch.allclose(back, xyz), bool((log_det + z.log_det).abs().max() < 1e-9)
        (True, True)
    """

    bond_atoms: Tensor
    angle_atoms: Tensor
    dihedral_atoms: Tensor
    fixed_atoms: Tensor

    def __init__(
        self,
        table: ConstructionTable,
        *,
        pose: bool = False,
        normalize_angles: bool = False,
        method: str = "auto",
    ) -> None:
        super().__init__()
        self.table = check_table(table)
        refs = table.topology.refs
        if pose and pose_info(table).n_seeded == 0:
            raise ValueError(
                "pose=True needs a seeded component, but every component is anchored by fixed atoms"
            )
        self.pose = bool(pose)
        self.normalize_angles = bool(normalize_angles)
        self.method = method
        # index buffers made outside inference mode: a layer first built in a validation
        # pass (under torch.inference_mode) must still train afterwards
        with torch.inference_mode(False):
            for name, col in (("bond_atoms", 0), ("angle_atoms", 1), ("dihedral_atoms", 2)):
                self.register_buffer(
                    name, torch.as_tensor(np.flatnonzero(refs[:, col] >= 0)), persistent=False
                )
            self.register_buffer("fixed_atoms", table.fixed, persistent=False)
        # build the CPU plans eagerly: the first build must not happen inside a torch.func transform
        for kind in ("levels", "inverse"):
            table.plan(kind)
        # entries that are a few runs of consecutive atoms are sliced and concatenated, not
        # gathered and scattered (EntryLayout.runs); the log-det is summed over the entries directly
        self._runs = tuple(EntryLayout.of(getattr(self, f"{k}_atoms"), table.n_atoms).runs for k in _KINDS)
        self._log_det_terms = tuple(
            entry_weights(table, self.pose, kind, getattr(self, f"{kind[:-1]}_atoms").numpy())
            for kind in ("bonds", "angles")
        )
        m = _masks(table)
        self._n_angles = int(self.angle_atoms.numel())
        self._n_dihedrals = int(self.dihedral_atoms.numel())
        self._n_angular = m.n_angular

    @property
    def n_bonds(self) -> int:
        """Number of bond entries."""
        return int(self.bond_atoms.numel())

    @property
    def n_angles(self) -> int:
        """Number of angle entries."""
        return self._n_angles

    @property
    def n_dihedrals(self) -> int:
        """Number of dihedral entries."""
        return self._n_dihedrals

    def _norm_log_det(self) -> float:
        if not self.normalize_angles:
            return 0.0
        return self._n_angles * _LOG_PI + self._n_dihedrals * _LOG_2PI

    def forward(self, xyz: Tensor) -> FlowCoordinates:
        """Cartesian ``(..., N, 3)`` -> [`FlowCoordinates`][batched_nerf.FlowCoordinates] (see the class
        docstring).

        Raises:
            ValueError: ``xyz`` is not ``(..., N, 3)``.
        """
        rotation = translation = None
        if self.pose:  # one kernel for both, and the pose before the torch operations below
            ic, (rotation, translation) = to_internal(xyz, self.table, return_pose=True)
        else:
            ic = to_internal(xyz, self.table)
        bonds, angles, dihedrals = (self._entries(v, k) for v, k in zip(ic, _KINDS))
        ld = self._log_det(bonds, angles)
        if ld is None:
            ld = log_det_jacobian(ic.bonds, ic.angles, ic.dihedrals, self.table, pose=self.pose)
        ld = -ld
        if self.normalize_angles:
            angles = angles / math.pi
            dihedrals = (dihedrals + math.pi) / (2.0 * math.pi)
            ld = ld - self._norm_log_det()
        fixed = xyz.index_select(-2, self.fixed_atoms) if self.table.n_fixed else None
        return FlowCoordinates(bonds, angles, dihedrals, rotation, translation, fixed, ld)

    def inverse(
        self,
        bonds: Tensor,
        angles: Tensor,
        dihedrals: Tensor,
        rotation: Tensor | None = None,
        translation: Tensor | None = None,
        fixed_xyz: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Internal coordinates (as returned by [`forward`][batched_nerf.InternalCoordinateTransform.forward])
        -> ``(xyz (..., N, 3), log_det (...))``.

        ``log_det = log|det dx/dz|``, the negative of the forward one.

        Raises:
            TypeError: ``bonds``, ``angles`` or ``dihedrals`` is not a tensor
                (a numpy array: convert it with ``torch.as_tensor``).
            ValueError: an input is not ``(..., n_bonds)``, ``(..., n_angles)``
                or ``(..., n_dihedrals)``; the pose is missing although
                ``pose=True`` (or given although ``pose=False``); the shapes
                do not broadcast; ``fixed_xyz`` is missing or misshapen.
        """
        for t, name, k in (
            (bonds, "bonds", self.n_bonds),
            (angles, "angles", self.n_angles),
            (dihedrals, "dihedrals", self.n_dihedrals),
        ):
            if check_tensor(t, name).ndim < 1 or t.shape[-1] != k:
                raise ValueError(f"{name} must have shape (..., {k}), got {tuple(t.shape)}")
        if self.pose and (rotation is None or translation is None):
            raise ValueError("pose=True: inverse needs rotation and translation")
        if not self.pose and (rotation is not None or translation is not None):
            raise ValueError("pose=False: inverse takes no rotation or translation")
        if self.normalize_angles:
            angles = angles * math.pi
            dihedrals = dihedrals * (2.0 * math.pi) - math.pi
        try:
            batch = batch_shape(bonds.shape[:-1], angles.shape[:-1], dihedrals.shape[:-1])
        except RuntimeError:
            raise ValueError(
                f"bonds {tuple(bonds.shape)}, angles {tuple(angles.shape)} and dihedrals "
                f"{tuple(dihedrals.shape)} do not broadcast"
            ) from None
        dtype = torch.promote_types(torch.promote_types(bonds.dtype, angles.dtype), dihedrals.dtype)
        entries = tuple(v.to(dtype).expand(*batch, -1) for v in (bonds, angles, dihedrals))
        b, a, d = (self._full(v, k) for v, k in zip(entries, _KINDS))
        ld = self._log_det(entries[0], entries[1])
        if ld is None:
            ld = log_det_jacobian(b, a, d, self.table, pose=self.pose)
        xyz = to_cartesian(
            b, a, d, self.table, fixed_xyz=fixed_xyz, method=self.method,  # type: ignore[arg-type]
            rotation=rotation, translation=translation,
        )  # fmt: skip
        ld = ld + self._norm_log_det()
        return xyz, ld.expand(xyz.shape[:-2])

    def _layout(self, kind: str) -> EntryLayout:
        """The entries of ``kind`` (their index on the buffers' device)."""
        runs = self._runs[_KINDS.index(kind)]
        return EntryLayout(getattr(self, f"{kind}_atoms"), runs, self.table.n_atoms)

    def _entries(self, values: Tensor, kind: str) -> Tensor:
        """``(..., N)`` per-atom values -> ``(..., E)`` entries of ``kind``."""
        return gather(values, self._layout(kind))

    def _full(self, entries: Tensor, kind: str) -> Tensor:
        """``(..., E)`` entries of ``kind`` -> ``(..., N)`` per-atom values (zero where none)."""
        return spread(entries, self._layout(kind))

    def _log_det(self, bonds: Tensor, angles: Tensor) -> Tensor | None:
        """[`log_det_jacobian`][batched_nerf.log_det_jacobian] from the entries (``None``: not expressible on
        them)."""
        if None in self._log_det_terms:
            return None
        return entries_log_det(bonds, angles, self._log_det_terms)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return f"{self.table!r}, pose={self.pose}, normalize_angles={self.normalize_angles}"
