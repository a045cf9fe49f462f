"""Reading, setting and matching torsions; the torsion log-volume against an autograd oracle."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch
from test_torsion_space import coordinates, distances, molecule, with_hydrogens

import batched_nerf as bn

F64 = torch.float64
NAMES = ["isopentane", "ring", "bicyclohexyl"]


def ragged(seed: int = 0):
    mols = [molecule(name, seed=seed + s) for s, name in enumerate(NAMES)]
    rotors = [bn.RotorTable.from_connectivity(p, n) for p, n, _ in mols]
    xyz = torch.cat([x for _, _, x in mols])
    batch = torch.cat([torch.full((n,), m) for m, (_, n, _) in enumerate(mols)])
    return rotors, xyz, batch


def random_rigid(x: torch.Tensor, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(seed)))
    q = q * torch.linalg.det(q)  # a rotation
    return x @ q.T + torch.tensor([1.0, -2.0, 0.5], dtype=F64)


# ----------------------------------------------------------------- read and set


def test_torsion_angles_are_the_iupac_dihedrals_of_the_named_atoms():
    rotors, xyz, batch = ragged()
    got = bn.torsion_angles(xyz, rotors, batch=batch)
    offsets = np.cumsum([0] + [r.n_atoms for r in rotors])
    expected = []
    for r, o in zip(rotors, offsets.tolist()):
        for p, u, v, m in (r.torsions + o).tolist():
            chain = bn.ConstructionTable.chain(4)
            expected.append(float(bn.to_internal(xyz[[p, u, v, m]], chain).dihedrals[3]))
            assert {p, m}.isdisjoint({u, v})
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-12)
    # p is bonded to u, m to v
    for r in rotors:
        bonded = {frozenset(e) for e in r.connectivity.tolist()}
        for p, u, v, m in r.torsions.tolist():
            assert frozenset((p, u)) in bonded and frozenset((v, m)) in bonded and frozenset((u, v)) in bonded


def test_an_update_changes_the_torsion_by_minus_tau():
    rotors, xyz, batch = ragged(1)
    total = sum(r.n_bonds for r in rotors)
    taus = torch.linspace(-1.3, 1.1, total, dtype=F64)
    before = bn.torsion_angles(xyz, rotors, batch=batch)
    after = bn.torsion_angles(bn.update_torsions(xyz, rotors, taus, batch=batch), rotors, batch=batch)
    delta = torch.remainder(after - before + taus + math.pi, 2 * math.pi) - math.pi
    assert delta.abs().max() < 1e-10


def test_set_and_transfer_torsions():
    rotors, xyz, batch = ragged(2)
    total = sum(r.n_bonds for r in rotors)
    values = torch.linspace(-3.0, 3.1, total, dtype=F64)
    new = bn.set_torsions(xyz, rotors, values, batch=batch)
    read = bn.torsion_angles(new, rotors, batch=batch)
    assert (torch.remainder(read - values + math.pi, 2 * math.pi) - math.pi).abs().max() < 1e-10
    # the same molecules with other bond lengths and angles: transfer keeps each one's local geometry
    other = torch.cat([coordinates(*molecule(name)[:2], seed=20 + s) for s, name in enumerate(NAMES)])
    moved = bn.set_torsions(other, rotors, bn.torsion_angles(new, rotors, batch=batch), batch=batch)
    read = bn.torsion_angles(moved, rotors, batch=batch)
    assert (torch.remainder(read - values + math.pi, 2 * math.pi) - math.pi).abs().max() < 1e-10
    for r, a, b in zip(
        rotors,
        bn.split_atoms(other, [r.n_atoms for r in rotors]),
        bn.split_atoms(moved, [r.n_atoms for r in rotors]),
    ):
        i, j = r.connectivity.T
        assert np.abs(distances(a)[i, j] - distances(b)[i, j]).max() < 1e-10  # bond lengths kept
        fixed = r.fixed
        assert (a[fixed] - b[fixed]).abs().max() < 1e-10  # the unmoved part stays in place


def test_set_torsions_is_differentiable():
    pairs, n = with_hydrogens([(0, 1), (1, 2), (2, 3)], [4, 4, 4, 2])
    xyz = coordinates(pairs, n, seed=6).requires_grad_()
    rotors = bn.RotorTable.from_connectivity(pairs, n)
    values = torch.tensor([0.4, -2.0, 1.0], dtype=F64, requires_grad=True)

    def f(x, v):
        return bn.set_torsions(x, rotors, v)

    assert torch.autograd.gradcheck(f, (xyz, values))
    assert torch.autograd.gradgradcheck(f, (xyz, values))


def test_jacrev_over_updates_of_a_ragged_batch():
    """The batch vector is a constant captured by the function under the transform."""
    rotors, xyz, batch = ragged(4)
    total = sum(r.n_bonds for r in rotors)
    jac = torch.func.jacrev(lambda t: bn.update_torsions(xyz, rotors, t, batch=batch))(
        torch.zeros(total, dtype=F64)
    )
    assert jac.shape == (xyz.shape[0], 3, total)
    vol = torch.func.jacrev(lambda x: bn.torsion_log_volume(x, rotors, batch=batch))(xyz)
    assert vol.shape == (3, *xyz.shape) and torch.isfinite(vol).all()


# ----------------------------------------------------------------- matching


def test_match_torsions_recovers_the_updates_of_a_moved_copy():
    rotors, xyz, batch = ragged(3)
    total = sum(r.n_bonds for r in rotors)
    taus = torch.linspace(-2.0, 2.5, total, dtype=F64)
    target = random_rigid(bn.update_torsions(xyz, rotors, taus, batch=batch), seed=1)
    updates, fitted, rmsd = bn.match_torsions(xyz, target, rotors, batch=batch, steps=0)
    assert rmsd.shape == (3,) and rmsd.max() < 1e-6  # sqrt of a difference of sums: ~sqrt(eps) scale
    assert np.abs(distances(fitted) - distances(target)).max() < 1e-10
    assert (torch.remainder(updates - taus + math.pi, 2 * math.pi) - math.pi).abs().max() < 1e-10
    assert torch.allclose(fitted, bn.update_torsions(xyz, rotors, updates, batch=batch))


def test_match_torsions_improves_on_the_transfer_for_other_local_geometry():
    pairs, n, xyz = molecule("isopentane", seed=4)
    rotors = bn.RotorTable.from_connectivity(pairs, n)
    other = coordinates(pairs, n, seed=30)  # other bonds and angles
    target = random_rigid(bn.update_torsions(other, rotors, torch.full((rotors.n_bonds,), 0.8, dtype=F64)), 2)
    _, _, start = bn.match_torsions(xyz, target, rotors, steps=0)
    _, fitted, end = bn.match_torsions(xyz, target, rotors, steps=150, lr=0.02)
    assert end.shape == () and float(end) < 0.9 * float(start)
    # the reported RMSD is the superposed one: an independent SVD Kabsch agrees
    a = fitted.numpy() - fitted.numpy().mean(0)
    b = target.numpy() - target.numpy().mean(0)
    u, s, vt = np.linalg.svd(a.T @ b)
    s[-1] *= np.sign(np.linalg.det(u @ vt))
    kabsch = math.sqrt(max((np.square(a).sum() + np.square(b).sum() - 2 * s.sum()) / n, 0.0))
    assert abs(kabsch - float(end)) < 1e-8


def test_match_torsions_errors():
    pairs, n, xyz = molecule("isopentane")
    rotors = bn.RotorTable.from_connectivity(pairs, n)
    with pytest.raises(
        ValueError, match=r"target must be a tensor of the shape of xyz \(17, 3\), got \(16, 3\)"
    ):
        bn.match_torsions(xyz, xyz[1:], rotors)
    with pytest.raises(ValueError, match="steps must be a non-negative int, got -1"):
        bn.match_torsions(xyz, xyz, rotors, steps=-1)
    with pytest.raises(ValueError, match="lr must be positive, got 0"):
        bn.match_torsions(xyz, xyz, rotors, lr=0)
    with pytest.raises(ValueError, match=r"values has 2 values, but the molecules have 4 rotatable bonds"):
        bn.set_torsions(xyz, rotors, torch.zeros(2, dtype=F64))
    with pytest.raises(ValueError, match=r"xyz has 16 atoms, but the molecules have 17"):
        bn.torsion_angles(xyz[1:], rotors)


# ----------------------------------------------------------------- log-volume


def log_volume_oracle(xyz: torch.Tensor, rotors: bn.RotorTable) -> float:
    """0.5 log det(J^T J), J the autograd Jacobian of update_torsions at 0 projected off rigid motions."""
    n = xyz.shape[0]
    jac = torch.func.jacrev(lambda t: bn.update_torsions(xyz, rotors, t))(
        torch.zeros(rotors.n_bonds, dtype=F64)
    ).reshape(3 * n, -1)
    p = xyz - xyz.mean(0)
    rigid = [torch.eye(3, dtype=F64)[c].expand(n, 3) for c in range(3)]
    rigid += [torch.linalg.cross(torch.eye(3, dtype=F64)[c].expand(n, 3), p) for c in range(3)]
    q, _ = torch.linalg.qr(torch.stack([r.reshape(-1) for r in rigid], 1))
    jp = jac - q @ (q.T @ jac)
    return float(0.5 * torch.linalg.slogdet(jp.T @ jp)[1])


@pytest.mark.parametrize("name", NAMES)
def test_log_volume_equals_the_autograd_oracle(name):
    pairs, n, xyz = molecule(name, seed=5)
    for moving in ("smaller", "larger"):  # the side that turns does not matter
        rotors = bn.RotorTable.from_connectivity(pairs, n, moving=moving)
        got = bn.torsion_log_volume(xyz, rotors)
        assert got.shape == ()
        assert abs(float(got) - log_volume_oracle(xyz, rotors)) < 1e-10
    # invariant to a rigid motion of the molecule
    assert abs(float(bn.torsion_log_volume(random_rigid(xyz, 3), rotors)) - float(got)) < 1e-10


def test_log_volume_ragged_batch_and_molecule_without_bonds():
    rotors, xyz, batch = ragged(6)
    water = bn.RotorTable([(0, 1), (0, 2)], 3)
    h2o = torch.tensor([[0.0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]], dtype=F64)
    flat = torch.cat([xyz, h2o])
    got = bn.torsion_log_volume(flat, [*rotors, water], batch=torch.cat([batch, torch.full((3,), 3)]))
    parts = bn.split_atoms(xyz, [r.n_atoms for r in rotors])
    expected = [float(bn.torsion_log_volume(x, r)) for x, r in zip(parts, rotors)] + [0.0]
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-10)
    # copies (..., N, 3) and vmap
    pairs, n, one = molecule("ring", seed=7)
    r = bn.RotorTable.from_connectivity(pairs, n)
    copies = torch.stack(
        [one, random_rigid(one, 4), bn.update_torsions(one, r, torch.ones(r.n_bonds, dtype=F64))]
    )
    many = bn.torsion_log_volume(copies, r)
    assert many.shape == (3,)
    assert torch.allclose(many, torch.func.vmap(lambda x: bn.torsion_log_volume(x, r))(copies), atol=1e-12)
    assert abs(float(many[0] - many[1])) < 1e-10 and abs(float(many[0] - many[2])) > 1e-3


def test_log_volume_gradients():
    pairs, n = with_hydrogens([(0, 1), (1, 2), (2, 3)], [4, 4, 4, 2])
    xyz = coordinates(pairs, n, seed=8).requires_grad_()
    rotors = bn.RotorTable.from_connectivity(pairs, n)
    assert torch.autograd.gradcheck(lambda x: bn.torsion_log_volume(x, rotors), (xyz,))
    assert torch.autograd.gradgradcheck(lambda x: bn.torsion_log_volume(x, rotors), (xyz,))
    # a ragged batch pads the molecule with fewer bonds (zero-length axes): still finite to second order
    pentane, butane = (bn.RotorTable.from_connectivity([(k, k + 1) for k in range(n - 1)], n) for n in (5, 4))
    chains = bn.pack_tables([bn.ConstructionTable.chain(5), bn.ConstructionTable.chain(4)])
    flat = bn.to_cartesian(
        torch.full((9,), 1.5, dtype=F64),
        torch.full((9,), 1.9, dtype=F64),
        torch.linspace(-2, 2, 9, dtype=F64),
        chains,
    ).requires_grad_()
    batch = torch.tensor([0] * 5 + [1] * 4)
    assert (pentane.n_bonds, butane.n_bonds) == (2, 1)
    assert torch.autograd.gradgradcheck(
        lambda x: bn.torsion_log_volume(x, [pentane, butane], batch=batch), (flat,)
    )


# ----------------------------------------------------------------- the peer, where its checkout is given


def test_log_volume_equals_torsional_diffusion():
    """torsional diffusion's own log_det_jac (TORSIONAL_DIFFUSION_PATH: its checkout)."""
    path = os.environ.get("TORSIONAL_DIFFUSION_PATH")
    if not path:
        pytest.skip("TORSIONAL_DIFFUSION_PATH is not set (a checkout of gcorso/torsional-diffusion)")
    pytest.importorskip("torch_geometric", reason="torsional diffusion's utils need torch_geometric")
    pytest.importorskip("rdkit", reason="torsional diffusion's likelihood imports RDKit")
    for name in [m for m in sys.modules if m == "utils" or m.startswith("utils.")]:
        del sys.modules[name]  # DiffDock's package has the same name
    sys.path.insert(0, path)
    try:
        from diffusion.likelihood import log_det_jac
        from torch_geometric.data import Data
        from utils.torsion import get_transformation_mask
    finally:
        sys.path.remove(path)
    from rdkit import Chem
    from rdkit.Chem import AllChem

    def rdkit_conformer(smiles: str):
        mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
        AllChem.EmbedMolecule(mol, randomSeed=7)
        pairs = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()]
        return pairs, mol.GetNumAtoms(), torch.tensor(mol.GetConformer().GetPositions(), dtype=F64)

    drug_like = ["CC(C)Cc1ccc(cc1)C(C)C(=O)O", "CC(=O)Nc1ccc(O)cc1", "CN1CCC[C@H]1c1cccnc1", "OCCOCCN(CC)CC"]
    for pairs, n, xyz in [molecule(name, seed=9) for name in NAMES] + [rdkit_conformer(s) for s in drug_like]:
        both = [(i, j) for i, j in pairs] + [(j, i) for i, j in pairs]
        edge_index = torch.tensor(sorted(both)).T  # each bond twice, (i, j) beside (j, i) as PyG gives it
        order = [
            k for i, j in sorted(pairs) for k in (sorted(both).index((i, j)), sorted(both).index((j, i)))
        ]
        edge_index = edge_index[:, order]
        data = Data(edge_index=edge_index, pos=xyz.clone(), num_nodes=n)
        data.edge_mask, data.mask_rotate = get_transformation_mask(data)
        data.edge_mask = torch.tensor(data.edge_mask)
        theirs = log_det_jac(data)
        rotors = bn.RotorTable.from_connectivity(pairs, n)
        assert int(data.edge_mask.sum()) == rotors.n_bonds
        assert abs(float(bn.torsion_log_volume(xyz, rotors)) - theirs) < 1e-8


