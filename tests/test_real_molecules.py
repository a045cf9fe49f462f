"""Real molecules from outside the project: ASE's G2 and S22 sets, RDKit salts, a solvated molecule.

Every structure goes XYZ -> Z-matrix -> XYZ and must come back with every
interatomic distance to 1e-6 A (float64), through the API, the Gaussian text
formats, chemcoord and the command line. Several molecules in one structure
(dimers, salts, solvent) are linked into one build.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import batched_nerf as bn
from batched_nerf.cli import main
from batched_nerf.formats import (
    read_gaussian,
    read_xyz,
    read_zmat,
    write_gaussian,
    write_xyz,
    write_zmat,
)

TOL = 1e-6  # Angstrom, on every interatomic distance
LINEAR_DEG = 5.0


def pdist(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.linalg.norm(x[:, None, :] - x[None, :, :], axis=-1)


def worst(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(pdist(a) - pdist(b)).max()) if len(a) > 1 else 0.0


def fragments(connectivity: np.ndarray, n: int) -> np.ndarray:
    label = np.arange(n)
    for _ in range(n):
        changed = False
        for i, j in np.asarray(connectivity).reshape(-1, 2).tolist():
            lo = min(label[i], label[j])
            if label[i] != lo or label[j] != lo:
                label[i] = label[j] = lo
                changed = True
        if not changed:
            break
    return np.unique(label, return_inverse=True)[1]


def g2() -> object:
    return pytest.importorskip("ase.collections", reason="ASE is not installed (optional)").g2


def s22() -> object:
    return pytest.importorskip("ase.collections", reason="ASE is not installed (optional)").s22


def _g2_names() -> list[str]:
    try:
        from ase.collections import g2 as coll
    except ImportError:
        return ["needs-ase"]
    return list(coll.names)


def _s22_names() -> list[str]:
    try:
        from ase.collections import s22 as coll
    except ImportError:
        return ["needs-ase"]
    return list(coll.names)


def _atoms(collection: object, name: str) -> tuple[list[str], np.ndarray]:
    atoms = collection[name]  # type: ignore[index]
    return list(atoms.get_chemical_symbols()), np.array(atoms.get_positions(), dtype=np.float64)


def rdkit_system(smiles: str, seed: int = 7) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Elements, coordinates and RDKit's own bond graph of an embedded SMILES."""
    Chem = pytest.importorskip("rdkit.Chem", reason="RDKit is not installed (optional)")
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
    assert AllChem.EmbedMolecule(mol, randomSeed=seed) == 0
    AllChem.MMFFOptimizeMolecule(mol)
    elements = [a.GetSymbol() for a in mol.GetAtoms()]
    xyz = np.array(mol.GetConformer().GetPositions(), dtype=np.float64)
    pairs = sorted(tuple(sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx()))) for b in mol.GetBonds())
    return elements, xyz, np.array(pairs, dtype=np.int64).reshape(-1, 2)


def solvated_methanol() -> tuple[list[str], np.ndarray]:
    """Methanol (G2) with six waters (G2) around it, at 3.2 A from its centre, randomly turned."""
    el_m, x_m = _atoms(g2(), "CH3OH")
    el_w, x_w = _atoms(g2(), "H2O")
    rng = np.random.default_rng(0)
    elements, parts = list(el_m), [x_m]
    centre = x_m.mean(0)
    for direction in np.concatenate([np.eye(3), -np.eye(3)]):
        q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        parts.append((x_w - x_w.mean(0)) @ q.T + centre + 3.2 * direction)
        elements += el_w
    return elements, np.concatenate(parts)


def check_not_linear(refs: np.ndarray, xyz: np.ndarray) -> None:
    def angle(p: int, q: int, r: int) -> float:
        u, v = xyz[p] - xyz[q], xyz[r] - xyz[q]
        return float(np.degrees(np.arctan2(np.linalg.norm(np.cross(u, v)), u @ v)))

    for i, (b, a, d) in enumerate(refs.tolist()):
        if d >= 0:
            assert LINEAR_DEG < angle(i, b, a) < 180 - LINEAR_DEG, f"row {i}: angle {i}-{b}-{a}"
            assert LINEAR_DEG < angle(b, a, d) < 180 - LINEAR_DEG, f"row {i}: triple {b}-{a}-{d}"


