"""Side chains onto a given backbone (`bn.protein.place_side_chains`, "packer mode").

Oracles: full proteins built by `bn.protein.build` (their side chains must come back to
1e-9 A from their own backbone and chi, the backbone bitwise), per-protein calls for a
mixed batch, `torsions` for the inverse, and a real structure (MDAnalysisTests'
adenylate kinase, optional).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf.protein import build, place_side_chains, torsions, torsions_batch

ALL20 = "ACDEFGHIKLMNPQRSTVWY"


def _protein(sequence, batch=(), hydrogens=False, seed=0, psi_last=None):
    """A protein of random torsions (float64) and its (..., L, 4, 3) N, CA, C, O and chi."""
    g = torch.Generator().manual_seed(seed)
    n = len(bn.protein.protein_table(sequence).residues)
    phi, psi = (torch.rand(*batch, n, generator=g, dtype=torch.float64) * 6 - 3 for _ in range(2))
    if psi_last is not None:
        psi[..., -1] = psi_last
    omega = math.pi + torch.randn(*batch, n, generator=g, dtype=torch.float64) * 0.1
    chi = torch.rand(*batch, n, 4, generator=g, dtype=torch.float64) * 6 - 3
    p = build(sequence, phi, psi, omega, chi, hydrogens=hydrogens)
    return p, _backbone(p, n), chi


def _backbone(p, n):
    names = np.array(p.atom_names)
    index = [
        [int(np.flatnonzero((p.residue_index.numpy() == r) & (names == a))[0]) for a in ("N", "CA", "C", "O")]
        for r in range(n)
    ]
    return p.xyz[..., torch.tensor(index), :]


@pytest.mark.parametrize("hydrogens", [False, True])
def test_side_chains_of_a_built_protein_come_back(hydrogens):
    p, backbone, chi = _protein(ALL20, (2,), hydrogens=hydrogens)
    q = place_side_chains(ALL20, backbone, chi, hydrogens=hydrogens)
    assert q.atom_names == p.atom_names and q.xyz.shape == p.xyz.shape
    assert (q.xyz - p.xyz).abs().max() < 1e-9
    names = np.array(p.atom_names)
    given = torch.from_numpy(np.isin(names, ["N", "CA", "C", "O"]))
    assert torch.equal(q.xyz[:, given], p.xyz[:, given])  # copied, not rebuilt


def test_without_o_the_carbonyls_lie_in_the_peptide_plane():
    p, backbone, chi = _protein("MKWP", psi_last=math.pi)  # OXT trans to N, as documented
    q = place_side_chains("MKWP", backbone[:, :3], chi)
    assert (q.xyz - p.xyz).abs().max() < 1e-9


def test_mixed_batch_equals_single_calls_and_ignores_padding():
    sequences = ["GW", "ACDEF", "RKP"]
    single = [_protein(s, seed=k) for k, s in enumerate(sequences)]
    backbone = torch.full((3, 7, 4, 3), float("nan"), dtype=torch.float64)  # L_pad 7 > L_max 5
    chi = torch.full((3, 7, 4), float("nan"), dtype=torch.float64)
    for k, (_, bb, c) in enumerate(single):
        backbone[k, : len(bb)] = bb
        chi[k, : len(bb)] = torch.where(bn.protein.protein_table(sequences[k]).chi_mask, c, float("nan"))
    backbone.requires_grad_(True)
    chi.requires_grad_(True)
    q = place_side_chains(sequences, backbone, chi)
    sizes = [p.xyz.shape[0] for p, _, _ in single]
    assert q.xyz.shape == (3, max(sizes), 3) and q.mask.sum(1).tolist() == sizes
    assert not q.xyz.isnan().any()
    for k, (p, _, _) in enumerate(single):
        n = p.xyz.shape[0]
        assert (q.xyz[k, :n] - p.xyz).abs().max() < 1e-9 and q.atom_names[k] == p.atom_names
    gb, gc = torch.autograd.grad(q.xyz.sum(), (backbone, chi))
    assert not gb.isnan().any() and not gc.isnan().any()
    assert gb[:, 5:].eq(0).all() and gc[:, 5:].eq(0).all()  # padding: no gradient
    assert gc[0, 0].eq(0).all()  # glycine has no chi


def test_chi_read_back_and_degrees():
    _, backbone, _ = _protein("FKRW")
    chi = torch.tensor(
        [[10.0, 20.0, 0, 0], [30.0, 40.0, 50.0, 60.0], [-70.0, 80.0, 90.0, 100.0], [110.0, -120.0, 0, 0]]
    )
    q = place_side_chains("FKRW", backbone, chi.double(), degrees=True)
    mask = bn.protein.protein_table("FKRW").chi_mask
    back = torsions(q.xyz, "FKRW", degrees=True).chi
    assert torch.allclose(back[mask], chi.double()[mask], atol=1e-9)
    batch = place_side_chains(
        ["FKRW", "G"], torch.stack([backbone, backbone]), chi.double().expand(2, 4, 4), degrees=True
    )
    back = torsions_batch(batch.xyz, ["FKRW", "G"], degrees=True).chi
    assert torch.allclose(back[0][mask], chi.double()[mask], atol=1e-9)


def test_default_chi_is_the_builders_rotamer():
    p = build("FKL", torch.full((3,), -1.0, dtype=torch.float64), torch.full((3,), 2.0, dtype=torch.float64))
    q = place_side_chains("FKL", _backbone(p, 3))
    assert (q.xyz - p.xyz).abs().max() < 1e-9


def test_float32_and_broadcasting():
    p, backbone, chi = _protein("YEH", (3,))
    q = place_side_chains("YEH", backbone.float(), chi[0].float())  # chi broadcast over the batch
    ref = place_side_chains("YEH", backbone, chi[0].expand(3, 3, 4))
    assert q.xyz.dtype == torch.float32 and (q.xyz.double() - ref.xyz).abs().max() < 1e-4


def test_gradcheck_and_gradgradcheck_in_chi_and_backbone():
    _, backbone, chi = _protein("FS", seed=3)
    backbone.requires_grad_(True)
    chi.requires_grad_(True)

    def f(bb, c):
        return place_side_chains("FS", bb, c).xyz

    assert torch.autograd.gradcheck(f, (backbone, chi))
    assert torch.autograd.gradgradcheck(f, (backbone, chi))


def test_torch_func():
    _, backbone, chi = _protein("KW", (2,), seed=4)
    jac = torch.func.vmap(torch.func.jacrev(lambda c, bb: place_side_chains("KW", bb, c).xyz))(chi, backbone)
    assert jac.shape == (2, 24, 3, 2, 4)
    eps = 1e-6
    step = torch.zeros_like(chi[0])
    step[1, 2] = eps
    fd = (
        place_side_chains("KW", backbone[0], chi[0] + step).xyz
        - place_side_chains("KW", backbone[0], chi[0] - step).xyz
    ) / (2 * eps)
    assert torch.allclose(jac[0, :, :, 1, 2], fd, atol=1e-6)


def test_nan_in_nan_out():
    _, backbone, chi = _protein("FA")
    chi[0, 0] = float("nan")
    q = place_side_chains("FA", backbone, chi)
    names = q.atom_names
    ring = [k for k, n in enumerate(names) if q.residue_index[k] == 0 and n in ("CG", "CD1", "CZ")]
    assert q.xyz[ring].isnan().all() and not q.xyz[q.residue_index == 1].isnan().any()


def test_bad_input():
    _, backbone, chi = _protein("FA")
    with pytest.raises(ValueError, match=r"backbone must be \(\.\.\., L, 3 or 4, 3\).*got shape \(2, 2, 3\)"):
        place_side_chains("FA", backbone[:, :2], chi)
    with pytest.raises(ValueError, match=r"does not fit 2 residues"):
        place_side_chains("FA", backbone[:1], chi)
    with pytest.raises(ValueError, match=r"does not fit B = 2 sequences of up to 3 residues"):
        place_side_chains(["FA", "GGG"], backbone.expand(2, 2, 4, 3), None)
    with pytest.raises(ValueError, match=r"chi must be \(\.\.\., L, 4\) = \(\.\.\., 2, 4\), got \(2, 3\)"):
        place_side_chains("FA", backbone, chi[:, :3])
    with pytest.raises(ValueError, match=r"protein 0, residue 0 is the cap ACE"):
        place_side_chains("ACE ALA NME", torch.zeros(3, 4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"backbone and chi do not broadcast"):
        place_side_chains("FA", backbone.expand(3, 2, 4, 3), chi.expand(2, 2, 4))
    with pytest.raises(TypeError, match="backbone"):
        place_side_chains("FA", backbone.long(), chi)
    with pytest.raises(ValueError, match="non-empty list"):
        place_side_chains([], backbone, chi)
    with pytest.raises(ValueError, match="residue"):
        place_side_chains("FAZ", backbone, chi)


def _adk():
    """Heavy atoms of adenylate kinase (MDAnalysisTests) in the table's order: (sequence, (N, 3) float64)."""
    mda = pytest.importorskip("MDAnalysis", reason="MDAnalysis is an optional test dependency")
    data = pytest.importorskip(
        "MDAnalysisTests.datafiles", reason="MDAnalysisTests is an optional test dependency"
    )
    atoms = mda.Universe(data.PDB).select_atoms("protein and not name H*")
    sequence = " ".join(r.resname for r in atoms.residues)
    table = bn.protein.protein_table(sequence)
    first = atoms.residues[0].resindex
    perm = table.order_from([a.resindex - first for a in atoms], [a.name for a in atoms])
    return table, torch.from_numpy(atoms.positions.astype(np.float64))[perm]


