"""Adapter for [chemcoord](https://github.com/mcocdawc/chemcoord) ``Zmat`` objects.

chemcoord (an optional dependency, imported only when these functions are
called) describes a molecule as a table of rows ``atom, b, bond, a, angle, d,
dihedral``, indexed by atom labels, every row referencing three earlier atoms
or one of the *absolute references* ``origin``, ``e_x``, ``e_y``, ``e_z``
(stored as strings, or internally as very negative integers). The mapping onto
[`ZMatrix`][batched_nerf.ZMatrix]:

* **Rows.** The ``Zmat``'s rows become the first rows of the table, in the same
  order; row ``k``'s label (the ``Zmat`` index) is kept as ``labels[k]``.
* **Absolute references** become *fixed dummy atoms*, appended after the real
  rows, at ``origin = (0, 0, 0)``, ``e_x = (1, 0, 0)``, ``e_y = (0, 1, 0)`` and
  ``e_z = (0, 0, 1)`` (element ``"X"``, label the reference's name, not
  [`real`][batched_nerf.ZMatrix.real]). So every chemcoord row is a fully
  referenced row, and [`to_cartesian`][batched_nerf.ZMatrix.to_cartesian] reproduces
  ``zmat.get_cartesian()`` exactly, not just up to a rigid motion.
* **Units and signs.** chemcoord's angles are degrees; its dihedral is the
  negative of the IUPAC dihedral used here (chemcoord places atom ``i`` at
  ``B @ (r sin a cos d, -r sin a sin d, -r cos a)``), so
  ``dihedrals = -radians(zmat["dihedral"])``.
* **Seeds.** Going the other way ([`to_chemcoord`][batched_nerf.formats.to_chemcoord]), the seed rows of a
  component are written with absolute references that reproduce this package's
  canonical frame: the root at the origin (``origin, e_z, e_x``, bond ``0``), the
  second seed on ``+x`` (``root, e_z, e_x``, angle 90 deg) and the third in the
  ``xy``-plane with ``y > 0`` (``b, a, e_y``, dihedral 0).

Example (needs chemcoord):

```python
import chemcoord as cc
import batched_nerf as bn
zmat = cc.Cartesian.read_xyz("molecule.xyz").get_zmat()
z = bn.from_chemcoord(zmat)              # radians, IUPAC dihedrals
xyz = z.to_cartesian()                   # == zmat.get_cartesian() coordinates
zmat2 = bn.to_chemcoord(z)               # the same Zmat again
```
"""

from __future__ import annotations

import io
import os
import re
import sys
from typing import IO, Any

import numpy as np
import torch

from ..core.files import PathOrFile, finite_float, optional_import, read_text, require_one_conformation
from ..core.table import ConstructionTable
from ..core.zmatrix import ZMatrix
from ..topology.order import build_order

__all__ = ["ABSOLUTE_REFERENCES", "from_chemcoord", "read_chemcoord", "to_chemcoord"]

#: chemcoord's absolute references and the positions of the dummy atoms standing for them.
ABSOLUTE_REFERENCES: dict[str, tuple[float, float, float]] = {
    "origin": (0.0, 0.0, 0.0),
    "e_x": (1.0, 0.0, 0.0),
    "e_y": (0.0, 1.0, 0.0),
    "e_z": (0.0, 0.0, 1.0),
}

# chemcoord.constants.int_label, without importing chemcoord
_INT_LABEL = {
    -sys.maxsize - 1: "origin",
    -sys.maxsize: "e_x",
    -sys.maxsize + 1: "e_y",
    -sys.maxsize + 2: "e_z",
}
_COLUMNS = ["atom", "b", "bond", "a", "angle", "d", "dihedral"]


def _import_chemcoord() -> Any:
    return optional_import("chemcoord", "chemcoord")


def _absolute_name(ref: Any) -> str | None:
    """``'origin'`` etc. for an absolute reference (string or chemcoord integer), else ``None``."""
    if isinstance(ref, str):
        return ref if ref in ABSOLUTE_REFERENCES else None
    if isinstance(ref, (int, np.integer)) and int(ref) in _INT_LABEL:
        return _INT_LABEL[int(ref)]
    return None


