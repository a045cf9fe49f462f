"""Readers, writers and adapters for molecular file formats and other packages.

* [`xyz`][batched_nerf.formats.xyz]: XYZ coordinate files, single- and multi-frame.
* [`gaussian`][batched_nerf.formats.gaussian]: Gaussian input files and Z-matrix text (read as a
[`ZMatrix`][batched_nerf.ZMatrix]).
* [`bgflow`][batched_nerf.formats.bgflow]: the integer z-matrices of bgflow / bgmol.
* [`chemcoord`][batched_nerf.formats.chemcoord]: chemcoord ``Zmat`` objects and files (needs ``chemcoord``).
* [`ase`][batched_nerf.formats.ase]: ASE ``Atoms`` (needs ``ase``).
* [`rdkit`][batched_nerf.formats.rdkit]: construction tables and coordinates from RDKit molecules (needs
``rdkit``).
* [`mdanalysis`][batched_nerf.formats.mdanalysis]: tables from MDAnalysis ``AtomGroup`` objects, trajectory
frames, and
  ``MDAnalysis.analysis.bat.BAT`` interoperability (needs ``MDAnalysis``).
* [`mdtraj`][batched_nerf.formats.mdtraj]: mdtraj trajectories in Angstrom, with their tables and unit cells
(needs ``mdtraj``).

The optional packages are imported only when their functions are called.
"""

from __future__ import annotations

from ..core.zmatrix import ZMatrix
from .ase import from_ase, to_ase
from .bgflow import refs_from_bgflow, refs_to_bgflow, table_from_bgflow, table_to_bgflow
from .chemcoord import from_chemcoord, read_chemcoord, to_chemcoord
from .gaussian import GaussianInput, read_gaussian, read_zmat, write_gaussian, write_zmat
from .mdanalysis import (
    AtomGroupTable,
    BATTable,
    frames,
    from_bat,
    table_from_atomgroup,
    table_from_bat,
    to_bat,
)
from .mdtraj import MDTrajFrames, from_mdtraj
from .rdkit import table_from_rdkit, xyz_from_rdkit
from .xyz import read_xyz, write_xyz

__all__ = [
    "AtomGroupTable",
    "BATTable",
    "GaussianInput",
    "MDTrajFrames",
    "ZMatrix",
    "frames",
    "from_ase",
    "from_bat",
    "from_chemcoord",
    "from_mdtraj",
    "read_chemcoord",
    "read_gaussian",
    "read_xyz",
    "read_zmat",
    "refs_from_bgflow",
    "refs_to_bgflow",
    "table_from_atomgroup",
    "table_from_bat",
    "table_from_bgflow",
    "table_from_rdkit",
    "table_to_bgflow",
    "to_ase",
    "to_bat",
    "to_chemcoord",
    "write_gaussian",
    "write_xyz",
    "write_zmat",
    "xyz_from_rdkit",
]
