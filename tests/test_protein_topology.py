"""Tables from topologies: a protein with a ligand and waters, read by mdtraj, round-trips."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import batched_nerf as bn

md = pytest.importorskip("mdtraj", reason="mdtraj is an optional dependency (batched-nerf[protein])")

SEQUENCE = "MKTAYWDGHP"

# ethanol (CONECT bonds) and two waters, placed away from the peptide
HETERO = """\
HETATM 9001  C1  EOH B   1      20.000  20.000  20.000  1.00  0.00           C
HETATM 9002  C2  EOH B   1      21.520  20.000  20.000  1.00  0.00           C
HETATM 9003  O   EOH B   1      22.020  21.350  20.000  1.00  0.00           O
HETATM 9004  O   HOH C   1      25.000  25.000  25.000  1.00  0.00           O
HETATM 9005  H1  HOH C   1      25.957  25.000  25.000  1.00  0.00           H
HETATM 9006  H2  HOH C   1      24.760  25.927  25.000  1.00  0.00           H
HETATM 9007  O   HOH C   2      30.000  25.000  25.000  1.00  0.00           O
HETATM 9008  H1  HOH C   2      30.957  25.000  25.000  1.00  0.00           H
HETATM 9009  H2  HOH C   2      29.760  25.927  25.000  1.00  0.00           H
CONECT 9001 9002
CONECT 9002 9001 9003
CONECT 9003 9002
"""


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    g = torch.Generator().manual_seed(4)
    n = len(SEQUENCE)
    phi, psi = (torch.empty(n, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g) for _ in "ab")
    chi = torch.empty(n, 4, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g)
    protein = bn.protein.build(SEQUENCE, phi, psi, chi=chi)
    text = bn.protein.write_pdb(protein).replace("ENDMDL\nEND\n", "")
    path = tmp_path_factory.mktemp("top") / "system.pdb"
    path.write_text(text + HETERO + "ENDMDL\nEND\n")
    return path


def test_table_covers_protein_ligand_and_waters(system):
    traj = md.load(str(system))
    top = bn.protein.table_from_topology(system)
    assert top.table.n_atoms == traj.n_atoms
    # with coordinates the molecules are linked into one build ...
    assert top.table.n_components == 1
    # ... or kept apart: peptide, ethanol and two waters are separate components
    apart = bn.protein.table_from_topology(system, link_fragments=False)
    assert apart.table.n_components == 4
    assert top.residue_names[-1] == "HOH" and top.elements[-1] == "H"
    # every backbone torsion between residues is a row, addressable by residue
    rows = top.torsion_rows[: len(SEQUENCE)]
    assert (rows[1:, 0] >= 0).all() and (rows[:-1, 1:3] >= 0).all()
    assert (top.torsion_rows[len(SEQUENCE) :] == -1).all()


def test_backbone_rows_hold_mdtraj_torsions(system):
    traj = md.load(str(system))
    top = bn.protein.table_from_topology(traj.topology, xyz=traj.xyz[0] * 10)
    xyz = torch.tensor(traj.xyz[0] * 10.0, dtype=torch.float64)
    dihedrals = bn.to_internal(xyz, top.table).dihedrals.numpy()
    for column, name in enumerate(("phi", "psi", "omega")):
        idx, values = getattr(md, f"compute_{name}")(traj)
        for quad, value in zip(idx, values[0]):
            residue = traj.topology.atom(int(quad[1])).residue.index
            row = int(top.torsion_rows[residue, column])
            diff = (dihedrals[row] - value + math.pi) % (2 * math.pi) - math.pi
            assert abs(diff) < 1e-5, (name, residue)


def test_round_trip_of_the_structure(system):
    traj = md.load(str(system))
    top = bn.protein.table_from_topology(system)
    xyz = torch.tensor(traj.xyz[0] * 10.0, dtype=torch.float64)
    ic, pose = bn.to_internal(xyz, top.table, return_pose=True)
    back = bn.to_cartesian(*ic, top.table, rotation=pose.rotation, translation=pose.translation)
    np.testing.assert_allclose(back.numpy(), xyz.numpy(), atol=1e-6)


def test_openmm_style_topology_and_errors(system):
    traj = md.load(str(system))

    class Atom:  # the OpenMM Topology interface: atoms(), bonds(), with .residue.chain
        def __init__(self, a):
            self.index, self.name, self.element, self.residue = a.index, a.name, a.element, a.residue

    class OpenMMLike:
        def atoms(self):
            return [Atom(a) for a in traj.topology.atoms]

        def bonds(self):
            return [(Atom(a), Atom(b)) for a, b in traj.topology.bonds]

    a = bn.protein.table_from_topology(OpenMMLike())
    b = bn.protein.table_from_topology(traj.topology)
    assert a.table == b.table and torch.equal(a.torsion_rows, b.torsion_rows)
    with pytest.raises(TypeError, match="topology must be an mdtraj Topology"):
        bn.protein.table_from_topology(42)


@pytest.fixture(scope="module")
def peptidebuilder_system(tmp_path_factory):
    """A peptide built by PeptideBuilder (an independent tool), plus the ethanol and two waters above."""
    pb = pytest.importorskip("PeptideBuilder", reason="PeptideBuilder is an optional test dependency")
    from Bio.PDB import PDBIO
    from PeptideBuilder import Geometry

    rng = np.random.default_rng(11)
    geos = []
    for k, aa in enumerate(SEQUENCE):
        geo = Geometry.geometry(aa)
        geo.phi, geo.psi_im1 = float(rng.uniform(-170, -50)), float(rng.uniform(-70, 170)) if k else 0.0
        geos.append(geo)
    structure = pb.initialize_res(geos[0])
    for geo in geos[1:]:
        pb.add_residue(structure, geo)
    pb.add_terminal_OXT(structure)
    io = PDBIO()
    io.set_structure(structure)
    path = tmp_path_factory.mktemp("pb") / "peptide.pdb"
    io.save(str(path))
    atoms = [line for line in path.read_text().splitlines() if line.startswith("ATOM")]
    path.write_text("\n".join(atoms) + "\nTER\n" + HETERO + "END\n")
    return path


@pytest.mark.parametrize("link", [True, False])
def test_peptidebuilder_system_round_trips(peptidebuilder_system, link):
    traj = md.load(str(peptidebuilder_system))
    top = bn.protein.table_from_topology(peptidebuilder_system, link_fragments=link)
    assert top.table.n_atoms == traj.n_atoms
    assert top.table.n_components == (1 if link else 4)  # peptide, ethanol, two waters
    xyz = torch.tensor(traj.xyz[0] * 10.0, dtype=torch.float64)
    ic, pose = bn.to_internal(xyz, top.table, return_pose=True)
    back = bn.to_cartesian(*ic, top.table, rotation=pose.rotation, translation=pose.translation)
    np.testing.assert_allclose(back.numpy(), xyz.numpy(), atol=1e-6)
    # the backbone torsions are single rows and hold mdtraj's values
    dihedrals = ic.dihedrals.numpy()
    for column, name in enumerate(("phi", "psi", "omega")):
        idx, values = getattr(md, f"compute_{name}")(traj)
        assert len(idx) == len(SEQUENCE) - 1
        for quad, value in zip(idx, values[0]):
            row = int(top.torsion_rows[traj.topology.atom(int(quad[1])).residue.index, column])
            assert abs((dihedrals[row] - value + math.pi) % (2 * math.pi) - math.pi) < 1e-5, (name, row)


def test_table_made_under_inference_mode_serves_training(system):
    """A TopologyTable made in a validation pass holds no inference tensors: its rows index a backward."""
    with torch.inference_mode():
        top = bn.protein.table_from_topology(system)
    assert not top.residue_index.is_inference() and not top.torsion_rows.is_inference()
    xyz = torch.tensor(md.load(str(system)).xyz[0] * 10.0, dtype=torch.float64, requires_grad=True)
    rows = top.torsion_rows[:, 0]
    phi = bn.to_internal(xyz, top.table).dihedrals.index_select(-1, rows[rows >= 0])
    weights = torch.ones(len(top.torsion_rows), dtype=torch.float64).index_select(0, top.residue_index)
    (phi.sin().sum() + (weights * xyz[:, 0]).sum()).backward()
    assert torch.isfinite(xyz.grad).all() and xyz.grad.abs().sum() > 0
