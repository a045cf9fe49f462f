"""Static topology of a construction table: row checks, components, levels, seeds.

The ground layer of the package: numpy only, no torch, nothing imported from
the rest of the package but its build orders (`batched_nerf.topology.order`).
[`ConstructionTable`][batched_nerf.ConstructionTable] analyses its rows once with
`analyse` and every engine planner, the pose and log-det code and the
losses read the resulting [`Topology`][batched_nerf.Topology] (``table.topology``)
instead of re-deriving it.

Row kinds, by the number of references a row has: ``ROOT`` ``(-1, -1, -1)``,
``SECOND`` ``(b, -1, -1)``, ``THIRD`` ``(b, a, -1)`` and ``FULL`` ``(b, a, d)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .order import _find_cycle, _levels, _order

__all__ = [
    "FULL",
    "ROOT",
    "SECOND",
    "THIRD",
    "Topology",
    "analyse",
    "as_index_array",
    "components",
    "concatenate",
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
        order: ``(N,)`` ``int64`` the build order
            (`build_order`): every
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

    def __setstate__(self, state: dict[str, Any]) -> None:
        # unpickled arrays are writeable: make them read-only again
        for key, value in state.items():
            object.__setattr__(self, key, _readonly(value) if isinstance(value, np.ndarray) else value)

    @property
    def is_fixed(self) -> np.ndarray:
        """``(N,)`` ``bool``: the atom is listed in `fixed`."""
        mask = np.zeros(self.n_atoms, dtype=bool)
        mask[self.fixed] = True
        return mask


def analyse(refs: Any, fixed: Any = None) -> Topology:
    """Check the rows of a table and analyse them (see [`Topology`][batched_nerf.Topology]).

    Whole-array numpy passes (no Python loop over atoms or rows): row checks,
    components (hooking and pointer jumping), seeds (per-component counts),
    build order, levels (pointer jumping along a critical-reference forest).
    The build order (`batched_nerf.topology.order`) is found in whole-array
    passes too, except for deep tables whose rows are far from build order
    (a heap over the rows).

    Args:
        refs: integer array-like ``(N, 3)``.
        fixed: integer array-like ``(F,)`` or None.

    Raises:
        ValueError: naming the row and the reason (see
            [`ConstructionTable`][batched_nerf.ConstructionTable]).
    """
    arr = as_index_array(refs, "refs")
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"refs must have shape (N, 3), got {tuple(arr.shape)}")
    fixed_arr = np.zeros(0, dtype=np.int64) if fixed is None else as_index_array(fixed, "fixed")
    if fixed_arr.ndim != 1:
        raise ValueError(f"fixed must be a 1-D sequence of atom indices, got shape {fixed_arr.shape}")
    _check_rows(arr, fixed_arr)
    n = arr.shape[0]
    kind = (arr >= 0).sum(1).astype(np.int64)
    component = components(arr)
    n_components = int(component.max()) + 1 if n else 0
    is_fixed = np.zeros(n, dtype=bool)
    is_fixed[fixed_arr] = True
    seeded = _check_seeds(arr, kind, component, is_fixed, n_components)
    order, stuck, level = _order(arr)
    if stuck is not None:
        cycle = _find_cycle(arr, stuck)
        raise ValueError(
            f"row {cycle[0]}: reference cycle {' -> '.join(map(str, cycle))}; "
            "an atom must not depend, directly or indirectly, on itself"
        )
    if level is None:
        level = _levels(arr, kind == FULL)  # acyclic (the order exists): it settles
        assert level is not None
    root, second, third, from_second = _seed_atoms(arr, kind, component, seeded, n_components)
    comp_slot = np.full(n_components, seeded.size, dtype=np.int64)
    comp_slot[seeded] = np.arange(seeded.size)
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
        n_components=n_components,
        depth=int(level.max()) if n else 0,
    )


def concatenate(parts: Sequence[Topology]) -> Topology:
    """The topology of the rows of ``parts`` one after another, without re-analysing them.

    Atom ``k`` of ``parts[m]`` becomes atom ``offset_m + k``; components,
    seeded components and fixed atoms keep their order, part by part. Equal to
    `analyse` of the concatenated rows: components are numbered by their
    first atom, and the build order (lowest ready index first) places every
    atom of a part before any atom of a later part, so the parts' orders
    concatenate.

    Raises:
        ValueError: ``parts`` is empty.

    Example:
        >>> from batched_nerf.topology.analysis import analyse, concatenate
        >>> water = analyse([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
        >>> chain = analyse([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]])
        >>> both = concatenate([water, chain])
        >>> both.component.tolist(), both.order.tolist(), both.seed_root.tolist()
        ([0, 0, 0, 1, 1, 1, 1], [0, 1, 2, 3, 4, 5, 6], [0, 3])
    """
    parts = list(parts)
    if not parts:
        raise ValueError("concatenate needs at least one topology")
    return _Concatenated(tuple(parts))


class _Concatenated(Topology):
    """The [`Topology`][batched_nerf.Topology] that `concatenate` returns: counts now, each array on first
    read.

    A packed table built through a bound path reads only a few of its arrays
    (the fused plan is composed from the parts' plans): each array is concatenated
    from the parts, with its offsets, when it is first read, then kept (read-only,
    as any topology's). Pickles as a plain [`Topology`][batched_nerf.Topology].
    """

    def __init__(self, parts: tuple[Topology, ...]) -> None:
        counts = {
            "n_atoms": sum(p.n_atoms for p in parts),
            "n_fixed": sum(p.n_fixed for p in parts),
            "n_components": sum(p.n_components for p in parts),
            "depth": max(p.depth for p in parts),
        }
        for name, value in counts.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_parts", parts)

    def __getattr__(self, name: str) -> Any:
        make = _CONCATENATED.get(name)
        parts = self.__dict__.get("_parts")
        if make is None or parts is None:
            raise AttributeError(f"'Topology' object has no attribute {name!r}")
        value = _readonly(make(parts))
        object.__setattr__(self, name, value)
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpickled, ({f.name: getattr(self, f.name) for f in dataclasses.fields(Topology)},)


def _unpickled(state: dict[str, Any]) -> Topology:
    """A plain [`Topology`][batched_nerf.Topology] of a pickled state (its arrays read-only again)."""
    topo = Topology.__new__(Topology)
    topo.__setstate__(state)
    return topo


def _offsets(counts: Iterable[int]) -> np.ndarray:
    """``(M + 1,)`` running sums of ``counts``, from 0."""
    return np.cumsum([0, *counts])


def _cat(parts: Sequence[Topology], name: str) -> np.ndarray:
    return np.concatenate([getattr(p, name) for p in parts])


def _shifted(parts: Sequence[Topology], name: str, count: str, offset: str, keep: bool = False) -> np.ndarray:
    """The parts' ``name`` arrays one after another, part ``m``'s rows (``_count(part, count)`` of them)
    plus the sum of the earlier parts' ``_count(part, offset)`` (``keep``: ``-1`` stays ``-1``).

    Concatenated, then shifted in place in whole-array passes (fresh arrays as large as the packed
    ones cost page faults, more than the arithmetic; per-part slices cost more in Python).
    """
    out = _cat(parts, name).astype(np.int64, copy=False)
    rows = [_count(p, count) for p in parts]
    shift = np.repeat(_offsets(_count(p, offset) for p in parts)[:-1], rows)
    shift = shift.reshape((-1,) + (1,) * (out.ndim - 1))
    if keep:
        none = out < 0
        out += shift
        np.putmask(out, none, -1)
    else:
        out += shift
    return out


def _count(topo: Topology, name: str) -> int:
    """A count of ``topo`` (``n_*``) or the length of one of its arrays."""
    return getattr(topo, name) if name.startswith("n_") else getattr(topo, name).size


def _seed_slot(parts: Sequence[Topology]) -> np.ndarray:
    """Each atom's seeded-component slot; ``S`` (all seeded components) for anchored atoms."""
    n_atoms, n_seeds = [p.n_atoms for p in parts], [p.seeded.size for p in parts]
    seed_off = _offsets(n_seeds)
    slot = _cat(parts, "seed_slot").astype(np.int64, copy=False)
    anchored = slot >= np.repeat(n_seeds, n_atoms)  # S_m marks the anchored atoms of part m
    slot += np.repeat(seed_off[:-1], n_atoms)
    np.putmask(slot, anchored, int(seed_off[-1]))
    return slot


#: How :func:`concatenate` makes each array: ``(parts) -> array``.
_CONCATENATED: dict[str, Callable[[Sequence[Topology]], np.ndarray]] = {
    "refs": lambda ps: _shifted(ps, "refs", "n_atoms", "n_atoms", keep=True),
    "fixed": lambda ps: _shifted(ps, "fixed", "n_fixed", "n_atoms"),
    "kind": lambda ps: _cat(ps, "kind"),
    "component": lambda ps: _shifted(ps, "component", "n_atoms", "n_components"),
    "level": lambda ps: _cat(ps, "level"),
    "order": lambda ps: _shifted(ps, "order", "n_atoms", "n_atoms"),
    "seeded": lambda ps: _shifted(ps, "seeded", "seeded", "n_components"),
    "seed_root": lambda ps: _shifted(ps, "seed_root", "seeded", "n_atoms", keep=True),
    "seed_second": lambda ps: _shifted(ps, "seed_second", "seeded", "n_atoms", keep=True),
    "seed_third": lambda ps: _shifted(ps, "seed_third", "seeded", "n_atoms", keep=True),
    "third_from_second": lambda ps: _cat(ps, "third_from_second"),
    "seed_slot": _seed_slot,
}


def _row_error(arr: np.ndarray, i: int) -> str | None:
    """The message for row ``i`` of `_check_rows`, or None."""
    n = arr.shape[0]
    row = arr[i].tolist()
    for r in row:
        if r < -1 or r >= n:
            return (
                f"row {i}: reference {r} out of range; references must be -1 or "
                f"an atom index in [0, {n - 1}] (refs {row})"
            )
    filled = [r for r in row if r != -1]
    if any(r == -1 for r in row[: len(filled)]):
        return (
            f"row {i}: references must be filled from the left "
            f"(bond, angle, dihedral) with -1 only at the end, got {row}"
        )
    if i in filled:
        return f"row {i}: atom {i} references itself (refs {row})"
    if len(set(filled)) != len(filled):
        return f"row {i}: repeated atom in references {row}"
    return None


def _check_rows(arr: np.ndarray, fixed: np.ndarray) -> None:
    """Row and fixed-atom checks in whole-array passes; the first offending row is named."""
    n = arr.shape[0]
    if n:
        out_of_range = ((arr < -1) | (arr >= n)).any(1)
        empty = arr == -1
        count = (~empty).sum(1)
        not_left = (empty & (np.arange(3)[None, :] < count[:, None])).any(1)
        itself = (arr == np.arange(n)[:, None]).any(1)
        c0, c1, c2 = arr.T
        repeated = (~empty[:, 0] & ((c0 == c1) | (c0 == c2))) | (~empty[:, 1] & (c1 == c2))
        bad = out_of_range | not_left | itself | repeated
        if bad.any():
            raise ValueError(_row_error(arr, int(np.argmax(bad))))
    if fixed.size:
        out = (fixed < 0) | (fixed >= n)
        by_value = np.argsort(fixed, kind="stable")
        twice = np.zeros(fixed.size, dtype=bool)
        twice[by_value[1:]] = fixed[by_value[1:]] == fixed[by_value[:-1]]
        safe = np.clip(fixed, 0, max(n - 1, 0))
        has_refs = ~out & (arr[safe] != -1).any(1) if n else np.zeros(fixed.size, dtype=bool)
        bad = out | twice | has_refs
        if bad.any():
            p = int(np.argmax(bad))
            f = int(fixed[p])
            if out[p]:
                raise ValueError(f"fixed atom {f} out of range [0, {n - 1}]")
            if twice[p]:
                raise ValueError(f"fixed atom {f} listed twice")
            raise ValueError(f"row {f}: fixed atom must have references (-1, -1, -1), got {arr[f].tolist()}")


def components(arr: np.ndarray) -> np.ndarray:
    """Connected component of each atom (atoms linked by references), numbered by first atom.

    Any ``(N, 3)`` reference array (``-1`` for none), cycles included: roots are
    hooked under the smaller root of every reference, then pointers jump to
    their roots, until every reference joins atoms of one root. A table whose
    every row after the first references an earlier row (a chain, a protein) is
    one component, seen in one pass.
    """
    arr = np.asarray(arr, dtype=np.int64).reshape(-1, 3)
    n = arr.shape[0]
    rows = np.arange(n, dtype=np.int64)
    # one component, at once: every row after the first references an earlier row (so, by induction,
    # an atom of row 0's component; any other reference joins that one component too)
    if n and ((arr >= 0) & (arr < rows[:, None])).any(1)[1:].all():
        return np.zeros(n, dtype=np.int64)
    return _hooked(arr)


def _hooked(arr: np.ndarray) -> np.ndarray:
    """`components` of an ``(N, 3)`` int64 array by hooking and pointer jumping."""
    n = arr.shape[0]
    parent = np.arange(n, dtype=np.int64)
    rows, cols = np.nonzero(arr >= 0)
    targets = arr[rows, cols]
    while rows.size:
        pu, pv = parent[rows], parent[targets]
        differ = pu != pv
        if not differ.any():
            break
        pu, pv = pu[differ], pv[differ]
        np.minimum.at(parent, np.maximum(pu, pv), np.minimum(pu, pv))
        parent = _roots(parent)
    # each root is its component's smallest atom: number the roots in order
    first = np.zeros(n, dtype=np.int64)
    first[parent] = 1
    return (np.cumsum(first) - 1)[parent].astype(np.int64)


def _roots(parent: np.ndarray) -> np.ndarray:
    """Pointer jumping until every atom points at the root of its tree."""
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return parent
        parent = grand


def _check_component(arr: np.ndarray, kind: np.ndarray, members: np.ndarray, is_fixed: np.ndarray) -> None:
    """The seed checks of one component (raises the first message that applies)."""
    kinds = kind[members]
    if is_fixed[members].any():
        seeds = members[(kinds < FULL) & ~is_fixed[members]]
        if seeds.size:
            raise ValueError(
                f"row {int(seeds[0])}: component of atoms {short(members)} is anchored by "
                f"fixed atoms {short(members[is_fixed[members]])} and must not contain seed "
                f"rows, but row {int(seeds[0])} has references {arr[seeds[0]].tolist()}"
            )
        return
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


def _check_seeds(
    arr: np.ndarray, kind: np.ndarray, component: np.ndarray, is_fixed: np.ndarray, n_comp: int
) -> np.ndarray:
    """Seed rows of every component; returns the seeded (not anchored) components.

    Per-component counts in whole-array passes; the first offending component
    (in component order) is then checked alone for its message.
    """

    def per_component(mask: np.ndarray) -> np.ndarray:
        return np.bincount(component[mask], minlength=n_comp)

    anchored = per_component(is_fixed) > 0
    bad = anchored & (per_component((kind < FULL) & ~is_fixed) > 0)
    size = np.bincount(component, minlength=n_comp)
    counts = [per_component(kind == k) for k in (ROOT, SECOND, THIRD)]
    want = [size >= 1, size >= 2, size >= 3]
    seeded = ~anchored
    bad |= seeded & ((counts[0] != want[0]) | (counts[1] != want[1]) | (counts[2] != want[2]))
    seed_atom = np.full((3, n_comp), -1, dtype=np.int64)
    for k in (ROOT, SECOND):
        atoms = np.flatnonzero(kind == k)
        seed_atom[k, component[atoms]] = atoms
    second = np.flatnonzero(kind == SECOND)
    c2 = component[second]
    bad[c2[seeded[c2] & (arr[second, 0] != seed_atom[ROOT, c2])]] = True
    third = np.flatnonzero(kind == THIRD)
    c3 = component[third]
    r, s = seed_atom[ROOT, c3], seed_atom[SECOND, c3]
    b, a = arr[third, 0], arr[third, 1]
    bad[c3[seeded[c3] & ~(((b == r) & (a == s)) | ((b == s) & (a == r)))]] = True
    if bad.any():
        order = np.argsort(component, kind="stable")
        starts = np.concatenate([[0], np.cumsum(size)])
        for c in np.flatnonzero(bad).tolist():  # the first one raises
            _check_component(arr, kind, order[starts[c] : starts[c + 1]], is_fixed)
    return np.flatnonzero(seeded).astype(np.int64)


def _seed_atoms(
    arr: np.ndarray, kind: np.ndarray, component: np.ndarray, seeded: np.ndarray, n_comp: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Root, second and third seed atom (``-1`` if absent) of each seeded component."""
    s = seeded.size
    comp_slot = np.full(n_comp, -1, dtype=np.int64)
    comp_slot[seeded] = np.arange(s)
    out = []
    for k in (ROOT, SECOND, THIRD):
        target = np.full(s, -1, dtype=np.int64)
        atoms = np.flatnonzero(kind == k)
        slot = comp_slot[component[atoms]]
        keep = slot >= 0
        target[slot[keep]] = atoms[keep]
        out.append(target)
    root, second, third = out
    from_second = (third >= 0) & (second >= 0) & (arr[np.maximum(third, 0), 0] == second)
    return root, second, third, from_second


def short(rows: Sequence[int] | np.ndarray, limit: int = 8) -> str:
    """``[a, b, c, ...]``: at most ``limit`` atom indices for error messages."""
    vals = [int(r) for r in rows]
    text = ", ".join(map(str, vals[:limit]))
    return f"[{text}{', ...' if len(vals) > limit else ''}]"
