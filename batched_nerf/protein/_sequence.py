"""Construction tables of protein heavy atoms, one per sequence, cached."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..core.table import ConstructionTable, outside_inference_mode
from ..residues.templates import (
    BACKBONE,
    CHI_NAMES,
    CTERM_C_O,
    CTERM_CA_C_O,
    DEFAULT_CHI,
    L_CB_SIGN,
    ONE_TO_THREE,
    RESIDUE_ALIASES,
    RESIDUE_NAMES,
    RING_BONDS,
    SIDE_CHAINS,
    THREE_TO_ONE,
    Branch,
    base_residue,
    branch_dihedral,
    residue_name,
)
from ._hydrogens import SIDE_CHAIN_H, backbone_h, hydrogen_rows
from ._names import CONVENTIONS, detect_convention, to_pdb_names

#: Backbone torsion names; with :data:`CHI_NAMES` the names :meth:`ProteinTable.row` accepts.
BACKBONE_TORSIONS = ("phi", "psi", "omega")
TORSION_NAMES = BACKBONE_TORSIONS + CHI_NAMES
#: Size of the per-sequence table cache (:func:`protein_table`, least recently used tables dropped).
CACHE_SIZE = 4096
#: Residue names that are not one of the 20 standard ones (variants, caps): alone in a canonical
#: sequence they stand for that one residue.
_SINGLE_NAMES = frozenset(RESIDUE_NAMES[20:])


def public_state(obj: Any) -> dict[str, Any]:
    """What pickles of a protein table (or a packed one): the attributes its constructor makes.

    The private ones are derived on use (bound builds, masks, index maps, dtype casts; some hold
    local functions that do not pickle) and are made again after unpickling.
    """
    return {k: v for k, v in obj.__dict__.items() if not k.startswith("_")}


def _letters_or_names(names: list[str]) -> str:
    """Canonical sequence: one letter per residue if all are standard, else space-separated names.

    Never ambiguous (`residue_names` reads it back): a single non-standard residue is its
    name (``"HID"``), so three standard residues whose letters spell such a name keep their names
    (His-Ile-Asp is ``"HIS ILE ASP"``, not ``"HID"``).
    """
    if all(n in THREE_TO_ONE for n in names):
        letters = "".join(THREE_TO_ONE[n] for n in names)
        if letters not in _SINGLE_NAMES:
            return letters
    return " ".join(names)


def parse_sequence(sequence: Any) -> str:
    """Canonical sequence from one-letter codes, space-separated or listed three-letter names.

    One-letter strings (``"ACD"``, no spaces) name the 20 standard residues; a
    string with spaces (``"ACE ALA NME"``) or a list (``["ALA", "GLY"]``) holds
    three-letter names, which may also be the protonation variants ``HID HIE HIP
    CYX ASH GLH LYN`` and the caps ``ACE`` (first residue only) and ``NME`` (last
    only). CHARMM and GROMACS names read as the variant they mean
    ([`batched_nerf.protein.RESIDUE_ALIASES`][batched_nerf.protein.RESIDUE_ALIASES]: ``HSD``,
    ``HISA``, ``HISD`` -> ``HID``; ``HSE``, ``HISB``, ``HISE`` -> ``HIE``;
    ``HSP``, ``HISH`` -> ``HIP``; ``LYSH`` -> ``LYS``; ``LSN``, ``LYSN`` ->
    ``LYN``; ``ASPP``, ``ASPH`` -> ``ASH``; ``GLUP``, ``GLUH`` -> ``GLH``;
    ``CYSH`` -> ``CYS``; ``CYS2`` -> ``CYX``). The result is one-letter when
    every residue is standard (``HIS`` -> ``"H"``), else the names joined by
    spaces; it is never ambiguous: a lone non-standard residue is its name
    (``["HID"]`` -> ``"HID"``), so one-letter codes that spell such a name keep
    their names (``"HID"``, His-Ile-Asp, -> ``"HIS ILE ASP"``). A string
    without spaces always reads as one-letter codes: give a lone residue name
    as a list.

    Raises:
        TypeError: not a string or a sequence of strings.
        ValueError: an empty sequence, an unknown residue (naming its position),
            a state no template has (``CYM``, ``HIS1``, ``ARN``, ``ARGN``,
            ``TYM``: never replaced by another protonation state), or a cap
            that is not at its end of the chain.

    Example:
        >>> parse_sequence(["ALA", "GLY"]), parse_sequence("ag"), parse_sequence("ace ala nme")
        ('AG', 'AG', 'ACE ALA NME')
        >>> parse_sequence("MET HSD LYSH CYS2")
        'MET HID LYS CYX'
        >>> parse_sequence(["HID"]), parse_sequence("HID")
        ('HID', 'HIS ILE ASP')
    """
    if isinstance(sequence, str) and not any(c.isspace() for c in sequence.strip()):
        letters = sequence.strip().upper()
        for k, letter in enumerate(letters):
            if letter not in ONE_TO_THREE:
                raise ValueError(
                    f"unknown residue letter {letter!r} at position {k} of the sequence; "
                    f"expected one of the 20 standard amino acids {''.join(sorted(ONE_TO_THREE))}"
                )
        names = [ONE_TO_THREE[c] for c in letters]
    elif isinstance(sequence, str) or (
        isinstance(sequence, Sequence) and all(isinstance(s, str) for s in sequence)
    ):
        names = [s.upper() for s in (sequence.split() if isinstance(sequence, str) else sequence)]
        for k, name in enumerate(names):
            try:
                names[k] = residue_name(name)
            except ValueError as exc:
                raise ValueError(f"position {k} of the sequence: {exc}") from None
            if names[k] not in RESIDUE_NAMES:
                raise ValueError(
                    f"unknown residue name {name!r} at position {k} of the sequence; expected a "
                    f"three-letter code of the 20 standard amino acids, one of {RESIDUE_NAMES[20:]} "
                    f"or a CHARMM/GROMACS/Amber spelling of them ({' '.join(RESIDUE_ALIASES)})"
                )
    else:
        raise TypeError(
            f"sequence must be a string or a list of residue names, got {type(sequence).__name__}"
        )
    if not names:
        raise ValueError("the sequence is empty")
    for k, name in enumerate(names):
        if (name == "ACE" and k != 0) or (name == "NME" and (k != len(names) - 1 or k == 0)):
            where = "first" if name == "ACE" else "last (after at least one residue)"
            raise ValueError(f"cap {name} at position {k}: it must be the {where} residue of the chain")
    return _letters_or_names(names)


def residue_names(sequence: str) -> tuple[str, ...]:
    """Three-letter names of a canonical sequence
    ([`parse_sequence`][batched_nerf.protein.parse_sequence])."""
    if " " in sequence or sequence in _SINGLE_NAMES:
        return tuple(sequence.split())
    return tuple(ONE_TO_THREE[s] for s in sequence)


#: Other spellings of atom names that :meth:`ProteinTable.order_from` accepts where a name is missing
#: (OpenMM / Amber / CHARMM / GROMACS), after the translation of CHARMM and GROMACS names
#: (:mod:`~batched_nerf.protein._names`).
NAME_ALIASES: dict[str, tuple[str, ...]] = {
    "H1": ("HH31", "HN1", "HT1", "1H", "H"),
    "H2": ("HH32", "HN2", "HT2", "2H"),
    "H3": ("HH33", "HN3", "HT3", "3H"),
    "H": ("HN",),
    "C": ("CH3",),
    "O": ("OT1", "O1", "OC1"),
    "OXT": ("OT2", "O2", "OC2"),
    "CD1": ("CD",),
}


class _Block(NamedTuple):
    """The rows of one residue in context, with references as (residue offset, local index)."""

    names: tuple[str, ...]
    delta: np.ndarray  # (n, 3) residue offset of each reference (-1, 0, +1)
    local: np.ndarray  # (n, 3) index in that residue's block, -1 for none
    values: np.ndarray  # (n, 3) bond (A), angle, dihedral (deg)
    kind: np.ndarray  # (n,) torsion column (0..6), -1 for none
    owner: np.ndarray  # (n,) residue offset of the torsion's residue
    rotor: np.ndarray  # (n,) bool: a hydrogen rotor torsion
    chi: np.ndarray  # (4,) default chi (deg)


#: Local indices of the atoms a residue references in its neighbours.
_PREV = {"N": 0, "CA": 1, "C": 2}
_PREV_ACE = {"CH3": 0, "C": 1, "O": 2}


def _heavy(res: str, first: bool, last: bool, prev_ace: bool) -> list[tuple]:
    """Heavy rows ``(name, refs, bond, angle, dihedral, torsion)`` of a residue (``"-C"``: the previous C)."""
    base = base_residue(res)
    bb = BACKBONE["GLY" if res in ("ACE", "NME") else base]
    g = BACKBONE["ALA"]
    p_ca, p_n = ("-CH3", "-O") if prev_ace else ("-CA", "-N")
    rows: list[tuple] = []
    if res == "ACE":
        rows.append(("CH3", (), 0.0, 0.0, 0.0, None))
        rows.append(("C", ("CH3",), g.ca_c, 0.0, 0.0, None))
        rows.append(("O", ("C", "CH3"), g.c_o, g.ca_c_o, 0.0, None))
        return rows
    psi = None if prev_ace else (-1, 1)
    if first:
        rows.append(("N", (), 0.0, 0.0, 0.0, None))
        rows.append(("CA", ("N",), bb.n_ca, 0.0, 0.0, None))
    else:
        rows.append(("N", ("-C", p_ca, p_n), bb.c_n, bb.ca_c_n, 180.0 if prev_ace else 0.0, psi))
        rows.append(("CA" if res != "NME" else "C", ("N", "-C", p_ca), bb.n_ca, bb.c_n_ca, 180.0, (-1, 2)))
    if res == "NME":
        return rows
    if first:
        rows.append(("C", ("CA", "N"), bb.ca_c, bb.n_ca_c, 0.0, None))
    else:
        rows.append(("C", ("CA", "N", "-C"), bb.ca_c, bb.n_ca_c, 0.0, (0, 0)))
    if last:
        rows.append(("O", ("C", "CA", "OXT"), CTERM_C_O, CTERM_CA_C_O, 180.0, None))
    else:
        rows.append(("O", ("C", "CA", "+N"), bb.c_o, bb.ca_c_o, 180.0, None))
    if base != "GLY":
        cb = branch_dihedral(bb.n_ca_cb, bb.n_ca_c, bb.c_ca_cb, L_CB_SIGN)
        rows.append(("CB", ("CA", "N", "C"), bb.ca_cb, bb.n_ca_cb, cb, None))
    angle_of = {"CB": bb.n_ca_cb}
    chis = DEFAULT_CHI[base]
    for atom in SIDE_CHAINS[base]:
        d, torsion = atom.dihedral, None
        if isinstance(d, Branch):
            value = branch_dihedral(atom.angle, angle_of[atom.dihedral_ref], d.angle_xby, d.sign)
        elif isinstance(d, str):
            k = CHI_NAMES.index(d)
            value, torsion = chis[k], (0, 3 + k)
        else:
            value = d
        refs = (atom.bond_ref, atom.angle_ref, atom.dihedral_ref)
        rows.append((atom.name, refs, atom.bond, atom.angle, value, torsion))
        angle_of[atom.name] = atom.angle
    if last:
        rows.append(("OXT", ("C", "CA", "N"), CTERM_C_O, CTERM_CA_C_O, 0.0, (0, 1)))
    return rows


@functools.cache  # one entry per residue name and context: a few hundred at most
def _block(res: str, first: bool, last: bool, prev_ace: bool, hydrogens: bool) -> _Block:
    rows = _heavy(res, first, last, prev_ace)
    n_heavy = len(rows)
    rotor = [False] * n_heavy
    if hydrogens:
        groups = backbone_h(res, first) + SIDE_CHAIN_H[res]
        xyz = _ideal_heavy(res, first, prev_ace)
        for h in hydrogen_rows(groups, xyz):
            rows.append((h.name, h.refs, h.bond, h.angle, h.dihedral, None))
            rotor.append(h.rotor)
    names = tuple(r[0] for r in rows)
    own = {name: k for k, name in enumerate(names)}
    prev = _PREV_ACE if prev_ace else _PREV
    n = len(rows)
    delta = np.zeros((n, 3), dtype=np.int64)
    local = np.full((n, 3), -1, dtype=np.int64)
    for k, row in enumerate(rows):
        for j, ref in enumerate(row[1]):
            if ref[0] == "-":
                delta[k, j], local[k, j] = -1, prev[ref[1:]]
            elif ref[0] == "+":
                delta[k, j], local[k, j] = 1, 0  # the next residue's N is its first atom
            else:
                local[k, j] = own[ref]
    values = np.array([r[2:5] for r in rows], dtype=np.float64)
    kind = np.array([-1 if r[5] is None else r[5][1] for r in rows], dtype=np.int64)
    owner = np.array([0 if r[5] is None else r[5][0] for r in rows], dtype=np.int64)
    chi = np.zeros(4)
    chis = DEFAULT_CHI.get(base_residue(res), ())
    chi[: len(chis)] = chis
    return _Block(names, delta, local, values, kind, owner, np.array(rotor, dtype=bool), chi)


def _nerf(
    b: np.ndarray, a: np.ndarray, d: np.ndarray, bond: float, angle: float, dihedral: float
) -> np.ndarray:
    """One atom at ``bond`` from ``b``, at ``angle`` with ``a`` and ``dihedral`` from ``d`` (degrees)."""
    th, ph = math.radians(angle), math.radians(dihedral)
    bc = b - a
    bc /= np.linalg.norm(bc)
    n = np.cross(a - d, bc)
    n /= np.linalg.norm(n)
    m = np.cross(n, bc)
    local = bond * np.array([-math.cos(th), math.sin(th) * math.cos(ph), math.sin(th) * math.sin(ph)])
    return b + local[0] * bc + local[1] * m + local[2] * n


@functools.cache
def _ideal_heavy_cached(res: str, first: bool, prev_ace: bool) -> dict[str, np.ndarray]:
    """Heavy atoms of ``res`` (``-X``: of the previous residue) in a short ideal peptide, by a small NeRF."""
    if res == "ACE":
        context, at = ["ACE", "GLY"], 0
    elif first:
        context, at = [res, "GLY"], 0
    else:
        context, at = ["ACE" if prev_ace else "GLY", res] + ([] if res == "NME" else ["GLY"]), 1
    rows = {}
    for i, r in enumerate(context):
        for name, refs, bond, angle, dihedral, torsion in _heavy(
            r, i == 0, i == len(context) - 1, i > 0 and context[i - 1] == "ACE"
        ):
            if torsion is not None and torsion[1] < 3:  # phi -1.2, psi 2.4, omega pi (radians)
                dihedral = math.degrees((-1.2, 2.4, math.pi)[torsion[1]])
            keys = [
                (i - 1, x[1:]) if x[0] == "-" else (i + 1, x[1:]) if x[0] == "+" else (i, x) for x in refs
            ]
            rows[(i, name)] = (keys, bond, angle, dihedral)
    xyz: dict[tuple[int, str], np.ndarray] = {}
    while len(xyz) < len(rows):  # place every atom once its references are placed
        for key, (keys, bond, angle, dihedral) in rows.items():
            if key in xyz or not all(k in xyz for k in keys):
                continue
            if len(keys) == 0:
                xyz[key] = np.zeros(3)
            elif len(keys) == 1:
                xyz[key] = xyz[keys[0]] + np.array([bond, 0.0, 0.0])
            elif len(keys) == 2:
                b, a = xyz[keys[0]], xyz[keys[1]]
                xyz[key] = _nerf(b, a, a + np.array([0.0, -1.0, 0.0]), bond, angle, 0.0)
            else:
                xyz[key] = _nerf(xyz[keys[0]], xyz[keys[1]], xyz[keys[2]], bond, angle, dihedral)
    out = {}
    for (r, name), x in xyz.items():
        if r == at:
            out[name] = x
        elif r == at - 1:
            out["-" + name] = x
    return out


def _ideal_heavy(res: str, first: bool, prev_ace: bool):
    return _ideal_heavy_cached(res, first, prev_ace).__getitem__


class ProteinTable:
    """The atoms of one sequence as a Z-matrix, with named torsion rows (heavy atoms, or every atom).

    Made by [`protein_table`][batched_nerf.protein.protein_table] (cached per sequence). Atoms come residue by
    residue in PDB order (``N, CA, C, O``, side chain, and ``OXT`` after the last
    residue's side chain; with ``hydrogens`` each residue's hydrogens follow its
    heavy atoms). Rows (``R`` = residue ``i``, ``R-1`` the previous one):

    ```text
    N(0): root;  CA(0): (N);  C(0): (CA, N)
    N(i)   (C(i-1), CA(i-1), N(i-1))   dihedral psi(i-1)
    CA(i)  (N(i), C(i-1), CA(i-1))     dihedral omega(i-1)
    C(i)   (CA(i), N(i), C(i-1))       dihedral phi(i)
    O(i)   (C(i), CA(i), N(i+1))       180 deg  (last residue: (C, CA, OXT))
    OXT    (C, CA, N)                  dihedral psi(L-1)
    CB     (CA, N, C)                  L-chirality, from the three angles at CA
    side chain as in `SIDE_CHAINS`
    ACE    CH3 root; C (CH3); O (C, CH3); the next N (C, CH3, O) at 180 deg
    NME    N as above; C (N, C(i-1), CA(i-1)) dihedral omega(i-1)
    H      on their heavy atom (`_hydrogens`)
    ```

    so each of phi, psi, omega, chi1-chi4 is the dihedral of exactly one row
    ([`row`][batched_nerf.protein.ProteinTable.row], `torsion_rows`), and so is each hydrogen rotor
    (`rotor_rows`).

    Attributes:
        sequence: canonical sequence ([`parse_sequence`][batched_nerf.protein.parse_sequence]): one-letter, or
            three-letter names separated by spaces.
        residues: three-letter names, ``L``.
        hydrogens: whether the table holds the hydrogens.
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable] of the ``N`` atoms.
        atom_names: ``N`` PDB atom names.
        elements: ``N`` element symbols.
        residue_index: ``(N,)`` ``torch.long`` residue of each atom.
        bonds, angles, dihedrals: ``(N,)`` float64 template values (A, radians);
            the torsion rows hold the defaults (trans omega, the
            [`DEFAULT_CHI`][batched_nerf.protein.DEFAULT_CHI] rotamer, staggered
            rotors; phi and psi ``0``, they are always given).
        torsion_rows: ``(L, 7)`` ``torch.long`` row of phi, psi, omega, chi1..chi4
            of each residue, ``-1`` where the residue has no such torsion.
        rotor_rows: ``(K,)`` ``torch.long`` rows whose dihedral turns a methyl,
            ammonium, amine, hydroxyl or thiol group (empty without hydrogens).
        rotor_names: ``K`` ``(residue, atom name)`` of the rotor rows.

    Its tensors are made outside ``torch.inference_mode``: a table first made in
    a validation pass (and cached) still serves training afterwards.
    """

    def __getstate__(self) -> dict[str, Any]:
        return public_state(self)

    @outside_inference_mode
    def __init__(self, sequence: str, hydrogens: bool = False) -> None:
        self.sequence = sequence
        self.hydrogens = bool(hydrogens)
        self.residues = residue_names(sequence)
        res = self.residues
        n_res = len(res)
        # one template block per residue in its context, concatenated with index offsets
        blocks = [
            _block(r, i == 0, i == n_res - 1, i > 0 and res[i - 1] == "ACE", self.hydrogens)
            for i, r in enumerate(res)
        ]
        sizes = np.array([len(b.names) for b in blocks], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        res_of = np.repeat(np.arange(n_res), sizes)
        delta = np.concatenate([b.delta for b in blocks])
        local = np.concatenate([b.local for b in blocks])
        target = np.clip(res_of[:, None] + delta, 0, n_res - 1)
        ref_arr = np.where(local >= 0, offsets[target] + local, -1)
        values = np.concatenate([b.values for b in blocks])
        kind = np.concatenate([b.kind for b in blocks])
        owner = res_of + np.concatenate([b.owner for b in blocks])
        rotor = np.concatenate([b.rotor for b in blocks])
        names = tuple(itertools.chain.from_iterable(b.names for b in blocks))
        self.table = ConstructionTable(ref_arr)
        self.atom_names = names
        self.elements = tuple(n[0] for n in names)
        self.residue_index = torch.from_numpy(res_of)
        vals = torch.from_numpy(values)
        deg = math.pi / 180.0
        self.bonds = vals[:, 0].contiguous()
        self.angles = (vals[:, 1] * deg).contiguous()
        self.dihedrals = (vals[:, 2] * deg).contiguous()
        rows = torch.full((n_res, 7), -1, dtype=torch.long)
        has = np.nonzero(kind >= 0)[0]
        rows[torch.from_numpy(owner[has]), torch.from_numpy(kind[has])] = torch.from_numpy(has)
        self.torsion_rows = rows
        self.default_chi = torch.from_numpy(np.stack([b.chi for b in blocks]) * deg)
        rotor_rows = np.nonzero(rotor)[0]
        self.rotor_rows = torch.from_numpy(rotor_rows)
        self.rotor_names = tuple((int(res_of[k]), names[k]) for k in rotor_rows)
        # dihedrals = cat([template (N), phi (L), psi (L), omega (L), chi (4L)])[source]
        n = len(names)
        source = torch.arange(n)
        r, c = (rows >= 0).nonzero(as_tuple=True)
        offset = torch.where(c < 3, n + c * n_res + r, n + 3 * n_res + 4 * r + (c - 3))
        self.source = source.index_put((rows[r, c],), offset)

    @functools.cached_property
    def _index(self) -> dict[tuple[int, str], int]:
        return {(r, n): k for k, (r, n) in enumerate(zip(self.residue_index.tolist(), self.atom_names))}

    @functools.cached_property
    def connectivity(self) -> np.ndarray:
        """``(E, 2)`` ``int64`` chemical bonds ``i < j``: every row's bond reference and each ring's bonds.

        The bond references of a protein table are chemical bonds that span a
        tree; the rings of Pro (``N-CD``), Phe, Tyr, His and Trp close with
        bonds that are no reference. [`batched_nerf.losses.clash_loss`][batched_nerf.losses.clash_loss] reads
        this when given the protein table, so ring atoms are not scored as clashes.

        Example:
            >>> import batched_nerf as bn
            >>> t = bn.protein.protein_table("P")
            >>> [t.atom(0, "N"), t.atom(0, "CD")] in t.connectivity.tolist()
            True
        """
        refs = self.table.topology.refs
        child = np.flatnonzero(refs[:, 0] >= 0)
        pairs = [np.stack([child, refs[child, 0]], axis=1)]
        for r, name in enumerate(self.residues):
            for a, b in RING_BONDS.get(base_residue(name), ()):
                pairs.append(np.array([[self._index[(r, a)], self._index[(r, b)]]], dtype=np.int64))
        both = np.sort(np.concatenate(pairs), axis=1)
        out = np.unique(both, axis=0) if len(both) else np.zeros((0, 2), dtype=np.int64)
        out.setflags(write=False)
        return out

    @property
    def n_atoms(self) -> int:
        """Number of atoms ``N``."""
        return len(self.atom_names)

    @property
    def n_residues(self) -> int:
        """Number of residues ``L``."""
        return len(self.residues)

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

    def order_from(
        self, residues: Sequence[int], names: Sequence[str], *, convention: str = "auto"
    ) -> Tensor:
        """Permutation taking atoms listed as ``(residue, name)`` (e.g. read from a PDB file) to this table.

        Returns ``perm`` ``(N,)`` with ``xyz_table = xyz_other[..., perm, :]``;
        atoms the table does not have (hydrogens of a heavy-atom table, waters)
        are skipped. ``residues`` are 0-based positions in the sequence.

        Names are read in one of the conventions of
        `_names` (``convention="pdb"``,
        ``"charmm"``, ``"gromacs"``; ``"auto"``: CHARMM if a CHARMM-only name
        such as ``HN`` or ``OT1`` occurs, GROMACS if a methylene is numbered
        ``HB1 HB2``, else PDB), each translated to the PDB name of the atom in
        the same place (CHARMM ``HB1`` is PDB ``HB3``, GROMACS ``HB1`` PDB
        ``HB2``; Ile ``CD`` is ``CD1``; the table in ``docs/protein.md``).
        A name still missing may be found under the other spellings of
        [`NAME_ALIASES`][batched_nerf.protein.NAME_ALIASES] (``H`` for the N-terminal ``H1`` as OpenMM's
        ``Modeller.addHydrogens`` writes it, Amber's ``HH31``... for the caps'
        ``H1``..., ``OT2``/``O2``/``OC2`` for ``OXT``).

        Raises:
            ValueError: an atom of the table is missing from the list, two
                listed atoms of a residue have the same name (after
                translation), two atoms of the table matched the same listed
                atom, or an unknown ``convention``.

        Example:
            >>> import batched_nerf as bn
            >>> t = bn.protein.protein_table("G")
            >>> t.order_from([0, 0, 0, 0, 0, 0], ["CA", "N", "H", "C", "OXT", "O"]).tolist()
            [1, 0, 3, 5, 4]
            >>> t.order_from([0] * 5, ["N", "CA", "C", "OT1", "OT2"]).tolist()  # CHARMM C-terminus
            [0, 1, 2, 3, 4]
        """
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        listed = [(int(r), str(n)) for r, n in zip(residues, names)]
        by_residue: dict[int, list[str]] = {}
        for r, n in listed:
            by_residue.setdefault(r, []).append(n)
        if convention == "auto":
            own: dict[int, set[str]] = {}
            for r, n in zip(self.residue_index.tolist(), self.atom_names):
                own.setdefault(r, set()).add(n)
            convention = detect_convention(by_residue, own)
        rename = {
            r: to_pdb_names(self.residues[r], found, convention, first=r == 0)
            for r, found in by_residue.items()
            if 0 <= r < self.n_residues
        }
        where: dict[tuple[int, str], int] = {}
        for k, (r, n) in enumerate(listed):
            key = (r, rename.get(r, {}).get(n, n))
            if key in where:
                raise ValueError(
                    f"listed atoms {where[key]} and {k} of residue {r} are both {key[1]} "
                    f"(read as {convention} names); list each atom once"
                )
            where[key] = k
        perm = []
        for k, (r, n) in enumerate(zip(self.residue_index.tolist(), self.atom_names)):
            if (r, n) not in where:
                alias = next((a for a in NAME_ALIASES.get(n, ()) if (r, a) in where), None)
                if alias is not None:
                    perm.append(where[(r, alias)])
                    continue
                raise ValueError(
                    f"atom {k} ({n} of residue {r}, {self.residues[r]}) is missing from the list "
                    f"(read as {convention} names)"
                )
            perm.append(where[(r, n)])
        if len(set(perm)) != len(perm):
            k = next(k for k, p in enumerate(perm) if perm.count(p) > 1)
            raise ValueError(
                f"atom {k} ({self.atom_names[k]} of residue {int(self.residue_index[k])}) matched an atom "
                "of the list that another atom of the table matched too (an alias); list every atom"
            )
        return torch.tensor(perm, dtype=torch.long)

    def __repr__(self) -> str:
        seq = self.sequence if len(self.sequence) <= 20 else self.sequence[:17] + "..."
        return f"ProteinTable({seq!r}, n_residues={self.n_residues}, n_atoms={self.n_atoms})"


@functools.lru_cache(maxsize=CACHE_SIZE)
def _cached(sequence: str, hydrogens: bool) -> ProteinTable:
    return ProteinTable(sequence, hydrogens)


def protein_table(sequence: str | Sequence[str], *, hydrogens: bool = False) -> ProteinTable:
    """The (cached) [`ProteinTable`][batched_nerf.protein.ProteinTable] of a sequence: analysed once per
    sequence per process.

    Args:
        sequence: one-letter codes (``"ACDEF"``, case-insensitive), three-letter
            names separated by spaces (``"ACE ALA NME"``) or a list of them
            (see [`parse_sequence`][batched_nerf.protein.parse_sequence]).
        hydrogens: include every hydrogen (Amber / PDB names, after each residue's heavy atoms).

    The cache keeps the `CACHE_SIZE` (4,096) most recently used tables.

    Raises:
        TypeError, ValueError: see [`parse_sequence`][batched_nerf.protein.parse_sequence].

    Example:
        >>> import batched_nerf as bn
        >>> t = bn.protein.protein_table("GAW")
        >>> t.n_atoms, t.table.n_atoms, t is bn.protein.protein_table("gaw")
        (24, 24, True)
        >>> bn.protein.protein_table("ACE ALA NME", hydrogens=True).n_atoms
        22
    """
    if isinstance(sequence, str):
        return _cached(_by_string(sequence), bool(hydrogens))
    return _cached(parse_sequence(sequence), bool(hydrogens))


@functools.lru_cache(maxsize=CACHE_SIZE)
def _by_string(sequence: str) -> str:
    # a training loop passes the same strings again: skip parsing them
    return parse_sequence(sequence)
