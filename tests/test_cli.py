"""The command line: in-process calls of main() plus one `python -m batched_nerf --help`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from batched_nerf.cli import main, rotatable_torsions
from batched_nerf.data import load
from batched_nerf.formats import read_xyz, read_zmat


def pdist(x: np.ndarray) -> np.ndarray:
    return np.linalg.norm(x[..., :, None, :] - x[..., None, :, :], axis=-1)


def test_python_m_help() -> None:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-m", "batched_nerf", "--help"], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    for command in ("info", "sample", "convert", "bench"):
        assert command in out.stdout


@pytest.mark.parametrize("command", [[], ["info"], ["sample"], ["convert"], ["bench"]])
def test_help_everywhere(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--help"]) == 0
    assert "usage: batched-nerf" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["sample"],
        ["sample", "chain_20"],
        ["sample", "chain_20", "-o", "x.xyz", "--n", "x"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from batched_nerf._version import __version__

    assert main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


# ---------------------------------------------------------------------- info
def test_info_lists_molecules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "alanine_dipeptide" in out and "benzene" in out


def test_info_molecule(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "alanine_dipeptide"]) == 0
    out = capsys.readouterr().out
    assert "22 atoms (C6H12N2O2)" in out
    assert "rotatable torsions: 5" in out
    # row 14 is phi: C built from CA, N, C(ACE) with dihedral -80
    line = next(s for s in out.splitlines() if s.strip().startswith("14 "))
    assert "8 CA" in line and "-80.000" in line
    assert "batched-nerf sample alanine_dipeptide" in out


def test_info_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    zmat = tmp_path / "water.zmat"
    zmat.write_text("O\nH 1 0.96\nH 1 0.96 2 104.5\n")
    assert main(["info", str(zmat)]) == 0
    assert "3 atoms (H2O)" in capsys.readouterr().out
    xyz = tmp_path / "water.xyz"
    xyz.write_text("3\nwater\nO 0 0 0\nH 0.96 0 0\nH -0.24 0.93 0\n")
    assert main(["info", str(xyz)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("water: water") and "2 bonds" in out


def test_info_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "unobtainium"]) == 2
    err = capsys.readouterr().err
    assert "neither a shipped molecule" in err and "alanine_dipeptide" in err


# -------------------------------------------------------------------- sample
def test_rotatable_torsions_alanine_and_benzene() -> None:
    ala = load("alanine_dipeptide")
    groups = rotatable_torsions(ala.table.refs.numpy(), ala.connectivity)
    rows = sorted(r for _, g in groups for r in g)
    # methyl rotors (0, 11, 19), phi (14) and psi (16); not the amide omegas (8, 18)
    assert rows == [0, 11, 14, 16, 19]
    benzene = load("benzene")
    assert rotatable_torsions(benzene.table.refs.numpy(), benzene.connectivity) == []


def test_sample_alanine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ala.xyz"
    assert main(["sample", "alanine_dipeptide", "--n", "64", "-o", str(out), "--seed", "3", "-q"]) == 0
    report = capsys.readouterr().out
    assert "wrote 64 conformers" in report and "atoms/s" in report
    ala = load("alanine_dipeptide")
    elements, xyz, comments = read_xyz(out)
    assert elements == ala.elements and xyz.shape == (64, 22, 3)
    assert comments[5] == "alanine_dipeptide conformer 5"
    # bonds and bond angles (1-3 distances) are those of the molecule; phi varies
    for i, j in ala.connectivity.tolist():
        np.testing.assert_allclose(pdist(xyz)[:, i, j], pdist(ala.to_cartesian().numpy())[i, j], atol=1e-4)
    phi = ala.metadata["phi"]
    assert np.ptp(pdist(xyz)[:, phi[0], phi[3]]) > 0.1
    # reproducible with the seed, different with another
    again = tmp_path / "again.xyz"
    assert main(["sample", "alanine_dipeptide", "--n", "64", "-o", str(again), "--seed", "3", "-q"]) == 0
    assert again.read_text() == out.read_text()
    other = tmp_path / "other.xyz"
    assert main(["sample", "alanine_dipeptide", "--n", "64", "-o", str(other), "--seed", "4", "-q"]) == 0
    assert other.read_text() != out.read_text()


@pytest.mark.parametrize(
    "extra",
    [["--uniform"], ["--torsions", "all", "--sigma", "5"], ["--dtype", "float32", "--chunk", "7"], []],
)
def test_sample_options(extra: list[str], tmp_path: Path) -> None:
    out = tmp_path / "c.xyz"
    assert main(["sample", "chain_20", "--n", "20", "-o", str(out), *extra]) == 0
    _, xyz, _ = read_xyz(out)
    assert xyz.shape == (20, 20, 3)
    np.testing.assert_allclose(np.linalg.norm(xyz[:, 1] - xyz[:, 0], axis=-1), 1.54, atol=1e-4)


def test_sample_from_files_and_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    zmat = tmp_path / "butane.zmat"
    zmat.write_text("C\nC 1 1.54\nC 2 1.54 1 112.0\nC 3 1.54 2 112.0 1 180.0\n")
    out = tmp_path / "b.xyz"
    assert main(["sample", str(zmat), "--n", "10", "-o", str(out), "-q"]) == 0
    assert "1 torsions drawn" in capsys.readouterr().out
    assert main(["sample", str(out), "--n", "5", "-o", str(tmp_path / "c.xyz"), "-q"]) == 0
    assert read_xyz(tmp_path / "c.xyz")[1].shape == (5, 4, 3)
    assert main(["sample", "benzene", "--n", "2", "-o", str(tmp_path / "bz.xyz"), "-q"]) == 0
    assert "no rotatable torsions" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--n", "0"], 2, "--n must be positive"),
        (["--sigma", "-1"], 2, "--sigma"),
        (["--device", "nonsense"], 2, "--device 'nonsense' is not available"),
        (["--chunk", "-1"], 2, "--chunk must be positive (or 0: automatic), got -1"),
        (["--precision", "-2"], 2, "--precision must be between 0 and 17, got -2"),
        (["--precision", "18"], 2, "--precision must be between 0 and 17, got 18"),
        (["--sigma", "nan"], 2, "--sigma must be a finite number >= 0 (degrees), got nan"),
        (["--sigma", "inf"], 2, "--sigma must be a finite number >= 0 (degrees), got inf"),
        (["--device", "meta"], 2, "--device 'meta' is not available: "),
        (["--seed", str(2**64)], 2, f"--seed must be an integer in [-2**63, 2**64), got {2**64}"),
    ],
)
def test_sample_bad_arguments(
    argv: list[str], code: int, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.xyz"
    assert main(["sample", "chain_20", "-q", "-o", str(out), *argv]) == code
    err = capsys.readouterr().err
    assert err == f"batched-nerf: error: {message}" + err[len("batched-nerf: error: ") + len(message) :]
    assert message in err and err.count("\n") == 1  # one line
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no (empty) output file


def test_sample_failure_leaves_no_partial_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import batched_nerf.formats.xyz

    calls = []

    def failing_write(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("xyz contains NaN or infinite values")
        write_xyz(*args, **kwargs)  # type: ignore[arg-type]

    write_xyz = batched_nerf.formats.xyz.write_xyz
    monkeypatch.setattr(batched_nerf.formats.xyz, "write_xyz", failing_write)
    out = tmp_path / "x.xyz"
    out.write_text("an earlier result\n")
    assert main(["sample", "chain_20", "-q", "--n", "30", "--chunk", "10", "-o", str(out)]) == 1
    assert len(calls) == 2 and "cannot write" in capsys.readouterr().err
    assert out.read_text() == "an earlier result\n"  # untouched, no half-written file beside it
    assert [p.name for p in tmp_path.iterdir()] == ["x.xyz"]


def test_sample_unwritable_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sample", "chain_20", "-o", str(tmp_path / "missing" / "x.xyz"), "-q"]) == 1
    assert "cannot write" in capsys.readouterr().err


# ------------------------------------------------------------------- convert
def test_convert_xyz_zmat_xyz(tmp_path: Path) -> None:
    ala = load("alanine_dipeptide")
    xyz_in = tmp_path / "ala.xyz"
    from batched_nerf.formats import write_xyz

    write_xyz(xyz_in, ala.elements, ala.to_cartesian().numpy(), "ala", precision=10)
    zmat = tmp_path / "ala.zmat"
    assert main(["convert", str(xyz_in), str(zmat), "--precision", "10"]) == 0
    z = read_zmat(zmat)
    assert sorted(z.elements or []) == sorted(ala.elements)
    back = tmp_path / "back.xyz"
    assert main(["convert", str(zmat), str(back)]) == 0
    elements, xyz, _ = read_xyz(back)
    # the same molecule: the sorted distance spectrum per element pair matches
    assert sorted(elements) == sorted(ala.elements)
    np.testing.assert_allclose(
        np.sort(pdist(xyz[0]).ravel()), np.sort(pdist(ala.to_cartesian().numpy()).ravel()), atol=1e-6
    )
    # xyz -> xyz keeps all frames
    assert main(["convert", str(back), str(tmp_path / "copy.xyz")]) == 0


def test_convert_with_table_file(tmp_path: Path) -> None:
    ala = load("alanine_dipeptide")
    from batched_nerf.formats import write_xyz

    xyz_in = tmp_path / "ala.xyz"
    write_xyz(xyz_in, ala.elements, ala.to_cartesian().numpy(), precision=10)
    refs = tmp_path / "refs.npy"
    np.save(refs, ala.table.refs.numpy())
    out = tmp_path / "ala.gzmat"
    assert main(["convert", str(xyz_in), str(out), "--table-from", str(refs), "--precision", "8"]) == 0
    z = read_zmat(out)
    np.testing.assert_allclose(np.sort(z.bonds.numpy()), np.sort(ala.bonds), atol=1e-6)
    bad = tmp_path / "bad.npy"
    np.save(bad, ala.table.refs.numpy()[:5])
    assert main(["convert", str(xyz_in), str(out), "--table-from", str(bad)]) == 1


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        ("3\nx\nO 0 0 0\nH 1 0 0\nH 0 x 0\n", 1, "line 5: could not parse coordinate"),
        ("two\n", 1, "line 1: expected the atom count"),
    ],
)
def test_convert_bad_xyz(
    text: str, code: int, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.xyz"
    path.write_text(text)
    assert main(["convert", str(path), str(tmp_path / "o.zmat")]) == code
    err = capsys.readouterr().err
    assert str(path) in err and message in err


def test_convert_bad_zmat_and_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.zmat"
    path.write_text("C\nH 1 -1.0\n")
    assert main(["convert", str(path), str(tmp_path / "o.xyz")]) == 1
    assert "line 2: bond length must be positive" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "missing.xyz"), str(tmp_path / "o.zmat")]) == 1
    assert "No such file" in capsys.readouterr().err
    assert main(["convert", str(path), str(tmp_path / "o.pdb")]) == 2
    assert "--format-out" in capsys.readouterr().err
    ok = tmp_path / "ok.xyz"
    ok.write_text("2\n\nH 0 0 0\nH 0.74 0 0\n")
    assert main(["convert", str(ok), str(tmp_path / "o.zmat"), "--frame", "3"]) == 2
    assert "--frame 3 out of range: the input has 1 frame(s)" in capsys.readouterr().err
    assert main(["convert", str(ok), str(tmp_path / "o.zmat"), "--precision", "-1"]) == 2
    assert "--precision must be between 0 and 17, got -1" in capsys.readouterr().err
    assert not (tmp_path / "o.zmat").exists() and not (tmp_path / "o.xyz").exists()


def _trajectory(path: Path, frames: int) -> None:
    lines = []
    for k in range(frames):
        lines += ["3", f"frame {k}", "O 0 0 0", f"H {0.9 + 0.0001 * k:.4f} 0 0", "H -0.24 0.93 0"]
    path.write_text("\n".join(lines) + "\n")


def test_convert_multi_frame_xyz_to_zmatrix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traj = tmp_path / "traj.xyz"
    _trajectory(traj, 1000)
    out = tmp_path / "t.zmat"
    assert main(["convert", str(traj), str(out)]) == 0
    report = capsys.readouterr().out
    assert "(frame 0 of 1000)" in report
    assert f"note: {traj} has 1000 frames; a Z-matrix holds one geometry: wrote frame 0" in report
    assert "--frame K" in report
    assert sorted(read_zmat(out).bonds[1:].tolist()) == pytest.approx([0.9, 0.960469], abs=1e-6)
    assert main(["convert", str(traj), str(out), "--frame", "-1"]) == 0  # the last one, no note
    report = capsys.readouterr().out
    assert "(frame -1 of 1000)" in report and "note: " + str(traj) not in report
    assert sorted(read_zmat(out).bonds[1:].tolist()) == pytest.approx([0.960469, 0.9999], abs=1e-6)
    assert main(["convert", str(traj), str(tmp_path / "all.xyz")]) == 0  # xyz keeps all frames
    assert "1000 frame(s)" in capsys.readouterr().out
    assert main(["info", str(traj)]) == 0
    assert f"note: {traj} has 1000 frames; using frame 0" in capsys.readouterr().err


def test_convert_failure_leaves_no_partial_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import batched_nerf.formats.gaussian

    def failing_write(path: str, *args: object, **kwargs: object) -> None:
        Path(path).write_text("C\nH 1 1.0")  # half a file, then the writer fails
        raise ValueError("cannot write row 2")

    monkeypatch.setattr(batched_nerf.formats.gaussian, "write_zmat", failing_write)
    ok = tmp_path / "ok.xyz"
    ok.write_text("2\n\nH 0 0 0\nH 0.74 0 0\n")
    assert main(["convert", str(ok), str(tmp_path / "o.zmat")]) == 1
    assert "cannot write row 2" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.xyz"]


#: invocations with bad values: each must end with a one-line ``error:`` and status 1 or 2
BAD_INVOCATIONS = [
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--chunk", "-1"],
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--precision", "-2"],
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--sigma", "nan"],
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--sigma", "inf"],
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--sigma=-inf"],
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--device", "meta"],
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--device", "banana"],
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--device", "cpu:-1"],
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--device", ""],
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--seed", "99999999999999999999999"],
    ["sample", "chain_20", "-o", "{tmp}/o.xyz", "--n", "-5"],
    ["sample", "chain_20", "-o", "{tmp}/missing/o.xyz"],
    ["sample", "{tmp}/missing.zmat", "-o", "{tmp}/o.xyz"],
    ["sample", "unobtainium", "-o", "{tmp}/o.xyz"],
    ["bench", "--device", "banana"],
    ["bench", "--device", "meta"],
    ["convert", "{tmp}/missing.xyz", "{tmp}/o.zmat"],
    ["convert", "{tmp}/o.zmat", "{tmp}/o.pdb"],
    ["info", "{tmp}/missing.xyz"],
    ["info", "chain_20.xyz", "--table-from", "{tmp}/missing.npy"],
]


@pytest.mark.parametrize("argv", BAD_INVOCATIONS, ids=" ".join)
def test_bad_invocations_print_no_traceback(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.format(tmp=tmp_path) for a in argv]
    try:
        code = main(argv)
    except BaseException as exc:  # a traceback for the user
        pytest.fail(f"{argv} raised {type(exc).__name__}: {exc}")
    captured = capsys.readouterr()
    assert code in (1, 2), captured.err
    assert "Traceback" not in captured.err + captured.out
    errors = [line for line in captured.err.splitlines() if "error" in line]
    assert len(errors) == 1 and re.match(r"batched-nerf( \w+)?: error: ", errors[0]), captured.err
    assert not (tmp_path / "o.xyz").exists() and not (tmp_path / "o.zmat").exists()


def test_bad_invocation_as_a_process() -> None:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "batched_nerf", "bench", "--device", "banana"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("batched-nerf: error: --device 'banana' is not available")


def test_convert_chemcoord_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "chemcoord", None)
    path = tmp_path / "w.zmat"
    path.write_text("O\nH 1 0.96\nH 1 0.96 2 104.5\n")
    assert main(["convert", str(path), str(tmp_path / "o.cc"), "--format-out", "chemcoord"]) == 1
    assert "pip install chemcoord" in capsys.readouterr().err


def test_convert_chemcoord_roundtrip(tmp_path: Path) -> None:
    pytest.importorskip("chemcoord", reason="chemcoord is not installed (optional)")
    ala = load("alanine_dipeptide")
    from batched_nerf.formats import write_zmat

    zmat = tmp_path / "ala.zmat"
    write_zmat(zmat, ala.elements, ala.table.refs, ala.bonds, ala.angles, ala.dihedrals, precision=10)
    cc_file = tmp_path / "ala.cczmat"
    assert main(["convert", str(zmat), str(cc_file), "--format-out", "chemcoord", "--precision", "10"]) == 0
    out = tmp_path / "ala.xyz"
    assert main(["convert", str(cc_file), str(out), "--format-in", "chemcoord"]) == 0
    direct = tmp_path / "direct.xyz"
    assert main(["convert", str(zmat), str(direct)]) == 0
    # chemcoord's frame is ours: identical coordinates, not just distances
    np.testing.assert_allclose(read_xyz(out)[1], read_xyz(direct)[1], atol=1e-6)
    # and chemcoord -> Gaussian goes through a new (automatic) table
    assert main(["convert", str(cc_file), str(tmp_path / "again.zmat"), "--format-in", "chemcoord"]) == 0


# --------------------------------------------------------------------- bench
def test_bench_launches_checkout_suite(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []

    def run(cmd: list[str], check: bool = False) -> subprocess.CompletedProcess:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 3)

    import batched_nerf.cli

    root = Path(__file__).resolve().parents[1]  # this checkout, whichever copy of the package is imported
    monkeypatch.setattr(batched_nerf.cli, "__file__", str(root / "batched_nerf" / "cli.py"))
    monkeypatch.setattr(subprocess, "run", run)
    assert main(["bench", "--quick", "--out", "res", "--no-peers", "--device", "cpu"]) == 3  # its status
    script = root / "benchmarks" / "run.py"
    assert calls == [
        [sys.executable, str(script), "--device", "cpu", "--quick", "--out", "res", "--no-peers"]
    ]
    assert str(script) in capsys.readouterr().err


def test_bench_without_checkout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import batched_nerf.cli

    monkeypatch.setattr(batched_nerf.cli, "__file__", str(tmp_path / "batched_nerf" / "cli.py"))
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "not part of the installed package" in err
    assert "python benchmarks/run.py --quick" in err
