"""Linking the fragments of a table into one build: each further fragment references nearby placed atoms.

`link_components` places the components one after the other, outwards
from the first (shell by shell), and gives the seed rows of each references to
the nearest atoms placed before it. Each component's links depend only on the
atoms placed before it, so after the first few (while the build's frame is not
yet settled) all components are linked at once in numpy: the nearest earlier
atoms come from a cell list (`pairs_within`),
the distance of each fragment to the first from a KD-tree (scipy, when
importable) or blocks of numpy, never from all pairs at once, and the result is
the same as linking them one by one.

Also here: component labels in numpy and the reference picker that avoids
near-linear triples (shared with `batched_nerf.topology.auto`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .perceive import _CHUNK, _kdtree, as_xyz
from .perceive import pairs_within as _cell_pairs_within

__all__ = ["LINEAR_TOLERANCE_DEG", "badness", "components", "link_components", "ref_components"]

#: Reference triples whose angle lies within this many degrees of 0 or 180 are avoided.
LINEAR_TOLERANCE_DEG = 5.0

#: How many of the nearest placed atoms a fragment link considers.
_LINK_POOL = 64

#: How many of those the vectorised linking looks at first (the rest only when none of these will do).
_LINK_FEW = 4

#: Link every component one by one (the reference the vectorised linking is tested against).
_SEQUENTIAL = False


class _Picker:
    """Chooses references, refusing near-linear triples when coordinates are known."""

    def __init__(self, xyz: np.ndarray | None, tol_deg: float) -> None:
        self.coords = xyz
        self._xyz: list[list[float]] | None = None
        self.cos_tol = math.cos(math.radians(tol_deg))

    def badness(self, p: int, q: int, r: int) -> float:
        """``|cos|`` of the angle p-q-r at q (1 = linear); 0 without coordinates."""
        if self.coords is None:
            return 0.0
        if self._xyz is None:  # plain floats: faster than numpy for one triple at a time
            self._xyz = self.coords.tolist()
        (px, py, pz), (qx, qy, qz), (rx, ry, rz) = self._xyz[p], self._xyz[q], self._xyz[r]
        ux, uy, uz, vx, vy, vz = px - qx, py - qy, pz - qz, rx - qx, ry - qy, rz - qz
        norm = math.sqrt((ux * ux + uy * uy + uz * uz) * (vx * vx + vy * vy + vz * vz))
        if norm < 1e-16:
            return 1.0
        return abs(ux * vx + uy * vy + uz * vz) / norm

    def ok(self, p: int, q: int, r: int) -> bool:
        return self.badness(p, q, r) < self.cos_tol


def components(n: int, i: np.ndarray, j: np.ndarray) -> tuple[np.ndarray, int]:
    """Connected component of each of ``n`` atoms joined by edges ``i-j``, numbered by first atom.

    Hooking and pointer jumping in numpy (no Python loop over atoms): every atom
    ends labelled with the smallest atom index of its component.
    """
    label = np.arange(n, dtype=np.int64)
    while len(i):
        li, lj = label[i], label[j]
        if (li == lj).all():
            break
        low = np.minimum(li, lj)
        np.minimum.at(label, li, low)
        np.minimum.at(label, lj, low)
        while True:
            jumped = label[label]
            if (jumped == label).all():
                break
            label = jumped
    first, comp = np.unique(label, return_inverse=True)
    return comp.reshape(-1).astype(np.int64), len(first)


def ref_components(refs: np.ndarray) -> tuple[np.ndarray, int]:
    """Components of a table's atoms (linked by references), numbered by first atom, and their count."""
    rows, cols = np.nonzero(refs >= 0)
    return components(len(refs), rows.astype(np.int64), refs[rows, cols].astype(np.int64))


def badness(xyz: np.ndarray, p: Any, q: Any, r: Any) -> np.ndarray:
    """``|cos|`` of the angles ``p-q-r`` at ``q`` (index arrays, broadcast); 1 for a zero-length arm.

    The same floating-point operations, in the same order, as `_Picker.badness`.
    """
    u = xyz[p] - xyz[q]
    v = xyz[r] - xyz[q]
    u, v = np.broadcast_arrays(u, v)
    dot = u[..., 0] * v[..., 0] + u[..., 1] * v[..., 1] + u[..., 2] * v[..., 2]
    uu = u[..., 0] * u[..., 0] + u[..., 1] * u[..., 1] + u[..., 2] * u[..., 2]
    vv = v[..., 0] * v[..., 0] + v[..., 1] * v[..., 1] + v[..., 2] * v[..., 2]
    norm = np.sqrt(uu * vv)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(norm < 1e-16, 1.0, np.abs(dot) / norm)


