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