# ------------------------------------------------------------------- G2 set
@pytest.mark.parametrize("name", _g2_names())
def test_g2_molecule_round_trips(name: str) -> None:
    elements, xyz = _atoms(g2(), name)
    pairs = bn.perceive_connectivity(xyz, elements)
    if len(elements) > 1:  # every G2 entry is one molecule (F2 included)
        assert fragments(pairs, len(elements)).max() == 0, f"{name}: {pairs.tolist()}"
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), elements=elements)
    assert z.table.n_components == 1
    assert worst(z.to_cartesian().numpy(), xyz) < TOL
    # and through Gaussian text: written in build order, read back
    out = io.StringIO()
    order = write_zmat(out, z, precision=10)
    back = read_zmat(io.StringIO(out.getvalue()))
    assert back.elements == [elements[i] for i in order]
    assert worst(back.to_cartesian().numpy(), xyz[order]) < TOL


@pytest.mark.parametrize(
    ("symbol", "length"),
    [("F", 1.412), ("Cl", 1.988), ("Br", 2.281), ("I", 2.666)],  # experimental X2 bond lengths
)
def test_dihalogens_are_one_molecule(symbol: str, length: float) -> None:
    xyz = np.array([[0.0, 0.0, 0.0], [length, 0.0, 0.0]])
    assert bn.perceive_connectivity(xyz, [symbol, symbol]).tolist() == [[0, 1]]
    table = bn.ConstructionTable.from_xyz(xyz, [symbol] * 2, link_fragments=False)
    assert table.n_components == 1


def test_g2_f2_peroxide_and_dichlorine_bonds() -> None:
    coll = g2()
    for name, pair in (("F2", ("F", "F")), ("Cl2", ("Cl", "Cl")), ("H2O2", ("O", "O"))):
        elements, xyz = _atoms(coll, name)
        pairs = bn.perceive_connectivity(xyz, elements)
        assert any((elements[i], elements[j]) == pair for i, j in pairs.tolist()), name


@pytest.mark.parametrize(
    "smiles",
    [
        "OO",  # hydrogen peroxide
        "CC(=O)OOC(=O)C",  # diacetyl peroxide
        "CSSC",  # dimethyl disulfide
        "NC(CSSCC(N)C(=O)O)C(=O)O",  # cystine
        "FC(F)(F)Br",
        "ICCI",
        "Clc1ccc(Br)cc1",
        "CC(C)(C)OOC(C)(C)C",
        "C[N+](C)(C)C",
        "OC(=O)c1ccccc1O",
    ],
)
def test_perceived_connectivity_matches_rdkit(smiles: str) -> None:
    elements, xyz, pairs = rdkit_system(smiles)
    assert bn.perceive_connectivity(xyz, elements).tolist() == pairs.tolist()


def test_covalent_radii_are_cordero_as_in_ase() -> None:
    data = pytest.importorskip("ase.data", reason="ASE is not installed (optional)")
    from batched_nerf.topology.perceive import COVALENT_RADII

    assert len(COVALENT_RADII) == 96
    for z, (symbol, r) in enumerate(COVALENT_RADII.items(), start=1):
        assert data.chemical_symbols[z] == symbol
        assert r == pytest.approx(data.covalent_radii[z], abs=1e-9), symbol


# ------------------------------------------------------------- dimers, salts
def water_dimer() -> tuple[list[str], np.ndarray]:
    return _atoms(s22(), "Water_dimer")


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def sodium_acetate() -> tuple[list[str], np.ndarray]:
    """RDKit's acetate (``CC(=O)[O-]``) with the Na+ 2.3 A from both carboxylate oxygens."""
    elements, xyz, pairs = rdkit_system("CC(=O)[O-]")
    o = [i for i, e in enumerate(elements) if e == "O"]
    c = int(next(set(p) - {o[0]} for p in pairs.tolist() if o[0] in p).pop())  # the carboxylate C
    mid = xyz[o].mean(0)
    half = np.linalg.norm(xyz[o[0]] - mid)
    na = mid + _unit(mid - xyz[c]) * np.sqrt(2.3**2 - half**2)
    return [*elements, "Na"], np.concatenate([xyz, na[None]])


