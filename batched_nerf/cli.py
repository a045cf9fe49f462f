"""The ``batched-nerf`` command line (also ``python -m batched_nerf``).

Subcommands:

* ``info [MOLECULE]``: the construction table, atoms and a summary of a shipped
  molecule ([`batched_nerf.data.available`][batched_nerf.data.available]) or of a ``.zmat``/``.xyz`` file;
  without an argument, the list of shipped molecules.
* ``sample MOLECULE -o OUT.xyz``: many conformers from one batched conversion,
  drawing the rotatable torsions (Gaussian perturbations or uniformly),
  written as a multi-frame XYZ file.
* ``convert IN OUT``: between XYZ, Gaussian-style Z-matrices and chemcoord's
  Z-matrix files, choosing a construction table automatically when needed.
* ``warmup``: compile (or load) every CPU kernel of the fused engine ahead of use
  ([`batched_nerf.warmup`][batched_nerf.warmup]), e.g. while building a container image.
* ``bench``: the benchmark suite.

Exit status: 0 on success, 1 for bad input (the message names the file, line
and reason), 2 for usage errors.

Example:
    >>> from batched_nerf.cli import main
    >>> main(["info", "chain_20"])  # doctest: +ELLIPSIS
    chain_20: ...
    0
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any

import numpy as np
import torch

from ._version import __version__
from .core.table import ConstructionTable
from .core.zmatrix import ZMatrix, formula
from .torsion_space.ops import rotatable_torsions

__all__ = ["main"]

PROG = "batched-nerf"
_EXTENSIONS = {
    ".xyz": "xyz",
    ".zmat": "gzmat",
    ".gzmat": "gzmat",
    ".gzm": "gzmat",
    ".gjf": "gjf",
    ".com": "gjf",
}
_FORMATS = ("xyz", "gzmat", "gjf", "chemcoord")


class CliError(Exception):
    """An error reported as ``batched-nerf: error: ...`` with exit status ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------- options
_PRECISION_MAX = 17  # decimals; beyond float64's resolution for coordinates of a few Angstrom


def _check_range(option: str, value: float, low: float, high: float | None = None, what: str = "") -> None:
    """Raise the usage error (exit 2) ``--option must be ..., got value`` unless ``low <= value <= high``.

    NaN and infinities always fail (``math.isfinite``).
    """
    if math.isfinite(value) and low <= value and (high is None or value <= high):
        return
    bound = what or (f"between {low} and {high}" if high is not None else f">= {low}")
    raise CliError(f"{option} must be {bound}, got {value}", code=2)


def _device_of(option: str, spec: str) -> torch.device:
    """``torch.device(spec)`` after a round trip of a tensor through it (``meta`` holds no data: refused)."""
    try:
        device = torch.device(spec)
        torch.zeros(1, device=device).cpu()
    except Exception as exc:  # RuntimeError, AssertionError, NotImplementedError, ImportError, ...
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CliError(f"{option} {spec!r} is not available: {reason}", code=2) from None
    return device


