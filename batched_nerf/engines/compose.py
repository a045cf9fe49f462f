"""Plans of a packed table composed from its parts' plans: concatenation with offsets, no re-planning.

[`batched_nerf.pack_tables`][batched_nerf.pack_tables] puts tables one after another (atom ``k`` of
part ``m`` becomes atom ``offset_m + k``; its topology is
`batched_nerf.topology.analysis.concatenate`). Every reference stays inside its
part, so a plan whose entries are per-atom (or per-row) values and indices is
the parts' plans laid end to end, with the atom, row and fixed-slot offsets
added to the index entries (``-1`` kept). That is a handful of whole-array numpy
passes over the packed atoms, against a planner's tens of passes (and the
frame tree) for a table planned from scratch.

* `compose_fused` (`FusedPlan`): the ``(12, N)`` index
  arrays concatenated (atom, reference rows, parent and sibling rows and flip
  atom shifted by the part's atom offset, fixed slots by its fixed-atom
  offset, pose slots by its seeded-component offset); work units regrouped
  *on the parts' unit boundaries*: a part's unit ``[s, e)`` starts a new unit
  of the packed plan where ``s // target`` changes,
  ``target = max(UNIT_MIN_ATOMS, ceil(N / UNITS_MAX))``, the rule
  `fused_plan` applies to component boundaries. Where every part
  is a single component (or a single unit of its own) the composed plan equals
  ``fused_plan`` of the packed topology array for array; otherwise its units
  are coarser (a part's unit is never split) and its rows may be ordered
  differently within a part, with the same values bit for bit (each atom is
  placed from its references only; units hold whole components).
* `compose_padded`: `compose_fused` with each part's atoms placed at
  ``k * stride + j`` in a padded output layout (the placed and flip atom entries
  moved, the rows as in the packed plan): the plan of
  `padded`, written in one pass.
* `compose_inverse` (`InversePlan`): the safe reference
  gathers shifted by the atom offsets, the masks concatenated; equal to
  `inverse_plan` of the packed topology.

The table ([`batched_nerf.ConstructionTable.plan`][batched_nerf.ConstructionTable.plan]) composes a packed
table's plan when its parts have theirs (`worth_composing`), else plans
from scratch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..topology.analysis import Topology
from .fused.build import UNIT_MIN_ATOMS, UNITS_MAX, FusedPlan
from .inverse import InversePlan

__all__ = ["PLAN_ATOMS", "compose_fused", "compose_inverse", "compose_padded", "worth_composing"]

#: Planning a table costs about one fixed overhead (tens of numpy passes) plus a per-atom part; the
#: fixed part is worth about this many atoms (fused plan, 2-core CPU). Used by :func:`worth_composing`.
PLAN_ATOMS = 512


def worth_composing(n_atoms: int, n_missing: int) -> bool:
    """Whether to plan the ``n_missing`` parts that lack a plan and compose, rather than plan anew.

    Planning ``m`` parts of ``n`` atoms in all costs about ``m`` fixed overheads
    plus ``n`` atoms, planning the packed table of ``N`` atoms one overhead plus
    ``N`` atoms; composing afterwards costs a few whole-array passes. So parts
    are planned (each once: later packs reuse their plans) while
    ``m <= 1 + N // PLAN_ATOMS``.

    Example:
        >>> worth_composing(26_000, 32), worth_composing(2_500, 64), worth_composing(100, 0)
        (True, False, True)
    """
    return n_missing <= 1 + n_atoms // PLAN_ATOMS


def _offsets(sizes: Sequence[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))]).astype(np.int64)


def _shift_kept(view: np.ndarray, offset: np.ndarray) -> None:
    """``view += offset`` in place where ``view >= 0`` (``-1``: none, kept)."""
    none = view < 0
    view += offset
    np.putmask(view, none, -1)


def compose_fused(parts: Sequence[FusedPlan], topo: Topology) -> FusedPlan:
    """The fused plan of the packed ``topo`` from its parts' plans (see the module docstring).

    Args:
        parts: the fused plans of the packed tables, in packing order.
        topo: the packed topology (``concatenate`` of the parts' topologies).

    Raises:
        ValueError: the parts' atom counts do not add up to ``topo.n_atoms``.

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf.engines.fused.build import fused_plan
        >>> water = bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
        >>> chain = bn.ConstructionTable.chain(5)
        >>> packed = bn.pack_tables([water, chain])
        >>> plan = compose_fused([fused_plan(water.topology), fused_plan(chain.topology)], packed.topology)
        >>> bool((plan.index == fused_plan(packed.topology).index).all()), plan.starts.tolist()
        (True, [0, 8])
    """
    return _composed(parts, topo, None)


def compose_padded(parts: Sequence[FusedPlan], topo: Topology, stride: int) -> FusedPlan:
    """`compose_fused` with part ``k``'s atom ``j`` placed at ``k * stride + j`` (a padded layout).

    The kernels read and write atoms through the plan's atom entries only (the
    placed atom and the ``sin(angle) < 0`` flip atom), so the plan of the packed
    table writing into a ``(B * stride)``-atom padded layout is the composed plan
    with those two entries moved: one pass, with no packed plan made first.

    Raises:
        ValueError: the parts' atom counts do not add up to ``topo.n_atoms``, or a
            part has more than ``stride`` atoms.

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf.engines.fused.build import fused_plan
        >>> a, b = bn.ConstructionTable.chain(3), bn.ConstructionTable.chain(2)
        >>> parts = [fused_plan(a.topology), fused_plan(b.topology)]
        >>> plan = compose_padded(parts, bn.pack_tables([a, b]).topology, 4)
        >>> plan.index[0].tolist()
        [0, 1, 2, 4, 5]
    """
    sizes = [p.index.shape[1] for p in parts]
    if max(sizes, default=0) > stride:
        raise ValueError(f"a part of {max(sizes)} atoms does not fit a padded stride of {stride}")
    return _composed(parts, topo, np.arange(len(parts), dtype=np.int64) * stride)


def _composed(parts: Sequence[FusedPlan], topo: Topology, placed: np.ndarray | None) -> FusedPlan:
    """The packed plan of ``parts``, part ``k``'s atoms at ``placed[k] + j`` (default: its atom offset)."""
    atom_off = _checked_offsets([p.index.shape[1] for p in parts], topo)
    starts, width = _composed_units(parts, atom_off, topo.n_atoms)
    return FusedPlan(
        index=_composed_index(parts, atom_off, placed),
        starts=starts,
        runs=np.concatenate([[0], *(off + p.runs[1:] for off, p in zip(atom_off, parts))]).astype(np.int64),
        topology=topo,
        width=width,
        reach=max((p.reach for p in parts), default=0),
    )