# ----------------------------------------------------------------- PyG batches and RDKit molecules


def test_rotor_tables_of_a_pyg_batch():
    pyg = pytest.importorskip("torch_geometric.data", reason="torch_geometric is an optional extra")
    mols = [molecule(name, seed=s) for s, name in enumerate(NAMES)]
    datas = []
    for pairs, n, xyz in mols:
        edge_index = torch.tensor([e for a, b in pairs for e in ((a, b), (b, a))]).T
        datas.append(pyg.Data(edge_index=edge_index, pos=xyz, num_nodes=n))
    data = pyg.Batch.from_data_list(datas)
    rotors = bn.rotor_tables(data)
    assert rotors == [bn.RotorTable.from_connectivity(p, n) for p, n, _ in mols]  # the cached objects
    assert rotors[0] is bn.RotorTable.from_connectivity(mols[0][0], mols[0][1])
    taus = torch.linspace(-1.0, 2.0, sum(r.n_bonds for r in rotors), dtype=F64)
    new = bn.update_torsions(data.pos, rotors, taus, batch=data.batch)
    expected = torch.cat([x for _, _, x in mols])
    assert torch.equal(new, bn.update_torsions(expected, rotors, taus))
    # a single Data, and the batch vector in place of ptr, give the same tables
    assert bn.rotor_tables(datas[1]) == [rotors[1]]
    del data.ptr
    assert bn.rotor_tables(data) == rotors


