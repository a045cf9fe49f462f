"""Reliability of the formats and of bond perception: writers produce what their readers take, clear errors.

Each test pins a defect that was reproduced: a writer whose output its own
reader refused, a reader that accepted nonsense, or a message that pointed at
the wrong line or spoke of internal table rows.
"""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf.formats import (
    read_chemcoord,
    read_gaussian,
    read_xyz,
    read_zmat,
    to_chemcoord,
    write_gaussian,
    write_xyz,
    write_zmat,
)

WATER = [[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0]]
BOM = "\ufeff"


def water_zmatrix() -> bn.ZMatrix:
    return read_zmat(io.StringIO("O\nH 1 0.96\nH 1 0.96 2 104.5\nH 1 1.0 2 100.0 3 120.0\n"))


# ------------------------------------------------------------ write_zmat
def test_write_zmat_normalises_angles_outside_0_180_to_the_same_positions() -> None:
    z = water_zmatrix()
    xyz = z.to_cartesian()
    angles = z.angles.clone()
    dihedrals = z.dihedrals.clone()
    angles[3] = 2 * math.pi - angles[3]  # 260 deg: the same point with the dihedral turned by 180
    dihedrals[3] = dihedrals[3] + math.pi
    odd = bn.ZMatrix(z.table, z.bonds, angles, dihedrals, elements=z.elements)
    torch.testing.assert_close(odd.to_cartesian(), xyz)
    for angle in (angles[3], angles[3] - 2 * math.pi):  # 260 and -100 deg
        a = angles.clone()
        a[3] = angle
        out = io.StringIO()
        write_zmat(out, bn.ZMatrix(z.table, z.bonds, a, dihedrals, elements=z.elements), precision=10)
        line = out.getvalue().splitlines()[3].split()
        assert float(line[4]) == pytest.approx(100.0, abs=1e-9)
        assert float(line[6]) == pytest.approx(120.0, abs=1e-9)
        back = read_zmat(io.StringIO(out.getvalue()))
        torch.testing.assert_close(back.to_cartesian(), xyz, atol=1e-9, rtol=0)


def test_write_zmat_third_seed_angle_above_180_is_the_same_molecule() -> None:
    z = water_zmatrix()
    angles = z.angles.clone()
    angles[2] = math.radians(360 - 104.5)
    odd = bn.ZMatrix(z.table, z.bonds, angles, z.dihedrals, elements=z.elements)
    out = io.StringIO()
    write_zmat(out, odd, precision=10)
    assert out.getvalue().splitlines()[2] == "H 1 0.9600000000 2 104.5000000000"
    back = read_zmat(io.StringIO(out.getvalue()))
    torch.testing.assert_close(back.angles, z.angles)
    # the same molecule (turned about its first bond): all distances agree, chirality too
    x, y = odd.to_cartesian(), back.to_cartesian()
    torch.testing.assert_close(torch.cdist(x, x), torch.cdist(y, y), atol=1e-9, rtol=0)
    volume = torch.linalg.det(torch.stack([x[1] - x[0], x[2] - x[0], x[3] - x[0]]))
    torch.testing.assert_close(volume, torch.linalg.det(torch.stack([y[1] - y[0], y[2] - y[0], y[3] - y[0]])))


@pytest.mark.parametrize("label", ["C 1", "", " C", "C,1", "C!", "1C"])
def test_write_zmat_refuses_labels_that_do_not_read_back(label: str) -> None:
    z = water_zmatrix()
    elements = list(z.elements or [])
    elements[1] = label
    with pytest.raises(
        ValueError, match=rf"atom 1: element label {label!r} cannot be written: it must be one"
    ):
        write_zmat(io.StringIO(), elements, z.table, z.bonds, z.angles, z.dihedrals)
    zl = bn.ZMatrix(z.table, z.bonds, z.angles, z.dihedrals, elements=elements)
    with pytest.raises(ValueError, match=r"atom 1: element label"):
        write_gaussian(io.StringIO(), zl, cartesian=True)


