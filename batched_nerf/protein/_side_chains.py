"""Side chains onto a given backbone ("packer mode"): every side-chain atom from chi, backbone kept.

The packed table of the sequences ([`packed_proteins`][batched_nerf.protein.packed_proteins]) with
its backbone atoms (N, CA, C, and O where given) turned into fixed atoms: each residue's
side chain hangs from its own N, CA, C (CB from ``(CA, N, C)`` at L-chirality), so one
[`to_cartesian`][batched_nerf.to_cartesian] call with ``fixed_xyz`` places every side chain of a
mixed batch, and the backbone is copied, not rebuilt.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..core.convert import to_cartesian
from ..core.table import ConstructionTable, _static_tensors, outside_inference_mode
from ._build import _DEG, PACK_CACHE_SIZE, PackedProteins, Protein, _float, _packed
from ._sequence import protein_table

#: The backbone atoms a caller gives, in the order of ``backbone[..., j, :]``.
BACKBONE_ATOMS: tuple[str, ...] = ("N", "CA", "C", "O")


#: Padding lengths (and devices) whose gather indices each fixed-backbone table keeps.
_MAPS_KEPT = 8


class _Placer(NamedTuple):
    """The fixed-backbone table of a tuple of sequences and the index maps of its inputs."""

    packed: PackedProteins
    table: ConstructionTable
    slot: np.ndarray  # (F, 3): protein, residue, backbone atom of each fixed atom (table.fixed order)
    chi: np.ndarray  # (C, 4): row, protein, residue, chi column of each chi row
    bonds: Tensor  # (N_total,) template values (A, radians); OXT's dihedral pi
    angles: Tensor
    dihedrals: Tensor
    maps: dict  # (L_pad, device) -> (fixed index, dihedral source)


@functools.lru_cache(maxsize=PACK_CACHE_SIZE)
@outside_inference_mode
def _placer(sequences: tuple[tuple[str, ...], ...], hydrogens: bool, n_backbone: int) -> _Placer:
    packed = _packed(sequences, hydrogens)
    refs = packed.table.topology.refs.copy()
    dihedrals = packed.dihedrals.clone()
    slots, chis, first = [], [], 0
    for k, t in enumerate(packed.tables):
        for r, name in enumerate(t.residues):
            if name in ("ACE", "NME"):
                raise ValueError(
                    f"place_side_chains: protein {k}, residue {r} is the cap {name}: "
                    "caps have no N, CA, C to hang a side chain from; leave them out"
                )
        names = np.array(t.atom_names)
        res = t.residue_index.numpy()
        for j, atom in enumerate(BACKBONE_ATOMS[:n_backbone]):
            rows = np.flatnonzero(names == atom)
            slots.append(np.stack([rows + first, np.full_like(rows, k), res[rows], np.full_like(rows, j)], 1))
        oxt = first + t.atom(t.n_residues - 1, "OXT")
        last = t.n_residues - 1
        if n_backbone == 4:  # the carboxylate from the given O: OXT opposite O, in the CA-C-O plane
            refs[oxt] = [first + t.atom(last, "C"), first + t.atom(last, "CA"), first + t.atom(last, "O")]
        dihedrals[oxt] = math.pi  # psi of the last residue without O: OXT trans to N
        rows = t.torsion_rows[:, 3:].numpy()
        r, c = np.nonzero(rows >= 0)
        chis.append(np.stack([rows[r, c] + first, np.full_like(r, k), r, c], 1))
        first += t.n_atoms
    slot = np.concatenate(slots)
    slot = slot[np.argsort(slot[:, 0], kind="stable")]
    refs[slot[:, 0]] = -1
    table = ConstructionTable(refs, fixed=slot[:, 0])
    return _Placer(
        packed, table, slot[:, 1:], np.concatenate(chis), packed.bonds, packed.angles, dihedrals, {}
    )


def _maps(placer: _Placer, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Gather indices for a backbone padded to ``L_pad = length``: the fixed atoms' slots in
    ``backbone.flatten(-4, -2)`` and each row's dihedral in ``cat([template (N), chi (4 B L_pad)])``."""
    key = (length, device)
    if key not in placer.maps:
        if len(placer.maps) >= _MAPS_KEPT:  # bounded: drop the oldest padding length
            placer.maps.pop(next(iter(placer.maps)))
        n_backbone = int(placer.slot[:, 2].max()) + 1
        k, r, j = placer.slot.T
        fixed = (k * length + r) * n_backbone + j
        source = np.arange(placer.table.n_atoms)
        row, k, r, c = placer.chi.T
        source[row] = placer.table.n_atoms + 4 * (k * length + r) + c
        with _static_tensors():
            placer.maps[key] = (torch.from_numpy(fixed).to(device), torch.from_numpy(source).to(device))
    return placer.maps[key]


