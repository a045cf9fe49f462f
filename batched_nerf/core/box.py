r"""Periodic boxes: minimum images, whole molecules, wrapping, and the check of the bound.

A periodic box is given either as MDAnalysis's ``[a, b, c, alpha, beta, gamma]``
(``(..., 6)``: lengths in the unit of the coordinates, angles in degrees) or as
the matrix ``H`` of its box vectors in rows (``(..., 3, 3)``, the mdtraj / OpenMM
convention); [`box_vectors`][batched_nerf.box_vectors] turns the first into the second (MDAnalysis's
``triclinic_vectors``: ``a`` along ``x``, ``b`` in the ``xy``-plane). A point
``x`` has fractional coordinates ``s = x H^{-1}``; its images are
``x + n H`` for integer row vectors ``n``.

Minimum image ([`minimum_image`][batched_nerf.minimum_image]). A vector ``v`` is first reduced in
fractional coordinates, ``v0 = (s - round(s)) H``, then the shortest of the 27
images ``v0 + o H``, ``o`` in ``{-1, 0, 1}^3``, is taken (``o = 0`` on ties). With
``w = min_k |det H| / |h_l x h_m|`` the smallest perpendicular width of the box,
a vector shorter than ``w / 2`` is returned exactly: its fractional coordinates
lie in ``(-1/2, 1/2)``, so the reduction alone recovers it, and every other
image is longer than ``w / 2``. Longer vectors cannot be told from their images
(the result is the shortest image the search finds; for boxes in GROMACS's
reduced form that is the shortest image). The image shift ``n`` is piecewise
constant in the inputs: its derivative is zero, so the minimum image ``v + n H``
has derivative ``1`` in ``v`` and ``n`` in ``H`` (exact away from the faces
where ``n`` jumps).

Whole molecules ([`unwrap`][batched_nerf.unwrap]). Along a spanning tree of the table's reference
graph, every atom is placed at its parent's whole position plus the minimum
image of ``x_i - x_parent``; the tree is the bond-reference forest (``bond_ref``
of each row), joined across the fixed atoms of an anchored component by angle
and dihedral references. The sum over each atom's path is an integer image shift
``N_i``, accumulated by pointer jumping (``ceil(log2 depth)`` gathers of
``(..., N, 3)``, levels precomputed once per table), so the whole coordinates
are ``x_i + N_i H``: as differentiable as ``x`` and ``H`` themselves. Every
reference vector of the table (``x_i - x_b``, ``x_a - x_b``, ``x_a - x_d``) then
comes out right whenever each tree edge and each reference vector of the whole
molecule is shorter than ``w / 2`` ([`check_box`][batched_nerf.check_box] checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from ..topology.analysis import FULL, SECOND, THIRD, Topology, short
from .checks import DEG, as_box, as_float, check_table, check_xyz
from .table import ConstructionTable, _static_tensors

__all__ = ["Center", "box_vectors", "check_box", "minimum_image", "unwrap", "wrap"]

Center = Literal["atom", "first", "centroid"]
_CENTERS = ("atom", "first", "centroid")

#: The 27 neighbour offsets of the minimum-image search, ``(0, 0, 0)`` first (it wins ties).
_OFFSETS = np.array(
    [(p // 9 - 1, p // 3 % 3 - 1, p % 3 - 1) for p in ((j + 13) % 27 for j in range(27))], dtype=np.float64
)


# --------------------------------------------------------------------- box matrices
def _cos_deg(angle: Tensor) -> Tensor:
    """``cos`` of an angle in degrees, exactly ``0`` at ``90`` (with the right derivative there)."""
    return torch.sin((90.0 - angle) * DEG)


def _matrix(box: Tensor) -> Tensor:
    """``(..., 3, 3)`` box vectors in rows of a checked box of either format (NaN for impossible boxes)."""
    if box.shape[-1] != 6:
        return box
    a, b, c, alpha, beta, gamma = box.unbind(-1)
    ca, cb, cg = _cos_deg(alpha), _cos_deg(beta), _cos_deg(gamma)
    sg = torch.cos((90.0 - gamma) * DEG)
    cx = c * cb
    cy = c * (ca - cb * cg) / sg
    cz2 = c * c - cx * cx - cy * cy
    ok = (a > 0) & (b > 0) & (c > 0) & (cz2 > 0)
    for angle in (alpha, beta, gamma):
        ok = ok & (angle > 0) & (angle < 180)
    cz = torch.sqrt(torch.where(ok, cz2, torch.ones_like(cz2)))
    zero = torch.zeros_like(a)
    rows = torch.stack(
        [
            torch.stack([a, zero, zero], -1),
            torch.stack([b * cg, b * sg, zero], -1),
            torch.stack([cx, cy, cz], -1),
        ],
        -2,
    )
    return torch.where(ok[..., None, None], rows, torch.full_like(rows, math.nan))


def _reciprocal(h: Tensor) -> tuple[Tensor, Tensor]:
    """``(H^{-1}, det H)`` from cross products (NaN for a singular box; no solver, vmap-safe)."""
    a, b, c = h.unbind(-2)
    r = torch.stack([torch.linalg.cross(b, c), torch.linalg.cross(c, a), torch.linalg.cross(a, b)], -2)
    det = (a * r[..., 0, :]).sum(-1)
    safe = torch.where(det != 0, det, torch.full_like(det, math.nan))
    return r.transpose(-1, -2) / safe[..., None, None], det


def _widths(h: Tensor) -> Tensor:
    """``(..., 3)`` perpendicular widths ``|det H| / |h_l x h_m|`` of the box."""
    a, b, c = h.unbind(-2)
    det = (a * torch.linalg.cross(b, c)).sum(-1).abs()
    areas = torch.stack(
        [
            torch.linalg.cross(b, c).norm(dim=-1),
            torch.linalg.cross(c, a).norm(dim=-1),
            torch.linalg.cross(a, b).norm(dim=-1),
        ],
        -1,
    )
    return det[..., None] / areas


def box_vectors(box: Any) -> Tensor:
    r"""The box vectors in rows, ``H = (h_a, h_b, h_c)``, of a periodic box given in either format.

    From ``[a, b, c, alpha, beta, gamma]`` (MDAnalysis ``Timestep.dimensions``;
    ``alpha`` between ``b`` and ``c``, ``beta`` between ``a`` and ``c``,
    ``gamma`` between ``a`` and ``b``, degrees):

    ```text
    h_a = (a, 0, 0)
    h_b = (b cos(gamma), b sin(gamma), 0)
    h_c = (c_x, c_y, sqrt(c^2 - c_x^2 - c_y^2)),  c_x = c cos(beta),
          c_y = c (cos(alpha) - cos(beta) cos(gamma)) / sin(gamma)
    ```

    with ``cos(90) = 0`` exactly (MDAnalysis's ``triclinic_vectors``). A matrix
    ``(..., 3, 3)`` comes back as it is. Differentiable in the lengths and angles.

    Args:
        box: ``(..., 6)`` lengths (any unit) and angles (degrees), or ``(..., 3, 3)``.

    Returns:
        ``(..., 3, 3)`` box vectors in rows, in the box's unit; NaN for a box
        with a length ``<= 0``, an angle outside ``(0, 180)`` or angles that
        close no cell (MDAnalysis's all-zero "no box" included).

    Raises:
        TypeError: a complex or boolean box.
        ValueError: a shape other than ``(..., 6)`` or ``(..., 3, 3)``.

    Example:
        >>> import batched_nerf as bn
        >>> bn.box_vectors([10.0, 10.0, 10.0, 60.0, 60.0, 90.0])  # rhombic dodecahedron
        tensor([[10.0000,  0.0000,  0.0000],
                [ 0.0000, 10.0000,  0.0000],
                [ 5.0000,  5.0000,  7.0711]])
    """
    b = as_float(box, "box")
    return _matrix(as_box(b, b.new_zeros(1, 3)))


# ------------------------------------------------------------------- minimum image
def _image_shift(v: Tensor, h: Tensor, hinv: Tensor) -> Tensor:
    """Integer-valued ``n`` ``(..., M, 3)`` with ``v + n H`` the minimum image (detached inputs)."""
    s = v @ hinv
    n = -torch.round(s)
    offsets = torch.as_tensor(_OFFSETS, dtype=v.dtype, device=v.device)
    # with r = (s + n) H and G = H H^T: |r + o H|^2 - |r|^2 = 2 ((s + n) G) . o + o G o^T
    gram = h @ h.transpose(-1, -2)
    const = ((offsets @ gram) * offsets).sum(-1)  # (..., 27)
    score = (
        torch.addmm(const, ((s + n) @ gram).reshape(-1, 3), offsets.T, alpha=2.0)
        if gram.ndim == 2
        else (2.0 * ((s + n) @ gram) @ offsets.T + const.unsqueeze(-2))
    )
    return n + offsets.index_select(0, score.argmin(-1).reshape(-1)).reshape(n.shape)


def minimum_image(vectors: Any, box: Any) -> Tensor:
    r"""The minimum image ``v + n H`` of each vector in a periodic box.

    ``n = -round(v H^{-1}) + o``, ``o`` the shortest of the 27 neighbouring
    images (see the module notes: exact for vectors shorter than half the
    smallest perpendicular box width). ``n`` is piecewise constant, so the
    result has derivative ``1`` in ``v`` and ``n`` in ``H``; works under
    ``torch.func`` (no data-dependent branch).

    Args:
        vectors: ``(..., M, 3)`` difference vectors (the unit of the box).
        box: ``(..., 6)`` or ``(..., 3, 3)`` (see [`box_vectors`][batched_nerf.box_vectors]), per frame
            (leading dimensions broadcasting against those of ``vectors``) or shared.

    Returns:
        ``(..., M, 3)`` with the broadcast leading shape; NaN for an impossible box.

    Raises:
        TypeError: a complex or boolean value, or a box of a higher precision
            than ``vectors``.
        ValueError: ``vectors`` not ``(..., M, 3)``, a box of another shape or
            device, or leading dimensions that do not broadcast.

    Example:
        >>> import batched_nerf as bn
        >>> bn.minimum_image([[9.0, 1.0, -6.0]], [10.0, 10.0, 10.0, 90.0, 90.0, 90.0])
        tensor([[-1.,  1.,  4.]])
    """
    v = as_float(vectors, "vectors")
    if v.ndim < 2 or v.shape[-1] != 3:
        raise ValueError(f"vectors must have shape (..., M, 3), got {tuple(v.shape)}")
    return nearest_image(v, *cell(as_box(box, v)))


def cell(box: Tensor) -> tuple[Tensor, Tensor]:
    """``(H, H^{-1})`` of a checked box (``H^{-1}`` of the detached ``H``), made once for many vectors."""
    h = _matrix(box)
    hinv, _ = _reciprocal(h.detach())
    return h, hinv


def nearest_image(v: Tensor, h: Tensor, hinv: Tensor) -> Tensor:
    """[`minimum_image`][batched_nerf.minimum_image] of ``(..., M, 3)`` vectors with the box from ``cell``."""
    return v + _image_shift(v.detach(), h.detach(), hinv) @ h


# ------------------------------------------------------------------ whole molecules
@dataclass(frozen=True)
class _Tree:
    """Static spanning tree of a table for making its molecules whole (numpy, once per table)."""

    parent: np.ndarray  # (N,) parent atom in the spanning tree, roots point at themselves
    jumps: tuple[np.ndarray, ...]  # pointer-jumping parents: parent, parent[parent], ... (not yet at roots)
    rows: np.ndarray  # (E,) row of each reference vector x_u - x_v
    u: np.ndarray  # (E,)
    v: np.ndarray  # (E,)


def _tree(topo: Topology) -> _Tree:
    refs, kind, n = topo.refs, topo.kind, topo.n_atoms
    atoms = np.arange(n, dtype=np.int64)
    parent = np.where(refs[:, 0] >= 0, refs[:, 0], atoms)
    # reference vectors of every row: x_i - x_b, x_a - x_b, x_a - x_d
    sel = [kind >= SECOND, kind >= THIRD, kind == FULL]
    rows = np.concatenate([atoms[m] for m in sel])
    u = np.concatenate([atoms[sel[0]], refs[sel[1], 1], refs[sel[2], 1]])
    v = np.concatenate([refs[sel[0], 0], refs[sel[1], 0], refs[sel[2], 2]])
    root = parent.copy()
    while True:  # root of each atom's bond-reference tree
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    is_root = parent == atoms
    per_component = np.bincount(topo.component[is_root], minlength=topo.n_components)
    if (per_component > 1).any():  # anchored components with several fixed atoms: join their trees
        parent = _join_trees(parent, root, topo.component, per_component > 1, u, v)
    jumps = []
    p = parent
    while True:
        nxt = p[p]
        if np.array_equal(nxt, p):
            break
        jumps.append(p)
        p = nxt
    return _Tree(parent=parent, jumps=tuple(jumps), rows=rows, u=u, v=v)


def _join_trees(
    parent: np.ndarray,
    root: np.ndarray,
    component: np.ndarray,
    multi: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
) -> np.ndarray:
    """Re-root and hang the bond-reference trees of each component under its first tree.

    A breadth-first search over trees (nodes) linked by reference vectors
    ``(u, v)`` whose atoms lie in different trees; a tree reached through
    ``(u, v)`` (``v`` in the new tree) is re-rooted at ``v`` and hung under ``u``.
    Python loops over the trees and the re-rooted paths only (anchored
    components with several fixed atoms).
    """
    parent = parent.copy()
    cross_tree = (root[u] != root[v]) & multi[component[u]]
    links: dict[int, list[tuple[int, int]]] = {}
    for a, b in zip(u[cross_tree].tolist(), v[cross_tree].tolist()):
        links.setdefault(int(root[a]), []).append((a, b))
        links.setdefault(int(root[b]), []).append((b, a))
    roots = np.flatnonzero((parent == np.arange(parent.size)) & multi[component])
    done: set[int] = set()
    for start in roots.tolist():  # lowest root of each component first
        if start in done:
            continue
        done.add(start)
        queue = [start]
        while queue:
            tree = queue.pop(0)
            for a, b in links.get(tree, []):
                other = int(root[b])
                if other in done:
                    continue
                done.add(other)
                queue.append(other)
                prev, node = a, b  # reverse the path b -> ... -> other, then hang b under a
                while True:
                    nxt = int(parent[node])
                    parent[node] = prev
                    if nxt == node:
                        break
                    prev, node = node, nxt
    return parent


def _tree_tensors(table: ConstructionTable, device: torch.device) -> tuple[Tensor, tuple[Tensor, ...]]:
    """The spanning tree's parent and jump tensors on ``device`` (cached per table and device)."""

    def make(topo: Topology) -> tuple[Tensor, tuple[Tensor, ...]]:
        tree = table.cached(_tree, _tree)
        with _static_tensors():
            parent = torch.from_numpy(tree.parent).to(device)
            jumps = tuple(torch.from_numpy(j).to(device) for j in tree.jumps)
        return parent, jumps

    return table.cached((_tree_tensors, device), make)


def _whole(x: Tensor, h: Tensor, table: ConstructionTable) -> Tensor:
    """Whole coordinates ``x + N H`` (checked ``x`` ``(..., N, 3)``, ``h`` ``(..., 3, 3)``)."""
    parent, jumps = _tree_tensors(table, x.device)
    xd, hd = x.detach(), h.detach()
    hinv, _ = _reciprocal(hd)
    shift = _image_shift(xd - xd.index_select(-2, parent), hd, hinv)
    for p in jumps:
        shift = shift + shift.index_select(-2, p)
    return x + shift @ h


def unwrap(xyz: Any, table: ConstructionTable, box: Any) -> Tensor:
    r"""Molecules made whole: every atom moved by a box vector next to the atom it is built from.

    Along the table's spanning tree (the bond references; see the module
    notes):

    ```text
    x'_root = x_root,    x'_i = x'_parent(i) + minimum_image(x_i - x_parent(i))
    ```

    computed as ``x'_i = x_i + N_i H`` with integer image shifts ``N_i``
    accumulated by pointer jumping, so differentiable in ``xyz`` (derivative
    ``1``) and in the box, under ``torch.func`` too. Each component's root atom
    (its lowest-numbered fixed atom, for anchored components) stays where it is. Correct
    when every tree edge of the whole molecule is shorter than half the smallest
    perpendicular box width ([`check_box`][batched_nerf.check_box]).

    Args:
        xyz: ``(..., N, 3)`` coordinates, wrapped per atom or not (any length unit).
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable] of the ``N`` atoms.
        box: ``(..., 6)`` ``[a, b, c, alpha, beta, gamma]`` (unit of ``xyz``,
            degrees) or ``(..., 3, 3)`` box vectors in rows; per frame (leading
            dimensions broadcasting against those of ``xyz``) or shared.

    Returns:
        ``(..., N, 3)`` with the broadcast leading shape; NaN for the frames of
        an impossible box.

    Raises:
        TypeError: ``table`` is not a ConstructionTable, a complex or boolean
            value, or a box of a higher precision than ``xyz``.
        ValueError: ``xyz`` is not ``(..., N, 3)``, or a box of another shape,
            device or leading shape.

    Example:
        >>> import torch, batched_nerf as bn
        >>> # wrapped at x = 10
        >>> xyz = torch.tensor([[9.5, 0.0, 0.0], [0.5, 0.0, 0.0], [1.5, 0.0, 0.0]])
        >>> bn.unwrap(xyz, bn.ConstructionTable.chain(3), [10.0, 10.0, 10.0, 90.0, 90.0, 90.0])[:, 0]
        tensor([ 9.5000, 10.5000, 11.5000])
    """
    x = check_xyz(xyz, check_table(table))
    return _whole(x, _matrix(as_box(box, x)), table)


# ------------------------------------------------------------------------- wrapping
def _first_atoms(topo: Topology) -> np.ndarray:
    """``(N,)`` the first (lowest) atom of each atom's component."""
    _, first = np.unique(topo.component, return_index=True)
    return first[topo.component].astype(np.int64)


def wrap(
    xyz: Any, box: Any, table: ConstructionTable | None = None, *, center: Center | None = None
) -> Tensor:
    r"""Coordinates moved into the box ``{s H : 0 <= s < 1}`` by whole box vectors.

    Each unit (an atom, or a whole molecule: a component of ``table``) is moved
    by ``n H`` with ``n = -floor(s)``, ``s = c H^{-1}`` the fractional
    coordinates of its centre ``c``, so that ``c`` lands in the box (the
    parallelepiped spanned by the box vectors from the origin, as
    MDAnalysis's ``wrap``; not the compact, e.g. dodecahedral, unit cell).
    Molecules stay whole when they were (as built by
    [`to_cartesian`][batched_nerf.to_cartesian]); use [`unwrap`][batched_nerf.unwrap] first otherwise.
    Derivative ``1`` in ``xyz`` and ``n`` in the box; ``torch.func``-safe.

    Args:
        xyz: ``(..., M, 3)`` coordinates (``M = N`` with a table).
        box: ``(..., 6)`` or ``(..., 3, 3)`` (see [`box_vectors`][batched_nerf.box_vectors]), per frame or
            shared.
        table: moves each component of the table as one unit; without it, atoms
            are wrapped one by one.
        center: ``"atom"`` (each atom on its own; the default without a table),
            ``"first"`` (a molecule's first atom, the default with a table) or
            ``"centroid"`` (the mean position of a molecule's atoms) lands in the box.

    Returns:
        ``(..., M, 3)`` with the broadcast leading shape; NaN for an impossible box.

    Raises:
        TypeError: ``table`` is given but not a ConstructionTable, a complex or
            boolean value, or a box of a higher precision than ``xyz``.
        ValueError: ``xyz`` not ``(..., M, 3)`` (``(..., N, 3)`` with a table),
            a box of another shape, device or leading shape, an unknown
            ``center``, or ``"first"`` / ``"centroid"`` without a table.

    Example:
        >>> import torch, batched_nerf as bn
        >>> xyz = torch.tensor([[9.5, 0.0, 0.0], [10.5, 0.0, 0.0], [11.5, 0.0, 0.0]])
        >>> box = [10.0, 10.0, 10.0, 90.0, 90.0, 90.0]
        >>> bn.wrap(xyz, box)[:, 0], bn.wrap(xyz, box, bn.ConstructionTable.chain(3))[:, 0]
        (tensor([9.5000, 0.5000, 1.5000]), tensor([ 9.5000, 10.5000, 11.5000]))
    """
    if center is None:
        center = "atom" if table is None else "first"
    if center not in _CENTERS:
        raise ValueError(f"center must be one of {_CENTERS}, got {center!r}")
    if table is None:
        if center != "atom":
            raise ValueError(
                f"center={center!r} wraps whole molecules and needs their table (table=...); "
                "without one, atoms are wrapped one by one (center='atom')"
            )
        x = as_float(xyz, "xyz")
        if x.ndim < 2 or x.shape[-1] != 3:
            raise ValueError(f"xyz must have shape (..., M, 3), got {tuple(x.shape)}")
    else:
        x = check_xyz(xyz, check_table(table))
    h = _matrix(as_box(box, x))
    xd, hd = x.detach(), h.detach()
    if center == "atom":
        ref = xd
    else:
        topo = table.topology  # type: ignore[union-attr]
        if center == "first":
            first = torch.from_numpy(table.cached(_first_atoms, _first_atoms)).to(x.device)  # type: ignore[union-attr]
            ref = xd[..., first, :]
        else:
            comp = torch.from_numpy(topo.component.copy()).to(x.device)
            counts = torch.from_numpy(np.bincount(topo.component)).to(x.device, x.dtype)
            sums = torch.zeros(*xd.shape[:-2], topo.n_components, 3, dtype=x.dtype, device=x.device)
            ref = (sums.index_add(-2, comp, xd) / counts[:, None])[..., comp, :]
    hinv, _ = _reciprocal(hd)
    return x - torch.floor(ref @ hinv) @ h


# ----------------------------------------------------------------------- the check
def check_box(xyz: Any, table: ConstructionTable, box: Any) -> None:
    r"""Check that every reference vector of ``table`` can be told from its periodic images.

    A vector is recovered from its image only when it is shorter than half the
    smallest perpendicular width ``w = min_k |det H| / |h_l x h_m|`` of the box
    (for a rectangular box, half its shortest edge). This makes the molecules
    whole ([`unwrap`][batched_nerf.unwrap]) and measures, in every frame, each row's reference
    vectors ``x_i - x_b``, ``x_a - x_b`` and ``x_a - x_d``: those at least
    ``w / 2`` long are reported, since [`to_internal`][batched_nerf.to_internal] with
    ``box=`` may have taken another of their images. It also checks the box
    itself. Outside the compute path (it reads values: not for ``torch.func``
    or ``torch.compile``); NaN coordinates are not reported.

    What no check can see: in wrapped coordinates a vector longer than ``w / 2``
    whose image is shorter than ``w / 2`` is indistinguishable from that image
    (that is the ambiguity itself); it is taken to be the short image. The bound
    is an assumption about the molecule (its bonds and the table's reference
    vectors shorter than half the box), and this check reports where the
    coordinates contradict it: the shortest image of a tree edge at least
    ``w / 2`` long, or a reference vector of the whole molecule (one not on the
    tree, e.g. ``x_a - x_d`` of a branch, or between molecules linked into one
    build) at least ``w / 2`` long.

    Args:
        xyz: ``(..., N, 3)`` coordinates, wrapped or whole.
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable] of the ``N`` atoms.
        box: ``(..., 6)`` or ``(..., 3, 3)`` (see [`box_vectors`][batched_nerf.box_vectors]), per frame or
            shared.

    Raises:
        TypeError: ``table`` is not a ConstructionTable, a complex or boolean
            value, or a box of a higher precision than ``xyz``.
        ValueError: ``xyz`` or the box of a wrong shape, device or leading
            shape; a box with a length ``<= 0``, an angle outside ``(0, 180)``,
            angles that close no cell, or singular or non-finite box vectors
            (naming the frame); or rows whose reference vectors are at least
            half the smallest box width long (naming the rows, the atoms, the
            length, the bound and the frame).

    Example:
        >>> import torch, batched_nerf as bn
        >>> xyz = torch.tensor([[0.0, 0, 0], [1.5, 0, 0], [1.5, 1.5, 0], [4.0, 4.0, 0]])
        >>> bn.check_box(xyz, bn.ConstructionTable.chain(4), [10.0, 10.0, 10.0, 90.0, 90.0, 90.0])
        >>> try:  # in a 5-A box, x_3 - x_2 = (2.5, 2.5, 0) has no image shorter than 2.5
        ...     bn.check_box(xyz, bn.ConstructionTable.chain(4), [5.0, 5.0, 5.0, 90.0, 90.0, 90.0])
        ... except ValueError as err:
        ...     print(str(err)[:72])
        row 3: reference vector x_3 - x_2 (atoms 3, 2) is 3.53553 long, not shor
    """
    x = check_xyz(xyz, check_table(table))
    b = as_box(box, x)
    with torch.no_grad():
        x, b = x.detach(), b.detach()
        h = _matrix(b)
        bad_box = ~torch.isfinite(h).all(-1).all(-1) | (_reciprocal(h)[1] == 0)
        if bad_box.any():  # named by the box's own leading index
            frame = tuple(int(i) for i in torch.nonzero(bad_box)[0].tolist())
            what = (
                "[a, b, c, alpha, beta, gamma] needs lengths > 0 and angles in (0, 180) that close a cell"
                if b.shape[-1] == 6
                else "box vectors must be finite and linearly independent"
            )
            where = f" of frame {frame}" if frame else ""
            many = f"; {int(bad_box.sum())} such boxes in all" if bad_box.ndim else ""
            raise ValueError(f"box{where} is not a periodic cell: {b[frame].tolist()} ({what}{many})")
        batch = torch.broadcast_shapes(x.shape[:-2], h.shape[:-2])
        h = h.expand(*batch, 3, 3)
        half = _widths(h).min(-1).values / 2
        tree = table.cached(_tree, _tree)
        whole = _whole(x.expand(*batch, *x.shape[-2:]), h, table)
        lengths = (whole[..., tree.u, :] - whole[..., tree.v, :]).norm(dim=-1)
        long = lengths >= half[..., None]
        if not long.any():
            return
        hits = torch.nonzero(long)
        first = hits[0].tolist()
        frame, e = tuple(first[:-1]), first[-1]
        bad_rows = np.unique(tree.rows[torch.unique(hits[:, -1]).cpu().numpy()])
        row, u, v = int(tree.rows[e]), int(tree.u[e]), int(tree.v[e])
        count = f"{bad_rows.size} row{'s' if bad_rows.size > 1 else ''} in all: {short(bad_rows)}"
        where = f" in frame {frame}" if frame else ""
        raise ValueError(
            f"row {row}: reference vector x_{u} - x_{v} (atoms {u}, {v}) is "
            f"{lengths[(*frame, e)].item():.6g} long{where}, not shorter than {half[frame].item():.6g}, "
            f"half the smallest perpendicular box width; it cannot be told from its periodic images "
            f"({count}); use a larger box or a table whose references are shorter"
        )