def ammonium_chloride() -> tuple[list[str], np.ndarray]:
    """RDKit's ammonium (``[NH4+]``) with the Cl- on the axis of an N-H bond, 3.2 A from N.

    (RDKit embeds ``[NH4+].[Cl-]`` with the chloride on the nitrogen: coincident atoms,
    which the bond perception rejects.)
    """
    elements, xyz, _ = rdkit_system("[NH4+]")
    cl = xyz[0] + 3.2 * _unit(xyz[1] - xyz[0])
    return [*elements, "Cl"], np.concatenate([xyz, cl[None]])


SYSTEMS = {
    "water_dimer": water_dimer,
    "benzene_dimer_T": lambda: _atoms(s22(), "Benzene_dimer_T-shaped"),
    "sodium_acetate": sodium_acetate,
    "ammonium_chloride": ammonium_chloride,
    "solvated_methanol": solvated_methanol,
}


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_multi_molecule_round_trip_api(system: str) -> None:
    elements, xyz = SYSTEMS[system]()
    auto = bn.topology.auto.refs_from_xyz(xyz, elements)  # the arrays behind ConstructionTable.from_xyz
    n_frag = int(fragments(auto.connectivity, len(elements)).max()) + 1
    table = bn.ConstructionTable.from_xyz(xyz, elements)
    assert table.n_components == 1 and np.array_equal(table.refs.numpy(), auto.refs)
    check_not_linear(auto.refs, xyz)
    # the links are the only references across fragments, and they are marked
    frag = fragments(auto.connectivity, len(elements))
    refs = auto.refs
    crossing = (refs >= 0) & (frag[np.maximum(refs, 0)] != frag[:, None])
    assert not (crossing & ~auto.nonbonded).any()
    assert int((refs[:, 0] >= 0).sum()) == len(elements) - 1
    linked_rows = np.flatnonzero(crossing.any(1))
    assert len(linked_rows) <= 3 * (n_frag - 1)
    # separate components on request, the same rows inside each fragment
    apart = bn.ConstructionTable.from_xyz(xyz, elements, link_fragments=False)
    assert apart.n_components == n_frag
    inner = (apart.refs.numpy() >= 0).sum(1) == 3
    assert np.array_equal(apart.refs.numpy()[inner], refs[inner])
    # and the round trip in float64 (also batched)
    x = torch.from_numpy(xyz)
    z = bn.ZMatrix.from_cartesian(x, elements=elements)
    assert worst(z.to_cartesian().numpy(), xyz) < TOL
    batch = bn.ZMatrix.from_cartesian(torch.stack([x, x + 1.0]), table, elements=elements)
    assert worst(batch.to_cartesian()[1].numpy(), xyz) < TOL


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_multi_molecule_round_trip_gaussian(system: str) -> None:
    elements, xyz = SYSTEMS[system]()
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), elements=elements)
    for variables in (False, True):
        out = io.StringIO()
        order = write_zmat(out, z, variables=variables, precision=10)
        back = read_zmat(io.StringIO(out.getvalue()))
        assert worst(back.to_cartesian().numpy(), xyz[order]) < TOL
        gjf = io.StringIO()
        order2 = write_gaussian(gjf, z, route="#p b3lyp/6-31g(d)", title=system, variables=variables)
        g = read_gaussian(io.StringIO(gjf.getvalue()))
        assert g.route == "#p b3lyp/6-31g(d)" and g.title == system and g.charge == 0
        assert g.zmatrix.elements == [elements[i] for i in order2]
        assert worst(g.zmatrix.to_cartesian().numpy(), xyz[order2]) < 1e-5  # 6 decimals
    cart = io.StringIO()
    write_gaussian(cart, z, cartesian=True, precision=10)
    assert worst(read_zmat(io.StringIO(cart.getvalue())).to_cartesian().numpy(), xyz) < TOL


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_multi_molecule_round_trip_chemcoord(system: str) -> None:
    pytest.importorskip("chemcoord", reason="chemcoord is not installed (optional)")
    elements, xyz = SYSTEMS[system]()
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), elements=elements)
    zmat = bn.to_chemcoord(z)
    cart = zmat.get_cartesian().sort_index()
    got = cart.loc[:, ["x", "y", "z"]].to_numpy(dtype=np.float64)
    assert list(cart["atom"]) == elements
    assert worst(got, xyz) < TOL
    back = bn.from_chemcoord(zmat)
    rows = [int(label) for label in back.real_labels or []]
    assert worst(back.to_cartesian().numpy(), xyz[rows]) < TOL


