"""XYZ files: an atom count line, a comment line, then ``element x y z`` lines, per frame.

Multi-frame files (trajectories) simply repeat the block; every frame must list
the same elements in the same order. Columns after ``z`` (e.g. the extended
XYZ forces) are ignored when reading. Coordinates are returned as written
(usually Angstrom); nothing is converted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from ..core.files import PathOrFile, as_numpy, check_precision, finite_float, open_text, read_text

__all__ = ["read_xyz", "write_xyz"]

#: A finite decimal number as XYZ files write it (no ``nan``/``inf``, no ``1_000`` digit grouping).
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def read_xyz(path_or_file: PathOrFile | IO[bytes]) -> tuple[list[str], np.ndarray, list[str]]:
    """Read a single- or multi-frame XYZ file.

    Args:
        path_or_file: a path or an open file (text, or binary: decoded as
            UTF-8); a leading byte-order mark is ignored.

    Returns:
        ``(elements, xyz, comments)``: the ``N`` element symbols (as written),
        ``(F, N, 3)`` ``float64`` coordinates (``F = 1`` for a single frame), and
        the ``F`` comment lines (without the newline).

    Raises:
        ValueError: naming the 1-based line and the reason, for an empty file, a
            bad atom count, a missing comment or atom line, an atom line with
            fewer than 4 fields, a coordinate that is not a finite decimal number
            (``nan``, ``inf``, ``1e400``, which overflows float64, and ``1_0`` are
            refused), a file that is not UTF-8, or a frame whose atom count or
            elements differ from the first frame, or two atoms of a frame at the
            same coordinates (naming both lines).

    Example:
        >>> import io
        >>> from batched_nerf.formats import read_xyz
        >>> text = "2\\nwater-ish\\nO 0 0 0\\nH 0.96 0 0\\n"
        >>> elements, xyz, comments = read_xyz(io.StringIO(text))
        >>> elements, xyz.shape, comments
        (['O', 'H'], (1, 2, 3), ['water-ish'])
    """
    lines = read_text(path_or_file).splitlines()
    elements: list[str] | None = None
    frames: list[np.ndarray] = []
    comments: list[str] = []
    starts: list[int] = []
    k = 0
    while k < len(lines):
        if not lines[k].strip():  # blank lines between or after frames
            k += 1
            continue
        head = lines[k].split()
        if not re.fullmatch(r"[+-]?\d+", head[0]):  # int() would take "1_0" too
            raise ValueError(f"line {k + 1}: expected the atom count, got {lines[k].strip()!r}")
        n = int(head[0])
        if len(head) != 1 or n < 0:
            raise ValueError(f"line {k + 1}: expected a non-negative atom count, got {lines[k].strip()!r}")
        frame_no = len(frames) + 1
        if k + 1 >= len(lines):
            raise ValueError(
                f"line {k + 2}: unexpected end of file, expected the comment line of frame {frame_no}"
            )
        comments.append(lines[k + 1])
        if k + 2 + n > len(lines):
            got = len(lines) - k - 2
            raise ValueError(
                f"line {len(lines) + 1}: unexpected end of file, frame {frame_no} declares {n} atoms "
                f"but only {got} atom lines follow"
            )
        names: list[str] = []
        coords = np.empty((n, 3))
        for a in range(n):
            lineno = k + 3 + a
            fields = lines[lineno - 1].split()
            if len(fields) < 4:
                raise ValueError(f"line {lineno}: expected 4 fields 'element x y z', got {len(fields)}")
            names.append(fields[0])
            for c in range(3):
                coords[a, c] = finite_float(fields[1 + c], f"line {lineno}", "coordinate", pattern=_NUMBER)
        if elements is None:
            elements = names
        elif len(names) != len(elements):
            raise ValueError(
                f"line {k + 1}: frame {frame_no} has {len(names)} atoms, the first frame {len(elements)}"
            )
        elif names != elements:
            bad = next(a for a in range(n) if names[a] != elements[a])
            raise ValueError(
                f"line {k + 3 + bad}: frame {frame_no} has element {names[bad]!r} for atom {bad}, "
                f"the first frame {elements[bad]!r}"
            )
        frames.append(coords)
        starts.append(k + 3)
        k += 2 + n
    if elements is None:
        raise ValueError("line 1: empty XYZ file, expected an atom count")
    xyz = np.stack(frames)
    _check_distinct(xyz, starts)
    return elements, xyz, comments


def _check_distinct(xyz: np.ndarray, starts: list[int]) -> None:
    """Raise for two atoms of one frame at exactly the same coordinates (``starts``: first atom lines)."""
    n = xyz.shape[1]
    if n < 2:
        return
    # identical atoms have identical projections; sorting one number per atom is fast
    key = xyz @ np.array([1.0, 0.7548776662466927, 0.5698402909980532])
    order = np.argsort(key, axis=1, kind="stable")
    ranked = np.take_along_axis(key, order, axis=1)
    for f, k in zip(*np.nonzero(ranked[:, 1:] == ranked[:, :-1])):
        tied = order[f][ranked[f] == ranked[f, k]].tolist()  # all atoms sharing the key
        pairs = sorted((p, q) for p in tied for q in tied if p < q and (xyz[f, p] == xyz[f, q]).all())
        if pairs:
            i, j = pairs[0]
            raise ValueError(
                f"line {starts[f] + j}: atom {j} has the same coordinates as atom {i} (line {starts[f] + i}) "
                f"in frame {f + 1}: coincident atoms (a duplicated line?)"
            )


def write_xyz(
    path_or_file: PathOrFile,
    elements: Sequence[str],
    xyz: Any,
    comments: str | Sequence[str] | None = None,
    *,
    precision: int = 8,
) -> None:
    """Write one frame ``(N, 3)`` or a trajectory ``(F, N, 3)`` as XYZ.

    Args:
        path_or_file: a path (overwritten) or an open text file (appended to).
        elements: ``N`` element symbols.
        xyz: ``(N, 3)`` or ``(F, N, 3)`` coordinates; numpy, lists or torch
            tensors (detached and moved to the CPU).
        comments: one comment for every frame, or a sequence of ``F`` comments;
            ``None`` writes empty comment lines.
        precision: decimals written per coordinate (a non-negative integer).

    Raises:
        ValueError: for a negative ``precision``, a wrong shape, a count mismatch, non-finite coordinates,
            an empty or whitespace-containing element, or a comment containing a
            line break.

    Example:
        >>> import io
        >>> import numpy as np
        >>> from batched_nerf.formats import write_xyz
        >>> out = io.StringIO()
        >>> write_xyz(out, ["H", "H"], np.array([[0.0, 0.0, 0.0], [0.74, 0.0, 0.0]]), "H2", precision=3)
        >>> print(out.getvalue(), end="")
        2
        H2
        H 0.000 0.000 0.000
        H 0.740 0.000 0.000
    """
    coords = as_numpy(xyz)
    if coords.ndim == 2:
        coords = coords[None]
    if coords.ndim != 3 or coords.shape[-1] != 3:
        raise ValueError(f"xyz must have shape (N, 3) or (F, N, 3), got {tuple(as_numpy(xyz).shape)}")
    n_frames, n_atoms = coords.shape[:2]
    elements = [str(e) for e in elements]
    if len(elements) != n_atoms:
        raise ValueError(f"got {len(elements)} elements for {n_atoms} atoms")
    for a, el in enumerate(elements):
        if not el or len(el.split()) != 1 or el != el.strip():
            raise ValueError(f"element {a} must be a non-empty symbol without spaces, got {el!r}")
    if not np.isfinite(coords).all():
        raise ValueError("xyz contains NaN or infinite values")
    if comments is None:
        lines_c = [""] * n_frames
    elif isinstance(comments, str):
        lines_c = [comments] * n_frames
    else:
        lines_c = [str(c) for c in comments]
        if len(lines_c) != n_frames:
            raise ValueError(f"got {len(lines_c)} comments for {n_frames} frames")
    for f, c in enumerate(lines_c):
        if "\n" in c or "\r" in c:
            raise ValueError(f"comment of frame {f} contains a line break")
    # one %-template per frame: much faster than formatting line by line
    number = f"%.{check_precision(precision)}f"
    body = "".join(f"{el.replace('%', '%%')} {number} {number} {number}\n" for el in elements)
    chunks: list[str] = []
    for f in range(n_frames):
        chunks.append(f"{n_atoms}\n{lines_c[f]}\n")
        chunks.append(body % tuple(coords[f].reshape(-1).tolist()))
    with open_text(path_or_file, "w") as handle:
        handle.write("".join(chunks))
