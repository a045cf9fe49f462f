"""Integer Z-matrices of bgflow / bgmol.

bgflow's internal-coordinate flows (``bgflow.nn.flow.crd_transform.ic``) take a
``z_matrix`` of shape ``(M, 4)`` whose row ``[i, b, a, d]`` places atom ``i``
from its bond partner ``b``, angle partner ``a`` and torsion partner ``d``,
plus an optional list of ``fixed_atoms`` kept in Cartesian coordinates.

How bgflow's conventions map onto [`ConstructionTable`][batched_nerf.ConstructionTable]:

* **Rows and atoms.** A bgflow row is our row ``refs[i] = (b, a, d)``; bgflow's
  rows may come in any order and its outputs (bonds, angles, torsions) follow
  the z-matrix rows, ours follow the atoms: ``ours[..., z[:, 0]] = bgflow[...]``.
* **Relative / mixed mode** (``RelativeInternalCoordinateTransformation``,
  ``MixedCoordinateTransformation``): the fixed atoms are not in the z-matrix
  and every row is complete; they become our ``fixed`` atoms (rows
  ``(-1, -1, -1)``), whose positions go to ``to_cartesian(..., fixed_xyz=...)``
  in the order of ``fixed_atoms``.
* **Global mode** (``GlobalInternalCoordinateTransformation``): the three rows
  with the most ``-1`` entries, ``[r, -1, -1, -1]``, ``[s, r, -1, -1]`` and
  ``[t, s, r, -1]``, are the seeds; bgflow measures the chain ``r-s-t`` (bond
  ``t-s``, angle ``t-s-r``) and encodes the global pose separately, where we put
  ``r`` at the origin, ``s`` on ``+x`` and ``t`` in the ``xy``-plane. Seed rows are
  read literally, so a third seed row ``[t, r, s, -1]`` becomes our
  ``(r, s, -1)``; bgflow would still use the ``r-s-t`` chain for it, so tables
  written for bgflow's global mode should use ``[t, s, r, -1]``.
* **Dihedral sign.** bgflow's torsion of row ``[i, b, a, d]`` is the IUPAC
  dihedral of ``(x_i, x_b, x_a, x_d)``, the same as ours.
* **Units.** bgflow takes lengths in whatever unit its coordinates have
  (nanometres for OpenMM systems; our shipped data are in Angstrom). Angles and
  torsions are radians, but with ``normalize_angles=True`` (the default) bgflow
  outputs ``angle / pi`` and ``(torsion + pi) / (2 pi)`` in ``[0, 1]``: undo that
  with ``angle = u * pi`` and ``dihedral = v * 2 pi - pi`` before
  [`to_cartesian`][batched_nerf.to_cartesian].
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.files import as_numpy, refs_of
from ..core.table import ConstructionTable
from ..topology.order import build_order

__all__ = ["refs_from_bgflow", "refs_to_bgflow", "table_from_bgflow", "table_to_bgflow"]


def refs_from_bgflow(
    z_matrix: Any, fixed_atoms: Any = None, n_atoms: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Construction-table rows from a bgflow z-matrix, as numpy arrays.

    Args:
        z_matrix: ``(M, 4)`` integer rows ``[atom, bond_ref, angle_ref, dihedral_ref]``,
            ``-1`` for missing references (numpy, lists or torch).
        fixed_atoms: optional indices of atoms kept in Cartesian coordinates.
        n_atoms: number of atoms ``N``; by default one more than the largest index.

    Returns:
        ``(refs, fixed)``: ``(N, 3)`` and ``(F,)`` ``np.int64`` arrays.

    Raises:
        ValueError: for a wrong shape, an index out of range, an atom placed
            twice or both placed and fixed, ``-1`` before a reference, or an atom
            neither placed nor fixed.

    Example:
        >>> from batched_nerf.formats import refs_from_bgflow
        >>> refs, fixed = refs_from_bgflow([[3, 2, 1, 0]], fixed_atoms=[0, 1, 2])
        >>> refs.tolist(), fixed.tolist()
        ([[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [2, 1, 0]], [0, 1, 2])
    """
    z = as_numpy(z_matrix, np.int64)
    if z.size == 0:
        z = z.reshape(0, 4)
    if z.ndim != 2 or z.shape[1] != 4:
        raise ValueError(f"z_matrix must have shape (M, 4), got {tuple(z.shape)}")
    fixed = (
        np.zeros(0, dtype=np.int64) if fixed_atoms is None else as_numpy(fixed_atoms, np.int64).reshape(-1)
    )
    largest = max([int(z.max()) if z.size else -1, int(fixed.max()) if fixed.size else -1])
    n = largest + 1 if n_atoms is None else int(n_atoms)
    if n_atoms is not None and largest >= n:
        raise ValueError(f"atom index {largest} out of range for n_atoms={n}")
    refs = np.full((n, 3), -1, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    for k, row in enumerate(z.tolist()):
        atom, *rest = row
        if atom < 0:
            raise ValueError(f"z-matrix row {k} {row}: atom index must be >= 0")
        if min(rest) < -1:
            raise ValueError(f"z-matrix row {k} {row}: references must be atom indices or -1")
        if any(r == -1 for r in rest[: sum(r >= 0 for r in rest)]):
            raise ValueError(f"z-matrix row {k} {row}: -1 (missing reference) may only come last")
        if placed[atom]:
            raise ValueError(f"z-matrix row {k} {row}: atom {atom} is placed by more than one row")
        placed[atom] = True
        refs[atom] = rest
    for f in fixed.tolist():
        if f < 0:
            raise ValueError(f"fixed atom index {f} must be >= 0")
        if placed[f]:
            raise ValueError(f"atom {f} is both fixed and placed by a z-matrix row")
    covered = placed.copy()
    covered[fixed] = True
    missing = np.flatnonzero(~covered)
    if missing.size:
        raise ValueError(f"atoms {missing.tolist()[:8]} are neither placed by a z-matrix row nor fixed")
    return refs, fixed


def table_from_bgflow(
    z_matrix: Any, fixed_atoms: Any = None, n_atoms: int | None = None
) -> ConstructionTable:
    """A [`ConstructionTable`][batched_nerf.ConstructionTable] from a bgflow / bgmol z-matrix.

    See the module docstring for how bgflow's conventions map onto ours.

    Args:
        z_matrix: ``(M, 4)`` integer rows ``[atom, bond_ref, angle_ref, dihedral_ref]``,
            ``-1`` for missing references (global mode seeds).
        fixed_atoms: indices of atoms given in Cartesian coordinates (relative
            and mixed modes); they become the table's ``fixed`` atoms, in this order.
        n_atoms: number of atoms; by default one more than the largest index.

    Returns:
        The validated table.

    Raises:
        ValueError: as [`refs_from_bgflow`][batched_nerf.formats.refs_from_bgflow], and for tables the
            [`ConstructionTable`][batched_nerf.ConstructionTable] rejects (cycles, bad seeds).

    Example:
        >>> from batched_nerf.formats import table_from_bgflow
        >>> z = [[0, -1, -1, -1], [1, 0, -1, -1], [2, 1, 0, -1], [3, 2, 1, 0]]
        >>> table_from_bgflow(z).refs.tolist()
        [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]]
    """
    refs, fixed = refs_from_bgflow(z_matrix, fixed_atoms, n_atoms)
    return ConstructionTable(refs, fixed=fixed)


def refs_to_bgflow(refs: Any, fixed: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """bgflow z-matrix rows from construction-table rows (see
    [`table_to_bgflow`][batched_nerf.formats.table_to_bgflow])."""
    ref_arr = as_numpy(refs, np.int64)
    if ref_arr.ndim != 2 or ref_arr.shape[1] != 3:
        raise ValueError(f"refs must have shape (N, 3), got {tuple(ref_arr.shape)}")
    fixed_arr = np.zeros(0, dtype=np.int64) if fixed is None else as_numpy(fixed, np.int64).reshape(-1)
    is_fixed = np.zeros(len(ref_arr), dtype=bool)
    is_fixed[fixed_arr] = True
    order = [i for i in build_order(ref_arr).tolist() if not is_fixed[i]]
    z = np.concatenate([np.asarray(order, dtype=np.int64)[:, None], ref_arr[order]], axis=1)
    return z.reshape(-1, 4), fixed_arr.copy()


def table_to_bgflow(table: ConstructionTable) -> tuple[np.ndarray, np.ndarray]:
    """A bgflow z-matrix and fixed-atom list from a construction table.

    Every atom that is not fixed gets one row ``[atom, b, a, d]``, in a build
    order (references before their users). bgflow's relative and mixed
    transforms need complete rows, i.e. a table whose every component is
    anchored by fixed atoms; its global transform needs exactly one seed triple
    and no fixed atoms (see the module docstring for its seed convention).

    Args:
        table: a [`ConstructionTable`][batched_nerf.ConstructionTable] (or any object with
            ``refs`` and ``fixed``).

    Returns:
        ``(z_matrix, fixed_atoms)``: ``(M, 4)`` and ``(F,)`` ``np.int64`` arrays,
        ``M = N - F``.

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf.formats import table_to_bgflow
        >>> table = bn.ConstructionTable([[-1, -1, -1]] * 3 + [[2, 1, 0]], fixed=[0, 1, 2])
        >>> z, fixed = table_to_bgflow(table)
        >>> z.tolist(), fixed.tolist()
        ([[3, 2, 1, 0]], [0, 1, 2])
    """
    refs, fixed = refs_of(table)
    return refs_to_bgflow(refs, fixed)
