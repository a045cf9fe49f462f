"""OpenFold / AlphaFold ``atom37`` and ``atom14`` layouts.

The two layouts are those of OpenFold's ``openfold/np/residue_constants.py``
(the same as AlphaFold 2's): ``atom37`` gives every residue one slot per heavy
atom type of [`ATOM37_NAMES`][batched_nerf.protein.ATOM37_NAMES] (``atom_types``
there), ``atom14`` a residue's own heavy atoms in 14 slots
([`atom14_names`][batched_nerf.protein.atom14_names],
``restype_name_to_atom14_names`` there). Both hold heavy atoms only: the
hydrogens of an all-atom build have no slot, and ``atom14`` has no ``OXT``.
The conversions are gathers with index tensors made once per sequence (kept on
its [`ProteinTable`][batched_nerf.protein.ProteinTable] or
[`PackedProteins`][batched_nerf.protein.PackedProteins]), so they are
differentiable, ``torch.func`` compatible and have no Python loop over residues.
The symmetric side-chain torsions are `_symmetry`'s.
"""

from __future__ import annotations

import math
from typing import Any, Union

import numpy as np
import torch
from torch import Tensor

from ..core.table import outside_inference_mode
from ..residues.templates import (
    CAPS,
    CTERM_C_O,
    CTERM_CA_C_O,
    ONE_TO_THREE,
    RESIDUE_NAMES,
    base_residue,
    residue_name,
)
from ..runtime.state import memo
from ._build import PackedProteins, _float
from ._sequence import ProteinTable, protein_table

#: The 37 heavy-atom types of the ``atom37`` layout, in OpenFold's order (``residue_constants.atom_types``).
ATOM37_NAMES: tuple[str, ...] = (
    "N", "CA", "C", "CB", "O", "CG", "CG1", "CG2", "OG", "OG1", "SG", "CD", "CD1", "CD2", "ND1", "ND2",
    "OD1", "OD2", "SD", "CE", "CE1", "CE2", "CE3", "NE", "NE1", "NE2", "OE1", "OE2", "CH2", "NH1", "NH2",
    "OH", "CZ", "CZ2", "CZ3", "NZ", "OXT",
)  # fmt: skip

