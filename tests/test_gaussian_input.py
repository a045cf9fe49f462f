"""Full Gaussian input files (.gjf/.com): header, Cartesian and Z-matrix lines, dummies, isotopes."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf.cli import main
from batched_nerf.formats import GaussianInput, read_gaussian, read_xyz, read_zmat, write_gaussian, write_xyz

FULL = """%chk=methane.chk
%mem=1GB
#p B3LYP/6-31G(d)
 opt freq

methane, symmetric
second title line

0 1
C
H 1 R
H 1 R 2 A
H 1 R 2 A 3 D
H 1 R 2 A 3 -D
 Variables:
R 1.09
A 109.4712

Constants:
D 120.0

C 0
6-31G(d)
****

"""

CARTESIAN = """#p hf/3-21g

HOD, a dummy on top

0 1
O   0.0   0.0   0.0
D   0     0.96  0.0   0.0
H  -0.24  0.93  zH
X   0.0   0.0   1.0

zH 0.0
"""


def test_read_full_input_header_zmatrix_and_trailing_sections() -> None:
    g = read_gaussian(io.StringIO(FULL))
    assert isinstance(g, GaussianInput)
    assert g.link0 == ["%chk=methane.chk", "%mem=1GB"]
    assert g.route == "#p B3LYP/6-31G(d)\nopt freq"
    assert g.title == "methane, symmetric\nsecond title line"
    assert (g.charge, g.multiplicity) == (0, 1)
    z = g.zmatrix
    assert z.elements == ["C", "H", "H", "H", "H"]
    np.testing.assert_allclose(np.degrees(z.dihedrals.numpy()), [0, 0, 0, 120.0, -120.0])
    xyz = z.to_cartesian().numpy()
    hh = np.linalg.norm(xyz[1:, None] - xyz[None, 1:], axis=-1)[np.triu_indices(4, 1)]
    np.testing.assert_allclose(hh, hh[0], atol=1e-4)  # a regular tetrahedron
    # read_zmat takes the same file, without the header
    assert read_zmat(io.StringIO(FULL)).elements == z.elements
    # a bare Z-matrix has no header
    bare = read_gaussian(io.StringIO("O\nH 1 0.96\n"))
    assert (bare.route, bare.title, bare.charge, bare.multiplicity, bare.link0) == (
        None,
        None,
        None,
        None,
        [],
    )


def test_read_cartesian_lines_dummies_isotopes_and_variables() -> None:
    g = read_gaussian(io.StringIO(CARTESIAN))
    z = g.zmatrix
    assert z.elements == ["O", "D", "H", "X"] and z.real.tolist() == [True, True, True, False]
    assert z.table.n_fixed == 4  # Cartesian atoms are fixed atoms: kept exactly as written
    expected = np.array([[0.0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]])
    np.testing.assert_allclose(z.to_cartesian().numpy(), expected, atol=0)
    assert z.to_cartesian(dummies=True).shape == (4, 3)
    # D is bonded as hydrogen
    assert bn.perceive_connectivity(expected, z.real_elements or []).tolist() == [[0, 1], [0, 2]]


def test_zmatrix_lines_after_cartesian_lines() -> None:
    text = "#p hf\n\nformaldehyde\n\n0 1\nC 0 0 0\nO 1.2 0 0\nH -0.5 0.9 0\nH 1 1.09 2 120.0 3 180.0\n\n"
    z = read_zmat(io.StringIO(text))
    xyz = z.to_cartesian().numpy()
    assert z.table.refs.tolist()[3] == [0, 1, 2] and z.table.n_fixed == 3
    assert np.linalg.norm(xyz[3] - xyz[0]) == pytest.approx(1.09)
    assert xyz[3, 2] == pytest.approx(0.0, abs=1e-12) and xyz[3, 1] < 0  # trans to the first H, in-plane


def test_isotopes_and_dummies_in_zmatrix_lines() -> None:
    z = read_zmat(io.StringIO("O\nD 1 0.96\nT1 1 0.96 2 104.5\nX 1 1.0 2 90.0 3 180.0\n"))
    assert z.elements == ["O", "D", "T", "X"] and z.n_real == 3


@pytest.mark.parametrize("variables", [False, True])
def test_write_full_input_round_trip(variables: bool, tmp_path: Path) -> None:
    z = read_zmat(io.StringIO(FULL))
    path = tmp_path / "m.gjf"
    order = write_gaussian(
        path,
        z,
        route="#p B3LYP/6-31G(d)\nopt",
        title="methane",
        link0=["%chk=m.chk"],
        variables=variables,
        precision=8,
    )
    text = path.read_text()
    assert text.endswith("\n\n")  # Gaussian needs the closing blank line
    g = read_gaussian(path)
    header = (g.route, g.title, g.charge, g.multiplicity, g.link0)
    assert header == ("#p B3LYP/6-31G(d)\nopt", "methane", 0, 1, ["%chk=m.chk"])
    assert g.zmatrix.elements == [z.elements[i] for i in order]  # type: ignore[index]
    torch.testing.assert_close(g.zmatrix.to_cartesian(), z.to_cartesian()[order], atol=1e-7, rtol=0)


def test_write_cartesian_input_keeps_fixed_atoms_and_multiplicity() -> None:
    z = read_zmat(io.StringIO(CARTESIAN))
    out = io.StringIO()
    order = write_gaussian(out, z, cartesian=True, charge=1)
    assert order.tolist() == [0, 1, 2, 3]
    g = read_gaussian(io.StringIO(out.getvalue()))
    assert (g.charge, g.multiplicity) == (1, 2)  # 9 electrons: a doublet (the dummy has none)
    assert g.zmatrix.elements == ["O", "D", "H", "X"]
    torch.testing.assert_close(g.zmatrix.to_cartesian(dummies=True), z.to_cartesian(dummies=True))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("%chk=a.chk\nC\n", r"line 2: expected the route section \(a line starting with '#'\)"),
        ("#p hf\n", r"line 2: expected the title section"),
        ("#p hf\n\ntitle\n\nC\n", r"line 5: expected the charge and multiplicity \(e.g. '0 1'\), got 'C'"),
        ("#p hf\n\ntitle\n", r"line 4: expected the charge and multiplicity \(e.g. '0 1'\), got the end"),
        ("#p hf\n\nt\n\n0 0\nC\n", r"line 5: the multiplicity must be a positive integer, got 0"),
        ("#p hf\n\nt\n\n0 1\n\n", r"line 6: no atom lines found"),
        (
            "C\nO 1.2 0 0\n",
            r"line 2: atom 2 has 4 fields, the form of a Cartesian line .label x y z., but Cartesian lines "
            r"cannot follow the Z-matrix line 1",
        ),
        ("O 0 0 0\nH 0.9 0 zz\n", r"line 2: undefined variable 'zz'"),
        ("#p hf\n\nt\n\n0 1\nC\nH 1 R\n\nbasis\n", r"line 7: undefined variable 'R'"),
    ],
)
def test_read_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_gaussian(io.StringIO(text))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"route": "p hf"}, r"route section must start with '#'"),
        ({"route": "#p hf\n\nopt"}, r"route section must start with '#' and have no blank lines"),
        ({"title": "  "}, r"title must be non-blank"),
        ({"link0": ["chk=a.chk"]}, r"Link 0 lines must start with '%'"),
        ({"multiplicity": 2}, r"multiplicity 2 does not fit 10 electrons \(charge 0\)"),
        ({"multiplicity": 0}, r"multiplicity 0 does not fit"),
    ],
)
def test_write_errors(kwargs: dict, match: str) -> None:
    water = read_zmat(io.StringIO("O\nH 1 0.96\nH 1 0.96 2 104.5\n"))
    with pytest.raises(ValueError, match=match):
        write_gaussian(io.StringIO(), water, **kwargs)


def test_write_type_and_fixed_atom_errors() -> None:
    with pytest.raises(TypeError, match="expected a batched_nerf.ZMatrix"):
        write_gaussian(io.StringIO(), "water")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot hold fixed atoms"):
        write_gaussian(io.StringIO(), read_zmat(io.StringIO(CARTESIAN)))


def test_cli_gjf_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "hod.gjf"
    src.write_text(CARTESIAN)
    xyz_file = tmp_path / "hod.xyz"
    assert main(["convert", str(src), str(xyz_file)]) == 0
    elements, frames, _ = read_xyz(xyz_file)
    assert elements == ["O", "D", "H"]
    out = tmp_path / "again.com"
    assert main(["convert", str(xyz_file), str(out), "--precision", "10"]) == 0
    g = read_gaussian(out)
    assert g.title == "hod.xyz converted by batched-nerf" and g.route == "#p sp"
    assert (g.charge, g.multiplicity) == (0, 1)
    back = g.zmatrix.to_cartesian().numpy()
    d0 = np.linalg.norm(frames[0][:, None] - frames[0][None], axis=-1)
    assert g.zmatrix.elements == elements  # O is the root: no reordering
    np.testing.assert_allclose(np.linalg.norm(back[:, None] - back[None], axis=-1), d0, atol=1e-8)
    # xyz -> gjf -> xyz through --format-in/--format-out too
    assert main(["convert", str(out), str(tmp_path / "b.txt"), "--format-out", "xyz"]) == 0
    write_xyz(tmp_path / "w.xyz", ["O", "H", "H"], [[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]])
    assert main(["convert", str(tmp_path / "w.xyz"), str(tmp_path / "w.inp"), "--format-out", "gjf"]) == 0
    assert read_gaussian(tmp_path / "w.inp").route == "#p sp"
    assert "error" not in capsys.readouterr().err


def test_gaussian_isotope_spelling_round_trips() -> None:
    z = read_zmat(io.StringIO("O\nH(Iso=2) 1 0.96\nH(Iso=3, Spin=1) 1 0.96 2 104.5\n"))
    assert z.elements == ["O", "D", "T"]
    out = io.StringIO()
    write_gaussian(out, z, precision=3)
    text = out.getvalue()
    assert "H(Iso=2) 1 0.960\n" in text and "H(Iso=3) 1 0.960 2 104.500\n" in text
    assert read_gaussian(io.StringIO(text)).zmatrix.elements == ["O", "D", "T"]
    # the bare Z-matrix writer keeps D and T, which read_zmat reads too
    bare = io.StringIO()
    from batched_nerf.formats import write_zmat

    write_zmat(bare, z)
    assert bare.getvalue().splitlines()[1].startswith("D 1 ")
