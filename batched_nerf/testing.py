"""Hypothesis strategies and assertions for property-testing code built on batched_nerf.

This module needs [hypothesis](https://hypothesis.readthedocs.io) (a test
dependency, ``pip install -e ".[test]"``); ``import batched_nerf`` does not
import it.

* [`construction_tables`][batched_nerf.testing.construction_tables] draws valid
[`ConstructionTable`][batched_nerf.ConstructionTable]
  objects: chains and branched trees, rows shuffled, several molecules, fixed
  (anchored) atoms;
* [`internal_coordinates`][batched_nerf.testing.internal_coordinates] and
[`fixed_positions`][batched_nerf.testing.fixed_positions] draw well-conditioned
  inputs for [`to_cartesian`][batched_nerf.to_cartesian] (values come from a seeded torch
  generator, so large batches stay fast; hypothesis shrinks the seed);
* [`rigid_motions`][batched_nerf.testing.rigid_motions] draws proper rotations and translations;
* [`assert_same_geometry`][batched_nerf.testing.assert_same_geometry] compares two conformations up to a rigid
motion of
  each molecule (distance matrix and chirality);
* [`reference_to_cartesian`][batched_nerf.testing.reference_to_cartesian] is a slow, sequential, float64
implementation
  for cross-checking;
* [`used_entries`][batched_nerf.testing.used_entries] tells which internal coordinates a table reads.

Example:
    >>> import torch, batched_nerf as bn
    >>> from hypothesis import given, settings, strategies as st
    >>> from batched_nerf.testing import construction_tables, internal_coordinates
    >>> @settings(max_examples=5, deadline=None)
    ... @given(st.data())
    ... def test_round_trip(data):
    ...     table = data.draw(construction_tables(max_atoms=12))
    ...     ic = data.draw(internal_coordinates(table, batch_shape=(3,)))
    ...     xyz = bn.to_cartesian(*ic, table)
    ...     assert xyz.shape == (3, table.n_atoms, 3)
    >>> test_round_trip()
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from hypothesis import strategies as st
from torch import Tensor

from .core.convert import InternalCoordinates
from .core.table import ConstructionTable

__all__ = [
    "assert_same_geometry",
    "construction_tables",
    "fixed_positions",
    "internal_coordinates",
    "reference_to_cartesian",
    "rigid_motions",
    "used_entries",
]

_SEEDS = st.integers(min_value=0, max_value=2**31 - 1)


# --------------------------------------------------------------------- tables
def _component_rows(
    draw: st.DrawFn, size: int, n_fixed: int, branched: bool
) -> tuple[list[list[int]], list[int]]:
    """Rows of one component in local indices (build order) and its fixed atoms.

    Every fully referenced atom ``i`` picks a bond reference ``b`` among earlier
    atoms and takes ``(a, d)`` from a pair ``P(b)`` such that the angle
    ``b-a-d`` is itself a drawn angle or a triangle angle of drawn values, so
    its references are never close to collinear for well-conditioned inputs.
    """
    rows: list[list[int]] = []
    pair: dict[int, tuple[int, int]] = {}
    children: dict[int, list[int]] = {}
    if n_fixed:
        rows = [[-1, -1, -1] for _ in range(n_fixed)]
        fixed = list(range(n_fixed))
        if n_fixed >= 3:
            pair[0] = (1, 2)
            pair[1] = (0, 2)
            for j in range(2, n_fixed):
                pair[j] = (j - 1, j - 2)
    else:
        fixed = []
        rows.append([-1, -1, -1])
        if size >= 2:
            rows.append([0, -1, -1])
        if size >= 3:
            rows.append(draw(st.sampled_from([[0, 1, -1], [1, 0, -1]])))
            b3, a3 = rows[2][0], rows[2][1]
            pair[2] = (b3, a3)
            pair[0] = (1, 2)
            pair[1] = (0, 2)
    for i in range(len(rows), size):
        if branched:
            b = draw(st.integers(0, i - 1))
        else:
            b = i - 1
        a, d = pair[b]
        siblings = [c for c in children.get(b, []) if rows[c][1] == a]
        if siblings and draw(st.booleans()):
            # improper-style reference: dihedral to an earlier sibling on b
            d = draw(st.sampled_from(siblings))
        rows.append([b, a, d])
        pair[i] = (b, a)
        children.setdefault(b, []).append(i)
    return rows, fixed


@st.composite
def construction_tables(
    draw: st.DrawFn,
    min_atoms: int = 1,
    max_atoms: int = 24,
    shuffle: bool = True,
    max_components: int = 3,
    fixed: bool | None = False,
    branched: bool | None = None,
) -> ConstructionTable:
    """Strategy for valid construction tables.

    Each component (molecule) is a chain or a branched tree whose references are
    chosen so that the geometry built from [`internal_coordinates`][batched_nerf.testing.internal_coordinates]
    is well
    conditioned (no nearly collinear reference triples). Components of one and
    two atoms occur.

    Args:
        min_atoms: smallest total number of atoms (at least 1).
        max_atoms: largest total number of atoms.
        shuffle: permute the rows (and references) at random, so the build
            order differs from the row order.
        max_components: largest number of components.
        fixed: ``False`` for no fixed atoms, ``True`` to always include at least
            one anchored component (three or more fixed atoms, or a lone fixed
            atom), ``None`` to decide at random. ``table.fixed`` lists the fixed
            atoms so that [`fixed_positions`][batched_nerf.testing.fixed_positions] builds a well-conditioned
            anchor.
        branched: ``True`` for trees, ``False`` for chains, ``None`` for either.

    Returns:
        A strategy drawing [`ConstructionTable`][batched_nerf.ConstructionTable] objects.

    Example:
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=5, deadline=None)
        ... @given(construction_tables(min_atoms=3, max_atoms=8, fixed=True))
        ... def check(table):
        ...     assert 3 <= table.n_atoms <= 8 and table.n_fixed >= 1
        >>> check()
    """
    if min_atoms < 1 or max_atoms < min_atoms:
        raise ValueError(f"need 1 <= min_atoms <= max_atoms, got {min_atoms}, {max_atoms}")
    want_fixed = draw(st.booleans()) if fixed is None else fixed
    if want_fixed and max_atoms < 1:
        raise ValueError("fixed=True needs max_atoms >= 1")
    total = draw(st.integers(min_atoms, max_atoms))
    n_comp = draw(st.integers(1, max(1, min(max_components, total))))
    # split `total` into n_comp positive sizes
    cuts = (
        sorted(
            draw(st.lists(st.integers(1, total - 1), min_size=n_comp - 1, max_size=n_comp - 1, unique=True))
        )
        if n_comp > 1
        else []
    )
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
    refs: list[list[int]] = []
    fixed_atoms: list[int] = []
    anchored_done = False
    for k, size in enumerate(sizes):
        n_fixed = 0
        if want_fixed and (not anchored_done or draw(st.booleans())):
            if size == 1 or size >= 3:
                n_fixed = 1 if size == 1 else draw(st.integers(3, min(size, 4)))
            elif k == len(sizes) - 1 and not anchored_done:
                n_fixed = 1  # a two-atom component cannot be anchored: make its first atom lone-fixed
                rows, _ = _component_rows(draw, 1, 1, False)
                offset = len(refs)
                refs.extend(rows)
                fixed_atoms.append(offset)
                rows, _ = _component_rows(draw, 1, 0, False)
                refs.extend(rows)
                anchored_done = True
                continue
        is_branched = draw(st.booleans()) if branched is None else branched
        rows, local_fixed = _component_rows(draw, size, n_fixed, is_branched)
        offset = len(refs)
        refs.extend([[r + offset if r >= 0 else -1 for r in row] for row in rows])
        fixed_atoms.extend(f + offset for f in local_fixed)
        anchored_done = anchored_done or bool(local_fixed)
    arr = np.asarray(refs, dtype=np.int64).reshape(-1, 3)
    fixed_arr = np.asarray(fixed_atoms, dtype=np.int64)
    if shuffle and len(arr) > 1:
        perm = np.asarray(draw(st.permutations(range(len(arr)))), dtype=np.int64)
        new = np.empty_like(arr)
        new[perm] = np.where(arr >= 0, perm[np.clip(arr, 0, None)], -1)
        arr = new
        fixed_arr = perm[fixed_arr]
    return ConstructionTable(arr, fixed=fixed_arr if want_fixed else None)


# ----------------------------------------------------------------- coordinates
def _generator(seed: int, device: torch.device | str | None) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def _uniform(g: torch.Generator, shape: Sequence[int], low: float, high: float, dtype: torch.dtype) -> Tensor:
    return low + (high - low) * torch.rand(tuple(shape), generator=g, dtype=torch.float64).to(dtype)


@st.composite
def internal_coordinates(
    draw: st.DrawFn,
    table: ConstructionTable,
    batch_shape: Sequence[int] = (),
    dtype: torch.dtype = torch.float64,
    angle_margin: float = 0.3,
    bond_range: tuple[float, float] = (0.8, 2.0),
    device: torch.device | str | None = None,
) -> InternalCoordinates:
    """Strategy for random internal coordinates of ``table``.

    Bonds are uniform in ``bond_range``, angles in
    ``[angle_margin, pi - angle_margin]`` and dihedrals in ``[-pi, pi)``, in
    radians. Entries the table does not use are random too (they must be
    ignored). Values come from a torch generator seeded by a drawn integer.

    Args:
        table: the construction table.
        batch_shape: leading shape of the tensors.
        dtype: floating dtype of the tensors.
        angle_margin: distance of the angles from ``0`` and ``pi``.
        bond_range: ``(low, high)`` of the bond lengths.
        device: device of the tensors (default CPU).

    Returns:
        A strategy drawing [`InternalCoordinates`][batched_nerf.InternalCoordinates], each
        tensor ``(*batch_shape, N)``.

    Example:
        >>> import batched_nerf as bn
        >>> from hypothesis import given, settings
        >>> table = bn.ConstructionTable.chain(5)
        >>> @settings(max_examples=3, deadline=None)
        ... @given(internal_coordinates(table, batch_shape=(2,)))
        ... def check(ic):
        ...     assert ic.bonds.shape == (2, 5) and float(ic.angles.min()) >= 0.3
        >>> check()
    """
    seed = draw(_SEEDS)
    g = _generator(seed, device)
    shape = (*batch_shape, table.n_atoms)
    bonds = _uniform(g, shape, bond_range[0], bond_range[1], dtype)
    angles = _uniform(g, shape, angle_margin, math.pi - angle_margin, dtype)
    dihedrals = _uniform(g, shape, -math.pi, math.pi, dtype)
    return InternalCoordinates(
        *(t.to(device) if device is not None else t for t in (bonds, angles, dihedrals))
    )


@st.composite
def fixed_positions(
    draw: st.DrawFn,
    table: ConstructionTable,
    batch_shape: Sequence[int] = (),
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Tensor | None:
    """Strategy for ``fixed_xyz`` of ``table``: ``(*batch_shape, F, 3)``, or None if ``F == 0``.

    The fixed atoms, in ``table.fixed`` order, are placed as one chain with
    bonds in ``[1, 1.5]`` and angles in ``[0.5, pi - 0.5]``, then moved by a
    random rigid motion, so consecutive fixed atoms are never close to
    collinear (the anchors [`construction_tables`][batched_nerf.testing.construction_tables] makes rely on
    that).

    Args:
        table: the construction table.
        batch_shape: leading shape.
        dtype: floating dtype.
        device: device (default CPU).

    Returns:
        A strategy drawing a tensor, or ``None`` for tables without fixed atoms.

    Example:
        >>> import batched_nerf as bn
        >>> from hypothesis import given, settings
        >>> table = bn.ConstructionTable([[-1, -1, -1]] * 3, fixed=[0, 1, 2])
        >>> @settings(max_examples=3, deadline=None)
        ... @given(fixed_positions(table, batch_shape=(4,)))
        ... def check(xyz):
        ...     assert xyz.shape == (4, 3, 3)
        >>> check()
    """
    f = table.n_fixed
    if f == 0:
        return None
    seed = draw(_SEEDS)
    g = _generator(seed, device)
    shape = (*batch_shape, f)
    bonds = _uniform(g, shape, 1.0, 1.5, torch.float64)
    angles = _uniform(g, shape, 0.5, math.pi - 0.5, torch.float64)
    dihedrals = _uniform(g, shape, -math.pi, math.pi, torch.float64)
    chain = ConstructionTable.chain(f)
    from .core.convert import to_cartesian

    xyz = to_cartesian(bonds, angles, dihedrals, chain, method="levels")
    rot, shift = _rigid(g, tuple(batch_shape), torch.float64)
    xyz = xyz @ rot.transpose(-1, -2) + shift.unsqueeze(-2)
    return xyz.to(dtype=dtype, device=device)


def _rigid(g: torch.Generator, batch_shape: tuple[int, ...], dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    m = torch.randn((*batch_shape, 3, 3), generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(m)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    det = torch.linalg.det(q)
    q = torch.cat((q[..., :, :2], q[..., :, 2:] * det[..., None, None]), dim=-1)
    t = 3.0 * torch.randn((*batch_shape, 3), generator=g, dtype=torch.float64)
    return q.to(dtype), t.to(dtype)


@st.composite
def rigid_motions(
    draw: st.DrawFn,
    batch_shape: Sequence[int] = (),
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Strategy for proper rigid motions ``(R, t)``: apply as ``x @ R.mT + t[..., None, :]``.

    Args:
        batch_shape: leading shape of ``R`` ``(*batch_shape, 3, 3)`` and ``t``
            ``(*batch_shape, 3)``.
        dtype: floating dtype.
        device: device (default CPU).

    Returns:
        A strategy drawing ``(R, t)`` with ``R`` orthogonal, ``det(R) = +1``.

    Example:
        >>> import torch
        >>> from hypothesis import given, settings
        >>> @settings(max_examples=3, deadline=None)
        ... @given(rigid_motions())
        ... def check(motion):
        ...     rot, t = motion
        ...     assert abs(float(torch.linalg.det(rot)) - 1) < 1e-12
        >>> check()
    """
    seed = draw(_SEEDS)
    rot, shift = _rigid(_generator(seed, device), tuple(batch_shape), dtype)
    return rot.to(device) if device is not None else rot, shift.to(device) if device is not None else shift