# OpenFold's residue_constants.restype_name_to_atom14_names, the empty slots left out (padded to 14 below).
_ATOM14 = {
    "ALA": ("N", "CA", "C", "O", "CB"),
    "ARG": ("N", "CA", "C", "O", "CB", "CG", "CD", "NE", "CZ", "NH1", "NH2"),
    "ASN": ("N", "CA", "C", "O", "CB", "CG", "OD1", "ND2"),
    "ASP": ("N", "CA", "C", "O", "CB", "CG", "OD1", "OD2"),
    "CYS": ("N", "CA", "C", "O", "CB", "SG"),
    "GLN": ("N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "NE2"),
    "GLU": ("N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "OE2"),
    "GLY": ("N", "CA", "C", "O"),
    "HIS": ("N", "CA", "C", "O", "CB", "CG", "ND1", "CD2", "CE1", "NE2"),
    "ILE": ("N", "CA", "C", "O", "CB", "CG1", "CG2", "CD1"),
    "LEU": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2"),
    "LYS": ("N", "CA", "C", "O", "CB", "CG", "CD", "CE", "NZ"),
    "MET": ("N", "CA", "C", "O", "CB", "CG", "SD", "CE"),
    "PHE": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ"),
    "PRO": ("N", "CA", "C", "O", "CB", "CG", "CD"),
    "SER": ("N", "CA", "C", "O", "CB", "OG"),
    "THR": ("N", "CA", "C", "O", "CB", "OG1", "CG2"),
    "TRP": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "NE1", "CE2", "CE3", "CZ2", "CZ3", "CH2"),
    "TYR": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ", "OH"),
    "VAL": ("N", "CA", "C", "O", "CB", "CG1", "CG2"),
}
_ATOM37_INDEX = {name: k for k, name in enumerate(ATOM37_NAMES)}

Layout = Union[str, "list[str]", ProteinTable, PackedProteins]


def _three(residue: str, what: str) -> str:
    """The standard residue (three letters) whose atom14 slots ``residue`` uses."""
    if not isinstance(residue, str):
        raise TypeError(f"residue must be a string, got {type(residue).__name__}")
    name = ONE_TO_THREE.get(residue.upper(), residue.upper()) if len(residue) == 1 else residue_name(residue)
    if name in CAPS:
        raise ValueError(f"residue {name} is a cap: it has no {what} residue type (the 20 amino acids only)")
    if name not in RESIDUE_NAMES:
        raise ValueError(f"unknown residue {residue!r}; expected one of {RESIDUE_NAMES[:-2]}")
    return base_residue(name)


def atom14_names(residue: str) -> tuple[str, ...]:
    """The 14 ``atom14`` slot names of a residue (OpenFold's order), ``''`` for an empty slot.

    Args:
        residue: a three-letter name (variants such as ``HID`` or ``CYX`` take
            their standard residue's slots; CHARMM/GROMACS spellings read as in
            [`parse_sequence`][batched_nerf.protein.parse_sequence]) or a one-letter code.

    Returns:
        ``N, CA, C, O`` then the side chain, padded with ``''`` to 14 names.
        ``OXT`` has no ``atom14`` slot.

    Raises:
        TypeError: ``residue`` is not a string.
        ValueError: an unknown residue, or a cap (``ACE``, ``NME``: no residue type of the layout).

    Example:
        >>> from batched_nerf.protein import atom14_names
        >>> atom14_names("SER")[:6], atom14_names("W")[-1], atom14_names("HID") == atom14_names("HIS")
        (('N', 'CA', 'C', 'O', 'CB', 'OG'), 'CH2', True)
    """
    names = _ATOM14[_three(residue, "atom14")]
    return names + ("",) * (14 - len(names))


# ----------------------------------------------------------------------------- index maps


def _table(sequence: Any, hydrogens: bool) -> ProteinTable | PackedProteins:
    if isinstance(sequence, (ProteinTable, PackedProteins)):
        if hydrogens and not sequence.hydrogens:
            raise ValueError(
                "hydrogens=True, but the given table has heavy atoms only: make it with hydrogens=True"
            )
        return sequence
    return protein_table(sequence, hydrogens=hydrogens)


def _tables(t: ProteinTable | PackedProteins) -> tuple[list[ProteinTable], bool]:
    return (t.tables, True) if isinstance(t, PackedProteins) else ([t], False)


def _slots(t: ProteinTable, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(slot (N,), present (L, width))``: each atom's slot ``r * width + s`` (``-1``: none); cached."""
    cache = memo(t, "layout_slots", dict)
    if width not in cache:
        slot_of = []
        for r, res in enumerate(t.residues):
            if res in CAPS:
                raise ValueError(
                    f"residue {r} is the cap {res}: caps have no atom{width} residue type "
                    "(the layouts hold the 20 amino acids only)"
                )
            base = base_residue(res)
            slot_of.append(_ATOM37_INDEX if width == 37 else {n: k for k, n in enumerate(_ATOM14[base])})
        res_of = t.residue_index.numpy()
        slot = np.array(
            [
                r * width + slot_of[r][n] if n in slot_of[r] else -1
                for r, n in zip(res_of.tolist(), t.atom_names)
            ],
            dtype=np.int64,
        )
        present = np.zeros(t.n_residues * width, dtype=bool)
        present[slot[slot >= 0]] = True
        cache[width] = (slot, present.reshape(t.n_residues, width))
    return cache[width]


class _Maps:
    """Gather indices between a table's atoms (padded ``(B, N_max)`` for a packed one) and a layout.

    ``to_index`` ``(B*L_max*width,)``: the atom of each slot in ``cat([atoms, zero])``;
    ``from_index`` ``(B*N_max,)``: the slot of each atom in ``cat([slots, zero, nan, oxt])``
    (padding: the zero; hydrogens: the NaN; atom14's OXT: its ideal position ``oxt``, computed
    from the ``oxt_refs`` ``(B, 3)`` slots of C, CA and O of each chain's last residue);
    ``ideal_index``: the same with every OXT placed ideally.
    """

    @outside_inference_mode
    def __init__(self, t: ProteinTable | PackedProteins, width: int) -> None:
        tables, packed = _tables(t)
        n_max = max(p.n_atoms for p in tables)
        l_max = max(p.n_residues for p in tables)
        n_slots = len(tables) * l_max * width
        to_index = np.full(n_slots, len(tables) * n_max, dtype=np.int64)
        from_index = np.full(len(tables) * n_max, n_slots, dtype=np.int64)  # padding: the zero row
        present = np.zeros((len(tables), l_max, width), dtype=bool)
        oxt_rows, oxt_refs, names = [], [], []
        c, ca, o = (2, 1, 4) if width == 37 else (2, 1, 3)
        for b, p in enumerate(tables):
            slot, here = _slots(p, width)
            present[b, : p.n_residues] = here
            atoms = np.arange(p.n_atoms) + b * n_max
            has = slot >= 0
            to_index[slot[has] + b * l_max * width] = atoms[has]
            from_index[atoms[has]] = slot[has] + b * l_max * width
            from_index[atoms[~has]] = n_slots + 1  # hydrogens (and atom14's OXT, set below): NaN
            last = (p.n_residues - 1) * width + b * l_max * width
            oxt_rows.append(atoms[p.atom(p.n_residues - 1, "OXT")])
            oxt_refs.append([last + c, last + ca, last + o])
            names.append(p.residues)
        ideal = from_index.copy()
        ideal[oxt_rows] = n_slots + 2 + np.arange(len(oxt_rows))
        self.packed, self.width, self.n_max, self.l_max, self.batch = packed, width, n_max, l_max, len(tables)
        self.n_atoms = tables[0].n_atoms
        self.names = names
        self.index = {
            "to": torch.from_numpy(to_index),
            "from": torch.from_numpy(ideal if width == 14 else from_index),
            "ideal": torch.from_numpy(ideal),
        }
        self.oxt_refs = torch.tensor(oxt_refs, dtype=torch.long).reshape(-1, 3)
        self.present = torch.from_numpy(present if packed else present[0])
        self._on: dict[tuple[str, torch.device], Tensor] = {}

    def on(self, key: str, device: torch.device) -> Tensor:
        """An index tensor (``"to"``, ``"from"``, ``"oxt"``) or the mask (``"mask"``) on ``device``."""
        if (key, device) not in self._on:
            value = {"oxt": self.oxt_refs, "mask": self.present}.get(key)
            with torch.inference_mode(False):  # a first call under inference_mode still serves training
                self._on[(key, device)] = (self.index[key] if value is None else value).to(device)
        return self._on[(key, device)]


def _maps(t: ProteinTable | PackedProteins, width: int) -> _Maps:
    cache = memo(t, "layout_maps", dict)
    if width not in cache:
        cache[width] = _Maps(t, width)
    return cache[width]


def _coordinates(value: Any, name: str, shape: tuple[int, ...], what: str) -> Tensor:
    value = _float(value, name, None)
    if value.dim() < len(shape) or tuple(value.shape[-len(shape) :]) != shape:
        raise ValueError(f"{name} must have shape (..., {', '.join(map(str, shape))}) ({what}), "
                         f"got {tuple(value.shape)}")  # fmt: skip
    return value


def _to_layout(xyz: Any, sequence: Any, hydrogens: bool, width: int) -> tuple[Tensor, Tensor]:
    m = _maps(_table(sequence, hydrogens), width)
    lead = (m.batch, m.n_max) if m.packed else (m.n_atoms,)
    what = "B sequences, N_max padded atoms, xyz" if m.packed else "N atoms of the sequence, xyz"
    xyz = _coordinates(xyz, "xyz", (*lead, 3), what)
    flat = xyz.flatten(-len(lead) - 1, -2) if m.packed else xyz
    flat = torch.cat([flat, flat.new_zeros(()).expand(*flat.shape[:-2], 1, 3)], dim=-2)
    out = flat.index_select(-2, m.on("to", xyz.device))
    shape = (m.batch, m.l_max, width) if m.packed else (m.l_max, width)
    return out.unflatten(-2, shape), m.on("mask", xyz.device).clone()  # a copy: callers may edit it


def _ideal_oxt(c: Tensor, ca: Tensor, o: Tensor) -> Tensor:
    """OXT of a C-terminal carboxylate: in the plane of CA, C, O, opposite O, at the template values."""
    u = ca - c
    u = u / torch.linalg.vector_norm(u, dim=-1, keepdim=True)
    w = o - c
    w = w - (w * u).sum(-1, keepdim=True) * u
    w = w / torch.linalg.vector_norm(w, dim=-1, keepdim=True)
    theta = math.radians(CTERM_CA_C_O)
    return c + CTERM_C_O * (math.cos(theta) * u - math.sin(theta) * w)


def _check_mask(m: _Maps, mask: Any, ideal_oxt: bool) -> None:
    """Raise if ``mask`` misses an atom the table needs (``OXT`` allowed missing with ``ideal_oxt``)."""
    mask = torch.as_tensor(mask).to(device="cpu", dtype=torch.bool)
    want = m.present
    if mask.shape[-want.dim() :] != want.shape:
        raise ValueError(
            f"mask must have shape (..., {', '.join(map(str, want.shape))}), got {tuple(mask.shape)}"
        )
    missing = (want & ~mask).reshape(-1, *want.shape).any(0)
    if ideal_oxt and m.width == 37:
        missing[..., -1] = False
    if bool(missing.any()):
        where = missing.nonzero()[0].tolist()
        b, (r, s) = (where[0], where[1:]) if m.packed else (0, where)
        res = m.names[b]
        chain = f"sequence {b}, " if m.packed else ""
        hint = " (ideal_oxt=True places it)" if ATOM37_NAMES[s] == "OXT" and m.width == 37 else ""
        name = ATOM37_NAMES[s] if m.width == 37 else _ATOM14[base_residue(res[r])][s]
        raise ValueError(f"{chain}residue {r} ({res[r]}): atom {name} is absent from the mask{hint}")


def _from_layout(
    layout: Any, sequence: Any, hydrogens: bool, width: int, mask: Any, ideal_oxt: bool
) -> Tensor:
    m = _maps(_table(sequence, hydrogens), width)
    lead = (m.batch, m.l_max, width) if m.packed else (m.l_max, width)
    name = f"atom{width}"
    what = "B sequences, L_max residues, slots, xyz" if m.packed else "L residues, slots, xyz"
    layout = _coordinates(layout, name, (*lead, 3), what)
    if mask is not None:
        _check_mask(m, mask, ideal_oxt)
    flat = layout.flatten(-len(lead) - 1, -2)
    rows = flat.shape[:-2]
    extra = [flat.new_zeros(()).expand(*rows, 1, 3), flat.new_full((), math.nan).expand(*rows, 1, 3)]
    ideal = width == 14 or ideal_oxt
    if ideal:
        refs = flat.index_select(-2, m.on("oxt", flat.device).flatten()).unflatten(-2, (-1, 3))
        extra.append(_ideal_oxt(refs[..., 0, :], refs[..., 1, :], refs[..., 2, :]))
    xyz = torch.cat([flat, *extra], dim=-2).index_select(-2, m.on("ideal" if ideal else "from", flat.device))
    return xyz.unflatten(-2, (m.batch, m.n_max)) if m.packed else xyz


def to_atom37(xyz: Any, sequence: Layout, hydrogens: bool = False) -> tuple[Tensor, Tensor]:
    """The library's atoms of a sequence in OpenFold's ``atom37`` layout.

    Hydrogens (``hydrogens=True``) have no ``atom37`` slot: they are dropped.
    Variants (``HID``, ``CYX``, ``ASH``...) fill their standard residue's slots.

    Args:
        xyz: ``(..., N, 3)`` coordinates (A) in the order of
            [`protein_table`][batched_nerf.protein.protein_table]``(sequence, hydrogens=hydrogens)``;
            for a [`PackedProteins`][batched_nerf.protein.PackedProteins] ``sequence``, the padded
            ``(..., B, N_max, 3)`` of [`build_batch`][batched_nerf.protein.build_batch].
        sequence: a sequence ([`parse_sequence`][batched_nerf.protein.parse_sequence]), its
            [`ProteinTable`][batched_nerf.protein.ProteinTable], or the
            [`PackedProteins`][batched_nerf.protein.PackedProteins] of a mixed batch (a list of
            strings is one sequence of residue names, as for
            [`build`][batched_nerf.protein.build]).
        hydrogens: ``xyz`` holds every atom (the all-atom build). A table's own
            atoms are read where one is given.

    Returns:
        ``(atom37, mask)``: ``atom37`` ``(..., L, 37, 3)`` (A; mixed batch:
        ``(..., B, L_max, 37, 3)``), zeros where the residue has no such atom;
        ``mask`` ``(L, 37)`` (``(B, L_max, 37)``) bool, ``True`` where it has.
        Slots follow [`ATOM37_NAMES`][batched_nerf.protein.ATOM37_NAMES]; ``OXT``
        is filled on the last residue only.

    Raises:
        TypeError: non-floating coordinates, a sequence of the wrong type.
        ValueError: ``xyz`` of the wrong shape (naming it), an unknown residue,
            a cap (``ACE``/``NME`` have no residue type of the layout, naming
            the residue), or ``hydrogens=True`` with a heavy-atom table.

    Example:
        >>> import torch, batched_nerf as bn
        >>> p = bn.protein.build("GW", torch.zeros(2), torch.zeros(2))
        >>> atom37, mask = bn.protein.to_atom37(p.xyz, "GW")
        >>> atom37.shape, mask.sum(1).tolist()
        (torch.Size([2, 37, 3]), [4, 15])
    """
    return _to_layout(xyz, sequence, hydrogens, 37)


def from_atom37(
    atom37: Any,
    sequence: Layout,
    hydrogens: bool = False,
    *,
    mask: Any = None,
    ideal_oxt: bool = False,
) -> Tensor:
    """Coordinates in the library's atom order from OpenFold's ``atom37`` layout (the inverse of
    [`to_atom37`][batched_nerf.protein.to_atom37]).

    Slots the sequence does not use are not read. Hydrogens (``hydrogens=True``)
    have no slot: they come back as NaN, for the caller to place (e.g. by
    [`internal_coordinates`][batched_nerf.protein.internal_coordinates] of the heavy atoms and
    [`build`][batched_nerf.protein.build] with ``hydrogens=True``).

    Args:
        atom37: ``(..., L, 37, 3)`` coordinates (A) in the slots of
            [`ATOM37_NAMES`][batched_nerf.protein.ATOM37_NAMES] (mixed batch:
            ``(..., B, L_max, 37, 3)``).
        sequence: as for [`to_atom37`][batched_nerf.protein.to_atom37].
        hydrogens: return the all-atom order (hydrogens NaN).
        mask: optional ``(..., L, 37)`` bool: which slots hold atoms. When
            given, every atom the sequence needs must be present (checked on
            the host: a device synchronisation).
        ideal_oxt: place the C-terminal ``OXT`` from ``C``, ``CA`` and ``O``
            instead of reading its slot: in their plane, opposite ``O``, at the
            templates' carboxylate bond and angle (1.249 A, 118.4 deg; exact for
            a structure of [`build`][batched_nerf.protein.build]). For layouts with
            no ``OXT`` (e.g. converted from ``atom14``).

    Returns:
        ``(..., N, 3)`` (mixed batch: ``(..., B, N_max, 3)``, zeros in padding),
        differentiable in ``atom37``.

    Raises:
        TypeError: non-floating coordinates, a sequence of the wrong type.
        ValueError: ``atom37`` or ``mask`` of the wrong shape; an atom the
            sequence needs absent from ``mask`` (naming residue index, residue
            and atom); an unknown residue or a cap.

    Example:
        >>> import torch, batched_nerf as bn
        >>> p = bn.protein.build("GW", torch.zeros(2), torch.zeros(2))
        >>> atom37, mask = bn.protein.to_atom37(p.xyz, "GW")
        >>> torch.equal(bn.protein.from_atom37(atom37, "GW", mask=mask), p.xyz)
        True
    """
    return _from_layout(atom37, sequence, hydrogens, 37, mask, ideal_oxt)


def to_atom14(xyz: Any, sequence: Layout, hydrogens: bool = False) -> tuple[Tensor, Tensor]:
    """The library's atoms of a sequence in OpenFold's ``atom14`` layout.

    As [`to_atom37`][batched_nerf.protein.to_atom37], with each residue's slots
    of [`atom14_names`][batched_nerf.protein.atom14_names]. Hydrogens and the
    C-terminal ``OXT`` have no ``atom14`` slot: they are dropped
    ([`from_atom14`][batched_nerf.protein.from_atom14] places ``OXT`` again).

    Args:
        xyz: ``(..., N, 3)`` coordinates (A) (mixed batch: ``(..., B, N_max, 3)``).
        sequence: a sequence, its [`ProteinTable`][batched_nerf.protein.ProteinTable],
            or a [`PackedProteins`][batched_nerf.protein.PackedProteins].
        hydrogens: ``xyz`` holds every atom.

    Returns:
        ``(atom14, mask)``: ``(..., L, 14, 3)`` (A, zeros in empty slots) and
        ``(L, 14)`` bool (mixed batch: ``(..., B, L_max, 14, 3)``, ``(B, L_max, 14)``).

    Raises:
        TypeError: non-floating coordinates, a sequence of the wrong type.
        ValueError: ``xyz`` of the wrong shape, an unknown residue, a cap.

    Example:
        >>> import torch, batched_nerf as bn
        >>> p = bn.protein.build("GW", torch.zeros(2), torch.zeros(2))
        >>> atom14, mask = bn.protein.to_atom14(p.xyz, "GW")
        >>> atom14.shape, mask.sum(1).tolist()
        (torch.Size([2, 14, 3]), [4, 14])
    """
    return _to_layout(xyz, sequence, hydrogens, 14)


def from_atom14(atom14: Any, sequence: Layout, hydrogens: bool = False, *, mask: Any = None) -> Tensor:
    """Coordinates in the library's atom order from OpenFold's ``atom14`` layout (the inverse of
    [`to_atom14`][batched_nerf.protein.to_atom14]).

    The C-terminal ``OXT``, which has no ``atom14`` slot, is placed from ``C``,
    ``CA`` and ``O`` of the last residue (as ``ideal_oxt`` of
    [`from_atom37`][batched_nerf.protein.from_atom37]: exact, to rounding, for a
    structure of [`build`][batched_nerf.protein.build]); hydrogens
    (``hydrogens=True``) come back as NaN.

    Args:
        atom14: ``(..., L, 14, 3)`` coordinates (A) (mixed batch: ``(..., B, L_max, 14, 3)``).
        sequence: as for [`to_atom14`][batched_nerf.protein.to_atom14].
        hydrogens: return the all-atom order (hydrogens NaN).
        mask: optional ``(..., L, 14)`` bool; when given, every atom the
            sequence needs must be present.

    Returns:
        ``(..., N, 3)`` (mixed batch: ``(..., B, N_max, 3)``), differentiable in ``atom14``.

    Raises:
        TypeError: non-floating coordinates, a sequence of the wrong type.
        ValueError: ``atom14`` or ``mask`` of the wrong shape; an atom absent
            from ``mask`` (naming residue index, residue and atom); an unknown
            residue or a cap.

    Example:
        >>> import torch, batched_nerf as bn
        >>> p = bn.protein.build("GW", torch.zeros(2), torch.zeros(2))
        >>> back = bn.protein.from_atom14(bn.protein.to_atom14(p.xyz, "GW")[0], "GW")
        >>> bool((back - p.xyz).abs().max() < 1e-5)
        True
    """
    return _from_layout(atom14, sequence, hydrogens, 14, mask, True)
