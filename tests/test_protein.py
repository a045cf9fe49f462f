"""batched_nerf.protein: heavy atoms from torsions, the inverse, mixed batches, PDB output."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import batched_nerf as bn
from tests.reference import reference_to_cartesian

ALL20 = "ARNDCQEGHILKMFPSTWYV"
#: Heavy atoms per residue (PDB), without OXT.
N_HEAVY = dict(zip(ALL20, [5, 11, 8, 8, 6, 9, 9, 4, 10, 8, 8, 9, 8, 11, 7, 6, 7, 14, 12, 7]))


def random_torsions(seq: str, batch: tuple[int, ...] = (), seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    n = len(seq)
    phi = torch.empty(*batch, n, dtype=dtype).uniform_(-math.pi, math.pi, generator=g)
    psi = torch.empty(*batch, n, dtype=dtype).uniform_(-math.pi, math.pi, generator=g)
    omega = math.pi + 0.1 * torch.randn(*batch, n, dtype=dtype, generator=g)
    chi = torch.empty(*batch, n, 4, dtype=dtype).uniform_(-math.pi, math.pi, generator=g)
    return phi, psi, omega, chi


def test_atoms_of_all_20_residues():
    t = bn.protein.protein_table(ALL20)
    assert t.n_atoms == sum(N_HEAVY.values()) + 1
    assert t.atom_names[-1] == "OXT" and t.residue_index[-1].item() == 19
    for i, aa in enumerate(ALL20):
        assert int((t.residue_index == i).sum()) == N_HEAVY[aa] + (i == 19)
    assert set(t.elements) == {"N", "C", "O", "S"}
    assert [t.atom_names[k] for k in range(4)] == ["N", "CA", "C", "O"]


def test_torsions_are_single_named_rows():
    t = bn.protein.protein_table("KR")
    refs = t.table.refs
    names = t.atom_names
    # psi(0) is the dihedral of N(1) about CA(0)-C(0) from N(0)
    row = t.row("psi", 0)
    assert names[row] == "N" and [names[r] for r in refs[row].tolist()] == ["C", "CA", "N"]
    assert [names[r] for r in refs[t.row("omega", 0)].tolist()] == ["N", "C", "CA"]
    assert names[t.row("chi4", 1)] == "CZ"
    # every torsion row is used by exactly one dihedral source
    rows = t.torsion_rows[t.torsion_rows >= 0]
    assert rows.unique().numel() == rows.numel()
    assert (t.source[rows] >= t.n_atoms).all() and (t.source != torch.arange(t.n_atoms)).sum() == rows.numel()


def test_build_matches_float64_oracle():
    seq = ALL20
    phi, psi, omega, chi = random_torsions(seq)
    p = bn.protein.build(seq, phi, psi, omega, chi)
    t = bn.protein.protein_table(seq)
    dihedrals = t.dihedrals.clone()
    for name, values in (("phi", phi), ("psi", psi), ("omega", omega)):
        for i in range(len(seq)):
            if t.torsion_rows[i, bn.protein.TORSION_NAMES.index(name)] >= 0:
                dihedrals[t.row(name, i)] = values[i]
    for i in range(len(seq)):
        for k in range(4):
            if t.chi_mask[i, k]:
                dihedrals[t.row(f"chi{k + 1}", i)] = chi[i, k]
    ref = reference_to_cartesian(t.table.refs.numpy(), t.bonds.numpy(), t.angles.numpy(), dihedrals.numpy())
    np.testing.assert_allclose(p.xyz.numpy(), ref, atol=1e-10)


def test_torsions_round_trip_and_ideal_geometry():
    seq = ALL20
    phi, psi, omega, chi = random_torsions(seq, (3,))
    p = bn.protein.build(seq, phi, psi, omega, chi)
    back = bn.protein.torsions(p.xyz, seq)
    t = bn.protein.protein_table(seq)

    def wrap(x):
        return torch.remainder(x + math.pi, 2 * math.pi) - math.pi

    assert wrap(back.phi[:, 1:] - phi[:, 1:]).abs().max() < 1e-9
    assert wrap(back.psi - psi).abs().max() < 1e-9
    assert wrap(back.omega[:, :-1] - omega[:, :-1]).abs().max() < 1e-9
    mask = t.chi_mask
    assert wrap(back.chi - chi)[:, mask].abs().max() < 1e-9
    assert (back.chi[:, ~mask] == 0).all() and (back.phi[:, 0] == 0).all() and (back.omega[:, -1] == 0).all()
    ic = bn.protein.internal_coordinates(p.xyz, seq)
    torch.testing.assert_close(ic.bonds[..., 1:], t.bonds[1:].expand(3, -1))
    torch.testing.assert_close(ic.angles[..., 2:], t.angles[2:].expand(3, -1))
    # peptide bond C(i)-N(i+1) has the template length
    c, n = t.atom(0, "C"), t.atom(1, "N")
    assert torch.allclose((p.xyz[:, c] - p.xyz[:, n]).norm(dim=-1), torch.tensor(1.329, dtype=torch.float64))


def test_defaults_trans_omega_and_rotamers():
    seq = "KFP"
    p = bn.protein.build(seq, torch.zeros(3), torch.zeros(3))
    back = bn.protein.torsions(p.xyz.double(), seq, degrees=True)

    def close(a, b):
        return ((a - torch.tensor(b, dtype=a.dtype) + 180) % 360 - 180).abs().max() < 1e-3

    assert close(back.omega[:2], [180.0, 180.0])
    assert close(back.chi[0], bn.protein.DEFAULT_CHI["LYS"])
    assert close(back.chi[2, :2], bn.protein.DEFAULT_CHI["PRO"])
    # the defaults are the same when the given torsions are in degrees
    in_degrees = bn.protein.build(seq, torch.zeros(3), torch.zeros(3), degrees=True)
    torch.testing.assert_close(in_degrees.xyz, p.xyz)


def _chiral_volume(xyz, t, i, centre, a, b, c):
    x0 = xyz[..., t.atom(i, centre), :]
    v = [xyz[..., t.atom(i, n), :] - x0 for n in (a, b, c)]
    return torch.linalg.det(torch.stack(v, -2))


def test_ca_chirality_is_l():
    seq = "".join(a for a in ALL20 if a != "G")
    phi, psi, omega, chi = random_torsions(seq, (4,))
    p = bn.protein.build(seq, phi, psi, omega, chi)
    t = bn.protein.protein_table(seq)
    # L-amino acids: looking from H onto CA, CO -> R -> N runs clockwise (the "CORN" rule);
    # equivalently the chiral volume (N - CA) . ((C - CA) x (CB - CA)) is positive (about +2.5 A^3).
    for i in range(len(seq)):
        vol = _chiral_volume(p.xyz, t, i, "CA", "N", "C", "CB")
        assert (vol > 2.0).all() and (vol < 3.0).all(), (seq[i], vol)
    # the two true chiral centres of the side chains: Ile CB (S) and Thr CB (R)
    i_ile, i_thr = seq.index("I"), seq.index("T")
    assert (_chiral_volume(p.xyz, t, i_ile, "CB", "CA", "CG1", "CG2") > 0).all()
    assert (_chiral_volume(p.xyz, t, i_thr, "CB", "OG1", "CA", "CG2") < 0).all()


def test_gradcheck_and_create_graph():
    seq = "MYW"
    phi, psi, omega, chi = (x.requires_grad_() for x in random_torsions(seq))
    assert torch.autograd.gradcheck(lambda *a: bn.protein.build(seq, *a).xyz, (phi, psi, omega, chi))
    assert torch.autograd.gradgradcheck(lambda a, b: bn.protein.build(seq, a, b).xyz, (phi, psi))
    xyz = bn.protein.build(seq, phi, psi, omega, chi).xyz
    (g,) = torch.autograd.grad(xyz.square().sum(), chi, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), phi)
    assert torch.isfinite(gg).all() and gg.abs().sum() > 0
    # entries that place no atom get zero gradient
    assert (g[~bn.protein.protein_table(seq).chi_mask] == 0).all()


def test_vmap_matches_batched_call():
    seq = "ACDK"
    phi, psi, omega, chi = random_torsions(seq, (5,))
    batched = bn.protein.build(seq, phi, psi, omega, chi).xyz
    vm = torch.func.vmap(lambda a, b, c, d: bn.protein.build(seq, a, b, c, d).xyz)(phi, psi, omega, chi)
    torch.testing.assert_close(vm, batched)
    jac = torch.func.jacrev(lambda a: bn.protein.build(seq, a, psi[0]).xyz)(phi[0])
    assert jac.shape == (bn.protein.protein_table(seq).n_atoms, 3, 4)


@pytest.mark.parametrize("transform", ["jacrev", "vmap"])
def test_new_sequences_first_seen_inside_a_transform(transform):
    """Tables and packed batches first made inside jacrev/vmap hold plain tensors: the call works
    and matches the scan engine, and the cached tables serve later calls outside the transform."""
    seqs = ["CWQR", "HPM"] if transform == "jacrev" else ["CWQRH", "MPY"]
    g = torch.Generator().manual_seed(3)
    phi, psi = (torch.rand(2, 5, generator=g, dtype=torch.float64) for _ in range(2))
    if transform == "jacrev":
        got = torch.func.jacrev(lambda a: bn.protein.build_batch(seqs, a, psi).xyz)(phi)
        want = torch.autograd.functional.jacobian(
            lambda a: bn.protein.build_batch(seqs, a, psi, method="scan").xyz, phi
        )
    else:
        got = torch.func.vmap(lambda a: bn.protein.build_batch(seqs, a, psi).xyz)(phi[None].expand(3, 2, 5))
        want = bn.protein.build_batch(seqs, phi, psi, method="scan").xyz.expand(3, -1, -1, -1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    for s in seqs:
        t = bn.protein.protein_table(s)
        assert t.source.numpy().shape == (t.n_atoms,)  # a plain tensor, not a transform's wrapper
    again = bn.protein.build_batch(seqs, phi, psi).xyz
    torch.testing.assert_close(again, bn.protein.build_batch(seqs, phi, psi, method="scan").xyz)


def test_geometry_and_degrees():
    seq = "GSV"
    phi, psi, omega, chi = random_torsions(seq, (2,))
    p = bn.protein.build(seq, phi, psi, omega, chi)
    ic = bn.protein.internal_coordinates(p.xyz, seq, degrees=True)
    deg = 180 / math.pi
    again = bn.protein.build(seq, phi * deg, psi * deg, omega * deg, chi * deg, geometry=ic, degrees=True)
    torch.testing.assert_close(again.xyz, p.xyz)


def test_float32_accuracy_long_chain():
    seq = (ALL20 * 10)[:200]
    phi, psi, omega, chi = random_torsions(seq, seed=3)
    ref = bn.protein.build(seq, phi, psi, omega, chi).xyz
    f32 = bn.protein.build(seq, *(x.float() for x in (phi, psi, omega, chi))).xyz
    assert f32.dtype == torch.float32
    assert (f32.double() - ref).norm(dim=-1).max() < 1e-3


def test_mixed_batch_matches_single_builds():
    seqs = ["ACDEFG", "W", "KRHPY", "MNQSTV"]
    l_max = 6
    phi, psi, omega, chi = random_torsions("X" * l_max, (2, len(seqs)), seed=5)
    p = bn.protein.build_batch(seqs, phi, psi, omega, chi)
    assert p.xyz.shape == (2, 4, max(bn.protein.protein_table(s).n_atoms for s in seqs), 3)
    for k, s in enumerate(seqs):
        n, L = bn.protein.protein_table(s).n_atoms, len(s)
        single = bn.protein.build(s, phi[:, k, :L], psi[:, k, :L], omega[:, k, :L], chi[:, k, :L])
        torch.testing.assert_close(p.xyz[:, k, :n], single.xyz)
        assert (p.xyz[:, k, n:] == 0).all() and p.mask[k].sum() == n
        assert p.atom_names[k] == single.atom_names
        back = bn.protein.torsions_batch(p.xyz, seqs)
        torch.testing.assert_close(back.psi[:, k, :L], bn.protein.torsions(single.xyz, s).psi)
    # cached: the same tuple of sequences is analysed once
    assert bn.protein.packed_proteins(seqs) is bn.protein.packed_proteins(tuple(seqs))
    assert bn.protein.packed_proteins(seqs).tables[1] is bn.protein.protein_table("W")


def test_mixed_batch_gradients_vanish_in_padding():
    seqs = ["AG", "KLM"]
    phi, psi, omega, chi = (x.requires_grad_() for x in random_torsions("XXX", (2,), seed=1))
    xyz = bn.protein.build_batch(seqs, phi, psi, omega, chi).xyz
    # weighted: the plain sum of the coordinates does not depend on the last psi (up to rounding)
    w = torch.randn(xyz.shape, generator=torch.Generator().manual_seed(0), dtype=xyz.dtype)
    (g,) = torch.autograd.grad((w * xyz).sum(), psi)
    assert (g[0, 2] == 0) and (g[1].abs() > 1e-6).all()
    # torsions padded beyond the longest sequence: the extra columns are ignored
    wide = [torch.cat([x, torch.zeros(*x.shape[:1], 2, *x.shape[2:])], 1) for x in (phi, psi, omega, chi)]
    torch.testing.assert_close(bn.protein.build_batch(seqs, *wide).xyz, xyz)


def test_pdb_text():
    p = bn.protein.build("GW", torch.zeros(3, 2), torch.zeros(3, 2))
    text = bn.protein.write_pdb(p)
    lines = text.splitlines()
    assert text.count("MODEL") == 3 and text.count("ENDMDL") == 3 and lines[-1] == "END"
    atom = lines[1]
    assert atom[:6] == "ATOM  " and atom[12:16] == " N  " and atom[17:20] == "GLY" and atom[21] == "A"
    assert atom[76:78].strip() == "N" and float(atom[30:38]) == 0.0
    oxt = next(ln for ln in lines if ln[12:16] == " OXT")
    assert oxt[17:20] == "TRP" and int(oxt[22:26]) == 2


def test_errors():
    with pytest.raises(ValueError, match="unknown residue letter 'X' at position 2"):
        bn.protein.build("ACX", torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="unknown residue name 'HOH' at position 1"):
        bn.protein.protein_table(["ALA", "HOH"])
    with pytest.raises(ValueError, match="the sequence is empty"):
        bn.protein.protein_table("")
    with pytest.raises(TypeError, match="sequence must be a string"):
        bn.protein.protein_table(5)
    with pytest.raises(ValueError, match=r"phi must have shape \(\.\.\., L\) = \(\.\.\., 3\), got \(2, 4\)"):
        bn.protein.build("ACD", torch.zeros(2, 4), torch.zeros(2, 3))
    with pytest.raises(
        ValueError, match=r"chi must have shape \(\.\.\., L, 4\) = \(\.\.\., 3, 4\), got \(3,\)"
    ):
        bn.protein.build("ACD", torch.zeros(3), torch.zeros(3), chi=torch.zeros(3))
    with pytest.raises(ValueError, match="do not broadcast"):
        bn.protein.build("ACD", torch.zeros(2, 3), torch.zeros(4, 3))
    with pytest.raises(TypeError, match="phi must be a floating tensor"):
        bn.protein.build("ACD", torch.zeros(3, dtype=torch.long), torch.zeros(3))
    with pytest.raises(ValueError, match=r"phi must have shape \(\.\.\., B, L_max\) = \(\.\.\., 2, 2\)"):
        bn.protein.build_batch(["AC", "D"], torch.zeros(2, 1), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="non-empty list of sequences"):
        bn.protein.build_batch("ACD", torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="geometry bonds must have shape"):
        bn.protein.build("A", torch.zeros(1), torch.zeros(1), geometry=(torch.zeros(3),) * 3)
    with pytest.raises(ValueError, match="does not broadcast with torsions of batch shape"):
        bn.protein.build("A", torch.zeros(2, 1), torch.zeros(2, 1), geometry=(torch.zeros(3, 6),) * 3)
    with pytest.raises(ValueError, match="geometry must be"):
        bn.protein.build("A", torch.zeros(1), torch.zeros(1), geometry=(torch.zeros(6),))
    with pytest.raises(ValueError, match=r"xyz must have shape \(\.\.\., N, 3\) = \(\.\.\., 6, 3\)"):
        bn.protein.torsions(torch.zeros(5, 3), "A")
    t = bn.protein.protein_table("GA")
    with pytest.raises(ValueError, match="residue 0 \\(GLY\\) has no phi torsion"):
        t.row("phi", 0)
    with pytest.raises(ValueError, match="unknown torsion 'chi5'"):
        t.row("chi5", 1)
    with pytest.raises(ValueError, match="residue 0 \\(GLY\\) has no atom 'CB'"):
        t.atom(0, "CB")
    with pytest.raises(ValueError, match=r"atom 1 \(CA of residue 0, GLY\) is missing"):
        t.order_from([0], ["N"])
    with pytest.raises(ValueError, match="single character"):
        bn.protein.write_pdb(bn.protein.build("G", torch.zeros(1), torch.zeros(1)), chain="AB")
    far = bn.protein.build("G", torch.zeros(1), torch.zeros(1))._replace(xyz=torch.full((4, 3), 1e5))
    with pytest.raises(ValueError, match="do not fit the PDB format"):
        bn.protein.write_pdb(far)


@pytest.mark.slow
def test_thousand_mixed_chains_in_one_call():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(50, 301, (1000,), generator=g).tolist()
    letters = torch.randint(0, 20, (sum(lengths),), generator=g).tolist()
    seqs, k = [], 0
    for n in lengths:
        seqs.append("".join(ALL20[j] for j in letters[k : k + n]))
        k += n
    phi, psi, omega, chi = random_torsions("X" * 300, (1000,), seed=9)
    p = bn.protein.build_batch(seqs, phi, psi, omega, chi)
    assert p.xyz.shape[:2] == (1000, max(bn.protein.protein_table(s).n_atoms for s in seqs))
    for k in (int(torch.tensor(lengths).argmax()), 0, 999):
        n = lengths[k]
        single = bn.protein.build(seqs[k], phi[k, :n], psi[k, :n], omega[k, :n], chi[k, :n]).xyz
        torch.testing.assert_close(p.xyz[k, : single.shape[0]], single, atol=1e-9, rtol=0)
    # float32 with the scan engine stays within 1e-3 A of float64 for every chain
    f32 = bn.protein.build_batch(seqs, *(x.float() for x in (phi, psi, omega, chi)), method="scan").xyz
    assert (f32.double() - p.xyz).norm(dim=-1).max() < 1e-3


# ------------------------------------------------------------- caches made under inference mode
def _fresh_caches() -> None:
    """Empty the protein layer's caches, so that the next use of a sequence is its first."""
    from batched_nerf.protein import _build, _sequence

    _sequence._cached.cache_clear()
    _build._packed.cache_clear()


