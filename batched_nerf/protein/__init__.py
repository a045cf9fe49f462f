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
- [`build_backbone`][batched_nerf.protein.build_backbone] /
  [`backbone_internal`][batched_nerf.protein.backbone_internal]: backbones (N, CA, C) of
  mixed lengths from per-residue torsions, bond angles and lengths (FoldingDiff's six
  angles), and back;
- [`place_side_chains`][batched_nerf.protein.place_side_chains]: side chains (and hydrogens)
  placed from chi onto a given backbone (N, CA, C, O), mixed batches in one call;
- [`to_atom37`][batched_nerf.protein.to_atom37] / [`to_atom14`][batched_nerf.protein.to_atom14] and back:
  OpenFold's atom37 and atom14 layouts; [`symmetric_chi`][batched_nerf.protein.symmetric_chi],
  [`symmetric_renaming`][batched_nerf.protein.symmetric_renaming] and
  [`chi_loss`][batched_nerf.protein.chi_loss]: the pi-periodic side-chain torsions;
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

from ..residues.templates import (
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
from ..residues.topology import TopologyTable, table_from_topology
from ._backbone import FOLDINGDIFF_FIRST, BackboneInternal, backbone_internal, build_backbone
from ._build import PackedProteins, Protein, build, build_batch, packed_proteins
from ._inverse import Torsions, internal_coordinates, torsions, torsions_batch
from ._layouts import ATOM37_NAMES, atom14_names, from_atom14, from_atom37, to_atom14, to_atom37
from ._pdb import write_pdb
from ._sequence import NAME_ALIASES, TORSION_NAMES, ProteinTable, parse_sequence, protein_table
from ._side_chains import BACKBONE_ATOMS, place_side_chains
from ._symmetry import chi_loss, symmetric_chi, symmetric_renaming

__all__ = [
    "ATOM37_NAMES",
    "BACKBONE_ATOMS",
    "CAPS",
    "CHI_NAMES",
    "DEFAULT_CHI",
    "FOLDINGDIFF_FIRST",
    "NAME_ALIASES",
    "ONE_TO_THREE",
    "RESIDUE_ALIASES",
    "RESIDUE_NAMES",
    "THREE_TO_ONE",
    "TORSION_NAMES",
    "UNSUPPORTED_RESIDUES",
    "VARIANTS",
    "BackboneInternal",
    "PackedProteins",
    "Protein",
    "ProteinTable",
    "TopologyTable",
    "Torsions",
    "atom14_names",
    "backbone_internal",
    "build",
    "build_backbone",
    "build_batch",
    "chi_loss",
    "from_atom14",
    "from_atom37",
    "internal_coordinates",
    "packed_proteins",
    "parse_sequence",
    "place_side_chains",
    "protein_table",
    "symmetric_chi",
    "symmetric_renaming",
    "table_from_topology",
    "to_atom14",
    "to_atom37",
    "torsions",
    "torsions_batch",
    "write_pdb",
]
