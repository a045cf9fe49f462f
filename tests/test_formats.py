"""File formats: XYZ, Gaussian Z-matrices and bgflow z-matrices."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from batched_nerf import ConstructionTable, to_cartesian, to_internal
from batched_nerf.data import available, load
from batched_nerf.data._reference import build_xyz, internal_coordinates
from batched_nerf.formats import (
    ZMatrix,
    read_xyz,
    read_zmat,
    refs_from_bgflow,
    refs_to_bgflow,
    table_from_bgflow,
    table_to_bgflow,
    write_xyz,
    write_zmat,
)


def pdist(x: np.ndarray) -> np.ndarray:
    return np.linalg.norm(x[..., :, None, :] - x[..., None, :, :], axis=-1)


# --------------------------------------------------------------------------- xyz
def test_xyz_single_frame_roundtrip(tmp_path: Path) -> None:
    mol = load("alanine_dipeptide")
    ref = mol.to_cartesian().numpy()
    path = tmp_path / "ala.xyz"
    write_xyz(path, mol.elements, ref, "alanine dipeptide", precision=10)
    elements, xyz, comments = read_xyz(path)
    assert elements == mol.elements
    assert xyz.shape == (1, 22, 3)
    assert comments == ["alanine dipeptide"]
    np.testing.assert_allclose(xyz[0], ref, atol=1e-9)
    # str paths work too
    assert read_xyz(str(path))[0] == mol.elements


def test_xyz_multi_frame_roundtrip_stringio() -> None:
    rng = np.random.default_rng(0)
    frames = rng.normal(size=(4, 5, 3))
    out = io.StringIO()
    write_xyz(out, ["C", "H", "H", "Cl", "Br"], torch.tensor(frames), [f"frame {k}" for k in range(4)])
    out.seek(0)
    elements, xyz, comments = read_xyz(out)
    assert elements == ["C", "H", "H", "Cl", "Br"]
    assert comments == [f"frame {k}" for k in range(4)]
    np.testing.assert_allclose(xyz, frames, atol=1e-8)


def test_xyz_torch_requires_grad_and_defaults() -> None:
    x = torch.zeros(2, 3, requires_grad=True)
    out = io.StringIO()
    write_xyz(out, ["H", "H"], x)
    assert out.getvalue().splitlines()[:2] == ["2", ""]


def test_xyz_tolerates_blank_lines_and_extra_columns() -> None:
    text = "2\nc1\nO 0 0 0 extra\nH 1 0 0 0.1 0.2\n\n2\nc2\nO 0 0 1\nH 1 0 1\n\n"
    elements, xyz, comments = read_xyz(io.StringIO(text))
    assert elements == ["O", "H"] and comments == ["c1", "c2"]
    assert xyz[1, :, 2].tolist() == [1.0, 1.0]


def test_xyz_zero_atoms() -> None:
    elements, xyz, _ = read_xyz(io.StringIO("0\nempty\n"))
    assert elements == [] and xyz.shape == (1, 0, 3)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"line 1: empty XYZ file"),
        ("abc\n", r"line 1: expected the atom count, got 'abc'"),
        ("-2\nc\n", r"line 1: expected a non-negative atom count"),
        ("2\n", r"line 2: unexpected end of file, expected the comment line of frame 1"),
        ("2\nc\nH 0 0 0\n", r"line 4: unexpected end of file, frame 1 declares 2 atoms but only 1"),
        ("2\nc\nH 0 0 0\nH 0 0\n", r"line 4: expected 4 fields 'element x y z', got 3"),
        ("1\nc\nH 0 x1 0\n", r"line 3: could not parse coordinate 'x1' as a number"),
        ("1\nc\nH 0 0 0\n2\nc\nH 0 0 0\nH 0 0 0\n", r"line 4: frame 2 has 2 atoms, the first frame 1"),
        ("2\nc\nH 0 0 0\nO 0 0 0\n2\nc\nH 0 0 0\nC 0 0 0\n", r"line 8: frame 2 has element 'C' for atom 1"),
    ],
)
def test_read_xyz_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_xyz(io.StringIO(text))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((["H"], np.zeros((1, 2))), r"xyz must have shape \(N, 3\) or \(F, N, 3\), got \(1, 2\)"),
        ((["H", "H"], np.zeros((1, 3))), r"got 2 elements for 1 atoms"),
        ((["H"], np.full((1, 3), np.inf)), r"NaN or infinite"),
        ((["H H"], np.zeros((1, 3))), r"element 0 must be a non-empty symbol without spaces"),
        ((["H"], np.zeros((2, 1, 3)), ["a"]), r"got 1 comments for 2 frames"),
        ((["H"], np.zeros((1, 3)), "two\nlines"), r"comment of frame 0 contains a line break"),
    ],
)
def test_write_xyz_errors(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        write_xyz(io.StringIO(), *args)


# ---------------------------------------------------------------------- gaussian
METHANE = """\
C
H 1 1.09
H 1 1.09 2 109.4712
H 1 R1 2 A1 3 -D1
H1 1 R1 2 A1 3 D1