@pytest.mark.parametrize("precision", [-1, 1.5, True])
def test_writers_refuse_bad_precisions(precision: object) -> None:
    z = water_zmatrix()
    msg = rf"precision must be a non-negative integer \(decimals per value\), got {precision!r}"
    with pytest.raises(ValueError, match=msg):
        write_zmat(io.StringIO(), z, precision=precision)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=msg):
        write_gaussian(io.StringIO(), z, precision=precision)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=msg):
        write_gaussian(io.StringIO(), z, cartesian=True, precision=precision)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=msg):
        write_xyz(io.StringIO(), ["H"], [[0.0, 0.0, 0.0]], precision=precision)  # type: ignore[arg-type]


# -------------------------------------------------------- write_gaussian
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"charge": 1.5}, r"charge must be an integer, got 1.5"),
        ({"charge": True}, r"charge must be an integer, got True"),
        ({"multiplicity": 2.0}, r"multiplicity must be an integer, got 2.0"),
    ],
)
def test_write_gaussian_refuses_non_integer_charge_and_multiplicity(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        write_gaussian(io.StringIO(), water_zmatrix(), **kwargs)


def test_write_gaussian_takes_a_link0_string_as_one_line() -> None:
    out = io.StringIO()
    write_gaussian(out, water_zmatrix(), link0="%chk=a.chk", charge=0, multiplicity=2)
    assert out.getvalue().startswith("%chk=a.chk\n#p sp\n")
    assert read_gaussian(io.StringIO(out.getvalue())).link0 == ["%chk=a.chk"]
    out = io.StringIO()
    write_gaussian(out, water_zmatrix(), link0="%chk=a.chk\n%mem=1GB", multiplicity=2)
    assert read_gaussian(io.StringIO(out.getvalue())).link0 == ["%chk=a.chk", "%mem=1GB"]


# ------------------------------------------------------------- read_zmat
def test_zmatrix_line_with_an_extra_field_is_named() -> None:
    text = "O\nH 1 0.96 2\nH 1 0.96 2 104.5\n"
    with pytest.raises(ValueError) as info:
        read_zmat(io.StringIO(text))
    assert str(info.value) == (
        "line 2: atom 2 has 4 fields, the form of a Cartesian line 'label x y z', but Cartesian lines "
        "cannot follow the Z-matrix line 1 (its frame would not be defined); as a Z-matrix line atom 2 "
        "expects 3 fields (an element and 1 (reference, value) pairs)"
    )


def test_zmatrix_seed_line_after_cartesian_lines_is_named() -> None:
    with pytest.raises(
        ValueError,
        match=r"^line 2: atom 2 is a Z-matrix line with 1 reference\(s\) after the Cartesian line 1",
    ):
        read_zmat(io.StringIO("C 0 0 0\nH 1 1.09\n"))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "O\nH 1 1e400\n",
            r"^line 2: could not parse bond '1e400' as a finite number \(it overflows float64\)$",
        ),
        ("O\nH 1 0.96\nH 1 0.96 2 1D400\n", r"^line 3: could not parse angle '1D400' as a finite number"),
        (
            "O\nH 1 0.96\nH 1 0.96 2 104.5\nH 1 1.0 2 100.0 3 -9.9e999\n",
            r"^line 4: could not parse dihedral '-9.9e999' as a finite number \(it overflows float64\)$",
        ),
        (
            "O\nH 1 R\n\nR 1.0d+309\n",
            r"^line 4: could not parse the value of variable 'R' '1.0d\+309' as a finite number \(it over",
        ),
        ("O 0 0 0\nH 0.96 1e400 0\n", r"^line 2: could not parse coordinate '1e400' as a finite number"),
    ],
    ids=["bond", "angle", "dihedral", "variable", "cartesian"],
)
def test_read_zmat_refuses_numbers_that_overflow_float64(text: str, match: str) -> None:
    """``float("1e400")`` is ``inf``: every number of a Z-matrix file goes through one finiteness check."""
    with pytest.raises(ValueError, match=match):
        read_zmat(io.StringIO(text))
    with pytest.raises(ValueError, match=match):
        read_gaussian(io.StringIO(text))


def test_read_zmat_reads_large_finite_and_fortran_numbers() -> None:
    z = read_zmat(io.StringIO("O\nH 1 R\nH 1 1.7976931348623157e308 2 104.5D0\n\nR 0.96D0\n"))
    assert z.bonds.tolist() == [0.0, 0.96, 1.7976931348623157e308]
    assert z.angles[2].item() == pytest.approx(math.radians(104.5))


