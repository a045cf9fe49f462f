"""batched_nerf.protein with hydrogens: names, variants, caps, rotors, gradients, topologies."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import batched_nerf as bn

ALL20 = "ARNDCQEGHILKMFPSTWYV"
VARIANTS = "HID HIE HIP ASH GLH LYN"
#: alanine dipeptide (OpenMM's / the literature's): 22 atoms, 21 bonds
DIPEPTIDE = {
    "ACE": {"H1", "CH3", "H2", "H3", "C", "O"},
    "ALA": {"N", "H", "CA", "HA", "CB", "HB1", "HB2", "HB3", "C", "O"},
    "NME": {"N", "H", "C", "H1", "H2", "H3"},
}


def torsions_for(seq: str, batch=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    n = bn.protein.protein_table(seq).n_residues
    phi = torch.empty(*batch, n, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g)
    psi = torch.empty(*batch, n, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g)
    return phi, psi


def heavy_part(seq: str) -> torch.Tensor:
    t = bn.protein.protein_table(seq, hydrogens=True)
    return torch.tensor([k for k, e in enumerate(t.elements) if e != "H"])


@pytest.mark.parametrize("seq", [ALL20, "ACE ALA NME", "PRO " + VARIANTS + " CYX NME", "G"])
def test_heavy_atoms_unchanged_by_hydrogens(seq):
    phi, psi = torsions_for(seq, (2,))
    heavy = bn.protein.build(seq, phi, psi)
    full = bn.protein.build(seq, phi, psi, hydrogens=True)
    keep = heavy_part(seq)
    assert tuple(full.atom_names[k] for k in keep.tolist()) == heavy.atom_names
    torch.testing.assert_close(full.xyz[:, keep], heavy.xyz, atol=1e-12, rtol=0)
    # the heavy-atom table is the one of the default (no hydrogens)
    assert bn.protein.protein_table(seq) is bn.protein.protein_table(seq, hydrogens=False)


def test_alanine_dipeptide_atoms_and_names():
    t = bn.protein.protein_table("ACE ALA NME", hydrogens=True)
    assert t.n_atoms == 22 and t.residues == ("ACE", "ALA", "NME")
    for r, names in DIPEPTIDE.items():
        i = t.residues.index(r)
        assert {n for k, n in enumerate(t.atom_names) if t.residue_index[k] == i} == names
    # phi, psi of ALA and the two omegas are single rows
    assert t.atom_names[t.row("phi", 1)] == "C" and t.atom_names[t.row("psi", 1)] == "N"
    assert t.atom_names[t.row("omega", 0)] == "CA" and t.atom_names[t.row("omega", 1)] == "C"
    assert bn.protein.parse_sequence(["ace", "ala", "nme"]) == "ACE ALA NME"


def test_termini_variants_and_names():
    t = bn.protein.protein_table("GAPS", hydrogens=True)
    names0 = {t.atom_names[k] for k in range(t.n_atoms) if t.residue_index[k] == 0}
    assert {"H1", "H2", "H3", "HA2", "HA3"} <= names0 and "H" not in names0
    assert t.atom_names.count("OXT") == 1 and t.residue_index[t.atom(3, "OXT")] == 3
    assert "H" not in {t.atom_names[k] for k in range(t.n_atoms) if t.residue_index[k] == 2}  # Pro
    npro = bn.protein.protein_table("PG", hydrogens=True)
    assert {npro.atom_names[k] for k in range(5)} >= {"N", "CA"} and "H1" not in npro.atom_names
    assert npro.atom(0, "H2") >= 0 and npro.atom(0, "H3") >= 0

    def names(seq, i=1):
        tt = bn.protein.protein_table(seq, hydrogens=True)
        return {tt.atom_names[k] for k in range(tt.n_atoms) if tt.residue_index[k] == i}

    assert names("GHG") == names("GLY HIE GLY") and "HE2" in names("GHG") and "HD1" not in names("GHG")
    assert {"HD1", "HE2"} <= names("GLY HIP GLY") and "HE2" not in names("GLY HID GLY")
    assert "HG" in names("GCG") and "HG" not in names("GLY CYX GLY")
    assert "HD2" in names("GLY ASH GLY") and "HE2" in names("GLY GLH GLY")
    assert {"HZ1", "HZ2", "HZ3"} <= names("GKG") and "HZ1" not in names("GLY LYN GLY")
    # with caps: no H1-H3 on ALA's N, no OXT
    dip = bn.protein.protein_table("ACE ALA NME")
    assert "OXT" not in dip.atom_names and dip.n_atoms == 10
    with pytest.raises(ValueError, match="cap ACE at position 1: it must be the first"):
        bn.protein.protein_table("ALA ACE")
    with pytest.raises(ValueError, match="cap NME at position 0"):
        bn.protein.protein_table(["NME"])
    with pytest.raises(ValueError, match="unknown residue name 'XYZ' at position 1"):
        bn.protein.protein_table("ALA XYZ")


def test_rotors_are_single_rows_with_staggered_defaults():
    seq = "ACE ALA SER NME"
    t = bn.protein.protein_table(seq, hydrogens=True)
    assert [n for _, n in t.rotor_names] == ["H1", "HB1", "HG", "H1"]
    phi, psi = torsions_for(seq)
    p = bn.protein.build(seq, phi, psi, hydrogens=True)
    ic = bn.protein.internal_coordinates(p.xyz, seq, hydrogens=True, degrees=True)
    torch.testing.assert_close(ic.dihedrals[t.rotor_rows].abs(), torch.full((4,), 180.0, dtype=torch.float64))
    # turning one rotor moves only its own hydrogens
    rotors = torch.full((4,), 3.0, dtype=torch.float64)
    p = bn.protein.build(seq, phi, psi, hydrogens=True, rotors=rotors)
    rotors[1] = 1.0
    q = bn.protein.build(seq, phi, psi, hydrogens=True, rotors=rotors)
    moved = ((q.xyz - p.xyz).norm(dim=-1) > 1e-9).nonzero().flatten().tolist()
    assert sorted(t.atom_names[k] for k in moved) == ["HB1", "HB2", "HB3"]
    back = bn.protein.internal_coordinates(q.xyz, seq, hydrogens=True).dihedrals[t.rotor_rows]
    torch.testing.assert_close(back, rotors)
    tors = bn.protein.torsions(q.xyz, seq, hydrogens=True)
    torch.testing.assert_close(tors.phi[1:3], phi[1:3])
    with pytest.raises(ValueError, match=r"rotors must have shape \(\.\.\., K\) with K = 4"):
        bn.protein.build(seq, phi, psi, hydrogens=True, rotors=torch.zeros(3))


def test_all_atom_gradcheck_and_gradgradcheck():
    seq = "ACE ALA NME"
    phi, psi = (x.requires_grad_() for x in torsions_for(seq))
    rotors = torch.full((3,), 3.0, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, r: bn.protein.build(seq, a, b, hydrogens=True, rotors=r).xyz, (phi, psi, rotors)
    )
    assert torch.autograd.gradgradcheck(
        lambda a, b: bn.protein.build(seq, a, b, hydrogens=True).xyz, (phi, psi)
    )


def test_mixed_batch_with_hydrogens_matches_single_builds():
    seqs = ["ACE ALA NME", "GSK"]
    phi, psi = torsions_for("GGG", (len(seqs),))
    batch = bn.protein.build_batch(seqs, phi, psi, hydrogens=True)
    for k, s in enumerate(seqs):
        single = bn.protein.build(s, phi[k], psi[k], hydrogens=True)
        n = single.xyz.shape[-2]
        torch.testing.assert_close(batch.xyz[k, :n], single.xyz)
        assert batch.atom_names[k] == single.atom_names


def test_numpy_float64_torsions_stay_float64():
    phi, psi = np.full(3, -1.0), np.full(3, 2.0)
    assert bn.protein.build("ACD", phi, psi).xyz.dtype == torch.float64
    assert bn.protein.build("ACD", phi.astype(np.float32), psi.astype(np.float32)).xyz.dtype == torch.float32
    assert bn.protein.build("ACD", [-1.0] * 3, [2.0] * 3).xyz.dtype == torch.get_default_dtype()


def test_pdb_names_columns():
    p = bn.protein.build("LYS HID NME", *torsions_for("KHG"), hydrogens=True)
    lines = [ln for ln in bn.protein.write_pdb(p).splitlines() if ln.startswith("ATOM")]
    assert len(lines) == p.xyz.shape[0]
    by_name = {ln[12:16]: ln for ln in lines}
    assert " HZ1" in by_name and "HD1 " not in by_name and " HD1" in by_name
    assert by_name[" HD1"][17:20] == "HIS"  # variants under their PDB residue name
    assert all(ln[76:78].strip() == ln[12:16].strip()[0] for ln in lines)


# ------------------------------------------------------------------ two chains, units


def _helix_pair_pdb(hydrogens: bool = False, seed: int = 0) -> str:
    g = torch.Generator().manual_seed(seed)
    lines = []
    for k, s in enumerate(("MKTAYWDGHPLEVSNR", "GSHWKLMNPQRSTVAY")):
        phi = -57.0 + 20 * torch.randn(len(s), generator=g, dtype=torch.float64)
        psi = -47.0 + 20 * torch.randn(len(s), generator=g, dtype=torch.float64)
        p = bn.protein.build(s, phi, psi, degrees=True, hydrogens=hydrogens)
        x = p.xyz - p.xyz.mean(0) + torch.tensor([10.0 * k, 0.0, 0.0], dtype=torch.float64)
        if k:
            x = x * torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64)
        text = bn.protein.write_pdb(p._replace(xyz=x), chain="AB"[k])
        lines += [ln for ln in text.splitlines() if ln.startswith(("ATOM", "TER"))]
    return "\n".join(lines) + "\nEND\n"


def test_two_chains_give_no_reference_cycle(tmp_path):
    md = pytest.importorskip("mdtraj", reason="mdtraj is an optional dependency (batched-nerf[protein])")
    for seed in range(3):  # on main each raised "reference cycle"
        path = tmp_path / f"two{seed}.pdb"
        path.write_text(_helix_pair_pdb(seed=seed))
        top = bn.protein.table_from_topology(path)
        traj = md.load(str(path))
        xyz = torch.tensor(traj.xyz[0] * 10.0, dtype=torch.float64)
        ic, pose = bn.to_internal(xyz, top.table, return_pose=True)
        back = bn.to_cartesian(*ic, top.table, rotation=pose.rotation, translation=pose.translation)
        np.testing.assert_allclose(back.numpy(), xyz.numpy(), atol=1e-6)
        assert int((top.torsion_rows[:, :3] >= 0).sum()) > 70  # most backbone torsions of 2 x 16 residues
    with pytest.raises(ValueError, match="xyz looks like nanometres"):
        bn.protein.table_from_topology(traj.topology, xyz=traj.xyz[0])


def test_topology_with_hydrogens_rows(tmp_path):
    md = pytest.importorskip("mdtraj", reason="mdtraj is an optional dependency (batched-nerf[protein])")
    path = tmp_path / "h.pdb"
    path.write_text(_helix_pair_pdb(hydrogens=True))
    traj = md.load(str(path))
    top = bn.protein.table_from_topology(path)
    refs = top.table.refs
    bonded = {frozenset((a.index, b.index)) for a, b in traj.topology.bonds}
    for k, e in enumerate(top.elements):
        if e == "H":  # a hydrogen hangs on its heavy atom
            assert frozenset((k, int(refs[k, 0]))) in bonded and top.elements[int(refs[k, 0])] != "H"
    xyz = torch.tensor(traj.xyz[0] * 10.0, dtype=torch.float64)
    dihedrals = bn.to_internal(xyz, top.table).dihedrals
    _, chi1 = md.compute_chi1(traj)
    idx, _ = md.compute_chi1(traj)
    hits = 0
    for quad, value in zip(idx, chi1[0]):
        row = int(top.torsion_rows[traj.topology.atom(int(quad[1])).residue.index, 3])
        if row >= 0:
            hits += 1
            assert abs((float(dihedrals[row]) - value + math.pi) % (2 * math.pi) - math.pi) < 1e-5
    assert hits >= len(idx) - 4


def test_hydrogen_chirality_and_planarity():
    seq = "GAFW"
    p = bn.protein.build(seq, *torsions_for(seq, (3,)), hydrogens=True)
    t = bn.protein.protein_table(seq, hydrogens=True)

    def volume(i, centre, a, b, c):
        x0 = p.xyz[..., t.atom(i, centre), :]
        return torch.linalg.det(torch.stack([p.xyz[..., t.atom(i, n), :] - x0 for n in (a, b, c)], -2))

    # HA sits opposite CB (L): (N - CA) . ((C - CA) x (X - CA)) is positive for CB, negative for HA
    assert (volume(1, "CA", "N", "C", "CB") > 0).all() and (volume(1, "CA", "N", "C", "HA") < 0).all()
    # glycine's HA2 takes HA's place, HA3 CB's (as in wwPDB entries: tests/test_protein_names.py)
    assert (volume(0, "CA", "N", "C", "HA2") < 0).all() and (volume(0, "CA", "N", "C", "HA3") > 0).all()
    # aromatic hydrogens lie in their ring's plane
    for i, ring in ((2, ("CG", "CD1", "CE1", "HD1", "HE1", "HZ")), (3, ("CD2", "CE3", "CZ3", "HE3", "HZ3"))):
        pts = p.xyz[..., [t.atom(i, n) for n in ring], :]
        centred = pts - pts.mean(-2, keepdim=True)
        assert torch.linalg.svdvals(centred)[..., -1].max() < 1e-6
    # backbone H in the peptide plane, trans to O: dihedral H-N-C-O is 180 deg
    x = p.xyz
    h, n, c, o = (x[..., t.atom(i, name), :] for i, name in ((1, "H"), (1, "N"), (0, "C"), (0, "O")))
    b1 = c - n
    u, v = torch.linalg.cross(b1, h - n), torch.linalg.cross(b1, o - c)
    cos = (u * v).sum(-1) / (u.norm(dim=-1) * v.norm(dim=-1))
    torch.testing.assert_close(cos, torch.full_like(cos, -1.0))
