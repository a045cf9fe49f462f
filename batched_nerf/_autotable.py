"""Automatic construction tables (plain numpy arrays) from a bond graph or from coordinates.

:func:`refs_from_connectivity` turns a bond graph (``connectivity``: pairs of
bonded atoms) into a chemically sensible Z-matrix: every atom is placed from a
bonded neighbour, at an angle to a neighbour of that atom, and with a proper
torsion along bonds where one exists. Further branches around the same bond
(the 2nd and 3rd hydrogen of a methyl group) use an already placed sibling as
dihedral reference, so that their dihedrals are the rigid ~+-120 deg offsets
rather than copies of the same torsion. :func:`refs_from_xyz` perceives the
bonds from covalent radii first (:func:`~batched_nerf._perceive.perceive_connectivity`).

When coordinates are known, disconnected fragments (the molecules of a dimer,
the ions of a salt, solvent molecules) are *linked* into one build by
:func:`link_components`: the first atoms of each further fragment reference
the nearest atoms already placed. Those references are not chemical bonds;
:func:`nonbonded_references` marks them (and any other non-bonded reference).

This module works on numpy arrays only; :class:`~batched_nerf.ConstructionTable`
wraps its results (``ConstructionTable.from_connectivity``, ``from_xyz``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ._perceive import COVALENT_RADII, DEFAULT_SCALE, as_xyz, check_not_coincident, perceive_connectivity
from ._topology import components

__all__ = [
    "COVALENT_RADII",
    "LINEAR_TOLERANCE_DEG",
    "AutoRefs",
    "link_components",
    "nonbonded_references",
    "perceive_connectivity",
    "refs_from_connectivity",
    "refs_from_xyz",
]

#: How many nearby earlier atoms the last-resort search considers.
_POOL = 16

#: How many of the nearest placed atoms a fragment link considers.
_LINK_POOL = 64

#: Reference triples whose angle lies within this many degrees of 0 or 180 are avoided.
LINEAR_TOLERANCE_DEG = 5.0

#: Atoms closer than this (in the unit of ``xyz``) are rejected as coincident.
COINCIDENT_DISTANCE = 1e-4


class AutoRefs(NamedTuple):
    """An automatic construction table as plain arrays.

    Attributes:
        refs: ``(N, 3)`` ``np.int64`` references ``(bond, angle, dihedral)``, ``-1`` for none.
        nonbonded: ``(N, 3)`` boolean mask of the internal coordinates that are
            not chemical ones (see :func:`nonbonded_references`), among them
            every link between fragments.
        connectivity: ``(E, 2)`` ``np.int64`` bonded pairs ``i < j`` (sorted, unique)
            that the table was built from.
    """

    refs: np.ndarray
    nonbonded: np.ndarray
    connectivity: np.ndarray


def _adjacency(connectivity: Any, n_atoms: int) -> tuple[list[list[int]], np.ndarray]:
    if hasattr(connectivity, "detach"):
        connectivity = connectivity.detach().cpu().numpy()
    arr = (
        connectivity if isinstance(connectivity, np.ndarray) else np.asarray([tuple(p) for p in connectivity])
    )
    if arr.size == 0:
        arr = np.zeros((0, 2), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"connectivity must be a sequence of (i, j) pairs, got shape {tuple(arr.shape)}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"connectivity must hold integer atom indices, got dtype {arr.dtype}")
    neighbours: list[set[int]] = [set() for _ in range(n_atoms)]
    for k, (i, j) in enumerate(arr.astype(np.int64).tolist()):
        for x in (i, j):
            if x < 0 or x >= n_atoms:
                raise ValueError(
                    f"connectivity pair {k} ({i}, {j}): atom index {x} out of range [0, {n_atoms - 1}]"
                )
        if i == j:
            raise ValueError(f"connectivity pair {k} ({i}, {j}): an atom cannot be bonded to itself")
        neighbours[i].add(j)
        neighbours[j].add(i)
    pairs = np.array([(i, j) for i in range(n_atoms) for j in sorted(neighbours[i]) if i < j], dtype=np.int64)
    return [sorted(s) for s in neighbours], pairs.reshape(-1, 2)


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


# ------------------------------------------------------------------ linking
def link_components(
    refs: Any,
    xyz: Any,
    *,
    fixed: Iterable[int] | np.ndarray | None = None,
    first: int | None = None,
) -> np.ndarray:
    """Join the seeded components of a table into one build, referencing the nearest placed atoms.

    The components are placed one after the other: first the one containing
    atom ``first`` (default: the largest whose atoms are not all on one line,
    so that the seed triple lies in the main molecule rather than on an ion),
    then the others in order of the distance of their root atom to that
    first component (shell by shell, which keeps the links short and the build
    shallow). The (up to) three seed rows of each get references to atoms
    already placed, chosen nearest to its root first and so that no reference
    triple is within :data:`LINEAR_TOLERANCE_DEG` of 0 or 180 deg (the least
    linear choice when no other exists):

    * root ``r``: ``(p1, p2, p3)``, ``p1`` the placed atom nearest to ``r``;
    * second seed ``s = (r, -1, -1)``: ``(r, q1, q2)``;
    * third seed ``t = (b, a, -1)``: ``(b, a, q)``.

    Every other row is kept. While all atoms placed so far lie on one line
    (linear molecules, single atoms) they define no frame for a dihedral; then
    the first seed atom off that line becomes the build's third seed instead.
    The new references are not chemical bonds (see :func:`nonbonded_references`).
    Components anchored by ``fixed`` atoms are not changed; when they hold
    three or more atoms the seeded components are linked to them too (so the
    whole system keeps its absolute placement).

    Args:
        refs: ``(N, 3)`` integer references of a valid table.
        xyz: ``(N, 3)`` coordinates of one conformation.
        fixed: indices of the table's fixed atoms (default none).
        first: an atom whose component is placed first (default: the largest component).

    Returns:
        ``(N, 3)`` ``np.int64`` references with a single seed triple (or none,
        when anchored components received the links).

    Raises:
        ValueError: ``refs`` or ``xyz`` of the wrong shape, or ``first`` out of range.

    Example:
        >>> from batched_nerf._autotable import link_components
        >>> two_waters = [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [-1, -1, -1], [3, -1, -1], [3, 4, -1]]
        >>> xyz = [[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0],
        ...        [2.9, 0.1, 0.2], [3.3, 0.9, 0], [3.3, -0.6, 0.5]]
        >>> link_components(two_waters, xyz).tolist()[3:]
        [[1, 0, 2], [3, 1, 0], [3, 4, 1]]
    """
    arr = np.array(refs, dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"refs must have shape (N, 3), got {tuple(arr.shape)}")
    n = len(arr)
    coords = as_xyz(xyz, n)
    if first is not None and not 0 <= int(first) < n:
        raise ValueError(f"first must be an atom index in [0, {n - 1}], got {first!r}")
    comp = components(arr)
    n_comp = int(comp.max()) + 1 if n else 0
    is_fixed = np.zeros(n, dtype=bool)
    is_fixed[np.asarray(list(fixed) if fixed is not None else [], dtype=np.int64)] = True
    anchored = np.zeros(n_comp, dtype=bool)
    anchored[comp[is_fixed]] = True
    members = [np.flatnonzero(comp == c) for c in range(n_comp)]
    seeded = [c for c in range(n_comp) if not anchored[c]]
    placed_atoms = np.flatnonzero(anchored[comp])
    if placed_atoms.size < 3:
        placed_atoms = np.zeros(0, dtype=np.int64)
    n_refs = (arr >= 0).sum(1)
    picker = _Picker(coords, LINEAR_TOLERANCE_DEG)
    line: list[int] | None = None  # the seed atoms (R0, S0) of the build while all its atoms are collinear
    if not placed_atoms.size:
        if len(seeded) < 2:
            return arr
        # largest first, preferring a molecule whose atoms are not all on one line (its seed
        # triple then spans a plane that every further link can use)
        bent = {c: not _collinear(members[c], n_refs, picker) for c in seeded}
        largest = max(seeded, key=lambda c: (bent[c], members[c].size, -c))
        start = int(comp[first]) if first is not None and int(comp[first]) in seeded else largest
        seeded.remove(start)
        placed_atoms = members[start]
        if not bent[start]:
            line = [int(v) for v in sorted(placed_atoms.tolist(), key=lambda v: n_refs[v])[:2]]
    if not seeded:
        return arr
    roots = np.array([int(members[c][n_refs[members[c]] == 0][0]) for c in seeded], dtype=np.int64)
    # shell by shell outwards from the first component: the links stay short and the build shallow
    dmin = _min_distance(coords[roots], coords[placed_atoms])
    placed = list(placed_atoms.tolist())
    for k in np.lexsort((np.arange(len(seeded)), dmin)).tolist():
        c, r = seeded[k], int(roots[k])
        d = np.linalg.norm(coords[placed] - coords[r], axis=1)
        near = np.argpartition(d, _LINK_POOL)[:_LINK_POOL] if len(d) > _LINK_POOL else np.arange(len(d))
        near = near[np.lexsort((near, d[near]))]
        cands = [placed[m] for m in near.tolist()]
        atoms = members[c]
        s = atoms[n_refs[atoms] == 1]
        t = atoms[n_refs[atoms] == 2]
        seeds = [r, int(s[0]) if s.size else None, int(t[0]) if t.size else None]
        _link_seeds(arr, seeds[0], seeds[1], seeds[2], cands, picker)
        if line is not None:
            line = _unbend(arr, line, placed, [v for v in seeds if v is not None], atoms, picker)
        placed.extend(atoms.tolist())
    return arr


def _collinear(atoms: np.ndarray, n_refs: np.ndarray, picker: _Picker) -> bool:
    """Whether all ``atoms`` of a component lie (within the tolerance) on the line of its first two seeds."""
    if atoms.size < 3:
        return True
    r0, s0 = (int(v) for v in sorted(atoms.tolist(), key=lambda v: n_refs[v])[:2])
    return all(_on_line(int(x), r0, s0, picker) for x in atoms.tolist() if x not in (r0, s0))


def _on_line(x: int, r0: int, s0: int, picker: _Picker) -> bool:
    return picker.badness(x, r0, s0) >= picker.cos_tol and picker.badness(x, s0, r0) >= picker.cos_tol


def _unbend(
    refs: np.ndarray, line: list[int], placed: list[int], seeds: list[int], atoms: np.ndarray, picker: _Picker
) -> list[int] | None:
    """Keep the build's frame defined while its atoms so far lie on one line.

    While every placed atom is on the line of the build's root ``R0`` and second
    seed ``S0``, no dihedral reference frame exists among them, so the first
    seed atom ``o`` of the new component that is off that line becomes the
    build's third seed ``(R0 or S0, the other, -1)`` and the old, collinear third
    seed (whose angle is straight, so its dihedral is free) takes ``o`` as its
    dihedral reference. Returns the line's ``[R0, S0]`` while the build stays on
    it, else ``None``.
    """
    build = placed + [int(v) for v in atoms.tolist()]
    n_refs = (refs[build] >= 0).sum(1)
    r0 = build[int(np.flatnonzero(n_refs == 0)[0])]
    second = np.flatnonzero(n_refs == 1)
    if not second.size:
        return [r0]
    s0 = build[int(second[0])]
    third = np.flatnonzero(n_refs == 2)
    off = [v for v in seeds if v not in (r0, s0) and not _on_line(v, r0, s0, picker)]
    if third.size and off:
        t0, o = build[int(third[0])], off[0]
        if o != t0 and _on_line(t0, r0, s0, picker):
            near, far = sorted((r0, s0), key=lambda v: picker.badness(o, v, r0 + s0 - v))
            refs[o] = [near, far, -1]
            refs[t0, 2] = o
    if all(_on_line(v, r0, s0, picker) for v in build if v not in (r0, s0)):
        return [r0, s0]
    return None


def _min_distance(a: np.ndarray, b: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """Distance from each point of ``a`` to the nearest point of ``b``."""
    out = np.full(len(a), np.inf)
    for k in range(0, len(b), chunk):
        d = np.linalg.norm(a[:, None, :] - b[None, k : k + chunk, :], axis=-1)
        out = np.minimum(out, d.min(1))
    return out


def _link_seeds(
    refs: np.ndarray, r: int, s: int | None, t: int | None, cands: list[int], picker: _Picker
) -> None:
    """Give the seed rows ``r``, ``s``, ``t`` references to placed atoms ``cands`` (nearest first)."""

    def pick(exclude: Sequence[int], triple: Callable[[int], tuple[int, int, int]]) -> int:
        best: tuple[float, int] | None = None
        for c in cands:
            if c in exclude:
                continue
            bad = picker.badness(*triple(c))
            if bad < picker.cos_tol:
                return c
            if best is None or bad < best[0]:
                best = (bad, c)
        assert best is not None  # the caller checks that enough candidates exist
        return best[1]

    k = len(cands)
    p = [cands[0]]
    if k >= 2:
        p.append(pick(p, lambda c: (r, p[0], c)))
    if k >= 3:
        p.append(pick(p, lambda c: (p[0], p[1], c)))
    refs[r] = p + [-1] * (3 - len(p))
    if s is not None:
        q = [pick([], lambda c: (s, r, c))]
        if k >= 2:
            q.append(pick(q, lambda c: (r, q[0], c)))
        refs[s] = [r, *q] + [-1] * (2 - len(q))
    if t is not None:
        b, a = int(refs[t, 0]), int(refs[t, 1])
        refs[t, 2] = pick([], lambda c: (b, a, c))


def nonbonded_references(refs: Any, connectivity: Any = None) -> np.ndarray:
    """Mask of the internal coordinates of a table that are not chemical ones.

    For row ``i`` with references ``(b, a, d)``, with "bonded" meaning a pair
    of ``connectivity``:

    * ``[i, 0]``, the bond ``|x_i - x_b|``: ``i-b`` is not bonded;
    * ``[i, 1]``, the angle ``i-b-a``: ``[i, 0]`` or ``b-a`` is not bonded;
    * ``[i, 2]``, the dihedral ``i-b-a-d``: ``[i, 1]``, or ``d`` is bonded
      neither to ``a`` (a proper torsion) nor to ``b`` (an improper one, such
      as the rigid offset between the hydrogens of a methyl group).

    Columns without a reference are ``False``. The links that
    :func:`link_components` adds between fragments are always marked: their
    values are distances and orientations between molecules, not bond lengths,
    bond angles or torsions (a flow or a force field should treat them as such).

    Args:
        refs: ``(N, 3)`` integer references (numpy, lists or torch), a
            :class:`~batched_nerf.ConstructionTable` (its ``refs``) or a
            :class:`~batched_nerf.ZMatrix` (its table's ``refs``, and its
            ``connectivity`` unless one is given).
        connectivity: ``(E, 2)`` bonded pairs; required unless ``refs`` is a
            ZMatrix that has a bond graph.

    Returns:
        ``(N, 3)`` boolean numpy array.

    Raises:
        TypeError: ``refs`` is none of the above (naming its type), or
            ``connectivity`` is missing.
        ValueError: malformed ``refs`` (not integers, ragged, not ``(N, 3)``)
            or ``connectivity``.

    Example:
        >>> import batched_nerf as bn
        >>> refs = [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [1, 0, 2]]   # a water and an ion
        >>> bn.nonbonded_references(refs, [(0, 1), (0, 2)]).tolist()[3]
        [True, True, True]
        >>> bn.nonbonded_references(bn.ConstructionTable(refs), [(0, 1), (0, 2)]).tolist()[3]
        [True, True, True]
    """
    # duck-typed: this ground layer cannot import the table or the ZMatrix
    if hasattr(refs, "table") and hasattr(refs, "connectivity"):  # a ZMatrix
        if connectivity is None:
            connectivity = refs.connectivity
        if connectivity is None:
            raise TypeError(
                "nonbonded_references needs connectivity, the (E, 2) bonded pairs: this ZMatrix has none"
            )
        refs = refs.table
    if hasattr(refs, "topology") and hasattr(refs.topology, "refs"):  # a ConstructionTable
        refs = refs.topology.refs
    if connectivity is None:
        raise TypeError("nonbonded_references needs connectivity, the (E, 2) bonded pairs")
    if hasattr(refs, "detach"):
        refs = refs.detach().cpu().numpy()
    try:
        arr = np.asarray(refs, dtype=np.int64)
    except (TypeError, ValueError) as e:
        kind = TypeError if isinstance(e, TypeError) else ValueError
        raise kind(
            "refs must be (N, 3) integer references, a ConstructionTable or a ZMatrix, "
            f"got {type(refs).__name__}"
        ) from None
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"refs must have shape (N, 3), got {tuple(arr.shape)}")
    n = len(arr)
    _, pairs = _adjacency(connectivity, n)
    keys = np.sort(np.concatenate([pairs[:, 0] * n + pairs[:, 1], pairs[:, 1] * n + pairs[:, 0]]))

    def bonded(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        ok = (x >= 0) & (y >= 0)
        code = np.where(ok, x * n + y, -1)
        pos = np.clip(np.searchsorted(keys, code), 0, max(len(keys) - 1, 0))
        return ok & (keys[pos] == code) if len(keys) else np.zeros(len(x), dtype=bool)

    i = np.arange(n)
    b, a, d = arr[:, 0], arr[:, 1], arr[:, 2]
    m0 = (b >= 0) & ~bonded(i, b)
    m1 = (a >= 0) & (m0 | ~bonded(b, a))
    m2 = (d >= 0) & (m1 | ~(bonded(a, d) | bonded(b, d)))
    return np.stack([m0, m1, m2], axis=1)


# ------------------------------------------------------------- entry points
def refs_from_connectivity(
    connectivity: Iterable[Sequence[int]] | np.ndarray,
    n_atoms: int,
    *,
    xyz: Any = None,
    root: int | None = None,
    link_fragments: bool | None = None,
) -> AutoRefs:
    """Construction table (as arrays) for a molecule or system given by its bond graph.

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
    three atoms, does the third seed take a non-bonded bond reference.

    With coordinates, the fragments are then linked into one build
    (:func:`link_components`): each further fragment's seed rows reference the
    nearest atoms already placed, so that one seed triple describes the whole
    system (a dimer, a salt, a solvated molecule) and the relative placement
    of the fragments is part of the internal coordinates. ``nonbonded`` marks
    those links. With ``link_fragments=False`` every fragment keeps its own
    seed triple (molecules that move independently, e.g. for packing).

    Args:
        connectivity: ``(E, 2)`` integer pairs ``(i, j)`` of bonded atoms (any
            order, duplicates allowed; numpy, lists or torch).
        n_atoms: number of atoms ``N``; atoms in no pair are 1-atom fragments.
        xyz: optional ``(N, 3)`` coordinates (numpy or torch). When given, angle
            and dihedral references forming a triple within
            :data:`LINEAR_TOLERANCE_DEG` (5 deg) of 0 or 180 deg are avoided
            (``i-b-a`` for the angle, ``b-a-d`` for the dihedral); if a fragment
            is entirely linear the least linear choice is kept.
        root: optional atom placed at the origin (its fragment is seeded from it
            and placed first); other fragments use their graph centre.
        link_fragments: join the fragments into one build; default: when ``xyz`` is given.

    Returns:
        :class:`AutoRefs` ``(refs, nonbonded, connectivity)``: ``(N, 3)`` int64
        references (one seed triple in all, or one per fragment when not
        linked), the ``(N, 3)`` boolean mask of :func:`nonbonded_references`,
        and the ``(E, 2)`` sorted unique bonded pairs.

    Raises:
        ValueError: for a negative ``n_atoms``, a pair index out of range or a
            self-bond, malformed ``connectivity``, ``xyz`` of the wrong shape or
            not finite, two atoms closer than ``1e-4`` (naming them), ``root``
            out of range, or ``link_fragments=True`` without ``xyz``.

    Example:
        >>> from batched_nerf._autotable import refs_from_connectivity
        >>> ethane = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 5), (1, 6), (1, 7)]
        >>> refs_from_connectivity(ethane, 8).refs.tolist()
        [[1, -1, -1], [-1, -1, -1], [0, 1, 5], [0, 1, 2], [0, 1, 2], [1, 0, -1], [1, 0, 5], [1, 0, 5]]
        >>> refs_from_connectivity(ethane, 8, root=0).refs.tolist()[1:4]
        [[0, -1, -1], [0, 1, -1], [0, 1, 2]]
    """
    if isinstance(n_atoms, bool) or not isinstance(n_atoms, (int, np.integer)) or n_atoms < 0:
        raise ValueError(f"n_atoms must be a non-negative integer, got {n_atoms!r}")
    n_atoms = int(n_atoms)
    adj, pairs = _adjacency(connectivity, n_atoms)
    coords = None if xyz is None else as_xyz(xyz, n_atoms)
    if root is not None and (isinstance(root, bool) or not 0 <= int(root) < n_atoms):
        raise ValueError(f"root must be an atom index in [0, {n_atoms - 1}], got {root!r}")
    start = None if root is None else int(root)
    link = coords is not None if link_fragments is None else bool(link_fragments)
    if link and coords is None:
        raise ValueError(
            "link_fragments=True needs xyz: fragments are linked to the nearest atoms already placed"
        )
    if coords is not None:
        check_not_coincident(coords, np.full(n_atoms, COINCIDENT_DISTANCE / 2))
    refs = _refs_from_adjacency(adj, n_atoms, coords, start, LINEAR_TOLERANCE_DEG)
    if link:
        assert coords is not None
        refs = link_components(refs, coords, first=start)
    return AutoRefs(refs, nonbonded_references(refs, pairs), pairs)


def refs_from_xyz(
    xyz: Any,
    elements: Sequence[str],
    *,
    scale: float = DEFAULT_SCALE,
    link_fragments: bool = True,
) -> AutoRefs:
    """Construction table (as arrays) from coordinates: perceive bonds, then :func:`refs_from_connectivity`.

    Two atoms are bonded when their distance is below ``scale`` times the sum
    of their covalent radii (:func:`~batched_nerf._perceive.perceive_connectivity`).
    The coordinates are also used to avoid near-linear reference triples and,
    by default, to link the fragments (molecules, ions) into one build.

    Args:
        xyz: ``(N, 3)`` coordinates in Angstrom (numpy or torch; one conformation).
        elements: ``N`` element symbols, case-insensitive; ``D``/``T`` count as
            hydrogen, dummy atoms ``X`` are never bonded.
        scale: tolerance factor on the sum of covalent radii (default 1.3).
        link_fragments: join the fragments into one build (default) or give
            each its own seed triple.

    Returns:
        :class:`AutoRefs` ``(refs, nonbonded, connectivity)``.

    Raises:
        ValueError: for an unknown element, a length mismatch between ``xyz``
            and ``elements``, a wrong shape, non-finite coordinates, or
            coincident atoms (naming them).

    Warns:
        UserWarning: when most atoms have no bond (coordinates in bohr?).

    Example:
        >>> from batched_nerf._autotable import refs_from_xyz
        >>> water = [[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0]]
        >>> refs_from_xyz(water, ["O", "H", "H"]).refs.tolist()
        [[-1, -1, -1], [0, -1, -1], [0, 1, -1]]
    """
    coords = as_xyz(xyz)
    pairs = perceive_connectivity(coords, elements, scale=scale)
    return refs_from_connectivity(pairs, len(coords), xyz=coords, link_fragments=link_fragments)