def test_finite_float_is_the_one_number_check() -> None:
    from batched_nerf.core.files import finite_float

    assert finite_float("-1.5e3", "line 1", "x") == -1500.0
    assert finite_float("2.5D-1", "line 1", "x", fortran=True) == 0.25
    cases = {
        "1e400": "a finite number (it overflows float64)",
        "inf": "a finite number",
        "NaN": "a finite number",
        "1_0": "a number (no '_' digit separators)",
        "x1": "a number",
        "2.5D-1": "a number",  # not without fortran=True
    }
    for token, kind in cases.items():
        with pytest.raises(ValueError) as info:
            finite_float(token, "line 7", "bond")
        assert str(info.value) == f"line 7: could not parse bond {token!r} as {kind}"


# ------------------------------------------------------------------ BOM
def test_byte_order_mark_is_accepted_everywhere(tmp_path: Path) -> None:
    xyz_text = "3\nwater\nO 0 0 0\nH 0.96 0 0\nH -0.24 0.93 0\n"
    zmat_text = "O\nH 1 0.96\nH 1 0.96 2 104.5\n"
    gjf_text = "#p sp\n\nwater\n\n0 1\n" + zmat_text + "\n"
    for name, text, read in (
        ("w.xyz", xyz_text, read_xyz),
        ("w.gzmat", zmat_text, read_zmat),
        ("w.gjf", gjf_text, read_gaussian),
    ):
        path = tmp_path / name
        path.write_text(BOM + text, encoding="utf-8")
        plain = tmp_path / ("plain-" + name)
        plain.write_text(text, encoding="utf-8")
        got, want = read(path), read(plain)
        if name.endswith(".xyz"):
            assert got[0] == want[0] == ["O", "H", "H"]
            np.testing.assert_array_equal(got[1], want[1])
        else:
            z = got if isinstance(got, bn.ZMatrix) else got.zmatrix
            assert z.elements == ["O", "H", "H"]
        assert read(io.StringIO(BOM + text)) is not None  # a text handle holding the mark


def test_bytes_streams_are_decoded() -> None:
    elements, xyz, comments = read_xyz(io.BytesIO(b"\xef\xbb\xbf2\nc\nO 0 0 0\nH 1 0 0\n"))
    assert elements == ["O", "H"] and comments == ["c"]
    assert all(isinstance(e, str) for e in elements)
    assert read_zmat(io.BytesIO(b"O\nH 1 0.96\n")).elements == ["O", "H"]
    with pytest.raises(ValueError, match=r"the stream is not UTF-8 text: byte 8 cannot be decoded"):
        read_xyz(io.BytesIO(b"1\nc\nH 0 \xff 0\n"))