def test_real_structure():
    """Chi measured on a real structure rebuild its side chains on its own backbone: the chi read back are
    the measured ones; the atoms differ from the real ones only by the ideal bond lengths and angles."""
    table, xyz = _adk()
    n = table.n_residues
    measured = torsions(xyz, table.sequence)
    p = bn.protein.Protein(xyz, table.atom_names, table.residue_index, table.elements, table.sequence, None)
    backbone = _backbone(p, n)
    q = place_side_chains(table.sequence, backbone, measured.chi)
    mask = table.chi_mask
    back = torsions(q.xyz, table.sequence).chi
    err = (back - measured.chi).remainder(2 * math.pi)
    err = torch.minimum(err, 2 * math.pi - err)
    assert err[mask].max() < 1e-6
    side = ~torch.from_numpy(np.isin(np.array(table.atom_names), ["N", "CA", "C", "O", "OXT"]))
    per_residue = torch.zeros(n, dtype=torch.float64).index_add_(
        0, table.residue_index[side], (q.xyz[side] - xyz[side]).square().sum(-1)
    )
    count = torch.zeros(n).index_add_(0, table.residue_index[side], torch.ones(int(side.sum())))
    # the file wraps a few residues across its periodic box (y ~ 0 and ~ 79 A in one residue):
    # those are left out, found by an atom more than 10 A from its residue's CA (a side chain
    # spans 8 A at most) or from the next residue's N
    ca = xyz[[table.atom(r, "CA") for r in range(n)]]
    n_next = xyz[[table.atom(min(r + 1, n - 1), "N") for r in range(n)]]
    far = torch.maximum(
        (xyz - ca[table.residue_index]).norm(dim=-1), (xyz - n_next[table.residue_index]).norm(dim=-1) - 3
    )
    broken = torch.zeros(n, dtype=torch.float64).index_add_(0, table.residue_index, (far > 10.0).double()) > 0
    assert 0 < int(broken.sum()) < 20
    # and a residue or two of the file is a D-amino acid (CB on the other side of N, CA, C)
    with_cb = [r for r in range(n) if table.residues[r] != "GLY"]

    def handedness(x):
        at = {a: x[[table.atom(r, a) for r in with_cb]] for a in ("N", "CA", "C", "CB")}
        normal = torch.linalg.cross(at["N"] - at["CA"], at["C"] - at["CA"], dim=-1)
        return (normal * (at["CB"] - at["CA"])).sum(-1).sign()

    flipped = torch.tensor(with_cb)[handedness(xyz) != handedness(q.xyz)]
    assert len(flipped) < 10  # 32 (Asp 33) and residues the box wraps
    broken[flipped] = True
    keep = (count > 0) & ~broken
    rmsd = (per_residue[keep] / count[keep]).sqrt()
    assert rmsd.max() < 1.0, float(
        rmsd.max()
    )  # measured 0.96 A at most: ideal angles compound along a side chain
    assert torch.equal(q.xyz[~side][: 4 * n], xyz[~side][: 4 * n])
