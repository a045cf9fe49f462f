"""Hydrogen templates: every hydrogen of the residues, named as in the PDB / Amber (``amber14-all.xml``).

Bond lengths and target bond angles are the equilibrium values of Amber ff14SB
(``openmm/app/data/amber14/protein.ff14SB.xml`` of OpenMM 8, ``HarmonicBondForce``
``length`` and ``HarmonicAngleForce`` ``angle``; read at development time):

- X-H bonds: C(sp3)-H 1.090, C(aromatic)-H 1.080, N-H 1.010, O-H 0.960, S-H 1.336 A;
- angles: every H-C(sp3)-X and H-N3-X 109.5 deg, HO-OH-CT 108.5, HO-OH-C/CA 113.0,
  HS-SH-CT 96.0, H-N-CX (backbone amide) 118.04, H-N-C 120.0, H-N2-CD (Arg HE) 118.4,
  H-NA-CN (Trp HE1) 123.1, aromatic H-C-C and H-N-C 120.0.

Four kinds of groups, each one or a few rows of the construction table:

- `Rotor` (methyl, ammonium, amine, hydroxyl, thiol): the first hydrogen's
  dihedral is a free torsion (one row, default staggered: anti to the dihedral
  reference), the others hang on it at +-120 deg (from the angles);
- `Methylene` (``HB2``/``HB3`` ...) and `Methine` (``HA``, Val ``HB``...):
  ideal tetrahedral positions from the heavy atoms (H-C-H 109.5 deg, the methine H
  opposite the sum of its neighbours' bond directions);
- `Planar` (aromatic and amide H on an atom with two heavy neighbours): in
  their plane, the two angles as close to their targets as the ring angle allows;
- `Amide` (``NH2`` of Asn, Gln, Arg): in the plane, cis and trans to a reference
  (the first name cis to ``d``).

The fixed (non-rotor) rows' angles and dihedrals are measured once per residue
type on an ideal heavy-atom build (`hydrogen_rows`), so hydrogens move
rigidly with the torsions of their heavy atoms. Methylene hydrogens are named
``2``/``3`` by one geometric rule: seen from the neighbour of lower locant
(``a``), the neighbour of higher locant (``b``), H2 and H3 run clockwise, so
that ``Gly HA2`` takes the place of the L-residues' HA; the amide hydrogens
``HD21`` (Asn) and ``HE21`` (Gln) are trans to the carbonyl oxygen, Arg
``HH11``/``HH21`` cis to ``NE``. These are the names of wwPDB entries (checked
on every methylene, amide and methyl group of PDB 2JUY and 5A7U, as shipped
with MDAnalysisTests: ``tests/test_protein_names.py``; Amber treats the two
methylene hydrogens alike).
Atom names prefixed ``-`` are the previous residue's (``-C``).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Union

import numpy as np

from ..residues.templates import branch_dihedral

#: X-H bond lengths (A) of Amber ff14SB by the element of X (``"C"`` sp3, ``"Car"`` aromatic).
BOND = {"C": 1.090, "Car": 1.080, "N": 1.010, "O": 0.960, "S": 1.336}
#: Tetrahedral H-X-H and H-X-Y angle of Amber ff14SB (deg).
TETRAHEDRAL = 109.5


class Rotor(NamedTuple):
    """Hydrogens ``names`` on ``parent``; the first one's dihedral about ``parent - angle_ref`` turns."""

    parent: str
    angle_ref: str
    dihedral_ref: str
    names: tuple[str, ...]
    angle: float = TETRAHEDRAL
    default: float = 180.0


class Methylene(NamedTuple):
    """Two hydrogens on an sp3 ``parent`` with heavy neighbours ``a`` (lower locant) and ``b``."""

    parent: str
    a: str
    b: str
    names: tuple[str, str]


class Methine(NamedTuple):
    """One hydrogen on an sp3 ``parent`` with three heavy neighbours."""

    name: str
    parent: str
    neighbours: tuple[str, str, str]


class Planar(NamedTuple):
    """One hydrogen in the plane of ``a - parent - b``, target angles ``target_a``, ``target_b`` (deg)."""

    name: str
    parent: str
    a: str
    b: str
    target_a: float = 120.0
    target_b: float = 120.0