@contextlib.contextmanager
def _output(path: str) -> Iterator[str]:
    """A temporary path next to ``path``, renamed to ``path`` when the block succeeds, removed otherwise.

    A failed or interrupted command leaves no partial output (and an existing
    ``path`` untouched). Special files (``/dev/stdout``, FIFOs) are written directly.
    """
    if os.path.exists(path) and not os.path.isfile(path):
        yield path
        return
    head, tail = os.path.split(path)
    stem, ext = os.path.splitext(tail)
    tmp = os.path.join(head, f".{stem}.partial-{os.getpid()}{ext}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)


# --------------------------------------------------------------------------- input
def _format_of(path: str, explicit: str | None) -> str:
    if explicit is not None:
        return explicit
    ext = os.path.splitext(path)[1].lower()
    if ext not in _EXTENSIONS:
        known = ", ".join(sorted(_EXTENSIONS))
        raise CliError(
            f"cannot tell the format of {path!r} from its extension (known: {known}); "
            "pass --format-in/--format-out (xyz, gzmat, gjf or chemcoord)",
            code=2,
        )
    return _EXTENSIONS[ext]


def _bad_input(path: str, exc: Exception) -> CliError:
    return CliError(f"{path}: {exc}", code=1)


def _read_xyz(path: str) -> tuple[list[str], np.ndarray, list[str]]:
    from .formats.xyz import read_xyz

    try:
        return read_xyz(path)
    except OSError as exc:
        raise CliError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise _bad_input(path, exc) from None


def _read_gzmat(path: str) -> ZMatrix:
    from .formats.gaussian import read_zmat

    try:
        return read_zmat(path)
    except OSError as exc:
        raise CliError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise _bad_input(path, exc) from None


def _import_chemcoord() -> Any:
    try:
        import chemcoord
    except ImportError:
        raise CliError(
            "the chemcoord format needs the optional package chemcoord: pip install chemcoord", code=1
        ) from None
    return chemcoord


def _read_chemcoord(path: str) -> ZMatrix:
    from .formats.chemcoord import read_chemcoord

    _import_chemcoord()
    if not os.path.exists(path):
        raise CliError(f"cannot read {path!r}: No such file or directory")
    try:  # checks the lines (byte-order marks, empty or malformed files: named by line and atom)
        return read_chemcoord(path)
    except Exception as exc:  # chemcoord raises many kinds of errors
        raise _bad_input(path, exc) from None


def _table_from(spec: str, xyz: np.ndarray, elements: list[str]) -> ConstructionTable:
    """``auto`` (bond perception on ``xyz``, fragments linked) or a ``.npy``/text file of ``(N, 3)`` refs."""
    import warnings

    if spec == "auto":
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UserWarning)
                table = ConstructionTable.from_xyz(xyz, elements)
        except ValueError as exc:
            raise CliError(f"cannot choose a construction table automatically: {exc}") from None
        for w in caught:
            print(f"{PROG}: warning: {w.message}", file=sys.stderr)
        return table
    try:
        refs = np.load(spec) if spec.endswith(".npy") else np.loadtxt(spec, dtype=np.int64, ndmin=2)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read the construction table {spec!r}: {exc}") from None
    try:
        table = ConstructionTable(refs)
    except ValueError as exc:
        raise CliError(f"{spec}: {exc}") from None
    if table.n_atoms != len(elements):
        raise CliError(f"{spec}: the table has {table.n_atoms} rows but the molecule {len(elements)} atoms")
    return table


def _graph_of(zmatrix: ZMatrix) -> np.ndarray:
    """Bonds perceived from the built coordinates of the real atoms, as row pairs."""
    import warnings

    from .topology.auto import perceive_connectivity

    elements = zmatrix.real_elements
    if elements is None:
        return np.zeros((0, 2), dtype=np.int64)
    rows = torch.nonzero(zmatrix.real).reshape(-1).numpy()
    xyz = zmatrix.to_cartesian().detach().reshape(-1, len(rows), 3)[0].double().numpy()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            pairs = perceive_connectivity(xyz, elements)
    except ValueError:
        return np.zeros((0, 2), dtype=np.int64)
    return rows[pairs]


def load_source(spec: str, table_from: str = "auto") -> ZMatrix:
    """A shipped molecule by name, or a ``.zmat``/``.gzmat``/``.gjf``/``.xyz`` file (first frame).

    Returns the [`ZMatrix`][batched_nerf.ZMatrix] with ``name``, ``connectivity`` (perceived
    from the coordinates for files) and ``metadata["description"]``.

    Raises:
        CliError: unknown names, unreadable files or unknown extensions.
    """
    from . import data

    if spec in data.available():
        return data.load(spec)
    ext = os.path.splitext(spec)[1].lower()
    if ext not in _EXTENSIONS:
        raise CliError(
            f"{spec!r} is neither a shipped molecule ({', '.join(data.available())}) "
            "nor a .xyz/.zmat/.gzmat/.gjf/.com file",
            code=2 if not os.path.exists(spec) else 1,
        )
    name = os.path.splitext(os.path.basename(spec))[0]
    if _EXTENSIONS[ext] == "xyz":
        elements, frames, comments = _read_xyz(spec)
        if len(frames) > 1:
            print(f"{PROG}: note: {spec} has {len(frames)} frames; using frame 0", file=sys.stderr)
        table = _table_from(table_from, frames[0], elements)
        z = ZMatrix.from_cartesian(torch.from_numpy(frames[0]), table, elements=elements)
        return _named(z, name, comments[0].strip())
    return _named(_read_gzmat(spec), name, "")