def _cached_tensors(owner: object) -> list[torch.Tensor]:
    out = [v for v in vars(owner).values() if isinstance(v, torch.Tensor)]
    for casts in vars(owner).get("_cast", {}).values():
        out += list(casts)
    for cache in ("_sources", "_masks"):  # build's direct-path gathers and atom masks
        out += list(vars(owner).get(cache, {}).values())
    return out


@pytest.mark.parametrize("hydrogens", [False, True])
def test_build_trains_after_a_first_use_under_inference_mode(hydrogens):
    """A validation pass (inference_mode) makes and caches the table; training then saves its tensors."""
    _fresh_caches()
    seq = "MKVW"
    with torch.inference_mode():
        bn.protein.build(seq, torch.zeros(4), torch.zeros(4), hydrogens=hydrogens)  # float32 casts
        bn.protein.build(seq, *random_torsions(seq), hydrogens=hydrogens)  # float64 casts
    t = bn.protein.protein_table(seq, hydrogens=hydrogens)
    assert not any(x.is_inference() for x in _cached_tensors(t))
    for dtype in (torch.float32, torch.float64):
        phi, psi, omega, chi = (x.requires_grad_(True) for x in random_torsions(seq, (2,), dtype=dtype))
        p = bn.protein.build(seq, phi, psi, omega, chi, hydrogens=hydrogens)
        (p.xyz.square() * p.mask[:, None]).sum().backward()  # the cached mask is saved for backward
        assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in (phi, psi, omega, chi))
        assert phi.grad[..., 1:].abs().sum() > 0


