"""OpenFold atom37 / atom14 layouts and the symmetric side-chain torsions (protein._layouts, ._symmetry)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf.protein import (
    ATOM37_NAMES,
    atom14_names,
    chi_loss,
    from_atom14,
    from_atom37,
    protein_table,
    symmetric_chi,
    symmetric_renaming,
    to_atom14,
    to_atom37,
)

#: One sequence holding each of the 20 standard residues.
ALL20 = "ARNDCQEGHILKMFPSTWYV"

#: Oracle: OpenFold's residue_constants.atom_types (openfold/np/residue_constants.py), written out.
OPENFOLD_ATOM_TYPES = [
    "N", "CA", "C", "CB", "O", "CG", "CG1", "CG2", "OG", "OG1", "SG", "CD", "CD1", "CD2", "ND1", "ND2",
    "OD1", "OD2", "SD", "CE", "CE1", "CE2", "CE3", "NE", "NE1", "NE2", "OE1", "OE2", "CH2", "NH1", "NH2",
    "OH", "CZ", "CZ2", "CZ3", "NZ", "OXT",
]  # fmt: skip

#: Oracle: OpenFold's residue_constants.restype_name_to_atom14_names, written out with the empty slots.
_E = ""
OPENFOLD_ATOM14 = {
    "ALA": ["N", "CA", "C", "O", "CB", _E, _E, _E, _E, _E, _E, _E, _E, _E],
    "ARG": ["N", "CA", "C", "O", "CB", "CG", "CD", "NE", "CZ", "NH1", "NH2", _E, _E, _E],
    "ASN": ["N", "CA", "C", "O", "CB", "CG", "OD1", "ND2", _E, _E, _E, _E, _E, _E],
    "ASP": ["N", "CA", "C", "O", "CB", "CG", "OD1", "OD2", _E, _E, _E, _E, _E, _E],
    "CYS": ["N", "CA", "C", "O", "CB", "SG", _E, _E, _E, _E, _E, _E, _E, _E],
    "GLN": ["N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "NE2", _E, _E, _E, _E, _E],
    "GLU": ["N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "OE2", _E, _E, _E, _E, _E],
    "GLY": ["N", "CA", "C", "O", _E, _E, _E, _E, _E, _E, _E, _E, _E, _E],
    "HIS": ["N", "CA", "C", "O", "CB", "CG", "ND1", "CD2", "CE1", "NE2", _E, _E, _E, _E],
    "ILE": ["N", "CA", "C", "O", "CB", "CG1", "CG2", "CD1", _E, _E, _E, _E, _E, _E],
    "LEU": ["N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", _E, _E, _E, _E, _E, _E],
    "LYS": ["N", "CA", "C", "O", "CB", "CG", "CD", "CE", "NZ", _E, _E, _E, _E, _E],
    "MET": ["N", "CA", "C", "O", "CB", "CG", "SD", "CE", _E, _E, _E, _E, _E, _E],
    "PHE": ["N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ", _E, _E, _E],
    "PRO": ["N", "CA", "C", "O", "CB", "CG", "CD", _E, _E, _E, _E, _E, _E, _E],
    "SER": ["N", "CA", "C", "O", "CB", "OG", _E, _E, _E, _E, _E, _E, _E, _E],
    "THR": ["N", "CA", "C", "O", "CB", "OG1", "CG2", _E, _E, _E, _E, _E, _E, _E],
    "TRP": ["N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "NE1", "CE2", "CE3", "CZ2", "CZ3", "CH2"],
    "TYR": ["N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ", "OH", _E, _E],
    "VAL": ["N", "CA", "C", "O", "CB", "CG1", "CG2", _E, _E, _E, _E, _E, _E, _E],
}


def _torsions(n: int, seed: int = 0, batch: tuple[int, ...] = (), dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    phi, psi = ((torch.rand(*batch, n, generator=g, dtype=dtype) * 2 - 1) * math.pi for _ in range(2))
    chi = (torch.rand(*batch, n, 4, generator=g, dtype=dtype) * 2 - 1) * math.pi
    return phi, psi, chi


def _build(seq: str, hydrogens: bool = False, batch: tuple[int, ...] = (2,), seed: int = 0):
    phi, psi, chi = _torsions(len(protein_table(seq).residues), seed, batch)
    return bn.protein.build(seq, phi, psi, chi=chi, hydrogens=hydrogens).xyz


# ----------------------------------------------------------------------------- the layouts' names


def test_atom37_names_are_openfolds():
    assert list(ATOM37_NAMES) == OPENFOLD_ATOM_TYPES
    assert len(set(ATOM37_NAMES)) == 37


@pytest.mark.parametrize("residue", sorted(OPENFOLD_ATOM14))
def test_atom14_names_are_openfolds(residue):
    assert list(atom14_names(residue)) == OPENFOLD_ATOM14[residue]
    assert atom14_names(bn.protein.THREE_TO_ONE[residue]) == atom14_names(residue)


def test_atom14_names_of_variants_and_aliases():
    assert atom14_names("HID") == atom14_names("HIE") == atom14_names("HIP") == atom14_names("HIS")
    assert atom14_names("CYX") == atom14_names("CYS")
    assert atom14_names("ASH") == atom14_names("ASP")
    assert atom14_names("hsd") == atom14_names("HIS")  # CHARMM spelling


def test_atom14_names_errors():
    with pytest.raises(ValueError, match="ACE is a cap"):
        atom14_names("ACE")
    with pytest.raises(ValueError, match="unknown residue 'XYZ'"):
        atom14_names("XYZ")
    with pytest.raises(ValueError, match="unknown residue 'B'"):
        atom14_names("B")
    with pytest.raises(TypeError, match="residue must be a string"):
        atom14_names(3)


def test_every_heavy_atom_of_the_templates_has_a_slot():
    t = protein_table(ALL20)
    for r, name in zip(t.residue_index.tolist(), t.atom_names):
        assert name in ATOM37_NAMES
        if name != "OXT":
            assert name in atom14_names(t.residues[r]), (t.residues[r], name)


# ----------------------------------------------------------------------------- masks


def test_masks_match_the_templates():
    t = protein_table(ALL20)
    _, mask37 = to_atom37(torch.zeros(t.n_atoms, 3), ALL20)
    _, mask14 = to_atom14(torch.zeros(t.n_atoms, 3), ALL20)
    assert mask37.shape == (20, 37) and mask37.dtype == torch.bool
    assert mask14.shape == (20, 14) and mask14.dtype == torch.bool
    for r, res in enumerate(t.residues):
        own = {n for k, n in enumerate(t.atom_names) if int(t.residue_index[k]) == r}
        assert {ATOM37_NAMES[s] for s in mask37[r].nonzero().flatten().tolist()} == own
        assert {atom14_names(res)[s] for s in mask14[r].nonzero().flatten().tolist()} == own - {"OXT"}
        assert mask14[r].tolist() == [n != "" for n in atom14_names(res)]
    gly, trp = t.residues.index("GLY"), t.residues.index("TRP")
    assert [ATOM37_NAMES[s] for s in mask37[gly].nonzero().flatten()] == ["N", "CA", "C", "O"]
    assert bool(mask14[trp].all()) and int(mask37[trp].sum()) == 14
    assert bool(mask37[-1, ATOM37_NAMES.index("OXT")]) and int(mask37[:-1, -1].sum()) == 0


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("hydrogens", [False, True])
def test_atom37_round_trip_is_bitwise(hydrogens):
    xyz = _build(ALL20, hydrogens)
    t = protein_table(ALL20, hydrogens=hydrogens)
    atom37, mask = to_atom37(xyz, ALL20, hydrogens=hydrogens)
    assert atom37.shape == (2, 20, 37, 3)
    assert bool((atom37[..., ~mask, :] == 0).all())
    back = from_atom37(atom37, ALL20, hydrogens=hydrogens, mask=mask)
    heavy = torch.tensor([e != "H" for e in t.elements])
    assert torch.equal(back[..., heavy, :], xyz[..., heavy, :])
    assert bool(back[..., ~heavy, :].isnan().all()) and int((~heavy).sum()) == (
        0 if not hydrogens else t.n_atoms - protein_table(ALL20).n_atoms
    )
    # each slot holds its atom
    for k in (0, 5, t.n_atoms - 1):
        if heavy[k]:
            r, s = int(t.residue_index[k]), ATOM37_NAMES.index(t.atom_names[k])
            assert torch.equal(atom37[..., r, s, :], xyz[..., k, :])


@pytest.mark.parametrize("hydrogens", [False, True])
def test_atom14_round_trip(hydrogens):
    xyz = _build(ALL20, hydrogens)
    t = protein_table(ALL20, hydrogens=hydrogens)
    atom14, mask = to_atom14(xyz, ALL20, hydrogens=hydrogens)
    assert atom14.shape == (2, 20, 14, 3)
    back = from_atom14(atom14, ALL20, hydrogens=hydrogens, mask=mask)
    heavy = torch.tensor([e != "H" for e in t.elements])
    oxt = t.atom(19, "OXT")
    exact = heavy.clone()
    exact[oxt] = False
    assert torch.equal(back[..., exact, :], xyz[..., exact, :])  # bitwise: a gather
    # OXT has no atom14 slot: placed from C, CA, O (ideal carboxylate), as the templates built it
    torch.testing.assert_close(back[..., oxt, :], xyz[..., oxt, :], atol=1e-12, rtol=0)
    assert bool(back[..., ~heavy, :].isnan().all())


def test_atom14_slot_order():
    xyz = _build("W", batch=())
    t = protein_table("W")
    atom14, _ = to_atom14(xyz, "W")
    for s, name in enumerate(atom14_names("TRP")):
        assert torch.equal(atom14[0, s], xyz[t.atom(0, name)])


def test_variants_use_their_base_residue_slots():
    seq = "HID CYX ASH GLH LYN HIP"
    xyz = _build(seq)
    atom37, mask = to_atom37(xyz, seq)
    base = "HCDEKH"
    assert torch.equal(mask, to_atom37(_build(base), base)[1])
    assert torch.equal(from_atom37(atom37, seq), xyz)
    atom14, mask14 = to_atom14(xyz, seq, hydrogens=False)
    assert torch.equal(mask14, to_atom14(_build(base), base)[1])


def test_ideal_oxt_from_atom37():
    xyz = _build("GAS")
    atom37, mask = to_atom37(xyz, "GAS")
    mask[-1, -1] = False
    atom37 = atom37.clone()
    atom37[..., -1, -1, :] = 0.0
    with pytest.raises(ValueError, match=r"residue 2 \(SER\): atom OXT is absent .*ideal_oxt=True"):
        from_atom37(atom37, "GAS", mask=mask)
    back = from_atom37(atom37, "GAS", mask=mask, ideal_oxt=True)
    torch.testing.assert_close(back, xyz, atol=1e-12, rtol=0)


def test_tables_and_leading_dims():
    xyz = _build("MKV", batch=(3, 2))
    atom37, mask = to_atom37(xyz, protein_table("MKV"))
    assert atom37.shape == (3, 2, 3, 37, 3)
    assert torch.equal(from_atom37(atom37, ["MET", "LYS", "VAL"]), xyz)
    atom14, _ = to_atom14(xyz[0, 0], "MKV")
    assert atom14.shape == (3, 14, 3)


def test_packed_layout():
    seqs = ["GW", "DEF", "R"]
    packed = bn.protein.packed_proteins(seqs)
    phi, psi, chi = _torsions(3, 1, (2, 3))
    out = bn.protein.build_batch(seqs, phi, psi, chi=chi)
    atom37, mask = to_atom37(out.xyz, packed)
    assert atom37.shape == (2, 3, 3, 37, 3) and mask.shape == (3, 3, 37)
    for b, s in enumerate(seqs):
        single, own_mask = to_atom37(out.xyz[:, b, : protein_table(s).n_atoms], s)
        assert torch.equal(atom37[:, b, : len(s)], single)
        assert torch.equal(mask[b, : len(s)], own_mask) and not bool(mask[b, len(s) :].any())
    back = from_atom37(atom37, packed, mask=mask)
    assert torch.equal(back, out.xyz)
    atom14, mask14 = to_atom14(out.xyz, packed)
    back14 = from_atom14(atom14, packed, mask=mask14)
    torch.testing.assert_close(back14, out.xyz, atol=1e-12, rtol=0)
    assert bool((back14[..., ~out.mask, :] == 0).all())


def test_packed_with_hydrogens():
    seqs = ["GA", "Y"]
    packed = bn.protein.packed_proteins(seqs, hydrogens=True)
    phi, psi, chi = _torsions(2, 2, (2,))
    out = bn.protein.build_batch(seqs, phi, psi, chi=chi, hydrogens=True)
    atom37, mask = to_atom37(out.xyz, packed)
    back = from_atom37(atom37, packed, mask=mask)
    heavy = torch.tensor(
        [[e != "H" for e in t.elements] + [True] * (packed.n_max - t.n_atoms) for t in packed.tables]
    )
    assert torch.equal(back[..., heavy, :], out.xyz[..., heavy, :])
    assert bool(back[..., ~heavy, :].isnan().all())


# ----------------------------------------------------------------------------- gradients


def test_gradcheck_to_atom37():
    xyz = _build("DFG", batch=()).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: to_atom37(x, "DFG")[0], (xyz,))
    assert torch.autograd.gradgradcheck(lambda x: to_atom37(x, "DFG")[0], (xyz,))


def test_gradcheck_from_layouts():
    xyz = _build("DFG", batch=())
    atom37 = to_atom37(xyz, "DFG")[0].requires_grad_(True)
    atom14 = to_atom14(xyz, "DFG")[0].requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a: from_atom37(a, "DFG"), (atom37,))
    assert torch.autograd.gradcheck(lambda a: from_atom37(a, "DFG", ideal_oxt=True), (atom37,))
    assert torch.autograd.gradcheck(lambda a: from_atom14(a, "DFG"), (atom14,))


def test_layouts_under_vmap():
    xyz = _build("DFG", batch=(4,))
    a = torch.func.vmap(lambda x: to_atom37(x, "DFG")[0])(xyz)
    assert torch.equal(a, to_atom37(xyz, "DFG")[0])
    b = torch.func.vmap(lambda x: from_atom14(x, "DFG"))(to_atom14(xyz, "DFG")[0])
    torch.testing.assert_close(b, xyz, atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------- errors


def test_layout_errors():
    xyz = _build("GA", batch=())
    with pytest.raises(ValueError, match=r"xyz must have shape \(\.\.\., 10, 3\).*got \(9, 3\)"):
        to_atom37(xyz[:-1], "GA")
    with pytest.raises(ValueError, match=r"xyz must have shape \(\.\.\., 10, 3\).*got \(10, 2\)"):
        to_atom14(xyz[:, :2], "GA")
    with pytest.raises(ValueError, match=r"atom37 must have shape \(\.\.\., 2, 37, 3\).*got \(2, 14, 3\)"):
        from_atom37(torch.zeros(2, 14, 3), "GA")
    with pytest.raises(ValueError, match=r"atom14 must have shape \(\.\.\., 2, 14, 3\).*got \(3, 14, 3\)"):
        from_atom14(torch.zeros(3, 14, 3), "GA")
    with pytest.raises(ValueError, match="unknown residue letter 'X' at position 1"):
        to_atom37(xyz, "GX")
    with pytest.raises(ValueError, match="residue 0 is the cap ACE"):
        to_atom37(torch.zeros(9, 3), "ACE ALA NME")
    with pytest.raises(ValueError, match="residue 1 is the cap NME"):
        to_atom14(torch.zeros(100, 3), protein_table("ALA NME"))
    with pytest.raises(TypeError, match="floating"):
        to_atom37(torch.zeros(10, 3, dtype=torch.long), "GA")
    with pytest.raises(ValueError, match="heavy atoms only"):
        to_atom37(xyz, protein_table("GA"), hydrogens=True)
    atom37, mask = to_atom37(xyz, "GA")
    mask = mask.clone()
    mask[1, ATOM37_NAMES.index("CB")] = False
    with pytest.raises(ValueError, match=r"residue 1 \(ALA\): atom CB is absent from the mask"):
        from_atom37(atom37, "GA", mask=mask)
    with pytest.raises(ValueError, match=r"mask must have shape \(\.\.\., 2, 37\)"):
        from_atom37(atom37, "GA", mask=mask[:, :14])
    atom14, mask14 = to_atom14(xyz, "GA")
    mask14 = mask14.clone()
    mask14[0, 3] = False
    with pytest.raises(ValueError, match=r"residue 0 \(GLY\): atom O is absent"):
        from_atom14(atom14, "GA", mask=mask14)
    packed = bn.protein.packed_proteins(["G", "A"])
    _, pmask = to_atom14(torch.zeros(2, 6, 3), packed)
    pmask = pmask.clone()
    pmask[1, 0, 4] = False
    with pytest.raises(ValueError, match=r"sequence 1, residue 0 \(ALA\): atom CB is absent"):
        from_atom14(torch.zeros(2, 1, 14, 3), packed, mask=pmask)


# ----------------------------------------------------------------------------- symmetric chi


def test_symmetric_chi_values():
    seq = "ASP GLU PHE TYR ARG ASN LEU ASH GLH"
    chi = torch.full((9, 4), 2.5, dtype=torch.float64)
    alt = symmetric_chi(chi, seq)
    expect = chi.clone()
    for r, k in ((0, 1), (1, 2), (2, 1), (3, 1)):
        expect[r, k] = 2.5 - math.pi
    assert torch.equal(alt, expect)
    # wrapped into (-pi, pi]: -pi + pi -> pi, 0 -> pi, pi -> 0
    edge = torch.tensor([[0.0, -math.pi, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    out = symmetric_chi(edge, "DE")
    assert float(out[0, 1]) == pytest.approx(0.0, abs=1e-15) and float(out[1, 2]) == pytest.approx(math.pi)
    many = torch.linspace(-20, 20, 401, dtype=torch.float64)
    wrapped = symmetric_chi(torch.stack([torch.zeros_like(many), many, many, many], -1)[:, None], "D")[
        :, 0, 1
    ]
    assert bool((wrapped > -math.pi).all() and (wrapped <= math.pi).all())
    torch.testing.assert_close(torch.cos(wrapped), -torch.cos(many))
    assert torch.equal(symmetric_chi(chi[:2], "ASH GLH"), chi[:2])


def test_symmetric_chi_errors():
    with pytest.raises(ValueError, match=r"chi must have shape \(\.\.\., 2, 4\).*got \(3, 4\)"):
        symmetric_chi(torch.zeros(3, 4), "DE")
    with pytest.raises(ValueError, match=r"pred must have shape \(\.\.\., 2, 4\).*got \(2, 3\)"):
        chi_loss(torch.zeros(2, 3), torch.zeros(2, 4), "DE")
    with pytest.raises(ValueError, match=r"target must have shape"):
        chi_loss(torch.zeros(2, 4), torch.zeros(1, 4), "DE")
    with pytest.raises(ValueError, match=r"mask must have shape"):
        chi_loss(torch.zeros(2, 4), torch.zeros(2, 4), "DE", mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="unknown residue letter 'Z'"):
        symmetric_chi(torch.zeros(2, 4), "DZ")


def test_symmetric_renaming():
    t = protein_table("DEFYRA")
    perm = symmetric_renaming("DEFYRA")
    assert sorted(perm.tolist()) == list(range(t.n_atoms))
    assert torch.equal(perm[perm], torch.arange(t.n_atoms))
    moved = {(int(t.residue_index[k]), t.atom_names[k], t.atom_names[int(perm[k])]) for k in range(t.n_atoms)}
    moved = {m for m in moved if m[1] != m[2]}
    assert moved == {
        (0, "OD1", "OD2"), (0, "OD2", "OD1"), (1, "OE1", "OE2"), (1, "OE2", "OE1"),
        (2, "CD1", "CD2"), (2, "CD2", "CD1"), (2, "CE1", "CE2"), (2, "CE2", "CE1"),
        (3, "CD1", "CD2"), (3, "CD2", "CD1"), (3, "CE1", "CE2"), (3, "CE2", "CE1"),
        (4, "NH1", "NH2"), (4, "NH2", "NH1"),
    }  # fmt: skip
    no_arg = symmetric_renaming("DEFYRA", arginine=False)
    assert no_arg[t.atom(4, "NH1")] == t.atom(4, "NH1")
    th = protein_table("RFASH", hydrogens=True)
    perm = symmetric_renaming("RFASH", hydrogens=True)
    names = {(th.atom_names[k], th.atom_names[int(perm[k])]) for k in range(th.n_atoms) if perm[k] != k}
    for a, b in (("HH11", "HH21"), ("HH12", "HH22"), ("HD1", "HD2"), ("HE1", "HE2"), ("NH1", "NH2")):
        assert (a, b) in names and (b, a) in names
    assert not any(th.residues[int(th.residue_index[k])] == "ASH" for k in range(th.n_atoms) if perm[k] != k)
    packed = symmetric_renaming(bn.protein.packed_proteins(["D", "GA"]))
    assert packed.shape == (2, 10) and packed[0, 9] == 9
    assert torch.equal(packed[0, :9], symmetric_renaming("D"))


SYMMETRIC_RINGS = ("CZ", "OH", "HZ", "HE1", "HE2", "HH")


@pytest.mark.parametrize("hydrogens", [False, True])
def test_building_with_symmetric_chi_renames_the_atoms(hydrogens):
    seq = "ADEFYRKGW"
    phi, psi, chi = _torsions(len(seq), 3, (2,))
    xyz1 = bn.protein.build(seq, phi, psi, chi=chi, hydrogens=hydrogens).xyz
    xyz2 = bn.protein.build(seq, phi, psi, chi=symmetric_chi(chi, seq), hydrogens=hydrogens).xyz
    perm = symmetric_renaming(seq, hydrogens=hydrogens, arginine=False)
    t = protein_table(seq, hydrogens=hydrogens)
    assert not torch.allclose(xyz2, xyz1)
    ring = torch.tensor(
        [
            t.residues[r] in ("PHE", "TYR") and n in SYMMETRIC_RINGS
            for r, n in zip(t.residue_index.tolist(), t.atom_names)
        ]
    )
    # exact (to rounding) everywhere but the far end of the Phe/Tyr rings
    torch.testing.assert_close(xyz2[..., perm, :][..., ~ring, :], xyz1[..., ~ring, :], atol=1e-10, rtol=0)
    # the templates' six-ring closes 0.007 A off its mirror axis: CZ (and what hangs on it) moves a little
    far = (xyz2[..., perm, :] - xyz1).norm(dim=-1)[
        ..., ring & torch.tensor([n != "HH" for n in t.atom_names])
    ]
    assert float(far.max()) < 0.03


def test_chi_loss_values():
    seq = "DEFYLRG"
    _, _, target = _torsions(len(seq), 4)
    flipped = symmetric_chi(target, seq)
    assert float(chi_loss(flipped, target, seq)) == pytest.approx(0.0, abs=1e-12)
    assert float(chi_loss(target, target, seq)) == pytest.approx(0.0, abs=1e-12)
    other = target + 0.3
    loss = chi_loss(other, target, seq)
    t = protein_table(seq)
    assert float(loss) == pytest.approx(1 - math.cos(0.3), rel=1e-12)
    # a non-symmetric chi flipped costs 2
    bad = target.clone()
    bad[4, 0] += math.pi  # Leu chi1
    n = int(t.chi_mask.sum())
    assert float(chi_loss(bad, target, seq)) == pytest.approx(2.0 / n)
    # the Gly row and the chi a residue lacks do not count; masks weight
    junk = target.clone()
    junk[6] = 3.0
    junk[0, 3] = 1.0
    assert float(chi_loss(junk, target, seq)) == pytest.approx(0.0, abs=1e-12)
    mask = torch.ones(len(seq), 4, dtype=torch.bool)
    mask[4, 0] = False
    assert float(chi_loss(bad, target, seq, mask=mask)) == pytest.approx(0.0, abs=1e-12)
    assert float(chi_loss(target, target, "G" * 7)) == 0.0
    batch = chi_loss(torch.stack([target, bad]), target, seq)
    assert batch.shape == (2,) and float(batch[0]) < 1e-12 < float(batch[1])
    packed = bn.protein.packed_proteins(["DL", "G"])
    pt = torch.zeros(2, 2, 4, dtype=torch.float64)
    pp = pt.clone()
    pp[0, 0, 1] = math.pi  # Asp chi2: symmetric
    pp[1, 1] = 2.0  # padding
    assert chi_loss(pp, pt, packed).abs().max() < 1e-12


def test_chi_loss_gradcheck_and_vmap():
    seq = "DEFYLR"
    _, _, target = _torsions(len(seq), 5)
    pred = (
        target + torch.linspace(-0.7, 0.7, len(seq) * 4, dtype=torch.float64).reshape(-1, 4)
    ).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda p: chi_loss(p, target, seq), (pred,))
    assert torch.autograd.gradgradcheck(lambda p: chi_loss(p, target, seq), (pred,))
    preds = torch.stack([pred.detach(), target, symmetric_chi(target, seq)])
    out = torch.func.vmap(lambda p: chi_loss(p, target, seq))(preds)
    torch.testing.assert_close(out, chi_loss(preds, target, seq))
    grads = torch.func.vmap(torch.func.grad(lambda p: chi_loss(p, target, seq)))(preds)
    assert grads.shape == preds.shape and bool(grads.isfinite().all())


def test_numpy_inputs():
    target = np.zeros((1, 4))
    assert float(chi_loss(np.full((1, 4), math.pi), target, "D")) == pytest.approx(1.0)


def test_first_call_under_inference_mode_serves_training():
    seq = "KDW"
    with torch.inference_mode():
        xyz = _build(seq, batch=())
        to_atom37(xyz, seq)
        from_atom14(to_atom14(xyz, seq)[0], seq)
        chi_loss(torch.zeros(3, 4), torch.zeros(3, 4), seq)
    x = _build(seq, batch=()).requires_grad_(True)
    from_atom14(to_atom14(x, seq)[0], seq).sum().backward()
    assert x.grad is not None
    p = torch.zeros(3, 4, requires_grad=True)
    chi_loss(p, torch.ones(3, 4), seq).backward()
    assert p.grad is not None
