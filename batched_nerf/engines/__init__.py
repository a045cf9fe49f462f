"""Engines: a registry of planners and builders, one module or subpackage per engine.

Each engine (`Engine`) is a *planner*, run once per table on its
[`Topology`][batched_nerf.Topology] (numpy work; the table caches the
result per device), and a *builder*, the compute path. ``to_cartesian``
engines are listed in `METHODS`; ``"inverse"`` is the plan of
``to_internal``. `dispatch` chooses between them for ``method="auto"``.

Layout: shared machinery at this level (`base`: plan mixin, engine
record; `function`: the engines' ``autograd.Function`` base;
`seeds`: block 0; `frame_tree`: the placement-frame
classification; `layout`; `compiled`; `dispatch`:
``method="auto"``; `backends`: the fused engine's compiled backends,
found lazily), then one room per engine: `levels`, `inverse` (one
module each), `scan` (plan, path, build) and `fused` (plan, build
and inverse with their autograd; its backends below it in
`fused.cpu` (numba) and `fused.cuda` (Triton)); `compose`
makes plans of packed tables from their parts' plans. Nothing here imports the
table or the public API.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..topology.analysis import Topology
from .base import Engine
from .compose import compose_fused, compose_inverse
from .fused.build import FUSED
from .inverse import INVERSE
from .levels import LEVELS
from .scan.build import SCAN

__all__ = ["ENGINES", "METHODS", "Engine", "get", "make_plan"]

#: Every engine by name.
#: Engines whose plans a packed table composes from its parts' (:mod:`.compose`).
_COMPOSED = (replace(FUSED, compose=compose_fused), replace(INVERSE, compose=compose_inverse))
ENGINES: dict[str, Engine] = {e.name: e for e in (LEVELS, SCAN, *_COMPOSED)}
#: Engines that ``to_cartesian(method=...)`` accepts (besides ``"auto"``).
METHODS: tuple[str, ...] = (SCAN.name, LEVELS.name, FUSED.name)


def get(name: str) -> Engine:
    """The engine called ``name``.

    Raises:
        ValueError: an unknown name.
    """
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; expected one of {tuple(ENGINES)}") from None


def make_plan(name: str, topo: Topology, variant: int = 1) -> Any:
    """Plan of engine ``name`` (variant: e.g. the scan band size) for ``topo``, on the CPU."""
    return get(name).plan(topo, variant)