def place_side_chains(
    sequences: str | Sequence[str | Sequence[str]],
    backbone: Any,
    chi: Any = None,
    *,
    hydrogens: bool = False,
    degrees: bool = False,
    method: str = "auto",
) -> Protein:
    r"""Side chains placed on a given backbone from their chi angles (packer mode).

    Every atom but the given backbone is built from the residue templates of
    [`build`][batched_nerf.protein.build] (Engh & Huber bond lengths and angles, CB at
    L-chirality from N, CA, C; hydrogens with Amber ff14SB values) and the chi
    angles, while N, CA, C (and O) are copied bitwise from ``backbone``:

    ```text
    CB[i]        from (CA[i], N[i], C[i])               ideal, independent of phi and psi
    chi[i, k]  = chi(k+1) of residue i (mdtraj's compute_chi atoms), IUPAC sign
    O[i]         given, or in the peptide plane: dihedral(O[i], C[i], CA[i], N[i+1]) = pi
    OXT          opposite the given O, or (no O) dihedral(N, CA, C, OXT) = pi
    ```

    One [`batched_nerf.to_cartesian`][batched_nerf.to_cartesian] call for the whole
    batch (the backbone atoms are the table's fixed atoms), so the result is
    differentiable to any order with respect to ``chi`` and ``backbone`` and
    ``torch.func`` compatible. The inverse (chi from coordinates) is
    [`torsions_batch`][batched_nerf.protein.torsions_batch] (or
    [`torsions`][batched_nerf.protein.torsions] for one sequence).

    Args:
        sequences: one sequence, a string (``"ACD"``, ``"ALA CYS ASP"``), or a
            list of ``B`` sequences (mixed lengths; each a string or a list of
            residue names); caps (``ACE``, ``NME``) are refused.
        backbone: ``(..., B, L_pad, 3, 3)`` N, CA, C or ``(..., B, L_pad, 4, 3)``
            N, CA, C, O of each residue (Angstrom), ``L_pad`` at least the longest
            sequence; entries past each sequence are ignored (NaN allowed, zero
            gradient). For one sequence ``(..., L, 3 or 4, 3)``.
        chi: ``(..., B, L_pad, 4)`` (one sequence: ``(..., L, 4)``) side-chain
            torsions; entries beyond a residue's side chain are ignored; default
            one common rotamer per residue type
            ([`DEFAULT_CHI`][batched_nerf.protein.DEFAULT_CHI]).
        hydrogens: also place every hydrogen (backbone ``H``/``HA`` included,
            rotors staggered).
        degrees: ``chi`` in degrees.
        method: passed to [`batched_nerf.to_cartesian`][batched_nerf.to_cartesian].

    Returns:
        [`Protein`][batched_nerf.protein.Protein] in the atom order of
        [`build_batch`][batched_nerf.protein.build_batch]: ``xyz`` ``(..., B, N_max, 3)``
        (zeros in padding) with ``mask`` ``(B, N_max)``; for one sequence as
        [`build`][batched_nerf.protein.build], ``xyz`` ``(..., N, 3)``.

    Raises:
        ValueError: an unknown residue or a cap; ``backbone`` not ``(..., B, L_pad, 3|4, 3)``
            (naming the shape and the sequences' counts); ``chi`` of the wrong shape;
            batch shapes that do not broadcast.
        TypeError: non-floating ``backbone`` or ``chi``.

    Example:
        >>> import torch, batched_nerf as bn
        >>> p = bn.protein.build("FKW", torch.full((3,), -1.0), torch.full((3,), -0.8))
        >>> backbone = torch.stack([p.xyz[p.residue_index == i][:4] for i in range(3)])  # N, CA, C, O
        >>> chi = torch.full((3, 4), 1.0)
        >>> q = bn.protein.place_side_chains("FKW", backbone, chi)
        >>> q.xyz.shape, bool(q.xyz[:4].equal(p.xyz[:4]))
        (torch.Size([35, 3]), True)
        >>> bn.protein.torsions(q.xyz, "FKW").chi[0, :2]
        tensor([1.0000, 1.0000])
    """
    single = isinstance(sequences, str)
    given = [sequences] if single else list(sequences)
    if not given:
        raise ValueError("sequences must be a sequence or a non-empty list of sequences")
    residues = tuple(protein_table(s).residues for s in given)
    counts = [len(r) for r in residues]
    x = _backbone(backbone, counts, single)
    length = x.shape[-3]
    placer = _placer(residues, bool(hydrogens), x.shape[-2])
    c = _chi(chi, x, placer.packed, counts, single, degrees)
    dtype = torch.promote_types(x.dtype, c.dtype)
    try:
        batch = torch.broadcast_shapes(x.shape[:-4], c.shape[:-3])
    except RuntimeError:
        raise ValueError(
            f"backbone and chi do not broadcast: batch shapes {tuple(x.shape[:-4])} and {tuple(c.shape[:-3])}"
        ) from None
    fixed, source = _maps(placer, length, x.device)
    fixed_xyz = x.to(dtype).expand(*batch, *x.shape[-4:]).flatten(-4, -2).index_select(-2, fixed)
    template = placer.dihedrals.to(dtype=dtype, device=x.device).expand(*batch, -1)
    dihedrals = torch.cat([template, c.to(dtype).expand(*batch, *c.shape[-3:]).flatten(-3)], -1)
    dihedrals = dihedrals.index_select(-1, source)
    bonds = placer.bonds.to(dtype=dtype, device=x.device)
    angles = placer.angles.to(dtype=dtype, device=x.device)
    xyz = to_cartesian(bonds, angles, dihedrals, placer.table, fixed_xyz=fixed_xyz, method=method)
    return _protein(placer.packed, placer.packed.padded(xyz), single)


