"""The symmetric side-chain torsions: pi-periodic chi, the atom renaming that goes with them, a loss.

Four side-chain torsions are pi-periodic (OpenFold's ``chi_pi_periodic``): Asp
chi2, Glu chi3, Phe chi2 and Tyr chi2. Turning one by pi swaps the names of the
two atoms (or ring halves) it turns (``residue_atom_renaming_swaps`` there);
Arg's ``NH1``/``NH2`` are a renaming with no torsion (chi5 is not a torsion of
the tables here).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.table import outside_inference_mode
from ..runtime.state import memo
from ._build import PackedProteins, _float
from ._layouts import Layout, _table, _tables
from ._sequence import ProteinTable

#: Pi-periodic chi (0-based column of ``chi``) by residue name (OpenFold's ``chi_pi_periodic``); the
#: protonated ``ASH``/``GLH`` are not symmetric (their H sits on ``OD2``/``OE2``).
_PERIODIC = {"ASP": 1, "GLU": 2, "PHE": 1, "TYR": 1}
#: Atom name pairs that swap: with the pi-periodic chi, and Arg's guanidinium (no chi).
_SWAPS = {
    "ASP": (("OD1", "OD2"),),
    "GLU": (("OE1", "OE2"),),
    "PHE": (("CD1", "CD2"), ("CE1", "CE2"), ("HD1", "HD2"), ("HE1", "HE2")),
    "TYR": (("CD1", "CD2"), ("CE1", "CE2"), ("HD1", "HD2"), ("HE1", "HE2")),
    "ARG": (("NH1", "NH2"), ("HH11", "HH21"), ("HH12", "HH22")),
}


@outside_inference_mode
def _chi_masks(t: ProteinTable | PackedProteins, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(periodic, has)``: ``(L, 4)`` (packed ``(B, L_max, 4)``) bool masks, kept on the table."""
    cache = memo(t, "chi_masks", dict)
    if device not in cache:
        tables, packed = _tables(t)
        l_max = max(p.n_residues for p in tables)
        periodic = torch.zeros(len(tables), l_max, 4, dtype=torch.bool)
        has = torch.zeros(len(tables), l_max, 4, dtype=torch.bool)
        for b, p in enumerate(tables):
            has[b, : p.n_residues] = p.chi_mask
            for r, res in enumerate(p.residues):
                if res in _PERIODIC:  # by name: ASH and GLH are not symmetric
                    periodic[b, r, _PERIODIC[res]] = True
        periodic, has = (periodic, has) if packed else (periodic[0], has[0])
        cache[device] = periodic.to(device), has.to(device)
    return cache[device]


def _chi(value: Any, name: str, shape: tuple[int, ...], like: Tensor | None = None) -> Tensor:
    value = _float(value, name, like)
    if value.dim() < len(shape) or tuple(value.shape[-len(shape) :]) != shape:
        dims = ", ".join(map(str, shape))
        raise ValueError(
            f"{name} must have shape (..., {dims}) (residues, chi1..chi4), got {tuple(value.shape)}"
        )
    return value