def test_rotor_tables_duck_typed_and_errors():
    from types import SimpleNamespace

    edges = torch.tensor([[0, 1], [1, 2], [2, 3], [4, 5], [5, 6], [6, 7]]).T
    data = SimpleNamespace(edge_index=edges, num_nodes=8, batch=torch.tensor([0] * 4 + [1] * 4))
    assert [r.n_bonds for r in bn.rotor_tables(data)] == [1, 1]
    assert [r.bonds.tolist() for r in bn.rotor_tables(data, moving="larger")] == [[[1, 2]], [[1, 2]]]
    # the batch cache is keyed by content: other edges in the same tensor give other tables
    edges[:, 2] = torch.tensor([1, 3])  # molecule 0 becomes a star: nothing turns
    assert [r.n_bonds for r in bn.rotor_tables(data)] == [0, 1]
    edges[:, 2] = torch.tensor([2, 3])
    with pytest.raises(ValueError, match=r"edge 1 \(1, 5\) joins molecule 0 and molecule 1"):
        bn.rotor_tables(
            SimpleNamespace(edge_index=torch.tensor([[0, 1], [1, 5]]).T, num_nodes=8, ptr=[0, 4, 8])
        )
    with pytest.raises(ValueError, match=r"ptr must rise from 0 to the 8 atoms, got \[0, 4, 7\]"):
        bn.rotor_tables(SimpleNamespace(edge_index=edges, num_nodes=8, ptr=[0, 4, 7]))
    with pytest.raises(ValueError, match="batch must be 8 sorted non-negative molecule indices"):
        bn.rotor_tables(SimpleNamespace(edge_index=edges, num_nodes=8, batch=torch.tensor([1] * 4 + [0] * 4)))
    with pytest.raises(ValueError, match=r"edge_index must be \(2, E\) integer atom pairs"):
        bn.rotor_tables(SimpleNamespace(edge_index=edges.T, num_nodes=8))
    with pytest.raises(ValueError, match=r"edge_index names atoms outside 0\.\.7"):
        bn.rotor_tables(SimpleNamespace(edge_index=edges + 1, num_nodes=8))
    with pytest.raises(TypeError, match="molecules must be a torch_geometric Data/Batch"):
        bn.rotor_tables(42)
    with pytest.raises(TypeError, match=r"molecules\[1\] must be an RDKit molecule, got int"):
        bn.rotor_tables([SimpleNamespace(GetBonds=list, GetNumAtoms=lambda: 0), 3])
    with pytest.raises(ValueError, match="moving must be"):
        bn.rotor_tables(data, moving="left")  # type: ignore[arg-type]