def _graph(z: ZMatrix) -> np.ndarray:
    """The bond graph of ``z`` as row pairs (empty when unknown)."""
    return np.zeros((0, 2), dtype=np.int64) if z.connectivity is None else z.connectivity


def _named(z: ZMatrix, name: str, description: str) -> ZMatrix:
    """``z`` with its name, description and perceived bond graph."""
    return ZMatrix(
        z.table,
        z.bonds,
        z.angles,
        z.dihedrals,
        z.fixed_xyz,
        z.elements,
        z.labels,
        real=z.real,
        connectivity=_graph_of(z),
        name=name,
        metadata={**z.metadata, "description": description},
    )


# ----------------------------------------------------------------- progress
class _Progress:
    """tqdm when installed, else a ``\\r`` counter on stderr; silent when disabled."""

    def __init__(self, total: int, enabled: bool, unit: str) -> None:
        self.total, self.done, self.enabled, self.unit = total, 0, enabled, unit
        self.bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit=unit, unit_scale=True, file=sys.stderr, leave=False)
            except ImportError:
                self.bar = None

    def update(self, k: int) -> None:
        self.done += k
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(k)
        else:
            sys.stderr.write(f"\r{self.done}/{self.total} {self.unit}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\r" + " " * (2 * len(str(self.total)) + len(self.unit) + 2) + "\r")
            sys.stderr.flush()


# ---------------------------------------------------------------- commands
def _cmd_info(args: argparse.Namespace, out: IO[str]) -> int:
    from . import data

    if args.molecule is None:
        print("shipped molecules (batched_nerf.data):", file=out)
        for name in data.available():
            mol = data.load(name)
            description = mol.metadata["description"]
            print(f"  {name:<20} {mol.n_real:>4} atoms  {formula(mol.elements):<12} {description}", file=out)
        print(f"\ntry: {PROG} info alanine_dipeptide", file=out)
        return 0
    z = load_source(args.molecule, args.table_from)
    table = z.table
    graph = _graph(z)
    refs = table.refs.numpy()
    labels = z.labels or [str(i) for i in range(z.n_atoms)]
    elements = z.elements or ["?"] * z.n_atoms
    groups = rotatable_torsions(refs, graph)
    description = z.metadata.get("description", "")
    title = f"{z.name}: {description}" if description else f"{z.name}:"
    print(title, file=out)
    print(
        f"{z.n_real} atoms ({formula(z.real_elements or [])}), {table.n_components} component(s), "
        f"{table.n_fixed} fixed, {z.n_atoms - z.n_real} dummies, {len(graph)} bonds, "
        f"build depth {table.depth} level(s)",
        file=out,
    )
    rows = sorted(r for _, group in groups for r in group)
    print(f"rotatable torsions: {len(groups)} (driven by rows {rows})", file=out)
    print(file=out)
    head = f"{'row':>4} {'label':<6} {'el':<3} {'bond ref':<10} {'angle ref':<10} {'dihedral ref':<12}"
    print(f"{head} {'bond/A':>8} {'angle/deg':>10} {'dihed/deg':>10}", file=out)
    b, a, d = (
        t.detach().reshape(-1, z.n_atoms)[0].double().numpy() for t in (z.bonds, z.angles, z.dihedrals)
    )
    fixed = set(table.fixed.tolist())
    for i in range(z.n_atoms):
        cells = []
        for r in refs[i].tolist():
            cells.append(f"{r} {labels[r]}" if r >= 0 else "-")
        n_refs = int((refs[i] >= 0).sum())
        values = [
            f"{b[i]:8.4f}" if n_refs >= 1 else f"{'':8}",
            f"{math.degrees(a[i]):10.3f}" if n_refs >= 2 else f"{'':10}",
            f"{math.degrees(d[i]):10.3f}" if n_refs >= 3 else f"{'':10}",
        ]
        tag = " fixed" if i in fixed else ""
        print(
            f"{i:>4} {labels[i]:<6.6} {elements[i]:<3} {cells[0]:<10} {cells[1]:<10} {cells[2]:<12} "
            f"{' '.join(values)}{tag}",
            file=out,
        )
    print(f"\nnext: {PROG} sample {args.molecule} --n 1000 -o {z.name}.xyz", file=out)
    return 0