class Amide(NamedTuple):
    """``NH2`` hydrogens on ``parent`` (bonded to ``a``): cis and trans to ``d`` about ``parent - a``."""

    parent: str
    a: str
    d: str
    names: tuple[str, str]


Group = Union[Rotor, Methylene, Methine, Planar, Amide]

_HA = Methine("HA", "CA", ("N", "C", "CB"))


def _ch2(parent: str, a: str, b: str, stem: str) -> Methylene:
    return Methylene(parent, a, b, (stem + "2", stem + "3"))


def _methyl(parent: str, a: str, d: str, stem: str) -> Rotor:
    return Rotor(parent, a, d, (stem + "1", stem + "2", stem + "3"))


_HB = _ch2("CB", "CA", "CG", "HB")
_RING6 = (
    Planar("HD1", "CD1", "CG", "CE1"),
    Planar("HD2", "CD2", "CG", "CE2"),
    Planar("HE1", "CE1", "CD1", "CZ"),
    Planar("HE2", "CE2", "CD2", "CZ"),
)
_HIS = (_HA, _HB, Planar("HD2", "CD2", "CG", "NE2"), Planar("HE1", "CE1", "ND1", "NE2"))
_HD1 = Planar("HD1", "ND1", "CG", "CE1")
_HE2 = Planar("HE2", "NE2", "CD2", "CE1")
_LYS = (_HA, _HB, _ch2("CG", "CB", "CD", "HG"), _ch2("CD", "CG", "CE", "HD"), _ch2("CE", "CD", "NZ", "HE"))
_ASP = (_HA, _HB)
_GLU = (_HA, _HB, _ch2("CG", "CB", "CD", "HG"))

#: Side-chain (and HA) hydrogens of every residue name, after the backbone H.
SIDE_CHAIN_H: dict[str, tuple[Group, ...]] = {
    "GLY": (_ch2("CA", "N", "C", "HA"),),
    "ALA": (_HA, _methyl("CB", "CA", "N", "HB")),
    "SER": (_HA, _ch2("CB", "CA", "OG", "HB"), Rotor("OG", "CB", "CA", ("HG",), 108.5)),
    "CYS": (_HA, _ch2("CB", "CA", "SG", "HB"), Rotor("SG", "CB", "CA", ("HG",), 96.0)),
    "CYX": (_HA, _ch2("CB", "CA", "SG", "HB")),
    "VAL": (
        _HA,
        Methine("HB", "CB", ("CA", "CG1", "CG2")),
        _methyl("CG1", "CB", "CA", "HG1"),
        _methyl("CG2", "CB", "CA", "HG2"),
    ),
    "THR": (
        _HA,
        Methine("HB", "CB", ("CA", "OG1", "CG2")),
        Rotor("OG1", "CB", "CA", ("HG1",), 108.5),
        _methyl("CG2", "CB", "CA", "HG2"),
    ),
    "ILE": (
        _HA,
        Methine("HB", "CB", ("CA", "CG1", "CG2")),
        _ch2("CG1", "CB", "CD1", "HG1"),
        _methyl("CG2", "CB", "CA", "HG2"),
        _methyl("CD1", "CG1", "CB", "HD1"),
    ),
    "LEU": (
        _HA,
        _HB,
        Methine("HG", "CG", ("CB", "CD1", "CD2")),
        _methyl("CD1", "CG", "CB", "HD1"),
        _methyl("CD2", "CG", "CB", "HD2"),
    ),
    "MET": (_HA, _HB, _ch2("CG", "CB", "SD", "HG"), _methyl("CE", "SD", "CG", "HE")),
    "PRO": (_HA, _HB, _ch2("CG", "CB", "CD", "HG"), _ch2("CD", "CG", "N", "HD")),
    "ASP": _ASP,
    "ASH": (*_ASP, Rotor("OD2", "CG", "OD1", ("HD2",), 113.0, 0.0)),
    "ASN": (_HA, _HB, Amide("ND2", "CG", "CB", ("HD21", "HD22"))),
    "GLU": _GLU,
    "GLH": (*_GLU, Rotor("OE2", "CD", "OE1", ("HE2",), 113.0, 0.0)),
    "GLN": (_HA, _HB, _ch2("CG", "CB", "CD", "HG"), Amide("NE2", "CD", "CG", ("HE21", "HE22"))),
    "LYS": (*_LYS, Rotor("NZ", "CE", "CD", ("HZ1", "HZ2", "HZ3"))),
    "LYN": (*_LYS, Rotor("NZ", "CE", "CD", ("HZ2", "HZ3"))),
    "ARG": (
        _HA,
        _HB,
        _ch2("CG", "CB", "CD", "HG"),
        _ch2("CD", "CG", "NE", "HD"),
        Planar("HE", "NE", "CD", "CZ", 118.4, 120.0),
        Amide("NH1", "CZ", "NE", ("HH11", "HH12")),
        Amide("NH2", "CZ", "NE", ("HH21", "HH22")),
    ),
    "HIS": (*_HIS, _HE2),
    "HIE": (*_HIS, _HE2),
    "HID": (*_HIS, _HD1),
    "HIP": (*_HIS, _HD1, _HE2),
    "PHE": (_HA, _HB, *_RING6, Planar("HZ", "CZ", "CE1", "CE2")),
    "TYR": (_HA, _HB, *_RING6, Rotor("OH", "CZ", "CE1", ("HH",), 113.0)),
    "TRP": (
        _HA,
        _HB,
        Planar("HD1", "CD1", "CG", "NE1"),
        Planar("HE1", "NE1", "CD1", "CE2", 120.0, 123.1),
        Planar("HE3", "CE3", "CD2", "CZ3"),
        Planar("HZ2", "CZ2", "CE2", "CH2"),
        Planar("HZ3", "CZ3", "CE3", "CH2"),
        Planar("HH2", "CH2", "CZ2", "CZ3"),
    ),
    "ACE": (_methyl("CH3", "C", "O", "H"),),
    "NME": (Planar("H", "N", "C", "-C", 118.04, 120.0), _methyl("C", "N", "-C", "H")),
}


