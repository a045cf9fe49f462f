"""Static topology of a construction table: row checks, components, levels, seeds.

The ground layer of the package: numpy only, no torch, nothing imported from
the rest of the package. :class:`~batched_nerf.ConstructionTable` analyses its
rows once with :func:`analyse` and every engine planner, the pose and log-det
code and the losses read the resulting :class:`Topology` (``table.topology``)
instead of re-deriving it.

Row kinds, by the number of references a row has: ``ROOT`` ``(-1, -1, -1)``,
``SECOND`` ``(b, -1, -1)``, ``THIRD`` ``(b, a, -1)`` and ``FULL`` ``(b, a, d)``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FULL",
    "ROOT",
    "SECOND",
    "THIRD",
    "Topology",
    "analyse",
    "as_index_array",
    "build_order",
    "components",
]

#: Row kinds, by number of references: root, second and third seed atom,
#: fully referenced atom.
ROOT, SECOND, THIRD, FULL = 0, 1, 2, 3


def as_index_array(values: Any, what: str) -> np.ndarray:
    """Integer array-likes (lists, numpy, torch tensors) as ``np.int64``.

    Raises:
        ValueError: ragged nesting, or a non-integer dtype (booleans included).
    """
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().cpu().numpy()
    try:
        arr = np.asarray(values)
    except ValueError:  # ragged nested sequences
        raise ValueError(
            f"{what} must have shape (N, 3), got rows of different lengths"
            if what == "refs"
            else f"{what} must be a 1-D sequence of atom indices, got ragged nesting"
        ) from None
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or (arr.size == 0 and arr.dtype == np.float64)
    ):
        raise ValueError(f"{what} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class Topology:
    """Read-only analysis of a construction table (``table.topology``).

    Every array is a read-only numpy array; every count a plain Python ``int``
    (fixed when the table is made, so that dispatch decisions never depend on
    tensor data, also under ``torch.compile``).

    Attributes:
        refs: ``(N, 3)`` ``int64`` rows ``(bond_ref, angle_ref, dihedral_ref)``, ``-1`` for none.
        fixed: ``(F,)`` ``int64`` fixed atoms, in ``fixed_xyz`` order.
        kind: ``(N,)`` ``int64`` number of references of each row (``ROOT`` ... ``FULL``).
        component: ``(N,)`` ``int64`` connected component of each atom.
        level: ``(N,)`` ``int64`` dependency level (0 for seed and fixed rows; a
            full row is one level above its deepest reference).
        order: ``(N,)`` ``int64`` the build order (:func:`build_order`): every
            reference comes before the rows that read it, lowest index first.
        seeded: ``(S,)`` ``int64`` components that are placed from seed rows (not anchored).
        seed_root, seed_second, seed_third: ``(S,)`` ``int64`` root, second and third
            seed atom of each seeded component (``-1`` where the component has fewer atoms).
        third_from_second: ``(S,)`` ``bool`` the third seed's bond reference is the
            second seed atom (else the root).
        seed_slot: ``(N,)`` ``int64`` index into ``seeded`` of each atom's component
            (``S`` for atoms of anchored components).
        n_atoms, n_fixed, n_components, depth: counts (``depth``: number of levels
            of full rows).

    Example:
        >>> import batched_nerf as bn
        >>> topo = bn.ConstructionTable.chain(5).topology
        >>> topo.level.tolist(), topo.depth, topo.seed_third.tolist()
        ([0, 0, 0, 1, 2], 2, [2])
    """

    refs: np.ndarray
    fixed: np.ndarray
    kind: np.ndarray
    component: np.ndarray
    level: np.ndarray
    order: np.ndarray
    seeded: np.ndarray
    seed_root: np.ndarray
    seed_second: np.ndarray
    seed_third: np.ndarray
    third_from_second: np.ndarray
    seed_slot: np.ndarray
    n_atoms: int
    n_fixed: int
    n_components: int
    depth: int

    @property
    def is_fixed(self) -> np.ndarray:
        """``(N,)`` ``bool``: the atom is listed in :attr:`fixed`."""
        mask = np.zeros(self.n_atoms, dtype=bool)
        mask[self.fixed] = True
        return mask


def analyse(refs: Any, fixed: Any = None) -> Topology:
    """Check the rows of a table and analyse them (see :class:`Topology`).

    Args:
        refs: integer array-like ``(N, 3)``.
        fixed: integer array-like ``(F,)`` or None.

    Raises:
        ValueError: naming the row and the reason (see
            :class:`~batched_nerf.ConstructionTable`).
    """
    arr = as_index_array(refs, "refs")
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"refs must have shape (N, 3), got {tuple(arr.shape)}")
    fixed_arr = np.zeros(0, dtype=np.int64) if fixed is None else as_index_array(fixed, "fixed")
    if fixed_arr.ndim != 1:
        raise ValueError(f"fixed must be a 1-D sequence of atom indices, got shape {fixed_arr.shape}")
    _check_rows(arr, fixed_arr)
    kind = (arr >= 0).sum(1).astype(np.int64)
    component = components(arr)
    n = arr.shape[0]
    is_fixed = np.zeros(n, dtype=bool)
    is_fixed[fixed_arr] = True
    seeded = _check_seeds(arr, kind, component, is_fixed)
    level = _levels(arr, kind)
    order = build_order(arr)
    root, second, third, from_second = _seed_atoms(arr, kind, component, seeded)
    slot = np.full(n, seeded.size, dtype=np.int64)
    comp_slot = np.full(int(component.max()) + 1 if n else 0, seeded.size, dtype=np.int64)
    comp_slot[seeded] = np.arange(seeded.size)
    if n:
        slot = comp_slot[component]
    arrays = {
        "refs": arr,
        "fixed": fixed_arr,
        "kind": kind,
        "component": component,
        "level": level,
        "order": order,
        "seeded": seeded,
        "seed_root": root,
        "seed_second": second,
        "seed_third": third,
        "third_from_second": from_second,
        "seed_slot": slot,
    }
    return Topology(
        **{name: _readonly(value) for name, value in arrays.items()},
        n_atoms=int(n),
        n_fixed=int(fixed_arr.size),
        n_components=int(component.max()) + 1 if n else 0,
        depth=int(level.max()) if n else 0,
    )


def build_order(refs: np.ndarray) -> np.ndarray:
    """A build order in which every atom comes after its references.

    Among the atoms ready to be placed the lowest index goes first, so a table
    that is already in build order keeps its order. Works on raw ``(N, 3)``
    reference arrays too (the file writers order rows with it).

    Raises:
        ValueError: for references out of range or a reference cycle.
    """
    n = len(refs)
    waiting = np.zeros(n, dtype=np.int64)
    users: list[list[int]] = [[] for _ in range(n)]
    for i, row in enumerate(refs.tolist()):
        for r in row:
            if r >= n or r < -1:
                raise ValueError(f"row {i}: reference {r} out of range [-1, {n - 1}]")
            if r >= 0:
                waiting[i] += 1
                users[r].append(i)
    ready = [i for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != n:
        stuck = sorted(set(range(n)) - set(order))
        raise ValueError(f"the references contain a cycle (atoms {stuck[:8]} can never be placed)")
    return np.asarray(order, dtype=np.int64)


def _check_rows(arr: np.ndarray, fixed: np.ndarray) -> None:
    n = arr.shape[0]
    for i, row in enumerate(arr.tolist()):
        for r in row:
            if r < -1 or r >= n:
                raise ValueError(
                    f"row {i}: reference {r} out of range; references must be -1 or "
                    f"an atom index in [0, {n - 1}] (refs {row})"
                )
        filled = [r for r in row if r != -1]
        if any(r == -1 for r in row[: len(filled)]):
            raise ValueError(
                f"row {i}: references must be filled from the left "
                f"(bond, angle, dihedral) with -1 only at the end, got {row}"
            )
        if i in filled:
            raise ValueError(f"row {i}: atom {i} references itself (refs {row})")
        if len(set(filled)) != len(filled):
            raise ValueError(f"row {i}: repeated atom in references {row}")
    seen: set[int] = set()
    for f in fixed.tolist():
        if f < 0 or f >= n:
            raise ValueError(f"fixed atom {f} out of range [0, {n - 1}]")
        if f in seen:
            raise ValueError(f"fixed atom {f} listed twice")
        seen.add(f)
        if arr[f].tolist() != [-1, -1, -1]:
            raise ValueError(f"row {f}: fixed atom must have references (-1, -1, -1), got {arr[f].tolist()}")


def components(arr: np.ndarray) -> np.ndarray:
    """Connected component of each atom (atoms linked by references), numbered by first atom."""
    n = arr.shape[0]
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, row in enumerate(arr.tolist()):
        for r in row:
            if r >= 0:
                ri, rr = find(i), find(r)
                if ri != rr:
                    parent[ri] = rr
    comp_root = np.array([find(i) for i in range(n)], dtype=np.int64)
    _, component = np.unique(comp_root, return_inverse=True)
    return component.reshape(-1).astype(np.int64)


def _check_seeds(
    arr: np.ndarray, kind: np.ndarray, component: np.ndarray, is_fixed: np.ndarray
) -> np.ndarray:
    """Seed rows of every component; returns the seeded (not anchored) components."""
    seeded = []
    for c in range(int(component.max()) + 1 if component.size else 0):
        members = np.flatnonzero(component == c)
        kinds = kind[members]
        if is_fixed[members].any():
            seeds = members[(kinds < FULL) & ~is_fixed[members]]
            if seeds.size:
                raise ValueError(
                    f"row {int(seeds[0])}: component of atoms {short(members)} is anchored by "
                    f"fixed atoms {short(members[is_fixed[members]])} and must not contain seed "
                    f"rows, but row {int(seeds[0])} has references {arr[seeds[0]].tolist()}"
                )
            continue
        seeded.append(c)
        if not (kinds == ROOT).any():
            raise ValueError(
                f"row {int(members[0])}: atoms {short(members)} are not connected to any "
                "seed atom (a row (-1, -1, -1)) or fixed atom"
            )
        expected = min(members.size, 3)
        for k, label in ((ROOT, "(-1, -1, -1)"), (SECOND, "(b, -1, -1)"), (THIRD, "(b, a, -1)")):
            rows = members[kinds == k]
            want = 1 if k < expected else 0
            if rows.size != want:
                where = f" (rows {short(rows)})" if rows.size else ""
                raise ValueError(
                    f"row {int(rows[0]) if rows.size else int(members[0])}: the component of "
                    f"atoms {short(members)} has {rows.size} seed rows of the form {label}{where}; "
                    f"expected exactly {want}"
                )
        root = int(members[kinds == ROOT][0])
        for i in members[kinds == SECOND].tolist():
            if arr[i, 0] != root:
                raise ValueError(
                    f"row {i}: the seed row (b, -1, -1) must reference its component's root "
                    f"atom {root}, got {arr[i].tolist()}"
                )
        for i in members[kinds == THIRD].tolist():
            second = int(members[kinds == SECOND][0])
            if set(arr[i, :2].tolist()) != {root, second}:
                raise ValueError(
                    f"row {i}: the seed row (b, a, -1) must reference the root atom {root} "
                    f"and the second seed atom {second}, got {arr[i].tolist()}"
                )
    return np.asarray(seeded, dtype=np.int64)


def _levels(arr: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Dependency levels (Kahn's algorithm); raises on a reference cycle."""
    n = arr.shape[0]
    level = np.where(kind < FULL, 0, -1).astype(np.int64)
    dependents: list[list[int]] = [[] for _ in range(n)]
    waiting = np.zeros(n, dtype=np.int64)
    for i in np.flatnonzero(kind == FULL).tolist():
        waiting[i] = 3
        for r in arr[i].tolist():
            dependents[r].append(i)
    frontier = np.flatnonzero(level == 0).tolist()
    while frontier:
        nxt: list[int] = []
        for r in frontier:
            for i in dependents[r]:
                waiting[i] -= 1
                if waiting[i] == 0:
                    level[i] = 1 + max(int(level[j]) for j in arr[i])
                    nxt.append(i)
        frontier = nxt
    stuck = np.flatnonzero(level < 0)
    if stuck.size:
        cycle = _find_cycle(arr, stuck)
        raise ValueError(
            f"row {cycle[0]}: reference cycle {' -> '.join(map(str, cycle))}; "
            "an atom must not depend, directly or indirectly, on itself"
        )
    return level