class _Groups:
    """The atoms of each component, in index order, as slices of one array (no list of arrays)."""

    def __init__(self, comp: np.ndarray, n_comp: int) -> None:
        self.atoms = np.argsort(comp, kind="stable")
        self.sizes = np.bincount(comp, minlength=n_comp)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)])

    def __getitem__(self, c: int) -> np.ndarray:
        return self.atoms[self.starts[c] : self.starts[c + 1]]

    def first_with(self, mask: np.ndarray, n_comp: int, comp: np.ndarray) -> np.ndarray:
        """Per component, its first atom (in index order) where ``mask`` holds, or -1."""
        out = np.full(n_comp, -1, dtype=np.int64)
        atoms = self.atoms[mask[self.atoms]]
        c, at = np.unique(comp[atoms], return_index=True)
        out[c] = atoms[at]
        return out


def _bent(
    groups: _Groups, comp: np.ndarray, n_refs: np.ndarray, xyz: np.ndarray, cos_tol: float
) -> np.ndarray:
    """Per component: whether its atoms are not all (within the tolerance) on the line of its 2 seeds."""
    n_comp = len(groups.sizes)
    order = np.lexsort((np.arange(len(comp)), n_refs, comp))  # by component, fewest references first
    big = np.flatnonzero(groups.sizes >= 3)
    r0 = np.full(n_comp, -1, dtype=np.int64)
    s0 = np.full(n_comp, -1, dtype=np.int64)
    r0[big] = order[groups.starts[big]]
    s0[big] = order[groups.starts[big] + 1]
    x = np.flatnonzero(groups.sizes[comp] >= 3)
    c = comp[x]
    other = (x != r0[c]) & (x != s0[c])
    x, c = x[other], c[other]
    on = (badness(xyz, x, r0[c], s0[c]) >= cos_tol) & (badness(xyz, x, s0[c], r0[c]) >= cos_tol)
    bent = np.zeros(n_comp, dtype=bool)
    bent[c[~on]] = True
    return bent