def symmetric_chi(chi: Any, sequence: Layout) -> Tensor:
    """The equivalent side-chain torsions: the pi-periodic ones turned by pi.

    Asp chi2, Glu chi3, Phe chi2 and Tyr chi2 (OpenFold's ``chi_pi_periodic``)
    become ``chi + pi`` wrapped into ``(-pi, pi]``; every other entry is
    returned unchanged. The protonated ``ASH``/``GLH`` are not symmetric and
    keep their chi. Building with the result gives the same structure with the
    atoms renamed by
    [`symmetric_renaming`][batched_nerf.protein.symmetric_renaming]``(sequence, arginine=False)``:
    exactly (to rounding) for Asp and Glu; for Phe and Tyr the ring atoms
    ``CD1 CD2 CE1 CE2`` (and their hydrogens) swap exactly, while ``CZ``
    (``OH``, ``HZ``, ``HE1``/``HE2``, ``HH``) move by up to 0.03 A (0.9 A for
    Tyr ``HH``, whose rotor keeps its value): the Engh & Huber ring of the
    templates closes slightly off its mirror axis.

    Args:
        chi: ``(..., L, 4)`` torsions (radians; mixed batch ``(..., B, L_max, 4)``),
            as the ``chi`` of [`build`][batched_nerf.protein.build].
        sequence: a sequence, its [`ProteinTable`][batched_nerf.protein.ProteinTable]
            or a [`PackedProteins`][batched_nerf.protein.PackedProteins].

    Returns:
        ``(..., L, 4)`` torsions (radians), differentiable in ``chi``.

    Raises:
        TypeError: non-floating ``chi``, a sequence of the wrong type.
        ValueError: ``chi`` of the wrong shape, an unknown residue.

    Example:
        >>> import math, torch, batched_nerf as bn
        >>> chi = torch.tensor([[1.0, 2.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0]])
        >>> bn.protein.symmetric_chi(chi, "DN")[:, 1]  # Asp chi2 turns, Asn chi2 does not
        tensor([-1.1416,  2.0000])
    """
    t = _table(sequence, False)
    periodic, _ = _chi_masks(t, torch.device("cpu") if not isinstance(chi, Tensor) else chi.device)
    chi = _chi(chi, "chi", tuple(periodic.shape))
    periodic = periodic.to(chi.device)
    turned = math.pi - torch.remainder(-chi, 2 * math.pi)  # chi + pi in (-pi, pi]
    return torch.where(periodic, turned, chi)


def _swaps(t: ProteinTable) -> np.ndarray:
    """``(N,)`` the renaming permutation of one table (all swaps, Arg's included; kept on ``t``)."""
    cache = memo(t, "renaming", dict)
    if not cache:
        index = t._index
        arg = np.arange(t.n_atoms)
        perm = np.arange(t.n_atoms)
        for r, res in enumerate(t.residues):
            for a, b in _SWAPS.get(res, ()):
                if (r, a) in index and (r, b) in index:
                    i, j = index[(r, a)], index[(r, b)]
                    perm[i], perm[j] = j, i
                    if res != "ARG":
                        arg[i], arg[j] = j, i
        cache[True], cache[False] = perm, arg
    return cache


def symmetric_renaming(sequence: Layout, hydrogens: bool = False, *, arginine: bool = True) -> Tensor:
    """The permutation of the atoms that renames each symmetric pair: ``xyz_alt = xyz[..., perm, :]``.

    It swaps Asp ``OD1/OD2``, Glu ``OE1/OE2``, Phe and Tyr ``CD1/CD2``,
    ``CE1/CE2`` (and ``HD1/HD2``, ``HE1/HE2`` in an all-atom table) and, with
    ``arginine``, Arg ``NH1/NH2`` (and ``HH11/HH21``, ``HH12/HH22``): the names
    that OpenFold's ``residue_atom_renaming_swaps`` swaps, and Arg's, whose
    swap turns no torsion. ``ASH``/``GLH`` keep their names (not symmetric).
    A permutation of swaps: its own inverse.

    Args:
        sequence: a sequence, its [`ProteinTable`][batched_nerf.protein.ProteinTable]
            or a [`PackedProteins`][batched_nerf.protein.PackedProteins].
        hydrogens: the all-atom order (a table's own atoms are read where one is given).
        arginine: also swap Arg's ``NH1``/``NH2``. Without it the renaming is
            the one that goes with [`symmetric_chi`][batched_nerf.protein.symmetric_chi].

    Returns:
        ``(N,)`` ``torch.long`` (mixed batch: ``(B, N_max)``, each row a
        permutation of its sequence's atoms, padding in place).

    Raises:
        TypeError, ValueError: a bad sequence (see
            [`parse_sequence`][batched_nerf.protein.parse_sequence]), or
            ``hydrogens=True`` with a heavy-atom table.

    Example:
        >>> import batched_nerf as bn
        >>> t = bn.protein.protein_table("D")
        >>> perm = bn.protein.symmetric_renaming("D")
        >>> [t.atom_names[k] for k in perm]
        ['N', 'CA', 'C', 'O', 'CB', 'CG', 'OD2', 'OD1', 'OXT']
    """
    t = _table(sequence, hydrogens)
    tables, packed = _tables(t)
    if not packed:
        return torch.from_numpy(_swaps(t)[bool(arginine)].copy())
    n_max = max(p.n_atoms for p in tables)
    out = np.tile(np.arange(n_max), (len(tables), 1))
    for b, p in enumerate(tables):
        out[b, : p.n_atoms] = _swaps(p)[bool(arginine)]
    return torch.from_numpy(out)


