"""What every engine shares: movable plans, index conversion and the engine record.

An engine is a *planner* (``Topology -> plan``, numpy work done once per table)
and a *builder* (``plan, tensors -> tensor``, the compute path). Plans are
frozen dataclasses of index tensors and Python values; :class:`Movable` copies
them to another device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._topology import Topology

__all__ = ["Engine", "Movable", "as_long"]


def as_long(values: Any) -> Tensor:
    """``torch.long`` CPU tensor from integer array-likes."""
    return torch.tensor(np.asarray(values, dtype=np.int64))  # a copy: topology arrays are read-only


def _to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, (Tensor, Movable)):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to(o, device) for o in obj)
    return obj


class Movable:
    """Mixin for frozen dataclass plans: ``plan.to(device)`` copies every tensor field."""

    def to(self, device: torch.device) -> Any:
        return replace(self, **{f.name: _to(getattr(self, f.name), device) for f in fields(self)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Engine:
    """A named engine: its planner, its builder and the plan variants to prepare.

    Attributes:
        name: the ``method=`` name.
        plan: ``(topology, variant) -> plan`` (numpy work, CPU tensors).
        build: ``(plan, bonds, angles, dihedrals, fixed_xyz) -> xyz`` for
            to_cartesian engines, ``(plan, xyz) -> InternalCoordinates`` for the
            inverse map.
        variants: the plan variants (e.g. band sizes) that ``table.prepare``
            builds ahead of time.
        choose_variant: ``(n_atoms, n_samples) -> variant`` for one call (one of
            ``variants``); engines with a single plan return 1.
    """

    name: str
    plan: Callable[[Topology, int], Any]
    build: Callable[..., Any]
    variants: tuple[int, ...] = (1,)
    choose_variant: Callable[[int, int], int] = lambda n_atoms, n_samples: 1