def test_rotor_tables_of_rdkit_molecules():
    chem = pytest.importorskip("rdkit.Chem", reason="RDKit is an optional extra (interop)")
    mols = [chem.AddHs(chem.MolFromSmiles(s)) for s in ("CCCC", "CC(=O)Nc1ccc(O)cc1")]
    rotors = bn.rotor_tables(mols)
    for mol, r in zip(mols, rotors):
        pairs = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()]
        assert r is bn.RotorTable.from_connectivity(pairs, mol.GetNumAtoms())
    assert bn.rotor_tables(mols[0]) == rotors[:1]
    assert [r.n_bonds for r in rotors] == [3, 4]  # butane: two methyls and C1-C2; paracetamol: no ring bond


# ----------------------------------------------------------------- DiffDock's alignment after the update


def kabsch_numpy(mobile: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``mobile`` superposed onto ``reference`` by an SVD Kabsch (reflection fixed), float64."""
    cm, cr = mobile.mean(0), reference.mean(0)
    u, _, vt = np.linalg.svd((mobile - cm).T @ (reference - cr))
    d = np.sign(np.linalg.det(u @ vt))
    rot = u @ np.diag([1.0, 1.0, d]) @ vt  # x -> x @ rot
    return (mobile - cm) @ rot + cr


def test_align_superposes_each_molecule_onto_its_input():
    rotors, xyz, batch = ragged(8)
    total = sum(r.n_bonds for r in rotors)
    taus = torch.linspace(-2.5, 2.0, total, dtype=F64)
    free = bn.update_torsions(xyz, rotors, taus, batch=batch)
    aligned = bn.update_torsions(xyz, rotors, taus, batch=batch, align=True)
    sizes = [r.n_atoms for r in rotors]
    for f, a, x in zip(
        bn.split_atoms(free, sizes), bn.split_atoms(aligned, sizes), bn.split_atoms(xyz, sizes)
    ):
        expected = kabsch_numpy(f.numpy(), x.numpy())
        assert np.abs(a.numpy() - expected).max() < 1e-10
        assert np.abs(distances(a) - distances(f)).max() < 1e-10  # a rigid motion of the update
        assert (a - f).abs().max() > 1e-3  # and not the identity
    # equivariant: a rotated input gives the rotated result
    moved = random_rigid(xyz, 5)
    turned = bn.update_torsions(moved, rotors, taus, batch=batch, align=True)
    assert (turned - random_rigid(aligned, 5)).abs().max() < 1e-10


def test_align_gradients_vmap_and_nan():
    pairs, n = with_hydrogens([(0, 1), (1, 2), (2, 3)], [4, 4, 4, 2])
    xyz = coordinates(pairs, n, seed=11).requires_grad_()
    rotors = bn.RotorTable.from_connectivity(pairs, n)
    taus = torch.tensor([0.3, -1.1, 2.0], dtype=F64, requires_grad=True)

    def f(x, t):
        return bn.update_torsions(x, rotors, t, align=True)

    assert torch.autograd.gradcheck(f, (xyz, taus))
    assert torch.autograd.gradgradcheck(f, (xyz, taus))
    many = torch.randn(4, 3, dtype=F64, generator=torch.Generator().manual_seed(2))
    x = xyz.detach()
    mapped = torch.func.vmap(lambda t: f(x, t))(many)
    assert (mapped - f(x.expand(4, n, 3), many)).abs().max() < 1e-12
    # a NaN update makes its molecule NaN, the other molecules stay finite
    rot, xyz3, batch = ragged(9)
    total = sum(r.n_bonds for r in rot)
    bad = torch.zeros(total, dtype=F64)
    bad[0] = float("nan")
    out = bn.update_torsions(xyz3, rot, bad, batch=batch, align=True)
    first = batch == 0
    assert torch.isnan(out[first]).all() and torch.isfinite(out[~first]).all()
    assert (out[~first] - xyz3[~first]).abs().max() < 1e-10  # zero updates, aligned onto themselves


# ----------------------------------------------------------------- a chemist's rule


def test_chemistry_rule_on_a_graph():
    pairs, n = with_hydrogens([(0, 1), (1, 2), (2, 3)], [4, 4, 4, 4])  # butane
    orders = [1] * len(pairs)
    elements = ["C"] * 4 + ["H"] * (n - 4)
    assert bn.rotatable_bonds(pairs, n).shape == (3, 2)
    chem = bn.rotatable_bonds(pairs, n, rule="chemistry", bond_orders=orders, elements=elements)
    assert chem.tolist() == [[2, 1]]  # the methyl rotors are terminal
    # a double bond and a triple bond are not rotors; atomic numbers work as well as symbols
    z = [6] * 4 + [1] * (n - 4)
    double = bn.rotatable_bonds(pairs, n, rule="chemistry", bond_orders=[1, 2, 1] + [1] * (n - 4), elements=z)
    assert double.tolist() == []
    with pytest.raises(ValueError, match="rule='chemistry' needs bond_orders"):
        bn.rotatable_bonds(pairs, n, rule="chemistry")
    with pytest.raises(ValueError, match=r"bond_orders has 2 values, but connectivity has 13 pairs"):
        bn.rotatable_bonds(pairs, n, rule="chemistry", bond_orders=[1, 1], elements=z)
    with pytest.raises(ValueError, match=r"elements must have one entry per atom \(14\)"):
        bn.rotatable_bonds(pairs, n, rule="chemistry", bond_orders=orders, elements=z[:3])
    with pytest.raises(ValueError, match=r"unknown element .Qq. at index 3"):
        bn.rotatable_bonds(
            pairs, n, rule="chemistry", bond_orders=orders, elements=["C"] * 3 + ["Qq"] + ["H"] * (n - 4)
        )
    with pytest.raises(ValueError, match=r"the pair \(1, 0\) is given twice with the orders 1.0 and 2.0"):
        bn.rotatable_bonds([*pairs, (1, 0)], n, rule="chemistry", bond_orders=[*orders, 2], elements=z)
    with pytest.raises(ValueError, match="rule must be 'graph' or 'chemistry', got 'rdkit'"):
        bn.rotatable_bonds(pairs, n, rule="rdkit")  # type: ignore[arg-type]


def test_chemistry_rule_equals_rdkit_rotatable_bond_smarts():
    chem = pytest.importorskip("rdkit.Chem", reason="RDKit is an optional extra (interop)")
    from rdkit.Chem import Lipinski

    # no amides here (RDKit's pattern excludes only N-H amides, ours every amide)
    smiles = [
        "CC(=O)Oc1ccccc1C(=O)O",
        "CC(C)Cc1ccc(cc1)C(C)C(=O)O",
        "CN1CCC[C@H]1c1cccnc1",
        "OCCOCCN(CC)CC",
        "CCOC(=O)C1=C(C)NC(C)=C(C1c1ccccc1[N+](=O)[O-])C(=O)OC",
        "c1ccccc1-c1ccccc1",
        "CC#CCC",
    ]
    for s in smiles:
        mol = chem.AddHs(chem.MolFromSmiles(s))
        ours = {frozenset(b) for b in bn.rotor_tables(mol, rule="chemistry")[0].bonds.tolist()}
        heavy = chem.RemoveHs(mol)  # hydrogens were appended: heavy-atom indices agree
        theirs = {frozenset(m) for m in heavy.GetSubstructMatches(Lipinski.RotatableBondSmarts)}
        assert ours == theirs, s
    # paracetamol: the amide C-N is excluded here, kept by the graph rule
    para = chem.AddHs(chem.MolFromSmiles("CC(=O)Nc1ccc(O)cc1"))
    assert bn.rotor_tables(para)[0].n_bonds == 4
    assert bn.rotor_tables(para, rule="chemistry")[0].bonds.tolist() in ([[3, 4]], [[4, 3]])
    with pytest.raises(
        ValueError, match="rule='chemistry' needs bond orders, which a PyG batch does not carry"
    ):
        from types import SimpleNamespace

        bn.rotor_tables(
            SimpleNamespace(edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=1), rule="chemistry"
        )


def test_stereocentres_keep_their_cip_labels():
    chem = pytest.importorskip("rdkit.Chem", reason="RDKit is an optional extra (interop)")
    from rdkit.Chem import AllChem
    from rdkit.Geometry import Point3D

    mol = chem.AddHs(chem.MolFromSmiles("C[C@H](N)C(=O)N[C@@H](Cc1ccccc1)C(=O)O[C@@H](C)CC"))
    AllChem.EmbedMolecule(mol, randomSeed=3)

    def labels(xyz: torch.Tensor) -> dict[int, str]:
        conf = mol.GetConformer()
        for i, (x, y, z) in enumerate(xyz.tolist()):
            conf.SetAtomPosition(i, Point3D(x, y, z))
        chem.AssignStereochemistryFrom3D(mol)
        return {a.GetIdx(): a.GetProp("_CIPCode") for a in mol.GetAtoms() if a.HasProp("_CIPCode")}

    xyz = torch.tensor(mol.GetConformer().GetPositions(), dtype=F64)
    before = labels(xyz)
    assert len(before) == 3
    rotors = bn.rotor_tables(mol)[0]
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        taus = (2 * torch.rand(rotors.n_bonds, generator=gen, dtype=F64) - 1) * math.pi
        for moved in (
            bn.update_torsions(xyz, rotors, taus),
            bn.update_torsions(xyz, rotors, taus, align=True),
        ):
            assert labels(moved) == before
    # a mirror image flips them: the check can fail
    assert labels(xyz * torch.tensor([-1.0, 1.0, 1.0], dtype=F64)) != before


# ----------------------------------------------------------------- the peers' own updates (their checkouts)


def _peer_torsion_module(env: str, what: str):
    path = os.environ.get(env)
    if not path:
        pytest.skip(f"{env} is not set (a checkout of {what})")
    pytest.importorskip("torch_geometric", reason="the peers' utils/torsion.py imports torch_geometric")
    pytest.importorskip("rdkit", reason="the peers' molecules come from RDKit")
    for name in [m for m in sys.modules if m == "utils" or m.startswith("utils.")]:
        del sys.modules[name]  # both peers name their package "utils"
    sys.path.insert(0, path)
    try:
        import utils.torsion as torsion
    finally:
        sys.path.remove(path)
    return path, torsion


def test_matches_diffdock_on_its_1a0q_ligand():
    path, torsion = _peer_torsion_module("DIFFDOCK_PATH", "gcorso/DiffDock")
    from rdkit import Chem

    mol = Chem.RemoveHs(Chem.MolFromMolFile(os.path.join(path, "data", "1a0q", "1a0q_ligand.sdf")))
    rotors = bn.rotor_tables(mol)[0]
    pos = torch.tensor(mol.GetConformer().GetPositions(), dtype=F64)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        taus = (2 * torch.rand(rotors.n_bonds, generator=gen, dtype=F64) - 1) * math.pi
        theirs = torsion.modify_conformer_torsion_angles(
            pos.numpy(), rotors.bonds, rotors.moving.numpy(), taus.numpy(), as_numpy=True
        )
        ours = bn.update_torsions(pos, rotors, taus)
        assert np.abs(ours.numpy() - theirs).max() < 1e-8  # the unmoved atoms stay: the same frame
    zero = bn.update_torsions(pos, rotors, torch.zeros(rotors.n_bonds, dtype=F64))
    assert (zero - pos).abs().max() < 1e-10


def test_matches_torsional_diffusion_on_a_ragged_batch():
    _, torsion = _peer_torsion_module("TORSIONAL_DIFFUSION_PATH", "gcorso/torsional-diffusion")
    from rdkit import Chem
    from rdkit.Chem import AllChem
    from torch_geometric.data import Batch, Data

    smiles = ["CC(C)Cc1ccc(cc1)C(C)C(=O)O", "CC(=O)Nc1ccc(O)cc1", "CN1CCC[C@H]1c1cccnc1", "OCCOCCN(CC)CC"]
    datas = []
    for k, s in enumerate(smiles):
        mol = Chem.AddHs(Chem.MolFromSmiles(s))
        AllChem.EmbedMolecule(mol, randomSeed=k)
        pairs = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()]
        edge_index = torch.tensor([e for a, b in pairs for e in ((a, b), (b, a))]).T
        pos = torch.tensor(mol.GetConformer().GetPositions(), dtype=F64)
        data = Data(edge_index=edge_index, pos=pos, num_nodes=mol.GetNumAtoms())
        edge_mask, data.mask_rotate = torsion.get_transformation_mask(data)
        data.edge_mask = torch.tensor(edge_mask)
        datas.append(data)
    batch = Batch.from_data_list(datas)
    rotors = bn.rotor_tables(batch)
    gen = torch.Generator().manual_seed(1)
    taus = [(2 * torch.rand(r.n_bonds, generator=gen, dtype=F64) - 1) * math.pi for r in rotors]
    ours = bn.update_torsions(batch.pos, rotors, torch.cat(taus), batch=batch.batch)
    for data, r, t, mine in zip(datas, rotors, taus, bn.split_atoms(ours, [r.n_atoms for r in rotors])):
        peer_edges = data.edge_index.T[data.edge_mask].tolist()
        assert sorted(map(tuple, peer_edges)) == sorted(
            map(tuple, r.bonds.tolist())
        )  # same bonds, same sides
        order = [peer_edges.index(b) for b in r.bonds.tolist()]
        peer_taus = np.zeros(len(order))
        peer_taus[order] = t.numpy()
        theirs = torsion.modify_conformer(
            data.pos.clone(), data.edge_index.T[data.edge_mask], data.mask_rotate, peer_taus, as_numpy=True
        )
        assert np.abs(distances(mine) - distances(theirs)).max() < 1e-8
        assert np.abs(mine.numpy() - theirs).max() < 1e-8