# ------------------------------------------------------------------ assertions
def _kabsch_rmsd_max(x: np.ndarray, y: np.ndarray) -> float:
    """Largest deviation after the best proper rotation + translation of ``y`` onto ``x``."""
    cx, cy = x.mean(0), y.mean(0)
    h = (y - cy).T @ (x - cx)
    u, _, vt = np.linalg.svd(h)
    s = np.eye(3)
    s[2, 2] = np.sign(np.linalg.det(vt.T @ u.T)) or 1.0
    rot = vt.T @ s @ u.T
    aligned = (y - cy) @ rot.T + cx
    return float(np.abs(aligned - x).max())


def assert_same_geometry(
    x: Tensor | np.ndarray,
    y: Tensor | np.ndarray,
    atol: float = 1e-6,
    components: Tensor | np.ndarray | None = None,
) -> None:
    """Assert that ``x`` and ``y`` are the same conformations up to proper rigid motions.

    Per conformation (leading dims) and per group of ``components``, checks that
    the distance matrices agree within ``atol`` and that the best proper
    rotation plus translation (Kabsch, ``det = +1``, so mirror images fail)
    maps ``y`` onto ``x`` within ``atol``.

    Args:
        x: ``(..., N, 3)`` coordinates.
        y: ``(..., N, 3)`` coordinates (broadcastable with ``x``).
        atol: absolute tolerance, in the length unit.
        components: ``(N,)`` integer group of each atom (e.g.
            ``table.components``); each group may move on its own. Default: one
            rigid body.

    Raises:
        AssertionError: with the worst deviation.

    Example:
        >>> import torch
        >>> x = torch.randn(5, 3, dtype=torch.float64)
        >>> c, s = 0.6, 0.8
        >>> rot = torch.tensor([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=torch.float64)
        >>> assert_same_geometry(x, x @ rot.T + 1.0, atol=1e-9)
        >>> try:
        ...     assert_same_geometry(x, -x, atol=1e-9)  # mirror image
        ... except AssertionError:
        ...     print("mirror")
        mirror
    """
    xa = np.asarray(x.detach().cpu().double() if isinstance(x, Tensor) else x, dtype=np.float64)
    ya = np.asarray(y.detach().cpu().double() if isinstance(y, Tensor) else y, dtype=np.float64)
    xa, ya = np.broadcast_arrays(xa, ya)
    if xa.ndim < 2 or xa.shape[-1] != 3:
        raise ValueError(f"expected (..., N, 3) coordinates, got {xa.shape}")
    n = xa.shape[-2]
    groups = (
        np.zeros(n, dtype=np.int64)
        if components is None
        else np.asarray(components.cpu() if isinstance(components, Tensor) else components)
    )
    xf = xa.reshape(-1, n, 3)
    yf = ya.reshape(-1, n, 3)
    dx = np.linalg.norm(xf[:, :, None] - xf[:, None], axis=-1)
    dy = np.linalg.norm(yf[:, :, None] - yf[:, None], axis=-1)
    same = groups[:, None] == groups[None, :]
    dist_err = float(np.abs(dx - dy)[:, same].max()) if n else 0.0
    if dist_err > atol:
        raise AssertionError(f"distance matrices differ by {dist_err:.3g} > atol={atol:.3g}")
    worst = 0.0
    for k in range(xf.shape[0]):
        for gid in np.unique(groups):
            idx = np.flatnonzero(groups == gid)
            worst = max(worst, _kabsch_rmsd_max(xf[k, idx], yf[k, idx]))
    if worst > atol:
        raise AssertionError(
            f"no proper rigid motion maps y onto x: worst deviation {worst:.3g} > atol={atol:.3g} "
            "(mirror image or different shape)"
        )