def chi_loss(pred: Any, target: Any, sequence: Layout, mask: Any = None) -> Tensor:
    """A side-chain torsion loss that counts the symmetric torsions' two equivalent values alike.

    Per torsion ``1 - cos(pred - target)``; on the pi-periodic ones of
    [`symmetric_chi`][batched_nerf.protein.symmetric_chi] the smaller of that
    and ``1 - cos(pred - target - pi)`` (``= 1 - |cos(pred - target)|``). The
    mean over the torsions the residues have (``ProteinTable.chi_mask``), times
    ``mask`` where given. Each term is in ``[0, 2]``, 0 where the torsions agree
    (up to the symmetry).

    Args:
        pred: ``(..., L, 4)`` predicted torsions (radians; mixed batch ``(..., B, L_max, 4)``).
        target: ``(..., L, 4)`` target torsions (radians), broadcasting with ``pred``.
        sequence: a sequence, its [`ProteinTable`][batched_nerf.protein.ProteinTable]
            or a [`PackedProteins`][batched_nerf.protein.PackedProteins].
        mask: optional ``(..., L, 4)`` bool or float weights (e.g. the torsions a
            structure resolved), broadcasting with ``pred``.

    Returns:
        ``(...)`` the mean per structure (the leading dimensions of ``pred``,
        ``target`` and ``mask`` broadcast; 0 where no torsion counts);
        differentiable to any order, ``torch.func`` compatible.

    Raises:
        TypeError: non-floating torsions, a sequence of the wrong type.
        ValueError: ``pred``, ``target`` or ``mask`` of the wrong shape, an unknown residue.

    Example:
        >>> import torch, batched_nerf as bn
        >>> target = torch.tensor([[1.0, 2.0, 0.0, 0.0]])
        >>> flipped = bn.protein.symmetric_chi(target, "F")
        >>> loss = [bn.protein.chi_loss(flipped, target, seq) for seq in ("F", "L")]
        >>> [round(float(v), 6) for v in loss]  # Phe chi2 is pi-periodic, Leu chi2 is not
        [0.0, 1.0]
    """
    t = _table(sequence, False)
    device = pred.device if isinstance(pred, Tensor) else torch.device("cpu")
    periodic, has = _chi_masks(t, device)
    shape = tuple(periodic.shape)
    pred = _chi(pred, "pred", shape)
    target = _chi(target, "target", shape, like=pred)
    periodic, has = periodic.to(pred.device), has.to(pred.device)
    cos = torch.cos(pred - target)
    loss = torch.where(periodic, torch.minimum(1.0 - cos, 1.0 + cos), 1.0 - cos)
    weight = has.to(loss.dtype)
    if mask is not None:
        weight = weight * _weights(mask, shape, loss)
    shape = torch.broadcast_shapes(weight.shape, loss.shape)
    weight, loss = weight.expand(shape), loss.expand(shape)
    count = weight.sum((-2, -1))
    return (loss * weight).sum((-2, -1)) / count.clamp_min(torch.finfo(loss.dtype).tiny)


def _weights(mask: Any, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """``mask`` ``(..., *shape)`` as weights in ``like``'s dtype and device."""
    mask = mask if isinstance(mask, Tensor) else torch.as_tensor(np.asarray(mask))
    if mask.dim() < len(shape) or tuple(mask.shape[-len(shape) :]) != shape:
        dims = ", ".join(map(str, shape))
        raise ValueError(
            f"mask must have shape (..., {dims}) (residues, chi1..chi4), got {tuple(mask.shape)}"
        )
    return mask.to(dtype=like.dtype, device=like.device)
