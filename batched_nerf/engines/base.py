"""What every engine shares: movable plans, index conversion and the engine record.

An engine is a *planner* (``Topology -> plan``, numpy work done once per table)
and a *builder* (``plan, tensors -> tensor``, the compute path). Plans are
frozen dataclasses of index tensors and Python values; `Movable` copies
them to another device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..runtime.torch_compat import import_dynamo_early
from ..topology.analysis import Topology

__all__ = ["Engine", "Movable", "as_long"]

import_dynamo_early()  # torch < 2.4: see there


def as_long(values: Any) -> Tensor:
    """``torch.long`` CPU tensor from integer array-likes."""
    return torch.from_numpy(np.array(values, dtype=np.int64))  # a copy: topology arrays are read-only


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


def _one_variant(n_atoms: int, n_samples: int) -> int:
    return 1


def _always_gathers(plan: Any) -> bool:
    return True


def _as_planned(plan: Any, accumulate_dtype: torch.dtype | None, auto: bool) -> Any:
    return plan


def _never(bonds: Any) -> bool:
    return False


@dataclass(frozen=True)
class Engine:
    """A named engine: its planner, its builder, and what the table and dispatch ask about it.

    The table ([`plan`][batched_nerf.ConstructionTable.plan]), ``method="auto"``
    (`dispatch`) and [`compile_builder`][batched_nerf.compile_builder] read an engine
    only through this record:

    * *when is it planned?* ``eager``: at table construction (only for plans
      that cost next to nothing); otherwise on first use, one variant at a time;
    * *which plans exist?* ``variants``, all built by ``table.prepare``; one call
      uses ``choose_variant(n_atoms, n_samples)``;
    * *does its compiled backward gather?* ``gathers(plan)`` (a compiled CPU
      backward with index gathers needs torch >= 2.14.1, see `compiled`).

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
        eager: plan variant ``variants[0]`` when the table is made (default: on first use).
        gathers: ``plan -> bool``: the build's backward uses index gathers.
        nan_bonds: the build itself makes atoms with negative bonds NaN (the
            domain rule of [`to_cartesian`][batched_nerf.to_cartesian], one ``torch.where``
            the caller applies otherwise); the fused kernels do it per atom.
        compose: ``(part plans, packed topology) -> plan``: the plan of a table
            packed by [`pack_tables`][batched_nerf.pack_tables] from its parts' plans
            (`compose`), or None (planned from scratch).
        configure: ``(plan, accumulate_dtype, auto) -> plan`` for one call: the
            plan with the call's options (``to_cartesian``'s ``accumulate_dtype``,
            None when not given; ``auto``: ``method="auto"`` chose the engine);
            engines without options return the plan itself. The fused engine's
            GPU kernels read both (`fused.configure`).
        takes_pose: ``bonds -> bool``: ``build(..., pose=(rotation, translation))``
            builds each seeded component in its pose itself for inputs like
            ``bonds`` (the fused CPU kernels write ``R y + t`` out); otherwise
            [`to_cartesian`][batched_nerf.to_cartesian] moves the built coordinates.
    """

    name: str
    plan: Callable[[Topology, int], Any]
    build: Callable[..., Any]
    variants: tuple[int, ...] = (1,)
    choose_variant: Callable[[int, int], int] = _one_variant
    eager: bool = False
    gathers: Callable[[Any], bool] = _always_gathers
    nan_bonds: bool = False
    compose: Callable[[Sequence[Any], Topology], Any] | None = None
    configure: Callable[[Any, Any, bool], Any] = _as_planned
    takes_pose: Callable[[Any], bool] = _never
