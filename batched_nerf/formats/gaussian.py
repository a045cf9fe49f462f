"""Gaussian input files and Gaussian-style Z-matrix text (the molecule specification).

One atom per line, references 1-based (or by the label of an earlier line),
lengths as written (usually Angstrom), angles in degrees:

```text
C
H 1 1.09
H 1 1.09 2 109.5
H 1 R1 2 A1 3 -D1

R1 1.09
A1 109.5
D1 120.0
```

A value may be a variable name, optionally signed (``-D1``), defined after a
blank line as ``name value`` or ``name=value`` (an optional ``Variables:`` or
``Constants:`` header line is skipped). Commas may separate fields and ``!``
starts a comment. Gaussian's dihedral ``i-b-a-d`` is the IUPAC dihedral, the
same as `batched_nerf`'s, so values carry over unchanged.

A full input file (``.gjf``/``.com``) is read too: optional Link 0 lines
(``%chk=...``), the route section (``#...``), a blank line, the title section,
a blank line, the charge and multiplicity line, then the molecule
specification and its variables; sections after the variables (basis sets,
``ModRedundant`` input, ...) are ignored. [`read_gaussian`][batched_nerf.formats.read_gaussian] returns the
header too, [`write_gaussian`][batched_nerf.formats.write_gaussian] writes a complete input file.

Atom lines are Z-matrix lines or Cartesian lines ``label x y z`` (also
``label 0 x y z`` with a freeze flag); Cartesian atoms become fixed atoms of
the [`ZMatrix`][batched_nerf.ZMatrix], so the coordinates are kept as written.
Labels start with an element symbol, ``D``/``T`` (hydrogen isotopes, also
read as Gaussian's ``H(Iso=2)``/``H(Iso=3)``, which [`write_gaussian`][batched_nerf.formats.write_gaussian]
writes) or ``X`` (a dummy atom: it takes part in the build but is not
[`real`][batched_nerf.ZMatrix.real]). Not supported: the two-angle form of a
Z-matrix line (flag ``1``/``-1``), and Z-matrix seed lines (fewer than three
references) together with Cartesian lines.

A Gaussian row may only reference earlier rows and the first three rows are the
seeds. Construction tables allow any row order, so [`write_zmat`][batched_nerf.formats.write_zmat] writes the
rows in a valid build order (a topological sort that keeps the original order
where it can) and returns that order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..core.files import (
    PathOrFile,
    as_numpy,
    check_precision,
    finite_float,
    open_text,
    read_text,
    refs_of,
    require_one_conformation,
)
from ..core.table import ConstructionTable
from ..core.zmatrix import ZMatrix
from ..topology.order import build_order
from ..topology.perceive import atomic_number, element_symbol

__all__ = ["GaussianInput", "ZMatrix", "read_gaussian", "read_zmat", "write_gaussian", "write_zmat"]

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eEdD][+-]?\d+)?$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADERS = ("variables", "constants")
_ISOTOPES = {"D": "H(Iso=2)", "T": "H(Iso=3)"}


@dataclass
class GaussianInput:
    """A Gaussian input file: the molecule and the sections around it.

    Attributes:
        zmatrix: the molecule specification as a [`ZMatrix`][batched_nerf.ZMatrix].
        route: the route section (``"#p B3LYP/6-31G(d) opt"``; lines joined by
            newlines), ``None`` for a bare Z-matrix.
        title: the title section, ``None`` for a bare Z-matrix.
        charge: total charge (``None`` for a bare Z-matrix).
        multiplicity: spin multiplicity ``2S + 1`` (``None`` for a bare Z-matrix).
        link0: the Link 0 lines (``%chk=...``), as written.
    """

    zmatrix: ZMatrix
    route: str | None = None
    title: str | None = None
    charge: int | None = None
    multiplicity: int | None = None
    link0: list[str] = field(default_factory=list)


def _strip(line: str) -> str:
    text = line.split("!", 1)[0]
    # keep atom options such as H(Iso=2,Spin=1) in one field
    text = re.sub(r"\([^)]*\)", lambda m: m.group(0).replace(",", ";").replace(" ", ""), text)
    return text.replace(",", " ").strip()


def _element(label: str, lineno: int) -> str:
    """Element of a label like ``C``, ``C12``, ``Cl3``, ``CL``, ``D``, ``X1`` (any case, as Gaussian)."""
    m = re.match(r"[A-Za-z]+", label)
    if m is None:
        raise ValueError(f"line {lineno}: atom label {label!r} does not start with an element symbol")
    letters = m.group(0)
    iso = re.search(r"\(.*\biso\s*=\s*(\d+)", label, re.IGNORECASE)
    if letters[:1].upper() == "H" and len(letters) == 1 and iso and iso.group(1) in ("2", "3"):
        return "D" if iso.group(1) == "2" else "T"  # Gaussian's H(Iso=2) and H(Iso=3)
    for candidate in ([letters[:2]] if len(letters) >= 2 else []) + [letters[:1]]:
        try:
            return element_symbol(candidate)
        except ValueError:
            continue
    raise ValueError(f"line {lineno}: unknown element in atom label {label!r}")


def _check_labels(elements: Sequence[str]) -> list[str]:
    """Element labels as strings, each one that [`read_zmat`][batched_nerf.formats.read_zmat] reads back as
    the same single field."""
    out = [str(e) for e in elements]
    for i, label in enumerate(out):
        ok = bool(label) and not any(c.isspace() or c in ",!" for c in label)
        if ok:
            try:
                _element(label, 0)
            except ValueError:
                ok = False
        if not ok:
            raise ValueError(
                f"atom {i}: element label {label!r} cannot be written: it must be one non-empty field "
                "without spaces, commas or '!' that starts with an element symbol"
            )
    return out


def _is_variable_line(text: str) -> bool:
    fields = text.replace("=", " ").split()
    return len(fields) == 2 and bool(_NAME.match(fields[0])) and bool(_NUMBER.match(fields[1]))


def _header(lines: list[str], k: int) -> tuple[int, dict[str, Any]]:
    """Parse Link 0, route, title and charge/multiplicity from line ``k``; return the next line index."""
    n = len(lines)
    link0: list[str] = []
    while k < n and lines[k].strip().startswith("%"):
        link0.append(lines[k].strip())
        k += 1
    if k >= n or not lines[k].strip().startswith("#"):
        raise ValueError(f"line {k + 1}: expected the route section (a line starting with '#')")
    route: list[str] = []
    while k < n and lines[k].strip():
        route.append(lines[k].strip())
        k += 1
    while k < n and not lines[k].strip():
        k += 1
    title: list[str] = []
    while k < n and lines[k].strip():
        title.append(lines[k].strip())
        k += 1
    if not title:
        raise ValueError(f"line {k + 1}: expected the title section after the route section and a blank line")
    while k < n and not lines[k].strip():
        k += 1
    fields = _strip(lines[k]).split() if k < n else []
    if len(fields) < 2 or len(fields) % 2 or not all(f.lstrip("+-").isdigit() for f in fields):
        got = repr(lines[k].strip()) if k < n else "the end of the file"
        raise ValueError(f"line {k + 1}: expected the charge and multiplicity (e.g. '0 1'), got {got}")
    charge, mult = int(fields[0]), int(fields[1])
    if mult < 1:
        raise ValueError(f"line {k + 1}: the multiplicity must be a positive integer, got {mult}")
    info = {"route": "\n".join(route), "title": "\n".join(title), "charge": charge, "multiplicity": mult}
    return k + 1, {**info, "link0": link0}


def read_gaussian(path_or_file: PathOrFile) -> GaussianInput:
    """Read a Gaussian input file (``.gjf``/``.com``) or a bare Gaussian-style Z-matrix.

    Args:
        path_or_file: a path or an open text file.

    Returns:
        A [`GaussianInput`][batched_nerf.formats.GaussianInput]: the molecule as a
        [`ZMatrix`][batched_nerf.ZMatrix]
        (float64, unbatched, angles in radians, elements and labels as written,
        dummy atoms ``X`` not [`real`][batched_nerf.ZMatrix.real], Cartesian atoms
        as fixed atoms) and, for a full input file, the route, title, charge,
        multiplicity and Link 0 lines (``None`` for a bare Z-matrix).

    Raises:
        ValueError: naming the 1-based line and the reason: a missing route,
            title or charge/multiplicity line, no atoms, a wrong number of
            fields for the row, a reference that is not an earlier atom or is
            repeated, a value that is neither a number nor a defined variable,
            a number that is not finite in float64 (``1e400`` overflows; in an
            atom line or a variable line), a malformed or repeated variable
            line, a non-positive bond length, an angle outside [0, 180]
            degrees, or an unsupported form.

    Example:
        >>> import io
        >>> from batched_nerf.formats import read_gaussian
        >>> text = "%chk=w.chk\\n#p hf/sto-3g\\n\\nwater\\n\\n0 1\\nO\\nH 1 0.96\\nH 1 0.96 2 104.5\\n\\n"
        >>> g = read_gaussian(io.StringIO(text))
        >>> g.route, g.title, g.charge, g.multiplicity, g.zmatrix.elements
        ('#p hf/sto-3g', 'water', 0, 1, ['O', 'H', 'H'])
    """
    lines = read_text(path_or_file).splitlines()
    k = 0
    while k < len(lines) and not _strip(lines[k]):
        k += 1
    header: dict[str, Any] = {}
    full = k < len(lines) and lines[k].strip().startswith(("%", "#"))
    if full:
        k, header = _header(lines, k)
    atoms: list[tuple[int, list[str]]] = []
    while k < len(lines) and _strip(lines[k]):
        text = _strip(lines[k])
        if text.lower().rstrip(":") in _HEADERS:
            break
        atoms.append((k + 1, text.split()))
        k += 1
    if not atoms:
        raise ValueError(f"line {min(k, len(lines)) + 1}: no atom lines found")
    variables: dict[str, float] = {}
    for lineno, raw in enumerate(lines[k:], start=k + 1):
        text = _strip(raw)
        if not text or text.lower().rstrip(":") in _HEADERS:
            continue
        if not _is_variable_line(text):
            if full:  # further input sections (basis set, ModRedundant, ...)
                break
            raise ValueError(
                f"line {lineno}: expected a variable definition 'name value', got {raw.strip()!r}"
            )
        fields = text.replace("=", " ").split()
        if fields[0] in variables:
            raise ValueError(f"line {lineno}: variable {fields[0]!r} defined twice")
        what = f"the value of variable {fields[0]!r}"
        variables[fields[0]] = finite_float(fields[1], f"line {lineno}", what, fortran=True)
    return GaussianInput(_molecule(atoms, variables), **header)


def read_zmat(path_or_file: PathOrFile) -> ZMatrix:
    """Read a Gaussian-style Z-matrix, or the molecule of a full Gaussian input file.

    The same as [`read_gaussian`][batched_nerf.formats.read_gaussian] without the header (route, title,
    charge, multiplicity).

    Args:
        path_or_file: a path or an open text file.

    Returns:
        A [`ZMatrix`][batched_nerf.ZMatrix] (float64, unbatched, angles in radians)
        with the element symbols and the labels as written; dummy atoms (element
        ``X``) are marked as not [`real`][batched_nerf.ZMatrix.real]; Cartesian
        lines become fixed atoms.

    Raises:
        ValueError: as [`read_gaussian`][batched_nerf.formats.read_gaussian], naming the 1-based line.

    Example:
        >>> import io
        >>> from batched_nerf.formats import read_zmat
        >>> z = read_zmat(io.StringIO("O\\nH 1 0.96\\nH 1 R 2 104.5\\n\\nR 0.96\\n"))
        >>> z.elements, z.table.refs.tolist(), z.bonds.tolist()
        (['O', 'H', 'H'], [[-1, -1, -1], [0, -1, -1], [0, 1, -1]], [0.0, 0.96, 0.96])
    """
    return read_gaussian(path_or_file).zmatrix


def _is_cartesian(fields: list[str]) -> bool:
    return len(fields) == 4 or (len(fields) == 5 and fields[1] in ("0", "-1"))


def _molecule(atoms: list[tuple[int, list[str]]], variables: dict[str, float]) -> ZMatrix:
    n = len(atoms)
    refs = np.full((n, 3), -1, dtype=np.int64)
    values = np.zeros((n, 3))
    names: list[str] = []
    elements: list[str] = []
    label_index: dict[str, int] = {}
    cartesian: dict[int, list[float]] = {}
    seed_line = cartesian_line = 0
    for row, (lineno, fields) in enumerate(atoms):
        label = fields[0]
        elements.append(_element(label, lineno))
        names.append(label)
        label_index.setdefault(label, row)
        n_refs = min(row, 3)
        expected = 1 + 2 * n_refs
        what = "only an element" if n_refs == 0 else f"an element and {n_refs} (reference, value) pairs"
        if _is_cartesian(fields):
            if seed_line:
                raise ValueError(
                    f"line {lineno}: atom {row + 1} has {len(fields)} fields, the form of a Cartesian line "
                    f"'label x y z', but Cartesian lines cannot follow the Z-matrix line {seed_line} (its "
                    f"frame would not be defined); as a Z-matrix line atom {row + 1} expects {expected} "
                    f"fields ({what})"
                )
            cartesian_line = cartesian_line or lineno
            cartesian[row] = [_value(t, variables, lineno, "coordinate") for t in fields[-3:]]
            continue
        if n_refs < 3 and not seed_line:
            seed_line = lineno
            if cartesian_line:
                raise ValueError(
                    f"line {lineno}: atom {row + 1} is a Z-matrix line with {n_refs} reference(s) after the "
                    f"Cartesian line {cartesian_line}: its frame would not be defined; write it as a "
                    "Cartesian line 'label x y z' (after Cartesian lines a Z-matrix line needs 3 references)"
                )
        if n_refs == 3 and len(fields) == 8:
            if fields[7] != "0":
                raise ValueError(
                    f"line {lineno}: the two-angle form (flag {fields[7]}) is not supported; "
                    "use a dihedral (flag 0 or no flag)"
                )
            fields = fields[:7]
        if len(fields) != expected:
            raise ValueError(
                f"line {lineno}: atom {row + 1} expects {expected} fields ({what}), got {len(fields)}"
            )
        for j in range(n_refs):
            token = fields[1 + 2 * j]
            if token.lstrip("+-").isdigit():
                ref = int(token) - 1
                if not 0 <= ref < row:
                    raise ValueError(f"line {lineno}: reference {token} must be an earlier atom (1..{row})")
            elif token in label_index and label_index[token] < row:
                ref = label_index[token]
            else:
                raise ValueError(f"line {lineno}: unknown atom reference {token!r}")
            if ref in refs[row, :j]:
                raise ValueError(f"line {lineno}: atom {ref + 1} referenced twice")
            refs[row, j] = ref
            values[row, j] = _value(fields[2 + 2 * j], variables, lineno, ("bond", "angle", "dihedral")[j])
        bond, ang = values[row, 0], values[row, 1]
        if n_refs >= 1 and not bond > 0:
            raise ValueError(f"line {lineno}: bond length must be positive, got {bond}")
        if n_refs >= 2 and not 0.0 <= ang <= 180.0:
            raise ValueError(f"line {lineno}: angle must lie in [0, 180] degrees, got {ang}")
    fixed = sorted(cartesian)
    return ZMatrix(
        ConstructionTable(refs, fixed=fixed),
        torch.from_numpy(values[:, 0].copy()),
        torch.from_numpy(np.deg2rad(values[:, 1])),
        torch.from_numpy(np.deg2rad(values[:, 2])),
        torch.tensor([cartesian[r] for r in fixed], dtype=torch.float64) if fixed else None,
        elements=elements,
        labels=names,
        real=torch.tensor([e != "X" for e in elements], dtype=torch.bool),
    )


def _value(token: str, variables: dict[str, float], lineno: int, what: str) -> float:
    if _NUMBER.match(token):
        return finite_float(token, f"line {lineno}", what, fortran=True)
    sign, name = (-1.0, token[1:]) if token.startswith("-") else (1.0, token.lstrip("+"))
    if _NAME.match(name) and name in variables:
        return sign * variables[name]
    if _NAME.match(name):
        raise ValueError(f"line {lineno}: undefined variable {name!r}")
    raise ValueError(f"line {lineno}: could not parse value {token!r} as a number or variable")


def write_zmat(
    path_or_file: PathOrFile,
    elements: Sequence[str] | ZMatrix,
    refs: ConstructionTable | Any = None,
    bonds: Any = None,
    angles: Any = None,
    dihedrals: Any = None,
    *,
    degrees: bool = False,
    variables: bool = False,
    precision: int = 6,
) -> np.ndarray:
    """Write a Z-matrix in Gaussian style, reordering rows into a valid build order.

    Gaussian rows reference only earlier rows, so the atoms are written in a
    topological order of ``refs`` (the lowest index first among atoms ready to
    be placed; a table already in build order is written unchanged) and the
    references are renumbered accordingly. Reading the file back gives the
    atoms in the returned order.

    Args:
        path_or_file: a path (overwritten) or an open text file.
        elements: ``N`` element symbols, or a [`ZMatrix`][batched_nerf.ZMatrix] of
            one conformation with elements (then ``refs`` and the values are
            taken from it and must not be passed).
        refs: a [`ConstructionTable`][batched_nerf.ConstructionTable] (without fixed atoms) or
            an ``(N, 3)`` integer array, ``-1`` for no reference.
        bonds: ``(N,)`` bond lengths of one conformation (numpy, lists or
            torch tensors); entries unused by an atom are ignored.
        angles: ``(N,)`` bond angles, like ``bonds``.
        dihedrals: ``(N,)`` IUPAC dihedrals, like ``bonds``.
        degrees: whether ``angles``/``dihedrals`` are in degrees (default radians).
        variables: write symbolic ``R<k>``/``A<k>``/``D<k>`` names and a variable block.
        precision: decimals written per value (a non-negative integer).

    Bond angles outside ``[0, 180]`` degrees (which [`read_zmat`][batched_nerf.formats.read_zmat] refuses)
    are written as the equivalent angle in that range with the dihedral turned
    by 180 deg: the same atom position (for the third seed atom, which has no
    dihedral, the same molecule turned about its first bond).

    Returns:
        ``(N,)`` ``np.int64`` ``order``: written row ``k`` is atom ``order[k]``.

    Raises:
        TypeError: for a ZMatrix together with ``refs`` or values, or missing
            ``refs`` or values otherwise.
        ValueError: for a ZMatrix without elements or with more than one
            conformation, for fixed atoms, not exactly one seed triple (Gaussian
            describes one connected build: link the fragments of a dimer or a
            salt with ``ZMatrix.from_cartesian``/``ConstructionTable.from_xyz``),
            references that cannot be written as Gaussian rows, a reference
            cycle, values of the wrong shape, a non-finite value or a bond
            length that is not positive (naming the row), an element label that
            would not read back as one field (empty, with spaces; naming the
            atom), or a negative ``precision``.

    Example:
        >>> import io
        >>> from batched_nerf.formats import write_zmat
        >>> out = io.StringIO()
        >>> refs = [[1, 2, -1], [-1, -1, -1], [1, -1, -1]]
        >>> values = [0.96, 0.0, 0.96], [104.5, 0.0, 0.0], [0.0, 0.0, 0.0]
        >>> order = write_zmat(out, ["H", "O", "H"], refs, *values, degrees=True, precision=2)
        >>> order.tolist()
        [1, 2, 0]
        >>> print(out.getvalue(), end="")
        O
        H 1 0.96
        H 1 0.96 2 104.50
    """
    if isinstance(elements, ZMatrix):
        if any(v is not None for v in (refs, bonds, angles, dihedrals)):
            raise TypeError("pass either a ZMatrix or elements, refs, bonds, angles and dihedrals")
        if degrees:
            raise ValueError("a ZMatrix holds radians; do not pass degrees=True with it")
        z = elements
        require_one_conformation(z, "a Gaussian Z-matrix")
        elements, refs = z.elements, z.table
        bonds, angles, dihedrals = (v.reshape(-1) for v in (z.bonds, z.angles, z.dihedrals))
    elif any(v is None for v in (refs, bonds, angles, dihedrals)):
        raise TypeError("write_zmat needs refs, bonds, angles and dihedrals (or a ZMatrix)")
    ref_arr, fixed = refs_of(refs)
    n = len(ref_arr)
    if fixed.size:
        raise ValueError(f"a Gaussian Z-matrix cannot hold fixed atoms; the table fixes {fixed.tolist()[:8]}")
    elements = _check_labels(elements)
    if len(elements) != n:
        raise ValueError(f"got {len(elements)} elements for {n} atoms")
    precision = check_precision(precision)
    vals = []
    for name, v in (("bonds", bonds), ("angles", angles), ("dihedrals", dihedrals)):
        arr = as_numpy(v)
        if arr.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},) (one conformation), got {tuple(arr.shape)}")
        vals.append(arr)
    b, a, d = vals
    n_refs = (ref_arr >= 0).sum(1)
    for name, v, col in (("bond length", b, 0), ("angle", a, 1), ("dihedral", d, 2)):
        bad = np.flatnonzero((ref_arr[:, col] >= 0) & ~np.isfinite(v))
        if bad.size:
            raise ValueError(f"row {int(bad[0])}: the {name} is not finite ({v[bad[0]]})")
    short = np.flatnonzero((n_refs >= 1) & ~(b > 0))
    if short.size:
        i = int(short[0])
        raise ValueError(
            f"row {i}: bond length {b[i]} to atom {int(ref_arr[i, 0])} is not positive (coincident atoms?); "
            "a Gaussian Z-matrix needs positive bond lengths"
        )
    if not degrees:
        a, d = np.rad2deg(a), np.rad2deg(d)
    a, d = _normalise_angles(a, d, n_refs)
    roots = np.flatnonzero(n_refs == 0)
    if n and roots.size != 1:
        raise ValueError(
            "a Gaussian Z-matrix describes one connected build with a single seed triple; "
            f"the table has {roots.size} atoms without references (rows {roots.tolist()[:8]}); link the "
            "fragments into one build (ZMatrix.from_cartesian(xyz, table) or ConstructionTable.from_xyz "
            "link them by default)"
        )
    order = build_order(ref_arr)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    out: list[str] = []
    var_lines: list[str] = []
    fmt = f"{{:.{precision}f}}"
    for k, i in enumerate(order.tolist()):
        if n_refs[i] != min(k, 3):
            raise ValueError(
                f"row {i}: has {n_refs[i]} references but would be written as atom {k + 1}, which needs "
                f"{min(k, 3)}; the table is not a single seeded build"
            )
        fields = [elements[i]]
        for j, (tag, value) in enumerate((("R", b[i]), ("A", a[i]), ("D", d[i]))[: n_refs[i]]):
            fields.append(str(int(position[ref_arr[i, j]]) + 1))
            text = fmt.format(float(value))
            if variables:
                var_lines.append(f"{tag}{k + 1} {text}")
                text = f"{tag}{k + 1}"
            fields.append(text)
        out.append(" ".join(fields))
    text = "\n".join(out) + "\n"
    if variables and var_lines:
        text += "\n" + "\n".join(var_lines) + "\n"
    with open_text(path_or_file, "w") as handle:
        handle.write(text)
    return order


def _normalise_angles(
    angles: np.ndarray, dihedrals: np.ndarray, n_refs: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Bond angles (degrees) into the reader's ``[0, 180]``, describing the same atom positions.

    An angle ``theta`` and ``360 - theta`` (or ``-theta``) with the dihedral
    turned by 180 deg place the atom at the same point. For a third seed atom
    (no dihedral) the mirrored angle turns the whole molecule by 180 deg about
    its first bond: the same molecule, internal coordinates unchanged.
    """
    theta = np.mod(angles, 360.0)
    flip = (n_refs >= 2) & (theta > 180.0)
    angles = np.where(n_refs >= 2, np.where(flip, 360.0 - theta, theta), angles)
    turned = dihedrals + 180.0
    turned = np.where(turned > 180.0, turned - 360.0, turned)
    dihedrals = np.where(flip & (n_refs >= 3), turned, dihedrals)
    return angles, dihedrals