def backbone_h(residue: str, first: bool) -> tuple[Group, ...]:
    """Hydrogens on N: ``H`` (peptide), ``H1 H2 H3`` (free N-terminus; proline ``H2 H3``), none for caps."""
    if residue in ("ACE", "NME"):
        return ()
    if first:
        if residue == "PRO":
            return (Methylene("N", "CA", "CD", ("H2", "H3")),)
        return (Rotor("N", "CA", "C", ("H1", "H2", "H3")),)
    if residue == "PRO":
        return ()
    return (Planar("H", "N", "CA", "-C", 118.04, 120.0),)


class HRow(NamedTuple):
    """One hydrogen row: name, references (parent, angle_ref, dihedral_ref), values (A, deg), rotor flag."""

    name: str
    refs: tuple[str, str, str]
    bond: float
    angle: float
    dihedral: float
    rotor: bool


def _element(parent: str) -> str:
    return parent.lstrip("-")[0]


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _angle(h: np.ndarray, x: np.ndarray, a: np.ndarray) -> float:
    u, v = _unit(h - x), _unit(a - x)
    return math.degrees(math.atan2(np.linalg.norm(np.cross(u, v)), float(u @ v)))


def _dihedral(p0: np.ndarray, p1: np.ndarray, p2: np.ndarray, p3: np.ndarray) -> float:
    b0, b1, b2 = p0 - p1, p2 - p1, p3 - p2
    n1 = b1 / np.linalg.norm(b1)
    v, w = b0 - (b0 @ n1) * n1, b2 - (b2 @ n1) * n1
    return math.degrees(math.atan2(float(np.cross(n1, v) @ w), float(v @ w)))


