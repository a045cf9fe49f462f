"""Atom and residue names of other sources: wwPDB hydrogens, CHARMM (PSF) and GROMACS (GRO/TPR) files.

The reference files are those of MDAnalysisTests: two wwPDB entries with
hydrogens (2JUY, an NMR ensemble; 5A7U), and adenylate kinase (AdK, 214
residues, 3,341 atoms) as a CHARMM PSF/DCD and as a GROMACS (OPLS-AA) GRO/TPR.
"""

from __future__ import annotations

import math
import os
import warnings
from collections import Counter

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf.protein._hydrogens import SIDE_CHAIN_H, Amide, Methylene, Rotor

mda = pytest.importorskip("MDAnalysis", reason="MDAnalysis is an optional test dependency")
datafiles = pytest.importorskip("MDAnalysisTests.datafiles", reason="needs the MDAnalysisTests data files")
DATA = os.path.join(os.path.dirname(datafiles.__file__), "data")


def _universe(*files: str):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mda.Universe(*files)


def _dihedral(p0: np.ndarray, p1: np.ndarray, p2: np.ndarray, p3: np.ndarray) -> float:
    b0, b1, b2 = p0 - p1, p2 - p1, p3 - p2
    n1 = b1 / np.linalg.norm(b1)
    v, w = b0 - (b0 @ n1) * n1, b2 - (b2 @ n1) * n1
    return math.degrees(math.atan2(float(np.cross(n1, v) @ w), float(v @ w)))


def _signatures(xyz, residue: str) -> dict:  # type: ignore[no-untyped-def]
    """Which hydrogen of each group is which: a sign per methylene and methyl, cis/trans per amide.

    ``xyz(name)`` gives an atom of the residue (KeyError: absent).
    """
    out = {}
    for g in SIDE_CHAIN_H.get(residue, ()):
        try:
            if isinstance(g, Methylene):
                p, a, b, h = (xyz(n) for n in (g.parent, g.a, g.b, g.names[0]))
                out[g.names] = int(np.sign(np.cross(a - p, b - p) @ (h - p)))
            elif isinstance(g, Rotor) and len(g.names) == 3:
                p, h1, h2, a = (xyz(n) for n in (g.parent, *g.names[:2], g.angle_ref))
                out[g.names] = int(np.sign(np.cross(h1 - p, h2 - p) @ (a - p)))
            elif isinstance(g, Amide):
                d = _dihedral(*(xyz(n) for n in (g.names[0], g.parent, g.a, g.d)))
                out[g.names] = "cis" if abs(d) < 90 else "trans"
        except KeyError:
            pass
    return out


def _template_signatures(residue: str) -> dict:  # type: ignore[no-untyped-def]
    seq = ["GLY", residue, "GLY"]
    t = bn.protein.protein_table(seq, hydrogens=True)
    phi, psi = torch.full((3,), -1.1, dtype=torch.float64), torch.full((3,), 2.3, dtype=torch.float64)
    x = bn.protein.build(seq, phi, psi, hydrogens=True).xyz.numpy()
    return _signatures(lambda n: x[t.atom(1, n)], residue)


def _variant(residue) -> str:  # type: ignore[no-untyped-def]
    names = set(residue.atoms.names)
    if residue.resname == "CYS" and "HG" not in names:
        return "CYX"
    if residue.resname == "HIS":
        return {(True, True): "HIP", (True, False): "HID"}.get(("HD1" in names, "HE2" in names), "HIE")
    return residue.resname


@pytest.mark.parametrize("entry", ["nmr_neopetrosiamide.pdb", "5a7u.pdb"])
def test_hydrogen_templates_name_their_hydrogens_as_wwpdb_entries(entry: str) -> None:
    """Methylene 2/3 (Gly HA2 where the L residues' HA is), amide 21/22 and methyl 1/2/3 as in the PDB."""
    u = _universe(os.path.join(DATA, entry))
    tally: Counter = Counter()
    for r in u.select_atoms("protein").residues:
        name = _variant(r)
        pos = {a.name: a.position.astype(np.float64) for a in r.atoms}
        mine = _template_signatures(name)
        for group, value in _signatures(pos.__getitem__, name).items():
            tally[mine[group] == value] += 1
    # 2JUY (an NMR model) names one Thr methyl the other way round; every other group agrees
    assert tally[True] >= 40 and tally[False] <= 1, tally


