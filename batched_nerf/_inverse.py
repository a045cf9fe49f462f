"""Inverse map: internal coordinates of every atom from Cartesian coordinates."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._geometry import angle, dihedral, distance
from ._plan import InversePlan


class InternalCoordinates(NamedTuple):
    """Bond lengths, bond angles and dihedrals, each ``(..., N)``.

    Angles and dihedrals are in radians unless ``degrees=True`` was asked for;
    entries an atom does not use (seed and fixed atoms) are ``0``.
    """

    bonds: Tensor
    angles: Tensor
    dihedrals: Tensor


def internal_from_xyz(plan: InversePlan, xyz: Tensor) -> InternalCoordinates:
    """``(..., N, 3) -> 3 x (..., N)``, all atoms in one vectorised gather.

    Missing references point at the atom itself; the resulting zero vectors
    give finite values and derivatives (see :mod:`._geometry`), which the static
    masks then replace by exact zeros.
    """
    n = xyz.shape[-2]
    ref = xyz.index_select(-2, plan.refs.reshape(-1)).unflatten(-2, (n, 3))
    xb, xa, xd = ref.unbind(-2)
    zero = xyz.new_zeros(())
    bonds = torch.where(plan.has_bond, distance(xyz, xb), zero)
    angles = torch.where(plan.has_angle, angle(xyz, xb, xa), zero)
    dihedrals = torch.where(plan.has_dihedral, dihedral(xd, xa, xb, xyz), zero)
    return InternalCoordinates(bonds, angles, dihedrals)
