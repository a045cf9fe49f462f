"""Construction tables from molecular topologies (mdtraj, OpenMM, PDB files), backbone torsions as rows."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..core.files import as_numpy, optional_import
from ..core.table import ConstructionTable, outside_inference_mode
from ..topology.order import adopt_dihedrals
from .templates import CHI_NAMES, SIDE_CHAINS, base_residue

#: Columns of :attr:`TopologyTable.torsion_rows` (the conventions of :func:`build`).
BACKBONE_COLUMNS = ("phi", "psi", "omega")
TORSION_COLUMNS = (*BACKBONE_COLUMNS, *CHI_NAMES)


class TopologyTable(NamedTuple):
    """A [`ConstructionTable`][batched_nerf.ConstructionTable] for a whole topology, with its atoms' labels.

    Attributes:
        table: the table of all ``N`` atoms (proteins, ligands, waters; each
            molecule its own component).
        atom_names, elements, residue_names: ``N`` labels.
        residue_index: ``(N,)`` ``torch.long`` residue of each atom (the topology's numbering, from 0).
        torsion_rows: ``(R, 7)`` ``torch.long``: the row whose dihedral is phi,
            psi, omega, chi1..chi4 of each residue (conventions of [`build`][batched_nerf.protein.build]),
            ``-1`` where the residue has none (termini, non-amino-acid residues, a
            seed row of the table, or a torsion the bond graph's build order
            cannot hold as one row).
    """

    table: ConstructionTable
    atom_names: tuple
    elements: tuple
    residue_names: tuple
    residue_index: Tensor
    torsion_rows: Tensor


def _labels(top: Any) -> tuple[list, list, list, list, list, list]:
    """Names, elements, residue names and indices, chains and bonds of an mdtraj or OpenMM topology.

    mdtraj exposes ``atoms`` and ``bonds`` as properties, OpenMM as methods.
    """
    atoms = list(top.atoms() if callable(top.atoms) else top.atoms)
    bonds = top.bonds() if callable(top.bonds) else top.bonds
    connectivity = [(a.index, b.index) for a, b in bonds]
    return (
        [a.name for a in atoms],
        [a.element.symbol if a.element is not None else "" for a in atoms],
        [a.residue.name for a in atoms],
        [a.residue.index for a in atoms],
        [a.residue.chain.index for a in atoms],
        connectivity,
    )


def _backbone_quads(names, res_index, chain, bonded) -> dict[tuple[str, int], tuple[int, int, int, int]]:
    """phi/psi/omega atom quadruples between consecutive, peptide-bonded residues of a chain."""
    where: dict[tuple[int, str], int] = {}
    for k, (r, n) in enumerate(zip(res_index, names)):
        where.setdefault((r, n), k)
    quads = {}
    residues = sorted(set(res_index))
    for r, s in zip(residues[:-1], residues[1:]):
        try:
            n0, a0, c0 = (where[(r, x)] for x in ("N", "CA", "C"))
            n1, a1, c1 = (where[(s, x)] for x in ("N", "CA", "C"))
        except KeyError:
            continue
        if chain[c0] != chain[n1] or (c0, n1) not in bonded:
            continue
        quads[("psi", r)] = (n0, a0, c0, n1)
        quads[("omega", r)] = (a0, c0, n1, a1)
        quads[("phi", s)] = (c0, n1, a1, c1)
    return quads


def _chi_quads(names, res_names, res_index) -> dict[tuple[str, int], tuple[int, int, int, int]]:
    """chi1..chi4 atom quadruples of the standard residues (and variants) of a topology."""
    where: dict[tuple[int, str], int] = {}
    for k, (r, n) in enumerate(zip(res_index, names)):
        where.setdefault((r, n), k)
    quads = {}
    seen: set[int] = set()
    for r, rn in zip(res_index, res_names):
        base = base_residue(str(rn).upper())
        if r in seen or base not in SIDE_CHAINS:
            continue
        seen.add(r)
        for atom in SIDE_CHAINS[base]:
            if isinstance(atom.dihedral, str):
                try:
                    quad = tuple(
                        where[(r, x)] for x in (atom.dihedral_ref, atom.angle_ref, atom.bond_ref, atom.name)
                    )
                except KeyError:
                    continue
                quads[(atom.dihedral, r)] = quad
    return quads


def _angstrom(xyz: Any, connectivity: list) -> Any:
    """Coordinates in Angstrom: OpenMM Quantities converted; plain arrays that look like nm refused."""
    if xyz is None:
        return None
    if hasattr(xyz, "value_in_unit") and hasattr(xyz, "unit"):  # an openmm.unit.Quantity
        unit = optional_import("openmm.unit", "openmm")
        return as_numpy(xyz.value_in_unit(unit.angstrom))
    x = as_numpy(xyz)
    if x.ndim == 2 and x.shape[-1] == 3 and connectivity:
        pairs = np.asarray(connectivity, dtype=np.int64)
        if pairs.max() < len(x):
            lengths = np.linalg.norm(x[pairs[:, 0]] - x[pairs[:, 1]], axis=-1)
            median = float(np.median(lengths))
            if median < 0.5:
                raise ValueError(
                    f"xyz looks like nanometres (median bond length {median:.3f}); table_from_topology "
                    "takes Angstrom: multiply by 10 or pass an OpenMM Quantity "
                    "(pdb.getPositions(asNumpy=True)), whose unit is converted"
                )
    return x


@outside_inference_mode  # its index tensors serve later backward passes
def table_from_topology(topology: Any, xyz: Any = None, *, link_fragments: bool = True) -> TopologyTable:
    """Table of every atom of an mdtraj ``Topology``, an OpenMM ``Topology`` or a PDB file.

    References come from the bond graph
    ([`batched_nerf.ConstructionTable.from_connectivity`][batched_nerf.ConstructionTable.from_connectivity]:
    bonded
    references, proper torsions, hydrogens and other branches on a sibling;
    with coordinates, chains, ligands and waters are linked into one build by
    non-bonded references unless ``link_fragments=False``, which keeps each
    molecule its own component), then each
    backbone torsion phi, psi, omega (between peptide-bonded residues) is made
    the dihedral of exactly one row, listed in `TopologyTable.torsion_rows`.

    Hydrogens hang on their heavy atom (their only bond); chi1..chi4 of the
    standard residues (and the Amber variants) are single rows too, where the
    build order allows it (a torsion is made a row only if its new reference is
    built before the atom, so chains in any order never give a reference cycle).

    Args:
        topology: ``mdtraj.Topology``, ``openmm.app.Topology`` or the path of a
            PDB (or any mdtraj-readable) file, whose first frame gives ``xyz``.
        xyz: optional ``(N, 3)`` coordinates in Angstrom, or an OpenMM
            ``Quantity`` (any length unit, converted), used to avoid
            near-linear reference triples and to link the molecules.
        link_fragments: link separate molecules into one build (needs
            coordinates; see [`batched_nerf.nonbonded_references`][batched_nerf.nonbonded_references]).

    Returns:
        [`TopologyTable`][batched_nerf.protein.TopologyTable].

    Raises:
        ImportError: a path is given but mdtraj is not installed.
        TypeError: an unsupported topology object.
        ValueError: ``xyz`` of the wrong shape (see ``from_connectivity``), or a
            plain array that looks like nanometres (median bond below 0.5).

    Example:
        >>> import os, tempfile, pytest, torch, batched_nerf as bn
        >>> md = pytest.importorskip("mdtraj")  # optional: skips this example without mdtraj
        >>> p = bn.protein.build("GAG", torch.full((3,), -1.0), torch.full((3,), 2.0))
        >>> path = os.path.join(tempfile.mkdtemp(), "gag.pdb")
        >>> bn.protein.write_pdb(p, path)
        >>> top = bn.protein.table_from_topology(path)
        >>> top.table.n_atoms, tuple(top.torsion_rows.shape), int((top.torsion_rows[:, :3] >= 0).sum())
        (14, (3, 7), 6)
    """
    if isinstance(topology, (str, os.PathLike)):
        md = optional_import("mdtraj", "mdtraj")
        traj = md.load(os.fspath(topology))
        if xyz is None:
            xyz = traj.xyz[0] * 10.0
        topology = traj.topology
    if hasattr(topology, "atoms") and hasattr(topology, "bonds"):
        labels = _labels(topology)
    else:
        raise TypeError(
            "topology must be an mdtraj Topology, an OpenMM Topology or a file path, "
            f"got {type(topology).__name__}"
        )
    names, elements, res_names, res_index, chain, connectivity = labels
    n = len(names)
    xyz_np = _angstrom(xyz, connectivity)
    start = next((k for k, nm in enumerate(names) if nm == "N" and res_names[k] not in ("HOH", "WAT")), None)
    base = ConstructionTable.from_connectivity(
        connectivity, n, xyz=xyz_np, root=start, link_fragments=link_fragments and xyz_np is not None
    )
    refs = base.refs.numpy().copy()
    bonded = {(int(a), int(b)) for a, b in connectivity} | {(int(b), int(a)) for a, b in connectivity}
    quads = _backbone_quads(names, res_index, chain, bonded)
    quads.update(_chi_quads(names, res_names, res_index))
    residues = sorted(set(res_index))
    position = {r: k for k, r in enumerate(residues)}
    rows = torch.full((len(residues), len(TORSION_COLUMNS)), -1, dtype=torch.long)
    taken = adopt_dihedrals(refs, np.array(list(quads.values()), dtype=np.int64).reshape(-1, 4))
    for ((name, r), _), atom in zip(quads.items(), taken.tolist()):
        if atom >= 0:
            rows[position[r], TORSION_COLUMNS.index(name)] = atom
    table = ConstructionTable(refs)
    return TopologyTable(
        table,
        tuple(names),
        tuple(elements),
        tuple(res_names),
        torch.tensor([position[r] for r in res_index], dtype=torch.long),
        rows,
    )