# ------------------------------------------------------------ residue names
@pytest.mark.parametrize(
    ("spelling", "meaning"),
    [
        ("HSD", "HID"), ("HSE", "HIE"), ("HSP", "HIP"), ("ASPP", "ASH"), ("GLUP", "GLH"), ("LSN", "LYN"),
        ("HISA", "HID"), ("HISD", "HID"), ("HISB", "HIE"), ("HISE", "HIE"), ("HISH", "HIP"),
        ("LYSH", "LYS"), ("LYSN", "LYN"), ("ASPH", "ASH"), ("GLUH", "GLH"), ("CYSH", "CYS"),
        ("CYS2", "CYX"), ("LYP", "LYS"), ("CYN", "CYS"), ("hsd", "HID"),
    ],
)  # fmt: skip
def test_force_field_residue_names_mean_the_variant(spelling: str, meaning: str) -> None:
    assert bn.protein.parse_sequence(f"ALA {spelling}") == bn.protein.parse_sequence(f"ALA {meaning}")
    mine = bn.protein.protein_table(["ALA", spelling], hydrogens=True)
    assert mine.atom_names == bn.protein.protein_table(["ALA", meaning], hydrogens=True).atom_names


def test_histidine_spellings_put_the_proton_where_they_say() -> None:
    for spellings, on in ((("HSD", "HISA", "HISD"), {"HD1"}), (("HSE", "HISB", "HISE"), {"HE2"})):
        for s in spellings:
            names = set(bn.protein.protein_table(["GLY", s], hydrogens=True).atom_names)
            assert on <= names and not ({"HD1", "HE2"} - on) & names, s
    for s in ("HSP", "HISH"):
        assert {"HD1", "HE2"} <= set(bn.protein.protein_table(["GLY", s], hydrogens=True).atom_names)


@pytest.mark.parametrize(
    ("spelling", "state"),
    [("CYM", "deprotonated cysteine"), ("HIS1", "heme"), ("ARN", "neutral arginine"),
     ("ARGN", "neutral arginine"), ("TYM", "deprotonated tyrosine")],
)  # fmt: skip
def test_unsupported_states_are_refused_by_name(spelling: str, state: str) -> None:
    with pytest.raises(ValueError, match=rf"^position 1 of the sequence: residue {spelling} is a .*{state}"):
        bn.protein.protein_table(["ALA", spelling])


# ------------------------------------------------------------ atom names, per spelling
def _renamed(seq: list[str], rename: dict, hydrogens: bool = True):  # type: ignore[no-untyped-def]
    """The table of ``seq`` and its atoms listed (reversed) under other names: ``rename[(residue, name)]``."""
    t = bn.protein.protein_table(seq, hydrogens=hydrogens)
    listed = [(int(r), rename.get((t.residues[int(r)], n), n)) for r, n in zip(t.residue_index, t.atom_names)]
    return t, listed[::-1]