Variables:
R1 1.09
A1=109.4712
D1 = 120.0
"""


def test_read_zmat_variables_and_signs() -> None:
    z = read_zmat(io.StringIO(METHANE))
    assert isinstance(z, ZMatrix)
    assert z.elements == ["C", "H", "H", "H", "H"]
    assert z.labels is not None and z.labels[4] == "H1"
    assert z.table.refs.tolist() == [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [0, 1, 2], [0, 1, 2]]
    assert z.dtype == torch.float64 and z.batch_shape == () and z.n_atoms == 5
    np.testing.assert_allclose(z.bonds, [0, 1.09, 1.09, 1.09, 1.09])
    np.testing.assert_allclose(np.degrees(z.angles.numpy()), [0, 0, 109.4712, 109.4712, 109.4712])
    np.testing.assert_allclose(np.degrees(z.dihedrals.numpy()), [0, 0, 0, -120.0, 120.0])
    # a regular tetrahedron: all H-H distances equal
    x = build_xyz(z.table.refs.numpy(), z.bonds.numpy(), z.angles.numpy(), z.dihedrals.numpy())
    d = pdist(x)[1:, 1:][np.triu_indices(4, 1)]
    np.testing.assert_allclose(d, d[0], atol=1e-4)


def test_read_zmat_labels_commas_comments_and_path(tmp_path: Path) -> None:
    text = "! water\nO1\nH2, O1, 0.96\nH3 O1 0.96 H2 104.5 ! comment\n"
    path = tmp_path / "w.zmat"
    path.write_text(text)
    z = read_zmat(path)
    assert z.elements == ["O", "H", "H"]
    assert z.table.refs.tolist() == [[-1, -1, -1], [0, -1, -1], [0, 1, -1]]
    assert read_zmat(io.StringIO("Cl\nCL 1 2.0\n")).elements == ["Cl", "Cl"]


def test_zmat_dihedral_convention_matches_core() -> None:
    z = read_zmat(io.StringIO(METHANE))
    table = z.table
    x = to_cartesian(z.bonds, z.angles, z.dihedrals, table)
    torch.testing.assert_close(z.to_cartesian(), x)
    ic = to_internal(x, table)
    np.testing.assert_allclose(ic.dihedrals.numpy(), z.dihedrals, atol=1e-10)
    # and with the independent numpy reference
    _, _, dih = internal_coordinates(x.numpy(), table.refs.numpy())
    np.testing.assert_allclose(dih, z.dihedrals, atol=1e-10)


@pytest.mark.parametrize("name", available())
@pytest.mark.parametrize("variables", [False, True])
def test_zmat_roundtrip_shipped(name: str, variables: bool) -> None:
    mol = load(name)
    out = io.StringIO()
    order = write_zmat(
        out,
        mol.elements,
        mol.table,
        mol.bonds,
        mol.angles,
        mol.dihedrals,
        variables=variables,
        precision=10,
    )
    assert sorted(order.tolist()) == list(range(mol.n_atoms))
    text = out.getvalue()
    z = read_zmat(io.StringIO(text))
    assert z.elements == [mol.elements[i] for i in order]
    # read -> write -> read is a fixed point
    again = io.StringIO()
    order2 = write_zmat(
        again, z.elements, z.table.refs, z.bonds, z.angles, z.dihedrals, variables=variables, precision=10
    )
    assert order2.tolist() == list(range(mol.n_atoms))
    assert again.getvalue() == text
    # the geometry is the molecule's: same distance matrix after undoing the reordering
    # writing the ZMatrix itself gives the same text
    assert (
        write_zmat(third := io.StringIO(), z, variables=variables, precision=10).tolist() == order2.tolist()
    )
    assert third.getvalue() == text
    x = z.to_cartesian()
    np.testing.assert_allclose(pdist(x.numpy()), pdist(mol.to_cartesian().numpy()[order]), atol=1e-8)
    # and the values agree with a numpy internal-coordinate computation of the built coordinates
    refs = z.table.refs.numpy()
    b, a, d = internal_coordinates(x.numpy(), refs)
    used = refs >= 0
    np.testing.assert_allclose(b[used[:, 0]], z.bonds.numpy()[used[:, 0]], atol=1e-9)
    np.testing.assert_allclose(a[used[:, 1]], z.angles.numpy()[used[:, 1]], atol=1e-9)
    wrapped = np.angle(np.exp(1j * (d - z.dihedrals.numpy())))
    np.testing.assert_allclose(wrapped[used[:, 2]], 0.0, atol=1e-9)


def test_write_zmat_reorders_and_accepts_degrees_and_torch() -> None:
    refs = [[2, 1, 3], [3, -1, -1], [3, 1, -1], [-1, -1, -1]]
    out = io.StringIO()
    order = write_zmat(
        out,
        ["H", "H", "H", "N"],
        refs,
        torch.tensor([1.01, 1.01, 1.01, 0.0]),
        [107.0, 0.0, 107.0, 0.0],
        [-115.0, 0.0, 0.0, 0.0],
        degrees=True,
        precision=3,
    )
    assert order.tolist() == [3, 1, 2, 0]
    assert out.getvalue() == "N\nH 1 1.010\nH 1 1.010 2 107.000\nH 3 1.010 2 107.000 1 -115.000\n"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("\n\n", r"line 3: no atom lines found"),
        ("C 1 1.0\n", r"line 1: atom 1 expects 1 fields \(only an element\), got 3"),
        (
            "C\nH 1\n",
            r"line 2: atom 2 expects 3 fields \(an element and 1 \(reference, value\) pairs\), got 2",
        ),
        ("C\nH 2 1.0\n", r"line 2: reference 2 must be an earlier atom \(1..1\)"),
        ("C\nH 0 1.0\n", r"line 2: reference 0 must be an earlier atom"),
        ("C\nH X1 1.0\n", r"line 2: unknown atom reference 'X1'"),
        ("C\nH 1 1.0\nH 1 1.0 1 90\n", r"line 3: atom 1 referenced twice"),
        ("C\nH 1 R\n", r"line 2: undefined variable 'R'"),
        ("C\nH 1 1.0.0\n", r"line 2: could not parse value '1.0.0'"),
        ("C\nH 1 -1.0\n", r"line 2: bond length must be positive, got -1.0"),
        ("C\nH 1 1\nH 1 1 2 190\n", r"line 3: angle must lie in \[0, 180\] degrees, got 190.0"),
        (
            "C\nH 1 1\nH 1 1 2 90\nH 1 1 2 90 3 90 1\n",
            r"line 4: the two-angle form \(flag 1\) is not supported",
        ),
        ("C\nH 1 R\n\nR 1.0\nR 2.0\n", r"line 5: variable 'R' defined twice"),
        ("C\nH 1 R\n\nR one\n", r"line 4: expected a variable definition 'name value', got 'R one'"),
        ("1C\n", r"line 1: atom label '1C' does not start with an element symbol"),
        ("Qq\n", r"line 1: unknown element in atom label 'Qq'"),
    ],
)
def test_read_zmat_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_zmat(io.StringIO(text))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"refs": [[-1, -1, -1], [-1, -1, -1], [1, -1, -1]]},
            r"single seed triple; the table has 2 atoms without references \(rows \[0, 1\]\)",
        ),
        ({"refs": [[-1, -1, -1], [0, -1, -1], [0, -1, -1]]}, r"row 2: has 1 references but would be written"),
        ({"refs": [[-1, -1, -1], [2, -1, -1], [1, -1, -1]]}, r"references contain a cycle"),
        ({"refs": [[-1, -1, -1], [0, -1, -1], [5, -1, -1]]}, r"row 2: reference 5 out of range"),
        ({"elements": ["C"]}, r"got 1 elements for 3 atoms"),
        ({"bonds": np.zeros((2, 3))}, r"bonds must have shape \(3,\) \(one conformation\), got \(2, 3\)"),
        ({"refs": np.zeros((3, 2), dtype=int)}, r"refs must have shape \(N, 3\)"),
        (
            {"refs": ConstructionTable([[-1, -1, -1]] * 3, fixed=[0, 1, 2])},
            r"cannot hold fixed atoms",
        ),
    ],
)
def test_write_zmat_errors(kwargs: dict, match: str) -> None:
    args = {
        "elements": ["C", "H", "H"],
        "refs": [[-1, -1, -1], [0, -1, -1], [0, 1, -1]],
        "bonds": [0.0, 1.0, 1.0],
        "angles": [0.0, 0.0, 1.9],
        "dihedrals": [0.0, 0.0, 0.0],
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        write_zmat(io.StringIO(), **args)


# ------------------------------------------------------------------------ bgflow
def _ala_bgflow_relative() -> tuple[np.ndarray, np.ndarray]:
    """A bgflow-style relative z-matrix of alanine dipeptide: the shipped table with CA/N/C fixed."""
    mol = load("alanine_dipeptide")
    refs = mol.table.refs.numpy()
    fixed = np.array([1, 4, 6])  # ACE CH3, C and ALA N: the shipped table's seeds
    z = np.concatenate([np.arange(22)[:, None], refs], axis=1)
    return z[~np.isin(z[:, 0], fixed)], fixed


def test_bgflow_relative_roundtrip() -> None:
    z, fixed = _ala_bgflow_relative()
    table = table_from_bgflow(z, fixed)
    assert table.fixed.tolist() == fixed.tolist()
    z2, fixed2 = table_to_bgflow(table)
    assert fixed2.tolist() == fixed.tolist()
    assert sorted(map(tuple, z2.tolist())) == sorted(map(tuple, z.tolist()))
    assert table_from_bgflow(z2, fixed2) == table
    # references come before their users in the written rows
    seen = set(fixed.tolist())
    for atom, *refs in z2.tolist():
        assert all(r in seen for r in refs if r >= 0)
        seen.add(atom)
    # build with the fixed atoms taken from the shipped coordinates: the molecule is reproduced
    mol = load("alanine_dipeptide")
    ref = mol.to_cartesian()
    x = to_cartesian(mol.bonds, mol.angles, mol.dihedrals, table, fixed_xyz=ref[fixed])
    np.testing.assert_allclose(x.numpy(), ref.numpy(), atol=1e-9)


def test_bgflow_global_roundtrip() -> None:
    z = np.array([[3, 2, 1, 0], [4, 3, 2, 1], [0, -1, -1, -1], [1, 0, -1, -1], [2, 1, 0, -1]])
    table = table_from_bgflow(z)
    assert table.refs.tolist() == [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1]]
    z2, fixed = table_to_bgflow(table)
    assert fixed.size == 0
    assert z2.tolist() == [[0, -1, -1, -1], [1, 0, -1, -1], [2, 1, 0, -1], [3, 2, 1, 0], [4, 3, 2, 1]]
    refs, fixed3 = refs_from_bgflow(torch.tensor(z2), n_atoms=5)
    assert refs.tolist() == table.refs.tolist() and fixed3.size == 0
    assert refs_to_bgflow(refs)[0].tolist() == z2.tolist()


def test_bgflow_torsion_sign_matches_ours() -> None:
    # bgflow's torsion of row [i, b, a, d] is computed as atan2(y, x) with
    # b0 = x_i - x_b, b1 = x_a - x_b, b2 = x_d - x_a (praxeolitic form); check it equals ours.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 4, 3))
    xi, xb, xa, xd = (x[:, k] for k in range(4))
    b0, b1, b2 = xi - xb, xa - xb, xd - xa
    b1n = b1 / np.linalg.norm(b1, axis=-1, keepdims=True)
    v = b0 - (b0 * b1n).sum(-1, keepdims=True) * b1n
    w = b2 - (b2 * b1n).sum(-1, keepdims=True) * b1n
    bg = np.arctan2((np.cross(b1n, v) * w).sum(-1), (v * w).sum(-1))
    table = ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [1, 2, 0]])
    # atom 3 placed from (b=1, a=2, d=0): reorder points as (xd, xb, xa, xi) -> indices (0, 1, 2, 3)
    pts = np.stack([xd, xb, xa, xi], axis=1)
    ours = to_internal(torch.tensor(pts), table).dihedrals[:, 3].numpy()
    np.testing.assert_allclose(ours, bg, atol=1e-10)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([[0, 1, 2]],), r"z_matrix must have shape \(M, 4\), got \(1, 3\)"),
        (([[-2, 1, 2, 3]],), r"row 0 \[-2, 1, 2, 3\]: atom index must be >= 0"),
        (([[3, -2, 1, 0]], [0, 1, 2]), r"references must be atom indices or -1"),
        (([[3, -1, 1, 0]], [0, 1, 2]), r"-1 \(missing reference\) may only come last"),
        (([[3, 2, 1, 0], [3, 2, 1, 0]], [0, 1, 2]), r"atom 3 is placed by more than one row"),
        (([[3, 2, 1, 0]], [0, 1, 2, 3]), r"atom 3 is both fixed and placed"),
        (([[4, 2, 1, 0]], [0, 1, 2]), r"atoms \[3\] are neither placed by a z-matrix row nor fixed"),
        (([[3, 2, 1, 0]], [0, 1, 2], 3), r"atom index 3 out of range for n_atoms=3"),
        (([[3, 2, 1, 0]], [-1, 1, 2]), r"fixed atom index -1 must be >= 0"),
    ],
)
def test_bgflow_errors(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        refs_from_bgflow(*args)


def test_bgflow_invalid_table_rejected_by_core() -> None:
    with pytest.raises(ValueError):
        table_from_bgflow([[3, 2, 1, 0], [2, 3, 1, 0]], [0, 1])
