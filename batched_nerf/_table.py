"""Construction tables: the static topology of a Z-matrix, validated once.

A :class:`ConstructionTable` holds, for each atom ``i``, the three atoms it is
placed from: ``(bond_ref, angle_ref, dihedral_ref)``, ``-1`` meaning "no
reference". It checks the table once, when it is made (every check names the
offending row), and caches the build plans that the engines use, per device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    pass

#: Row patterns, by number of references: root, second and third seed atom,
#: fully referenced atom.
ROOT, SECOND, THIRD, FULL = 0, 1, 2, 3

#: Engines' plan kinds.
PLAN_KINDS = ("inverse", "scan", "levels")
#: Deeper tables build their level plan (one entry per level) on first use only.
EAGER_LEVELS_DEPTH = 256


def _as_index_array(values: Any, what: str) -> np.ndarray:
    """Convert integer array-likes (lists, numpy, torch) to ``np.int64``."""
    if isinstance(values, Tensor):
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


class ConstructionTable:
    """The Z-matrix topology: which atoms each atom is built from.

    Row ``i`` of ``refs`` is ``(b, a, d)`` for atom ``i``: it sits at distance
    ``bonds[i]`` from ``x_b``, makes the angle ``x_i-x_b-x_a = angles[i]`` at
    ``b``, and the IUPAC dihedral ``(x_i, x_b, x_a, x_d) = dihedrals[i]``. ``-1``
    means no reference; references fill from the left.

    Each connected component (atoms linked by references) is either *seeded* or
    *anchored*. A seeded component has exactly one row ``(-1, -1, -1)`` (placed
    at the origin), one ``(b, -1, -1)`` (on the ``+x`` axis) and one
    ``(b, a, -1)`` (in the ``xy``-plane, ``y > 0``), or only the first one or two
    of them for components of one or two atoms. An anchored component contains
    atoms listed in ``fixed`` (rows ``(-1, -1, -1)``), whose positions the caller
    supplies, and only fully referenced rows besides. Rows may come in any order;
    the build order is worked out here.

    Args:
        refs: integer array-like ``(N, 3)``.
        fixed: indices of atoms whose Cartesian positions are given to
            :func:`~batched_nerf.to_cartesian` as ``fixed_xyz`` (in this order).

    Raises:
        ValueError: naming the row and the reason, for a wrong shape or dtype, a
            reference out of range, a self-reference, a repeated atom in a row,
            references not filled from the left, a bad fixed atom, a component
            without exactly the seed rows, an atom not connected to any seed or
            fixed atom, or a reference cycle.

    Example:
        >>> import batched_nerf as bn
        >>> table = bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]])
        >>> table.n_atoms, table.depth
        (4, 1)
    """

    def __init__(self, refs: Any, fixed: Iterable[int] | Tensor | np.ndarray | None = None) -> None:
        arr = _as_index_array(refs, "refs")
        if arr.ndim != 2 or arr.shape[1] != 3:
            raise ValueError(f"refs must have shape (N, 3), got {tuple(arr.shape)}")
        n = arr.shape[0]
        fixed_arr = np.zeros(0, dtype=np.int64) if fixed is None else _as_index_array(fixed, "fixed")
        if fixed_arr.ndim != 1:
            raise ValueError(f"fixed must be a 1-D sequence of atom indices, got shape {fixed_arr.shape}")
        self._refs_np = arr
        self._fixed_np = fixed_arr
        self._validate_rows(arr, fixed_arr)
        self._component, self._level = self._analyse(arr, fixed_arr)
        self._refs = torch.from_numpy(arr.copy())
        self._fixed = torch.from_numpy(fixed_arr.copy())
        self._plans: dict[tuple[str, int, torch.device], Any] = {}
        self._n = n
        # plain Python ints, fixed here: dispatch reads them under torch.compile
        self._depth = int(self._level.max()) if n else 0
        self._n_components = int(self._component.max()) + 1 if n else 0
        self._n_fixed = int(fixed_arr.size)
        # Plans are static structure: build the CPU ones now, outside any
        # torch.func transform or torch.compile trace that a first call may sit in.
        self.prepare(levels=self.depth <= EAGER_LEVELS_DEPTH)

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _validate_rows(arr: np.ndarray, fixed: np.ndarray) -> None:
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
                raise ValueError(
                    f"row {f}: fixed atom must have references (-1, -1, -1), got {arr[f].tolist()}"
                )

    @staticmethod
    def _analyse(arr: np.ndarray, fixed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Components (seed checks) and dependency levels (cycle check)."""
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
        component = component.reshape(-1).astype(np.int64)
        n_refs = (arr >= 0).sum(1)
        is_fixed = np.zeros(n, dtype=bool)
        is_fixed[fixed] = True
        for c in range(int(component.max()) + 1 if n else 0):
            members = np.flatnonzero(component == c)
            kinds = n_refs[members]
            if is_fixed[members].any():
                seeds = members[(kinds < FULL) & ~is_fixed[members]]
                if seeds.size:
                    raise ValueError(
                        f"row {int(seeds[0])}: component of atoms {_short(members)} is anchored by "
                        f"fixed atoms {_short(members[is_fixed[members]])} and must not contain seed "
                        f"rows, but row {int(seeds[0])} has references {arr[seeds[0]].tolist()}"
                    )
                continue
            roots = members[kinds == ROOT]
            if roots.size == 0:
                raise ValueError(
                    f"row {int(members[0])}: atoms {_short(members)} are not connected to any "
                    "seed atom (a row (-1, -1, -1)) or fixed atom"
                )
            expected = min(members.size, 3)
            for kind, label in ((ROOT, "(-1, -1, -1)"), (SECOND, "(b, -1, -1)"), (THIRD, "(b, a, -1)")):
                rows = members[kinds == kind]
                want = 1 if kind < expected else 0
                if rows.size != want:
                    where = f" (rows {_short(rows)})" if rows.size else ""
                    raise ValueError(
                        f"row {int(rows[0]) if rows.size else int(members[0])}: the component of "
                        f"atoms {_short(members)} has {rows.size} seed rows of the form {label}{where}; "
                        f"expected exactly {want}"
                    )
            root = int(roots[0])
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
        # dependency levels (Kahn); non-full atoms are level 0
        level = np.full(n, -1, dtype=np.int64)
        dependents: list[list[int]] = [[] for _ in range(n)]
        waiting = np.zeros(n, dtype=np.int64)
        frontier: list[int] = []
        for i, row in enumerate(arr.tolist()):
            refs = [r for r in row if r >= 0]
            if len(refs) < FULL:
                level[i] = 0
                continue
            waiting[i] = len(refs)
            for r in refs:
                dependents[r].append(i)
        frontier = [i for i in range(n) if level[i] == 0]
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
        return component, level

    # ------------------------------------------------------------- properties
    @property
    def refs(self) -> Tensor:
        """``(N, 3)`` ``torch.long`` references, ``-1`` for none (CPU, read-only copy)."""
        return self._refs.clone()

    @property
    def fixed(self) -> Tensor:
        """``(F,)`` ``torch.long`` indices of the fixed atoms, in ``fixed_xyz`` order."""
        return self._fixed.clone()

    @property
    def n_atoms(self) -> int:
        """Number of atoms ``N``."""
        return self._n

    @property
    def n_fixed(self) -> int:
        """Number of fixed atoms ``F``."""
        return self._n_fixed

    @property
    def depth(self) -> int:
        """Number of dependency levels of fully referenced atoms (sequential level steps)."""
        return self._depth

    @property
    def n_components(self) -> int:
        """Number of connected components (molecules) in the table."""
        return self._n_components

    @property
    def components(self) -> Tensor:
        """``(N,)`` ``torch.long`` component index of each atom."""
        return torch.from_numpy(self._component.copy())

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return (
            f"ConstructionTable(n_atoms={self._n}, n_fixed={self.n_fixed}, "
            f"n_components={self.n_components}, depth={self.depth})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConstructionTable):
            return NotImplemented
        return np.array_equal(self._refs_np, other._refs_np) and np.array_equal(
            self._fixed_np, other._fixed_np
        )

    __hash__ = object.__hash__

    # ----------------------------------------------------------- constructors
    @classmethod
    def chain(cls, n: int) -> ConstructionTable:
        """Linear chain of ``n`` atoms: atom ``i`` references ``(i-1, i-2, i-3)``.

        Example:
            >>> import batched_nerf as bn
            >>> bn.ConstructionTable.chain(5).refs.tolist()[3:]
            [[2, 1, 0], [3, 2, 1]]
        """
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise ValueError(f"chain length must be a positive integer, got {n!r}")
        idx = np.arange(n)[:, None] - np.arange(1, 4)[None, :]
        return cls(np.where(idx >= 0, idx, -1))

    @classmethod
    def from_bonds(
        cls,
        bonds: Any,
        n_atoms: int,
        *,
        xyz: Any = None,
        root: int | None = None,
    ) -> ConstructionTable:
        """Table from a bond graph: bonded references, proper torsions, sibling branches.

        See :func:`batched_nerf._autotable.table_from_bonds` for the rules (rings,
        fragments, avoiding near-linear reference triples when ``xyz`` is given).

        Args:
            bonds: ``(B, 2)`` pairs of bonded atom indices.
            n_atoms: ``N``.
            xyz: optional ``(N, 3)`` coordinates used to avoid near-linear triples.
            root: atom to start from (default: chosen automatically).

        Raises:
            ValueError: an out-of-range bond index or bad shapes.

        Example:
            >>> import batched_nerf as bn
            >>> bn.ConstructionTable.from_bonds([(0, 1), (1, 2), (2, 3)], 4).n_atoms
            4
        """
        from ._autotable import table_from_bonds

        return table_from_bonds(bonds, n_atoms, xyz=xyz, root=root)

    @classmethod
    def from_xyz(cls, xyz: Any, elements: Sequence[str], *, scale: float = 1.2) -> ConstructionTable:
        """Table from ``(N, 3)`` coordinates (Angstrom), perceiving bonds from covalent radii.

        Atoms ``i, j`` are bonded when ``d_ij < scale * (r_i + r_j)``; then as
        :meth:`from_bonds`, avoiding near-linear references in these coordinates.

        Raises:
            ValueError: an unknown element or a shape mismatch.

        Example:
            >>> import batched_nerf as bn
            >>> mol = bn.data.load("alanine_dipeptide")
            >>> bn.ConstructionTable.from_xyz(mol.xyz, mol.elements).n_atoms
            22
        """
        from ._autotable import table_from_xyz

        return table_from_xyz(xyz, elements, scale=scale)

    # ------------------------------------------------------------------ plans
    def plan(self, kind: str, device: torch.device | str | None = None, block: int = 1) -> Any:
        """Build plan of an engine (``"levels"``, ``"scan"`` or ``"inverse"``), cached per device.

        CPU plans are built when the table is made (the level plan of a very deep
        table on first use); copies for other devices on first use, or ahead of
        time with :meth:`prepare`.
        """
        device = torch.device("cpu" if device is None else device)
        if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" share plans
            device = torch.device("cuda", torch.cuda.current_device())
        key = (kind, block, device)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        if kind not in PLAN_KINDS:
            raise ValueError(f"unknown plan kind {kind!r}; expected one of {PLAN_KINDS}")
        if torch.compiler.is_compiling():
            raise RuntimeError(
                f"the {kind!r} plan of this table is not ready for device {device}: call "
                f"table.prepare({str(device)!r}) before compiling a function that uses the table"
            )
        cpu_key = (kind, block, torch.device("cpu"))
        base = self._plans.get(cpu_key)
        if base is None:
            from . import _plan

            base = _plan.make_plan(kind, self, block)
            self._plans[cpu_key] = base
        cached = base if device.type == "cpu" else base.to(device)
        self._plans[key] = cached
        return cached

    def prepare(self, device: torch.device | str | None = None, *, levels: bool = True) -> ConstructionTable:
        """Build every engine's plan for ``device`` now; returns the table itself.

        Needed only before ``torch.compile`` on a non-CPU device (or for the
        level engine of a table deeper than ``EAGER_LEVELS_DEPTH``); elsewhere
        plans are made on first use.

        Example:
            >>> import batched_nerf as bn
            >>> table = bn.ConstructionTable.chain(8).prepare("cpu")
        """
        from ._dispatch import BLOCK_LARGE, BLOCK_SMALL

        self.plan("inverse", device)
        for block in (1, BLOCK_SMALL, BLOCK_LARGE):
            self.plan("scan", device, block)
        if levels:
            self.plan("levels", device)
        return self

    # numpy views for the planners (not public)
    @property
    def _levels(self) -> np.ndarray:
        return self._level


def _short(rows: Sequence[int] | np.ndarray, limit: int = 8) -> str:
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