@pytest.mark.parametrize(
    ("convention", "rename"),
    [
        ("charmm", {("SER", "H"): "HN", ("MET", "H1"): "HT1", ("MET", "H2"): "HT3", ("MET", "H3"): "HT2",
                    ("GLY", "O"): "OT1", ("GLY", "OXT"): "OT2", ("SER", "HB2"): "HB2", ("SER", "HB3"): "HB1",
                    ("SER", "HG"): "HG1", ("ILE", "CD1"): "CD", ("ILE", "HD11"): "HD1",
                    ("ILE", "HD12"): "HD3", ("ILE", "HD13"): "HD2", ("ILE", "HG12"): "HG12",
                    ("ILE", "HG13"): "HG11",
                    ("ILE", "HG22"): "HG23", ("ILE", "HG23"): "HG22", ("PRO", "HG2"): "HG1",
                    ("PRO", "HG3"): "HG2", ("PRO", "HB2"): "HB2", ("PRO", "HB3"): "HB1",
                    ("ASN", "HD21"): "HD22", ("ASN", "HD22"): "HD21", ("GLY", "HA2"): "HA2",
                    ("GLY", "HA3"): "HA1", ("MET", "HE2"): "HE3", ("MET", "HE3"): "HE2"}),
        ("gromacs", {("GLY", "O"): "O1", ("GLY", "OXT"): "O2", ("SER", "HB2"): "HB1", ("SER", "HB3"): "HB2",
                     ("ILE", "CD1"): "CD", ("ILE", "HD11"): "HD1", ("ILE", "HD12"): "HD2",
                     ("ILE", "HD13"): "HD3", ("ILE", "HG12"): "HG11", ("ILE", "HG13"): "HG12",
                     ("PRO", "HG2"): "HG1", ("PRO", "HG3"): "HG2", ("PRO", "HB2"): "HB1",
                     ("PRO", "HB3"): "HB2", ("GLY", "HA2"): "HA1", ("GLY", "HA3"): "HA2"}),
    ],
)  # fmt: skip
def test_order_from_reads_each_spelling(convention: str, rename: dict) -> None:
    seq = ["MET", "SER", "ILE", "PRO", "ASN", "GLY"]
    t, listed = _renamed(seq, rename)
    n = len(listed)
    expected = torch.arange(n - 1, -1, -1)
    for conv in ("auto", convention):
        assert torch.equal(
            t.order_from([r for r, _ in listed], [m for _, m in listed], convention=conv), expected
        )
    heavy = bn.protein.protein_table(seq)
    keep = [(r, m) for r, m in listed if not m.startswith("H")]
    perm = heavy.order_from([r for r, _ in keep], [m for _, m in keep], convention=conv)
    assert [keep[int(k)][1] for k in perm][-2:] == [rename[("GLY", "O")], rename[("GLY", "OXT")]]
    assert rename[("ILE", "CD1")] in [keep[int(k)][1] for k in perm]


def test_neutral_lysine_amine_and_errors() -> None:
    t, listed = _renamed(
        ["GLY", "LSN", "GLY"], {("LYN", "HZ2"): "HZ1", ("LYN", "HZ3"): "HZ2", ("LYN", "H"): "HN"}
    )
    assert torch.equal(t.order_from(*zip(*listed)), torch.arange(len(listed) - 1, -1, -1))
    with pytest.raises(ValueError, match=r"convention must be one of \('auto', 'pdb', 'charmm', 'gromacs'\)"):
        t.order_from(*zip(*listed), convention="amber")
    g = bn.protein.protein_table("G")
    with pytest.raises(
        ValueError, match=r"^listed atoms 3 and 5 of residue 0 are both O \(read as charmm names\)"
    ):
        g.order_from([0] * 6, ["N", "CA", "C", "O", "OT2", "OT1"])
    with pytest.raises(
        ValueError, match=r"atom 1 \(CA of residue 0, GLY\) is missing from the list \(read as pdb"
    ):
        g.order_from([0] * 3, ["N", "C", "O"])


# ------------------------------------------------------------ the AdK files
def _adk(kind: str):  # type: ignore[no-untyped-def]
    files = {
        "PSF": (datafiles.PSF, datafiles.DCD),
        "TPR": (datafiles.TPR, datafiles.GRO),
        "GRO": (datafiles.GRO,),
    }
    u = _universe(*files[kind])
    return u, u.select_atoms("protein")


@pytest.fixture(scope="module", params=["PSF", "TPR", "GRO"])
def adk(request):  # type: ignore[no-untyped-def]
    return (request.param, *_adk(request.param))