@pytest.mark.parametrize("name", _s22_names())
def test_s22_round_trip(name: str) -> None:
    elements, xyz = _atoms(s22(), name)
    auto = bn.topology.auto.refs_from_xyz(xyz, elements)
    assert fragments(auto.connectivity, len(elements)).max() == 1  # two molecules
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), elements=elements)
    assert worst(z.to_cartesian().numpy(), xyz) < TOL
    out = io.StringIO()
    order = write_zmat(out, z, precision=10)
    assert worst(read_zmat(io.StringIO(out.getvalue())).to_cartesian().numpy(), xyz[order]) < TOL
    try:
        import chemcoord  # noqa: F401
    except ImportError:
        return
    cart = bn.to_chemcoord(z).get_cartesian().sort_index()
    assert worst(cart.loc[:, ["x", "y", "z"]].to_numpy(dtype=np.float64), xyz) < TOL


@pytest.mark.parametrize("name", ["C2H2", "NCCN", "CO2", "HCN"])
def test_linear_g2_molecules_through_chemcoord(name: str) -> None:
    """chemcoord refuses collinear b-a-d rows, even where the angle is straight: absolute refs instead."""
    pytest.importorskip("chemcoord", reason="chemcoord is not installed (optional)")
    elements, xyz = _atoms(g2(), name)
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), elements=elements)
    zmat = bn.to_chemcoord(z)
    cart = zmat.get_cartesian().sort_index()
    assert worst(cart.loc[:, ["x", "y", "z"]].to_numpy(dtype=np.float64), xyz) < TOL
    back = bn.from_chemcoord(zmat)
    rows = [int(label) for label in back.real_labels or []]
    assert worst(back.to_cartesian().numpy(), xyz[rows]) < TOL


def _cli_round_trip(
    tmp_path: Path, elements: list[str], xyz: np.ndarray, suffix: str, fmt: list[str]
) -> None:
    src = tmp_path / "in.xyz"
    write_xyz(src, elements, xyz, precision=12)
    _, frames, _ = read_xyz(src)
    mid = tmp_path / f"mid{suffix}"
    out_fmt = ["--format-out", fmt[0]] if fmt else []
    in_fmt = ["--format-in", fmt[0]] if fmt else []
    assert main(["convert", str(src), str(mid), "--precision", "12", *out_fmt]) == 0
    back = tmp_path / "back.xyz"
    assert main(["convert", str(mid), str(back), "--precision", "12", *in_fmt]) == 0
    el2, got, _ = read_xyz(back)
    # the order the CLI writes: the build order of the same automatic table
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(frames[0]), elements=elements)
    order = write_zmat(io.StringIO(), z)
    assert el2 == [elements[i] for i in order]
    assert worst(got[0], xyz[order]) < TOL


@pytest.mark.parametrize("system", ["water_dimer", "sodium_acetate", "benzene_dimer_T"])
@pytest.mark.parametrize(
    ("suffix", "fmt"), [(".zmat", []), (".gjf", []), (".com", []), (".cc", ["chemcoord"])]
)
def test_multi_molecule_round_trip_cli(
    system: str, suffix: str, fmt: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if fmt:
        pytest.importorskip("chemcoord", reason="chemcoord is not installed (optional)")
    elements, xyz = SYSTEMS[system]()
    _cli_round_trip(tmp_path, elements, xyz, suffix, fmt)
    assert "error" not in capsys.readouterr().err


def test_cli_says_when_atoms_are_reordered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for system, reordered in (("benzene_dimer_T", True), ("water_dimer", False)):
        elements, xyz = SYSTEMS[system]()
        src = tmp_path / f"{system}.xyz"
        write_xyz(src, elements, xyz)
        order = write_zmat(io.StringIO(), bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), elements=elements))
        assert (not np.array_equal(order, np.arange(len(order)))) == reordered
        assert main(["convert", str(src), str(tmp_path / f"{system}.zmat")]) == 0
        assert ("atoms reordered into build order" in capsys.readouterr().out) == reordered


