"""All-atom peptides against OpenMM's amber14-all.xml: templates match, geometry, energies, inverse, units."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

import batched_nerf as bn

app = pytest.importorskip("openmm.app", reason="openmm is an optional dependency (batched-nerf[protein])")
mm = pytest.importorskip("openmm", reason="openmm is an optional dependency (batched-nerf[protein])")
unit = pytest.importorskip("openmm.unit", reason="openmm is an optional dependency (batched-nerf[protein])")

ALL20 = "ARNDCQEGHILKMFPSTWYV"
RESIDUES = [*bn.protein.ONE_TO_THREE.values(), "HID", "HIE", "HIP", "ASH", "GLH", "LYN"]
#: amber14 has no N- or C-terminal templates of these (only within a chain)
NO_TERMINAL = {"ASH", "GLH", "LYN"}
#: H on five-membered aromatic rings: amber's two 120 deg targets and the ring angle (~108 deg) sum to
#: less than 360, so the planar hydrogen (on the exterior bisector) is ~6 deg from both targets
FIVE_RING_H = {("HIS", "HD1"), ("HIS", "HE2"), ("HIS", "HD2"), ("HIS", "HE1"), ("TRP", "HD1"), ("TRP", "HE1")}


@pytest.fixture(scope="module")
def forcefield():
    return app.ForceField("amber14-all.xml")


def build_pdb(seq: str, phi: float = -2.5, psi: float = 2.4):
    n = bn.protein.protein_table(seq).n_residues
    p = bn.protein.build(
        seq,
        torch.full((n,), phi, dtype=torch.float64),
        torch.full((n,), psi, dtype=torch.float64),
        hydrogens=True,
    )
    return p, app.PDBFile(io.StringIO(bn.protein.write_pdb(p)))


def geometry_errors(system, pdb):
    """(|bond - r0| A, label) for X-H bonds and (|angle - theta0| deg, label) for angles with an H end."""
    xyz = pdb.getPositions(asNumpy=True).value_in_unit(unit.angstrom)
    atoms = list(pdb.topology.atoms())
    is_h = [a.element.symbol == "H" for a in atoms]
    bonds, angles = [], []
    for force in system.getForces():
        if isinstance(force, mm.HarmonicBondForce):
            for k in range(force.getNumBonds()):
                i, j, r0, _ = force.getBondParameters(k)
                if is_h[i] or is_h[j]:
                    err = abs(np.linalg.norm(xyz[i] - xyz[j]) - r0.value_in_unit(unit.angstrom))
                    bonds.append((err, (atoms[i].residue.name, atoms[i].name, atoms[j].name)))
        if isinstance(force, mm.HarmonicAngleForce):
            for k in range(force.getNumAngles()):
                i, j, m, theta0, _ = force.getAngleParameters(k)
                if is_h[i] or is_h[m]:
                    u, v = xyz[i] - xyz[j], xyz[m] - xyz[j]
                    a = math.degrees(math.atan2(np.linalg.norm(np.cross(u, v)), u @ v))
                    hs = {(atoms[x].residue.name, atoms[x].name) for x in (i, m) if is_h[x]}
                    angles.append((abs(a - math.degrees(theta0.value_in_unit(unit.radian))), hs))
    return bonds, angles


@pytest.mark.parametrize("res", RESIDUES)
def test_every_residue_matches_an_amber14_template(forcefield, res):
    # in the middle, as the N-terminal and as the C-terminal residue, and between caps
    ends = () if res in NO_TERMINAL else (f"{res} GLY", f"GLY {res}")
    for seq in (f"GLY {res} GLY", f"ACE {res} NME", *ends):
        _, pdb = build_pdb(seq)
        system = forcefield.createSystem(pdb.topology)
        assert system.getNumParticles() == bn.protein.protein_table(seq, hydrogens=True).n_atoms


def test_disulfide_pair_of_cyx(forcefield):
    p, _ = build_pdb("ACE CYX GLY GLY CYX NME")
    text = bn.protein.write_pdb(p, disulfides=[(1, 4)])  # CONECT: the S-S bond (the build does not close it)
    pdb = app.PDBFile(io.StringIO(text))
    sg = {a for a in pdb.topology.atoms() if a.name == "SG"}
    assert any({a, b} == sg for a, b in pdb.topology.bonds())
    forcefield.createSystem(pdb.topology)
    with pytest.raises(ValueError, match=r"disulfide \(0, 4\): residue 0 has no SG"):
        bn.protein.write_pdb(p, disulfides=[(0, 4)])
    assert not any(a.name == "HG" for a in pdb.topology.atoms())


@pytest.mark.parametrize("seq", [ALL20, "ACE " + " ".join(RESIDUES[20:]) + " PRO NME", "ACE ALA NME", "PGSK"])
def test_hydrogen_bonds_and_angles_at_amber_equilibrium(forcefield, seq):
    _, pdb = build_pdb(seq)
    bonds, angles = geometry_errors(forcefield.createSystem(pdb.topology), pdb)
    assert max(b for b, _ in bonds) < 0.02  # PDB's 3 decimals included
    ring = [a for a, hs in angles if hs & FIVE_RING_H]
    rest = sorted(((a, hs) for a, hs in angles if not hs & FIVE_RING_H), key=lambda x: x[0])
    assert rest[-1][0] < 3.0, rest[-1]
    assert not ring or max(ring) < 7.0


def test_energy_of_an_extended_peptide(forcefield):
    _, pdb = build_pdb(ALL20, phi=-2.4, psi=2.4)
    system = forcefield.createSystem(pdb.topology)
    for k, force in enumerate(system.getForces()):
        force.setForceGroup(k)
    context = mm.Context(system, mm.VerletIntegrator(1.0), mm.Platform.getPlatformByName("Reference"))
    context.setPositions(pdb.positions)
    total = context.getState(getEnergy=True).getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)
    assert math.isfinite(total)
    terms = {}
    for k, force in enumerate(system.getForces()):
        state = context.getState(getEnergy=True, groups={k})
        terms[type(force).__name__] = state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)
    n_atoms = system.getNumParticles()
    # ideal Engh & Huber heavy atoms and Amber hydrogens: bond and angle strain per atom stay small
    assert terms["HarmonicBondForce"] / n_atoms < 1.0, terms
    assert terms["HarmonicAngleForce"] / n_atoms < 2.0, terms


def test_alanine_dipeptide_is_openmms(forcefield):
    p, pdb = build_pdb("ACE ALA NME")
    atoms = list(pdb.topology.atoms())
    assert len(atoms) == 22
    got = {frozenset(((a.residue.name, a.name), (b.residue.name, b.name))) for a, b in pdb.topology.bonds()}
    expected = [
        ("ACE", "CH3", "ACE", "H1"), ("ACE", "CH3", "ACE", "H2"), ("ACE", "CH3", "ACE", "H3"),
        ("ACE", "CH3", "ACE", "C"), ("ACE", "C", "ACE", "O"), ("ACE", "C", "ALA", "N"),
        ("ALA", "N", "ALA", "H"), ("ALA", "N", "ALA", "CA"), ("ALA", "CA", "ALA", "HA"),
        ("ALA", "CA", "ALA", "CB"), ("ALA", "CB", "ALA", "HB1"), ("ALA", "CB", "ALA", "HB2"),
        ("ALA", "CB", "ALA", "HB3"), ("ALA", "CA", "ALA", "C"), ("ALA", "C", "ALA", "O"),
        ("ALA", "C", "NME", "N"), ("NME", "N", "NME", "H"), ("NME", "N", "NME", "C"),
        ("NME", "C", "NME", "H1"), ("NME", "C", "NME", "H2"), ("NME", "C", "NME", "H3"),
    ]  # fmt: skip
    assert got == {frozenset(((a, b), (c, d))) for a, b, c, d in expected}
    # every hydrogen of the table hangs on its bonded heavy atom
    t = bn.protein.protein_table("ACE ALA NME", hydrogens=True)
    label = [(t.residues[r], n) for r, n in zip(t.residue_index.tolist(), t.atom_names)]
    for k, e in enumerate(t.elements):
        if e == "H":
            assert frozenset((label[k], label[int(t.table.refs[k, 0])])) in got
    forcefield.createSystem(pdb.topology)


def test_dipeptide_batch_energies_from_phi_psi(forcefield):
    g = torch.Generator().manual_seed(0)
    phi = torch.empty(4, 3, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g)
    psi = torch.empty(4, 3, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g)
    p = bn.protein.build("ACE ALA NME", phi, psi, hydrogens=True)
    pdb = app.PDBFile(io.StringIO(bn.protein.write_pdb(p)))
    system = forcefield.createSystem(pdb.topology)
    context = mm.Context(system, mm.VerletIntegrator(1.0), mm.Platform.getPlatformByName("Reference"))
    energies = []
    for x in p.xyz:
        context.setPositions(x.numpy() * 0.1)
        energies.append(
            context.getState(getEnergy=True).getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)
        )
    assert all(math.isfinite(e) for e in energies) and len(set(energies)) == 4


def test_inverse_of_modeller_add_hydrogens(forcefield):
    seq = "MKTAYWDGHPLEVSNRCFQI"
    n = len(seq)
    g = torch.Generator().manual_seed(3)
    phi = -1.2 + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    psi = 2.2 + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    heavy = bn.protein.build(seq, phi, psi)
    pdb = app.PDBFile(io.StringIO(bn.protein.write_pdb(heavy)))
    modeller = app.Modeller(pdb.topology, pdb.positions)
    modeller.addHydrogens(forcefield)
    atoms = list(modeller.topology.atoms())
    names = {(a.residue.index, a.name) for a in atoms}
    # the histidine state OpenMM chose
    his = ["HIP" if {(8, "HD1"), (8, "HE2")} <= names else "HID" if (8, "HD1") in names else "HIE"]
    variant = [bn.protein.ONE_TO_THREE[c] for c in seq]
    variant[8] = his[0]
    t = bn.protein.protein_table(variant, hydrogens=True)
    perm = t.order_from([a.residue.index for a in atoms], [a.name for a in atoms])
    xyz = torch.tensor(modeller.getPositions().value_in_unit(unit.angstrom), dtype=torch.float64)[perm]
    tors = bn.protein.torsions(xyz, variant, hydrogens=True)
    # through a PDB file's 3 decimals
    torch.testing.assert_close(tors.phi[1:], phi[1:], atol=5e-3, rtol=0)
    torch.testing.assert_close(tors.psi[:-1], psi[:-1], atol=5e-3, rtol=0)
    # the all-atom structure comes back from its internal coordinates
    ic = bn.protein.internal_coordinates(xyz, variant, hydrogens=True)
    again = bn.protein.build(variant, *tors, geometry=ic, hydrogens=True).xyz
    d = torch.cdist(again, again) - torch.cdist(xyz, xyz)
    assert d.abs().max() < 1e-5  # cdist rounding


def test_topology_units_and_quantity(tmp_path):
    _, pdb = build_pdb("GSKW")
    plain = bn.protein.table_from_topology(pdb.topology, xyz=pdb.getPositions(asNumpy=True))
    angstrom = pdb.getPositions(asNumpy=True).value_in_unit(unit.angstrom)
    same = bn.protein.table_from_topology(pdb.topology, xyz=np.asarray(angstrom))
    assert plain.table == same.table
    listed = bn.protein.table_from_topology(pdb.topology, xyz=pdb.positions)  # a Quantity of a list of Vec3
    assert listed.table == same.table
    with pytest.raises(ValueError, match="xyz looks like nanometres"):
        bn.protein.table_from_topology(pdb.topology, xyz=np.asarray(angstrom) / 10.0)
    # an OpenMM topology with hydrogens: each hydrogen hangs on its bonded heavy atom
    bonded = {frozenset((a.index, b.index)) for a, b in pdb.topology.bonds()}
    refs = plain.table.refs
    for k, e in enumerate(plain.elements):
        if e == "H":
            assert frozenset((k, int(refs[k, 0]))) in bonded and plain.elements[int(refs[k, 0])] != "H"
    assert (plain.torsion_rows[1:, 0] >= 0).all() and plain.torsion_rows[2, 3] >= 0  # phi, Lys chi1


def test_all_atom_pdb_loads_in_mdtraj_and_biopython(tmp_path):
    md = pytest.importorskip("mdtraj", reason="mdtraj is an optional dependency")
    PDB = pytest.importorskip("Bio.PDB", reason="biopython is an optional dependency")
    p, _ = build_pdb("ACE ALA NME")
    path = tmp_path / "dip.pdb"
    bn.protein.write_pdb(p, path)
    traj = md.load(str(path))
    assert traj.n_atoms == 22 and sum(a.element.symbol == "H" for a in traj.topology.atoms) == 12
    np.testing.assert_allclose(traj.xyz[0] * 10.0, p.xyz.numpy(), atol=2e-3)
    structure = PDB.PDBParser(QUIET=True).get_structure("dip", str(path))
    assert len(list(structure.get_atoms())) == 22
