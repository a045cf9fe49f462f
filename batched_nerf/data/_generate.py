"""Regenerate the shipped molecule files from standard bond lengths and angles.

Run ``python -m batched_nerf.data._generate`` to rewrite the ``*.json`` files
next to this module. Every molecule is defined here by its Z-matrix (angles in
degrees); the Cartesian coordinates stored alongside are built from it with the
float64 numpy reference NeRF in `_reference`, so nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ._reference import build_xyz

# (name, element, (bond_ref, angle_ref, dihedral_ref), bond [A], angle [deg], dihedral [deg])
Row = tuple[str, str, tuple[int, int, int], float, float, float]

# ACE-ALA-NME, the atom order of the openmm/openmmtools/bgmol alanine dipeptide
# test systems. phi = C(ACE)-N-CA-C is row 14 (C), psi = N-CA-C-N(NME) is row 16.
_PHI, _PSI = -80.0, 75.0
ALANINE_DIPEPTIDE: list[Row] = [
    ("H1", "H", (1, 4, 6), 1.090, 109.5, 180.0),  # 0  ACE HH31
    ("CH3", "C", (-1, -1, -1), 0.0, 0.0, 0.0),  # 1  ACE CH3 (origin)
    ("H2", "H", (1, 4, 0), 1.090, 109.5, 120.0),  # 2  ACE HH32
    ("H3", "H", (1, 4, 0), 1.090, 109.5, -120.0),  # 3  ACE HH33
    ("C", "C", (1, -1, -1), 1.522, 0.0, 0.0),  # 4  ACE C
    ("O", "O", (4, 1, 6), 1.229, 120.4, 180.0),  # 5  ACE O
    ("N", "N", (4, 1, -1), 1.335, 116.6, 0.0),  # 6  ALA N
    ("H", "H", (6, 4, 8), 1.010, 119.8, 180.0),  # 7  ALA H
    ("CA", "C", (6, 4, 1), 1.449, 121.9, 180.0),  # 8  ALA CA (omega of ACE)
    ("HA", "H", (8, 6, 14), 1.090, 109.5, 120.0),  # 9  ALA HA (L-alanine)
    ("CB", "C", (8, 6, 14), 1.526, 110.1, -120.0),  # 10 ALA CB
    ("HB1", "H", (10, 8, 6), 1.090, 109.5, 180.0),  # 11 ALA HB1
    ("HB2", "H", (10, 8, 11), 1.090, 109.5, 120.0),  # 12 ALA HB2
    ("HB3", "H", (10, 8, 11), 1.090, 109.5, -120.0),  # 13 ALA HB3
    ("C", "C", (8, 6, 4), 1.522, 111.1, _PHI),  # 14 ALA C   (dihedral = phi)
    ("O", "O", (14, 8, 16), 1.229, 120.4, 180.0),  # 15 ALA O
    ("N", "N", (14, 8, 6), 1.335, 116.6, _PSI),  # 16 NME N   (dihedral = psi)
    ("H", "H", (16, 14, 18), 1.010, 119.8, 180.0),  # 17 NME H
    ("C", "C", (16, 14, 8), 1.449, 121.9, 180.0),  # 18 NME CH3 (omega of ALA)
    ("H1", "H", (18, 16, 14), 1.090, 109.5, 180.0),  # 19 NME HH31
    ("H2", "H", (18, 16, 19), 1.090, 109.5, 120.0),  # 20 NME HH32
    ("H3", "H", (18, 16, 19), 1.090, 109.5, -120.0),  # 21 NME HH33
]


def _chain_20() -> list[Row]:
    """United-atom polyethylene, 20 CH2 beads, all-trans with two gauche defects."""
    rows: list[Row] = []
    for i in range(20):
        refs = tuple(i - k if i - k >= 0 else -1 for k in (1, 2, 3))
        dihedral = {7: 65.0, 13: -65.0}.get(i, 180.0)
        rows.append((f"C{i + 1}", "C", refs, 1.54 if i else 0.0, 114.0 if i > 1 else 0.0, dihedral))  # type: ignore[arg-type]
    return [(n, e, r, b, a, d if r[2] >= 0 else 0.0) for n, e, r, b, a, d in rows]


def _polyethylene(n_carbons: int = 8) -> list[Row]:
    """Explicit-hydrogen H-(CH2)n-H (n-octane by default), all-trans.

    Atom order: each carbon followed by its hydrogens. Methyl hydrogens use a
    proper torsion for the first and the sibling for the other two; CH2
    hydrogens sit at +-121 deg around the C(k-1)-C(k) bond from C(k+1).
    """
    n_h = [3 if k in (0, n_carbons - 1) else 2 for k in range(n_carbons)]
    c_row = [k + sum(n_h[:k]) for k in range(n_carbons)]
    rows: list[Row] = []
    for k in range(n_carbons):
        c = c_row[k]
        refs = tuple(c_row[k - j] if k - j >= 0 else -1 for j in (1, 2, 3))
        rows.append(
            (f"C{k + 1}", "C", refs, 1.53 if k else 0.0, 112.0 if k > 1 else 0.0, 180.0 if k > 2 else 0.0)
        )  # type: ignore[arg-type]
        if n_h[k] == 3:
            axis = c_row[1] if k == 0 else c_row[k - 1]
            proper = c_row[2] if k == 0 else c_row[k - 2]
            first = len(rows)
            rows.append((f"H{k + 1}1", "H", (c, axis, proper), 1.09, 109.5, 180.0))
            rows.append((f"H{k + 1}2", "H", (c, axis, first), 1.09, 109.5, 120.0))
            rows.append((f"H{k + 1}3", "H", (c, axis, first), 1.09, 109.5, -120.0))
        else:
            prv, nxt = c_row[k - 1], c_row[k + 1]
            rows.append((f"H{k + 1}1", "H", (c, prv, nxt), 1.09, 109.5, 121.0))
            rows.append((f"H{k + 1}2", "H", (c, prv, nxt), 1.09, 109.5, -121.0))
    return rows


def _benzene() -> list[Row]:
    """Planar benzene: C-C 1.39, C-H 1.09, all angles 120 deg; the ring closes exactly."""
    rows: list[Row] = []
    for k in range(6):
        refs = tuple(k - j if k - j >= 0 else -1 for j in (1, 2, 3))
        rows.append((f"C{k + 1}", "C", refs, 1.39 if k else 0.0, 120.0 if k > 1 else 0.0, 0.0))  # type: ignore[arg-type]
    for k in range(6):
        rows.append((f"H{k + 1}", "H", (k, (k + 1) % 6, (k + 2) % 6), 1.09, 120.0, 180.0))
    return rows


def _molecule(
    name: str, description: str, rows: list[Row], extra_bonds: list[tuple[int, int]], meta: dict[str, Any]
) -> dict[str, Any]:
    refs = np.array([r[2] for r in rows], dtype=np.int64)
    bonds = np.array([r[3] for r in rows])
    angles_deg = np.array([r[4] for r in rows])
    dihedrals_deg = np.array([r[5] for r in rows])
    xyz = build_xyz(refs, bonds, np.deg2rad(angles_deg), np.deg2rad(dihedrals_deg))
    connectivity = sorted(
        {tuple(sorted((i, int(b)))) for i, b in enumerate(refs[:, 0]) if b >= 0}
        | {tuple(sorted(p)) for p in extra_bonds}
    )
    return {
        "name": name,
        "description": description,
        "units": {"bonds": "angstrom", "angles": "degree", "dihedrals": "degree", "xyz": "angstrom"},
        "elements": [r[1] for r in rows],
        "names": [r[0] for r in rows],
        "refs": refs.tolist(),
        "bonds": bonds.tolist(),
        "angles": angles_deg.tolist(),
        "dihedrals": dihedrals_deg.tolist(),
        "connectivity": [list(p) for p in connectivity],
        "xyz": xyz.tolist(),
        "metadata": meta,
    }


def molecules() -> list[dict[str, Any]]:
    """The shipped molecules as JSON-ready dictionaries."""
    return [
        _molecule(
            "alanine_dipeptide",
            "Alanine dipeptide (ACE-ALA-NME), L-alanine, C7eq-like conformation (phi=-80, psi=75 deg), "
            "built from standard bond lengths and angles; openmm/bgmol atom order.",
            ALANINE_DIPEPTIDE,
            [],
            {
                "phi": [4, 6, 8, 14],
                "psi": [6, 8, 14, 16],
                "phi_row": 14,
                "psi_row": 16,
                "phi_deg": _PHI,
                "psi_deg": _PSI,
                "residues": ["ACE"] * 6 + ["ALA"] * 10 + ["NME"] * 6,
            },
        ),
        _molecule(
            "chain_20",
            "United-atom polyethylene chain of 20 CH2 beads (C-C 1.54 A, C-C-C 114 deg), all-trans "
            "with gauche defects at rows 7 (+65 deg) and 13 (-65 deg).",
            _chain_20(),
            [],
            {"model": "united-atom", "gauche_rows": [7, 13]},
        ),
        _molecule(
            "polyethylene",
            "Explicit-hydrogen polyethylene oligomer H-(CH2)8-H (n-octane), all-trans.",
            _polyethylene(8),
            [],
            {"model": "all-atom", "n_carbons": 8},
        ),
        _molecule(
            "benzene",
            "Planar benzene (C-C 1.39 A, C-H 1.09 A, 120 deg); the bond C6-C1 closes the ring.",
            _benzene(),
            [(5, 0)],
            {"ring_closure": [5, 0]},
        ),
    ]


def main() -> None:
    """Write every molecule to ``<name>.json`` next to this module."""
    here = Path(__file__).resolve().parent
    for mol in molecules():
        (here / f"{mol['name']}.json").write_text(json.dumps(mol, indent=1) + "\n")


if __name__ == "__main__":  # pragma: no cover
    main()
