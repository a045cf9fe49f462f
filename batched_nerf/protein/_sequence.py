"""Construction tables of protein heavy atoms, one per sequence, cached."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._table import ConstructionTable
from ._templates import (
    BACKBONE,
    CHI_NAMES,
    CTERM_C_O,
    CTERM_CA_C_O,
    DEFAULT_CHI,
    L_CB_SIGN,
    ONE_TO_THREE,
    SIDE_CHAINS,
    THREE_TO_ONE,
    Branch,
    branch_dihedral,
)

#: Backbone torsion names; with :data:`CHI_NAMES` the names :meth:`ProteinTable.row` accepts.
BACKBONE_TORSIONS = ("phi", "psi", "omega")
TORSION_NAMES = BACKBONE_TORSIONS + CHI_NAMES
#: Size of the per-sequence table cache (:func:`protein_table`).
CACHE_SIZE = 4096


def parse_sequence(sequence: Any) -> str:
    """One-letter sequence from a string (``"ACD"``) or a list of three-letter names (``["ALA", ...]``).

    Raises:
        TypeError: not a string or a sequence of strings.
        ValueError: an empty sequence or an unknown residue, naming its position.

    Example:
        >>> parse_sequence(["ALA", "GLY"]), parse_sequence("ag")
        ('AG', 'AG')
    """
    if isinstance(sequence, str):
        letters = sequence.upper()
        for k, letter in enumerate(letters):
            if letter not in ONE_TO_THREE:
                raise ValueError(
                    f"unknown residue letter {letter!r} at position {k} of the sequence; "
                    f"expected one of the 20 standard amino acids {''.join(sorted(ONE_TO_THREE))}"
                )
    elif isinstance(sequence, Sequence) and all(isinstance(s, str) for s in sequence):
        out = []
        for k, name in enumerate(sequence):
            if name.upper() not in THREE_TO_ONE:
                raise ValueError(
                    f"unknown residue name {name!r} at position {k} of the sequence; "
                    "expected a three-letter code of the 20 standard amino acids"
                )
            out.append(THREE_TO_ONE[name.upper()])
        letters = "".join(out)
    else:
        raise TypeError(
            f"sequence must be a string or a list of residue names, got {type(sequence).__name__}"
        )
    if not letters:
        raise ValueError("the sequence is empty")
    return letters


class ProteinTable:
    """Heavy atoms of one amino-acid sequence as a Z-matrix, with named torsion rows.

    Made by :func:`protein_table` (cached per sequence). Atoms come residue by
    residue in PDB order (``N, CA, C, O``, side chain, and ``OXT`` after the last
    residue's side chain). Rows (``R`` = residue ``i``, ``R-1`` the previous one)::

        N(0): root;  CA(0): (N);  C(0): (CA, N)
        N(i)   (C(i-1), CA(i-1), N(i-1))   dihedral psi(i-1)
        CA(i)  (N(i), C(i-1), CA(i-1))     dihedral omega(i-1)
        C(i)   (CA(i), N(i), C(i-1))       dihedral phi(i)
        O(i)   (C(i), CA(i), N(i+1))       180 deg  (last residue: (C, CA, OXT))
        OXT    (C, CA, N)                  dihedral psi(L-1)
        CB     (CA, N, C)                  L-chirality, from the three angles at CA
        side chain as in :data:`~batched_nerf.protein._templates.SIDE_CHAINS`

    so each of phi, psi, omega, chi1-chi4 is the dihedral of exactly one row
    (:meth:`row`, :attr:`torsion_rows`).

    Attributes:
        sequence: one-letter sequence, length ``L``.
        residues: three-letter names, ``L``.
        table: the :class:`~batched_nerf.ConstructionTable` of the ``N`` atoms.
        atom_names: ``N`` PDB atom names.
        elements: ``N`` element symbols.
        residue_index: ``(N,)`` ``torch.long`` residue of each atom.
        bonds, angles, dihedrals: ``(N,)`` float64 template values (A, radians);
            the torsion rows hold the defaults (trans omega, the
            :data:`~batched_nerf.protein._templates.DEFAULT_CHI` rotamer; phi and
            psi ``0``, they are always given).
        torsion_rows: ``(L, 7)`` ``torch.long`` row of phi, psi, omega, chi1..chi4
            of each residue, ``-1`` where the residue has no such torsion.
    """

    def __init__(self, sequence: str) -> None:
        self.sequence = sequence
        self.residues = tuple(ONE_TO_THREE[s] for s in sequence)
        n_res = len(sequence)
        names: list[str] = []
        res_index: list[int] = []
        refs: list[list[Any]] = []  # (name, residue) keys, resolved below
        values: list[tuple[float, float, float]] = []
        torsion: dict[tuple[int, int], int] = {}
        default_chi = np.zeros((n_res, 4))

        def add(i: int, name: str, ref: list[tuple[int, str]], b: float, a: float, d: float) -> int:
            names.append(name)
            res_index.append(i)
            refs.append(ref)
            values.append((b, a, d))
            return len(names) - 1

        for i, res in enumerate(self.residues):
            bb = BACKBONE[res]
            last = i == n_res - 1
            if i == 0:
                add(i, "N", [], 0.0, 0.0, 0.0)
                add(i, "CA", [(i, "N")], bb.n_ca, 0.0, 0.0)
                add(i, "C", [(i, "CA"), (i, "N")], bb.ca_c, bb.n_ca_c, 0.0)
            else:
                torsion[(i - 1, 1)] = add(
                    i, "N", [(i - 1, "C"), (i - 1, "CA"), (i - 1, "N")], bb.c_n, bb.ca_c_n, 0.0
                )
                torsion[(i - 1, 2)] = add(
                    i, "CA", [(i, "N"), (i - 1, "C"), (i - 1, "CA")], bb.n_ca, bb.c_n_ca, 180.0
                )
                torsion[(i, 0)] = add(i, "C", [(i, "CA"), (i, "N"), (i - 1, "C")], bb.ca_c, bb.n_ca_c, 0.0)
            if last:
                add(i, "O", [(i, "C"), (i, "CA"), (i, "OXT")], CTERM_C_O, CTERM_CA_C_O, 180.0)
            else:
                add(i, "O", [(i, "C"), (i, "CA"), (i + 1, "N")], bb.c_o, bb.ca_c_o, 180.0)
            if res != "GLY":
                cb = branch_dihedral(bb.n_ca_cb, bb.n_ca_c, bb.c_ca_cb, L_CB_SIGN)
                add(i, "CB", [(i, "CA"), (i, "N"), (i, "C")], bb.ca_cb, bb.n_ca_cb, cb)
            angle_of = {"CB": bb.n_ca_cb}
            chis = DEFAULT_CHI[res]
            for atom in SIDE_CHAINS[res]:
                d = atom.dihedral
                if isinstance(d, Branch):
                    d = branch_dihedral(atom.angle, angle_of[atom.dihedral_ref], d.angle_xby, d.sign)
                    value = d
                elif isinstance(d, str):
                    k = CHI_NAMES.index(d)
                    value = chis[k]
                    default_chi[i, k] = value
                else:
                    value = d
                row = add(
                    i, atom.name, [(i, atom.bond_ref), (i, atom.angle_ref), (i, atom.dihedral_ref)],
                    atom.bond, atom.angle, value,
                )  # fmt: skip
                angle_of[atom.name] = atom.angle
                if isinstance(atom.dihedral, str):
                    torsion[(i, 3 + CHI_NAMES.index(atom.dihedral))] = row
            if last:
                torsion[(i, 1)] = add(i, "OXT", [(i, "C"), (i, "CA"), (i, "N")], CTERM_C_O, CTERM_CA_C_O, 0.0)
        index = {(r, n): k for k, (r, n) in enumerate(zip(res_index, names))}
        ref_arr = np.full((len(names), 3), -1, dtype=np.int64)
        for k, ref in enumerate(refs):
            for j, key in enumerate(ref):
                ref_arr[k, j] = index[key]
        self._index = index
        self.table = ConstructionTable(ref_arr)
        self.atom_names = tuple(names)
        self.elements = tuple(n[0] for n in names)
        self.residue_index = torch.tensor(res_index, dtype=torch.long)
        vals = torch.tensor(values, dtype=torch.float64)
        deg = math.pi / 180.0
        self.bonds = vals[:, 0].contiguous()
        self.angles = (vals[:, 1] * deg).contiguous()
        self.dihedrals = (vals[:, 2] * deg).contiguous()
        rows = torch.full((n_res, 7), -1, dtype=torch.long)
        for (i, k), r in torsion.items():
            rows[i, k] = r
        self.torsion_rows = rows
        self.default_chi = torch.from_numpy(default_chi * deg)
        # dihedrals = cat([template (N), phi (L), psi (L), omega (L), chi (4L)])[source]
        n = len(names)
        source = torch.arange(n)
        res, kind = (rows >= 0).nonzero(as_tuple=True)
        offset = torch.where(kind < 3, n + kind * n_res + res, n + 3 * n_res + 4 * res + (kind - 3))
        self.source = source.index_put((rows[res, kind],), offset)

    @property
    def n_atoms(self) -> int:
        """Number of heavy atoms ``N``."""
        return len(self.atom_names)

    @property
    def n_residues(self) -> int:
        """Number of residues ``L``."""
        return len(self.sequence)

    @property
    def chi_mask(self) -> Tensor:
        """``(L, 4)`` bool: which chi torsions each residue has."""
        return self.torsion_rows[:, 3:] >= 0

    def atom(self, residue: int, name: str) -> int:
        """Row of atom ``name`` of residue ``residue`` (0-based).

        Raises:
            ValueError: no such atom.

        Example:
            >>> import batched_nerf as bn
            >>> bn.protein.protein_table("AG").atom(1, "CA")
            6
        """
        try:
            return self._index[(residue, name)]
        except KeyError:
            raise ValueError(
                f"residue {residue} ({self.residues[residue] if 0 <= residue < self.n_residues else '?'}) "
                f"has no atom {name!r}"
            ) from None

    def row(self, torsion: str, residue: int) -> int:
        """Row whose dihedral is ``torsion`` (``"phi"``, ``"psi"``, ``"omega"``, ``"chi1"``...) of a residue.

        Raises:
            ValueError: an unknown torsion name, or the residue has no such torsion
                (phi of the first residue, omega of the last, chi beyond the side chain).

        Example:
            >>> import batched_nerf as bn
            >>> t = bn.protein.protein_table("KA")
            >>> t.atom_names[t.row("psi", 0)], t.atom_names[t.row("chi4", 0)]
            ('N', 'NZ')
        """
        if torsion not in TORSION_NAMES:
            raise ValueError(f"unknown torsion {torsion!r}; expected one of {TORSION_NAMES}")
        if not 0 <= residue < self.n_residues:
            raise ValueError(f"residue {residue} out of range [0, {self.n_residues - 1}]")
        r = int(self.torsion_rows[residue, TORSION_NAMES.index(torsion)])
        if r < 0:
            raise ValueError(f"residue {residue} ({self.residues[residue]}) has no {torsion} torsion")
        return r

    def order_from(self, residues: Sequence[int], names: Sequence[str]) -> Tensor:
        """Permutation taking atoms listed as ``(residue, name)`` (e.g. read from a PDB file) to this table.

        Returns ``perm`` ``(N,)`` with ``xyz_table = xyz_other[..., perm, :]``;
        atoms the table does not have (hydrogens, waters) are skipped.

        Raises:
            ValueError: an atom of the table is missing from the list.

        Example:
            >>> import batched_nerf as bn
            >>> t = bn.protein.protein_table("G")
            >>> t.order_from([0, 0, 0, 0, 0, 0], ["CA", "N", "H", "C", "OXT", "O"]).tolist()
            [1, 0, 3, 5, 4]
        """
        where = {(int(r), str(n)): k for k, (r, n) in enumerate(zip(residues, names))}
        perm = []
        for k, (r, n) in enumerate(zip(self.residue_index.tolist(), self.atom_names)):
            if (r, n) not in where:
                raise ValueError(
                    f"atom {k} ({n} of residue {r}, {self.residues[r]}) is missing from the list"
                )
            perm.append(where[(r, n)])
        return torch.tensor(perm, dtype=torch.long)

    def __repr__(self) -> str:
        seq = self.sequence if len(self.sequence) <= 20 else self.sequence[:17] + "..."
        return f"ProteinTable({seq!r}, n_residues={self.n_residues}, n_atoms={self.n_atoms})"


@functools.lru_cache(maxsize=CACHE_SIZE)
def _cached(sequence: str) -> ProteinTable:
    return ProteinTable(sequence)


def protein_table(sequence: str | Sequence[str]) -> ProteinTable:
    """The (cached) :class:`ProteinTable` of a sequence: analysed once per sequence per process.

    Args:
        sequence: one-letter codes (``"ACDEF"``, case-insensitive) or a list of
            three-letter names.

    Raises:
        TypeError, ValueError: see :func:`parse_sequence`.

    Example:
        >>> import batched_nerf as bn
        >>> t = bn.protein.protein_table("GAW")
        >>> t.n_atoms, t.table.n_atoms, t is bn.protein.protein_table("gaw")
        (24, 24, True)
    """
    if isinstance(sequence, str):
        return _by_string(sequence)
    return _cached(parse_sequence(sequence))


@functools.lru_cache(maxsize=CACHE_SIZE)
def _by_string(sequence: str) -> ProteinTable:
    # a training loop passes the same strings again: skip parsing them
    return _cached(parse_sequence(sequence))
