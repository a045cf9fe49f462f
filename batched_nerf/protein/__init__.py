"""Proteins: all heavy atoms (or every atom) of amino-acid sequences from torsions, and back.

A layer above the core (which never imports it), built on the public API
([`batched_nerf.ConstructionTable`][batched_nerf.ConstructionTable],
[`batched_nerf.to_cartesian`][batched_nerf.to_cartesian],
[`batched_nerf.to_internal`][batched_nerf.to_internal],
[`batched_nerf.pack_tables`][batched_nerf.pack_tables]):

- [`protein_table`][batched_nerf.protein.protein_table]: the Z-matrix of a sequence from residue templates
  (Engh & Huber 1991 bond lengths and angles; hydrogens with Amber ff14SB
  values, PDB/Amber names, variants HID HIE HIP CYX ASH GLH LYN, caps ACE NME;
  CHARMM and GROMACS residue and atom names read too),
  cached per sequence, with phi/psi/omega/chi1-chi4 and the hydrogen rotors as
  single named rows;
- [`build`][batched_nerf.protein.build] / [`build_batch`][batched_nerf.protein.build_batch]: coordinates from
torsions, for one
  sequence or a mixed batch;
- [`torsions`][batched_nerf.protein.torsions] / [`torsions_batch`][batched_nerf.protein.torsions_batch] /
[`internal_coordinates`][batched_nerf.protein.internal_coordinates]: the inverse;
- [`write_pdb`][batched_nerf.protein.write_pdb]: PDB output, one MODEL per structure;
- [`table_from_topology`][batched_nerf.protein.table_from_topology]: a table for every atom of an
mdtraj/OpenMM
  topology or PDB file (ligands, waters), backbone torsions as rows.

Example:
    >>> import torch, batched_nerf as bn
    >>> p = bn.protein.build("MKV", torch.full((3,), -1.0), torch.full((3,), -0.8))
    >>> p.xyz.shape, p.elements[-1]
    (torch.Size([25, 3]), 'O')
"""

from ._build import PackedProteins, Protein, build, build_batch, packed_proteins
from ._inverse import Torsions, internal_coordinates, torsions, torsions_batch
from ._pdb import write_pdb
from ._sequence import NAME_ALIASES, TORSION_NAMES, ProteinTable, parse_sequence, protein_table
from ._templates import (
    CAPS,
    CHI_NAMES,
    DEFAULT_CHI,
    ONE_TO_THREE,
    RESIDUE_ALIASES,
    RESIDUE_NAMES,
    THREE_TO_ONE,
    UNSUPPORTED_RESIDUES,
    VARIANTS,
)
from ._topology import TopologyTable, table_from_topology

__all__ = [
    "CAPS",
    "CHI_NAMES",
    "DEFAULT_CHI",
    "NAME_ALIASES",
    "ONE_TO_THREE",
    "RESIDUE_ALIASES",
    "RESIDUE_NAMES",
    "THREE_TO_ONE",
    "TORSION_NAMES",
    "UNSUPPORTED_RESIDUES",
    "VARIANTS",
    "PackedProteins",
    "Protein",
    "ProteinTable",
    "TopologyTable",
    "Torsions",
    "build",
    "build_batch",
    "internal_coordinates",
    "packed_proteins",
    "parse_sequence",
    "protein_table",
    "table_from_topology",
    "torsions",
    "torsions_batch",
    "write_pdb",
]
