"""Atom names of other force fields (CHARMM, GROMACS) translated to the PDB names of the templates.

The templates use wwPDB / Amber names. CHARMM (PSF files) and GROMACS (GRO,
TPR files of the GROMOS and OPLS-AA force fields) name some atoms otherwise;
`to_pdb_names` translates one residue's names, group by group, to the
PDB name of the atom *of the same place*: the two hydrogens of a methylene
group are told apart by their stereochemistry, the three of a methyl group by
their order around the bond, the two of an amide ``NH2`` by cis/trans. Each
rule was read off adenylate kinase as shipped with MDAnalysisTests (``PSF`` +
``DCD``: CHARMM; ``GRO`` / ``TPR``: GROMACS, OPLS-AA), comparing every group
with the wwPDB entries 2JUY and 5A7U (``tests/test_protein_names.py``):

============================  ======================  =========================
PDB (templates)               CHARMM                  GROMACS
============================  ======================  =========================
``H``                         ``HN``                  ``H``
``H1 H2 H3`` (N-terminus)     ``HT1 HT3 HT2``         ``H1 H2 H3``
``O OXT`` (C-terminus)        ``OT1 OT2``             ``O1 O2`` (``OC1 OC2``)
``HB2 HB3`` (methylene)       ``HB2 HB1``             ``HB1 HB2``
Pro ``HG2 HG3``, ``HD2 HD3``  ``HG1 HG2``, ``HD1 HD2``  ``HG1 HG2``, ``HD1 HD2``
``HB1 HB2 HB3`` (methyl)      ``HB1 HB3 HB2``         ``HB1 HB2 HB3``
Ile ``CD1``, ``HD11..13``     ``CD``, ``HD1 HD3 HD2``  ``CD``, ``HD1 HD2 HD3``
Ser, Cys ``HG``               ``HG1``                 ``HG``
Asn ``HD21 HD22``             ``HD22 HD21``           ``HD21 HD22``
Gln ``HE21 HE22``             ``HE22 HE21``           ``HE21 HE22``
============================  ======================  =========================

"Methylene" is every ``CH2`` of the templates (Gly ``HA2 HA3``, Ile ``HG12
HG13``, ...); "methyl" every ``CH3`` and ``NH3+`` (Lys ``HZ1..3``). The neutral
lysine's ``NH2`` (``LYN``: ``HZ2 HZ3``) reads CHARMM's and GROMACS' ``HZ1 HZ2``
in that order (no reference file holds one). Names not listed are the same in
all three.
"""

from __future__ import annotations

from collections.abc import Collection

from ..residues.templates import base_residue
from ._hydrogens import SIDE_CHAIN_H, Amide, Methylene, Rotor

#: Conventions :meth:`ProteinTable.order_from` reads (``"auto"``: told from the names).
CONVENTIONS = ("auto", "pdb", "charmm", "gromacs")

#: Names only CHARMM writes (backbone amide H, termini); their presence marks a CHARMM list.
_CHARMM_MARKS = frozenset({"HN", "HT1", "HT2", "HT3", "OT1", "OT2"})


def detect_convention(residue_names: dict[int, Collection[str]], template_names: dict[int, set[str]]) -> str:
    """``"charmm"``, ``"gromacs"`` or ``"pdb"`` from the atom names of each residue.

    CHARMM if any CHARMM-only name occurs (``HN``, ``HT1``..., ``OT1``,
    ``OT2``); else GROMACS if a methylene group of the templates is numbered
    ``1 2`` (``HB1 HB2`` and no ``HB3``); else PDB.
    """
    if any(_CHARMM_MARKS.intersection(names) for names in residue_names.values()):
        return "charmm"
    for r, names in residue_names.items():
        have = set(names)
        for name in template_names.get(r, ()):
            if name[-1] == "3" and name[0] == "H" and name not in have:
                stem = name[:-1]
                if stem + "1" in have and stem + "2" in have and stem + "2" in template_names[r]:
                    return "gromacs"
    return "pdb"


def _groups(residue: str) -> tuple:
    return SIDE_CHAIN_H.get(residue, ())


def to_pdb_names(residue: str, names: Collection[str], convention: str, first: bool) -> dict[str, str]:
    """PDB name of each listed atom of one residue written in ``convention`` (unchanged names left out).

    ``residue`` is the template's residue name (``"HID"``, not ``"HSD"``);
    ``first``: the N-terminal residue.
    """
    have = set(names)
    out: dict[str, str] = {}
    if convention == "pdb":
        return out
    charmm = convention == "charmm"
    base = base_residue(residue)
    if charmm:
        out.update({n: pdb for n, pdb in (("HN", "H"), ("OT1", "O"), ("OT2", "OXT")) if n in have})
        if first:  # the N-terminal NH3+ runs the other way round
            out.update({n: pdb for n, pdb in (("HT1", "H1"), ("HT2", "H3"), ("HT3", "H2")) if n in have})
        if base in ("SER", "CYS") and "HG1" in have and "HG" not in have:
            out["HG1"] = "HG"
    else:
        out.update({n: pdb for n, pdb in (("O1", "O"), ("O2", "OXT"), ("OC1", "O")) if n in have})
    for g in _groups(residue):
        if isinstance(g, Methylene):
            two, three = g.names
            stem = two[:-1]
            if three in have or stem + "1" not in have or two not in have:
                continue  # already PDB numbering (or absent)
            if charmm and not (base == "PRO" and stem in ("HG", "HD")):
                out[stem + "1"], out[two] = three, two
            else:
                out[stem + "1"], out[two] = two, three
        elif isinstance(g, Rotor) and len(g.names) == 3 and charmm:
            h1, h2, h3 = g.names
            if {h2, h3} <= have:
                out[h2], out[h3] = h3, h2
        elif isinstance(g, Rotor) and len(g.names) == 2 and g.names[0].endswith("2"):  # LYN's NH2
            two, three = g.names
            stem = two[:-1]
            if three not in have and stem + "1" in have and two in have:
                out[stem + "1"], out[two] = two, three
        elif isinstance(g, Amide) and charmm and base in ("ASN", "GLN") and set(g.names) <= have:
            a, b = g.names
            out[a], out[b] = b, a
    if base == "ILE" and "CD" in have and "CD1" not in have:
        out["CD"] = "CD1"
        order = ("HD1", "HD3", "HD2") if charmm else ("HD1", "HD2", "HD3")
        for name, pdb in zip(order, ("HD11", "HD12", "HD13")):
            if name in have:
                out[name] = pdb
    return out
