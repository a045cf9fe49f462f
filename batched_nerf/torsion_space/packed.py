"""Batches of rotor tables: the packed table, the bonds' nesting, padded views; and the LRU helper
the torsion-space caches share."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.pack import pack_tables
from ..core.table import ConstructionTable
from ..runtime.torch_compat import no_functorch, values_of
from .turns import TurnPlan, turn_plan

__all__: list[str] = []

Rotors = Any  # a `rotors.RotorTable` (not imported: rotors imports this module)


def _recent(
    cache: OrderedDict,
    size: int,
    key: Any,
    make: Callable[[], Any],
    valid: Callable[[Any], bool] | None = None,
) -> Any:
    """``cache[key]`` (made by ``make()`` when missing or not ``valid``), kept among the ``size`` most
    recently used entries."""
    hit = cache.get(key)
    if hit is None or (valid is not None and not valid(hit)):
        hit = cache[key] = make()
        cache.move_to_end(key)
        if len(cache) > size:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return hit


def _stacked(parts: list[Tensor], offsets: np.ndarray) -> Tensor:
    """The CPU int64 ``parts`` one after another, part ``m`` plus ``offsets[m]`` (one array pass; also
    when first asked for inside a ``torch.func`` transform)."""
    arrays = [values_of(p, "rotor table") for p in parts]
    shift = np.repeat(offsets[:-1], [len(a) for a in arrays]).reshape((-1,) + (1,) * (arrays[0].ndim - 1))
    with no_functorch():
        return torch.from_numpy(np.concatenate(arrays) + shift)


class _Packed:
    """The packed table of a sequence of rotor tables and its global torsion rows."""

    def __init__(self, rotors: tuple[Rotors, ...]) -> None:
        self.rotors = rotors  # keeps the ids of the cache key alive
        self.n_atoms = [r.n_atoms for r in rotors]
        self.n_bonds = [r.n_bonds for r in rotors]
        atom_offsets = np.cumsum([0, *self.n_atoms])
        bond_offsets = np.cumsum([0, *self.n_bonds])
        self.total_atoms, self.total_bonds = int(atom_offsets[-1]), int(bond_offsets[-1])
        self._offsets = atom_offsets, bond_offsets

    # made on first use: the turns (every update of nested sides) need none of them
    @cached_property
    def rows(self) -> Tensor:
        """``(K,)`` the torsion rows of all bonds, in packed atom indices."""
        return _stacked([r.rows for r in self.rotors], self._offsets[0])

    @cached_property
    def row_bonds(self) -> Tensor:
        """``(K,)`` the bond (packed index) of each torsion row."""
        return _stacked([r.row_bonds for r in self.rotors], self._offsets[1])

    @cached_property
    def torsions(self) -> Tensor:
        """``(R, 4)`` the atoms of each bond's torsion, in packed atom indices."""
        return _stacked([r.torsions for r in self.rotors], self._offsets[0])

    @cached_property
    def table(self) -> ConstructionTable:
        """The packed construction table (the round trip of sides that are not nested)."""
        return pack_tables([r.table for r in self.rotors]) if len(self.rotors) > 1 else self.rotors[0].table

    @cached_property
    def turns(self) -> TurnPlan | None:
        """The bonds' nesting (`turns.turn_plan`), None where sides overlap without nesting."""
        return turn_plan(self.rotors)

    @cached_property
    def padded(self) -> _Padded:
        """Per-molecule padded views, made on first use (the updates do not need them)."""
        return _Padded(self.rotors)


class _Padded:
    """Padded per-molecule views of packed rotor tables, ``(M, max N)`` atoms and ``(M, max R)`` bonds."""

    def __init__(self, rotors: tuple[Rotors, ...]) -> None:
        n_max, r_max = max(r.n_atoms for r in rotors), max(r.n_bonds for r in rotors)
        self.atoms = torch.zeros(len(rotors), n_max, dtype=torch.int64)  # global atom index
        self.atom_mask = torch.zeros(len(rotors), n_max, dtype=torch.bool)
        self.bond_atoms = torch.zeros(len(rotors), r_max, 2, dtype=torch.int64)  # global (u, v)
        self.bond_mask = torch.zeros(len(rotors), r_max, dtype=torch.bool)
        self.moving = torch.zeros(len(rotors), r_max, n_max, dtype=torch.bool)
        offset = 0
        for m, r in enumerate(rotors):
            self.atoms[m, : r.n_atoms] = torch.arange(offset, offset + r.n_atoms)
            self.atom_mask[m, : r.n_atoms] = True
            self.bond_atoms[m, : r.n_bonds] = r.bonds + offset
            self.bond_mask[m, : r.n_bonds] = True
            self.moving[m, : r.n_bonds, : r.n_atoms] = r.moving
            offset += r.n_atoms
        self.real = torch.nonzero(self.atom_mask.flatten()).squeeze(-1)  # (T,): atom t's flat padded slot

    def gather(self, x: Tensor) -> Tensor:
        """``(..., T, 3)`` -> ``(..., M, n, 3)``, zeros past each molecule's atoms."""
        mask = self.atom_mask.to(x.device)
        out = x.index_select(-2, self.atoms.to(x.device).reshape(-1)).unflatten(-2, tuple(mask.shape))
        return out * mask[..., None].to(x.dtype)

    def scatter(self, x: Tensor) -> Tensor:
        """``(..., M, n, 3)`` -> ``(..., T, 3)``, the inverse of ``gather`` on the real atoms."""
        return x.flatten(-3, -2).index_select(-2, self.real.to(x.device))


_PACKED_CACHE: OrderedDict[tuple[int, ...], _Packed] = OrderedDict()
_PACKED_CACHE_SIZE = 64


def _packed(rotors: tuple[Rotors, ...]) -> _Packed:
    key = tuple(id(r) for r in rotors)
    return _recent(
        _PACKED_CACHE,
        _PACKED_CACHE_SIZE,
        key,
        lambda: _Packed(rotors),
        lambda hit: all(a is b for a, b in zip(hit.rotors, rotors)),  # ids of live tables only
    )
