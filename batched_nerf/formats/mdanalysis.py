r"""Adapter for [MDAnalysis](https://www.mdanalysis.org) (an optional dependency: ``batched-nerf[md]``).

MDAnalysis is imported only when these functions are called. Coordinates are
in Angstrom on both sides (MDAnalysis's unit); nothing is converted.

* [`table_from_atomgroup`][batched_nerf.formats.table_from_atomgroup]: a construction table from the bonds of
any
  ``AtomGroup`` (several molecules, heavy atoms only, any selection), and
  [`frames`][batched_nerf.formats.frames]: a trajectory slice as one ``(F, N, 3)`` tensor, so that a
  whole trajectory is converted by one [`to_internal`][batched_nerf.to_internal] call.
* [`table_from_bat`][batched_nerf.formats.table_from_bat], [`from_bat`][batched_nerf.formats.from_bat],
[`to_bat`][batched_nerf.formats.to_bat]: interoperability
  with ``MDAnalysis.analysis.bat.BAT``: a table that follows BAT's own tree,
  and converters between BAT's ``results.bat`` layout and
  ``(bonds, angles, dihedrals)`` with a [`Pose`][batched_nerf.Pose], so that
  every frame of ``results.bat`` becomes Cartesian coordinates in one
  [`to_cartesian`][batched_nerf.to_cartesian] call (equal to ``BAT.Cartesian``):

  ```python
  import MDAnalysis as mda
  from MDAnalysis.analysis.bat import BAT
  import batched_nerf as bn
  from batched_nerf.formats.mdanalysis import from_bat, table_from_bat, to_bat

  bat = BAT(u.select_atoms("resid 1-40")).run()
  bt = table_from_bat(bat)
  # (F, N) each, (F, 3, 3), (F, 3)
  ic, pose = from_bat(bat.results.bat, bt)
  xyz = bn.to_cartesian(*ic, bt.table, rotation=pose.rotation, translation=pose.translation)
  # == bat.results.bat
  values = to_bat(*bn.to_internal(xyz, bt.table, return_pose=True), bt)
  ```

BAT's layout, per frame, ``3 N`` values (radians, Angstrom): the root atom's
position ``x, y, z``; the orientation ``phi, theta, omega`` (the direction of
root atom 0 -> 1 in spherical coordinates, azimuth ``phi`` and polar angle
``theta``, and the turn ``omega`` of root atom 2 about that axis); the root's
internals ``r01, r12, a012``; then ``N - 3`` bonds, ``N - 3`` angles and
``N - 3`` torsions, in the order of BAT's torsion list, where a torsion about
the same central bond as an earlier one (its *primary* torsion) is stored as
its difference from that primary (an *improper* torsion), and every torsion is
wrapped to ``[-pi, pi)``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..core.convert import InternalCoordinates
from ..core.files import as_numpy, optional_import
from ..core.pose import Pose
from ..core.table import ConstructionTable
from ..topology.analysis import as_index_array
from ..topology.order import adopt_dihedrals

__all__ = [
    "AtomGroupTable",
    "BATTable",
    "frames",
    "from_bat",
    "table_from_atomgroup",
    "table_from_bat",
    "to_bat",
]


def _import_mda() -> Any:
    return optional_import("MDAnalysis", "MDAnalysis", extra="md")


def _atoms(obj: Any, name: str = "universe_or_atomgroup") -> Any:
    """The ``AtomGroup`` of a Universe or an AtomGroup; TypeError otherwise."""
    mda = _import_mda()
    if isinstance(obj, mda.Universe):
        return obj.atoms
    if isinstance(obj, mda.AtomGroup):
        return obj.atoms  # an UpdatingAtomGroup: the static group of its current selection
    raise TypeError(f"{name} must be an MDAnalysis Universe or AtomGroup, got {type(obj).__name__}")


def _universe_indices(indices: Any, total: int) -> np.ndarray:
    """``(N,)`` int64 universe atom indices from integers (a list, numpy, a tensor) or a table with
    ``.indices`` (``AtomGroupTable``, ``BATTable``); refuses non-integers, masks and out-of-range."""
    if not isinstance(indices, (Tensor, np.ndarray, list)) and type(indices) is not tuple:
        indices = getattr(indices, "indices", indices)  # a table's (a tensor's is a sparse method)
    if isinstance(indices, Tensor):
        indices = indices.detach().cpu().numpy()
    if np.asarray(indices).dtype == np.bool_:
        raise ValueError(
            "indices must be universe atom indices, got a boolean mask; select with "
            "np.flatnonzero(mask) (or an AtomGroup) instead"
        )
    idx = as_index_array(indices, "indices").reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= total):
        bad = idx[(idx < 0) | (idx >= total)][0]
        raise ValueError(f"indices must be universe atom indices in [0, {total - 1}], got {bad}")
    return idx


def _check_unique(atoms: Any) -> np.ndarray:
    idx = np.asarray(atoms.indices, dtype=np.int64)
    if idx.size == 0:
        raise ValueError("the AtomGroup is empty")
    uniq, counts = np.unique(idx, return_counts=True)
    if uniq.size != idx.size:
        twice = uniq[counts > 1][:5].tolist()
        raise ValueError(
            f"the AtomGroup holds atoms more than once (universe indices {twice}); "
            "a table needs each atom once: use ag.unique (which sorts) or drop the repeats"
        )
    return idx


def _positions(atoms: Any) -> np.ndarray | None:
    """Current positions ``(N, 3)`` float64, or None for a Universe without coordinates."""
    mda = _import_mda()
    try:
        return np.asarray(atoms.positions, dtype=np.float64)
    except mda.exceptions.NoDataError:
        return None


class AtomGroupTable(NamedTuple):
    """A [`ConstructionTable`][batched_nerf.ConstructionTable] of an ``AtomGroup`` and its atoms.

    Attributes:
        table: ``N`` rows; row ``i`` is atom ``ag[i]`` (the table keeps the
            AtomGroup's order, whatever order it builds in).
        indices: ``(N,)`` ``torch.long`` universe indices of the rows
            (``ag.indices``): ``u.atoms[indices]`` is the AtomGroup again, and
            [`frames`][batched_nerf.formats.frames] ``(u, indices=...)`` reads coordinates in row order.
        torsion_rows: ``(K,)`` ``torch.long``: the row whose dihedral is the
            ``k``-th requested torsion, ``-1`` where it could not be made one
            (see [`table_from_atomgroup`][batched_nerf.formats.table_from_atomgroup]); empty when none were
            requested.
    """

    table: ConstructionTable
    indices: Tensor
    torsion_rows: Tensor


def _torsion_quads(torsions: Any, position: np.ndarray) -> np.ndarray:
    """``(K, 4)`` AtomGroup positions of the requested torsions (AtomGroups of 4 atoms or index rows)."""
    mda = _import_mda()
    quads = []
    for k, quad in enumerate(torsions):
        if quad is None:
            quads.append((-1, -1, -1, -1))
            continue
        if isinstance(quad, mda.AtomGroup):
            if quad.n_atoms != 4:
                raise ValueError(f"torsions[{k}] has {quad.n_atoms} atoms, not 4")
            where = position[np.asarray(quad.indices, dtype=np.int64)]
            if (where < 0).any():
                raise ValueError(
                    f"torsions[{k}] has atoms outside the AtomGroup "
                    f"(universe indices {quad.indices.tolist()})"
                )
            quads.append(tuple(int(x) for x in where))
            continue
        row = as_numpy(quad, np.int64).reshape(-1)
        n = int((position >= 0).sum())
        if row.size != 4 or (row < 0).any() or (row >= n).any():
            raise ValueError(
                f"torsions[{k}] must be an AtomGroup of 4 atoms or 4 positions in the AtomGroup "
                f"(0..{n - 1}), got {quad!r}"
            )
        quads.append(tuple(int(x) for x in row))
    return np.asarray(quads, dtype=np.int64).reshape(-1, 4)


def table_from_atomgroup(
    ag: Any,
    *,
    root: Any = None,
    link_fragments: bool | None = None,
    torsions: Any = None,
) -> AtomGroupTable:
    r"""Construction table of an ``AtomGroup`` (or a Universe) from its bonds.

    Only bonds with both atoms in the group count, so any selection works:
    several molecules, a protein with its ligand, heavy atoms only (whose bonds
    to the removed hydrogens simply vanish; ``BAT`` refuses such selections,
    MDAnalysis issue #4566, and groups of more than one molecule). The rules
    are those of [`from_connectivity`][batched_nerf.ConstructionTable.from_connectivity]
    (bonded references, proper torsions, branches on a sibling); with the
    group's current coordinates, near-linear reference triples are avoided and
    the molecules are linked into one build (each further molecule's seed rows
    reference the nearest atoms already placed; ``link_fragments=False`` gives
    each molecule its own seed triple and pose instead).

    Args:
        ag: an ``MDAnalysis.AtomGroup`` or ``Universe``; each atom once. Its
            universe needs bonds (read from PSF, prmtop, TPR, mol2, PDB CONECT
            records, or guessed: ``u.guess_TopologyAttrs(to_guess=["bonds"])``).
        root: the atom placed at the origin: a position in ``ag`` (int) or an
            ``MDAnalysis`` ``Atom`` of ``ag`` (default: chosen automatically).
        link_fragments: link the molecules into one build (default: when the
            universe has coordinates), or not (``False``).
        torsions: optional sequence of torsions to be made the dihedral of one
            row each: ``AtomGroup``\ s of 4 atoms (e.g. ``residue.phi_selection()``;
            ``None`` entries are skipped) or 4 positions in ``ag``. A torsion
            ``p-q-s-t`` becomes row ``t`` (``(s, q, p)``) or row ``p``
            (``(q, s, t)``) when the table already builds that atom from that
            bond and angle and the build order allows it; otherwise ``-1``.

    Returns:
        [`AtomGroupTable`][batched_nerf.formats.AtomGroupTable] ``(table, indices, torsion_rows)``; row ``i``
        of
        the table is ``ag[i]``.

    Raises:
        ImportError: MDAnalysis is not installed.
        TypeError: ``ag`` is not a Universe or AtomGroup.
        ValueError: an empty group, an atom listed twice, a universe without
            bonds, a ``root`` outside the group, a malformed torsion, or the
            errors of ``from_connectivity`` (coincident atoms).

    Example:
        >>> import pytest, torch, batched_nerf as bn
        >>> mda = pytest.importorskip("MDAnalysis")  # optional: skips this example without it
        >>> data = pytest.importorskip("MDAnalysisTests.datafiles")
        >>> from batched_nerf.formats.mdanalysis import frames, table_from_atomgroup
        >>> u = mda.Universe(data.PSF, data.DCD)
        >>> heavy = u.select_atoms("resid 1-5 and not name H*")
        >>> agt = table_from_atomgroup(heavy)
        >>> xyz = frames(heavy, stop=4)                       # (4, 43, 3) float64, Angstrom
        >>> ic, pose = bn.to_internal(xyz, agt.table, return_pose=True)
        >>> back = bn.to_cartesian(*ic, agt.table, rotation=pose.rotation, translation=pose.translation)
        >>> tuple(xyz.shape), bool(torch.allclose(back, xyz, atol=1e-9))
        ((4, 43, 3), True)
    """
    mda = _import_mda()
    atoms = _atoms(ag, "ag")
    idx = _check_unique(atoms)
    n = idx.size
    try:
        pairs = np.asarray(atoms.bonds.indices, dtype=np.int64).reshape(-1, 2)
    except mda.exceptions.NoDataError:
        raise ValueError(
            "the AtomGroup's universe has no bonds: read a topology with bonds (PSF, prmtop, TPR, mol2, "
            'PDB with CONECT) or guess them first: u.guess_TopologyAttrs(to_guess=["bonds"]) '
            "(MDAnalysis >= 2.8; ag.guess_bonds() before)"
        ) from None
    position = np.full(atoms.universe.atoms.n_atoms, -1, dtype=np.int64)
    position[idx] = np.arange(n)
    pairs = position[pairs]
    pairs = pairs[(pairs >= 0).all(axis=1)]  # bonds to atoms outside the group vanish
    start = None
    if root is not None:
        if isinstance(root, mda.core.groups.Atom):
            if position[root.index] < 0:
                raise ValueError(f"root {root} is not in the AtomGroup")
            start = int(position[root.index])
        elif isinstance(root, (int, np.integer)) and not isinstance(root, bool) and 0 <= root < n:
            start = int(root)
        else:
            raise ValueError(f"root must be an Atom of the group or a position in [0, {n - 1}], got {root!r}")
    xyz = _positions(atoms)
    auto = ConstructionTable.from_connectivity(pairs, n, xyz=xyz, root=start, link_fragments=link_fragments)
    rows = torch.zeros(0, dtype=torch.long)
    table = auto
    if torsions is not None:
        refs = auto.refs.numpy().copy()
        rows = torch.from_numpy(adopt_dihedrals(refs, _torsion_quads(torsions, position)))
        table = ConstructionTable(refs)
    return AtomGroupTable(table, torch.from_numpy(idx.copy()), rows)


def frames(
    universe_or_atomgroup: Any,
    start: int | None = None,
    stop: int | None = None,
    step: int | None = None,
    *,
    indices: Any = None,
    dtype: torch.dtype = torch.float64,
    return_box: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The coordinates of a trajectory slice as one ``(F, N, 3)`` tensor (Angstrom).

    Reads frames ``start:stop:step`` of the universe's trajectory (Python slice
    semantics) and leaves the trajectory on the frame it was on.

    Args:
        universe_or_atomgroup: an ``MDAnalysis.Universe`` or ``AtomGroup``;
            atoms in its order (the row order of
            [`table_from_atomgroup`][batched_nerf.formats.table_from_atomgroup]
            and of a ``BAT`` table). An ``UpdatingAtomGroup`` is read as the
            atoms it holds now, in every frame.
        start: the slice of frames: its first frame.
        stop: the slice's end (exclusive).
        step: the slice's step.
        indices: optional ``(N,)`` integer universe atom indices giving the
            atoms and their order instead (a list, numpy array or tensor, e.g.
            ``AtomGroupTable.indices`` or ``BATTable.indices``, or the table).
        dtype: a floating torch dtype (MDAnalysis stores float32; float64 holds
            those values exactly).
        return_box: also return the unit cells, ``(F, 3, 3)`` box vectors in
            rows (``ts.triclinic_dimensions``, Angstrom).

    Returns:
        ``(F, N, 3)`` tensor, or ``(xyz, box)`` with ``return_box=True``.

    Raises:
        ImportError: MDAnalysis is not installed.
        TypeError: not a Universe or AtomGroup, or ``dtype`` not floating.
        ValueError: an empty slice, an empty or repeated atom selection,
            ``indices`` that are not integers (floats, a boolean mask) or out of
            range, or ``return_box=True`` for a frame without a box.

    Example:
        >>> import pytest
        >>> mda = pytest.importorskip("MDAnalysis")  # optional: skips this example without it
        >>> data = pytest.importorskip("MDAnalysisTests.datafiles")
        >>> from batched_nerf.formats.mdanalysis import frames
        >>> u = mda.Universe(data.PSF, data.DCD)
        >>> tuple(frames(u.select_atoms("name CA"), 0, 10, 2).shape)
        (5, 214, 3)
    """
    atoms = _atoms(universe_or_atomgroup)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch dtype, got {dtype!r}")
    if indices is not None:
        atoms = atoms.universe.atoms[_universe_indices(indices, atoms.universe.atoms.n_atoms)]
    _check_unique(atoms)
    traj = atoms.universe.trajectory
    current = traj.ts.frame
    xyz, boxes = [], []
    try:
        for ts in traj[start:stop:step]:
            xyz.append(np.array(atoms.positions, dtype=np.float64))
            if return_box:
                box = ts.triclinic_dimensions
                if box is None:
                    raise ValueError(f"frame {ts.frame} has no unit cell (return_box=True)")
                boxes.append(np.array(box, dtype=np.float64))
    finally:
        traj[current]
    if not xyz:
        raise ValueError(
            f"the slice start={start}, stop={stop}, step={step} holds no frame of {traj.n_frames}"
        )
    out = torch.from_numpy(np.stack(xyz)).to(dtype)
    if return_box:
        return out, torch.from_numpy(np.stack(boxes)).to(dtype)
    return out


# ----------------------------------------------------------------------------- BAT


class BATTable(NamedTuple):
    """The construction table of an ``MDAnalysis.analysis.bat.BAT`` analysis, and its layout.

    Row ``i`` is atom ``bat.atoms[i]``. The rows follow BAT's tree: root atom 0
    ``(-1, -1, -1)``, root atom 1 ``(root0, -1, -1)``, root atom 2
    ``(root1, root0, -1)`` (BAT's root is a terminal atom, its neighbour and a
    neighbour of that), and for each torsion ``(a0, a1, a2, a3)`` of BAT's list
    the row ``a0: (a1, a2, a3)``.

    Attributes:
        table: ``N`` rows.
        root: ``(3,)`` ``torch.long`` rows of BAT's three root atoms.
        torsions: ``(N - 3, 4)`` ``torch.long`` rows ``(a0, a1, a2, a3)`` of
            each torsion, in BAT's order (the order of ``results.bat``).
        primary: ``(N - 3,)`` ``torch.long``: for each torsion, the first
            torsion of the list with the same central atoms (itself for a
            primary torsion); the others are stored by BAT as differences.
        indices: ``(N,)`` ``torch.long`` universe indices of the rows.
    """

    table: ConstructionTable
    root: Tensor
    torsions: Tensor
    primary: Tensor
    indices: Tensor


def table_from_bat(bat: Any) -> BATTable:
    """The construction table that follows a ``BAT`` analysis's tree (see
    [`BATTable`][batched_nerf.formats.BATTable]).

    Reads what ``BAT.__init__`` set up (its root atoms ``_root``, torsion list
    ``_torsions`` and primary torsions, as positions in ``bat.atoms``); ``run``
    is not needed.

    Args:
        bat: an ``MDAnalysis.analysis.bat.BAT``.

    Returns:
        [`BATTable`][batched_nerf.formats.BATTable].

    Raises:
        ImportError: MDAnalysis is not installed.
        TypeError: ``bat`` is not a ``BAT``.
        ValueError: its root and torsions do not give every atom exactly one
            row (a BAT of another MDAnalysis version whose layout differs).

    Example:
        >>> import pytest, torch
        >>> mda = pytest.importorskip("MDAnalysis")  # optional: skips this example without it
        >>> data = pytest.importorskip("MDAnalysisTests.datafiles")
        >>> from MDAnalysis.analysis.bat import BAT
        >>> from batched_nerf.formats.mdanalysis import table_from_bat
        >>> u = mda.Universe(data.PRMpbc, data.TRJpbc_bz2)
        >>> bt = table_from_bat(BAT(u.select_atoms("not resname WAT")))
        >>> improper = bt.primary != torch.arange(len(bt.primary))      # stored as differences
        >>> bt.table.n_atoms, tuple(bt.torsions.shape), int(improper.sum())
        (22, (19, 4), 12)
    """
    _import_mda()
    bat_module = optional_import("MDAnalysis.analysis.bat", "MDAnalysis", extra="md")
    if not isinstance(bat, bat_module.BAT):
        raise TypeError(f"expected an MDAnalysis.analysis.bat.BAT, got {type(bat).__name__}")
    atoms = bat.atoms
    n = atoms.n_atoms
    root = np.asarray(bat._root_XYZ_inds, dtype=np.int64).reshape(-1)
    tors = np.asarray(bat._torsion_XYZ_inds, dtype=np.int64).reshape(-1, 4)
    primary = np.asarray(bat._primary_torsion_indices, dtype=np.int64).reshape(-1)
    placed = np.concatenate((root, tors[:, 0]))
    if root.size != 3 or primary.size != len(tors) or np.sort(placed).tolist() != list(range(n)):
        raise ValueError(
            f"the BAT's root ({root.size} atoms) and torsion list ({len(tors)} torsions) do not place "
            f"each of its {n} atoms exactly once"
        )
    refs = np.full((n, 3), -1, dtype=np.int64)
    refs[root[1], 0] = root[0]
    refs[root[2], :2] = (root[1], root[0])
    refs[tors[:, 0]] = tors[:, 1:]
    return BATTable(
        ConstructionTable(refs),
        torch.from_numpy(root),
        torch.from_numpy(tors),
        torch.from_numpy(primary),
        torch.tensor(np.asarray(atoms.indices, dtype=np.int64)),
    )


def _check_bat_table(bat_table: Any) -> BATTable:
    if not isinstance(bat_table, BATTable):
        raise TypeError(f"bat_table must be a BATTable (from table_from_bat), got {type(bat_table).__name__}")
    return bat_table


def _wrap(t: Tensor) -> Tensor:
    """Angles into ``(-pi, pi]`` (batched_nerf's range of dihedrals)."""
    return math.pi - torch.remainder(math.pi - t, 2 * math.pi)


def _wrap_bat(t: Tensor) -> Tensor:
    """Angles into ``[-pi, pi)``, as BAT writes them: ``((t + pi) % 2 pi) - pi``."""
    return torch.remainder(t + math.pi, 2 * math.pi) - math.pi


def _float_tensor(value: Any, name: str) -> Tensor:
    t = torch.as_tensor(value)
    if t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be real, got {t.dtype}")
    return t if t.is_floating_point() else t.to(torch.float64)


def _shift_index(bt: BATTable, device: torch.device) -> tuple[Tensor, Tensor]:
    """Primary index of each torsion, and whether it is a non-primary (stored as a difference)."""
    primary = bt.primary.to(device)
    return primary, primary != torch.arange(len(primary), device=device)


def from_bat(values: Any, bat_table: BATTable) -> tuple[InternalCoordinates, Pose]:
    r"""Internal coordinates and pose of each frame of BAT's ``results.bat`` layout.

    With ``bt = table_from_bat(bat)``, per frame (BAT layout in the module
    docstring; ``t_k`` the stored torsions, ``p(k)`` the primary of torsion
    ``k``):

    ```text
    dihedrals[a0_k] = wrap(t_k + t_p(k))   (improper: p(k) != k)   or   wrap(t_k)
    bonds[a0_k], angles[a0_k] = the k-th bond and angle
    bonds[root1] = r01,  bonds[root2] = r12,  angles[root2] = a012
    rotation = Rz(phi) Ry(theta) Rz(omega) P,   translation = (x, y, z)
    ```

    with ``wrap`` into ``(-pi, pi]`` and ``P`` the axis permutation that carries
    batched_nerf's seed frame (root 0 -> 1 along ``+x``, root 2 in the
    ``xy``-plane) onto BAT's (root 0 -> 1 along ``+z``, root 2 in the
    ``xz``-plane before the turn ``omega``): the columns of ``rotation`` are
    ``(e, Rz(phi) Ry(theta) (cos omega, sin omega, 0), ...)`` with ``e`` the
    direction of root 0 -> 1. Then
    ``to_cartesian(*ic, bt.table, rotation=pose.rotation, translation=pose.translation)``
    equals ``bat.Cartesian`` frame by frame. Differentiable (torch operations,
    no data-dependent branch).

    Args:
        values: ``(..., 3 N)`` BAT coordinates (numpy or torch; e.g.
            ``bat.results.bat`` ``(F, 3 N)``), radians and Angstrom.
        bat_table: the [`BATTable`][batched_nerf.formats.BATTable] of the same BAT.

    Returns:
        ``(ic, pose)``: [`InternalCoordinates`][batched_nerf.InternalCoordinates] ``(..., N)``
        each (entries the table does not use are ``0``) and
        [`Pose`][batched_nerf.Pose] ``(..., 3, 3)``, ``(..., 3)``; dtype of
        ``values`` (float64 for numpy float64 and for integers).

    Raises:
        TypeError: ``bat_table`` is not a [`BATTable`][batched_nerf.formats.BATTable], or complex or
            boolean values.
        ValueError: the last dimension of ``values`` is not ``3 N``.

    Example:
        >>> import pytest, torch, batched_nerf as bn
        >>> mda = pytest.importorskip("MDAnalysis")  # optional: skips this example without it
        >>> data = pytest.importorskip("MDAnalysisTests.datafiles")
        >>> from MDAnalysis.analysis.bat import BAT
        >>> from batched_nerf.formats.mdanalysis import from_bat, table_from_bat
        >>> u = mda.Universe(data.PRMpbc, data.TRJpbc_bz2)
        >>> bat = BAT(u.select_atoms("not resname WAT")).run(stop=3)
        >>> bt = table_from_bat(bat)
        >>> ic, pose = from_bat(bat.results.bat, bt)
        >>> xyz = bn.to_cartesian(*ic, bt.table, rotation=pose.rotation, translation=pose.translation)
        >>> bool(torch.allclose(xyz[2], torch.from_numpy(bat.Cartesian(bat.results.bat[2])), atol=1e-5))
        True
    """
    bt = _check_bat_table(bat_table)
    v = _float_tensor(values, "values")
    n = bt.table.n_atoms
    if v.ndim < 1 or v.shape[-1] != 3 * n:
        raise ValueError(
            f"values must have shape (..., {3 * n}) (3 N for the BAT's {n} atoms), got {tuple(v.shape)}"
        )
    dev = v.device
    m = n - 3
    origin = v[..., 0:3]
    phi, theta, omega = v[..., 3], v[..., 4], v[..., 5]
    tb, ta, tt = v[..., 9 : 9 + m], v[..., 9 + m : 9 + 2 * m], v[..., 9 + 2 * m :]
    primary, improper = _shift_index(bt, dev)
    tt = _wrap(tt + torch.where(improper, tt.index_select(-1, primary), torch.zeros_like(tt)))
    # each atom reads one slot of [0, r01, r12, bonds...] (resp. [0, a012, angles...], [0, torsions...])
    root, a0 = bt.root.to(dev), bt.torsions[:, 0].to(dev)
    zero = v.new_zeros(v.shape[:-1] + (1,))
    slot_b = torch.zeros(n, dtype=torch.long, device=dev)
    slot_b[root[1]], slot_b[root[2]] = 1, 2
    slot_b[a0] = torch.arange(3, 3 + m, device=dev)
    slot_a = torch.zeros(n, dtype=torch.long, device=dev)
    slot_a[root[2]] = 1
    slot_a[a0] = torch.arange(2, 2 + m, device=dev)
    slot_d = torch.zeros(n, dtype=torch.long, device=dev)
    slot_d[a0] = torch.arange(1, 1 + m, device=dev)
    bonds = torch.cat((zero, v[..., 6:8], tb), -1).index_select(-1, slot_b)
    angles = torch.cat((zero, v[..., 8:9], ta), -1).index_select(-1, slot_a)
    dihedrals = torch.cat((zero, tt), -1).index_select(-1, slot_d)
    cp, sp, ct, st = torch.cos(phi), torch.sin(phi), torch.cos(theta), torch.sin(theta)
    co, so = torch.cos(omega), torch.sin(omega)
    c0 = torch.stack((cp * ct, sp * ct, -st), -1)  # Rz(phi) Ry(theta) x
    c1 = torch.stack((-sp, cp, torch.zeros_like(cp)), -1)  # Rz(phi) Ry(theta) y
    c2 = torch.stack((cp * st, sp * st, ct), -1)  # Rz(phi) Ry(theta) z: the direction root 0 -> 1
    e2 = co.unsqueeze(-1) * c0 + so.unsqueeze(-1) * c1
    e3 = co.unsqueeze(-1) * c1 - so.unsqueeze(-1) * c0
    rotation = torch.stack((c2, e2, e3), -1)
    return InternalCoordinates(bonds, angles, dihedrals), Pose(rotation, origin)


def to_bat(internal: Any, pose: Any, bat_table: BATTable) -> Tensor:
    r"""BAT's ``results.bat`` layout from internal coordinates and a pose: the inverse of
    [`from_bat`][batched_nerf.formats.from_bat].

    With ``e = rotation[..., :, 0]`` (the direction root 0 -> 1) and
    ``f = rotation[..., :, 1]``:

    ```text
    phi = atan2(e_y, e_x),  theta = arccos(e_z),
    omega = atan2(f . (Rz(phi) Ry(theta) y), f . (Rz(phi) Ry(theta) x))
    t_k = wrap_bat(dihedrals[a0_k] - dihedrals[a0_p(k)])  (improper)   or   wrap_bat(dihedrals[a0_k])
    ```

    with ``wrap_bat(t) = ((t + pi) mod 2 pi) - pi`` in ``[-pi, pi)``, BAT's own
    wrapping. ``to_bat(*to_internal(xyz, bt.table, return_pose=True), bt)``
    equals BAT's ``run`` on the same coordinates (to rounding; BAT computes
    from float32 positions).

    Args:
        internal: ``(bonds, angles, dihedrals)``, each ``(..., N)`` (an
            [`InternalCoordinates`][batched_nerf.InternalCoordinates]), radians.
        pose: ``(rotation (..., 3, 3), translation (..., 3))`` (a
            [`Pose`][batched_nerf.Pose]).
        bat_table: the [`BATTable`][batched_nerf.formats.BATTable] of the BAT.

    Returns:
        ``(..., 3 N)`` tensor, the batch shapes broadcast, in the widest dtype
        of the inputs (float32 bonds with a float64 pose give float64).

    Raises:
        TypeError: ``bat_table`` is not a [`BATTable`][batched_nerf.formats.BATTable], or complex or
            boolean inputs.
        ValueError: shapes other than ``(..., N)``, ``(..., 3, 3)`` and
            ``(..., 3)``, or batch shapes that do not broadcast.

    Example:
        >>> import pytest, numpy as np, torch, batched_nerf as bn
        >>> mda = pytest.importorskip("MDAnalysis")  # optional: skips this example without it
        >>> data = pytest.importorskip("MDAnalysisTests.datafiles")
        >>> from MDAnalysis.analysis.bat import BAT
        >>> from batched_nerf.formats.mdanalysis import frames, table_from_bat, to_bat
        >>> u = mda.Universe(data.PRMpbc, data.TRJpbc_bz2)
        >>> bat = BAT(u.select_atoms("not resname WAT")).run(stop=3)
        >>> bt = table_from_bat(bat)
        >>> values = to_bat(*bn.to_internal(frames(bat.atoms, stop=3), bt.table, return_pose=True), bt)
        >>> # compared on the circle
        >>> gap = np.angle(np.exp(1j * (values.numpy() - bat.results.bat)))
        >>> bool(np.abs(gap).max() < 1e-6)
        True
    """
    bt = _check_bat_table(bat_table)
    try:
        b, a, d = internal
        rotation, translation = pose
    except (TypeError, ValueError):
        raise TypeError(
            "internal must be (bonds, angles, dihedrals) and pose (rotation, translation)"
        ) from None
    b, a, d = (_float_tensor(x, name) for x, name in ((b, "bonds"), (a, "angles"), (d, "dihedrals")))
    rot, tr = _float_tensor(rotation, "rotation"), _float_tensor(translation, "translation")
    n = bt.table.n_atoms
    for x, name in ((b, "bonds"), (a, "angles"), (d, "dihedrals")):
        if x.ndim < 1 or x.shape[-1] != n:
            raise ValueError(f"{name} must have shape (..., {n}), got {tuple(x.shape)}")
    if rot.ndim < 2 or tuple(rot.shape[-2:]) != (3, 3):
        raise ValueError(f"rotation must have shape (..., 3, 3), got {tuple(rot.shape)}")
    if tr.ndim < 1 or tr.shape[-1] != 3:
        raise ValueError(f"translation must have shape (..., 3), got {tuple(tr.shape)}")
    try:
        batch = torch.broadcast_shapes(
            b.shape[:-1], a.shape[:-1], d.shape[:-1], rot.shape[:-2], tr.shape[:-1]
        )
    except RuntimeError:
        raise ValueError(
            f"batch shapes do not broadcast: bonds {tuple(b.shape)}, angles {tuple(a.shape)}, dihedrals "
            f"{tuple(d.shape)}, rotation {tuple(rot.shape)}, translation {tuple(tr.shape)}"
        ) from None
    dev = b.device
    dtype = b.dtype
    for x in (a, d, rot, tr):
        dtype = torch.promote_types(dtype, x.dtype)  # cast up, never down
    b, a, d = (x.to(dtype).expand(*batch, n) for x in (b, a, d))
    rot, tr = rot.to(dtype).expand(*batch, 3, 3), tr.to(dtype).expand(*batch, 3)
    e, f = rot[..., :, 0], rot[..., :, 1]
    phi = torch.atan2(e[..., 1], e[..., 0])
    theta = torch.acos(e[..., 2].clamp(-1.0, 1.0))
    cp, sp, ct, st = torch.cos(phi), torch.sin(phi), torch.cos(theta), torch.sin(theta)
    fx = f[..., 0] * cp * ct + f[..., 1] * sp * ct - f[..., 2] * st
    fy = -f[..., 0] * sp + f[..., 1] * cp
    omega = torch.atan2(fy, fx)
    root, a0 = bt.root.to(dev), bt.torsions[:, 0].to(dev)
    tt = d.index_select(-1, a0)
    primary, improper = _shift_index(bt, dev)
    tt = _wrap_bat(tt - torch.where(improper, tt.index_select(-1, primary), torch.zeros_like(tt)))
    return torch.cat(
        (
            tr,
            torch.stack((phi, theta, omega), -1),
            b.index_select(-1, root[1:]),
            a.index_select(-1, root[2:]),
            b.index_select(-1, a0),
            a.index_select(-1, a0),
            tt,
        ),
        -1,
    )