def _seed_atoms(
    arr: np.ndarray, kind: np.ndarray, component: np.ndarray, seeded: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Root, second and third seed atom (``-1`` if absent) of each seeded component."""
    s = seeded.size
    root = np.full(s, -1, dtype=np.int64)
    second = np.full(s, -1, dtype=np.int64)
    third = np.full(s, -1, dtype=np.int64)
    slot = {int(c): k for k, c in enumerate(seeded.tolist())}
    for target, k in ((root, ROOT), (second, SECOND), (third, THIRD)):
        atoms = np.flatnonzero(kind == k)
        for a in atoms.tolist():
            c = slot.get(int(component[a]))
            if c is not None:
                target[c] = a
    from_second = (third >= 0) & (second >= 0) & (arr[np.maximum(third, 0), 0] == second)
    return root, second, third, from_second


def short(rows: Sequence[int] | np.ndarray, limit: int = 8) -> str:
    """``[a, b, c, ...]``: at most ``limit`` atom indices for error messages."""
    vals = [int(r) for r in rows]
    text = ", ".join(map(str, vals[:limit]))
    return f"[{text}{', ...' if len(vals) > limit else ''}]"


def _find_cycle(arr: np.ndarray, stuck: np.ndarray) -> list[int]:
    """Follow references among unresolved atoms until an atom repeats."""
    stuck_set = set(stuck.tolist())
    node = int(stuck[0])
    path: list[int] = []
    index: dict[int, int] = {}
    while node not in index:
        index[node] = len(path)
        path.append(node)
        node = next(int(r) for r in arr[node] if r in stuck_set)
    cycle = path[index[node] :]
    return [*cycle, node]
