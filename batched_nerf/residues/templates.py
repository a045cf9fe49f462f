"""Residue templates: heavy atoms of the 20 standard amino acids as Z-matrix rows.

Bond lengths and bond angles follow Engh & Huber (1991), "Accurate bond and
angle parameters for X-ray protein structure refinement", Acta Cryst. A47,
392-400 (Table 3, the values of the X-PLOR/CNS ``protein_rep`` parameter set);
the C-terminal carboxylate uses their COO- values (C-O 1.249 A, C-C-O 118.4 deg).

Every side-chain atom is placed from three atoms of its own residue. Torsions a
user sets (chi1-chi4) are the dihedral of exactly one row (the atom that defines
the torsion in the IUPAC-IUB 1970 convention, as in mdtraj's ``compute_chi*``);
the other atoms of a branch or ring hang on that atom with a fixed dihedral
(``180``/``0`` in planar groups; a ``Branch`` at tetrahedral centres, whose
value follows from the three bond angles at the centre, see
`branch_dihedral`), so they move rigidly with the torsion. CB makes every
CA L (S, except Cys: R); Ile CB is S and Thr CB is R; the prochiral methyls
follow the IUPAC-IUB names (Val CG1 and Leu CD1 are pro-R).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Union

#: One-letter -> three-letter codes of the 20 standard amino acids.
ONE_TO_THREE = {
    "A": "ALA", "R": "ARG", "N": "ASN", "D": "ASP", "C": "CYS", "Q": "GLN", "E": "GLU",
    "G": "GLY", "H": "HIS", "I": "ILE", "L": "LEU", "K": "LYS", "M": "MET", "F": "PHE",
    "P": "PRO", "S": "SER", "T": "THR", "W": "TRP", "Y": "TYR", "V": "VAL",
}  # fmt: skip
THREE_TO_ONE = {v: k for k, v in ONE_TO_THREE.items()}

#: Protonation variants (Amber / OpenMM ``amber14-all.xml`` names) -> the residue whose heavy atoms they
#: share: neutral histidines (``HID``: H on ND1, ``HIE``: H on NE2; ``HIS`` is ``HIE``), charged ``HIP``,
#: disulfide-bonded cysteine ``CYX`` (no HG), neutral ``ASH``, ``GLH``, ``LYN``.
VARIANTS = {"HID": "HIS", "HIE": "HIS", "HIP": "HIS", "CYX": "CYS", "ASH": "ASP", "GLH": "GLU", "LYN": "LYS"}
#: Capping groups: N-terminal acetyl (``ACE``: CH3, C, O) and C-terminal N-methyl amide (``NME``: N, C).
CAPS = ("ACE", "NME")
#: Every residue name a sequence may hold.
RESIDUE_NAMES = (*ONE_TO_THREE.values(), *VARIANTS, *CAPS)

#: Other force fields' residue names -> the residue (or variant) they mean here. CHARMM: ``HSD``/``HSE``/
#: ``HSP`` (H on ND1 / NE2 / both), ``ASPP``, ``GLUP`` (protonated on OD2 / OE2), ``LSN`` (neutral
#: lysine). GROMACS (GROMOS, OPLS-AA; ``pdb2gmx``): ``HISA``/``HISD`` (H on ND1), ``HISB``/``HISE`` (NE2),
#: ``HISH`` (both), ``LYSH`` (charged lysine), ``LYSN`` (neutral), ``ASPH``, ``GLUH`` (protonated),
#: ``CYSH`` (cysteine with HG), ``CYS2`` (disulfide-bonded); the Amber ports (ffamber): ``LYP``
#: (charged lysine), ``CYN`` (cysteine with HG).
RESIDUE_ALIASES = {
    "HSD": "HID", "HSE": "HIE", "HSP": "HIP", "ASPP": "ASH", "GLUP": "GLH", "LSN": "LYN",
    "HISA": "HID", "HISD": "HID", "HISB": "HIE", "HISE": "HIE", "HISH": "HIP",
    "LYSH": "LYS", "LYSN": "LYN", "ASPH": "ASH", "GLUH": "GLH", "CYSH": "CYS", "CYS2": "CYX",
    "LYP": "LYS", "CYN": "CYS",
}  # fmt: skip
#: Residue names of protonation or bonding states no template here has: refused, naming the state.
UNSUPPORTED_RESIDUES = {
    "CYM": "deprotonated cysteine (thiolate, no HG; Amber, GROMACS)",
    "HIS1": "histidine bound to a heme iron (GROMACS)",
    "ARN": "neutral arginine (Amber)",
    "ARGN": "neutral arginine (GROMACS)",
    "TYM": "deprotonated tyrosine (tyrosinate; Amber)",
}


def residue_name(name: str) -> str:
    """``name`` (upper case) in the spelling of [`RESIDUE_NAMES`][batched_nerf.protein.RESIDUE_NAMES]: other
    force fields' names mapped.

    Raises:
        ValueError: a name of a state no template has
            ([`UNSUPPORTED_RESIDUES`][batched_nerf.protein.UNSUPPORTED_RESIDUES]), naming it.

    Example:
        >>> residue_name("hsd"), residue_name("HISB"), residue_name("LYSH"), residue_name("ALA")
        ('HID', 'HIE', 'LYS', 'ALA')
    """
    name = name.upper()
    if name in UNSUPPORTED_RESIDUES:
        raise ValueError(
            f"residue {name} is a {UNSUPPORTED_RESIDUES[name]}, a state the protein templates do not "
            f"have (variants: {' '.join(VARIANTS)}); it is not replaced by another protonation state"
        )
    return RESIDUE_ALIASES.get(name, name)


def base_residue(name: str) -> str:
    """The standard residue whose heavy atoms a variant has (``"HID"``, ``"HSD"``: ``"HIS"``), or ``name``."""
    name = RESIDUE_ALIASES.get(name, name)
    return VARIANTS.get(name, name)


#: Bonds of each ring, by atom name (PDB names; variants use their standard residue's).
#: The table's bond references span a tree; these include the closing bond of each ring.
RING_BONDS = {
    "PRO": (("N", "CD"),),
    "PHE": (("CG", "CD1"), ("CD1", "CE1"), ("CE1", "CZ"), ("CZ", "CE2"), ("CE2", "CD2"), ("CD2", "CG")),
    "TYR": (("CG", "CD1"), ("CD1", "CE1"), ("CE1", "CZ"), ("CZ", "CE2"), ("CE2", "CD2"), ("CD2", "CG")),
    "HIS": (("CG", "ND1"), ("ND1", "CE1"), ("CE1", "NE2"), ("NE2", "CD2"), ("CD2", "CG")),
    "TRP": (
        ("CG", "CD1"), ("CD1", "NE1"), ("NE1", "CE2"), ("CE2", "CD2"), ("CD2", "CG"),
        ("CE2", "CZ2"), ("CZ2", "CH2"), ("CH2", "CZ3"), ("CZ3", "CE3"), ("CE3", "CD2"),
    ),
}  # fmt: skip


#: Names of the side-chain torsions a user can set, in order.
CHI_NAMES = ("chi1", "chi2", "chi3", "chi4")


class Branch(NamedTuple):
    """Dihedral of an atom ``Y`` with references ``(B, A, X)`` at a tetrahedral centre ``B``.

    ``angle_xby`` is the bond angle ``X-B-Y`` (degrees); ``sign`` picks the
    handedness (``+1``/``-1``); the dihedral value follows from the three angles
    at ``B`` (`branch_dihedral`).
    """

    angle_xby: float
    sign: int


Dihedral = Union[float, str, Branch]


class AtomRow(NamedTuple):
    """A side-chain atom: name, references (atom names of the same residue), bond (A), angle (deg), dihedral.

    ``dihedral`` is a fixed value in degrees, the name of a torsion (``"chi1"``
    ... ``"chi4"``), or a `Branch`.
    """

    name: str
    bond_ref: str
    angle_ref: str
    dihedral_ref: str
    bond: float
    angle: float
    dihedral: Dihedral


class Backbone(NamedTuple):
    """Backbone geometry of one residue type (Engh & Huber 1991), lengths in A, angles in degrees.

    ``c_n`` and ``ca_c_n`` belong to the peptide bond that *enters* this
    residue (``C(i-1)-N(i)`` and ``CA(i-1)-C(i-1)-N(i)``): they differ for proline.
    """

    n_ca: float
    ca_c: float
    c_o: float
    c_n: float
    ca_c_n: float
    c_n_ca: float
    n_ca_c: float
    ca_c_o: float
    ca_cb: float
    n_ca_cb: float
    c_ca_cb: float


_GENERIC = Backbone(1.458, 1.525, 1.231, 1.329, 116.2, 121.7, 111.2, 120.8, 1.530, 110.5, 110.1)
_BETA_BRANCHED = _GENERIC._replace(ca_cb=1.540, n_ca_cb=111.5, c_ca_cb=109.1)
BACKBONE: dict[str, Backbone] = {aa: _GENERIC for aa in ONE_TO_THREE.values()}
BACKBONE.update(
    ALA=_GENERIC._replace(ca_cb=1.521, n_ca_cb=110.4, c_ca_cb=110.5),
    GLY=_GENERIC._replace(n_ca=1.451, ca_c=1.516, c_n_ca=120.6, n_ca_c=112.5),
    PRO=_GENERIC._replace(
        n_ca=1.466, c_n=1.341, ca_c_n=116.9, c_n_ca=122.6, n_ca_c=111.8, n_ca_cb=103.0, c_ca_cb=110.1
    ),
    ILE=_BETA_BRANCHED,
    THR=_BETA_BRANCHED,
    VAL=_BETA_BRANCHED,
)

#: C-terminal carboxylate (Engh & Huber 1991, COO- group): C-O bond (A) and CA-C-O angle (deg).
CTERM_C_O, CTERM_CA_C_O = 1.249, 118.4

#: Handedness of CB at CA (L-amino acids): sign of the dihedral (CB, CA, N, C).
L_CB_SIGN = -1

_L = L_CB_SIGN
# Side chains after CB (CB itself is placed by the backbone rules). Names follow the PDB.
SIDE_CHAINS: dict[str, tuple[AtomRow, ...]] = {
    "GLY": (),
    "ALA": (),
    "SER": (AtomRow("OG", "CB", "CA", "N", 1.417, 111.1, "chi1"),),
    "CYS": (AtomRow("SG", "CB", "CA", "N", 1.808, 114.4, "chi1"),),
    "VAL": (
        AtomRow("CG1", "CB", "CA", "N", 1.521, 110.5, "chi1"),
        AtomRow("CG2", "CB", "CA", "CG1", 1.521, 110.5, Branch(110.8, -_L)),
    ),
    "THR": (
        AtomRow("OG1", "CB", "CA", "N", 1.433, 109.6, "chi1"),
        AtomRow("CG2", "CB", "CA", "OG1", 1.521, 110.5, Branch(109.3, _L)),
    ),
    "ILE": (
        AtomRow("CG1", "CB", "CA", "N", 1.530, 110.4, "chi1"),
        AtomRow("CG2", "CB", "CA", "CG1", 1.521, 110.5, Branch(110.7, _L)),
        AtomRow("CD1", "CG1", "CB", "CA", 1.513, 113.8, "chi2"),
    ),
    "LEU": (
        AtomRow("CG", "CB", "CA", "N", 1.530, 116.3, "chi1"),
        AtomRow("CD1", "CG", "CB", "CA", 1.521, 110.7, "chi2"),
        AtomRow("CD2", "CG", "CB", "CD1", 1.521, 110.7, Branch(110.8, -_L)),
    ),
    "MET": (
        AtomRow("CG", "CB", "CA", "N", 1.520, 114.1, "chi1"),
        AtomRow("SD", "CG", "CB", "CA", 1.803, 112.7, "chi2"),
        AtomRow("CE", "SD", "CG", "CB", 1.791, 100.9, "chi3"),
    ),
    "PRO": (
        AtomRow("CG", "CB", "CA", "N", 1.492, 104.5, "chi1"),
        AtomRow("CD", "CG", "CB", "CA", 1.503, 106.1, "chi2"),
    ),
    "ASP": (
        AtomRow("CG", "CB", "CA", "N", 1.516, 112.6, "chi1"),
        AtomRow("OD1", "CG", "CB", "CA", 1.249, 118.4, "chi2"),
        AtomRow("OD2", "CG", "CB", "OD1", 1.249, 118.4, 180.0),
    ),
    "ASN": (
        AtomRow("CG", "CB", "CA", "N", 1.516, 112.6, "chi1"),
        AtomRow("OD1", "CG", "CB", "CA", 1.231, 120.8, "chi2"),
        AtomRow("ND2", "CG", "CB", "OD1", 1.328, 116.4, 180.0),
    ),
    "GLU": (
        AtomRow("CG", "CB", "CA", "N", 1.520, 114.1, "chi1"),
        AtomRow("CD", "CG", "CB", "CA", 1.516, 112.6, "chi2"),
        AtomRow("OE1", "CD", "CG", "CB", 1.249, 118.4, "chi3"),
        AtomRow("OE2", "CD", "CG", "OE1", 1.249, 118.4, 180.0),
    ),
    "GLN": (
        AtomRow("CG", "CB", "CA", "N", 1.520, 114.1, "chi1"),
        AtomRow("CD", "CG", "CB", "CA", 1.516, 112.6, "chi2"),
        AtomRow("OE1", "CD", "CG", "CB", 1.231, 120.8, "chi3"),
        AtomRow("NE2", "CD", "CG", "OE1", 1.328, 116.4, 180.0),
    ),
    "LYS": (
        AtomRow("CG", "CB", "CA", "N", 1.520, 114.1, "chi1"),
        AtomRow("CD", "CG", "CB", "CA", 1.520, 111.3, "chi2"),
        AtomRow("CE", "CD", "CG", "CB", 1.520, 111.3, "chi3"),
        AtomRow("NZ", "CE", "CD", "CG", 1.489, 111.9, "chi4"),
    ),
    "ARG": (
        AtomRow("CG", "CB", "CA", "N", 1.520, 114.1, "chi1"),
        AtomRow("CD", "CG", "CB", "CA", 1.520, 111.3, "chi2"),
        AtomRow("NE", "CD", "CG", "CB", 1.460, 112.0, "chi3"),
        AtomRow("CZ", "NE", "CD", "CG", 1.329, 124.2, "chi4"),
        AtomRow("NH1", "CZ", "NE", "CD", 1.326, 120.0, 0.0),
        AtomRow("NH2", "CZ", "NE", "NH1", 1.326, 120.0, 180.0),
    ),
    "HIS": (
        AtomRow("CG", "CB", "CA", "N", 1.497, 113.8, "chi1"),
        AtomRow("ND1", "CG", "CB", "CA", 1.378, 122.7, "chi2"),
        AtomRow("CD2", "CG", "CB", "ND1", 1.354, 131.0, 180.0),
        AtomRow("CE1", "ND1", "CG", "CB", 1.321, 109.3, 180.0),
        AtomRow("NE2", "CD2", "CG", "CB", 1.374, 107.2, 180.0),
    ),
    "PHE": (
        AtomRow("CG", "CB", "CA", "N", 1.502, 113.8, "chi1"),
        AtomRow("CD1", "CG", "CB", "CA", 1.384, 120.7, "chi2"),
        AtomRow("CD2", "CG", "CB", "CD1", 1.384, 120.7, 180.0),
        AtomRow("CE1", "CD1", "CG", "CB", 1.382, 120.7, 180.0),
        AtomRow("CE2", "CD2", "CG", "CB", 1.382, 120.7, 180.0),
        AtomRow("CZ", "CE1", "CD1", "CG", 1.382, 120.0, 0.0),
    ),
    "TYR": (
        AtomRow("CG", "CB", "CA", "N", 1.512, 113.9, "chi1"),
        AtomRow("CD1", "CG", "CB", "CA", 1.389, 120.8, "chi2"),
        AtomRow("CD2", "CG", "CB", "CD1", 1.389, 120.8, 180.0),
        AtomRow("CE1", "CD1", "CG", "CB", 1.382, 121.2, 180.0),
        AtomRow("CE2", "CD2", "CG", "CB", 1.382, 121.2, 180.0),
        AtomRow("CZ", "CE1", "CD1", "CG", 1.378, 119.6, 0.0),
        AtomRow("OH", "CZ", "CE1", "CD1", 1.376, 119.9, 180.0),
    ),
    "TRP": (
        AtomRow("CG", "CB", "CA", "N", 1.498, 113.6, "chi1"),
        AtomRow("CD1", "CG", "CB", "CA", 1.365, 126.9, "chi2"),
        AtomRow("CD2", "CG", "CB", "CD1", 1.433, 126.8, 180.0),
        AtomRow("NE1", "CD1", "CG", "CB", 1.374, 110.2, 180.0),
        AtomRow("CE2", "CD2", "CG", "CB", 1.409, 107.2, 180.0),
        AtomRow("CE3", "CD2", "CG", "CB", 1.398, 133.9, 0.0),
        AtomRow("CZ2", "CE2", "CD2", "CG", 1.394, 122.3, 180.0),
        AtomRow("CZ3", "CE3", "CD2", "CG", 1.382, 118.6, 180.0),
        AtomRow("CH2", "CZ2", "CE2", "CD2", 1.368, 117.5, 0.0),
    ),
}

#: Default side-chain torsions (degrees) used where ``chi`` is not given: one
#: common rotamer per residue (the ``m``/``t`` families of the Lovell et al.
#: 2000 penultimate rotamer library; proline C-gamma endo).
DEFAULT_CHI: dict[str, tuple[float, ...]] = {
    "GLY": (), "ALA": (), "SER": (62.0,), "CYS": (-65.0,), "VAL": (175.0,), "THR": (62.0,),
    "ILE": (-65.0, 170.0), "LEU": (-65.0, 175.0), "MET": (-65.0, 180.0, -70.0), "PRO": (30.0, -35.0),
    "ASP": (-70.0, -15.0), "ASN": (-65.0, -20.0), "GLU": (-65.0, 180.0, -10.0),
    "GLN": (-65.0, 180.0, -25.0), "LYS": (-65.0, 180.0, 180.0, 180.0), "ARG": (-65.0, 180.0, 180.0, 180.0),
    "HIS": (-65.0, -70.0), "PHE": (-65.0, -85.0), "TYR": (-65.0, -85.0), "TRP": (-65.0, 95.0),
}  # fmt: skip


def n_chi(residue: str) -> int:
    """Number of side-chain torsions (chi1...) of a three-letter residue name."""
    return sum(isinstance(a.dihedral, str) for a in SIDE_CHAINS[residue])


def branch_dihedral(angle_aby: float, angle_abx: float, angle_xby: float, sign: int) -> float:
    r"""Dihedral (degrees) of ``Y`` about ``B-A`` from ``X``, from the three bond angles at ``B``.

    With unit bond vectors from ``B`` the spherical law of cosines gives
    ``cos(phi) = (cos XBY - cos ABX cos ABY) / (sin ABX sin ABY)``; ``sign``
    picks the handedness.

    Example:
        >>> round(branch_dihedral(109.47, 109.47, 109.47, 1), 1)
        120.0
    """
    a, x, y = (math.radians(v) for v in (angle_aby, angle_abx, angle_xby))
    c = (math.cos(y) - math.cos(x) * math.cos(a)) / (math.sin(x) * math.sin(a))
    return sign * math.degrees(math.acos(max(-1.0, min(1.0, c))))
