"""Block 0 of every engine: fixed atoms, roots and seed atoms, in closed form.

Block 0 lists fixed atoms (in ``fixed`` order), roots, second and third seed
atoms, in that order. Roots sit at the origin, second atoms at ``(r, 0, 0)``,
third atoms in the ``xy``-plane with ``y > 0`` (see ``docs/conventions.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..topology.analysis import ROOT, SECOND, THIRD, Topology
from .base import Movable, as_long

__all__ = ["SeedPlan", "seed_atoms", "seed_block", "seed_plan", "seed_positions"]


@dataclass(frozen=True)
class SeedPlan(Movable):
    """Closed-form placement of fixed, root and seed atoms (block 0 of every engine)."""

    n_fixed: int
    n_roots: int
    second: Tensor  # (S2,) atom index of second seed atoms
    third: Tensor  # (S3,) atom index of third seed atoms
    third_from_second: Tensor  # (S3,) bool: the bond ref is the second atom (else the root)
    third_second_slot: Tensor  # (S3,) index into `second` of the component's second atom
    atoms: Tensor  # (n0,) atom index of every block-0 slot


def seed_atoms(topo: Topology) -> np.ndarray:
    """``(n0,)`` atom index of every block-0 slot: fixed atoms, roots, second, third seeds."""
    roots = np.flatnonzero((topo.kind == ROOT) & ~topo.is_fixed)
    second = np.flatnonzero(topo.kind == SECOND)
    third = np.flatnonzero(topo.kind == THIRD)
    return np.concatenate([topo.fixed, roots, second, third]).astype(np.int64)


def seed_plan(topo: Topology) -> SeedPlan:
    """The block-0 layout of ``topo`` as index tensors."""
    second = np.flatnonzero(topo.kind == SECOND)
    third = np.flatnonzero(topo.kind == THIRD)
    slot_of_second = np.full(topo.n_atoms, -1, dtype=np.int64)
    slot_of_second[second] = np.arange(second.size)
    # the component's second seed atom, through the seeded-component slot of the third atom
    second_of_third = topo.seed_second[topo.seed_slot[third]]
    return SeedPlan(
        n_fixed=topo.n_fixed,
        n_roots=int(((topo.kind == ROOT) & ~topo.is_fixed).sum()),
        second=as_long(second),
        third=as_long(third),
        third_from_second=torch.as_tensor(topo.refs[third, 0] == second_of_third),
        third_second_slot=as_long(slot_of_second[second_of_third]),
        atoms=as_long(seed_atoms(topo)),
    )


def seed_positions(
    plan: SeedPlan,
    r2: Tensor,
    r3: Tensor,
    t3: Tensor,
    fixed_xyz: Tensor | None,
    batch: tuple[int, ...],
    rows: bool = False,
) -> Tensor:
    """Positions of block 0 from the seed atoms' bonds and angles, in either layout.

    Roots sit at the origin, second atoms at ``(r, 0, 0)``, third atoms in the
    ``xy``-plane with ``y > 0``: ``x_b + r (s cos(theta), sin(theta), 0)`` with
    ``s = +1`` when the bond reference is the root and ``-1`` when it is the
    second atom (whose position is ``(r_b, 0, 0)``).

    Args:
        plan: the `SeedPlan`.
        r2: bonds of the second seed atoms, ``(..., S2)`` (``(S2, B)`` with ``rows``).
        r3, t3: bonds and angles of the third seed atoms, ``(..., S3)`` (``(S3, B)``).
        fixed_xyz: ``(..., F, 3)`` (``(F, 3, B)``) or None.
        batch: the leading shape ``...`` (``(B,)`` with ``rows``).
        rows: the engines' layouts: ``False`` gives ``(..., n0, 3)`` (atoms, then
            components last); ``True`` gives ``(n0, 3, B)`` (batch innermost).
    """
    atoms_dim, comp_dim = (0, 1) if rows else (-2, -1)
    values_dim = 0 if rows else -1
    zero = r2.new_zeros(())
    parts = []
    if plan.n_fixed:
        parts.append(fixed_xyz)
    if plan.n_roots:
        shape = (plan.n_roots, 3, *batch) if rows else (*batch, plan.n_roots, 3)
        parts.append(r2.new_zeros(shape))
    # the zero components are written as `0 * value` so that a NaN input makes the whole atom NaN
    if plan.second.numel():
        z2 = 0.0 * r2
        parts.append(torch.stack((r2, z2, z2), dim=comp_dim))
    if plan.third.numel():
        from_second = (
            plan.third_from_second.reshape(-1, *([1] * len(batch))) if rows else plan.third_from_second
        )
        rc = r3 * torch.cos(t3)
        xb = r2.index_select(values_dim, plan.third_second_slot)
        z3 = 0.0 * (torch.where(from_second, xb, zero) + r3 * t3)
        x0 = torch.where(from_second, xb - rc, rc)
        parts.append(torch.stack((x0 + z3, r3 * torch.sin(t3) + z3, z3), dim=comp_dim))
    if not parts:
        return r2.new_zeros((0, 3, *batch) if rows else (*batch, 0, 3))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=atoms_dim)


def seed_block(plan: SeedPlan, bonds: Tensor, angles: Tensor, fixed_xyz: Tensor | None) -> Tensor:
    """Positions of block 0 (fixed atoms, roots, seed atoms): ``(..., n0, 3)``.

    Args:
        plan: the `SeedPlan`.
        bonds, angles: ``(..., N)`` with the batch shape already broadcast.
        fixed_xyz: ``(..., F, 3)`` broadcast to the same batch shape, or None.
    """
    r2 = bonds.index_select(-1, plan.second)
    r3 = bonds.index_select(-1, plan.third)
    t3 = angles.index_select(-1, plan.third)
    return seed_positions(plan, r2, r3, t3, fixed_xyz, tuple(bonds.shape[:-1]))
