"""batched_nerf.protein against independent tools: PeptideBuilder, mdtraj and Biopython (optional)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import batched_nerf as bn

ALL20 = "ARNDCQEGHILKMFPSTWYV"


def wrap_deg(x):
    return (np.asarray(x) + 180.0) % 360.0 - 180.0


def kabsch_rmsd_max(mobile: np.ndarray, ref: np.ndarray) -> float:
    """Largest atom deviation after optimal superposition."""
    a, b = mobile - mobile.mean(0), ref - ref.mean(0)
    u, _, vt = np.linalg.svd(a.T @ b)
    d = np.sign(np.linalg.det(u @ vt))
    rot = u @ np.diag([1, 1, d]) @ vt
    return float(np.linalg.norm(a @ rot - b, axis=1).max())


@pytest.fixture(scope="module")
def peptide():
    """An all-20 peptide built by PeptideBuilder from given phi/psi (degrees): (structure, phi, psi)."""
    pb = pytest.importorskip("PeptideBuilder", reason="PeptideBuilder is an optional test dependency")
    from PeptideBuilder import Geometry

    rng = np.random.default_rng(7)
    phi = rng.uniform(-170, -50, len(ALL20))
    psi = rng.uniform(-70, 170, len(ALL20))
    geos = []
    for k, aa in enumerate(ALL20):
        geo = Geometry.geometry(aa)
        geo.phi, geo.psi_im1 = float(phi[k]), float(psi[k - 1]) if k else 0.0
        geos.append(geo)
    structure = pb.initialize_res(geos[0])
    for geo in geos[1:]:
        pb.add_residue(structure, geo)
    pb.add_terminal_OXT(structure)
    return structure, phi, psi


def _coords(structure):
    res, names, xyz = [], [], []
    for i, residue in enumerate(structure.get_residues()):
        for atom in residue:
            res.append(i)
            names.append(atom.get_id())
            xyz.append(atom.get_coord())
    t = bn.protein.protein_table(ALL20)
    return torch.tensor(np.array(xyz), dtype=torch.float64)[t.order_from(res, names)]


def test_peptidebuilder_torsions_read_back(peptide):
    structure, phi, psi = peptide
    tor = bn.protein.torsions(_coords(structure), ALL20, degrees=True)
    np.testing.assert_allclose(wrap_deg(tor.phi.numpy()[1:] - phi[1:]), 0, atol=1e-3)
    np.testing.assert_allclose(wrap_deg(tor.psi.numpy()[:-1] - psi[:-1]), 0, atol=1e-3)


def test_peptidebuilder_rebuilt_to_1e_3_angstrom(peptide):
    structure, _, _ = peptide
    xyz = _coords(structure)
    tor = bn.protein.torsions(xyz, ALL20)
    geometry = bn.protein.internal_coordinates(xyz, ALL20)
    rebuilt = bn.protein.build(ALL20, *tor, geometry=geometry).xyz
    assert kabsch_rmsd_max(rebuilt.numpy(), xyz.numpy()) < 1e-3
    # float32 in, float32 out, still within 1e-3 A
    rebuilt32 = bn.protein.build(ALL20, *(t.float() for t in tor), geometry=[g.float() for g in geometry]).xyz
    assert kabsch_rmsd_max(rebuilt32.double().numpy(), xyz.numpy()) < 1e-3


def _mdtraj_torsions(traj):
    md = pytest.importorskip("mdtraj")
    out = {}
    for name in ("phi", "psi", "omega", "chi1", "chi2", "chi3", "chi4"):
        idx, values = getattr(md, f"compute_{name}")(traj)
        residues = [traj.topology.atom(int(row[1])).residue.index for row in idx]
        out[name] = (residues, np.degrees(values))
    return out


def _compare_with_mdtraj(traj, tor):
    ours = {"phi": tor.phi, "psi": tor.psi, "omega": tor.omega}
    ours.update({f"chi{k + 1}": tor.chi[..., k] for k in range(4)})
    checked = 0
    for name, (residues, values) in _mdtraj_torsions(traj).items():
        mine = ours[name].numpy()[..., residues].reshape(values.shape)
        np.testing.assert_allclose(wrap_deg(mine - values), 0, atol=1e-2, err_msg=name)
        checked += values.shape[-1]
    return checked


def test_torsions_agree_with_mdtraj(peptide, tmp_path):
    md = pytest.importorskip("mdtraj", reason="mdtraj is an optional test dependency")
    from Bio.PDB import PDBIO

    structure, _, _ = peptide
    io = PDBIO()
    io.set_structure(structure)
    path = tmp_path / "pb.pdb"
    io.save(str(path))
    traj = md.load(str(path))
    t = bn.protein.protein_table(ALL20)
    atoms = list(traj.topology.atoms)
    perm = t.order_from([a.residue.index for a in atoms], [a.name for a in atoms])
    xyz = torch.tensor(traj.xyz[0] * 10.0, dtype=torch.float64)[perm]
    tor = bn.protein.torsions(xyz, ALL20, degrees=True)
    # 19 phi + 19 psi + 19 omega + every chi1-chi4 mdtraj defines
    assert _compare_with_mdtraj(traj, tor) >= 57 + 17


def test_our_pdb_loads_in_mdtraj_with_our_torsions(tmp_path):
    md = pytest.importorskip("mdtraj", reason="mdtraj is an optional test dependency")
    g = torch.Generator().manual_seed(2)
    shape = (3, len(ALL20))
    phi, psi = (
        torch.empty(shape, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g) for _ in "ab"
    )
    chi = torch.empty(*shape, 4, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g)
    p = bn.protein.build(ALL20, phi, psi, chi=chi)
    path = tmp_path / "ours.pdb"
    bn.protein.write_pdb(p, path)
    traj = md.load(str(path))
    assert traj.n_frames == 3 and traj.n_atoms == p.xyz.shape[-2] and traj.n_residues == 20
    assert [a.name for a in traj.topology.atoms] == list(p.atom_names)
    assert [a.element.symbol for a in traj.topology.atoms] == list(p.elements)
    np.testing.assert_allclose(traj.xyz * 10.0, p.xyz.numpy(), atol=1e-3)
    tor = bn.protein.torsions(torch.tensor(traj.xyz * 10.0, dtype=torch.float64), ALL20, degrees=True)
    assert _compare_with_mdtraj(traj, tor) >= 57 + 17
    # and mdtraj agrees with the torsions we built from (rounding of the file: 1e-3 A)
    md_phi = np.degrees(md.compute_phi(traj)[1])
    np.testing.assert_allclose(wrap_deg(md_phi - np.degrees(phi[:, 1:].numpy())), 0, atol=0.5)


def test_our_pdb_loads_in_biopython(tmp_path):
    pytest.importorskip("Bio", reason="biopython is an optional test dependency")
    from Bio.PDB import PDBParser

    seqs = ["ACDEFGHIK", "LMNPQRSTVWY"]
    phi, psi = torch.full((2, 11), -1.0), torch.full((2, 11), -0.7)
    p = bn.protein.build_batch(seqs, phi, psi)
    path = tmp_path / "mixed.pdb"
    bn.protein.write_pdb(p, path)
    structure = PDBParser(QUIET=True).get_structure("x", str(path))
    models = list(structure)
    assert len(models) == 2
    for k, model in enumerate(models):
        atoms = list(model.get_atoms())
        n = int(p.mask[k].sum())
        assert len(atoms) == n and len(list(model.get_residues())) == len(seqs[k])
        np.testing.assert_allclose(np.array([a.get_coord() for a in atoms]), p.xyz[k, :n].numpy(), atol=1e-3)