# ------------------------------------------------------------------- reference
def used_entries(table: ConstructionTable) -> tuple[Tensor, Tensor, Tensor]:
    """Masks of the internal coordinates that ``table`` uses.

    Args:
        table: the construction table.

    Returns:
        ``(bonds, angles, dihedrals)`` boolean masks ``(N,)``: an entry is used
        when the row has the corresponding reference.

    Example:
        >>> import batched_nerf as bn
        >>> used_entries(bn.ConstructionTable.chain(3))[1].tolist()
        [False, False, True]
    """
    refs = table.refs
    return refs[:, 0] >= 0, refs[:, 1] >= 0, refs[:, 2] >= 0


def reference_to_cartesian(
    bonds: Tensor,
    angles: Tensor,
    dihedrals: Tensor,
    table: ConstructionTable,
    fixed_xyz: Tensor | None = None,
) -> Tensor:
    """Slow sequential float64 reference for [`to_cartesian`][batched_nerf.to_cartesian].

    Places one atom at a time in a topological order, with the textbook NeRF
    frame, in float64 numpy; only for small inputs in tests. Angles in radians.

    Args:
        bonds: ``(..., N)`` bond lengths.
        angles: ``(..., N)`` bond angles (same shape).
        dihedrals: ``(..., N)`` dihedrals (same shape).
        table: the construction table.
        fixed_xyz: ``(..., F, 3)`` when the table has fixed atoms.

    Returns:
        ``(..., N, 3)`` float64 CPU tensor.

    Example:
        >>> import torch, batched_nerf as bn
        >>> table = bn.ConstructionTable.chain(3)
        >>> f64 = torch.float64
        >>> ic = torch.ones(3, dtype=f64), torch.full((3,), torch.pi / 2, dtype=f64), torch.zeros(3)
        >>> reference_to_cartesian(*ic, table).round(decimals=12).tolist()
        [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    """
    topo = table.topology
    refs = topo.refs
    fixed = topo.fixed.tolist()
    b, a, d = (
        np.asarray(t.detach().cpu().double() if isinstance(t, Tensor) else t)
        for t in (bonds, angles, dihedrals)
    )
    lead = b.shape[:-1]
    n = refs.shape[0]
    fx = None
    if fixed:
        if fixed_xyz is None:
            raise ValueError("the table has fixed atoms: pass fixed_xyz")
        fx = np.broadcast_to(np.asarray(fixed_xyz.detach().cpu().double()), (*lead, len(fixed), 3)).reshape(
            -1, len(fixed), 3
        )
    b, a, d = (v.reshape(-1, n) for v in (b, a, d))
    order = topo.order.tolist()
    out = np.zeros((b.shape[0], n, 3))
    for k in range(b.shape[0]):
        x = out[k]
        for j, f in enumerate(fixed):
            x[f] = fx[k, j]  # type: ignore[index]
        for i in order:
            if i in fixed:
                continue
            rb, ra, rd = refs[i].tolist()
            if rb < 0:
                x[i] = 0.0
            elif ra < 0:
                x[i] = (b[k, i], 0.0, 0.0)
            elif rd < 0:
                sign = 1.0 if x[ra, 0] > x[rb, 0] else -1.0
                x[i] = x[rb] + b[k, i] * np.array([sign * np.cos(a[k, i]), np.sin(a[k, i]), 0.0])
            else:
                e1 = x[rb] - x[ra]
                e1 /= np.linalg.norm(e1)
                e3 = np.cross(x[ra] - x[rd], e1)
                e3 /= np.linalg.norm(e3)
                e2 = np.cross(e3, e1)
                t, p = a[k, i], d[k, i]
                x[i] = x[rb] + b[k, i] * (
                    -np.cos(t) * e1 + np.sin(t) * np.cos(p) * e2 + np.sin(t) * np.sin(p) * e3
                )
    return torch.from_numpy(out.reshape(*lead, n, 3))
