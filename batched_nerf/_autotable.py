"""Automatic construction tables from a bond graph or from coordinates.

:func:`table_from_bonds` turns a bond graph into a chemically sensible
Z-matrix: every atom is placed from a bonded neighbour, at an angle to a
neighbour of that atom, and with a proper torsion along bonds where one exists.
Further branches around the same bond (the 2nd and 3rd hydrogen of a methyl
group) use an already placed sibling as dihedral reference, so that their
dihedrals are the rigid ~±120 deg offsets rather than copies of the same
torsion. :func:`table_from_xyz` perceives the bonds from covalent radii first.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from ._table import ConstructionTable

__all__ = ["COVALENT_RADII", "LINEAR_TOLERANCE_DEG", "perceive_bonds", "table_from_bonds", "table_from_xyz"]

#: Single-bond covalent radii in Angstrom (Cordero et al., Dalton Trans. 2008,
#: sp3 carbon, low-spin transition metals).
COVALENT_RADII: dict[str, float] = {
    "H": 0.31, "He": 0.28, "Li": 1.28, "Be": 0.96, "B": 0.84, "C": 0.76, "N": 0.71, "O": 0.66,
    "F": 0.57, "Ne": 0.58, "Na": 1.66, "Mg": 1.41, "Al": 1.21, "Si": 1.11, "P": 1.07, "S": 1.05,
    "Cl": 1.02, "Ar": 1.06, "K": 2.03, "Ca": 1.76, "Sc": 1.70, "Ti": 1.60, "V": 1.53, "Cr": 1.39,
    "Mn": 1.39, "Fe": 1.32, "Co": 1.26, "Ni": 1.24, "Cu": 1.32, "Zn": 1.22, "Ga": 1.22, "Ge": 1.20,
    "As": 1.19, "Se": 1.20, "Br": 1.20, "Kr": 1.16, "Rb": 2.20, "Sr": 1.95, "Y": 1.90, "Zr": 1.75,
    "Mo": 1.54, "Ru": 1.46, "Rh": 1.42, "Pd": 1.39, "Ag": 1.45, "Cd": 1.44, "In": 1.42, "Sn": 1.39,
    "Sb": 1.39, "Te": 1.38, "I": 1.39, "Xe": 1.40, "Cs": 2.44, "Ba": 2.15, "W": 1.62, "Pt": 1.36,
    "Au": 1.36, "Hg": 1.32, "Pb": 1.46, "Bi": 1.48,
}  # fmt: skip

#: How many nearby earlier atoms the last-resort search considers.
_POOL = 16

#: Reference triples whose angle lies within this many degrees of 0 or 180 are avoided.
LINEAR_TOLERANCE_DEG = 5.0


def _normalise_element(symbol: str) -> str:
    s = str(symbol).strip()
    return s[:1].upper() + s[1:].lower()


def _as_xyz(xyz: Any, n_atoms: int | None, what: str = "xyz") -> np.ndarray:
    if hasattr(xyz, "detach"):
        xyz = xyz.detach().cpu().numpy()
    arr = np.asarray(xyz, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 3 or (n_atoms is not None and arr.shape[0] != n_atoms):
        want = f"({n_atoms}, 3)" if n_atoms is not None else "(N, 3)"
        raise ValueError(f"{what} must have shape {want}, got {tuple(arr.shape)}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} contains NaN or infinite values")
    return arr


def _adjacency(bonds: Any, n_atoms: int) -> list[list[int]]:
    if hasattr(bonds, "detach"):
        bonds = bonds.detach().cpu().numpy()
    arr = bonds if isinstance(bonds, np.ndarray) else np.asarray([tuple(p) for p in bonds])
    if arr.size == 0:
        arr = np.zeros((0, 2), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"bonds must be a sequence of (i, j) pairs, got shape {tuple(arr.shape)}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"bonds must hold integer atom indices, got dtype {arr.dtype}")
    neighbours: list[set[int]] = [set() for _ in range(n_atoms)]
    for k, (i, j) in enumerate(arr.astype(np.int64).tolist()):
        for x in (i, j):
            if x < 0 or x >= n_atoms:
                raise ValueError(f"bond {k} ({i}, {j}): atom index {x} out of range [0, {n_atoms - 1}]")
        if i == j:
            raise ValueError(f"bond {k} ({i}, {j}): an atom cannot be bonded to itself")
        neighbours[i].add(j)
        neighbours[j].add(i)
    return [sorted(s) for s in neighbours]


def _bfs(adj: list[list[int]], start: int) -> dict[int, int]:
    """Graph distances from ``start`` within its component."""
    dist = {start: 0}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for v in adj[u]:
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


def _nearby(adj: list[list[int]], start: int, accept: Callable[[int], bool], limit: int) -> list[int]:
    """Up to ``limit`` atoms passing ``accept``, nearest to ``start`` along bonds first."""
    seen = {start}
    found: list[int] = []
    frontier = [start]
    while frontier and len(found) < limit:
        nxt: list[int] = []
        for u in frontier:
            for v in adj[u]:
                if v not in seen:
                    seen.add(v)
                    nxt.append(v)
        nxt.sort()
        found.extend(v for v in nxt if accept(v))
        frontier = nxt
    return found[:limit]


def _centre(adj: list[list[int]], start: int) -> tuple[int, list[int]]:
    """An approximate graph centre (double sweep) and the component's atoms."""
    d0 = _bfs(adj, start)
    u = max(d0, key=lambda k: (d0[k], -k))
    du = _bfs(adj, u)
    v = max(du, key=lambda k: (du[k], -k))
    dv = _bfs(adj, v)
    length = du[v]
    # an atom on a u-v shortest path, halfway
    mid = [k for k in du if du[k] + dv[k] == length and du[k] == length // 2]
    best = max(mid, key=lambda k: (len(adj[k]), -k))
    return best, sorted(d0)


class _Picker:
    """Chooses references, refusing near-linear triples when coordinates are known."""

    def __init__(self, xyz: np.ndarray | None, tol_deg: float) -> None:
        self.xyz = None if xyz is None else [tuple(p) for p in xyz.tolist()]
        self.cos_tol = math.cos(math.radians(tol_deg))

    def badness(self, p: int, q: int, r: int) -> float:
        """``|cos|`` of the angle p-q-r at q (1 = linear); 0 without coordinates."""
        if self.xyz is None:
            return 0.0
        (px, py, pz), (qx, qy, qz), (rx, ry, rz) = self.xyz[p], self.xyz[q], self.xyz[r]
        ux, uy, uz, vx, vy, vz = px - qx, py - qy, pz - qz, rx - qx, ry - qy, rz - qz
        norm = math.sqrt((ux * ux + uy * uy + uz * uz) * (vx * vx + vy * vy + vz * vz))
        if norm < 1e-16:
            return 1.0
        return abs(ux * vx + uy * vy + uz * vz) / norm

    def ok(self, p: int, q: int, r: int) -> bool:
        return self.badness(p, q, r) < self.cos_tol


def _refs_from_adjacency(
    adj: list[list[int]], n_atoms: int, xyz: np.ndarray | None, root: int | None, tol_deg: float
) -> np.ndarray:
    picker = _Picker(xyz, tol_deg)
    refs = np.full((n_atoms, 3), -1, dtype=np.int64)
    done = np.zeros(n_atoms, dtype=bool)
    starts = ([root] if root is not None else []) + list(range(n_atoms))
    for start in starts:
        if done[start]:
            continue
        centre, members = (start, sorted(_bfs(adj, start))) if start == root else _centre(adj, start)
        _place_component(adj, centre, members, refs, picker)
        done[members] = True
    return refs


def _place_component(
    adj: list[list[int]], root: int, members: list[int], refs: np.ndarray, picker: _Picker
) -> None:
    # breadth-first spanning tree from the root; ring-closure bonds are ignored
    parent = {root: -1}
    order = [root]
    for u in order:
        # visit well-connected neighbours first: they become the seeds and first branches
        for v in sorted(adj[u], key=lambda k: (-len(adj[k]), k)):
            if v not in parent:
                parent[v] = u
                order.append(v)
    if len(order) == 1:
        return
    second = order[1]
    refs[second] = [root, -1, -1]
    placed = [root, second]
    rest = order[2:]
    if rest:
        third = _third_seed(adj, root, second, rest, parent, refs, picker)
        placed.append(third)
        rest = [v for v in rest if v != third]
    placed.extend(rest)
    position = {atom: k for k, atom in enumerate(placed)}
    for i in placed[3:]:
        refs[i] = _full_refs(i, parent, adj, refs, position, picker)


def _third_seed(
    adj: list[list[int]],
    root: int,
    second: int,
    rest: list[int],
    parent: dict[int, int],
    refs: np.ndarray,
    picker: _Picker,
) -> int:
    """Choose and write the third seed row ``(b, a, -1)``, ``{b, a} = {root, second}``."""
    # preferably bonded to root or second (in BFS order) and not collinear with them
    for v in rest:
        b = parent[v]
        if b in (root, second) and picker.ok(v, b, root + second - b):
            refs[v] = [b, root + second - b, -1]
            return v
    # every bonded candidate is near-linear (e.g. the root ends a linear group).
    # A straight seed angle only harms atoms whose dihedrals use the seed frame:
    # in a 3-atom fragment keep the bond; otherwise a non-linear atom nearby if
    # there is one, else the least linear bonded candidate (any, when none is bonded)
    dist = _bfs(adj, root)
    every = [(v, b) for v in rest for b in (second, root)]
    bonded = [(v, parent[v]) for v in rest if parent[v] in (root, second)]
    ok = [] if len(rest) == 1 else [(v, b) for v, b in every if picker.ok(v, b, root + second - b)]
    candidates = ok or bonded or every
    _, _, v, b = min((picker.badness(v, b, root + second - b), dist[v], v, b) for v, b in candidates)
    refs[v] = [b, root + second - b, -1]
    return v


def _full_refs(
    i: int,
    parent: dict[int, int],
    adj: list[list[int]],
    refs: np.ndarray,
    position: dict[int, int],
    picker: _Picker,
) -> list[int]:
    b = parent[i]
    me = position[i]

    def before(k: int) -> bool:
        return position.get(k, me) < me

    # angle reference: towards the root first, then other bonded neighbours of b
    a_cands = [parent[b]] if parent[b] >= 0 else []
    a_cands += [k for k in adj[b] if k != i and before(k) and k not in a_cands]
    a_good = [a for a in a_cands if picker.ok(i, b, a)]
    a = a_good[0] if a_good else -1
    if a >= 0:
        d = _dihedral_ref(i, b, a, parent, adj, refs, before, position, picker)
        if d >= 0:
            return [b, a, d]
    # last resort: earlier atoms of the fragment, nearest along bonds first
    pool = _nearby(adj, b, lambda k: before(k) and k != i, _POOL)
    best: tuple[float, list[int]] | None = None
    for a2 in ([a] if a >= 0 else []) + [k for k in pool if k != a]:
        bad_a = picker.badness(i, b, a2)
        for d in pool:
            if d == a2:
                continue
            score = max(bad_a, picker.badness(b, a2, d))
            if best is None or score < best[0]:
                best = (score, [b, a2, d])
            if score < picker.cos_tol:
                return [b, a2, d]
    assert best is not None  # an atom placed after the three seeds has >= 2 earlier atoms
    return best[1]


def _dihedral_ref(
    i: int,
    b: int,
    a: int,
    parent: dict[int, int],
    adj: list[list[int]],
    refs: np.ndarray,
    before: Callable[[int], bool],
    position: dict[int, int],
    picker: _Picker,
) -> int:
    # a sibling already placed around the same axis b-a
    siblings = sorted(
        (k for k in adj[b] if k not in (i, a) and before(k) and parent.get(k) == b), key=lambda k: position[k]
    )
    siblings = [k for k in siblings if refs[k, 0] == b and refs[k, 1] == a] + [
        k for k in siblings if not (refs[k, 0] == b and refs[k, 1] == a)
    ]
    # a proper torsion along bonds i-b-a-d: towards the root, else the best-connected neighbour of a
    proper = ([parent[a]] if parent[a] >= 0 and parent[a] != b else []) + sorted(
        (k for k in adj[a] if k not in (i, b) and before(k)), key=lambda k: (-len(adj[k]), position[k])
    )
    # any other placed neighbour of b (branches off the seed atoms)
    others = [k for k in adj[b] if k not in (i, a) and before(k)]
    first_branch = not any(refs[k, 0] == b and refs[k, 1] == a for k in siblings)
    cands = (proper + siblings if first_branch else siblings + proper) + others
    for d in cands:
        if d not in (i, b, a) and picker.ok(b, a, d):
            return d
    return -1


def table_from_bonds(
    bonds: Iterable[Sequence[int]] | np.ndarray,
    n_atoms: int,
    *,
    xyz: Any = None,
    root: int | None = None,
) -> ConstructionTable:
    """Construction table for a molecule given by its bond graph.

    Each connected fragment is spanned breadth-first from an (approximate)
    graph centre, which keeps the build shallow; ring-closure bonds are simply
    left out of the spanning tree. Every atom ``i`` then gets

    * bond reference: its tree parent ``b`` (always a bonded neighbour);
    * angle reference: the parent ``a`` of ``b`` (another neighbour of ``b``
      for the atoms next to the root);
    * dihedral reference: a proper torsion ``i-b-a-d`` along bonds for the
      first branch around the axis ``b-a``; further branches (the 2nd and 3rd
      hydrogen of a CH3) reference that already placed *sibling*, i.e. they share
      ``b`` and ``a`` and their dihedral is the rigid offset around the bond.

    The root of a fragment, a neighbour of it and a third atom bonded to one of
    those two form the seed rows ``(-1, -1, -1)``, ``(root, -1, -1)`` and
    ``(b, a, -1)``. Atoms with too few bonded neighbours (and atoms whose
    bonded choices would all be near-linear) fall back to other, earlier placed
    atoms of the same fragment, nearest along bonds first. Only when no atom
    bonded to the first two seeds can be the third one without being collinear
    with them (e.g. ``root`` at the N of a nitrile), in a fragment of more than
    three atoms, does the third seed take a non-bonded bond reference; every
    other bond reference is a real bond.

    Args:
        bonds: ``(B, 2)`` integer pairs ``(i, j)`` (any order, duplicates allowed).
        n_atoms: number of atoms ``N``; atoms in no bond become 1-atom fragments.
        xyz: optional ``(N, 3)`` coordinates (numpy or torch). When given, angle
            and dihedral references forming a triple within
            :data:`LINEAR_TOLERANCE_DEG` (5 deg) of 0 or 180 deg are avoided
            (``i-b-a`` for the angle, ``b-a-d`` for the dihedral). If a fragment
            is entirely linear the least linear choice is kept.
        root: optional atom placed at the origin (its fragment is seeded from it);
            other fragments use their graph centre.

    Returns:
        A validated :class:`~batched_nerf.ConstructionTable` with ``N`` rows and
        one seed triple per fragment.

    Raises:
        ValueError: for a negative ``n_atoms``, a bond index out of range or a
            self-bond, malformed ``bonds``, ``xyz`` of the wrong shape or not
            finite, or ``root`` out of range.

    Example:
        >>> from batched_nerf._autotable import table_from_bonds
        >>> ethane = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 5), (1, 6), (1, 7)]
        >>> table_from_bonds(ethane, 8).refs.tolist()
        [[1, -1, -1], [-1, -1, -1], [0, 1, 5], [0, 1, 2], [0, 1, 2], [1, 0, -1], [1, 0, 5], [1, 0, 5]]
        >>> table_from_bonds(ethane, 8, root=0).refs.tolist()[1:4]
        [[0, -1, -1], [0, 1, -1], [0, 1, 2]]
    """
    from ._table import ConstructionTable

    return ConstructionTable(_refs_from_bonds(bonds, n_atoms, xyz=xyz, root=root))


def _refs_from_bonds(
    bonds: Iterable[Sequence[int]] | np.ndarray, n_atoms: int, *, xyz: Any = None, root: int | None = None
) -> np.ndarray:
    if isinstance(n_atoms, bool) or not isinstance(n_atoms, (int, np.integer)) or n_atoms < 0:
        raise ValueError(f"n_atoms must be a non-negative integer, got {n_atoms!r}")
    n_atoms = int(n_atoms)
    adj = _adjacency(bonds, n_atoms)
    coords = None if xyz is None else _as_xyz(xyz, n_atoms)
    if root is not None and (isinstance(root, bool) or not 0 <= int(root) < n_atoms):
        raise ValueError(f"root must be an atom index in [0, {n_atoms - 1}], got {root!r}")
    start = None if root is None else int(root)
    return _refs_from_adjacency(adj, n_atoms, coords, start, LINEAR_TOLERANCE_DEG)


def perceive_bonds(xyz: Any, elements: Sequence[str], *, scale: float = 1.2) -> np.ndarray:
    """Bonded pairs ``(i, j)``, ``i < j``, with ``|x_i - x_j| < scale * (r_i + r_j)``.

    Args:
        xyz: ``(N, 3)`` coordinates in Angstrom (numpy or torch).
        elements: ``N`` element symbols (case-insensitive), see :data:`COVALENT_RADII`.
        scale: tolerance factor on the sum of covalent radii.

    Returns:
        ``(B, 2)`` ``np.int64`` array of bonded pairs, sorted.

    Raises:
        ValueError: for an unknown element, mismatched lengths, a bad shape or a
            non-positive ``scale``.

    Example:
        >>> from batched_nerf._autotable import perceive_bonds
        >>> perceive_bonds([[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]], ["O", "H", "H"]).tolist()
        [[0, 1], [0, 2]]
    """
    coords = _as_xyz(xyz, None)
    elements = list(elements)
    if len(elements) != len(coords):
        raise ValueError(f"got {len(elements)} elements for {len(coords)} atoms")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    radii = np.empty(len(coords))
    for k, el in enumerate(elements):
        sym = _normalise_element(el)
        if sym not in COVALENT_RADII:
            raise ValueError(
                f"unknown element {el!r} at index {k}; known elements: {', '.join(COVALENT_RADII)}"
            )
        radii[k] = COVALENT_RADII[sym]
    return _close_pairs(coords, radii * scale)


def _close_pairs(coords: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """Pairs ``i < j`` with ``|x_i - x_j| < reach_i + reach_j``, via a cell list (linear time)."""
    n = len(coords)
    if n < 2:
        return np.zeros((0, 2), dtype=np.int64)
    h = 2.0 * float(reach.max())
    cell = np.floor((coords - coords.min(0)) / h).astype(np.int64) + 1  # one empty layer of padding
    dims = cell.max(0) + 2
    cid = (cell[:, 0] * dims[1] + cell[:, 1]) * dims[2] + cell[:, 2]
    order = np.argsort(cid, kind="stable")
    sorted_cid = cid[order]
    found = []
    for dx, dy, dz in itertools.product((-1, 0, 1), repeat=3):
        nid = cid + (dx * dims[1] + dy) * dims[2] + dz
        lo = np.searchsorted(sorted_cid, nid, "left")
        counts = np.searchsorted(sorted_cid, nid, "right") - lo
        i = np.repeat(np.arange(n), counts)
        start = np.repeat(lo - (np.cumsum(counts) - counts), counts)
        j = order[start + np.arange(len(i))]
        keep = i < j
        i, j = i[keep], j[keep]
        close = np.linalg.norm(coords[i] - coords[j], axis=1) < reach[i] + reach[j]
        found.append(np.stack([i[close], j[close]], axis=1))
    pairs = np.concatenate(found)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))].astype(np.int64)


