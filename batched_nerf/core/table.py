"""Construction tables: the static topology of a Z-matrix, validated once.

A [`ConstructionTable`][batched_nerf.ConstructionTable] holds, for each atom ``i``, the three atoms it is
placed from: ``(bond_ref, angle_ref, dihedral_ref)``, ``-1`` meaning "no
reference". It checks and analyses the rows once, when it is made (every check
names the offending row; see `batched_nerf.topology.analysis`), and caches what is derived
from them:

* the engines' build plans, made on first use, one engine and variant at a
  time, per device ([`ConstructionTable.plan`][batched_nerf.ConstructionTable.plan]; within the
  process's one byte budget, `batched_nerf.cache_budget`, least recently used dropped first;
  [`ConstructionTable.prepare`][batched_nerf.ConstructionTable.prepare] builds them ahead of
  ``torch.compile``);
* other static data ([`ConstructionTable.cached`][batched_nerf.ConstructionTable.cached]: one entry per
  caller).

Both live in the table's `runtime.state.State`, the one owner of derived state:
[`ConstructionTable.cache_info`][batched_nerf.ConstructionTable.cache_info] reports it in
bytes and [`ConstructionTable.release`][batched_nerf.ConstructionTable.release] frees it.

A table pickles as its rows, fixed atoms and topology (no plans, no memo), so
that sending it to ``DataLoader`` workers is cheap; plans are rebuilt there on
first use.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from .. import engines
from ..engines.compose import worth_composing
from ..engines.dispatch import single_path
from ..runtime.state import state_of
from ..runtime.torch_compat import clear_transforms, current_level, dynamo_loaded, no_functorch
from ..topology.analysis import FULL, THIRD, Topology, analyse
from ..topology.auto import refs_from_connectivity, refs_from_xyz

__all__ = ["ConstructionTable"]

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])
#: The CPU device, made once (`ConstructionTable.plan` without a device).
_CPU = torch.device("cpu")


def outside_inference_mode(fn: _F) -> _F:
    """``fn`` run outside ``torch.inference_mode`` and outside ``torch.func`` transforms
    (`_static_tensors`): what it makes are plain tensors that later calls may use and save.

    Cached tensors (plans, device copies, ``table.cached`` values, protein tables)
    first made inside ``torch.inference_mode()`` (a validation pass before training)
    would be inference tensors, and every later backward through them would fail;
    made inside ``jacrev``/``vmap`` they would be wrapped at a transform level that
    ends with the call (and their ``.numpy()`` would fail inside it). Skipped under
    ``torch.compile`` (which never builds caches).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        with _static_tensors():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _eager(reason: str) -> Callable[[_F], _F]:
    """``torch.compiler.disable`` with ``reason`` (shown by a ``fullgraph=True`` compile; torch
    releases before ``reason=`` existed show the function's name only)."""

    def wrap(fn: _F) -> _F:
        try:
            return torch.compiler.disable(fn, reason=reason)  # type: ignore[call-arg]
        except TypeError:  # pragma: no cover - torch without reason=
            return torch.compiler.disable(fn)

    return wrap


