"""Inverse map: internal coordinates of every atom from Cartesian coordinates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._geometry import angle, dihedral, distance
from ..topology.analysis import Topology
from .base import Engine, Movable, as_long

__all__ = ["INVERSE", "InternalCoordinates", "InversePlan", "internal_from_xyz", "inverse_plan"]


class InternalCoordinates(NamedTuple):
    """Bond lengths, bond angles and dihedrals, each ``(..., N)``.

    Angles and dihedrals are in radians unless ``degrees=True`` was asked for;
    entries an atom does not use (seed and fixed atoms) are ``0``.
    """

    bonds: Tensor
    angles: Tensor
    dihedrals: Tensor


@dataclass(frozen=True)
class InversePlan(Movable):
    """Index gathers of [`to_internal`][batched_nerf.to_internal]: ``-1`` replaced by the atom itself."""

    refs: Tensor  # (N, 3) safe indices
    has_bond: Tensor  # (N,) bool
    has_angle: Tensor  # (N,) bool
    has_dihedral: Tensor  # (N,) bool


def inverse_plan(topo: Topology, variant: int = 1) -> InversePlan:
    """Reference gathers of ``topo`` with ``-1`` pointing at the atom itself."""
    refs = topo.refs
    safe = np.where(refs >= 0, refs, np.arange(len(refs))[:, None])
    return InversePlan(
        refs=as_long(safe),
        has_bond=torch.as_tensor(refs[:, 0] >= 0),
        has_angle=torch.as_tensor(refs[:, 1] >= 0),
        has_dihedral=torch.as_tensor(refs[:, 2] >= 0),
    )


def internal_from_xyz(plan: InversePlan, xyz: Tensor) -> InternalCoordinates:
    """``(..., N, 3) -> 3 x (..., N)``, all atoms in one vectorised gather.

    Missing references point at the atom itself; the resulting zero vectors
    give finite values and derivatives (see `batched_nerf._geometry`),
    which the static masks then replace by exact zeros.
    """
    n = xyz.shape[-2]
    ref = xyz.index_select(-2, plan.refs.reshape(-1)).unflatten(-2, (n, 3))
    xb, xa, xd = ref.unbind(-2)
    zero = xyz.new_zeros(())
    bonds = torch.where(plan.has_bond, distance(xyz, xb), zero)
    angles = torch.where(plan.has_angle, angle(xyz, xb, xa), zero)
    dihedrals = torch.where(plan.has_dihedral, dihedral(xd, xa, xb, xyz), zero)
    return InternalCoordinates(bonds, angles, dihedrals)


INVERSE = Engine("inverse", inverse_plan, internal_from_xyz)