def test_cli_keeps_the_order_with_an_ordered_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elements, xyz = water_dimer()
    src = tmp_path / "dimer.xyz"
    write_xyz(src, elements, xyz, precision=12)
    # a table whose rows reference only earlier rows: the written order is the input order
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), elements=elements)
    order = write_zmat(io.StringIO(), z)
    inverse = np.argsort(order)
    refs = z.table.refs.numpy()[order]
    refs = np.where(refs >= 0, inverse[np.maximum(refs, 0)], -1)
    np.savetxt(tmp_path / "refs.txt", refs, fmt="%d")
    ordered = tmp_path / "ordered.xyz"
    write_xyz(ordered, [elements[i] for i in order], xyz[order], precision=12)
    args = ["convert", str(ordered), str(tmp_path / "o.zmat"), "--table-from", str(tmp_path / "refs.txt")]
    assert main(args) == 0
    assert "reordered" not in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "o.zmat"), str(tmp_path / "o.xyz"), "--precision", "12"]) == 0
    el2, got, _ = read_xyz(tmp_path / "o.xyz")
    assert el2 == [elements[i] for i in order]
    assert worst(got[0], xyz[order]) < TOL


# ------------------------------------------------------------ nothing silent
def test_bohr_coordinates_warn() -> None:
    elements, xyz = _atoms(g2(), "CH3OH")
    with pytest.warns(UserWarning, match=r"no bond perceived for 6 of 6 atoms.*Are the coordinates in bohr"):
        bn.perceive_connectivity(xyz / 0.529177210903, elements)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bn.perceive_connectivity(xyz, elements)  # no warning in Angstrom
        bn.perceive_connectivity(*ammonium_chloride()[::-1])  # one ion without bonds: fine


def test_bohr_coordinates_warn_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elements, xyz = _atoms(g2(), "H2O")
    src = tmp_path / "bohr.xyz"
    write_xyz(src, elements, xyz / 0.529177210903)
    assert main(["convert", str(src), str(tmp_path / "out.zmat")]) == 0
    assert "batched-nerf: warning: no bond perceived for 3 of 3 atoms" in capsys.readouterr().err


def test_coincident_atoms_raise_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xyz = np.array([[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [0.96, 0.0, 0.0]])
    with pytest.raises(ValueError, match=r"atoms 1 \(H\) and 2 \(H\) are 0\.000000 apart.*coincident"):
        bn.perceive_connectivity(xyz, ["O", "H", "H"])
    near = xyz + np.array([[0, 0, 0], [0, 0, 0], [0.05, 0, 0]])
    with pytest.raises(ValueError, match=r"atoms 1 \(H\) and 2 \(H\) are 0\.050000 apart"):
        bn.ConstructionTable.from_xyz(near, ["O", "H", "H"])
    with pytest.raises(ValueError, match=r"atoms 1 and 2 are 0\.000000 apart"):
        bn.ConstructionTable.from_connectivity([(0, 1), (0, 2)], 3, xyz=xyz)
    with pytest.raises(ValueError, match=r"line 5: atom 2 has the same coordinates as atom 1 \(line 4\)"):
        read_xyz(io.StringIO("3\n\nO 0 0 0\nH 0.96 0 0\nH 0.96 0 0\n"))
    src = tmp_path / "dup.xyz"
    src.write_text("3\n\nO 0 0 0\nH 0.96 0 0\nH 0.96 0 0\n")
    assert main(["convert", str(src), str(tmp_path / "out.zmat")]) == 1
    assert "same coordinates as atom 1" in capsys.readouterr().err
    assert not (tmp_path / "out.zmat").exists()


def test_write_zmat_refuses_zero_bonds_and_separate_components() -> None:
    with pytest.raises(ValueError, match=r"row 1: bond length 0\.0 to atom 0 is not positive"):
        write_zmat(io.StringIO(), ["O", "H"], [[-1, -1, -1], [0, -1, -1]], [0, 0.0], [0, 0], [0, 0])
    with pytest.raises(ValueError, match=r"row 2: the angle is not finite"):
        write_zmat(io.StringIO(), ["O", "H", "H"], [[-1, -1, -1], [0, -1, -1], [0, 1, -1]], [0, 1, 1],
                   [0, 0, float("nan")], [0, 0, 0])  # fmt: skip
    elements, xyz = water_dimer()
    apart = bn.ConstructionTable.from_xyz(xyz, elements, link_fragments=False)
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), apart, elements=elements, link_fragments=False)
    assert z.table.n_components == 2  # kept apart on request
    with pytest.raises(ValueError, match=r"single seed triple.*link the fragments"):
        write_zmat(io.StringIO(), z)