def test_build_batch_trains_after_a_first_use_under_inference_mode():
    _fresh_caches()
    seqs = ["GAV", "WY"]
    with torch.inference_mode():
        bn.protein.build_batch(seqs, torch.zeros(2, 3), torch.zeros(2, 3))
    packed = bn.protein.packed_proteins(seqs)
    assert not any(x.is_inference() for x in _cached_tensors(packed))
    assert not any(x.is_inference() for t in packed.tables for x in _cached_tensors(t))
    phi = torch.zeros(2, 3, requires_grad=True)
    psi = torch.full((2, 3), 2.0, requires_grad=True)
    p = bn.protein.build_batch(seqs, phi, psi)
    p.xyz.square().sum().backward()  # index_select on the cached pad / source indices
    assert torch.isfinite(phi.grad).all() and psi.grad.abs().sum() > 0


def test_torsions_train_after_a_first_use_under_inference_mode():
    _fresh_caches()
    xyz = bn.protein.build("ACDK", *random_torsions("ACDK")).xyz
    batch = bn.protein.build_batch(["ACDK", "GW"], *random_torsions("ACDK", (2,))[:2]).xyz
    with torch.inference_mode():
        bn.protein.torsions(xyz, "ACDK")
        bn.protein.internal_coordinates(xyz, "ACDK")
        bn.protein.torsions_batch(batch, ["ACDK", "GW"])
    x = xyz.clone().requires_grad_(True)
    y = batch.clone().requires_grad_(True)
    loss = (
        bn.protein.torsions(x, "ACDK").chi.sum()
        + bn.protein.internal_coordinates(x, "ACDK").dihedrals.sum()
        + bn.protein.torsions_batch(y, ["ACDK", "GW"]).psi.sum()
    )
    loss.backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(y.grad).all() and y.grad.abs().sum() > 0


