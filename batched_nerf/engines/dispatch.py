"""``method="auto"``: pick an engine from the table's shape, batch size and device.

A pure function of plain Python values (the table's counts are fixed when it is
made), so it adds no data-dependent control flow and is stable under
``torch.compile``.

Cost model (constants measured on a 2-core CPU, float32, single thread; see
``docs/benchmarks.md``): the level engine pays a fixed price per dependency
level plus a price per atom and sample; the scan engine pays a larger fixed
price per call and a per-element price that grows with the number of pointer
jumping steps, but no price per level. On accelerators the price is mostly
kernel launches, which favours the scan engine for all but the shallowest
tables.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["auto_method", "choose_method", "scan_block"]

#: Seconds per dependency level (level engine) and per atom-sample.
LEVEL_STEP_S = 4.5e-4
LEVEL_ELEMENT_S = 1.2e-7
#: Fixed seconds per call and per atom-sample per doubling step (scan engine).
SCAN_CALL_S = 2e-3
SCAN_ELEMENT_S = 1.5e-7
#: Scan band sizes by atom-samples per call: few -> pure pointer jumping.
BLOCK_SMALL, BLOCK_LARGE = 8, 32
BLOCK_THRESHOLDS = (2_048, 262_144)


def scan_block(n_atoms: int, n_samples: int) -> int:
    """Band size ``K`` of the scan engine for ``n_samples`` (batch) builds of ``n_atoms``."""
    work = n_atoms * max(n_samples, 1)
    if work < BLOCK_THRESHOLDS[0]:
        return 1
    return BLOCK_SMALL if work < BLOCK_THRESHOLDS[1] else BLOCK_LARGE


def choose_method(n_atoms: int, depth: int, scan_rounds: int, n_samples: int, device_type: str) -> str:
    """``"levels"`` or ``"scan"`` for one call.

    Args:
        n_atoms, depth: the table's size and number of dependency levels.
        scan_rounds: rounds of the scan plan (irregular rows re-root the scan once per round).
        n_samples: number of builds in the batch (product of the leading shape).
        device_type: ``"cpu"``, ``"cuda"``, ...
    """
    if depth <= 2:
        return "levels"
    if device_type != "cpu":
        return "scan" if depth > 8 else "levels"
    work = n_atoms * max(n_samples, 1)
    levels = depth * LEVEL_STEP_S + work * LEVEL_ELEMENT_S
    steps = math.ceil(math.log2(depth)) / (scan_block(n_atoms, n_samples) ** 0.5)
    scan = SCAN_CALL_S * scan_rounds + work * SCAN_ELEMENT_S * (1.0 + steps)
    return "levels" if levels <= scan else "scan"


def auto_method(table: Any, n_samples: int, device_type: str) -> str:
    """:func:`choose_method` for a :class:`~batched_nerf.ConstructionTable` (read through its public view)."""
    topo = table.topology
    rounds = len(table.plan("scan").rounds)
    return choose_method(topo.n_atoms, topo.depth, rounds, n_samples, device_type)