def test_to_chemcoord_refuses_separate_components() -> None:
    pytest.importorskip("chemcoord", reason="chemcoord is not installed (optional)")
    elements, xyz = water_dimer()
    apart = bn.ConstructionTable.from_xyz(xyz, elements, link_fragments=False)
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), apart, elements=elements, link_fragments=False)
    with pytest.raises(ValueError, match=r"2 separately seeded components \(roots at rows \[0, 3\]\)"):
        bn.to_chemcoord(z)


def test_from_cartesian_links_a_table_of_separate_components() -> None:
    elements, xyz = water_dimer()
    apart = bn.ConstructionTable.from_xyz(xyz, elements, link_fragments=False)
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), apart, elements=elements)
    assert apart.n_components == 2 and z.table.n_components == 1
    assert worst(z.to_cartesian().numpy(), xyz) < TOL
    # the links reference the nearest atoms of the first water and are marked
    pairs = bn.perceive_connectivity(xyz, elements)
    mask = bn.nonbonded_references(z.table.refs, pairs)
    changed = np.flatnonzero((z.table.refs.numpy() != apart.refs.numpy()).any(1))
    assert mask[changed].any(1).all() and not mask[np.setdiff1d(np.arange(6), changed)].any()


def test_from_cartesian_refuses_rows_it_cannot_rebuild() -> None:
    chain = bn.ConstructionTable.chain(4)
    collinear = torch.tensor([[0.0, 0, 0], [1, 0, 0], [2, 0, 0], [2, 1, 0]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"row 3: in conformation 0, its dihedral reference triple 2-1-0 is"):
        bn.ZMatrix.from_cartesian(collinear, chain)
    # a straight angle at row 3 needs no dihedral: fine
    straight = torch.tensor([[0.0, 1, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0]], dtype=torch.float64)
    bn.ZMatrix.from_cartesian(torch.stack([straight, straight]), chain)
    fine = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0]], dtype=torch.float64)
    same = torch.tensor([[0.0, 0, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"row 2: in conformation 1, its bond and angle references 1 and 0"):
        bn.ZMatrix.from_cartesian(torch.stack([fine, same]), bn.ConstructionTable.chain(3))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: bn.ZMatrix.from_cartesian(np.zeros((3, 3))), ValueError, r"needs elements"),
        (
            lambda: bn.ZMatrix.from_cartesian(np.zeros(3), elements=["H"]),
            ValueError,
            r"shape \(\.\.\., N, 3\)",
        ),
        (
            lambda: bn.ZMatrix.from_cartesian(np.zeros((1, 3)), "table"),
            TypeError,
            r"must be a ConstructionTable",
        ),
        (
            lambda: bn.ConstructionTable.from_connectivity([(0, 1)], 3, link_fragments=True),
            ValueError,
            r"link_fragments=True needs xyz",
        ),
        (
            lambda: bn.topology.auto.link_components([[-1, -1, -1]], [[0, 0, 0]], first=2),
            ValueError,
            r"first must",
        ),
        (
            lambda: bn.topology.auto.link_components([[-1, -1]], [[0, 0, 0]]),
            ValueError,
            r"refs must have shape",
        ),
        (lambda: bn.nonbonded_references([[-1, -1]], []), ValueError, r"refs must have shape \(N, 3\)"),
        (
            lambda: bn.perceive_connectivity([[0, 0, 0]], ["Qq"]),
            ValueError,
            r"unknown element 'Qq' at index 0",
        ),
    ],
)
def test_errors(call: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()  # type: ignore[operator]


def test_from_bonds_is_a_deprecated_alias() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"from_bonds is deprecated; use ConstructionTable.from_connectivity"
    ):
        old = bn.ConstructionTable.from_bonds([(0, 1), (1, 2)], 3)
    assert old == bn.ConstructionTable.from_connectivity([(0, 1), (1, 2)], 3)


def test_connectivity_without_coordinates_keeps_fragments_apart() -> None:
    table = bn.ConstructionTable.from_connectivity([(0, 1), (2, 3)], 4)
    assert table.n_components == 2
    xyz = np.array([[0.0, 0, 0], [1, 0, 0], [3, 0.5, 0], [3, 1.5, 0.3]])
    linked = bn.ConstructionTable.from_connectivity([(0, 1), (2, 3)], 4, xyz=xyz)
    assert linked.n_components == 1