def _backbone(backbone: Any, counts: list[int], single: bool) -> Tensor:
    """``backbone`` checked against the sequences' residue ``counts``: ``(..., B, L_pad, 3|4, 3)``
    (one sequence: a batch of one added)."""
    x = _float(backbone, "backbone", None)
    lead = 0 if single else 1
    if x.ndim < 3 + lead or x.shape[-1] != 3 or x.shape[-2] not in (3, 4):
        want = "(..., L, 3 or 4, 3)" if single else "(..., B, L_pad, 3 or 4, 3)"
        raise ValueError(
            f"backbone must be {want} (N, CA, C[, O] of each residue), got shape {tuple(x.shape)}"
        )
    shape = tuple(x.shape)
    if single:
        x = x.unsqueeze(-4)
    length = x.shape[-3]
    if x.shape[-4] != len(counts) or (length != counts[0] if single else length < max(counts)):
        what = (
            f"{counts[0]} residues"
            if single
            else f"B = {len(counts)} sequences of up to {max(counts)} residues"
        )
        raise ValueError(f"backbone of shape {shape} does not fit {what}")
    return x


def _chi(
    chi: Any, x: Tensor, packed: PackedProteins, counts: list[int], single: bool, degrees: bool
) -> Tensor:
    """``(..., B, L_pad, 4)`` chi (radians) of the call: ``chi`` checked, or the packed tables'
    default rotamers (``x``: the checked backbone, whose dtype and device they take)."""
    length = x.shape[-3]
    if chi is None:
        with _static_tensors():
            c = torch.zeros(len(counts), length, 4, dtype=torch.float64)
            c[:, : packed.l_max] = packed.default_chi
        return c.to(dtype=x.dtype, device=x.device)
    c = _float(chi, "chi", x)
    want = (counts[0], 4) if single else (len(counts), length, 4)
    if tuple(c.shape[-len(want) :]) != want or c.ndim < len(want):
        shape = "(..., L, 4)" if single else "(..., B, L_pad, 4)"
        raise ValueError(f"chi must be {shape} = (..., {', '.join(map(str, want))}), got {tuple(c.shape)}")
    c = c.unsqueeze(-3) if single else c
    return c * _DEG if degrees else c


def _protein(packed: PackedProteins, padded: Tensor, single: bool) -> Protein:
    """The `Protein` of ``padded`` ``(..., B, N_max, 3)`` coordinates: one sequence's own atoms, or
    the padded batch with its mask."""
    t, device = packed.tables, padded.device
    if single:
        return Protein(
            padded[..., 0, : t[0].n_atoms, :],
            t[0].atom_names,
            t[0].residue_index.to(device),
            t[0].elements,
            t[0].sequence,
            torch.ones(t[0].n_atoms, dtype=torch.bool, device=device),
        )
    return Protein(
        padded,
        tuple(p.atom_names for p in t),
        packed.residue_index.to(device),
        tuple(p.elements for p in t),
        packed.sequences,
        packed.mask.to(device),
    )
