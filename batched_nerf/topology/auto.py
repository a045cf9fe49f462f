"""Automatic construction tables (plain numpy arrays) from a bond graph or from coordinates.

`refs_from_connectivity` turns a bond graph (``connectivity``: pairs of
bonded atoms) into a chemically sensible Z-matrix: every atom is placed from a
bonded neighbour, at an angle to a neighbour of that atom, and with a proper
torsion along bonds where one exists. Further branches around the same bond
(the 2nd and 3rd hydrogen of a methyl group) use an already placed sibling as
dihedral reference, so that their dihedrals are the rigid ~+-120 deg offsets
rather than copies of the same torsion. `refs_from_xyz` perceives the
bonds from covalent radii first ([`perceive_connectivity`][batched_nerf.perceive_connectivity]).

When coordinates are known, disconnected fragments (the molecules of a dimer,
the ions of a salt, solvent molecules) are *linked* into one build by
`link_components`: the first atoms of each further fragment reference
the nearest atoms already placed. Those references are not chemical bonds;
[`nonbonded_references`][batched_nerf.nonbonded_references] marks them (and any other non-bonded reference).

At scale (solvent boxes): the fragments of up to three atoms (water, ions)
get their rows all at once in numpy, exactly the rows the per-atom rules give
them; larger fragments go atom by atom (about 50-80 us per atom). Components,
bond pairs and the non-bonded mask are numpy throughout; the linking lives in
`batched_nerf.topology.link`, bond perception in `batched_nerf.topology.perceive`.

This module works on numpy arrays only; [`ConstructionTable`][batched_nerf.ConstructionTable]
wraps its results (``ConstructionTable.from_connectivity``, ``from_xyz``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .link import LINEAR_TOLERANCE_DEG, _Picker, components, link_components
from .perceive import COVALENT_RADII, DEFAULT_SCALE, as_xyz, check_not_coincident, perceive_connectivity

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

#: Fragments of up to this many atoms get their rows all at once in numpy (the same rows as atom by atom).
_SMALL = 3

#: Atoms closer than this (in the unit of ``xyz``) are rejected as coincident.
COINCIDENT_DISTANCE = 1e-4


class AutoRefs(NamedTuple):
    """An automatic construction table as plain arrays.

    Attributes:
        refs: ``(N, 3)`` ``np.int64`` references ``(bond, angle, dihedral)``, ``-1`` for none.
        nonbonded: ``(N, 3)`` boolean mask of the internal coordinates that are
            not chemical ones (see [`nonbonded_references`][batched_nerf.nonbonded_references]), among them
            every link between fragments.
        connectivity: ``(E, 2)`` ``np.int64`` bonded pairs ``i < j`` (sorted, unique)
            that the table was built from.
    """

    refs: np.ndarray
    nonbonded: np.ndarray
    connectivity: np.ndarray


def _bond_pairs(connectivity: Any, n_atoms: int) -> np.ndarray:
    """Checked ``(E, 2)`` ``np.int64`` bonded pairs ``i < j``, sorted and unique."""
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
    arr = arr.astype(np.int64)
    out = (arr < 0) | (arr >= n_atoms)
    wrong = out.any(1) | (arr[:, 0] == arr[:, 1])
    if wrong.any():
        k = int(np.argmax(wrong))
        i, j = (int(v) for v in arr[k])
        if out[k].any():
            x = i if out[k, 0] else j
            raise ValueError(
                f"connectivity pair {k} ({i}, {j}): atom index {x} out of range [0, {n_atoms - 1}]"
            )
        raise ValueError(f"connectivity pair {k} ({i}, {j}): an atom cannot be bonded to itself")
    code = np.unique(np.minimum(arr[:, 0], arr[:, 1]) * n_atoms + np.maximum(arr[:, 0], arr[:, 1]))
    return np.stack([code // max(n_atoms, 1), code % max(n_atoms, 1)], axis=1).reshape(-1, 2)


def _adjacency(pairs: np.ndarray, n_atoms: int, atoms: np.ndarray) -> list[list[int]]:
    """Sorted neighbour lists of ``atoms`` (the other atoms get an empty list, never used)."""
    src = np.concatenate([pairs[:, 0], pairs[:, 1]])
    dst = np.concatenate([pairs[:, 1], pairs[:, 0]])
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    start = np.searchsorted(src, atoms, "left").tolist()
    stop = np.searchsorted(src, atoms, "right").tolist()
    dst_list = dst.tolist()
    adj: list[list[int]] = [[]] * n_atoms  # shared empty list: read only
    for a, lo, hi in zip(atoms.tolist(), start, stop):
        adj[a] = dst_list[lo:hi]
    return adj


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


def _refs_from_pairs(
    pairs: np.ndarray, n_atoms: int, xyz: np.ndarray | None, root: int | None, tol_deg: float
) -> np.ndarray:
    """Per-fragment references (one seed triple each) for the bond graph ``pairs``.

    Fragments of one, two or three atoms (ions, solvent such as water) are done
    all at once in numpy, with exactly the rows the general, per-atom rules
    below give them; larger fragments (and the one of ``root``) atom by atom.
    """
    refs = np.full((n_atoms, 3), -1, dtype=np.int64)
    comp, n_comp = components(n_atoms, pairs[:, 0], pairs[:, 1])
    sizes = np.bincount(comp, minlength=n_comp)
    size = sizes[comp]
    atoms = np.argsort(comp, kind="stable")  # by fragment, in index order
    general = size[atoms] > _SMALL
    if root is not None:
        general |= comp[atoms] == comp[root]
    # two atoms a < b: the centre is b, so a gets (b, -1, -1)
    two = atoms[(size[atoms] == 2) & ~general].reshape(-1, 2)
    refs[two[:, 0], 0] = two[:, 1]
    # three atoms x < y < z: the root is the middle of the chain (y of a triangle),
    # the other two follow in index order: (root, -1, -1) and (root, second, -1)
    three = atoms[(size[atoms] == 3) & ~general].reshape(-1, 3)
    if len(three):
        degree = np.bincount(pairs.reshape(-1), minlength=n_atoms)[three]
        middle = np.where((degree == 2).all(1), 1, np.argmax(degree == 2, 1))
        rows = np.arange(len(three))
        centre = three[rows, middle]
        others = np.sort(np.where(np.arange(3) == middle[:, None], n_atoms, three), axis=1)[:, :2]
        refs[others[:, 0], 0] = centre
        refs[others[:, 1], 0] = centre
        refs[others[:, 1], 1] = others[:, 0]
    rest = atoms[general]
    if not rest.size:
        return refs
    adj = _adjacency(pairs, n_atoms, rest)
    picker = _Picker(xyz, tol_deg)
    firsts = rest[np.concatenate([[True], comp[rest][1:] != comp[rest][:-1]])].tolist()
    if root is not None:
        firsts = [root] + [f for f in firsts if comp[f] != comp[root]]
    for start in firsts:
        centre, members = (start, sorted(_bfs(adj, start))) if start == root else _centre(adj, start)
        _place_component(adj, centre, members, refs, picker)
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
    `link_components` adds between fragments are always marked: their
    values are distances and orientations between molecules, not bond lengths,
    bond angles or torsions (a flow or a force field should treat them as such).

    Args:
        refs: ``(N, 3)`` integer references (numpy, lists or torch), a
            [`ConstructionTable`][batched_nerf.ConstructionTable] (its ``refs``) or a
            [`ZMatrix`][batched_nerf.ZMatrix] (its table's ``refs``, and its
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
    pairs = _bond_pairs(connectivity, n)
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
    (`link_components`): each further fragment's seed rows reference the
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
            `LINEAR_TOLERANCE_DEG` (5 deg) of 0 or 180 deg are avoided
            (``i-b-a`` for the angle, ``b-a-d`` for the dihedral); if a fragment
            is entirely linear the least linear choice is kept.
        root: optional atom placed at the origin (its fragment is seeded from it
            and placed first); other fragments use their graph centre.
        link_fragments: join the fragments into one build; default: when ``xyz`` is given.

    Returns:
        `AutoRefs` ``(refs, nonbonded, connectivity)``: ``(N, 3)`` int64
        references (one seed triple in all, or one per fragment when not
        linked), the ``(N, 3)`` boolean mask of [`nonbonded_references`][batched_nerf.nonbonded_references],
        and the ``(E, 2)`` sorted unique bonded pairs.

    Raises:
        ValueError: for a negative ``n_atoms``, a pair index out of range or a
            self-bond, malformed ``connectivity``, ``xyz`` of the wrong shape or
            not finite, two atoms closer than ``1e-4`` (naming them), ``root``
            out of range, or ``link_fragments=True`` without ``xyz``.

    Example:
        >>> from batched_nerf.topology.auto import refs_from_connectivity
        >>> ethane = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 5), (1, 6), (1, 7)]
        >>> refs_from_connectivity(ethane, 8).refs.tolist()
        [[1, -1, -1], [-1, -1, -1], [0, 1, 5], [0, 1, 2], [0, 1, 2], [1, 0, -1], [1, 0, 5], [1, 0, 5]]
        >>> refs_from_connectivity(ethane, 8, root=0).refs.tolist()[1:4]
        [[0, -1, -1], [0, 1, -1], [0, 1, 2]]
    """
    if isinstance(n_atoms, bool) or not isinstance(n_atoms, (int, np.integer)) or n_atoms < 0:
        raise ValueError(f"n_atoms must be a non-negative integer, got {n_atoms!r}")
    n_atoms = int(n_atoms)
    pairs = _bond_pairs(connectivity, n_atoms)
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
    return _auto_refs(pairs, n_atoms, coords, start, link)