@contextmanager
def _static_tensors() -> Iterator[None]:
    """Make plan tensors as plain tensors: outside inference mode and outside torch.func transforms.

    A plan made on a first call under ``torch.inference_mode()`` would otherwise
    hold inference tensors that no later backward may save, and one made inside
    ``jacrev``/``hessian`` tensors wrapped at a transform level that ends with
    the call.
    """
    with ExitStack() as stack:
        if torch.is_inference_mode_enabled():
            stack.enter_context(torch.inference_mode(False))
        if current_level() is not None:
            stack.enter_context(no_functorch())  # torch 2.3 needs it too
            stack.enter_context(clear_transforms())
        yield


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
            [`to_cartesian`][batched_nerf.to_cartesian] as ``fixed_xyz`` (in this order).

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
        self._init(analyse(refs, fixed))

    @classmethod
    def _from_topology(
        cls, topology: Topology, parts: Sequence[ConstructionTable] | None = None
    ) -> ConstructionTable:
        """A table of an already analysed (checked) topology, e.g. one composed by ``pack_tables``.

        ``parts``: the tables ``topology`` concatenates (``pack_tables``), whose
        plans this table's plans are composed from where the engine can
        (`engines.compose`); kept for that (not pickled).
        """
        table = cls.__new__(cls)
        table._init(topology, parts)
        table._parts = tuple(parts) if parts is not None else None
        return table

    def _init(self, topology: Topology, parts: Sequence[ConstructionTable] | None = None) -> None:
        self._topology = topology
        if parts:  # packed: the dispatch values from the parts' (no array of the packed topology read)
            self._has_full = any(p._has_full for p in parts)
            self._n_third = sum(p._n_third for p in parts)
            self._largest_component = max(p._largest_component for p in parts)
        else:
            self._has_full = bool((topology.kind == FULL).any())
            self._n_third = int(np.count_nonzero(topology.kind == THIRD))
            sizes = np.bincount(topology.component, minlength=topology.n_components)
            self._largest_component = int(sizes.max(initial=0))
        # single_path's own first two tests, then the whole test where they do not decide
        if not self._has_full or self._n_third != 1:
            self._single_path = not self._has_full
        else:
            self._single_path = single_path(topology)
        self._state = state_of(topology)  # plans and memo: derived from the rows, kept with them
        self._parts: tuple[ConstructionTable, ...] | None = None
        for engine in engines.ENGINES.values():  # plans that cost next to nothing, if any
            if engine.eager:
                self.plan(engine.name, None, engine.variants[0])

    def __getstate__(self) -> dict[str, Any]:
        # rows and analysis only: plans and the memo are rebuilt on first use
        return {"topology": self._topology}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._init(state["topology"])

    # ------------------------------------------------------------- properties
    @property
    def topology(self) -> Topology:
        """Read-only analysis of the rows: kinds, components, levels, build order, seeds.

        See [`Topology`][batched_nerf.Topology] (read-only numpy arrays, plain ``int`` counts).
        """
        return self._topology

    @property
    def refs(self) -> Tensor:
        """``(N, 3)`` ``torch.long`` references, ``-1`` for none (CPU, read-only copy)."""
        return torch.from_numpy(self._topology.refs.copy())

    @property
    def fixed(self) -> Tensor:
        """``(F,)`` ``torch.long`` indices of the fixed atoms, in ``fixed_xyz`` order."""
        return torch.from_numpy(self._topology.fixed.copy())

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
    def single_path(self) -> bool:
        """The scan engine builds this table as one unbranched path (a chain); fixed when it is made.

        Read by ``method="auto"`` (`single_path`).
        """
        return self._single_path

    @property
    def n_components(self) -> int:
        """Number of connected components (molecules) in the table."""
        return self._topology.n_components

    @property
    def largest_component(self) -> int:
        """Atoms of the largest connected component (0 for an empty table); fixed when it is made.

        Read by ``method="auto"`` on GPUs (`batched_nerf.engines.gpu_policy`): the
        fused Triton kernel walks each component atom by atom.

        Example:
            >>> import batched_nerf as bn
            >>> parts = [bn.ConstructionTable.chain(3), bn.ConstructionTable.chain(5)]
            >>> bn.pack_tables(parts).largest_component
            5
        """
        return self._largest_component

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

        See `batched_nerf.topology.auto.refs_from_connectivity` for the rules
        (rings, avoiding near-linear reference triples when ``xyz`` is given).
        With coordinates, disconnected fragments (the molecules of a dimer, the
        ions of a salt) are linked into one build by default: each further
        fragment's seed atoms reference the nearest atoms already placed. Those
        references are not chemical bonds; [`nonbonded_references`][batched_nerf.nonbonded_references]
        marks them.

        Args:
            connectivity: ``(E, 2)`` pairs of bonded atom indices.
            n_atoms: ``N``.
            xyz: optional ``(N, 3)`` coordinates used to avoid near-linear
                triples and to link the fragments (their values only: also
                inside ``torch.func.grad``, ``jacrev``, ``jacfwd``, ``hessian``).
            root: atom to start from (default: chosen automatically).
            link_fragments: one build for all fragments (default when ``xyz``
                is given), or one seed triple per fragment (``False``).

        Raises:
            ValueError: an out-of-range pair index, bad shapes, coincident atoms
                in ``xyz``, ``link_fragments=True`` without ``xyz``, or ``xyz``
                batched by ``torch.func.vmap`` (one table serves the batch).

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
        """Deprecated alias of [`from_connectivity`][batched_nerf.ConstructionTable.from_connectivity]
        (``bonds`` are bond lengths elsewhere).

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
        al. 2008 radii, [`perceive_connectivity`][batched_nerf.perceive_connectivity]); then as
        [`from_connectivity`][batched_nerf.ConstructionTable.from_connectivity], avoiding near-linear
        references in these
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
    def plan(
        self,
        kind: str,
        device: torch.device | str | None = None,
        variant: int = 1,
        *,
        block: int | None = None,
    ) -> Any:
        """Build plan of an engine (``"levels"``, ``"scan"``, ``"inverse"``, ...), cached per device.

        Made on first use, for this engine, variant and device only (numpy work
        on [`topology`][batched_nerf.ConstructionTable.topology], which also runs inside ``torch.func``
        transforms);
        a plan for another device is a copy of the CPU one. ``variant`` is the
        engine's plan variant (the scan engine's band size; ``block=`` is its
        old name, still accepted). Plans are static: they are built outside
        inference mode and outside ``torch.func`` transforms, so a plan first
        made under ``torch.inference_mode()`` or inside ``jacrev`` serves every
        later call and backward pass. Plans of every table share the process's byte
        budget ([`cache_budget`][batched_nerf.cache_budget]), least recently used dropped
        first (made again on next use).

        Under ``torch.compile`` a missing plan is made eagerly (a graph break on the
        table's first use; [`prepare`][batched_nerf.ConstructionTable.prepare] ahead avoids it).

        Raises:
            ValueError: an unknown engine.
        """
        if device is None:  # the common call: no device made (cheaper on every call)
            device = _CPU
        else:
            device = torch.device(device)
            if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" share plans
                device = torch.device("cuda", torch.cuda.current_device())
        if block is not None:
            variant = block
        key = (kind, variant, device)
        cached = self._state.plans.get(key)
        if cached is not None:
            if not torch.compiler.is_compiling():
                self._state.touch_plan(key)
            return cached
        if kind not in engines.ENGINES:
            raise ValueError(f"unknown plan kind {kind!r}; expected one of {tuple(engines.ENGINES)}")
        if torch.compiler.is_compiling():  # numpy work: eagerly, a graph break (`_eager_make_plan`)
            return _eager_make_plan()(self, kind, variant, device)
        if dynamo_loaded():  # a compile may come: wrapped now, where it costs nothing
            _eager_make_plan()
        return self._make_plan(kind, variant, device)

    def _make_plan(self, kind: str, variant: int, device: torch.device) -> Any:
        """Plan ``(kind, variant, device)`` made and kept: numpy work, run eagerly also when
        ``torch.compile`` traces the caller (`_eager_make_plan`: a graph break on a table's first use)."""
        key = (kind, variant, device)
        with _static_tensors():
            cpu_key = (kind, variant, torch.device("cpu"))
            base = self._state.plans.get(cpu_key)
            if base is None:
                base = self._composed(kind, variant)
                if base is None:
                    base = engines.make_plan(kind, self._topology, variant)
                self._state.keep_plan(cpu_key, base)
            cached = base if device.type == "cpu" else base.to(device)
        self._state.keep_plan(key, cached)
        return cached

    def _composed(self, kind: str, variant: int) -> Any:
        """The CPU plan composed from the parts' plans (a packed table), or None to plan from scratch.

        Parts without the plan yet are planned first (once: later packs of them
        reuse it) when that is worth it (`engines.compose.worth_composing`).
        """
        compose = engines.get(kind).compose
        if not self._parts or compose is None:
            return None
        cpu_key = (kind, variant, torch.device("cpu"))
        missing = len({id(p) for p in self._parts if cpu_key not in p._state.plans})
        if not worth_composing(self._topology.n_atoms, missing):
            return None
        return compose([p.plan(kind, None, variant) for p in self._parts], self._topology)

    def prepare(
        self,
        device: torch.device | str | None = None,
        *,
        methods: Iterable[str] | None = None,
        levels: bool = True,
    ) -> ConstructionTable:
        """Build plans for ``device`` now (every variant of each engine); returns the table itself.

        Plans are otherwise made on first use. Call this before ``torch.compile``
        of a function that uses the table, since a trace cannot build them
        ([`compile_builder`][batched_nerf.compile_builder] prepares what each call needs by
        itself), or to move the planning cost out of a timed loop.

        Args:
            device: the inputs' device (default CPU).
            methods: the engines to plan (default: every engine).
            levels: plan the level engine too (with the default ``methods``).

        Raises:
            ValueError: an unknown engine in ``methods``.

        Example:
            >>> import batched_nerf as bn
            >>> table = bn.ConstructionTable.chain(8).prepare("cpu")
        """
        names = list(engines.ENGINES) if methods is None else list(methods)
        for name in names:
            engine = engines.get(name)
            if levels or methods is not None or engine.name != "levels":
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
        memo = self._state.memo
        try:
            return memo[key]
        except KeyError:
            value = memo[key] = outside_inference_mode(make)(self._topology)
            return value

    def cache_info(self) -> dict[str, int]:
        """What the table keeps derived from its rows: counts and bytes.

        Returns:
            ``{"plans", "plan_bytes", "memo", "memo_bytes"}``: the engines' plans
            kept (within [`cache_budget`][batched_nerf.cache_budget], least recently
            used dropped first) and the [`cached`][batched_nerf.ConstructionTable.cached]
            entries, with the bytes of every array and tensor they hold (each
            storage counted once; plans on a GPU count their device memory). The
            rows themselves are not counted. See
            [`batched_nerf.cache_info`][batched_nerf.cache_info] for the whole process.

        Example:
            >>> import batched_nerf as bn, torch
            >>> table = bn.ConstructionTable.chain(100)
            >>> _ = bn.to_cartesian(torch.ones(100), torch.full((100,), 1.9), torch.zeros(100), table)
            >>> info = table.cache_info()
            >>> info["plans"] >= 1 and info["plan_bytes"] > 0
            True
            >>> table.release().cache_info()["plan_bytes"]
            0
        """
        return self._state.info()

    def release(self) -> ConstructionTable:
        """Free every plan and memo entry now; they are made again on next use. Returns the table.

        For a data set of many tables that each served once (their plans would
        otherwise live as long as the tables). Results do not change: plans are
        a pure function of the rows.
        """
        self._state.clear()
        return self


#: `_eager_make_plan`'s wrapper, once made.
_EAGER: dict[str, Callable[..., Any]] = {}


def _eager_make_plan() -> Callable[..., Any]:
    """`ConstructionTable._make_plan` under ``torch.compiler.disable`` (a graph break, with the reason
    a ``fullgraph=True`` compile shows), made once: at import where torch's compiler front end is
    loaded already (`dynamo_loaded`), else at the first plan made outside a compile once it is, else
    inside the first compile that makes a plan (there the wrapping is itself the graph break, and a
    ``fullgraph=True`` compile's error shows the reason in its debug context only). Not at class
    definition: ``torch.compiler.disable`` loads the front end, about 2 s that ``import
    batched_nerf`` need not pay."""
    wrapped = _EAGER.get("make_plan")
    if wrapped is None:
        wrapped = _EAGER["make_plan"] = _eager(
            "a table's plan is made on its first use, in numpy: "
            "call table.prepare(device) before compiling with fullgraph=True"
        )(ConstructionTable._make_plan)
    return wrapped


if dynamo_loaded():
    _eager_make_plan()