@pytest.mark.parametrize("hydrogens", [False, True])
def test_order_from_matches_every_atom_of_the_adk_files(adk, hydrogens: bool) -> None:  # type: ignore[no-untyped-def]
    """A table from the file's residue names; ``order_from`` its atoms: every bond of the table is a bond of
    the file (PSF, TPR: their bond lists; GRO: minimum-image distances), elements agree."""
    kind, u, prot = adk
    names = [r.resname for r in prot.residues]
    expected = {"PSF": {"HSD"}, "TPR": {"LYSH", "HISB", "CYSH"}, "GRO": {"HIS"}}[kind]
    assert expected <= set(names)  # the force fields' own residue names
    t = bn.protein.protein_table(names, hydrogens=hydrogens)
    assert t.n_residues == 214 and t.n_atoms == (3341 if hydrogens else 1656)
    perm = t.order_from(prot.atoms.resindices - prot.residues[0].resindex, prot.atoms.names).numpy()
    assert len(set(perm.tolist())) == t.n_atoms
    file_names = prot.atoms.names[perm]
    assert [n[0] for n in file_names] == list(t.elements)
    pairs = np.concatenate([t.table.refs.numpy()[:, :1], np.arange(t.n_atoms)[:, None]], axis=1)
    pairs = np.concatenate([pairs[pairs[:, 0] >= 0], t.connectivity])  # bond references and ring bonds
    i, j = perm[pairs[:, 0]], perm[pairs[:, 1]]
    if kind == "GRO":  # no bond list: the molecule is split across the periodic box, so minimum image
        from MDAnalysis.lib.distances import calc_bonds

        d = calc_bonds(prot.positions[i], prot.positions[j], box=u.dimensions)
        heavy = np.array([file_names[a][0] != "H" and file_names[b][0] != "H" for a, b in pairs])
        assert ((d > 1.15) & (d < 1.9))[heavy].all() and ((d > 0.9) & (d < 1.4))[~heavy].all()  # S-H 1.34
    else:
        bonds = {frozenset(b) for b in prot.bonds.indices.tolist()}
        assert all(frozenset((int(a), int(b))) in bonds for a, b in zip(i, j))


def test_order_from_puts_each_adk_hydrogen_in_its_place(adk) -> None:  # type: ignore[no-untyped-def]
    """Stereo, not only the bond graph: methylene, methyl and amide hydrogens where the templates (wwPDB
    names) have them, for all but a few groups the files themselves name inconsistently."""
    kind, u, prot = adk
    t = bn.protein.protein_table([r.resname for r in prot.residues], hydrogens=True)
    perm = t.order_from(prot.atoms.resindices - prot.residues[0].resindex, prot.atoms.names).numpy()
    x = prot.positions.astype(np.float64)[perm]
    if u.dimensions is not None:  # residues split across the periodic box (GRO): minimum image about CA
        from MDAnalysis.lib.distances import minimize_vectors

        ca = x[[t.atom(int(r), "CA") for r in t.residue_index]]
        x = ca + minimize_vectors((x - ca).astype(np.float32), u.dimensions).astype(np.float64)
    tally: Counter = Counter()
    for r, name in enumerate(t.residues):
        mine = _template_signatures(name)
        got = _signatures(lambda n: x[t.atom(r, n)], name)  # noqa: B023
        for group, value in got.items():
            tally[(name, group)] += 1
            tally[(name, group, "agree")] += mine[group] == value
    groups = [k for k in tally if len(k) == 2]
    agree = sum(tally[(*k, "agree")] for k in groups) / sum(tally[k] for k in groups)
    assert agree > 0.97, agree
    # every kind of group agrees in most residues (CHARMM's Arg HH21/HH22 are mixed in the PSF: 7 of 13)
    assert all(tally[(*k, "agree")] >= tally[k] / 2 for k in groups), tally
    n_methylene = sum(tally[k] for k in groups if len(k[1]) == 2 and k[1][0][-1] == "2")
    assert n_methylene > 250