def test_a_table_made_outside_inference_mode_casts_its_templates_outside_it():
    """The per-dtype template casts are cached on first use: under inference_mode too."""
    t = bn.protein.ProteinTable("GSG")  # a table of its own, no casts yet
    with torch.inference_mode():
        bn.protein._build.templates(t, torch.float32, torch.device("cpu"))
    assert not any(x.is_inference() for x in _cached_tensors(t))


# ------------------------------------------------------------- build's direct path
@pytest.mark.parametrize("given", ["none", "omega", "chi", "both"])
@pytest.mark.parametrize("hydrogens", [False, True])
def test_direct_path_equals_the_checked_path(given, hydrogens, monkeypatch):
    """Tensors of one dtype and shape skip the checks and casts; the numbers and gradients are the same."""
    from batched_nerf.protein import _build

    seq = "ACE MET LYS TRP TYR ARG NME" if hydrogens else "MKWYRP"
    length = bn.protein.protein_table(seq).n_residues
    phi, psi, omega, chi = random_torsions("x" * length, (2,))
    omega = omega if given in ("omega", "both") else None
    chi = chi if given in ("chi", "both") else None
    t = bn.protein.protein_table(seq, hydrogens=hydrogens)
    # the checked path, by numpy torsions (defaults made explicit: trans omega, the default rotamers)
    full_omega = torch.full((2, length), math.pi, dtype=torch.float64) if omega is None else omega
    full_chi = t.default_chi.expand(2, length, 4) if chi is None else chi
    args = [x.numpy() for x in (phi, psi, full_omega, full_chi)]
    checked = bn.protein.build(seq, *args, hydrogens=hydrogens).xyz
    leaves = [x if x is None else x.clone().requires_grad_(True) for x in (phi, psi, omega, chi)]

    def fail(*args, **kwargs):
        raise AssertionError("the direct path was not taken")

    monkeypatch.setattr(_build, "_torsion_values", fail)
    direct = bn.protein.build(seq, *leaves, hydrogens=hydrogens)
    torch.testing.assert_close(direct.xyz, checked, atol=0, rtol=0)
    w = torch.randn_like(direct.xyz)
    (direct.xyz * w).sum().backward()
    monkeypatch.undo()
    ref_leaves = [x if x is None else x.detach().clone().requires_grad_(True) for x in (phi, psi, omega, chi)]
    wide = [ref_leaves[0], ref_leaves[1], full_omega if omega is None else ref_leaves[2]]
    wide.append(full_chi if chi is None else ref_leaves[3])
    ref = bn.protein.build(seq, wide[0], wide[1], wide[2].clone(), wide[3].clone(), hydrogens=hydrogens)
    (ref.xyz * w).sum().backward()
    for mine, theirs in zip(leaves, ref_leaves):
        if mine is not None:
            torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-12, rtol=0)