def _fit_tetrahedral(
    x: np.ndarray, neighbours: list[np.ndarray], start: list[np.ndarray]
) -> list[np.ndarray]:
    """Unit directions of the hydrogens on an sp3 ``x``: every H-X-Y angle (Y: neighbour or H) near 109.5 deg.

    Least squares over the angles (Levenberg-Marquardt, numeric Jacobian) from
    the directions ``start``, which fix which hydrogen is which.
    """
    nb = [_unit(p - x) for p in neighbours]
    basis = []
    for s0 in start:
        e1 = _unit(np.cross(s0, nb[0]))
        basis.append((_unit(s0), e1, np.cross(_unit(s0), e1)))

    def directions(p: np.ndarray) -> list[np.ndarray]:
        return [_unit(s0 + p[2 * k] * e1 + p[2 * k + 1] * e2) for k, (s0, e1, e2) in enumerate(basis)]

    def residuals(p: np.ndarray) -> np.ndarray:
        u = directions(p)
        out = [_angle(h, np.zeros(3), v) - TETRAHEDRAL for h in u for v in nb]
        if len(u) == 2:
            out.append(_angle(u[0], np.zeros(3), u[1]) - TETRAHEDRAL)
        return np.radians(np.array(out))

    p = np.zeros(2 * len(start))
    r = residuals(p)
    for _ in range(50):
        jac = np.stack([(residuals(p + 1e-7 * e) - r) / 1e-7 for e in np.eye(len(p))], axis=1)
        step = np.linalg.solve(jac.T @ jac + 1e-9 * np.eye(len(p)), -jac.T @ r)
        trial = residuals(p + step)
        if trial @ trial >= r @ r:
            break
        p, r = p + step, trial
    return directions(p)


def hydrogen_rows(groups: tuple[Group, ...], xyz: Callable[[str], np.ndarray]) -> list[HRow]:
    """Rows of the hydrogens of ``groups``; ``xyz(name)`` gives heavy-atom coordinates of an ideal build."""
    rows: list[HRow] = []
    for g in groups:
        if isinstance(g, Rotor):
            bond = BOND[_element(g.parent)]
            first = g.names[0]
            rows.append(HRow(first, (g.parent, g.angle_ref, g.dihedral_ref), bond, g.angle, g.default, True))
            turn = branch_dihedral(g.angle, g.angle, TETRAHEDRAL, 1)
            for name, sign in zip(g.names[1:], (1, -1)):
                rows.append(HRow(name, (g.parent, g.angle_ref, first), bond, g.angle, sign * turn, False))
            continue
        if isinstance(g, Amide):
            bond = BOND["N"]
            for name, d in zip(g.names, (0.0, 180.0)):
                rows.append(HRow(name, (g.parent, g.a, g.d), bond, 120.0, d, False))
            continue
        x = xyz(g.parent)
        if isinstance(g, Methylene):
            a, b = xyz(g.a), xyz(g.b)
            ua, ub = _unit(a - x), _unit(b - x)
            out, normal = -_unit(ua + ub), _unit(np.cross(ua, ub))
            half = math.radians(TETRAHEDRAL) / 2
            bond = BOND[_element(g.parent)]
            start = [math.cos(half) * out + sign * math.sin(half) * normal for sign in (-1.0, 1.0)]
            for name, u in zip(g.names, _fit_tetrahedral(x, [a, b], start)):
                h = x + bond * u
                rows.append(
                    HRow(name, (g.parent, g.a, g.b), bond, _angle(h, x, a), _dihedral(h, x, a, b), False)
                )
        elif isinstance(g, Methine):
            n = [xyz(k) for k in g.neighbours]
            bond = BOND[_element(g.parent)]
            (u,) = _fit_tetrahedral(x, n, [-_unit(sum(_unit(p - x) for p in n))])
            h = x + bond * u
            rows.append(
                HRow(
                    g.name,
                    (g.parent, *g.neighbours[:2]),
                    bond,
                    _angle(h, x, n[0]),
                    _dihedral(h, x, n[0], n[1]),
                    False,
                )
            )
        else:  # Planar: angle to a fitted to both targets, the ring angle fixed
            a, b = xyz(g.a), xyz(g.b)
            ring = _angle(a, x, b)
            angle = (g.target_a + (360.0 - ring - g.target_b)) / 2
            el = _element(g.parent)
            bond = BOND["Car" if el == "C" else el]
            rows.append(HRow(g.name, (g.parent, g.a, g.b), bond, angle, 180.0, False))
    return rows
