"""Build plans: everything an engine needs from a table, as index tensors.

Plans are computed once per table (see :meth:`ConstructionTable.plan`) from the
table's numpy topology, and copied to other devices on demand.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ._table import FULL, ROOT, SECOND, THIRD

if TYPE_CHECKING:  # pragma: no cover
    from ._table import ConstructionTable


def _long(values: Any) -> Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64))


def _to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, _Movable):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to(o, device) for o in obj)
    return obj


class _Movable:
    """Mixin: ``plan.to(device)`` copies every tensor field."""

    def to(self, device: torch.device) -> Any:
        return replace(self, **{f.name: _to(getattr(self, f.name), device) for f in fields(self)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class SeedPlan(_Movable):
    """Closed-form placement of fixed, root and seed atoms (block 0 of every engine).

    Block 0 lists fixed atoms (in ``fixed`` order), roots, second and third seed
    atoms, in that order.
    """

    n_fixed: int
    n_roots: int
    second: Tensor  # (S2,) atom index of second seed atoms
    third: Tensor  # (S3,) atom index of third seed atoms
    third_from_second: Tensor  # (S3,) bool: the bond ref is the second atom (else the root)
    third_second_slot: Tensor  # (S3,) index into `second` of the component's second atom
    atoms: Tensor  # (n0,) atom index of every block-0 slot


@dataclass(frozen=True)
class LevelPlan(_Movable):
    """Dependency-level plan: atoms whose references are placed are built together.

    The engine works atom-major, ``(n, 3, B)`` with the batch innermost. Block 0
    holds fixed atoms, roots, second and third seed atoms (the order of
    ``seeds.atoms``); block ``k >= 1`` the atoms of level ``k``. Level ``k``
    concatenates ``parts[k]`` (each a whole earlier block, or some of its rows)
    and then, unless ``gathers[k]`` is None, picks the rows ``all d, all a,
    all b`` refs of its atoms from that pool. Every copy is at most a small
    multiple of the level's own size, so a build does linear work in N.
    """

    seeds: SeedPlan
    rows: Tensor  # (S2 + S3 + M,) atoms whose (bond, angle, dihedral) are read: seconds, thirds, full
    full_atoms: Tensor  # (M,) fully referenced atoms in build order
    level_sizes: tuple[int, ...]  # atoms per level, summing to M
    parts: tuple[tuple[tuple[int, Tensor | None], ...], ...]  # per level: (block, rows or None = all)
    gathers: tuple[Tensor | None, ...]  # per level: (3 * n_k,) rows of the pool, or None if in order
    inverse: Tensor  # (N,) position of each atom in cat(all blocks)


def seed_arrays(table: ConstructionTable) -> dict[str, np.ndarray]:
    """Block-0 layout as numpy arrays (planners work on numpy only, never on tensors)."""
    refs = table._refs_np
    n_refs = (refs >= 0).sum(1)
    fixed = table._fixed_np
    is_fixed = np.zeros(len(refs), dtype=bool)
    is_fixed[fixed] = True
    roots = np.flatnonzero((n_refs == ROOT) & ~is_fixed)
    second = np.flatnonzero(n_refs == SECOND)
    third = np.flatnonzero(n_refs == THIRD)
    slot_of_second = {int(a): k for k, a in enumerate(second)}
    comp = table._component
    second_of_comp = {int(comp[a]): int(a) for a in second}
    from_second = np.array([refs[t, 0] in slot_of_second for t in third], dtype=bool)
    return {
        "fixed": fixed,
        "roots": roots,
        "second": second,
        "third": third,
        "third_from_second": from_second,
        "third_second_slot": np.array(
            [slot_of_second[second_of_comp[int(comp[t])]] for t in third], dtype=np.int64
        ),
        "atoms": np.concatenate([fixed, roots, second, third]).astype(np.int64),
    }


def seed_plan(table: ConstructionTable, arrays: dict[str, np.ndarray] | None = None) -> SeedPlan:
    """Tensors of the block-0 layout (``arrays``: :func:`seed_arrays`, if already made)."""
    arrays = seed_arrays(table) if arrays is None else arrays
    return SeedPlan(
        n_fixed=int(arrays["fixed"].size),
        n_roots=int(arrays["roots"].size),
        second=_long(arrays["second"]),
        third=_long(arrays["third"]),
        third_from_second=torch.as_tensor(arrays["third_from_second"]),
        third_second_slot=_long(arrays["third_second_slot"]),
        atoms=_long(arrays["atoms"]),
    )


def level_plan(table: ConstructionTable) -> LevelPlan:
    seed_np = seed_arrays(table)
    seeds = seed_plan(table, seed_np)
    refs = table._refs_np
    level = table._levels
    n_refs = (refs >= 0).sum(1)
    block = np.full(len(refs), -1, dtype=np.int64)
    slot = np.full(len(refs), -1, dtype=np.int64)
    block0 = seed_np["atoms"]
    block[block0] = 0
    slot[block0] = np.arange(block0.size)
    full = np.flatnonzero(n_refs == FULL)
    order = full[np.argsort(level[full], kind="stable")]
    sizes = np.bincount(level[order], minlength=int(level.max(initial=0)) + 1)[1:]
    block_size = [int(block0.size)] + [int(s) for s in sizes]
    parts: list[tuple[tuple[int, Tensor | None], ...]] = []
    gathers: list[Tensor | None] = []
    start = 0
    for k, size in enumerate(sizes.tolist(), start=1):
        atoms = order[start : start + size]
        start += size
        block[atoms] = k
        slot[atoms] = np.arange(size)
        need = refs[atoms][:, ::-1].T.ravel()  # all d, all a, all b refs
        level_parts: list[tuple[int, Tensor | None]] = []
        pool_row = {}
        offset = 0
        for s in sorted(set(block[need].tolist())):
            used = np.unique(slot[need[block[need] == s]])
            whole = 2 * used.size >= block_size[s]  # copy the whole block unless it is mostly unused
            rows = np.arange(block_size[s]) if whole else used
            level_parts.append((s, None if whole else _long(rows)))
            pool_row.update({(s, int(r)): offset + j for j, r in enumerate(rows)})
            offset += rows.size
        flat = np.array([pool_row[(int(b), int(r))] for b, r in zip(block[need], slot[need])])
        parts.append(tuple(level_parts))
        in_order = flat.size == offset and np.array_equal(flat, np.arange(offset))
        gathers.append(None if in_order else _long(flat))
    block_start = np.concatenate([[0], np.cumsum(block_size)])
    inverse = block_start[block] + slot
    return LevelPlan(
        seeds=seeds,
        rows=_long(np.concatenate([seed_np["second"], seed_np["third"], order])),
        full_atoms=_long(order),
        level_sizes=tuple(int(s) for s in sizes),
        parts=tuple(parts),
        gathers=tuple(gathers),
        inverse=_long(inverse),
    )


def make_plan(kind: str, table: ConstructionTable, block: int = 1) -> Any:
    """Plan of engine ``kind`` for ``table`` (called once, then cached by the table)."""
    if kind == "levels":
        return level_plan(table)
    if kind == "inverse":
        return inverse_plan(table)
    from . import _scan

    return _scan.make_plan(kind, table, block)


@dataclass(frozen=True)
class InversePlan(_Movable):
    """Index gathers of :func:`~batched_nerf.to_internal`: ``-1`` replaced by the atom itself."""

    refs: Tensor  # (N, 3) safe indices
    has_bond: Tensor  # (N,) bool
    has_angle: Tensor  # (N,) bool
    has_dihedral: Tensor  # (N,) bool


def inverse_plan(table: ConstructionTable) -> InversePlan:
    refs = table._refs_np
    safe = np.where(refs >= 0, refs, np.arange(len(refs))[:, None])
    return InversePlan(
        refs=_long(safe),
        has_bond=torch.as_tensor(refs[:, 0] >= 0),
        has_angle=torch.as_tensor(refs[:, 1] >= 0),
        has_dihedral=torch.as_tensor(refs[:, 2] >= 0),
    )
