"""Gaussian-style Z-matrix text (the molecule specification of a Gaussian input).

One atom per line, references 1-based (or by the label of an earlier line),
lengths as written (usually Angstrom), angles in degrees::

    C
    H 1 1.09
    H 1 1.09 2 109.5
    H 1 R1 2 A1 3 -D1

    R1 1.09
    A1 109.5
    D1 120.0

A value may be a variable name, optionally signed (``-D1``), defined after a
blank line as ``name value`` or ``name=value`` (an optional ``Variables:`` or
``Constants:`` header line is skipped). Commas may separate fields and ``!``
starts a comment. Gaussian's dihedral ``i-b-a-d`` is the IUPAC dihedral, the
same as :mod:`batched_nerf`'s, so values carry over unchanged. Not supported:
Cartesian lines, the alternative two-angle form (flag ``1``/``-1``), and the
route/title/charge sections of a full input file.

A Gaussian row may only reference earlier rows and the first three rows are the
seeds. Construction tables allow any row order, so :func:`write_zmat` writes the
rows in a valid build order (a topological sort that keeps the original order
where it can) and returns that order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._autotable import COVALENT_RADII
from .._zmatrix import ZMatrix
from ._common import PathOrFile, as_numpy, open_text, refs_of, require_one_conformation, topological_order

if TYPE_CHECKING:  # pragma: no cover
    from .._table import ConstructionTable

__all__ = ["ZMatrix", "read_zmat", "write_zmat"]

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eEdD][+-]?\d+)?$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _strip(line: str) -> str:
    return line.split("!", 1)[0].replace(",", " ").strip()


def _element(label: str, lineno: int) -> str:
    """Element of a label like ``C``, ``C12``, ``Cl3``, ``CL`` (case-insensitive, as Gaussian)."""
    m = re.match(r"[A-Za-z]+", label)
    if m is None:
        raise ValueError(f"line {lineno}: atom label {label!r} does not start with an element symbol")
    letters = m.group(0)
    two, one = letters[:2].capitalize(), letters[:1].upper()
    if len(letters) >= 2 and two in COVALENT_RADII:
        return two
    if one in COVALENT_RADII or one == "X":
        return one
    raise ValueError(f"line {lineno}: unknown element in atom label {label!r}")


def read_zmat(path_or_file: PathOrFile) -> ZMatrix:
    """Read a Gaussian-style Z-matrix.

    Args:
        path_or_file: a path or an open text file.

    Returns:
        A :class:`~batched_nerf.ZMatrix` (float64, unbatched, angles in radians)
        with the element symbols and the labels as written; dummy atoms (element
        ``X``) are marked as not :attr:`~batched_nerf.ZMatrix.real`.

    Raises:
        ValueError: naming the 1-based line and the reason: no atoms, a wrong
            number of fields for the row, a reference that is not an earlier
            atom or is repeated, a value that is neither a number nor a defined
            variable, a malformed or repeated variable line, a non-positive bond
            length, an angle outside [0, 180] degrees, or an unsupported form.

    Example:
        >>> import io
        >>> from batched_nerf.formats import read_zmat
        >>> z = read_zmat(io.StringIO("O\\nH 1 0.96\\nH 1 R 2 104.5\\n\\nR 0.96\\n"))
        >>> z.elements, z.table.refs.tolist(), z.bonds.tolist()
        (['O', 'H', 'H'], [[-1, -1, -1], [0, -1, -1], [0, 1, -1]], [0.0, 0.96, 0.96])
    """
    with open_text(path_or_file, "r") as handle:
        lines = handle.read().splitlines()
    k = 0
    while k < len(lines) and not _strip(lines[k]):
        k += 1
    atoms: list[tuple[int, list[str]]] = []
    while k < len(lines) and _strip(lines[k]):
        text = _strip(lines[k])
        if text.lower().rstrip(":") in ("variables", "constants"):
            break
        atoms.append((k + 1, text.split()))
        k += 1
    if not atoms:
        raise ValueError(f"line {min(k, len(lines)) + 1}: no atom lines found")
    variables: dict[str, float] = {}
    for lineno, raw in enumerate(lines[k:], start=k + 1):
        text = _strip(raw)
        if not text or text.lower().rstrip(":") in ("variables", "constants"):
            continue
        fields = text.replace("=", " ").split()
        if len(fields) != 2 or not _NAME.match(fields[0]) or not _NUMBER.match(fields[1]):
            raise ValueError(
                f"line {lineno}: expected a variable definition 'name value', got {raw.strip()!r}"
            )
        if fields[0] in variables:
            raise ValueError(f"line {lineno}: variable {fields[0]!r} defined twice")
        variables[fields[0]] = float(fields[1].replace("d", "e").replace("D", "e"))

    n = len(atoms)
    refs = np.full((n, 3), -1, dtype=np.int64)
    values = np.zeros((n, 3))
    names: list[str] = []
    elements: list[str] = []
    label_index: dict[str, int] = {}
    for row, (lineno, fields) in enumerate(atoms):
        label = fields[0]
        elements.append(_element(label, lineno))
        names.append(label)
        n_refs = min(row, 3)
        expected = 1 + 2 * n_refs
        if n_refs == 3 and len(fields) == 8:
            if fields[7] != "0":
                raise ValueError(
                    f"line {lineno}: the two-angle form (flag {fields[7]}) is not supported; "
                    "use a dihedral (flag 0 or no flag)"
                )
            fields = fields[:7]
        if len(fields) != expected:
            what = "only an element" if n_refs == 0 else f"an element and {n_refs} (reference, value) pairs"
            raise ValueError(
                f"line {lineno}: atom {row + 1} expects {expected} fields ({what}), got {len(fields)}"
            )
        for j in range(n_refs):
            token = fields[1 + 2 * j]
            if token.lstrip("+-").isdigit():
                ref = int(token) - 1
                if not 0 <= ref < row:
                    raise ValueError(f"line {lineno}: reference {token} must be an earlier atom (1..{row})")
            elif token in label_index:
                ref = label_index[token]
            else:
                raise ValueError(f"line {lineno}: unknown atom reference {token!r}")
            if ref in refs[row, :j]:
                raise ValueError(f"line {lineno}: atom {ref + 1} referenced twice")
            refs[row, j] = ref
            values[row, j] = _value(fields[2 + 2 * j], variables, lineno)
        bond, ang = values[row, 0], values[row, 1]
        if n_refs >= 1 and not bond > 0:
            raise ValueError(f"line {lineno}: bond length must be positive, got {bond}")
        if n_refs >= 2 and not 0.0 <= ang <= 180.0:
            raise ValueError(f"line {lineno}: angle must lie in [0, 180] degrees, got {ang}")
        label_index.setdefault(label, row)
    from .._table import ConstructionTable

    return ZMatrix(
        ConstructionTable(refs),
        torch.from_numpy(values[:, 0].copy()),
        torch.from_numpy(np.deg2rad(values[:, 1])),
        torch.from_numpy(np.deg2rad(values[:, 2])),
        elements=elements,
        labels=names,
        real=torch.tensor([e != "X" for e in elements], dtype=torch.bool),
    )


def _value(token: str, variables: dict[str, float], lineno: int) -> float:
    if _NUMBER.match(token):
        return float(token.replace("d", "e").replace("D", "e"))
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
        elements: ``N`` element symbols, or a :class:`~batched_nerf.ZMatrix` of
            one conformation with elements (then ``refs`` and the values are
            taken from it and must not be passed).
        refs: a :class:`~batched_nerf.ConstructionTable` (without fixed atoms) or
            an ``(N, 3)`` integer array, ``-1`` for no reference.
        bonds: ``(N,)`` bond lengths of one conformation (numpy, lists or
            torch tensors); entries unused by an atom are ignored.
        angles: ``(N,)`` bond angles, like ``bonds``.
        dihedrals: ``(N,)`` IUPAC dihedrals, like ``bonds``.
        degrees: whether ``angles``/``dihedrals`` are in degrees (default radians).
        variables: write symbolic ``R<k>``/``A<k>``/``D<k>`` names and a variable block.
        precision: decimals written per value.

    Returns:
        ``(N,)`` ``np.int64`` ``order``: written row ``k`` is atom ``order[k]``.

    Raises:
        TypeError: for a ZMatrix together with ``refs`` or values, or missing
            ``refs`` or values otherwise.
        ValueError: for a ZMatrix without elements or with more than one
            conformation, for fixed atoms, not exactly one seed triple (Gaussian
            describes one connected build), references that cannot be written
            as Gaussian rows, a reference cycle, or values of the wrong shape.

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
    elements = [str(e) for e in elements]
    if len(elements) != n:
        raise ValueError(f"got {len(elements)} elements for {n} atoms")
    vals = []
    for name, v in (("bonds", bonds), ("angles", angles), ("dihedrals", dihedrals)):
        arr = as_numpy(v)
        if arr.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},) (one conformation), got {tuple(arr.shape)}")
        vals.append(arr)
    b, a, d = vals
    if not degrees:
        a, d = np.rad2deg(a), np.rad2deg(d)
    n_refs = (ref_arr >= 0).sum(1)
    roots = np.flatnonzero(n_refs == 0)
    if n and roots.size != 1:
        raise ValueError(
            "a Gaussian Z-matrix describes one connected build with a single seed triple; "
            f"the table has {roots.size} atoms without references (rows {roots.tolist()[:8]})"
        )
    order = topological_order(ref_arr)
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