def _auto_refs(
    pairs: np.ndarray, n_atoms: int, coords: np.ndarray | None, root: int | None, link: bool
) -> AutoRefs:
    refs = _refs_from_pairs(pairs, n_atoms, coords, root, LINEAR_TOLERANCE_DEG)
    if link:
        assert coords is not None
        refs = link_components(refs, coords, first=root)
    return AutoRefs(refs, nonbonded_references(refs, pairs), pairs)


def refs_from_xyz(
    xyz: Any,
    elements: Sequence[str],
    *,
    scale: float = DEFAULT_SCALE,
    link_fragments: bool = True,
) -> AutoRefs:
    """Construction table (as arrays) from coordinates: perceive bonds, then `refs_from_connectivity`.

    Two atoms are bonded when their distance is below ``scale`` times the sum
    of their covalent radii ([`perceive_connectivity`][batched_nerf.perceive_connectivity]).
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
        `AutoRefs` ``(refs, nonbonded, connectivity)``.

    Raises:
        ValueError: for an unknown element, a length mismatch between ``xyz``
            and ``elements``, a wrong shape, non-finite coordinates, or
            coincident atoms (naming them).

    Warns:
        UserWarning: when most atoms have no bond (coordinates in bohr?).

    Example:
        >>> from batched_nerf.topology.auto import refs_from_xyz
        >>> water = [[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0]]
        >>> refs_from_xyz(water, ["O", "H", "H"]).refs.tolist()
        [[-1, -1, -1], [0, -1, -1], [0, 1, -1]]
    """
    coords = as_xyz(xyz)
    # perception has refused atoms closer than 0.4 x the sum of their radii (>= 1e-4): no second check
    pairs = perceive_connectivity(coords, elements, scale=scale)
    return _auto_refs(pairs, len(coords), coords, None, bool(link_fragments))
