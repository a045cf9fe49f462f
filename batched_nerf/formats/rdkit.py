"""Adapter for [RDKit](https://www.rdkit.org) molecules (an optional dependency).

RDKit is imported only when these functions are called. The bond graph of a
``Mol`` gives a chemically sensible construction table (see
[`batched_nerf.ConstructionTable.from_connectivity`][batched_nerf.ConstructionTable.from_connectivity]), and
its conformers give
coordinates, so any molecule RDKit can read (SMILES, SDF, MOL2, PDB) can be
converted:

```python
from rdkit import Chem
from rdkit.Chem import AllChem
from batched_nerf.formats import table_from_rdkit, xyz_from_rdkit

mol = Chem.AddHs(Chem.MolFromSmiles("CC(=O)NC(C)C(=O)NC"))
AllChem.EmbedMolecule(mol, randomSeed=0)
table = table_from_rdkit(mol)
elements, xyz = xyz_from_rdkit(mol)          # (F, N, 3), one frame per conformer
```
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.files import optional_import
from ..core.table import ConstructionTable

__all__ = ["table_from_rdkit", "xyz_from_rdkit"]


def _check_mol(mol: Any) -> None:
    Chem = optional_import("rdkit.Chem", "rdkit")
    if not isinstance(mol, Chem.Mol):
        raise TypeError(f"expected an rdkit.Chem.Mol, got {type(mol).__name__}")


def table_from_rdkit(
    mol: Any, *, conf_id: int | None = -1, root: int | None = None, link_fragments: bool | None = None
) -> ConstructionTable:
    """Construction table from the bond graph of an RDKit molecule.

    Atom ``i`` of the table is RDKit atom ``i`` (hydrogens only if they are
    explicit atoms: use ``Chem.AddHs`` first). With a conformer, near-linear
    reference triples are avoided, as in
    [`from_xyz`][batched_nerf.ConstructionTable.from_xyz], and the fragments of a
    salt or a complex (``CC(=O)[O-].[Na+]``) are linked into one build: each
    further fragment's seed atoms reference the nearest atoms already placed
    (see [`nonbonded_references`][batched_nerf.nonbonded_references]).

    Args:
        mol: an ``rdkit.Chem.Mol``.
        conf_id: the conformer whose coordinates guide the choice of references
            (``-1``: the default conformer); ``None``, or a molecule without
            conformers, uses the bond graph only.
        root: optional atom placed at the origin.
        link_fragments: link the fragments into one build (default: when a
            conformer is used), or give each its own seed triple (``False``).

    Returns:
        A [`ConstructionTable`][batched_nerf.ConstructionTable] with ``mol.GetNumAtoms()`` rows.

    Raises:
        ImportError: RDKit is not installed.
        TypeError: ``mol`` is not a ``Mol``.
        ValueError: ``root`` out of range, an unknown ``conf_id``, coincident
            atoms in the conformer, or ``link_fragments=True`` without a conformer.
    """
    _check_mol(mol)
    bonds = np.array(
        [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()], dtype=np.int64
    ).reshape(-1, 2)
    xyz = None
    if conf_id is not None and mol.GetNumConformers():
        try:
            xyz = np.asarray(mol.GetConformer(conf_id).GetPositions(), dtype=np.float64)
        except ValueError as exc:
            raise ValueError(f"conformer {conf_id}: {exc}") from None
    return ConstructionTable.from_connectivity(
        bonds, mol.GetNumAtoms(), xyz=xyz, root=root, link_fragments=link_fragments
    )


def xyz_from_rdkit(mol: Any) -> tuple[list[str], np.ndarray]:
    """Element symbols and the coordinates of all conformers of an RDKit molecule.

    Args:
        mol: an ``rdkit.Chem.Mol`` with at least one conformer.

    Returns:
        ``(elements, xyz)``: ``N`` element symbols and ``(F, N, 3)`` ``float64``
        coordinates, one frame per conformer (in Angstrom, as RDKit stores them).

    Raises:
        ImportError: RDKit is not installed.
        TypeError: ``mol`` is not a ``Mol``.
        ValueError: the molecule has no conformers.
    """
    _check_mol(mol)
    if not mol.GetNumConformers():
        raise ValueError("the molecule has no conformers (embed one, e.g. AllChem.EmbedMolecule(mol))")
    elements = [atom.GetSymbol() for atom in mol.GetAtoms()]
    xyz = np.stack([np.asarray(c.GetPositions(), dtype=np.float64) for c in mol.GetConformers()])
    return elements, xyz.reshape(len(xyz), len(elements), 3)