# -------------------------------------------------------------- read_xyz
@pytest.mark.parametrize(
    ("token", "match"),
    [
        ("0_96", r"line 4: could not parse coordinate '0_96' as a number \(no '_' digit separators\)$"),
        ("nan", r"line 4: could not parse coordinate 'nan' as a finite number"),
        ("-inf", r"line 4: could not parse coordinate '-inf' as a finite number"),
        ("1e999", r"line 4: could not parse coordinate '1e999' as a finite number \(it overflows float64\)$"),
        ("-1E+400", r"line 4: could not parse coordinate '-1E\+400' as a finite number \(it overflows"),
        ("1d0", r"line 4: could not parse coordinate '1d0' as a number$"),
    ],
)
def test_read_xyz_refuses_underscores_and_non_finite_coordinates(token: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_xyz(io.StringIO(f"2\nc\nO 0 0 0\nH {token} 0 0\n"))


def test_read_xyz_refuses_an_atom_count_with_underscores() -> None:
    with pytest.raises(ValueError, match=r"line 1: expected the atom count, got '1_0'"):
        read_xyz(io.StringIO("1_0\nc\n" + "H 0 0 0\n" * 10))


# ---------------------------------------------------- tables from coordinates
def test_from_xyz_refuses_a_string_of_elements() -> None:
    with pytest.raises(
        TypeError,
        match=r"elements must be a sequence of element symbols such as \['O', 'H', 'H'\], "
        r"got the string 'OHH' \(a string would be split into characters\)",
    ):
        bn.ConstructionTable.from_xyz(WATER, "OHH")
    with pytest.raises(TypeError, match=r"got the string 'OHH'"):
        bn.perceive_connectivity(WATER, "OHH")


def test_dummy_atoms_never_bond() -> None:
    xyz = [*WATER, [0.3, 0.3, 0.2]]  # a dummy 0.47 A from the oxygen, 0.68 from a hydrogen
    assert bn.perceive_connectivity(xyz, ["O", "H", "H", "X"]).tolist() == [[0, 1], [0, 2]]
    auto = bn.topology.auto.refs_from_xyz(xyz, ["O", "H", "H", "X"])
    assert auto.nonbonded[3].all()  # linked, not bonded


def test_bohr_warning_names_real_atoms_only() -> None:
    # bohr-sized coordinates with a dummy sitting on a hydrogen's bond: the closest *real* pair is named
    xyz = np.array([*WATER, [0.8, 0.0, 0.0]]) / 0.529177210903
    with pytest.warns(UserWarning) as caught:
        bn.perceive_connectivity(xyz, ["O", "H", "H", "X"])
    message = str(caught[0].message)
    assert "no bond perceived for 3 of 3 atoms; the closest pair, atoms 0 (O) and 1 (H)" in message
    assert "(X)" not in message


# ------------------------------------------------------------- chemcoord files
@pytest.mark.parametrize("token", ["1e400", "-inf", "nan"])
def test_read_chemcoord_refuses_numbers_that_are_not_finite(token: str) -> None:
    """The check runs before chemcoord is imported: no chemcoord needed."""
    text = f"O origin 0.0 e_z 0.0 e_x 0.0\nH 1 0.96 e_z {token} e_x 0.0\n"
    with pytest.raises(
        ValueError, match=rf"^the input: line 2 \(atom 2\): could not parse value '{token}' as a finite"
    ):
        read_chemcoord(io.StringIO(text))


def test_read_chemcoord_names_the_empty_file(tmp_path: Path) -> None:
    pytest.importorskip("chemcoord", reason="needs chemcoord")
    path = tmp_path / "empty.zmat"
    path.write_text("")
    with pytest.raises(ValueError) as info:
        read_chemcoord(path)
    assert str(info.value) == (
        f"{str(path)!r}: empty chemcoord Z-matrix: no atom lines 'atom b bond a angle d dihedral' found"
    )
    with pytest.raises(ValueError, match=r"^the input: empty chemcoord Z-matrix"):
        read_chemcoord(io.StringIO("# only a comment\n\n"))


def test_read_chemcoord_reads_what_to_chemcoord_writes_with_a_bom(tmp_path: Path) -> None:
    pytest.importorskip("chemcoord", reason="needs chemcoord")
    z = water_zmatrix()
    path = tmp_path / "w.zmat"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to_chemcoord(z).to_zmat(str(path))
        path.write_text(BOM + path.read_text())
        back = read_chemcoord(path)
    torch.testing.assert_close(back.to_cartesian()[:4], z.to_cartesian(), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "O origin 0.0 e_z 0.0 e_x 0.0\nH 1 0.96 e_z 90.0 e_x 0.0 5\n",
            r"^the input: line 2 \(atom 2\): expected 7 fields 'atom b bond a angle d dihedral', got 8$",
        ),
        (
            "# water\nO origin 0.0 e_z 0.0 e_x 0.0\nH 7 0.96 e_z 90.0 e_x 0.0\n",
            r"^the input: line 3 \(atom 2\): reference '7' is neither another atom's number \(1..2\) nor an",
        ),
        (
            "O origin 0.0 e_z 0.0 e_x 0.0\nH 1 abc e_z 90.0 e_x 0.0\n",
            r"^the input: line 2 \(atom 2\): could not parse value 'abc' as a number$",
        ),
        ("O\nH 1 0.96 2\n", r"^the input: line 2 \(atom 2\): expected 3 fields 'atom b bond', got 4$"),
    ],
)
def test_read_chemcoord_names_the_files_line_and_atom(text: str, match: str) -> None:
    pytest.importorskip("chemcoord", reason="needs chemcoord")
    with pytest.raises(ValueError, match=match):
        read_chemcoord(io.StringIO(text))
