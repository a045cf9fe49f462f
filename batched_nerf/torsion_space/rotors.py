"""Molecules in torsion space: rotatable bonds and the per-molecule analysis of them.

Torsion-space generative models (DiffDock, torsional diffusion) change a
molecule's conformation by turning the atoms on one side of each rotatable
bond about that bond. What each molecule needs for that, found once per bond
graph and cached, is a [`RotorTable`][batched_nerf.RotorTable]: the rotatable
bonds (bridges of the bond graph, `rotatable_bonds`), the side each one moves,
a table rooted in the part that no bond moves and the rows that turn about
each bond. `update` applies updates to ragged batches of them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from ..core.table import ConstructionTable
from ..topology.auto import _bond_pairs, refs_from_connectivity
from ..topology.link import components
from ..topology.perceive import _symbols, atomic_number
from .packed import _recent

__all__ = ["RotorTable", "rotatable_bonds"]

Moving = Literal["smaller", "larger"]
Rule = Literal["graph", "chemistry"]


def _check_moving(moving: str) -> None:
    if moving not in ("smaller", "larger"):
        raise ValueError(f"moving must be 'smaller' or 'larger', got {moving!r}")


def _check_rule(rule: str) -> None:
    if rule not in ("graph", "chemistry"):
        raise ValueError(f"rule must be 'graph' or 'chemistry', got {rule!r}")


class _Bridges:
    """Bridges of a bond graph with, for each, the atoms of the child side (iterative DFS)."""

    def __init__(self, pairs: np.ndarray, n_atoms: int) -> None:
        adj: list[list[tuple[int, int]]] = [[] for _ in range(n_atoms)]
        for k, (i, j) in enumerate(pairs.tolist()):
            adj[i].append((j, k))
            adj[j].append((i, k))
        disc = [-1] * n_atoms
        low = [0] * n_atoms
        parent = [-1] * n_atoms
        order: list[int] = []  # DFS preorder
        size = [1] * n_atoms
        self.child: dict[frozenset[int], int] = {}  # bridge -> its endpoint away from the DFS root
        for start in range(n_atoms):
            if disc[start] >= 0:
                continue
            disc[start] = low[start] = len(order)
            order.append(start)
            stack: list[tuple[int, int, int]] = [(start, -1, 0)]  # atom, edge to parent, next neighbour
            while stack:
                u, pe, k = stack[-1]
                if k < len(adj[u]):
                    stack[-1] = (u, pe, k + 1)
                    v, e = adj[u][k]
                    if e == pe:
                        continue
                    if disc[v] < 0:
                        disc[v] = low[v] = len(order)
                        order.append(v)
                        parent[v] = u
                        stack.append((v, e, 0))
                    else:
                        low[u] = min(low[u], disc[v])
                else:
                    stack.pop()
                    if stack:
                        p = stack[-1][0]
                        low[p] = min(low[p], low[u])
                        size[p] += size[u]
                        if low[u] > disc[p]:
                            self.child[frozenset((p, u))] = u
        self.disc = np.asarray(disc, dtype=np.int64)
        self.size = np.asarray(size, dtype=np.int64)
        self.comp, _ = components(n_atoms, pairs[:, 0], pairs[:, 1])
        self._sides: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # child end -> (rest, subtree)

    def subtree(self, c: int) -> np.ndarray:
        """Boolean mask of the atoms of the DFS subtree of ``c`` (one side of its bridge)."""
        return (self.disc >= self.disc[c]) & (self.disc < self.disc[c] + self.size[c])

    def sides(self, u: int, v: int) -> tuple[np.ndarray, np.ndarray]:
        """Masks of the atoms on ``u``'s and on ``v``'s side of the bridge ``u-v`` (kept per bridge)."""
        c = self.child[frozenset((u, v))]
        if c not in self._sides:
            sub = self.subtree(c)
            self._sides[c] = ((self.comp == self.comp[c]) & ~sub, sub)
        rest, sub = self._sides[c]
        return (rest, sub) if c == v else (sub, rest)


def _oriented(pairs: np.ndarray, n_atoms: int, moving: str) -> tuple[np.ndarray, _Bridges]:
    """Rotatable bonds ``(R, 2)`` ``(u, v)``, ``v`` on the moving side, in sorted pair order."""
    graph = _Bridges(pairs, n_atoms)
    comp_size = np.bincount(graph.comp, minlength=1)
    out = []
    for i, j in pairs.tolist():
        c = graph.child.get(frozenset((i, j)))
        if c is None:
            continue
        below = int(graph.size[c])  # the atoms on c's side (its DFS subtree)
        above = int(comp_size[graph.comp[c]]) - below
        n_i, n_j = (above, below) if c == j else (below, above)
        if n_i < 2 or n_j < 2:
            continue
        side_i, side_j = graph.sides(i, j)
        if n_i != n_j:
            j_moves = (n_j < n_i) == (moving == "smaller")
        else:  # tie: the side holding the fragment's lowest atom index is "the smaller one"
            lowest = int(np.flatnonzero(side_i | side_j)[0])
            j_moves = bool(side_j[lowest]) == (moving == "smaller")
        out.append((i, j) if j_moves else (j, i))
    return np.asarray(out, dtype=np.int64).reshape(-1, 2), graph


def rotatable_bonds(
    connectivity: Any,
    n_atoms: int,
    *,
    moving: Moving = "smaller",
    rule: Rule = "graph",
    bond_orders: Any = None,
    elements: Any = None,
) -> Tensor:
    """Rotatable bonds of a bond graph, oriented towards the side that turns.

    The rule of DiffDock and torsional diffusion: a bond is rotatable when it
    is in no cycle (a bridge of the bond graph) and each of its two sides (the
    atoms connected to either end once the bond is cut) holds more than one
    atom. Unlike a chemist's rule, amide C-N and conjugated bonds count, and a
    methyl group's bond does too (its hydrogens turn).

    Each bond is returned as ``(u, v)``: the side of ``v`` is the one an update
    turns, by default the side with fewer atoms, as the peers do; on a tie
    (equal sides) the side holding the lowest atom index of the fragment counts
    as the smaller one (what the peers' ``sorted(connected_components(G),
    key=len)[0]`` picks with atoms numbered from 0). ``moving="larger"`` turns
    the other side.

    ``rule="chemistry"`` keeps, of those bonds, a chemist's rotors (the sense
    of RDKit's ``RotatableBondSmarts``, with amides excluded): a single bond
    (order 1; aromatic 1.5 is not) whose two atoms each have another heavy-atom
    neighbour (so methyl, hydroxyl, amine and halomethyl rotors are terminal
    and left out), neither atom in a triple bond, and not an amide C-N bond
    (a carbon double-bonded to O or S, bonded to N). It needs the bond orders
    and the elements.

    Args:
        connectivity: ``(E, 2)`` pairs of bonded atom indices (numpy, lists or
            torch; any order, duplicates allowed).
        n_atoms: the number of atoms ``N``.
        moving: ``"smaller"`` (default) or ``"larger"``: the side each bond turns.
        rule: ``"graph"`` (default; the peers' rule) or ``"chemistry"``.
        bond_orders: with ``rule="chemistry"``, ``(E,)`` order of each pair of
            ``connectivity`` (1, 1.5 aromatic, 2, 3).
        elements: with ``rule="chemistry"``, ``(N,)`` atomic numbers or
            element symbols.

    Returns:
        ``(R, 2)`` int64 tensor of ``(u, v)`` pairs, in the order of the sorted
        pairs ``(min(u, v), max(u, v))``.

    Raises:
        ValueError: a malformed pair or an atom index out of range, an
            unknown ``moving`` or ``rule``; with ``rule="chemistry"``, missing
            ``bond_orders`` or ``elements``, or of the wrong length, an
            unknown element symbol (naming its index), or two orders for one
            pair (naming it).

    Example:
        >>> import batched_nerf as bn
        >>> butane = [(0, 1), (1, 2), (2, 3)] + [(0, 4), (0, 5), (0, 6), (3, 7), (3, 8), (3, 9)]
        >>> butane += [(1, 10), (1, 11), (2, 12), (2, 13)]
        >>> # the methyls turn; C1-C2 has 7 atoms on each side: the side of atom 0 turns
        >>> bn.rotatable_bonds(butane, 14).tolist()
        [[1, 0], [2, 1], [2, 3]]
        >>> # a chemist's rule: the methyl rotors are terminal
        >>> orders, elements = [1] * 13, "CCCC" + "H" * 10
        >>> bn.rotatable_bonds(butane, 14, rule="chemistry", bond_orders=orders, elements=elements).tolist()
        [[2, 1]]
    """
    _check_moving(moving)
    pairs = _bond_pairs(connectivity, int(n_atoms))
    bonds, _ = _oriented(pairs, int(n_atoms), moving)
    _check_rule(rule)
    if rule == "chemistry":
        bonds = bonds[_chemists_rotors(connectivity, bond_orders, elements, pairs, bonds, int(n_atoms))]
    return torch.from_numpy(bonds)


def _chemists_rotors(
    connectivity: Any, bond_orders: Any, elements: Any, pairs: np.ndarray, bonds: np.ndarray, n: int
) -> np.ndarray:
    """``(R,)`` mask of the graph rule's ``bonds`` that are a chemist's rotors (see ``rotatable_bonds``)."""
    if bond_orders is None or elements is None:
        raise ValueError(
            "rule='chemistry' needs bond_orders (one per connectivity pair) and elements (one per atom)"
        )
    raw = np.asarray(connectivity.detach().cpu().numpy() if hasattr(connectivity, "detach") else connectivity)
    raw = raw.reshape(-1, 2).astype(np.int64)
    orders = np.asarray(bond_orders, dtype=np.float64).reshape(-1)
    if len(orders) != len(raw):
        raise ValueError(f"bond_orders has {len(orders)} values, but connectivity has {len(raw)} pairs")
    z = _atomic_numbers(elements, n)
    order_of: dict[tuple[int, int], float] = {}
    for (i, j), o in zip(raw.tolist(), orders.tolist()):
        key = (min(i, j), max(i, j))
        if order_of.setdefault(key, o) != o:
            raise ValueError(f"the pair ({i}, {j}) is given twice with the orders {order_of[key]} and {o}")
    heavy = z > 1
    heavy_degree = np.zeros(n, dtype=np.int64)
    np.add.at(heavy_degree, pairs[:, 0], heavy[pairs[:, 1]])
    np.add.at(heavy_degree, pairs[:, 1], heavy[pairs[:, 0]])
    triple = np.zeros(n, dtype=bool)
    carbonyl = np.zeros(n, dtype=bool)  # a carbon double-bonded to O or S
    for (i, j), o in order_of.items():
        if o == 3:
            triple[[i, j]] = True
        if o == 2:
            for c, x in ((i, j), (j, i)):
                carbonyl[c] |= z[c] == 6 and z[x] in (8, 16)
    keep = np.zeros(len(bonds), dtype=bool)
    for k, (u, v) in enumerate(bonds.tolist()):
        amide = (carbonyl[u] and z[v] == 7) or (carbonyl[v] and z[u] == 7)
        keep[k] = (
            order_of[(min(u, v), max(u, v))] == 1
            and heavy_degree[u] >= 2
            and heavy_degree[v] >= 2
            and not (triple[u] or triple[v] or amide)
        )
    return keep


def _atomic_numbers(elements: Any, n: int) -> np.ndarray:
    """``(N,)`` atomic numbers from numbers or symbols (a string of one-letter symbols too)."""
    items = list(elements) if isinstance(elements, str) else elements
    values = np.asarray(items.detach().cpu().numpy() if hasattr(items, "detach") else items)
    if values.shape != (n,):
        raise ValueError(f"elements must have one entry per atom ({n}), got shape {values.shape}")
    if np.issubdtype(values.dtype, np.integer):
        return values.astype(np.int64)
    return np.asarray([atomic_number(e) for e in _symbols(values.tolist())], dtype=np.int64)


class RotorTable:
    """A molecule's rotatable bonds, the side each one turns, and a table to turn them in.

    Made once per bond graph (use [`RotorTable.from_connectivity`][batched_nerf.RotorTable.from_connectivity]
    for a cached one) and passed to [`update_torsions`][batched_nerf.update_torsions].

    The construction table is made from the bond graph alone
    ([`ConstructionTable.from_connectivity`][batched_nerf.ConstructionTable.from_connectivity]
    without coordinates): every reference is a bonded neighbour or a sibling, so
    for a rotatable bond ``(u, v)`` the only rows whose atoms lie strictly on
    both sides are rows ``i: (b, a, d)`` with ``{b, a} = {u, v}`` and ``i``,
    ``d`` on opposite sides: the torsion rows of the bond (``rows``). Adding
    the same angle to all of them turns one side rigidly against the other.
    Each connected fragment is rooted at an atom that no bond moves (the
    highest-degree atom on no bond's moving side), with two of its neighbours as
    the other seeds, so that keeping the table's pose keeps the unmoved atoms
    in place.

    Attributes:
        n_atoms: ``N``.
        connectivity: ``(E, 2)`` int64 numpy array, the sorted unique bonded pairs.
        bonds: ``(R, 2)`` int64 tensor of the bonds ``(u, v)``; the side of ``v`` turns.
        moving: ``(R, N)`` bool tensor, the atoms each bond turns (``v`` included).
        fixed: ``(N,)`` bool tensor, the atoms no update moves (off every
            moving side, or on the axis of the bond whose side they are on).
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable].
        rows: ``(K,)`` int64 tensor, the torsion rows of all bonds.
        torsions: ``(R, 4)`` int64 tensor, the atoms ``(p, u, v, m)`` whose
            IUPAC dihedral is the torsion of each bond (read by
            [`torsion_angles`][batched_nerf.torsion_angles]): ``p`` the
            lowest-index neighbour of ``u`` other than ``v``, ``m`` that of ``v``
            other than ``u``.
        row_bonds: ``(K,)`` int64 tensor, the bond (index into ``bonds``) of each row.
        keeps_fixed: whether the seed atoms of every fragment are ``fixed``
            (always with ``moving="smaller"``); then [`update_torsions`][batched_nerf.update_torsions]
            leaves the ``fixed`` atoms exactly in place, else its result equals
            the peers' sequential update up to a rigid motion.
    """

    def __init__(
        self,
        connectivity: Any,
        n_atoms: int,
        *,
        bonds: Any = None,
        moving: Moving = "smaller",
    ) -> None:
        """Analyse a bond graph.

        Args:
            connectivity: ``(E, 2)`` pairs of bonded atom indices.
            n_atoms: ``N``.
            bonds: optional ``(R, 2)`` bonds ``(u, v)`` to turn, in the order of
                the updates (``v``'s side turns); default
                [`rotatable_bonds`][batched_nerf.rotatable_bonds]``(connectivity, n_atoms, moving=moving)``.
            moving: the side each default bond turns (ignored with ``bonds``).

        Raises:
            ValueError: a malformed pair or index, an unknown ``moving``, or a
                bond of ``bonds`` that is not a bond of the molecule, is in a
                ring, is terminal (one side is a single atom) or is given twice,
                each naming the bond's atoms.

        Example:
            >>> import batched_nerf as bn
            >>> rotors = bn.RotorTable([(0, 1), (1, 2), (2, 3)], 4)
            >>> rotors.bonds.tolist(), rotors.rows.tolist()  # equal sides: atom 0's turns
            ([[2, 1]], [0])
        """
        _check_moving(moving)
        n_atoms = int(n_atoms)
        pairs = _bond_pairs(connectivity, n_atoms)
        default, graph = _oriented(pairs, n_atoms, moving)
        chosen = default if bonds is None else self._check_bonds(bonds, pairs, graph, n_atoms)
        self.n_atoms = n_atoms
        self.connectivity = pairs
        moving_mask = np.zeros((len(chosen), n_atoms), dtype=bool)
        for k, (u, v) in enumerate(chosen.tolist()):
            moving_mask[k] = graph.sides(u, v)[1]
        strict = moving_mask.copy()
        strict[np.arange(len(chosen)), chosen[:, 1]] = False
        fixed = ~strict.any(0)
        refs, keeps = self._refs(pairs, n_atoms, graph, ~moving_mask.any(0), fixed)
        self.table = ConstructionTable(refs)
        rows, row_bonds = self._rotor_rows(refs, chosen, moving_mask)
        self.bonds = torch.from_numpy(chosen)
        self.moving = torch.from_numpy(moving_mask)
        self.fixed = torch.from_numpy(fixed)
        self.rows = torch.from_numpy(rows)
        self.row_bonds = torch.from_numpy(row_bonds)
        self.torsions = torch.from_numpy(self._torsion_atoms(pairs, chosen, n_atoms))
        self.keeps_fixed = keeps

    @property
    def n_bonds(self) -> int:
        """``R``, the number of rotatable bonds (of updates)."""
        return int(self.bonds.shape[0])

    def __repr__(self) -> str:
        return f"RotorTable(n_atoms={self.n_atoms}, n_bonds={self.n_bonds})"

    @classmethod
    def from_connectivity(
        cls, connectivity: Any, n_atoms: int, *, bonds: Any = None, moving: Moving = "smaller"
    ) -> RotorTable:
        """The cached [`RotorTable`][batched_nerf.RotorTable] of a bond graph.

        The same graph (the same set of pairs, in any order), bonds and
        ``moving`` give the same object (a least-recently-used cache of 1024
        graphs), so a training loop calls this per sample at the cost of a
        hash.

        Args:
            connectivity: ``(E, 2)`` pairs of bonded atom indices.
            n_atoms: ``N``.
            bonds: optional ``(R, 2)`` bonds to turn (see the constructor).
            moving: ``"smaller"`` or ``"larger"``.

        Returns:
            The shared [`RotorTable`][batched_nerf.RotorTable].

        Raises:
            ValueError: as the constructor.

        Example:
            >>> import batched_nerf as bn
            >>> a = bn.RotorTable.from_connectivity([(0, 1), (1, 2), (2, 3)], 4)
            >>> a is bn.RotorTable.from_connectivity([(3, 2), (1, 2), (0, 1)], 4)
            True
        """
        _check_moving(moving)
        pairs = _bond_pairs(connectivity, int(n_atoms))
        wanted = None if bonds is None else _as_pairs(bonds).tobytes()
        key = (int(n_atoms), pairs.tobytes(), wanted, moving)
        return _recent(
            _ROTOR_CACHE, _ROTOR_CACHE_SIZE, key, lambda: cls(pairs, int(n_atoms), bonds=bonds, moving=moving)
        )

    @staticmethod
    def _check_bonds(bonds: Any, pairs: np.ndarray, graph: _Bridges, n_atoms: int) -> np.ndarray:
        chosen = _as_pairs(bonds)
        bonded = {(int(i), int(j)) for i, j in pairs.tolist()}
        seen: set[frozenset[int]] = set()
        for k, (u, v) in enumerate(chosen.tolist()):
            name = f"bonds[{k}] = ({u}, {v})"
            if not (0 <= u < n_atoms and 0 <= v < n_atoms) or (min(u, v), max(u, v)) not in bonded:
                raise ValueError(f"{name} is not a bond of the molecule ({n_atoms} atoms)")
            if frozenset((u, v)) in seen:
                raise ValueError(f"{name}: the bond is given twice")
            seen.add(frozenset((u, v)))
            if frozenset((u, v)) not in graph.child:
                raise ValueError(f"{name} is in a ring: turning it would break the ring")
            side_u, side_v = graph.sides(u, v)
            if side_u.sum() < 2 or side_v.sum() < 2:
                lone = u if side_u.sum() < 2 else v
                raise ValueError(
                    f"{name} is terminal: atom {lone} is alone on its side, turning it moves nothing"
                )
        return chosen

    @staticmethod
    def _refs(
        pairs: np.ndarray, n_atoms: int, graph: _Bridges, core: np.ndarray, fixed: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        """References, each fragment rooted at its highest-degree core atom; whether the seeds are fixed."""
        refs = np.full((n_atoms, 3), -1, dtype=np.int64)
        degree = np.bincount(pairs.reshape(-1), minlength=n_atoms)
        comp = graph.comp
        keeps = True
        for c in range(int(comp.max()) + 1 if n_atoms else 0):
            atoms = np.flatnonzero(comp == c)
            local = np.full(n_atoms, -1, dtype=np.int64)
            local[atoms] = np.arange(len(atoms))
            sub = local[pairs[comp[pairs[:, 0]] == c]]
            candidates = atoms[core[atoms]]
            root = None
            if len(candidates) and len(atoms) > 3:
                root = int(local[candidates[np.argmax(degree[candidates])]])
            part = refs_from_connectivity(sub, len(atoms), root=root, link_fragments=False).refs
            refs[atoms] = np.where(part >= 0, atoms[np.maximum(part, 0)], -1)
            seeds = atoms[(part[:, 2] < 0)]
            keeps &= bool(fixed[seeds].all())
        return refs, keeps

    @staticmethod
    def _torsion_atoms(pairs: np.ndarray, bonds: np.ndarray, n_atoms: int) -> np.ndarray:
        """``(R, 4)`` ``(p, u, v, m)``: the lowest-index other neighbour of ``u`` and of ``v``."""
        both = np.concatenate([pairs, pairs[:, ::-1]])  # (atom, neighbour), each bond both ways
        both = both[np.lexsort((both[:, 1], both[:, 0]))]
        start = np.searchsorted(both[:, 0], np.arange(n_atoms))
        u, v = bonds[:, 0], bonds[:, 1]

        def lowest_other(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            # a rotatable bond is not terminal: a has a neighbour besides b, so start[a] + 1 is a's too
            first = both[start[a], 1]
            return np.where(first != b, first, both[np.minimum(start[a] + 1, len(both) - 1), 1])

        return np.stack([lowest_other(u, v), u, v, lowest_other(v, u)], 1).reshape(-1, 4).astype(np.int64)

    @staticmethod
    def _rotor_rows(refs: np.ndarray, bonds: np.ndarray, moving: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``i: (b, a, d)``, ``{b, a}`` a bond ``k``, ``i`` and ``d`` off its axis on opposite sides."""
        none = np.zeros(0, dtype=np.int64)
        if len(bonds) == 0:
            return none, none
        n = len(refs)
        codes = np.minimum(bonds[:, 0], bonds[:, 1]) * n + np.maximum(bonds[:, 0], bonds[:, 1])
        order = np.argsort(codes)
        b, a, d = refs[:, 0], refs[:, 1], refs[:, 2]
        row_codes = np.minimum(b, a) * n + np.maximum(b, a)
        k = order[np.minimum(np.searchsorted(codes[order], row_codes), len(codes) - 1)]
        i = np.arange(n)
        u, v = bonds[k, 0], bonds[k, 1]
        ok = (b >= 0) & (a >= 0) & (d >= 0) & (codes[k] == row_codes)
        ok &= (d != u) & (d != v) & (i != u) & (i != v) & (moving[k, i] != moving[k, np.maximum(d, 0)])
        rows, row_bonds = i[ok], k[ok]
        keep = np.lexsort((rows, row_bonds))  # bond after bond, rows ascending
        return rows[keep].astype(np.int64), row_bonds[keep].astype(np.int64)


def _as_pairs(bonds: Any) -> np.ndarray:
    if hasattr(bonds, "detach"):
        bonds = bonds.detach().cpu().numpy()
    arr = np.asarray(bonds)
    if arr.size == 0:
        arr = np.zeros((0, 2), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"bonds must be (R, 2) integer atom pairs, got shape {arr.shape} and dtype {arr.dtype}"
        )
    return np.ascontiguousarray(arr.astype(np.int64))


_ROTOR_CACHE: OrderedDict[tuple[Any, ...], RotorTable] = OrderedDict()
_ROTOR_CACHE_SIZE = 1024