def _checked_offsets(sizes: Sequence[int], topo: Topology) -> np.ndarray:
    atom_off = _offsets(sizes)
    if int(atom_off[-1]) != topo.n_atoms:
        raise ValueError(
            f"the parts' plans hold {int(atom_off[-1])} atoms, the packed topology {topo.n_atoms}"
        )
    return atom_off


def _composed_index(
    parts: Sequence[FusedPlan], atom_off: np.ndarray, placed: np.ndarray | None = None
) -> np.ndarray:
    """``(12, N)`` index of the parts one after another: rows shifted by ``atom_off``, atoms (placed, flip)
    by ``placed`` (default ``atom_off``), fixed and pose slots by the parts' counts; ``-1`` kept."""
    sizes = np.diff(atom_off)
    index = np.concatenate([p.index for p in parts], axis=1) if parts else np.zeros((12, 0), np.int64)
    # whole-array passes in place: the concatenation is the one array as large as the plan (fresh
    # large arrays cost page faults, more than the arithmetic); per-part slices cost more in Python
    shift = np.repeat(atom_off[:-1], sizes)
    if placed is None:
        index[0] += shift  # atoms: never -1
        _shift_kept(index[2:8], shift)  # reference rows, parent row, sibling row, flip atom
    else:
        moved = np.repeat(placed, sizes)
        index[0] += moved
        _shift_kept(index[2:7], shift)  # reference rows, parent row, sibling row
        _shift_kept(index[7], moved)  # flip atom
    fixed_off = _offsets([p.topology.n_fixed for p in parts])
    if int(fixed_off[-1]):
        _shift_kept(index[8], np.repeat(fixed_off[:-1], sizes))  # fixed slots
    seeded_off = _offsets([p.topology.seed_root.size for p in parts])
    if int(seeded_off[-1]):
        _shift_kept(index[11], np.repeat(seeded_off[:-1], sizes))  # pose slots
    return index


def _composed_units(parts: Sequence[FusedPlan], atom_off: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """Unit starts ``(U + 1,)`` of the composed plan and its widest unit: every part's unit starts, in
    packed rows; a new packed unit where ``start // target`` changes (the module docstring)."""
    if not parts:
        return np.zeros(1, dtype=np.int64), 1
    begins = np.concatenate([p.starts[:-1] + o for p, o in zip(parts, atom_off[:-1])])
    target = max(UNIT_MIN_ATOMS, -(-n // UNITS_MAX))
    key = begins // target
    keep = np.ones(begins.size, dtype=bool)
    keep[1:] = key[1:] != key[:-1]
    starts = np.append(begins[keep], n).astype(np.int64) if n else np.zeros(1, dtype=np.int64)
    return starts, int(np.diff(starts).max(initial=1))


def compose_inverse(parts: Sequence[InversePlan], topo: Topology) -> InversePlan:
    """The inverse-map plan of the packed ``topo`` from its parts' plans (equal to planning it).

    Raises:
        ValueError: the parts' atom counts do not add up to ``topo.n_atoms``.

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf.engines.inverse import inverse_plan
        >>> a, b = bn.ConstructionTable.chain(3), bn.ConstructionTable.chain(4)
        >>> packed = bn.pack_tables([a, b])
        >>> plan = compose_inverse([inverse_plan(a.topology), inverse_plan(b.topology)], packed.topology)
        >>> plan.refs[3:].tolist() == inverse_plan(packed.topology).refs[3:].tolist()
        True
    """
    sizes = [int(p.refs.shape[0]) for p in parts]
    atom_off = _checked_offsets(sizes, topo)
    shift = torch.from_numpy(np.repeat(atom_off[:-1], sizes))
    refs = torch.cat([p.refs for p in parts]) + shift[:, None]  # safe refs (never -1): all shifted
    return InversePlan(
        refs=refs,
        has_bond=torch.cat([p.has_bond for p in parts]),
        has_angle=torch.cat([p.has_angle for p in parts]),
        has_dihedral=torch.cat([p.has_dihedral for p in parts]),
    )