def from_chemcoord(zmat: Any) -> ZMatrix:
    """A [`ZMatrix`][batched_nerf.ZMatrix] from a chemcoord ``Zmat``.

    Args:
        zmat: a ``chemcoord.Zmat`` (numeric values; sympy symbols must be
            substituted first with ``zmat.subs``).

    Returns:
        A float64, unbatched [`ZMatrix`][batched_nerf.ZMatrix] (radians, IUPAC
        dihedrals) whose first ``len(zmat)`` rows are the ``Zmat``'s rows in its
        order, followed by one fixed dummy atom per absolute reference used;
        ``elements`` are the ``atom`` column (``"X"`` for the dummies) and
        ``labels`` the ``Zmat`` index as strings (the reference names for the
        dummies).

    Raises:
        ImportError: chemcoord is not installed.
        TypeError: ``zmat`` is not a ``chemcoord.Zmat``.
        ValueError: a reference to an atom that is not in the ``Zmat``,
            non-numeric values, or references that do not form a valid table.

    Example (needs chemcoord; run on the adapter's docs page):
        >>> import batched_nerf as bn  # doctest: +SKIP
        >>> z = bn.from_chemcoord(zmat)  # doctest: +SKIP
        >>> xyz = z.to_cartesian()  # equals zmat.get_cartesian() row for row  # doctest: +SKIP
    """
    cc = _import_chemcoord()
    if not isinstance(zmat, cc.Zmat):
        raise TypeError(f"expected a chemcoord.Zmat, got {type(zmat).__name__}")
    index = list(zmat.index)
    n = len(index)
    row_of = {label: k for k, label in enumerate(index)}
    used: list[str] = []
    raw_refs: list[list[int | str]] = []
    for k, label in enumerate(index):
        row: list[int | str] = []
        for col in ("b", "a", "d"):
            ref = zmat[col].iloc[k]
            name = _absolute_name(ref)
            if name is not None:
                if name not in used:
                    used.append(name)
                row.append(name)
            elif ref in row_of:
                row.append(row_of[ref])
            else:
                raise ValueError(
                    f"row {k} (atom {label!r}): column {col!r} references {ref!r}, which is neither an "
                    "atom of the Zmat nor an absolute reference"
                )
        raw_refs.append(row)
    dummies = [name for name in ABSOLUTE_REFERENCES if name in used]
    dummy_row = {name: n + j for j, name in enumerate(dummies)}
    refs = np.array(
        [[r if isinstance(r, int) else dummy_row[r] for r in row] for row in raw_refs], dtype=np.int64
    )
    refs = np.concatenate([refs.reshape(n, 3), np.full((len(dummies), 3), -1, dtype=np.int64)])
    table = ConstructionTable(refs, fixed=list(range(n, n + len(dummies))))
    try:
        values = {c: np.asarray(zmat[c], dtype=np.float64) for c in ("bond", "angle", "dihedral")}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the Zmat has non-numeric values (substitute symbols first): {exc}") from None
    pad = np.zeros(len(dummies))
    bonds = np.concatenate([values["bond"], pad])
    angles = np.concatenate([np.radians(values["angle"]), pad])
    dihedrals = np.concatenate([-np.radians(values["dihedral"]), pad])
    fixed_xyz = torch.tensor([ABSOLUTE_REFERENCES[name] for name in dummies], dtype=torch.float64)
    return ZMatrix(
        table,
        torch.from_numpy(bonds),
        torch.from_numpy(angles),
        torch.from_numpy(dihedrals),
        fixed_xyz.reshape(len(dummies), 3) if dummies else None,
        elements=[str(a) for a in zmat["atom"]] + ["X"] * len(dummies),
        labels=[str(label) for label in index] + dummies,
        real=torch.tensor([True] * n + [False] * len(dummies)),
    )


