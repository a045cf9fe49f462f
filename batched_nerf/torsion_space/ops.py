"""Torsions of rotatable bonds: read, set, match to a structure, and the torsion log-volume.

Built on [`update_torsions`][batched_nerf.update_torsions] and the per-molecule
views of its packed rotor tables, for the same layouts (one molecule or copies
``(..., N, 3)``; different molecules concatenated, PyTorch Geometric's layout).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._geometry import centered, cross, dihedral, safe_normalize, superposed_msd
from .packed import _Packed
from .rotors import RotorTable, _Bridges
from .update import _per_bond, _prepare, update_torsions

__all__ = ["match_torsions", "set_torsions", "torsion_angles", "torsion_log_volume"]

Rotors = RotorTable | Sequence[RotorTable]


def torsion_angles(xyz: Tensor, rotors: Rotors, *, batch: Tensor | None = None) -> Tensor:
    r"""The torsion of every rotatable bond of a batch of molecules.

    For each bond ``(u, v)`` of ``rotors`` the IUPAC dihedral of its atoms
    ``rotors.torsions[k] = (p, u, v, m)`` (``p`` the lowest-index other
    neighbour of ``u``, ``m`` that of ``v``), in ``(-pi, pi]``. An update
    ``tau`` of [`update_torsions`][batched_nerf.update_torsions] changes it
    by ``-tau``.

    Args:
        xyz: ``(..., N, 3)`` or ``(..., T, 3)`` coordinates (layouts as in
            [`update_torsions`][batched_nerf.update_torsions]).
        rotors: a [`RotorTable`][batched_nerf.RotorTable] or one per molecule.
        batch: optional sorted ``(T,)`` molecule index of each atom.

    Returns:
        ``(..., sum R)`` torsions in radians, the molecules' bonds in order;
        twice differentiable (finite at collinear atoms).

    Raises:
        TypeError, ValueError: as [`update_torsions`][batched_nerf.update_torsions]
            for ``xyz``, ``rotors`` and ``batch``.

    Example:
        >>> import torch, batched_nerf as bn
        >>> rotors = bn.RotorTable.from_connectivity([(0, 1), (1, 2), (2, 3)], 4)
        >>> xyz = torch.tensor([[1.0, 1, 0], [1, 0, 0], [2, 0, 0], [2, 0, 1]])
        >>> rotors.torsions.tolist(), bn.torsion_angles(xyz, rotors)  # dihedral 3-2-1-0
        ([[3, 2, 1, 0]], tensor([1.5708]))
    """
    packed, _ = _prepare(xyz, rotors, batch)
    return _angles(xyz, packed)


def _angles(xyz: Tensor, packed: _Packed) -> Tensor:
    atoms = xyz.index_select(-2, packed.torsions.to(xyz.device).reshape(-1))
    p, u, v, m = atoms.unflatten(-2, (-1, 4)).unbind(-2)
    return dihedral(p, u, v, m)


def set_torsions(xyz: Tensor, rotors: Rotors, values: Any, *, batch: Tensor | None = None) -> Tensor:
    r"""Set the torsion of every rotatable bond to a given value.

    ``update_torsions(xyz, rotors, wrap(torsion_angles(xyz) - values))``: the
    moving side of each bond turns until
    [`torsion_angles`][batched_nerf.torsion_angles] reads ``values``; bond
    lengths, angles, rings and the unmoved atoms (``rotors.fixed``) are kept.
    Transferring the torsions of a conformer ``source`` onto another
    conformer ``target`` of the same molecule, keeping ``target``'s local
    geometry, is ``set_torsions(target, rotors, torsion_angles(source, rotors))``.

    Args:
        xyz: ``(..., N, 3)`` or ``(..., T, 3)`` coordinates.
        rotors: a [`RotorTable`][batched_nerf.RotorTable] or one per molecule.
        values: ``(..., sum R)`` torsions in radians (any range).
        batch: optional sorted ``(T,)`` molecule index of each atom.

    Returns:
        The coordinates with the torsions set, the shape and dtype of ``xyz``;
        twice differentiable in ``xyz`` and ``values``.

    Raises:
        TypeError, ValueError: as [`update_torsions`][batched_nerf.update_torsions],
            ``values`` in the place of ``updates``.

    Example:
        >>> import torch, batched_nerf as bn
        >>> rotors = bn.RotorTable.from_connectivity([(0, 1), (1, 2), (2, 3)], 4)
        >>> xyz = torch.tensor([[1.0, 1, 0], [1, 0, 0], [2, 0, 0], [2, 0, 1]], dtype=torch.float64)
        >>> trans = bn.set_torsions(xyz, rotors, torch.tensor([3.14159265358979], dtype=torch.float64))
        >>> bn.torsion_angles(trans, rotors).abs().item() > 3.14159
        True
    """
    packed, flat = _prepare(xyz, rotors, batch)
    values = _per_bond(values, "values", packed, xyz, flat)
    return update_torsions(xyz, rotors, _wrapped(_angles(xyz, packed) - values.to(xyz.dtype)), batch=batch)


def _wrapped(delta: Tensor) -> Tensor:
    """Angle differences of any size mapped to ``[-pi, pi)`` (the same turn, the shorter way)."""
    return torch.remainder(delta + math.pi, 2 * math.pi) - math.pi


def _rmsd(x: Tensor, y: Tensor, packed: _Packed) -> Tensor:
    """``(..., M)`` RMSD of each molecule after the best superposition (no reflection)."""
    padded = packed.padded
    mask = padded.atom_mask.to(x.device)
    a, _ = centered(padded.gather(x), mask)
    b, _ = centered(padded.gather(y), mask)
    return superposed_msd(a, b, mask).sqrt()


def match_torsions(
    xyz: Tensor,
    target: Tensor,
    rotors: Rotors,
    *,
    batch: Tensor | None = None,
    steps: int = 100,
    lr: float = 0.02,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The torsion updates that best fit a conformer to a target structure (Kabsch RMSD).

    A batched replacement for torsional diffusion's "conformer matching"
    (a differential evolution over RDKit calls per molecule): starting from
    the transferred torsions (``tau0 = torsion_angles(xyz) -
    torsion_angles(target)``, exact when the local geometries agree), Adam
    takes ``steps`` gradient steps on the sum over molecules of

    ```text
    RMSD_m(tau) = min_R sqrt(mean_i |R (y_i - c_y) - (x_i(tau) - c_x)|^2)
    ```

    with ``x(tau) = update_torsions(xyz, rotors, tau)`` and ``R`` the best
    rotation (Horn's quaternion eigenvalue, no reflection). The molecules are
    independent (their own terms, their own Adam moments). A local search from
    the transferred torsions, not a global optimiser. Runs with gradients
    enabled and returns detached results.

    Args:
        xyz: ``(..., N, 3)`` or ``(..., T, 3)`` conformers whose torsions change.
        target: structures to fit, the shape of ``xyz`` (the same atoms).
        rotors: a [`RotorTable`][batched_nerf.RotorTable] or one per molecule.
        batch: optional sorted ``(T,)`` molecule index of each atom.
        steps: number of Adam steps (``0``: the transfer alone).
        lr: Adam's step size (radians).

    Returns:
        ``(updates, fitted, rmsd)``: ``(..., sum R)`` updates (radians),
        ``fitted = update_torsions(xyz, rotors, updates)``, and ``(..., M)``
        (flat layout) or ``(...)`` RMSD of each molecule to ``target`` after
        superposition, in the unit of ``xyz``.

    Raises:
        TypeError, ValueError: as [`update_torsions`][batched_nerf.update_torsions];
            ``target`` of another shape than ``xyz``; ``steps`` negative or
            ``lr`` not positive.

    Example:
        >>> import torch, batched_nerf as bn
        >>> pairs = [(0, 1), (1, 2), (2, 3), (3, 4)]
        >>> rotors = bn.RotorTable.from_connectivity(pairs, 5)
        >>> xyz = bn.to_cartesian(torch.ones(5), torch.full((5,), 1.9), torch.tensor([0, 0, 0, 1.0, -2.0]),
        ...                       bn.ConstructionTable.chain(5)).double()
        >>> target = bn.update_torsions(xyz, rotors, torch.tensor([0.3, -1.2], dtype=torch.float64))
        >>> updates, fitted, rmsd = bn.match_torsions(xyz, target, rotors, steps=0)
        >>> updates, rmsd.item() < 1e-12
        (tensor([ 0.3000, -1.2000], dtype=torch.float64), True)
    """
    packed, flat = _prepare(xyz, rotors, batch)
    if not isinstance(target, Tensor) or target.shape != xyz.shape:
        got = tuple(target.shape) if isinstance(target, Tensor) else type(target).__name__
        raise ValueError(f"target must be a tensor of the shape of xyz {tuple(xyz.shape)}, got {got}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    x, y = xyz.detach(), target.detach().to(xyz.dtype)
    tau = _wrapped(_angles(x, packed) - _angles(y, packed)).requires_grad_(True)
    with torch.enable_grad():
        opt = torch.optim.Adam([tau], lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            loss = _rmsd(update_torsions(x, rotors, tau, batch=batch), y, packed).sum()
            loss.backward()
            opt.step()
    tau = tau.detach()
    with torch.no_grad():
        fitted = update_torsions(x, rotors, tau, batch=batch)
        rmsd = _rmsd(fitted, y, packed)
    return tau, fitted, rmsd if flat else rmsd.squeeze(-1)


def torsion_log_volume(xyz: Tensor, rotors: Rotors, *, batch: Tensor | None = None) -> Tensor:
    r"""Log-volume of the torsion -> Cartesian map with the rigid motion removed, per molecule.

    For a molecule with rotatable bonds ``k = 1..R`` the columns of the
    Jacobian of [`update_torsions`][batched_nerf.update_torsions] at ``tau =
    0`` are the velocities of the moving atoms,
    ``dx_i / dtau_k = e_k x (x_i - x_v)`` with ``e_k = (x_u - x_v) / |x_u - x_v|``.
    Each column is projected onto the motions orthogonal (unit masses) to
    the rigid ones: its mean is removed, then the rotation ``w x (x_i - c)``
    with ``I w = sum_i (x_i - c) x dx_i`` (``I`` the inertia tensor about the
    centroid ``c``). With ``J`` the ``(3N, R)`` projected Jacobian:

    ```text
    log_volume = 0.5 * log det(J^T J)
    ```

    the quantity torsional diffusion's likelihood computes with a numpy SVD
    per conformer (``log_det_jac``), here exact, batched and twice
    differentiable in ``xyz``. It does not depend on which side of each bond
    turns. ``0`` for a molecule without rotatable bonds; ``-inf`` where the
    columns are dependent (e.g. a torsion whose moving side lies on its axis).

    Args:
        xyz: ``(..., N, 3)`` or ``(..., T, 3)`` coordinates (length unit ``L``).
        rotors: a [`RotorTable`][batched_nerf.RotorTable] or one per molecule.
        batch: optional sorted ``(T,)`` molecule index of each atom.

    Returns:
        ``(..., M)`` (flat layout: one value per molecule) or ``(...)``, in
        ``log(L^R)``.

    Raises:
        TypeError, ValueError: as [`update_torsions`][batched_nerf.update_torsions]
            for ``xyz``, ``rotors`` and ``batch``.

    Example:
        >>> import torch, batched_nerf as bn
        >>> rotors = bn.RotorTable.from_connectivity([(0, 1), (1, 2), (2, 3)], 4)
        >>> xyz = torch.tensor([[1.0, 1, 0], [1, 0, 0], [2, 0, 0], [2, 1, 0]], dtype=torch.float64)
        >>> # atom 0 turns at speed 1; less the rigid part of that motion, the molecule's speed is 1/2
        >>> bn.torsion_log_volume(xyz, rotors)  # log(1/2)
        tensor(-0.6931, dtype=torch.float64)
    """
    packed, flat = _prepare(xyz, rotors, batch)
    dev = xyz.device
    mask = packed.padded.atom_mask.to(dev)
    x = packed.padded.gather(xyz)  # (..., M, n, 3)
    bond_mask = packed.padded.bond_mask.to(dev)  # (M, r)
    ends = xyz.index_select(-2, packed.padded.bond_atoms.to(dev).reshape(-1)).unflatten(
        -2, (*bond_mask.shape, 2)
    )
    xu, xv = ends.unbind(-2)  # (..., M, r, 3)
    moving = packed.padded.moving.to(dev)[..., None].to(xyz.dtype)  # (M, r, n, 1)
    axis = xu - xv
    e = safe_normalize(axis)  # padded bonds have a zero axis: finite to second order there too
    w = mask[..., None].to(xyz.dtype)  # (M, n, 1)
    dx = cross(e.unsqueeze(-2), x.unsqueeze(-3) - xv.unsqueeze(-2)) * moving  # (..., M, r, n, 3)
    n = w.sum(-2, keepdim=True)  # (M, 1, 1)
    dx = (dx - dx.sum(-2, keepdim=True) / n.unsqueeze(-3)) * w.unsqueeze(-3)
    p, _ = centered(x, mask)  # (..., M, n, 3)
    eye = torch.eye(3, dtype=xyz.dtype, device=dev)
    inertia = p.square().sum((-1, -2))[..., None, None] * eye - p.transpose(-1, -2) @ p  # (..., M, 3, 3)
    momentum = cross(p.unsqueeze(-3), dx).sum(-2)  # (..., M, r, 3)
    omega = torch.linalg.solve_ex(inertia.unsqueeze(-3), momentum.unsqueeze(-1)).result.squeeze(-1)
    dx = dx - cross(omega.unsqueeze(-2), p.unsqueeze(-3))
    flat_j = dx.flatten(-2)  # (..., M, r, 3n)
    gram = flat_j @ flat_j.transpose(-1, -2)
    pad = (~bond_mask).to(xyz.dtype)
    gram = gram + torch.diag_embed(pad)  # padded bonds: a 1 on the diagonal, log 1 = 0
    value = 0.5 * torch.linalg.slogdet(gram)[1]
    return value if flat else value.squeeze(-1)


def rotatable_torsions(refs: np.ndarray, pairs: np.ndarray) -> list[tuple[tuple[int, int], list[int]]]:
    """Groups of rows whose dihedral is a proper torsion about the same rotatable bond (the CLI's
    ``info`` and ``sample`` commands).

    A bond ``b-a`` is rotatable when it is in no ring, both atoms have other
    neighbours, and it does not join two three-connected atoms (amide C-N,
    conjugated sp2-sp2 bonds). A row ``(b, a, d)`` drives it when ``i-b``,
    ``b-a`` and ``a-d`` are bonds; rows referencing a sibling (``d`` bonded to
    ``b``) follow rigidly.

    Returns:
        ``[((b, a), [rows...]), ...]`` in order of the first row.
    """
    n = len(refs)
    bonded = {frozenset(p) for p in pairs.tolist()}
    degree = np.zeros(n, dtype=np.int64)
    for i, j in pairs.tolist():
        degree[i] += 1
        degree[j] += 1
    free = {
        bond
        for bond in _Bridges(pairs, n).child
        if all(degree[x] > 1 for x in bond) and not all(degree[x] == 3 for x in bond)
    }
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (b, a, d) in enumerate(refs.tolist()):
        if d < 0 or frozenset((b, a)) not in free:
            continue
        if frozenset((i, b)) in bonded and frozenset((a, d)) in bonded:
            groups.setdefault((b, a), []).append(i)
    return list(groups.items())