def test_direct_path_reads_degrees_and_keeps_the_checks_for_the_rest():
    phi, psi, omega, chi = random_torsions("GAWK", (3,))
    deg = [x.rad2deg() for x in (phi, psi, omega, chi)]
    torch.testing.assert_close(
        bn.protein.build("GAWK", *deg, degrees=True).xyz, bn.protein.build("GAWK", phi, psi, omega, chi).xyz
    )
    # broadcasting, mixed dtypes and wrong shapes go through the checked path
    both = bn.protein.build("GAWK", phi, psi[0], omega.float(), chi).xyz
    assert both.shape == (3, bn.protein.protein_table("GAWK").n_atoms, 3) and both.dtype == torch.float64
    message = r"chi must have shape \(\.\.\., L, 4\) = \(\.\.\., 4, 4\), got \(3, 4, 3\)"
    with pytest.raises(ValueError, match=message):
        bn.protein.build("GAWK", phi, psi, omega, chi[..., :3])
    with pytest.raises(TypeError, match="phi must be a floating tensor, got dtype torch.int64"):
        bn.protein.build("GAWK", torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("hydrogens", [False, True])
def test_empty_batches_build(hydrogens: bool) -> None:
    """A batch of size 0 gives an empty batch of coordinates, as method="scan" did (the bound build
    raised a numpy reshape error; issue 43, item 9)."""
    phi = torch.zeros(0, 2, requires_grad=True)
    one = bn.protein.build("GA", phi, torch.zeros(0, 2), hydrogens=hydrogens)
    n = bn.protein.protein_table("GA", hydrogens=hydrogens).n_atoms
    assert one.xyz.shape == (0, n, 3)
    one.xyz.sum().backward()
    assert phi.grad is not None and phi.grad.shape == (0, 2)
    mixed = bn.protein.build_batch(["GA", "W"], torch.zeros(0, 2, 2), torch.zeros(0, 2, 2))
    assert mixed.xyz.shape[:2] == (0, 2)


def test_packed_proteins_pickle_after_a_build() -> None:
    """A PackedProteins pickled only while fresh: a build kept local functions on it (issue 43, item 9).
    The derived state is left out and made again on use."""
    import pickle

    packed = bn.protein.packed_proteins(["GAW", "K"])
    phi, psi = torch.rand(4, 2, 3), torch.rand(4, 2, 3)
    built = bn.protein.build_batch(["GAW", "K"], phi, psi)
    copy = pickle.loads(pickle.dumps(packed))
    assert copy.sequences == packed.sequences and copy.table == packed.table
    torch.testing.assert_close(copy.padded(copy.packed(built.xyz)), built.xyz)
    table = pickle.loads(pickle.dumps(bn.protein.protein_table("GAW")))
    assert table.residues == ("GLY", "ALA", "TRP") and table.table == packed.tables[0].table