def read_chemcoord(path_or_file: PathOrFile | IO[bytes]) -> ZMatrix:
    """Read a chemcoord Z-matrix file (as ``Zmat.to_zmat`` writes it) as a [`ZMatrix`][batched_nerf.ZMatrix].

    Lines ``atom b bond a angle d dihedral`` (``#`` starts a comment), the
    references 1-based atom numbers or absolute references (``origin``,
    ``e_x``, ``e_y``, ``e_z``); or chemcoord's short form whose first three
    lines have 1, 3 and 5 fields. The lines are checked here, naming the
    file's line and atom, then read by ``chemcoord.Zmat.read_zmat`` and
    converted by [`from_chemcoord`][batched_nerf.formats.from_chemcoord]. A leading byte-order mark is
    ignored.

    Args:
        path_or_file: a path or an open file (text or binary, UTF-8).

    Returns:
        The [`ZMatrix`][batched_nerf.ZMatrix] of [`from_chemcoord`][batched_nerf.formats.from_chemcoord].

    Raises:
        ImportError: chemcoord is not installed.
        ValueError: naming the file (or ``"the input"``), line and atom: an
            empty file, a wrong number of fields, a reference that is not an
            atom number of the file or an absolute reference, a value that is
            not a finite number, or a Z-matrix chemcoord cannot build.

    Example (needs chemcoord; run on the adapter's docs page):
        >>> from batched_nerf.formats import read_chemcoord  # doctest: +SKIP
        >>> z = read_chemcoord("water.zmat")  # doctest: +SKIP
    """
    where = "the input" if hasattr(path_or_file, "read") else repr(os.fspath(path_or_file))  # type: ignore[arg-type]
    text = read_text(path_or_file)
    rows: list[tuple[int, list[str]]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split("#", 1)[0].split()
        if fields:
            rows.append((lineno, fields))
    if not rows:
        raise ValueError(
            f"{where}: empty chemcoord Z-matrix: no atom lines 'atom b bond a angle d dihedral' found"
        )
    short = len(rows[0][1]) == 1  # chemcoord's form with implicit seed references
    n = len(rows)
    for k, (lineno, fields) in enumerate(rows):
        want = 1 + 2 * min(k, 3) if short else 7
        if len(fields) != want:
            form = " ".join(["atom", "b bond", "a angle", "d dihedral"][: (want + 1) // 2])
            raise ValueError(
                f"{where}: line {lineno} (atom {k + 1}): expected {want} fields '{form}', got {len(fields)}"
            )
        for j in range(1, want, 2):
            ref, value = fields[j], fields[j + 1]
            if ref not in ABSOLUTE_REFERENCES and not (
                ref.isdigit() and 1 <= int(ref) <= n and int(ref) != k + 1
            ):
                raise ValueError(
                    f"{where}: line {lineno} (atom {k + 1}): reference {ref!r} is neither another atom's "
                    f"number (1..{n}) nor an absolute reference {tuple(ABSOLUTE_REFERENCES)}"
                )
            finite_float(value, f"{where}: line {lineno} (atom {k + 1})", "value")
    cc = _import_chemcoord()
    clean = "\n".join(" ".join(fields) for _, fields in rows) + "\n"
    try:
        return from_chemcoord(cc.Zmat.read_zmat(io.StringIO(clean)))
    except Exception as exc:  # chemcoord raises many kinds of errors
        # internal rows are the file's atoms in order: name the file's lines
        message = re.sub(
            r"\brow (\d+)\b",
            lambda m: f"line {rows[int(m.group(1))][0]} (atom {int(m.group(1)) + 1})"
            if int(m.group(1)) < n
            else m.group(0),
            str(exc),
        )
        raise ValueError(f"{where}: {message}") from None


def to_chemcoord(zmatrix: ZMatrix) -> Any:
    """A chemcoord ``Zmat`` from a [`ZMatrix`][batched_nerf.ZMatrix] of one conformation.

    Fixed atoms must be dummies at the positions of chemcoord's absolute
    references (as [`from_chemcoord`][batched_nerf.formats.from_chemcoord] makes them); they become references
    to ``origin``/``e_x``/``e_y``/``e_z``. Seed rows are written with absolute
    references that put the atoms where [`to_cartesian`][batched_nerf.to_cartesian]
    does (see the module description), so ``to_chemcoord(z).get_cartesian()``
    equals ``z.to_cartesian()`` (for the rows it keeps). Rows are written in a
    build order (chemcoord references only earlier rows) that keeps the
    original order where possible; non-fixed dummy rows (Gaussian ``X``)
    are kept as ``X`` atoms. chemcoord refuses collinear reference atoms
    ``b-a-d`` even where the dihedral does not matter (a straight angle, as in
    acetylene); such rows take the least collinear absolute reference as ``d``
    instead, with the dihedral measured in the built coordinates. The index is
    taken from the labels when they are distinct integers (as after
    [`from_chemcoord`][batched_nerf.formats.from_chemcoord]), else it is the row number among the non-fixed
    rows.

    Args:
        zmatrix: a [`ZMatrix`][batched_nerf.ZMatrix] with ``elements`` and a batch
            of one conformation (any dtype and device).

    Returns:
        A ``chemcoord.Zmat`` (angles in degrees, chemcoord's dihedral sign).

    Raises:
        ImportError: chemcoord is not installed.
        TypeError: ``zmatrix`` is not a ZMatrix.
        ValueError: no elements, more than one conformation, a fixed atom
            that is not at one of the absolute references, or several seeded
            components (their relative placement is not in the ZMatrix; link
            them first, see [`from_cartesian`][batched_nerf.ZMatrix.from_cartesian]).

    Example (needs chemcoord; run on the adapter's docs page):
        >>> import batched_nerf as bn  # doctest: +SKIP
        >>> zmat = bn.to_chemcoord(z)  # z: a bn.ZMatrix with elements  # doctest: +SKIP
    """
    cc = _import_chemcoord()
    import pandas as pd

    if not isinstance(zmatrix, ZMatrix):
        raise TypeError(f"expected a batched_nerf.ZMatrix, got {type(zmatrix).__name__}")
    require_one_conformation(zmatrix, "a chemcoord Zmat")
    table = zmatrix.table
    n = table.n_atoms
    refs = table.refs.numpy()
    fixed = table.fixed.tolist()
    name_of: dict[int, str] = {}
    if fixed:
        assert zmatrix.fixed_xyz is not None
        positions = zmatrix.fixed_xyz.detach().cpu().double().reshape(len(fixed), 3).numpy()
        for row, pos in zip(fixed, positions):
            name = next(
                (k for k, v in ABSOLUTE_REFERENCES.items() if np.allclose(pos, v, rtol=0, atol=1e-12)), None
            )
            if name is None:
                raise ValueError(
                    f"row {row}: fixed atom at {pos.tolist()}; chemcoord can only express fixed atoms at "
                    f"its absolute references {ABSOLUTE_REFERENCES}"
                )
            name_of[row] = name
    comp = table.components.numpy()
    seeded = sorted(set(comp.tolist()) - set(comp[fixed].tolist()))
    if len(seeded) > 1:
        roots = [int(np.flatnonzero((comp == c) & ((refs >= 0).sum(1) == 0))[0]) for c in seeded]
        raise ValueError(
            f"the table has {len(seeded)} separately seeded components (roots at rows {roots[:8]}), which "
            "to_cartesian and a chemcoord Zmat both stack at the origin, so their placement relative to each "
            "other is not in the ZMatrix; link them into one build first (ZMatrix.from_cartesian(xyz, table) "
            "and ConstructionTable.from_xyz do by default)"
        )
    keep = [i for i in range(n) if i not in name_of]
    elements = zmatrix.elements
    labels = zmatrix.labels
    index: list[int] = list(range(len(keep)))
    if labels is not None:
        try:
            parsed = [int(labels[i]) for i in keep]
        except ValueError:
            parsed = []
        if len(parsed) == len(keep) and len(set(parsed)) == len(parsed):
            index = parsed
    label_of = {i: index[k] for k, i in enumerate(keep)}
    bonds, angles, dihedrals = (
        t.detach().cpu().double().reshape(n).numpy()
        for t in (zmatrix.bonds, zmatrix.angles, zmatrix.dihedrals)
    )
    n_refs = (refs >= 0).sum(1)
    built: np.ndarray | None = None
    rows: list[list[Any]] = []
    for i in keep:
        b, a, d = (name_of.get(r, label_of.get(r)) for r in refs[i].tolist())
        bond, angle, dihedral = (
            float(bonds[i]),
            float(np.degrees(angles[i])),
            float(-np.degrees(dihedrals[i])),
        )
        if n_refs[i] == 3:
            if built is None:
                built = zmatrix.to_cartesian(dummies=True).detach().cpu().double().reshape(n, 3).numpy()
            if _collinear(*built[refs[i]]):
                # chemcoord refuses a collinear b-a-d even where the dihedral is irrelevant (a straight
                # angle, as in acetylene): take the least collinear absolute reference instead
                d, point = _best_absolute(built[refs[i, 0]], built[refs[i, 1]])
                dihedral = -float(
                    np.degrees(_dihedral(built[i], built[refs[i, 0]], built[refs[i, 1]], point))
                )
        if n_refs[i] == 0:  # root: at the origin
            b, a, d, bond, angle, dihedral = "origin", "e_z", "e_x", 0.0, 0.0, 0.0
        elif n_refs[i] == 1:  # second seed: on +x
            a, d, angle, dihedral = "e_z", "e_x", 90.0, 0.0
        elif n_refs[i] == 2:  # third seed: in the xy-plane, y > 0
            d, dihedral = "e_y", 0.0
        rows.append([elements[i], b, bond, a, angle, d, dihedral])
    # build order among the kept rows (references to absolute refs do not constrain it)
    position = {i: k for k, i in enumerate(keep)}
    local = np.array(
        [[position.get(r, -1) if r >= 0 else -1 for r in refs[i].tolist()] for i in keep], dtype=np.int64
    ).reshape(len(keep), 3)
    order = build_order(local).tolist()
    frame = pd.DataFrame([rows[k] for k in order], columns=_COLUMNS, index=[index[k] for k in order])
    frame = frame.astype({"atom": object, "b": object, "a": object, "d": object})
    frame = frame.astype({"bond": "f8", "angle": "f8", "dihedral": "f8"})
    return cc.Zmat(frame)


def _sin_at(p: np.ndarray, q: np.ndarray, r: np.ndarray) -> float:
    """Sine of the angle p-q-r at q (0 for coincident points)."""
    u, v = p - q, r - q
    norm = float(np.linalg.norm(u) * np.linalg.norm(v))
    return float(np.linalg.norm(np.cross(u, v))) / norm if norm > 0 else 0.0


def _collinear(b: np.ndarray, a: np.ndarray, d: np.ndarray) -> bool:
    """Whether chemcoord would call the reference frame ``b, a, d`` invalid (with a safety margin)."""
    return _sin_at(b, a, d) < 1e-6 or float(np.linalg.norm(np.cross(d - a, b - a))) < 1e-6


def _best_absolute(b: np.ndarray, a: np.ndarray) -> tuple[str, np.ndarray]:
    """The absolute reference least collinear with ``b-a`` (as dihedral reference ``d``)."""
    name = max(ABSOLUTE_REFERENCES, key=lambda k: _sin_at(b, a, np.array(ABSOLUTE_REFERENCES[k])))
    return name, np.array(ABSOLUTE_REFERENCES[name])


def _dihedral(p0: np.ndarray, p1: np.ndarray, p2: np.ndarray, p3: np.ndarray) -> float:
    """IUPAC dihedral p0-p1-p2-p3 in radians (0 when undefined)."""
    b0, b1, b2 = p0 - p1, p2 - p1, p3 - p2
    n1 = b1 / max(float(np.linalg.norm(b1)), 1e-300)
    v, w = b0 - (b0 @ n1) * n1, b2 - (b2 @ n1) * n1
    return float(np.arctan2(np.cross(n1, v) @ w, v @ w))