def _nearest_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance from each point of ``a`` to the nearest point of ``b`` (KD-tree or blocked numpy).

    Both take a few nearest candidates and measure them as ``|a - b|``, so both
    give the same, exact distances.
    """
    if not len(a):
        return np.zeros(0)
    tree = _kdtree()
    if tree is not None:
        k = min(4, len(b))  # a few, re-measured below, so that both backends agree to the last bit
        _, idx = tree(b).query(a, k=k)
        idx = idx.reshape(len(a), k)
        return np.linalg.norm(a[:, None, :] - b[idx], axis=-1).min(1)
    # numpy: blocks of squared distances by matrix product pick a few candidates, measured as above
    out = np.empty(len(a))
    k = min(4, len(b))
    b2 = (b * b).sum(1)
    step = max(1, _CHUNK // max(len(b), 1))
    for lo in range(0, len(a), step):
        rows = a[lo : lo + step]
        d2 = (rows * rows).sum(1)[:, None] + b2[None, :] - 2.0 * (rows @ b.T)
        idx = (
            np.argpartition(d2, k - 1, axis=1)[:, :k]
            if k < len(b)
            else np.broadcast_to(np.arange(k), d2.shape)
        )
        out[lo : lo + step] = np.linalg.norm(rows[:, None, :] - b[idx], axis=-1).min(1)
    return out


def _nearest_earlier(
    xyz: np.ndarray, roots: np.ndarray, rank: np.ndarray, pos: np.ndarray, need: np.ndarray
) -> np.ndarray:
    """``(K, max(need))`` the ``need[k]`` atoms nearest to ``roots[k]`` among those of lower rank.

    Ordered by distance, then by placement position ``pos`` (the order of the
    sequential build); ``-1`` pads. Only nearby atoms are ever measured: those
    within a radius (cell list), the radius growing for the roots that have
    not found enough yet. (A cell list beats scipy's k-nearest query here: the
    rank filter would discard half of what the tree returns; for 4,000 waters
    the 16 nearest leave a tenth of the roots short, at about the cost of the
    cell list's first pass.)
    """
    width = int(need.max()) if len(need) else 0
    out = np.full((len(roots), width), -1, dtype=np.int64)
    if not len(roots):
        return out
    lo, hi = xyz.min(0), xyz.max(0)
    volume = float(np.prod(hi - lo + 1.0))
    radius = max(1.0, (3.0 * 4 * width * volume / (4.0 * math.pi * len(xyz))) ** (1.0 / 3.0))
    todo = np.arange(len(roots))
    while todo.size:
        mine = rank[roots[todo]]
        ia, ib, dist = _cell_pairs_within(
            xyz[roots[todo]], xyz, radius, lambda i, j, mine=mine: rank[j] < mine[i]
        )
        o = np.lexsort((pos[ib], dist, ia))
        ia, ib = ia[o], ib[o]
        count = np.bincount(ia, minlength=len(todo))
        done = count >= need[todo]
        within = np.arange(len(ia)) - (np.cumsum(count) - count)[ia]
        sel = done[ia] & (within < need[todo][ia])
        out[todo[ia[sel]], within[sel]] = ib[sel]
        # most roots short of atoms have found some: a little more reach will do (all of them, if any
        # found none: the radius doubles); the search is exact at any radius, only its cost changes
        radius *= 1.3 if count[~done].all() else 2.0
        todo = todo[~done]
    return out


def _pick(
    xyz: np.ndarray,
    cands: np.ndarray,
    p: np.ndarray,
    q: np.ndarray,
    exclude: list[np.ndarray],
    cos_tol: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised ``pick`` of `_link_seeds`: per row the first candidate ``c``, ``p-q-c`` not linear.

    Returns the choice and whether it is uncertain (no good candidate among
    these, while the sequential build would have looked at more).
    """
    valid = cands >= 0
    for e in exclude:
        valid &= cands != e[:, None]
    bad = badness(xyz, p[:, None], q[:, None], np.where(cands >= 0, cands, 0))
    good = valid & (bad < cos_tol)
    has = good.any(1)
    choice = np.where(has, np.argmax(good, 1), np.argmin(np.where(valid, bad, np.inf), 1))
    return cands[np.arange(len(cands)), choice], ~has


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
    triple is within `LINEAR_TOLERANCE_DEG` of 0 or 180 deg (the least
    linear choice when no other exists):

    * root ``r``: ``(p1, p2, p3)``, ``p1`` the placed atom nearest to ``r``;
    * second seed ``s = (r, -1, -1)``: ``(r, q1, q2)``;
    * third seed ``t = (b, a, -1)``: ``(b, a, q)``.

    Every other row is kept. While all atoms placed so far lie on one line
    (linear molecules, single atoms) they define no frame for a dihedral; then
    the first seed atom off that line becomes the build's third seed instead.
    The new references are not chemical bonds (see
    [`nonbonded_references`][batched_nerf.nonbonded_references]).
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
        >>> from batched_nerf.topology.auto import link_components
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
    comp, n_comp = ref_components(arr)
    groups = _Groups(comp, n_comp)
    is_fixed = np.zeros(n, dtype=bool)
    is_fixed[np.asarray(list(fixed) if fixed is not None else [], dtype=np.int64)] = True
    anchored = np.zeros(n_comp, dtype=bool)
    anchored[comp[is_fixed]] = True
    seeded = np.flatnonzero(~anchored)
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
        bent = _bent(groups, comp, n_refs, coords, picker.cos_tol)
        largest = int(seeded[np.lexsort((seeded, -groups.sizes[seeded], ~bent[seeded]))[0]])
        start = int(comp[first]) if first is not None and not anchored[comp[first]] else largest
        seeded = seeded[seeded != start]
        placed_atoms = groups[start]
        if not bent[start]:
            line = [int(v) for v in sorted(placed_atoms.tolist(), key=lambda v: n_refs[v])[:2]]
    if not seeded.size:
        return arr
    root_of = groups.first_with(n_refs == 0, n_comp, comp)
    if (root_of[seeded] < 0).any():
        c = int(seeded[np.argmax(root_of[seeded] < 0)])
        raise ValueError(f"row {int(groups[c][0])}: its component has no seed row (-1, -1, -1)")
    # shell by shell outwards from the first component: the links stay short and the build shallow
    dmin = _nearest_distance(coords[root_of[seeded]], coords[placed_atoms])
    seq = seeded[np.lexsort((np.arange(len(seeded)), dmin))]
    # the sequential build: placed atoms first (rank 0), then each component in turn (rank k + 1)
    comp_rank = np.full(n_comp, n_comp + 1, dtype=np.int64)
    comp_rank[seq] = np.arange(1, len(seq) + 1)
    rank = comp_rank[comp]
    rank[placed_atoms] = 0
    build = np.lexsort((np.arange(n), rank))[: len(placed_atoms) + int(groups.sizes[seq].sum())]
    pos = np.full(n, n, dtype=np.int64)
    pos[build] = np.arange(len(build))
    n_before = len(placed_atoms) + np.concatenate([[0], np.cumsum(groups.sizes[seq])[:-1]])
    second_of = groups.first_with(n_refs == 1, n_comp, comp)
    third_of = groups.first_with(n_refs == 2, n_comp, comp)
    k = 0  # one by one while the frame is not settled yet
    while k < len(seq) and (_SEQUENTIAL or line is not None or n_before[k] < 3):
        placed = build[: n_before[k]]
        _link_one(arr, int(seq[k]), coords, placed, root_of, second_of, third_of, picker)
        if line is not None:
            seeds = [int(v) for v in (root_of[seq[k]], second_of[seq[k]], third_of[seq[k]]) if v >= 0]
            line = _unbend(arr, line, placed.tolist(), seeds, groups[int(seq[k])], picker)
        k += 1
    _link_rest(arr, seq[k:], coords, rank, pos, n_before[k:], root_of, second_of, third_of, picker)
    return arr


def _link_one(
    refs: np.ndarray,
    c: int,
    xyz: np.ndarray,
    placed: np.ndarray,
    root_of: np.ndarray,
    second_of: np.ndarray,
    third_of: np.ndarray,
    picker: _Picker,
) -> None:
    """Link component ``c`` to the ``placed`` atoms (in build order) as the sequential build does."""
    r = int(root_of[c])
    d = np.linalg.norm(xyz[placed] - xyz[r], axis=1)
    near = np.argpartition(d, _LINK_POOL)[:_LINK_POOL] if len(d) > _LINK_POOL else np.arange(len(d))
    near = near[np.lexsort((near, d[near]))]
    s, t = int(second_of[c]), int(third_of[c])
    _link_seeds(refs, r, s if s >= 0 else None, t if t >= 0 else None, placed[near].tolist(), picker)


def _link_rest(
    refs: np.ndarray,
    seq: np.ndarray,
    xyz: np.ndarray,
    rank: np.ndarray,
    pos: np.ndarray,
    n_before: np.ndarray,
    root_of: np.ndarray,
    second_of: np.ndarray,
    third_of: np.ndarray,
    picker: _Picker,
) -> None:
    """Link the components ``seq`` (the build's frame is settled, >= 3 atoms placed) all at once.

    Each component's links depend only on the atoms placed before it, so all are
    chosen together from the `_LINK_FEW` nearest earlier atoms; the rare
    component for which none of those will do then from the `_LINK_POOL`
    nearest, all that the sequential build (`_link_one`) looks at.
    """
    if not len(seq):
        return
    few = np.minimum(_LINK_FEW, n_before)
    unsure = _link_vectorised(refs, seq, xyz, rank, pos, few, root_of, second_of, third_of, picker.cos_tol)
    # the rare component for which none of the few nearest will do: all the sequential build looks at
    again = np.flatnonzero(unsure & (few < np.minimum(_LINK_POOL, n_before)))
    if again.size:
        pool = np.minimum(_LINK_POOL, n_before[again])
        _link_vectorised(refs, seq[again], xyz, rank, pos, pool, root_of, second_of, third_of, picker.cos_tol)


def _link_vectorised(
    refs: np.ndarray,
    seq: np.ndarray,
    xyz: np.ndarray,
    rank: np.ndarray,
    pos: np.ndarray,
    need: np.ndarray,
    root_of: np.ndarray,
    second_of: np.ndarray,
    third_of: np.ndarray,
    tol: float,
) -> np.ndarray:
    """`_link_seeds` for many components at once, each from its ``need`` nearest earlier atoms.

    Returns where that was not enough to be sure (no good choice among them).
    """
    r, s, t = root_of[seq], second_of[seq], third_of[seq]
    cands = _nearest_earlier(xyz, r, rank, pos, need)
    p0 = cands[:, 0]
    p1, u1 = _pick(xyz, cands, r, p0, [p0], tol)
    p2, u2 = _pick(xyz, cands, p0, p1, [p0, p1], tol)
    refs[r] = np.stack([p0, p1, p2], axis=1)
    has_s, has_t = s >= 0, t >= 0
    s_, t_ = np.where(has_s, s, r), np.where(has_t, t, r)  # placeholders where there is no such seed
    q0, u3 = _pick(xyz, cands, s_, r, [], tol)
    q1, u4 = _pick(xyz, cands, r, q0, [q0], tol)
    b, a = refs[t_, 0], refs[t_, 1]
    d, u5 = _pick(xyz, cands, np.where(has_t, b, r), np.where(has_t, a, p0), [], tol)
    refs[s[has_s]] = np.stack([r, q0, q1], axis=1)[has_s]
    refs[t[has_t], 2] = d[has_t]
    return u1 | u2 | (has_s & (u3 | u4)) | (has_t & u5)


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
