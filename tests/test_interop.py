"""Adapters to optional packages: chemcoord, ASE, RDKit (each test module part skips without them)."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
import torch

from batched_nerf import ZMatrix
from batched_nerf.data import available, load
from batched_nerf.formats import read_zmat


def molecule_zmatrix(name: str) -> ZMatrix:
    return load(name)


def test_optional_packages_not_imported_eagerly() -> None:
    code = (
        "import sys, batched_nerf, batched_nerf.formats; "
        "print(sorted(m for m in ('chemcoord', 'ase', 'rdkit', 'pandas', 'MDAnalysis', 'mdtraj') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ chemcoord
@pytest.fixture(scope="module")
def cc():  # type: ignore[no-untyped-def]
    return pytest.importorskip("chemcoord", reason="chemcoord is not installed (optional)")


def cartesian_of(cc, name: str):  # type: ignore[no-untyped-def]
    import pandas as pd

    mol = load(name)
    xyz = mol.to_cartesian().numpy()
    frame = pd.DataFrame({"atom": mol.elements, "x": xyz[:, 0], "y": xyz[:, 1], "z": xyz[:, 2]})
    return cc.Cartesian(frame)


def xyz_of(cartesian, index) -> np.ndarray:  # type: ignore[no-untyped-def]
    return cartesian.loc[list(index), ["x", "y", "z"]].values.astype(np.float64)


@pytest.mark.parametrize("name", available())
def test_from_chemcoord_reproduces_get_cartesian_exactly(cc, name: str) -> None:  # type: ignore[no-untyped-def]
    from batched_nerf.formats.chemcoord import from_chemcoord, to_chemcoord

    zmat = cartesian_of(cc, name).get_zmat()
    z = from_chemcoord(zmat)
    assert z.n_real == len(zmat) and z.real_labels == [str(i) for i in zmat.index]
    assert z.real_elements == list(zmat["atom"])
    assert z.n_atoms > z.n_real and not z.real[z.n_real :].any()
    # the same coordinates, row for row, not just up to a rigid motion
    x = z.to_cartesian()
    np.testing.assert_allclose(x.numpy(), xyz_of(zmat.get_cartesian(), zmat.index), atol=1e-10)
    # and the molecule's own geometry
    np.testing.assert_allclose(x.numpy(), load(name).to_cartesian().numpy()[list(zmat.index)], atol=1e-8)
    # round trip: identical Zmat
    again = to_chemcoord(z)
    assert list(again.index) == list(zmat.index)
    for col in ("atom", "b", "a", "d"):
        assert list(again[col]) == list(zmat[col]), col
    for col in ("bond", "angle", "dihedral"):
        np.testing.assert_allclose(again[col].values, zmat[col].values, atol=1e-10)


def test_chemcoord_dihedral_sign_is_opposite_to_iupac(cc) -> None:  # type: ignore[no-untyped-def]
    from batched_nerf.core.convert import to_internal
    from batched_nerf.core.table import ConstructionTable
    from batched_nerf.formats.chemcoord import from_chemcoord

    zmat = cartesian_of(cc, "alanine_dipeptide").get_zmat()
    x = xyz_of(zmat.get_cartesian(), zmat.index)
    row_of = {label: k for k, label in enumerate(zmat.index)}
    rows = [k for k in range(len(zmat)) if all(zmat[c].iloc[k] in row_of for c in "bad")]
    assert len(rows) > 10
    refs = [[row_of[zmat[c].iloc[k]] for c in "bad"] for k in rows]
    # measure IUPAC dihedrals of (x_i, x_b, x_a, x_d) directly on the built coordinates
    for k, (b, a, d) in zip(rows, refs):
        four = np.stack([x[d], x[a], x[b], x[k]])
        ic = to_internal(torch.from_numpy(four), ConstructionTable.chain(4))
        iupac = float(ic.dihedrals[3])
        assert np.isclose(np.angle(np.exp(1j * (iupac + np.radians(zmat["dihedral"].iloc[k])))), 0, atol=1e-9)
    z = from_chemcoord(zmat)
    np.testing.assert_allclose(z.dihedrals[: len(zmat)].numpy(), -np.radians(zmat["dihedral"].values))


@pytest.mark.parametrize("name", available())
def test_to_chemcoord_of_our_tables(cc, name: str) -> None:  # type: ignore[no-untyped-def]
    from batched_nerf.formats.chemcoord import from_chemcoord, to_chemcoord

    z = molecule_zmatrix(name)
    zmat = to_chemcoord(z)
    assert sorted(zmat.index) == list(range(z.n_real))
    # chemcoord builds exactly our canonical frame (seeds at origin, +x, xy-plane)
    np.testing.assert_allclose(
        xyz_of(zmat.get_cartesian(), range(z.n_real)), z.to_cartesian().numpy(), atol=1e-10
    )
    back = from_chemcoord(zmat)
    order = [int(label) for label in back.real_labels or []]
    np.testing.assert_allclose(back.to_cartesian().numpy(), z.to_cartesian().numpy()[order], atol=1e-10)


def test_chemcoord_text_example(cc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from batched_nerf.formats.chemcoord import from_chemcoord, to_chemcoord

    # chemcoord's zmat text format, upper triangle left out, as in its documentation
    text = "O\nH 1 0.96\nH 1 0.96 2 104.5\n"
    path = tmp_path / "water.zmat"
    path.write_text(text)
    zmat = cc.Zmat.read_zmat(str(path))
    z = from_chemcoord(zmat)
    x = z.to_cartesian()
    np.testing.assert_allclose(x.numpy(), xyz_of(zmat.get_cartesian(), zmat.index), atol=1e-12)
    assert torch.isclose(torch.dist(x[0], x[1]), torch.tensor(0.96, dtype=torch.float64))
    out = tmp_path / "again.zmat"
    to_chemcoord(z).to_zmat(str(out))
    again = cc.Zmat.read_zmat(str(out))
    np.testing.assert_allclose(xyz_of(again.get_cartesian(), again.index), x.numpy(), atol=1e-5)


def test_to_chemcoord_gaussian_dummy_and_errors(cc) -> None:  # type: ignore[no-untyped-def]
    from batched_nerf.core.table import ConstructionTable
    from batched_nerf.formats.chemcoord import from_chemcoord, to_chemcoord

    z = read_zmat(io.StringIO("C\nX 1 1.0\nH 1 1.09 2 90.0\nH 1 1.09 2 90.0 3 180.0\n"))
    zmat = to_chemcoord(z)
    assert list(zmat["atom"]) == ["C", "X", "H", "H"]
    np.testing.assert_allclose(
        xyz_of(zmat.get_cartesian(), range(4)), z.to_cartesian(dummies=True).numpy(), atol=1e-12
    )
    with pytest.raises(ValueError, match="one conformation"):
        to_chemcoord(ZMatrix(z.table, z.bonds, z.angles, z.dihedrals.expand(2, 4), elements=z.elements))
    with pytest.raises(ValueError, match="no elements"):
        to_chemcoord(ZMatrix(z.table, z.bonds, z.angles, z.dihedrals))
    table = ConstructionTable([[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2]], fixed=[0, 1, 2])
    anchored = ZMatrix(
        table, torch.ones(4), torch.ones(4), torch.ones(4), torch.eye(3) * 2, elements=list("CCCC")
    )
    with pytest.raises(ValueError, match="absolute references"):
        to_chemcoord(anchored)
    with pytest.raises(TypeError, match="chemcoord.Zmat"):
        from_chemcoord(z)
    with pytest.raises(TypeError, match="ZMatrix"):
        to_chemcoord(zmat)


# ------------------------------------------------------------------------ ASE
def test_ase_roundtrip() -> None:
    pytest.importorskip("ase", reason="ASE is not installed (optional)")
    import ase

    from batched_nerf.formats.ase import from_ase, to_ase

    mol = load("alanine_dipeptide")
    ref = mol.to_cartesian().numpy()
    atoms = to_ase(mol.elements, torch.from_numpy(ref))
    assert isinstance(atoms, ase.Atoms) and len(atoms) == 22
    elements, xyz = from_ase(atoms)
    assert elements == mol.elements
    np.testing.assert_array_equal(xyz, ref)
    frames = to_ase(mol.elements, np.stack([ref, ref + 1]))
    assert isinstance(frames, list) and len(frames) == 2
    elements, xyz = from_ase(frames)
    assert xyz.shape == (2, 22, 3)
    np.testing.assert_allclose(xyz[1], ref + 1)
    with pytest.raises(ValueError, match="shape"):
        to_ase(mol.elements[:3], ref)
    with pytest.raises(TypeError, match="ase.Atoms"):
        from_ase([])
    with pytest.raises(ValueError, match="different elements"):
        from_ase([atoms, ase.Atoms("H2", positions=[[0, 0, 0], [0.7, 0, 0]])])


# ---------------------------------------------------------------------- RDKit
def test_rdkit_table_and_coordinates() -> None:
    pytest.importorskip("rdkit", reason="RDKit is not installed (optional)")
    from rdkit import Chem
    from rdkit.Chem import AllChem

    from batched_nerf.core.convert import to_internal
    from batched_nerf.formats.rdkit import table_from_rdkit, xyz_from_rdkit

    mol = Chem.AddHs(Chem.MolFromSmiles("CC(=O)NC(C)C(=O)NC"))
    graph_only = table_from_rdkit(mol)  # no conformer yet
    assert graph_only.n_atoms == mol.GetNumAtoms() == 22
    with pytest.raises(ValueError, match="no conformers"):
        xyz_from_rdkit(mol)
    AllChem.EmbedMultipleConfs(mol, numConfs=3, randomSeed=7)
    table = table_from_rdkit(mol)
    elements, xyz = xyz_from_rdkit(mol)
    assert elements[:3] == ["C", "C", "O"] and xyz.shape == (3, 22, 3)
    # every bond reference is a real bond of the molecule
    bonded = {frozenset((b.GetBeginAtomIdx(), b.GetEndAtomIdx())) for b in mol.GetBonds()}
    refs = table.refs.tolist()
    assert all(frozenset((i, row[0])) in bonded for i, row in enumerate(refs) if row[0] >= 0)
    # and the table reproduces the conformers (up to a rigid motion)
    x = torch.from_numpy(xyz)
    ic = to_internal(x, table)
    z = ZMatrix(table, ic.bonds, ic.angles, ic.dihedrals, elements=elements)
    rebuilt = z.to_cartesian()
    pd = torch.cdist(rebuilt, rebuilt) - torch.cdist(x, x)
    assert pd.abs().max() < 1e-8
    with pytest.raises(TypeError, match="Mol"):
        table_from_rdkit("CCO")
