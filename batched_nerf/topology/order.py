"""Build orders and dependency levels of reference arrays (the ground layer's own helper).

numpy only, nothing imported from the package. A *build order* lists every
atom after its references; `build_order` gives the one in which, among
the atoms ready to be placed, the lowest index goes first (so a table whose
rows are already in build order keeps them). That order is sequential by
definition, but the tables met in practice have structure that whole-array
passes can use, tried in turn by `_order`:

1. rows in build order already (one comparison);
2. few forward references, as in protein tables: a sort by the largest index
   each row depends on (`_grouped_order`);
3. a shallow table (linked fragments, such as a box of waters): the same
   sort, nested, with the largest indices found level by level
   (`_nested_order`);
4. otherwise a heap over the rows, which also finds reference cycles.

All four give the same order. `_levels` gives the dependency levels
(longest reference paths) that `analyse` keeps.
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["adopt_dihedrals", "build_order"]

#: Rounds of critical-reference choices that :func:`_order` lets :func:`_levels` take (a box of
#: 16,000 linked waters takes 17); past them, or on a cycle, the heap decides.
_LEVEL_ROUNDS = 64

#: :func:`_nested_order` gives way to the heap past this many level passes per row
#: (a level pass costs about as much as the heap spends on 16 rows).
_ROWS_PER_PASS = 16


def build_order(refs: np.ndarray) -> np.ndarray:
    """A build order in which every atom comes after its references.

    Among the atoms ready to be placed the lowest index goes first, so a table
    that is already in build order keeps its order. Found in whole-array passes
    where the table allows it (see the module docstring), else by a heap over
    the rows. Works on raw ``(N, 3)`` reference arrays too (the file writers
    order rows with it).

    Raises:
        ValueError: for references out of range or a reference cycle.

    Example:
        >>> from batched_nerf.topology.order import build_order
        >>> build_order([[1, -1, -1], [-1, -1, -1], [0, 1, -1]]).tolist()
        [1, 0, 2]
    """
    arr = np.asarray(refs, dtype=np.int64).reshape(-1, 3)
    n = len(arr)
    bad = ((arr >= n) | (arr < -1)).any(1)
    if bad.any():
        i = int(np.argmax(bad))
        r = next(r for r in arr[i].tolist() if r >= n or r < -1)
        raise ValueError(f"row {i}: reference {r} out of range [-1, {n - 1}]")
    order, stuck, _ = _order(arr)
    if stuck is not None:
        raise ValueError(f"the references contain a cycle (atoms {stuck[:8].tolist()} can never be placed)")
    return order


def adopt_dihedrals(refs: np.ndarray, quads: np.ndarray) -> np.ndarray:
    """Make each quad ``(p, q, s, t)`` the dihedral of one row where the build order allows it.

    Atom ``t`` with references ``(s, q, *)`` takes ``p`` as its dihedral reference
    (or atom ``p`` with ``(q, s, *)`` takes ``t``) if that atom comes earlier in
    ``build_order(refs)``: every rewrite keeps that one order valid, so none can
    make a reference cycle. ``refs`` ``(N, 3)`` int64 is rewritten in place;
    quads with ``p < 0`` are skipped. The rule of the tables read from a topology
    (``batched_nerf.protein.table_from_topology``, the MDAnalysis BAT tables).

    Returns:
        ``(Q,)`` int64: the row that took each quad, ``-1`` where none could.

    Example:
        >>> import numpy as np
        >>> from batched_nerf.topology.order import adopt_dihedrals
        >>> refs = np.array([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [2, 1, 3]])
        >>> adopt_dihedrals(refs, np.array([[0, 1, 2, 4]])).tolist(), refs[4].tolist()
        ([4], [2, 1, 0])
    """
    rank = np.empty(len(refs), dtype=np.int64)
    rank[build_order(refs)] = np.arange(len(refs))
    rows = np.full(len(quads), -1, dtype=np.int64)
    for k, (p, q, s, t) in enumerate(np.asarray(quads, dtype=np.int64).reshape(-1, 4).tolist()):
        if p < 0:
            continue
        for atom, b, a, d in ((t, s, q, p), (p, q, s, t)):
            if refs[atom, 0] == b and refs[atom, 1] == a and refs[atom, 2] >= 0 and rank[d] < rank[atom]:
                refs[atom, 2] = d
                rows[k] = atom
                break
    return rows


def _order(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The build order of `build_order`, the atoms that can never be placed (or None) and,
    where it was found on the way, the table's levels (`_levels`, or None)."""
    n = len(arr)
    rows = np.arange(n, dtype=np.int64)
    if bool((arr < rows[:, None]).all()):  # every reference before its reader: the rows' own order
        return rows, None, None
    order = _grouped_order(arr, rows)
    if order is not None:
        return order, None, None
    # the levels are needed anyway (analyse keeps them); None: a cycle, or slow to settle
    level = _levels(arr, (arr >= 0).all(1), rounds=_LEVEL_ROUNDS)
    if level is not None:
        order = _nested_order(arr, rows, level, max_passes=max(n // _ROWS_PER_PASS, 8))
        if order is not None:
            return order, None, level
    order, stuck = _heap_order(arr)
    return order, stuck, level if stuck is None else None


def _heap_order(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The lowest ready index first, one row at a time, and the atoms never placed (or None)."""
    n = len(arr)
    ref_rows, cols = np.nonzero(arr >= 0)
    targets = arr[ref_rows, cols]
    waiting = np.bincount(ref_rows, minlength=n).tolist()
    by_ref = np.argsort(targets, kind="stable")
    users_flat = ref_rows[by_ref].tolist()
    starts = np.concatenate([[0], np.cumsum(np.bincount(targets, minlength=n))]).tolist()
    ready = [i for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users_flat[starts[i] : starts[i + 1]]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    out = np.asarray(order, dtype=np.int64)
    if out.size == n:
        return out, None
    placed = np.zeros(n, dtype=bool)
    placed[out] = True
    return out, np.flatnonzero(~placed)


def _grouped_order(arr: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
    """The heap's order in whole-array passes for tables with few forward references, else None.

    With ``m(i)`` the largest index among ``i`` and everything it depends on,
    the heap places the *heads* ``m(i) = i`` in increasing order, each followed
    by the rows that waited for it (``m(i) = head``); when those rows' other
    references within the group all point backwards they follow in increasing
    order. So the order is the sort by ``(m(i), not head, i)``, used once it is
    checked to be a build order (which also proves the table acyclic).
    """
    m = _max_ancestor(arr, rows)
    if m is None:
        return None
    has = arr >= 0
    ref = np.where(has, arr, 0)
    group = m[:, None]
    if (has & (m[ref] == group) & (ref != group) & (ref > rows[:, None])).any():
        return None
    order = np.lexsort((rows, m != rows, m))
    pos = np.empty_like(order)
    pos[order] = rows
    if not (~has | (pos[ref] < pos[:, None])).all():
        return None
    return order


def _max_ancestor(arr: np.ndarray, rows: np.ndarray, rounds: int = 4) -> np.ndarray | None:
    """``m(i) = max(i, m(r) for each reference r)``, by pointer jumping along critical references.

    None when it does not settle (reference cycles) within ``rounds`` choices of
    critical references or ``log2(N) + 2`` jumps. Tables it serves settle in one
    or two rounds (proteins, with and without hydrogens); those that take many
    (4,000 linked waters: 32 rounds, 24 ms) then fail the grouped order's check
    anyway, so a few rounds bound the cost before `_nested_order` or the
    heap takes over (was 32).
    """
    n = rows.size
    has = arr >= 0
    ref = np.where(has, arr, rows[:, None])
    m = rows.copy()
    jumps = int(np.log2(max(n, 2))) + 2
    for _ in range(rounds):
        vals = np.where(has, m[ref], -1)
        want = np.maximum(rows, vals.max(1))
        if np.array_equal(want, m):
            return m
        parent = ref[rows, vals.argmax(1)]
        parent = np.where(vals.max(1) > rows, parent, rows)  # only references that raise m
        m = rows.copy()
        for _ in range(jumps):
            grand = parent[parent]
            m = np.maximum(m, m[parent])
            if np.array_equal(grand, parent):
                break
            parent = grand
        else:
            return None
    return None


def _nested_order(arr: np.ndarray, rows: np.ndarray, level: np.ndarray, max_passes: int) -> np.ndarray | None:
    """The heap's order by the nested form of `_grouped_order`, or None past ``max_passes``.

    With ``m(i)`` the largest index among ``i`` and everything it depends on,
    the heap places the heads (``m(i) = i``) in increasing order, each followed
    by the rows that waited for it; those it places in the same way among
    themselves, with their references outside the group as placed. So each
    round finds ``m`` within every group, the heads leave, and the order is the
    lexicographic sort of the rounds' ``m`` (a head's ``-1`` after its round
    puts it before its group). ``m`` of a round is one pass over the table's
    levels (``level``, `_levels`), which must strictly rise along every
    reference (checked, which also proves the table acyclic; else None). One
    level pass per level and round: for shallow tables only.
    """
    if 2 * (int(level.max(initial=0)) + 4) > max_passes:  # not even two rounds (one settles nothing)
        return None
    has = arr >= 0
    n_refs = has.sum(1)
    ref = np.where(has, arr, rows[:, None])
    stage = np.where(n_refs == 3, level + 3, n_refs)  # seed-like rows by reference count, then levels
    if (has & (stage[ref] >= stage[:, None])).any():
        return None
    active = has.copy()  # references within the reader's group (and not to its head)
    done = np.zeros(rows.size, dtype=bool)
    keys: list[np.ndarray] = []
    passes = 0
    while not done.all():
        readers = np.flatnonzero(active.any(1))
        readers = readers[np.argsort(stage[readers], kind="stable")]
        cuts = np.flatnonzero(np.diff(stage[readers])) + 1
        passes += cuts.size + 1
        if passes > max_passes:
            return None
        m = rows.copy()
        for g in np.split(readers, cuts) if readers.size else ():
            m[g] = np.maximum(g, np.where(active[g], m[ref[g]], -1).max(1))
        keys.append(np.where(done, -1, m))
        done |= m == rows
        active &= (m[ref] == m[:, None]) & (ref != m[:, None])
    return np.lexsort(keys[::-1])


def _levels(arr: np.ndarray, full: np.ndarray, rounds: int | None = None) -> np.ndarray | None:
    """``(N,)`` dependency levels: 0 for rows with fewer than three references, ``1 + max`` over references.

    Longest paths by pointer jumping: every full row (``full``, three
    references) picks one *critical* reference (first the bond reference); the
    depth of each row in that forest is a lower bound of its level, reached for
    every row once each critical reference is one of highest level. Each round
    chooses the critical references anew from the last depths; the depths only
    grow, so a few rounds (one for a chain) reach the fixed point of an acyclic
    table. None when the critical references close a cycle (the jumps do not
    settle within ``log2(N) + 2`` steps) or after ``rounds`` rounds, if given.
    """
    n = arr.shape[0]
    rows = np.flatnonzero(full)
    weight = full.astype(np.int64)
    level = np.zeros(n, dtype=np.int64)
    if not rows.size:
        return level
    refs = arr[rows]
    critical = refs[:, 0]
    pick = np.arange(rows.size)
    jumps = int(np.log2(max(n, 2))) + 2
    done = 0
    while rounds is None or done < rounds:
        done += 1
        parent = np.arange(n, dtype=np.int64)
        parent[rows] = critical
        level = weight.copy()  # path weight from each row up to (not including) parent[row]
        for _ in range(jumps):
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            level += level[parent]
            parent = grand
        else:
            return None
        ref_levels = level[refs]
        best = ref_levels.argmax(1)
        if np.array_equal(level[rows], ref_levels[pick, best] + 1):
            return level
        critical = refs[pick, best]
    return None


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
