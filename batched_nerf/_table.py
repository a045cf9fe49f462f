"""Construction tables: the static topology of a Z-matrix, validated once.

A :class:`ConstructionTable` holds, for each atom ``i``, the three atoms it is
placed from: ``(bond_ref, angle_ref, dihedral_ref)``, ``-1`` meaning "no
reference". It checks the rows once, when it is made (every check names the
offending row; see :mod:`._topology`), and caches what is derived from them:
the engines' build plans per device and other static data
(:meth:`ConstructionTable.cached`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from . import engines
from ._autotable import refs_from_connectivity, refs_from_xyz
from ._topology import Topology, analyse

__all__ = ["ConstructionTable"]

#: Deeper tables build their level plan (one entry per level) on first use only.
EAGER_LEVELS_DEPTH = 256

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])


def outside_inference_mode(fn: _F) -> _F:
    """``fn`` run with ``torch.inference_mode(False)``: what it makes can be saved for backward.

    Cached tensors (plans, device copies, ``table.cached`` values) first made
    inside ``torch.inference_mode()`` (a validation pass before training) would
    be inference tensors, and every later backward through them would fail.
    Skipped under ``torch.compile`` (which never builds caches).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling() and torch.is_inference_mode_enabled():
            with torch.inference_mode(False):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


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
        self._topology = analyse(refs, fixed)
        self._refs = torch.from_numpy(self._topology.refs.copy())
        self._fixed = torch.from_numpy(self._topology.fixed.copy())
        self._plans: dict[tuple[str, int, torch.device], Any] = {}
        self._memo: dict[Any, Any] = {}
        # Plans are static structure: build the CPU ones now, outside any
        # torch.func transform or torch.compile trace that a first call may sit in.
        self.prepare(levels=self._topology.depth <= EAGER_LEVELS_DEPTH)

    # ------------------------------------------------------------- properties
    @property
    def topology(self) -> Topology:
        """Read-only analysis of the rows: kinds, components, levels, build order, seeds.

        See :class:`~batched_nerf.Topology` (read-only numpy arrays, plain ``int`` counts).
        """
        return self._topology

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
        """Number of atoms ``N``: rows of the table, dummy atoms included."""
        return self._topology.n_atoms

    @property
    def n_fixed(self) -> int:
        """Number of fixed atoms ``F``."""
        return self._topology.n_fixed

    @property
    def depth(self) -> int:
        """Number of dependency levels of fully referenced atoms (sequential level steps)."""
        return self._topology.depth

    @property
    def n_components(self) -> int:
        """Number of connected components (molecules) in the table."""
        return self._topology.n_components

    @property
    def components(self) -> Tensor:
        """``(N,)`` ``torch.long`` component index of each atom."""
        return torch.from_numpy(self._topology.component.copy())

    def __len__(self) -> int:
        return self._topology.n_atoms

    def __repr__(self) -> str:
        return (
            f"ConstructionTable(n_atoms={self.n_atoms}, n_fixed={self.n_fixed}, "
            f"n_components={self.n_components}, depth={self.depth})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConstructionTable):
            return NotImplemented
        mine, theirs = self._topology, other._topology
        return np.array_equal(mine.refs, theirs.refs) and np.array_equal(mine.fixed, theirs.fixed)

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
    def from_connectivity(
        cls,
        connectivity: Any,
        n_atoms: int,
        *,
        xyz: Any = None,
        root: int | None = None,
        link_fragments: bool | None = None,
    ) -> ConstructionTable:
        """Table from a bond graph: bonded references, proper torsions, sibling branches.

        See :func:`batched_nerf._autotable.refs_from_connectivity` for the rules
        (rings, avoiding near-linear reference triples when ``xyz`` is given).
        With coordinates, disconnected fragments (the molecules of a dimer, the
        ions of a salt) are linked into one build by default: each further
        fragment's seed atoms reference the nearest atoms already placed. Those
        references are not chemical bonds; :func:`~batched_nerf.nonbonded_references`
        marks them.

        Args:
            connectivity: ``(E, 2)`` pairs of bonded atom indices.
            n_atoms: ``N``.
            xyz: optional ``(N, 3)`` coordinates used to avoid near-linear
                triples and to link the fragments.
            root: atom to start from (default: chosen automatically).
            link_fragments: one build for all fragments (default when ``xyz``
                is given), or one seed triple per fragment (``False``).

        Raises:
            ValueError: an out-of-range pair index, bad shapes, coincident atoms
                in ``xyz``, or ``link_fragments=True`` without ``xyz``.

        Example:
            >>> import batched_nerf as bn
            >>> bn.ConstructionTable.from_connectivity([(0, 1), (1, 2), (2, 3)], 4).n_atoms
            4
        """
        auto = refs_from_connectivity(
            connectivity, n_atoms, xyz=xyz, root=root, link_fragments=link_fragments
        )
        return cls(auto.refs)

    @classmethod
    def from_bonds(
        cls,
        bonds: Any,
        n_atoms: int,
        *,
        xyz: Any = None,
        root: int | None = None,
    ) -> ConstructionTable:
        """Deprecated alias of :meth:`from_connectivity` (``bonds`` are bond lengths elsewhere).

        Warns:
            DeprecationWarning: always.

        Example:
            >>> import warnings, batched_nerf as bn
            >>> with warnings.catch_warnings():
            ...     warnings.simplefilter("ignore", DeprecationWarning)
            ...     bn.ConstructionTable.from_bonds([(0, 1), (1, 2)], 3).n_atoms
            3
        """
        warnings.warn(
            "ConstructionTable.from_bonds is deprecated; use ConstructionTable.from_connectivity "
            "(the bond graph is called connectivity, bonds are bond lengths)",
            DeprecationWarning,
            stacklevel=2,
        )
        return cls.from_connectivity(bonds, n_atoms, xyz=xyz, root=root)

    @classmethod
    def from_xyz(
        cls, xyz: Any, elements: Sequence[str], *, scale: float = 1.3, link_fragments: bool = True
    ) -> ConstructionTable:
        """Table from ``(N, 3)`` coordinates (Angstrom), perceiving bonds from covalent radii.

        Atoms ``i, j`` are bonded when ``d_ij < scale * (r_i + r_j)`` (Cordero et
        al. 2008 radii, :func:`~batched_nerf.perceive_connectivity`); then as
        :meth:`from_connectivity`, avoiding near-linear references in these
        coordinates and linking the fragments into one build (unless
        ``link_fragments=False``).

        Raises:
            ValueError: an unknown element, a shape mismatch, or coincident atoms.

        Warns:
            UserWarning: most atoms have no bond (coordinates in bohr?).

        Example:
            >>> import batched_nerf as bn
            >>> mol = bn.data.load("alanine_dipeptide")
            >>> bn.ConstructionTable.from_xyz(mol.to_cartesian(), mol.elements).n_atoms
            22
        """
        return cls(refs_from_xyz(xyz, elements, scale=scale, link_fragments=link_fragments).refs)

    # ------------------------------------------------------------------ plans
    @outside_inference_mode  # plans made under inference_mode must still work with autograd
    def plan(self, kind: str, device: torch.device | str | None = None, block: int = 1) -> Any:
        """Build plan of an engine (``"levels"``, ``"scan"`` or ``"inverse"``), cached per device.

        CPU plans are built when the table is made (the level plan of a very
        deep table on first use). A table is not tied to a device: the first
        call with inputs on another device copies the plans there (or ahead of
        time, :meth:`prepare`). ``block`` is the engine's plan variant (the
        scan engine's band size).

        Raises:
            ValueError: an unknown engine.
            RuntimeError: the plan is missing while ``torch.compile`` traces.
        """
        device = torch.device("cpu" if device is None else device)
        if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" share plans
            device = torch.device("cuda", torch.cuda.current_device())
        key = (kind, block, device)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        if kind not in engines.ENGINES:
            raise ValueError(f"unknown plan kind {kind!r}; expected one of {tuple(engines.ENGINES)}")
        if torch.compiler.is_compiling():
            raise RuntimeError(
                f"the {kind!r} plan of this table is not ready for device {device}: call "
                f"table.prepare({str(device)!r}) before compiling a function that uses the table"
            )
        cpu_key = (kind, block, torch.device("cpu"))
        base = self._plans.get(cpu_key)
        if base is None:
            base = engines.make_plan(kind, self._topology, block)
            self._plans[cpu_key] = base
        cached = base if device.type == "cpu" else base.to(device)
        self._plans[key] = cached
        return cached

    def prepare(self, device: torch.device | str | None = None, *, levels: bool = True) -> ConstructionTable:
        """Build every engine's plans for ``device`` now; returns the table itself.

        Needed only before ``torch.compile`` on a non-CPU device (or for the
        level engine of a table deeper than ``EAGER_LEVELS_DEPTH``); elsewhere
        plans are made on first use.

        Example:
            >>> import batched_nerf as bn
            >>> table = bn.ConstructionTable.chain(8).prepare("cpu")
        """
        for engine in engines.ENGINES.values():
            if levels or engine.name != "levels":
                for variant in engine.variants:
                    self.plan(engine.name, device, variant)
        return self

    def cached(self, key: Any, make: Callable[[Topology], _T]) -> _T:
        """Static data derived from the topology, computed once per table.

        The one per-table memo of the package (pose layout, log-det masks and
        clash pair lists use it): ``make(table.topology)`` runs on the first
        call for ``key``, and its result is returned from then on. Use a key
        that names the caller (e.g. the function ``make`` itself). ``make``
        runs outside ``torch.inference_mode``, so tensors it builds during an
        inference pass can still take part in a later backward.

        Example:
            >>> import batched_nerf as bn
            >>> table = bn.ConstructionTable.chain(5)
            >>> table.cached("n_full", lambda topo: int((topo.kind == 3).sum()))
            2
        """
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = outside_inference_mode(make)(self._topology)
            return value
