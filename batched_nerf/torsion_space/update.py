"""Torsion updates of ragged batches: every rotatable bond of every molecule turned in one call.

The peers' loop over molecules and bonds (DiffDock's
``modify_conformer_torsion_angles``, torsional diffusion's ``perturb_batch``)
as one pass: the molecules' [`RotorTable`][batched_nerf.RotorTable]s packed
(`packed`), the nested sides turned rigidly (`turns`), overlapping sides
through an internal-coordinate round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._geometry import centered, superposing_rotation
from ..core.convert import to_cartesian, to_internal
from ..runtime.torch_compat import values_of
from .packed import _Packed, _packed, _Padded
from .rotors import RotorTable
from .turns import turned

__all__ = ["update_torsions"]


def _molecules(
    rotors: RotorTable | Sequence[RotorTable], batch: Any, xyz: Tensor
) -> tuple[tuple[RotorTable, ...], bool]:
    """The rotor table of every molecule; whether the layout is the flat (PyG) one."""
    if isinstance(rotors, RotorTable) and batch is None:
        return (rotors,), False
    if isinstance(rotors, RotorTable):
        many: list[RotorTable] | None = None
    else:
        if isinstance(rotors, (str, bytes)) or not isinstance(rotors, Sequence):
            raise TypeError(f"rotors must be a RotorTable or a sequence of them, got {type(rotors).__name__}")
        many = list(rotors)
        if not many:
            raise ValueError("rotors is empty: give one RotorTable per molecule")
        for m, r in enumerate(many):
            if not isinstance(r, RotorTable):
                raise TypeError(f"rotors[{m}] (molecule {m}) must be a RotorTable, got {type(r).__name__}")
    total = xyz.shape[-2]
    if batch is None:
        assert many is not None
        return tuple(many), True
    if (
        not isinstance(batch, Tensor)
        or batch.dim() != 1
        or batch.dtype.is_floating_point
        or batch.dtype == torch.bool
    ):
        raise TypeError("batch must be a 1-D integer tensor: the molecule of each atom (PyG's Data.batch)")
    if batch.shape[0] != total:
        raise ValueError(f"batch has {batch.shape[0]} entries, but xyz has {total} atoms")
    b = values_of(batch, "batch").astype(np.int64)
    if len(b) and (np.diff(b) < 0).any():
        k = int(np.argmax(np.diff(b) < 0))
        raise ValueError(
            f"batch must be sorted (the atoms of each molecule together, molecules in order): "
            f"batch[{k}] = {b[k]} > batch[{k + 1}] = {b[k + 1]}"
        )
    if len(b) and b[0] < 0:
        raise ValueError(f"batch holds a negative molecule index {b[0]}")
    if many is None:
        assert isinstance(rotors, RotorTable)
        n_mol = int(b[-1]) + 1 if len(b) else 0
        many = [rotors] * n_mol
    counts = np.bincount(b, minlength=len(many))
    if len(counts) > len(many):
        raise ValueError(f"batch names molecule {len(counts) - 1}, but rotors holds {len(many)} molecules")
    for m, (r, c) in enumerate(zip(many, counts.tolist())):
        if c != r.n_atoms:
            raise ValueError(f"molecule {m} has {c} atoms in batch, but its RotorTable has {r.n_atoms}")
    if not many:
        raise ValueError("batch is empty: no molecule to update")
    return tuple(many), True


def _prepare(xyz: Any, rotors: RotorTable | Sequence[RotorTable], batch: Any) -> tuple[_Packed, bool]:
    """The packed rotor tables of checked ``xyz``; whether the layout is the flat (PyG) one."""
    if not isinstance(xyz, Tensor):
        raise TypeError(f"xyz must be a tensor, got {type(xyz).__name__}")
    if xyz.dim() < 2 or xyz.shape[-1] != 3:
        raise ValueError(f"xyz must be (..., N, 3), got shape {tuple(xyz.shape)}")
    molecules, flat = _molecules(rotors, batch, xyz)
    packed = _packed(molecules)
    if xyz.shape[-2] != packed.total_atoms:
        raise ValueError(
            f"xyz has {xyz.shape[-2]} atoms, but the molecules have {packed.total_atoms}"
            + (f" (per molecule: {packed.n_atoms})" if flat else "")
        )
    return packed, flat


def _per_bond(values: Any, name: str, packed: _Packed, xyz: Tensor, flat: bool) -> Tensor:
    """``values`` ``(..., sum R)`` (radians) checked against the molecules' bonds and ``xyz``'s batch."""
    if not isinstance(values, Tensor):
        values = torch.as_tensor(values, dtype=xyz.dtype, device=xyz.device)
    if values.is_complex() or not values.dtype.is_floating_point:
        raise TypeError(f"{name} must be a real floating tensor (radians), got dtype {values.dtype}")
    if values.dim() < 1 or values.shape[-1] != packed.total_bonds:
        got = values.shape[-1] if values.dim() else "a scalar"
        raise ValueError(
            f"{name} has {got} values, but the molecules have {packed.total_bonds} rotatable bonds"
            + (f" (per molecule: {packed.n_bonds})" if flat else "")
        )
    if tuple(values.shape[:-1]) != tuple(xyz.shape[:-2]):
        raise ValueError(
            f"{name} of shape {tuple(values.shape)} need the leading shape {tuple(xyz.shape[:-2])} of xyz"
        )
    return values


def update_torsions(
    xyz: Tensor,
    rotors: RotorTable | Sequence[RotorTable],
    updates: Any,
    *,
    batch: Tensor | None = None,
    align: bool = False,
) -> Tensor:
    r"""Turn every rotatable bond of a batch of molecules by its update, in one call.

    The operation DiffDock (``modify_conformer_torsion_angles``) and torsional
    diffusion (``perturb_batch``) loop over bonds and molecules for: for each
    bond ``(u, v)`` of ``rotors``, the atoms on ``v``'s side (``rotors.moving``)
    turn by the update ``tau`` (radians) about the bond, right-handed about the
    axis ``x_u - x_v`` (the peers' convention: the axis points from the moving
    side inwards, Rodrigues' rotation by ``tau``). In IUPAC terms, the dihedral
    ``p-u-v-m`` of any atom ``p`` bonded to ``u`` on the fixed side and any
    ``m`` bonded to ``v`` on the moving side changes by ``-tau``:

    ```text
    phi'(p, u, v, m) = phi(p, u, v, m) - tau        (IUPAC dihedral, radians)
    ```

    Bond lengths, bond angles, ring geometry and chirality are untouched. The
    updates of several bonds compose as the peers' sequential loop does (their
    result does not depend on the order of the bonds when the moving sides
    leave a common part unmoved, as with the default ``moving="smaller"``), and
    the atoms no bond moves (``rotors.fixed``) stay exactly in place when
    ``rotors.keeps_fixed`` (always for the default sides); otherwise the result
    equals the sequential update up to a rigid motion of each molecule.

    Computed as rigid turns, each side rotated about its bond's axis in the
    input (Rodrigues), nested sides composed (`turns`: one numba pass, its
    backward another; torch operations under transforms and beyond): twice
    differentiable in ``xyz`` and ``updates``, on any device, and exact where
    a fixed-side neighbour is collinear with the bond. Sides that overlap
    without nesting (possible with ``moving="larger"`` or given bonds) take
    ``to_internal(..., return_pose=True)``, ``-tau`` on the torsion rows and
    ``to_cartesian``. A bond of zero length turns nothing.

    Layouts:

    * one molecule, or copies of it: ``rotors`` a [`RotorTable`][batched_nerf.RotorTable],
      ``xyz`` ``(..., N, 3)``, ``updates`` ``(..., R)`` with the same leading shape;
    * different molecules (PyTorch Geometric's): ``xyz`` ``(T, 3)`` (or
      ``(..., T, 3)``) with the atoms of molecule 0 first, then molecule 1,
      ...; ``rotors`` one [`RotorTable`][batched_nerf.RotorTable] per molecule
      (or one shared by all, then ``batch`` says how many); ``batch`` the
      sorted ``(T,)`` molecule index of each atom (optional with a sequence
      of rotors: then only their atom counts split ``xyz``); ``updates``
      ``(..., sum R_m)``, the molecules' bonds concatenated in molecule order.

    The packed table of a sequence of rotor tables is cached (by the identity
    of the tables; keep them, e.g. from
    [`RotorTable.from_connectivity`][batched_nerf.RotorTable.from_connectivity]).

    Args:
        xyz: ``(..., N, 3)`` or ``(..., T, 3)`` coordinates (any length unit).
        rotors: a [`RotorTable`][batched_nerf.RotorTable] or one per molecule.
        updates: ``(..., R)`` torsion updates in radians (tensor or array-like;
            a non-finite update makes the atoms its bond moves NaN, other
            molecules are unaffected).
        batch: optional sorted ``(T,)`` integer molecule index of each atom.
        align: superpose each updated molecule onto its input (all atoms,
            equal weights, the best rotation and translation: Horn's
            quaternion, no reflection), as DiffDock's ``modify_conformer``
            does after its torsion update; otherwise the unmoved atoms stay in
            place (see above). With it a non-finite update makes its whole
            molecule NaN.

    Returns:
        The updated coordinates, the shape and dtype of ``xyz``.

    Raises:
        TypeError: ``rotors`` (or one of them, named by molecule) is not a
            [`RotorTable`][batched_nerf.RotorTable], ``batch`` is not a 1-D
            integer tensor, or ``updates`` is not real.
        ValueError: ``xyz`` does not have the molecules' atom count, ``batch``
            is not sorted (naming the first decrease), does not match ``xyz``
            or gives a molecule another atom count than its table (naming the
            molecule), or ``updates`` has another number of values than there
            are rotatable bonds (naming the counts per molecule) or another
            leading shape than ``xyz``.

    Example:
        >>> import math, torch, batched_nerf as bn
        >>> butane = [(0, 1), (1, 2), (2, 3)]
        >>> rotors = bn.RotorTable.from_connectivity(butane, 4)
        >>> rotors.bonds.tolist()  # atom 0 turns about the axis x_2 - x_1 (+x)
        [[2, 1]]
        >>> xyz = torch.tensor([[1.0, 1, 0], [1, 0, 0], [2, 0, 0], [2, 1, 0]])  # cis, phi = 0
        >>> new = bn.update_torsions(xyz, rotors, torch.tensor([math.pi / 2]))
        >>> (new.round(decimals=6) + 0.0).tolist()  # phi = -90 deg
        [[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [2.0, 1.0, 0.0]]
        >>> pyg = torch.cat([xyz, xyz[:3]])         # butane, then propane: no rotatable bond
        >>> batch = torch.tensor([0, 0, 0, 0, 1, 1, 1])
        >>> propane = bn.RotorTable.from_connectivity([(0, 1), (1, 2)], 3)
        >>> bn.update_torsions(pyg, [rotors, propane], torch.tensor([math.pi]), batch=batch).shape
        torch.Size([7, 3])
    """
    packed, flat = _prepare(xyz, rotors, batch)
    updates = _per_bond(updates, "updates", packed, xyz, flat)
    if packed.turns is not None:
        new = turned(xyz, updates.to(xyz.dtype), packed.turns)
        return _superposed(new, xyz, packed.padded) if align else new
    ic, pose = to_internal(xyz, packed.table, return_pose=True)
    rows = packed.rows.to(xyz.device)
    shift = updates.to(ic.dihedrals.dtype)[..., packed.row_bonds.to(xyz.device)]
    dihedrals = ic.dihedrals.index_add(-1, rows, -shift)
    new = to_cartesian(
        ic.bonds, ic.angles, dihedrals, packed.table, rotation=pose.rotation, translation=pose.translation
    )
    return _superposed(new, xyz, packed.padded) if align else new


def _superposed(mobile: Tensor, reference: Tensor, padded: _Padded) -> Tensor:
    """Each molecule of ``mobile`` ``(..., T, 3)`` rigidly superposed onto ``reference``."""
    mask = padded.atom_mask.to(mobile.device)
    a, _ = centered(padded.gather(mobile), mask)
    b, centroid = centered(padded.gather(reference.to(mobile.dtype)), mask)
    turned = a @ superposing_rotation(a, b).transpose(-1, -2) + centroid
    return padded.scatter(turned)