def write_gaussian(
    path_or_file: PathOrFile,
    zmatrix: ZMatrix,
    *,
    route: str = "#p sp",
    title: str = "written by batched_nerf",
    charge: int = 0,
    multiplicity: int | None = None,
    link0: str | Sequence[str] = (),
    cartesian: bool = False,
    variables: bool = False,
    precision: int = 6,
) -> np.ndarray:
    """Write a complete Gaussian input file (``.gjf``/``.com``) for a ZMatrix.

    The file holds the Link 0 lines, the route section, a blank line, the
    title, a blank line, the charge and multiplicity, the molecule (Z-matrix
    lines as [`write_zmat`][batched_nerf.formats.write_zmat] writes them, rows in build order, or Cartesian
    lines ``element x y z`` with ``cartesian=True``, rows in table order,
    dummies included), the variables when ``variables=True``, and the closing
    blank line that Gaussian needs.

    Args:
        path_or_file: a path (overwritten) or an open text file.
        zmatrix: a [`ZMatrix`][batched_nerf.ZMatrix] of one conformation with elements.
        route: the route section; must start with ``#``.
        title: the title (one or more non-blank lines).
        charge: total charge.
        multiplicity: spin multiplicity ``2S + 1``; default 1 for an even number
            of electrons, 2 for an odd one.
        link0: Link 0 lines, each starting with ``%`` (e.g. ``["%chk=mol.chk", "%mem=1GB"]``;
            a string is one line, or several separated by newlines).
        cartesian: write Cartesian lines (from [`to_cartesian`][batched_nerf.ZMatrix.to_cartesian])
            instead of Z-matrix lines; needed for tables with fixed atoms.
        variables: symbolic ``R<k>``/``A<k>``/``D<k>`` values and a variable block.
        precision: decimals written per value (a non-negative integer).

    Returns:
        ``(N,)`` ``np.int64`` order: written atom ``k`` is row ``order[k]``.

    Raises:
        TypeError: ``zmatrix`` is not a ZMatrix.
        ValueError: no elements or more than one conformation, a route not
            starting with ``#``, a blank title or a title or route with blank
            lines, a Link 0 line not starting with ``%``, a charge or multiplicity
            that is not an integer, a multiplicity that is not positive or does
            not fit the number of electrons, or what
            [`write_zmat`][batched_nerf.formats.write_zmat] refuses.

    Example:
        >>> import io
        >>> from batched_nerf.formats import read_gaussian, read_zmat, write_gaussian
        >>> z = read_zmat(io.StringIO("O\\nH 1 0.96\\nH 1 0.96 2 104.5\\n"))
        >>> out = io.StringIO()
        >>> order = write_gaussian(out, z, route="#p hf/sto-3g", title="water", precision=2)
        >>> print(out.getvalue(), end="")
        #p hf/sto-3g
        <BLANKLINE>
        water
        <BLANKLINE>
        0 1
        O
        H 1 0.96
        H 1 0.96 2 104.50
        <BLANKLINE>
        >>> read_gaussian(io.StringIO(out.getvalue())).multiplicity
        1
    """
    if not isinstance(zmatrix, ZMatrix):
        raise TypeError(f"expected a batched_nerf.ZMatrix, got {type(zmatrix).__name__}")
    require_one_conformation(zmatrix, "a Gaussian input file")
    route_lines = [line.strip() for line in str(route).strip().splitlines()]
    if not route_lines or not route_lines[0].startswith("#") or not all(route_lines):
        raise ValueError(f"the route section must start with '#' and have no blank lines, got {route!r}")
    title_lines = [line.strip() for line in str(title).strip().splitlines()]
    if not title_lines or not all(title_lines):
        raise ValueError(f"the title must be non-blank and have no blank lines, got {title!r}")
    if isinstance(link0, str):  # one line (or several, separated by newlines), not its characters
        link0 = link0.splitlines()
    for line in link0:
        if not str(line).strip().startswith("%"):
            raise ValueError(f"Link 0 lines must start with '%', got {line!r}")
    for name, value in (("charge", charge), ("multiplicity", multiplicity)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    precision = check_precision(precision)
    elements = _check_labels(zmatrix.elements or [])
    real = zmatrix.real.tolist()
    electrons = sum(atomic_number(e) for e, keep in zip(elements, real) if keep) - int(charge)
    if multiplicity is None:
        multiplicity = 1 + electrons % 2
    if multiplicity < 1 or (electrons - multiplicity + 1) % 2:
        raise ValueError(
            f"multiplicity {multiplicity} does not fit {electrons} electrons (charge {charge}); "
            "an even number of electrons needs an odd multiplicity and vice versa"
        )
    import io

    body = io.StringIO()
    if cartesian:
        xyz = zmatrix.to_cartesian(dummies=True).detach().cpu().double().reshape(-1, 3).numpy()
        fmt = f"{{:.{precision}f}}"
        body.write("".join(f"{e} {' '.join(fmt.format(v) for v in row)}\n" for e, row in zip(elements, xyz)))
        order = np.arange(len(elements), dtype=np.int64)
    else:
        order = write_zmat(body, zmatrix, variables=variables, precision=precision)
    # Gaussian spells the hydrogen isotopes H(Iso=2) and H(Iso=3)
    lines = body.getvalue().splitlines()
    for k, line in enumerate(lines):
        head, _, rest = line.partition(" ")
        if head in _ISOTOPES:
            lines[k] = f"{_ISOTOPES[head]} {rest}".rstrip()
    body = io.StringIO("\n".join(lines) + ("\n" if lines else ""))
    head = (
        [str(line).strip() for line in link0]
        + route_lines
        + [""]
        + title_lines
        + ["", f"{charge} {multiplicity}"]
    )
    with open_text(path_or_file, "w") as handle:
        handle.write("\n".join(head) + "\n" + body.getvalue() + "\n")
    return order