def test_tiny_fragments_link_into_a_valid_seed_triple() -> None:
    # two argon atoms, then three separate ions: the first fragments have fewer than three atoms
    xyz = np.array([[0.0, 0, 0], [3.8, 0, 0], [1.0, 3.5, 0.2], [-2.0, 1.0, 3.0], [5.0, -2.0, -1.0]])
    refs = bn.topology.auto.link_components(np.full((5, 3), -1), xyz)
    table = bn.ConstructionTable(refs)
    assert table.n_components == 1
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), table)
    assert worst(z.to_cartesian().numpy(), xyz) < TOL
    # and a salt from RDKit's own graph, linked by its conformer
    Chem = pytest.importorskip("rdkit.Chem", reason="RDKit is not installed (optional)")
    from rdkit.Chem import AllChem

    from batched_nerf.formats import table_from_rdkit

    mol = Chem.AddHs(Chem.MolFromSmiles("CC(=O)[O-].[Na+]"))
    AllChem.EmbedMolecule(mol, randomSeed=3)
    table = table_from_rdkit(mol)
    assert table.n_components == 1
    xyz = torch.tensor(mol.GetConformer().GetPositions(), dtype=torch.float64)
    elements = [a.GetSymbol() for a in mol.GetAtoms()]
    assert worst(bn.ZMatrix.from_cartesian(xyz, table, elements).to_cartesian().numpy(), xyz.numpy()) < TOL
    assert table_from_rdkit(mol, link_fragments=False).n_components == 2
    assert table_from_rdkit(mol, conf_id=None).n_components == 2


def test_nonbonded_references_marks_what_is_not_chemical() -> None:
    # ethane with a sibling (improper) dihedral, plus a linked ion
    refs = [
        [1, -1, -1],
        [-1, -1, -1],
        [0, 1, 5],
        [0, 1, 2],
        [0, 1, 2],
        [1, 0, -1],
        [1, 0, 5],
        [1, 0, 5],
        [0, 1, 2],
    ]
    conn = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 5), (1, 6), (1, 7)]
    mask = bn.nonbonded_references(refs, conn)
    assert not mask[:8].any()  # proper and sibling dihedrals are chemical
    assert mask[8].tolist() == [True, True, True]
    assert mask.shape == (9, 3) and mask.dtype == bool


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 30), st.integers(0, 2**31 - 1), st.floats(0.0, 1.0))
def test_random_fragments_link_and_round_trip(n: int, seed: int, p_new: float) -> None:
    """Random forests (many fragments, single atoms included) at random positions: one valid build."""
    rng = np.random.default_rng(seed)
    pairs = [(int(rng.integers(0, i)), i) for i in range(1, n) if rng.random() > p_new]
    xyz = rng.normal(size=(n, 3)) * 3.0
    auto = bn.topology.auto.refs_from_connectivity(pairs, n, xyz=xyz)
    table = bn.ConstructionTable(auto.refs)
    assert table.n_components == 1
    crossing = (auto.refs >= 0) & (fragments(np.array(pairs).reshape(-1, 2), n)[np.maximum(auto.refs, 0)]
                                   != fragments(np.array(pairs).reshape(-1, 2), n)[:, None])  # fmt: skip
    assert not (crossing & ~auto.nonbonded).any()
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), table)
    assert worst(z.to_cartesian().numpy(), xyz) < TOL