def table_from_xyz(xyz: Any, elements: Sequence[str], *, scale: float = 1.2) -> ConstructionTable:
    """Construction table from coordinates: perceive bonds, then :func:`table_from_bonds`.

    Two atoms are bonded when their distance is below ``scale`` times the sum
    of their covalent radii (:data:`COVALENT_RADII`). The coordinates are also
    used to avoid near-linear reference triples.

    Args:
        xyz: ``(N, 3)`` coordinates in Angstrom (numpy or torch; one conformation).
        elements: ``N`` element symbols, case-insensitive (``"C"``, ``"cl"``, ``"BR"``).
        scale: tolerance factor on the sum of covalent radii (default 1.2).

    Returns:
        A :class:`~batched_nerf.ConstructionTable`; each bonded fragment gets its
        own seed triple.

    Raises:
        ValueError: for an unknown element, a length mismatch between ``xyz``
            and ``elements``, a wrong shape, or non-finite coordinates.

    Example:
        >>> from batched_nerf._autotable import table_from_xyz
        >>> water = [[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0]]
        >>> table_from_xyz(water, ["O", "H", "H"]).refs.tolist()
        [[-1, -1, -1], [0, -1, -1], [0, 1, -1]]
    """
    coords = _as_xyz(xyz, None)
    pairs = perceive_bonds(coords, elements, scale=scale)
    return table_from_bonds(pairs, len(coords), xyz=coords)