def _cmd_sample(args: argparse.Namespace, out: IO[str]) -> int:
    if args.n < 1:
        raise CliError(f"--n must be positive, got {args.n}", code=2)
    _check_range("--sigma", args.sigma, 0.0, what="a finite number >= 0 (degrees)")
    _check_range("--chunk", args.chunk, 0, what="positive (or 0: automatic)")
    _check_range("--precision", args.precision, 0, _PRECISION_MAX)
    _check_range("--seed", args.seed, -(2**63), 2**64 - 1, what="an integer in [-2**63, 2**64)")
    device = _device_of("--device", args.device)
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    z = load_source(args.molecule, args.table_from).to(device=device, dtype=dtype)
    if z.real_elements is None:
        raise CliError(f"{z.name}: the molecule has no element symbols")
    refs = z.table.refs.numpy()
    n_rows = z.n_atoms
    if args.torsions == "all":
        groups = [((int(r[0]), int(r[1])), [i]) for i, r in enumerate(refs.tolist()) if r[2] >= 0]
    else:
        groups = rotatable_torsions(refs, _graph(z))
    if not groups:
        print(
            f"{PROG}: warning: {z.name} has no "
            f"{'dihedrals' if args.torsions == 'all' else 'rotatable torsions'}; "
            "all conformers are identical (try --torsions all)",
            file=sys.stderr,
        )
    incidence = torch.zeros(len(groups), n_rows, dtype=dtype, device=device)
    for g, (_, rows) in enumerate(groups):
        incidence[g, rows] = 1.0
    base = z.dihedrals.reshape(-1, n_rows)[:1]
    bonds, angles = z.bonds.reshape(-1, n_rows)[:1], z.angles.reshape(-1, n_rows)[:1]
    fixed = None if z.fixed_xyz is None else z.fixed_xyz.reshape(-1, *z.fixed_xyz.shape[-2:])[:1]
    real = z.real.to(device)
    elements = z.real_elements
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    chunk = args.chunk or max(1, min(args.n, 1_000_000 // max(n_rows, 1)))
    sigma = math.radians(args.sigma)
    # warm-up outside the timed region: plans, and the kernels' first calls (a numba compile on a
    # cold cache, seconds) at every batch size the loop uses (the kernel layout depends on it)
    t_warm = time.perf_counter()
    for m in sorted({min(chunk, args.n), args.n % chunk or chunk}):
        ZMatrix(z.table, bonds.expand(m, -1), angles.expand(m, -1), base.expand(m, -1), fixed).to_cartesian(
            dummies=True
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t_warm = time.perf_counter() - t_warm
    progress = _Progress(args.n, not args.quiet, "conformers")
    t_convert = 0.0
    t0 = time.perf_counter()
    written = 0
    from .formats.xyz import write_xyz

    try:
        with _output(args.output) as path, open(path, "w", encoding="utf-8") as handle:
            while written < args.n:
                m = min(chunk, args.n - written)
                if args.uniform:
                    delta = (torch.rand(m, len(groups), generator=gen, dtype=torch.float64) * 2 - 1) * math.pi
                else:
                    delta = torch.randn(m, len(groups), generator=gen, dtype=torch.float64) * sigma
                delta = delta.to(device=device, dtype=dtype)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t = time.perf_counter()
                dihedrals = base + delta @ incidence
                xyz = ZMatrix(z.table, bonds, angles, dihedrals, fixed).to_cartesian(dummies=True)
                xyz = xyz[:, real, :] if not bool(real.all()) else xyz
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t_convert += time.perf_counter() - t
                comments = [f"{z.name} conformer {written + k}" for k in range(m)]
                write_xyz(handle, elements, xyz.cpu(), comments, precision=args.precision)
                written += m
                progress.update(m)
    except OSError as exc:
        raise CliError(f"cannot write {args.output!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"cannot write {args.output!r}: {exc}") from None
    finally:
        progress.close()
    total = time.perf_counter() - t0
    atoms = args.n * z.n_atoms
    mode = "uniform" if args.uniform else f"Gaussian, sigma {args.sigma:g} deg"
    print(
        f"wrote {args.n} conformers of {z.name} ({z.n_real} atoms) to {args.output}; "
        f"{len(groups)} {'dihedrals' if args.torsions == 'all' else 'torsions'} drawn ({mode})",
        file=out,
    )
    rate = atoms / t_convert if t_convert > 0 else float("inf")
    print(
        f"to_cartesian: {t_convert:.3f} s, {rate:,.0f} atoms/s on {device} ({args.dtype}); "
        f"total with writing {total:.2f} s; not counted: a first call per batch size before timing "
        f"(plans, kernel compile or cache load) {t_warm:.2f} s",
        file=out,
    )
    return 0


def _cmd_warmup(args: argparse.Namespace, out: IO[str]) -> int:
    from ._warmup import warmup

    dtypes = args.dtype or ["float32", "float64"]
    try:
        info = warmup(dtypes, threaded=not args.no_threaded, progress=not args.quiet)
    except RuntimeError as exc:  # numba missing
        raise CliError(str(exc)) from None
    print(
        f"warmup: {info['steps']} steps ({', '.join(dtypes)}; {info['threads']} numba thread(s)), "
        f"{info['compiled']} kernel(s) compiled, {info['seconds']:.1f} s; cache: {info['cache_dir']}",
        file=out,
    )
    return 0


def _to_zmatrix_for_output(
    args: argparse.Namespace, elements: list[str] | None, frames: np.ndarray | None, zin: ZMatrix | None
) -> ZMatrix:
    """A ZMatrix without fixed atoms, from Cartesian input or (re-tabled) Z-matrix input."""
    if zin is not None and zin.table.n_fixed == 0 and args.table_from is None:
        return zin
    if zin is not None:
        elements = zin.real_elements
        if elements is None:
            raise CliError("the input Z-matrix has no element symbols")
        frames = zin.to_cartesian().detach().reshape(-1, zin.n_real, 3).double().numpy()
    assert elements is not None and frames is not None
    frame = 0 if args.frame is None else args.frame
    if not -len(frames) <= frame < len(frames):
        raise CliError(f"--frame {frame} out of range: the input has {len(frames)} frame(s)", code=2)
    xyz = frames[frame]
    table = _table_from(args.table_from or "auto", xyz, elements)
    return ZMatrix.from_cartesian(torch.from_numpy(xyz), table, elements=elements)


def _cmd_convert(args: argparse.Namespace, out: IO[str]) -> int:
    fin = _format_of(args.input, args.format_in)
    fout = _format_of(args.output, args.format_out)
    elements: list[str] | None = None
    frames: np.ndarray | None = None
    comments: list[str] = []
    zin: ZMatrix | None = None
    notes: list[str] = []
    _check_range("--precision", args.precision, 0, _PRECISION_MAX)
    if fin == "xyz":
        elements, frames, comments = _read_xyz(args.input)
    elif fin in ("gzmat", "gjf"):
        zin = _read_gzmat(args.input)
    else:
        zin = _read_chemcoord(args.input)
    if fout == "chemcoord":
        _import_chemcoord()
    try:
        with _output(args.output) as path:
            what = _write_converted(args, path, fin, fout, elements, frames, comments, zin, notes)
    except OSError as exc:
        raise CliError(f"cannot write {args.output!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"cannot write {args.output!r} as {fout}: {exc}") from None
    print(f"wrote {what} to {args.output} ({fin} -> {fout})", file=out)
    for note in notes:
        print(note, file=out)
    return 0


def _write_converted(
    args: argparse.Namespace,
    path: str,
    fin: str,
    fout: str,
    elements: list[str] | None,
    frames: np.ndarray | None,
    comments: list[str],
    zin: ZMatrix | None,
    notes: list[str],
) -> str:
    """Write the input as ``fout`` to ``path``; returns what was written, appends notes for the user."""
    if fout == "xyz":
        from .formats.xyz import write_xyz

        if zin is not None:
            if zin.real_elements is None:
                raise CliError("the input Z-matrix has no element symbols")
            elements = zin.real_elements
            frames = zin.to_cartesian().detach().reshape(-1, zin.n_real, 3).double().numpy()
            comments = [f"converted from {os.path.basename(args.input)} by {PROG}"] * len(frames)
        assert elements is not None and frames is not None
        write_xyz(path, elements, frames, comments, precision=args.precision)
        return f"{len(frames)} frame(s) of {len(elements)} atoms"
    z = _to_zmatrix_for_output(args, elements, frames, zin)
    order = None
    if fout == "gzmat":
        from .formats.gaussian import write_zmat

        order = write_zmat(path, z, precision=args.precision)
    elif fout == "gjf":
        from .formats.gaussian import write_gaussian

        title = f"{os.path.basename(args.input)} converted by {PROG}"
        order = write_gaussian(path, z, title=title, precision=args.precision)
    else:
        from .formats.chemcoord import to_chemcoord

        to_chemcoord(z).to_zmat(path, float_format=f"{{:.{args.precision}f}}".format)
    what = f"a Z-matrix of {z.n_real} atoms"
    if zin is None and frames is not None and len(frames) > 1:
        frame = 0 if args.frame is None else args.frame
        what += f" (frame {frame} of {len(frames)})"
        if args.frame is None:
            notes.append(
                f"note: {args.input} has {len(frames)} frames; a Z-matrix holds one geometry: wrote frame 0 "
                "(choose another with --frame K; convert to .xyz to keep them all)"
            )
    if order is not None and not np.array_equal(order, np.arange(len(order))):
        notes.append(
            "note: atoms reordered into build order (a Z-matrix row may reference only earlier "
            "rows); to keep the input order, pass --table-from a table whose rows reference only "
            "earlier rows"
        )
    return what


def _cmd_bench(args: argparse.Namespace, out: IO[str]) -> int:
    """Launch the benchmark suite of a source checkout (it is not part of the installed package).

    Runs ``benchmarks/run.py`` found next to the package directory with the same
    Python, forwarding the options; its exit status is returned.  Without a
    checkout (an installed wheel), says how to run the suite and exits with 2.
    """
    import subprocess
    from pathlib import Path

    _device_of("--device", args.device)
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"
    if not script.is_file():
        raise CliError(
            "the benchmark suite is not part of the installed package: from a source checkout of "
            "batched_nerf run `python benchmarks/run.py --quick` (see benchmarks/README.md)",
            code=2,
        )
    cmd = [sys.executable, str(script), "--device", args.device]
    cmd += ["--quick"] if args.quick else []
    cmd += ["--out", args.out] if args.out else []
    cmd += ["--nerfax", args.nerfax] if args.nerfax else []
    cmd += ["--no-compile"] if args.no_compile else []
    cmd += ["--no-peers"] if args.no_peers else []
    print(f"running {' '.join(cmd)}", file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=False).returncode


# ------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``batched-nerf`` (all subcommands)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Batched, differentiable Z-matrix <-> Cartesian conversion: files, samples, benchmarks.",
        epilog=f"Start with: {PROG} info   (then: {PROG} sample alanine_dipeptide --n 1000 -o ala.xyz)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "info",
        help="show a molecule's construction table and summary",
        description="Show the construction table, atoms and a summary of a shipped molecule or a "
        ".zmat/.xyz file; without MOLECULE, list the shipped molecules.",
    )
    p.add_argument("molecule", nargs="?", metavar="MOLECULE", help="shipped molecule name or .zmat/.xyz file")
    p.add_argument(
        "--table-from", default="auto", metavar="auto|FILE", help="table for .xyz input (default auto)"
    )
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser(
        "sample",
        help="write many conformers of a molecule to a multi-frame XYZ file",
        description="Draw the rotatable torsions of a molecule (Gaussian perturbations around the "
        "reference, or uniformly with --uniform), build all conformers with batched to_cartesian calls, "
        "and write them as a multi-frame XYZ file.",
    )
    p.add_argument("molecule", metavar="MOLECULE", help="shipped molecule name or .zmat/.xyz file")
    p.add_argument("--n", type=int, default=1000, help="number of conformers (default 1000)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.xyz", help="output XYZ file")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--sigma", type=float, default=20.0, help="std. dev. of the torsion perturbations in degrees"
    )
    p.add_argument("--uniform", action="store_true", help="draw the torsions uniformly in (-180, 180]")
    p.add_argument(
        "--torsions",
        choices=("rotatable", "all"),
        default="rotatable",
        help="rotatable: one draw per rotatable bond (default); all: every dihedral independently",
    )
    p.add_argument(
        "--table-from", default="auto", metavar="auto|FILE", help="table for .xyz input (default auto)"
    )
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    p.add_argument("--chunk", type=int, default=0, help="conformers per batched call (default: automatic)")
    p.add_argument("--precision", type=int, default=5, help="decimals written per coordinate (default 5)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_sample)

    p = sub.add_parser(
        "convert",
        help="convert between XYZ, Gaussian Z-matrix and chemcoord Z-matrix files",
        description="Convert IN to OUT. Formats come from the extensions (.xyz; .zmat/.gzmat/.gzm: "
        "Gaussian-style Z-matrix; .gjf/.com: Gaussian input file) or --format-in/--format-out (xyz, gzmat, "
        "gjf, chemcoord). A construction table is chosen automatically from the bonds when a Z-matrix is "
        "written from Cartesian input; separate molecules (dimers, salts, solvent) are linked into one "
        "build. Z-matrix output lists the atoms in build order.",
    )
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.add_argument("--format-in", choices=_FORMATS, help="format of IN (default: from the extension)")
    p.add_argument("--format-out", choices=_FORMATS, help="format of OUT (default: from the extension)")
    p.add_argument(
        "--table-from",
        default=None,
        metavar="auto|FILE",
        help="construction table of the written Z-matrix: auto (bond perception) or a .npy/text file of "
        "(N, 3) integer references; default auto for XYZ input, the input's own table for Z-matrix input",
    )
    p.add_argument(
        "--frame",
        type=int,
        default=None,
        metavar="K",
        help="frame of a multi-frame XYZ written as a Z-matrix (default 0, with a note; negative counts "
        "from the end)",
    )
    p.add_argument("--precision", type=int, default=6, help="decimals written per value (default 6)")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser(
        "warmup",
        help="compile the fused engine's CPU kernels ahead of use (numba cache)",
        description="Compile (or load from numba's on-disk cache) every CPU kernel of the fused engine: "
        "each dtype, per-sample and blocked layouts, threaded ones, the inverse map and its second order. "
        "Run it while building a container image or a CI cache, with NUMBA_CACHE_DIR set to a folder kept "
        "with the image (default: __pycache__ next to the kernels, or ~/.cache/numba where that is "
        "read-only).",
    )
    p.add_argument(
        "--dtype",
        action="append",
        choices=("float32", "float64"),
        help="only this dtype (repeatable; default both)",
    )
    p.add_argument("--no-threaded", action="store_true", help="skip the threaded kernels")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_warmup)

    p = sub.add_parser(
        "bench",
        help="run the benchmark suite of a source checkout",
        description="Run benchmarks/run.py of the source checkout this package was installed from "
        "(same Python, options forwarded) and print its Markdown report. The suite is not part of the "
        "installed package: without a checkout this says how to get one and exits with status 2.",
    )
    p.add_argument("--quick", action="store_true", help="small sizes only (about a minute)")
    p.add_argument("--out", metavar="DIR", help="directory for the raw results")
    p.add_argument("--nerfax", metavar="PATH", help="path to a NeRFax checkout to compare against")
    p.add_argument("--device", default="cpu", help="torch device to benchmark on (default cpu)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    p.add_argument("--no-peers", action="store_true", help="skip the other packages (peers)")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 for bad input, 2 for usage errors
        (argparse's ``--help`` and ``--version`` return 0).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code) if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        return int(args.func(args, sys.stdout))
    except CliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `batched-nerf info | head`: the reader left; not an error
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # pragma: no cover - no real stdout
            pass
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