LINEAR_SYSTEMS = {
    "CO2+Ar": (["O", "C", "O", "Ar"], [[-1.16, 0, 0], [0, 0, 0], [1.16, 0, 0], [0.3, 3.4, 0.2]]),
    "Ar+CO2": (["Ar", "O", "C", "O"], [[0.3, 3.4, 0.2], [-1.16, 0, 0], [0, 0, 0], [1.16, 0, 0]]),
    "CO2+H2O": (
        ["O", "C", "O", "O", "H", "H"],
        [[-1.16, 0, 0], [0, 0, 0], [1.16, 0, 0], [0.2, 3.0, 0.1], [0.9, 3.5, 0.3], [-0.6, 3.5, -0.2]],
    ),
    "HCN dimer par": (
        ["H", "C", "N", "H", "C", "N"],
        [[-1.06, 0, 0], [0, 0, 0], [1.15, 0, 0], [-1.06, 3.5, 0], [0, 3.5, 0], [1.15, 3.5, 0]],
    ),
    "HCN dimer lin": (
        ["H", "C", "N", "H", "C", "N"],
        [[-1.06, 0, 0], [0, 0, 0], [1.15, 0, 0], [3.2, 0, 0], [4.26, 0, 0], [5.41, 0, 0]],
    ),
    "H2+H2 T": (["H", "H", "H", "H"], [[0, 0, 0], [0.74, 0, 0], [0.37, 2.5, -0.37], [0.37, 2.5, 0.37]]),
    "Ar+H2O axis": (["Ar", "O", "H", "H"], [[0, 0, 0], [3.5, 0, 0], [2.54, 0, 0], [3.74, 0.93, 0]]),
    "Ar+H2O axis2": (["Ar", "O", "H", "H"], [[0, 0, 0], [3.5, 0, 0], [4.46, 0, 0], [3.26, 0.93, 0]]),
    "Ar3 bent": (["Ar", "Ar", "Ar"], [[0, 0, 0], [3.8, 0, 0], [1.9, 3.3, 0]]),
    "Ar4": (["Ar"] * 4, [[0, 0, 0], [3.8, 0, 0], [7.6, 0, 0], [1.9, 3.3, 0.5]]),
    "C2H2+C2H2 T": (
        ["C", "C", "H", "H", "C", "C", "H", "H"],
        [
            [-0.6, 0, 0],
            [0.6, 0, 0],
            [-1.66, 0, 0],
            [1.66, 0, 0],
            [0, 3.5, -0.6],
            [0, 3.5, 0.6],
            [0, 3.5, -1.66],
            [0, 3.5, 1.66],
        ],
    ),
    "Na+Cl- + H2O": (
        ["Na", "Cl", "O", "H", "H"],
        [[0, 0, 0], [2.4, 0, 0], [-2.3, 0.5, 0], [-2.8, 1.2, 0.4], [-2.9, -0.2, -0.3]],
    ),
}


@pytest.mark.parametrize("name", sorted(LINEAR_SYSTEMS))
def test_linear_molecules_link_with_a_defined_frame(name: str) -> None:
    """Linear molecules (CO2, HCN, C2H2, H2) and atoms give no frame on their own: the links must."""
    elements, positions = LINEAR_SYSTEMS[name]
    xyz = np.array(positions, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # argon has no bonds
        table = bn.ConstructionTable.from_xyz(xyz, elements)
    assert table.n_components == 1
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), table, elements)  # raises on an undefined dihedral
    assert worst(z.to_cartesian().numpy(), xyz) < TOL


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 14), st.integers(0, 2**31 - 1), st.integers(0, 14), st.booleans())
def test_collinear_points_always_rebuild(n: int, seed: int, on_line: int, link: bool) -> None:
    """Grid points, some on one line: many exactly linear triples, yet every dihedral stays defined."""
    rng = np.random.default_rng(seed)
    pairs = [(int(rng.integers(0, i)), i) for i in range(1, n) if rng.random() > 0.4]
    grid = np.stack(np.meshgrid(*[np.arange(3.0)] * 3, indexing="ij"), -1).reshape(-1, 3) * 1.5
    xyz = grid[rng.permutation(len(grid))[:n]]
    m = min(on_line, n)
    xyz[:m] = np.stack([5.0 + 1.2 * np.arange(m), np.zeros(m), np.zeros(m)], 1)
    auto = bn.topology.auto.refs_from_connectivity(pairs, n, xyz=xyz, link_fragments=link)
    table = bn.ConstructionTable(auto.refs)
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(xyz), table, link_fragments=False)
    x = z.to_cartesian().numpy()
    comp = table.components.numpy()
    same = comp[:, None] == comp[None, :]
    assert np.abs(pdist(x) - pdist(xyz))[same].max() < TOL


def test_dummy_atoms_in_an_xyz_file_are_linked_not_bonded(tmp_path: Path) -> None:
    text = "4\nwater and a dummy\nO 0 0 0\nH 0.96 0 0\nH -0.24 0.93 0\nX 0.3 0.3 1.5\n"
    elements, frames, _ = read_xyz(io.StringIO(text))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the dummy has no bonds, and that is no reason to warn
        pairs = bn.perceive_connectivity(frames[0], elements)
    assert pairs.tolist() == [[0, 1], [0, 2]]
    z = bn.ZMatrix.from_cartesian(torch.from_numpy(frames[0]), elements=elements)
    assert z.table.n_components == 1 and worst(z.to_cartesian().numpy(), frames[0]) < TOL
