"""``method="auto"``: pick an engine from the table's shape, batch size and device.

A pure function of plain Python values (the table's counts are fixed when it is
made), so it adds no data-dependent control flow and is stable under
``torch.compile``.

The rule (CPU), fitted to side-by-side measurements of both engines on this
project's 2-core CPU (float32, forward and forward+backward; alanine
dipeptide, chains of 16-4,096 atoms, random trees, a protein backbone with side
chains; ``B`` = 1 to 4,096; see ``docs/benchmarks.md``):

* shallow tables (``depth <= 8``: small molecules) take the level engine, which
  is fastest there at every batch size;
* very large batches (``B >= 4096``, ``depth <= 512``) take the level engine:
  its per-atom cost is lower and its per-level cost is paid once for the batch;
* branched tables whose scan is not a single path (trees, proteins) take the
  level engine from ``B >= 1024`` on;
* everything else (chains at any batch below 4,096, deep branched tables at
  small batches) takes the scan engine.

On accelerators the price is mostly kernel launches, which favours the scan
engine for all but the shallowest tables.

The fused engine (one compiled kernel per pass) goes first on the CPU wherever it
has a backend (``fused=True``: numba; see `backends`) and
``torch.compile`` is not tracing: on the CPU it was fastest on every shape
measured, forward and forward+backward (chains of 64 x 1,024, 512 x 256,
4,096 x 1 and 30,000 x 1, a random 10,000-atom tree x 1 and x 64, small
molecules x 1 to x 1,024; ``docs/architecture.md``), and tied with the level
engine on shallow tables at ``B = 4096`` (alanine dipeptide: forward 2.4 vs
2.7 ms, forward+backward 7.6 vs 7.0 ms). It is not switched off there: one
engine at every batch size gives one answer at every batch size, also where
rounding decides (rows placed from nearly collinear references).

On CUDA (``fused=True``: triton imports and no Triton kernel has failed in this
process) the fused kernels run only where their lanes fill the device
(`gpu_policy.fused_fills_device`): at least
``FUSED_MIN_LANES = 4096`` ``(component, sample)`` lanes
(``n_components * n_samples``) and a largest component of at most
``FUSED_MAX_COMPONENT = 512`` atoms. Each lane walks one component atom by atom,
so few lanes leave most of the device idle and a long walk is a long chain of
dependent memory round trips, where the scan engine's ``log2(N)`` rounds of
whole-batch kernels win; the thresholds are estimates until a device has
measured them (``benchmarks/gpu.py`` times both sides). Elsewhere on CUDA the
rule below the fused engine applies (scan; levels for ``depth <= 8``). Unlike on
the CPU the engine then changes with the batch size, so rows whose placement
rounding decides (nearly collinear references) may differ across the threshold
as they differ between engines (``docs/conventions.md``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..topology.analysis import FULL, THIRD, Topology
from ..topology.frame_tree import PARENT, frame_tree
from . import backends
from .gpu_policy import fused_fills_device

__all__ = ["auto_method", "choose_method", "fused_fills_device", "scan_block", "single_path"]

#: Tables this shallow always take the level engine (CPU).
SHALLOW_DEPTH = 8
#: Batch sizes from which the level engine wins: any table up to LARGE_BATCH_DEPTH
#: levels / branched tables whose scan is not one path.
LARGE_BATCH, LARGE_BATCH_DEPTH, BRANCHED_BATCH = 4096, 512, 1024
#: Scan band sizes by atom-samples per call: few -> pure pointer jumping.
BLOCK_SMALL, BLOCK_LARGE = 8, 32
BLOCK_THRESHOLDS = (2_048, 262_144)


def scan_block(n_atoms: int, n_samples: int) -> int:
    """Band size ``K`` of the scan engine for ``n_samples`` (batch) builds of ``n_atoms``."""
    work = n_atoms * max(n_samples, 1)
    if work < BLOCK_THRESHOLDS[0]:
        return 1
    return BLOCK_SMALL if work < BLOCK_THRESHOLDS[1] else BLOCK_LARGE


def choose_method(
    depth: int,
    single_path: bool,
    n_samples: int,
    device_type: str,
    fused: bool = False,
    *,
    n_components: int = 1,
    largest_component: int = 0,
) -> str:
    """``"fused"``, ``"levels"`` or ``"scan"`` for one call (the rule in the module docstring).

    Args:
        depth: the table's number of dependency levels.
        single_path: every round of the scan plan is one path (chains), which
            the scan engine builds without gathers.
        n_samples: number of builds in the batch (product of the leading shape).
        device_type: ``"cpu"``, ``"cuda"``, ...
        fused: the fused engine has kernels for ``device_type`` and may run
            (not while ``torch.compile`` traces).
        n_components: the table's connected components (one GPU lane each per sample).
        largest_component: atoms of its largest component (the longest GPU walk).

    Example:
        >>> from batched_nerf.engines.dispatch import choose_method
        >>> choose_method(509, True, 256, "cpu"), choose_method(6, False, 1, "cpu")
        ('scan', 'levels')
        >>> choose_method(509, True, 256, "cpu", fused=True)
        'fused'
        >>> # CUDA: alanine dipeptide x 65,536 fills the device; one 1,392-atom protein does not
        >>> choose_method(6, False, 65_536, "cuda", True, n_components=1, largest_component=22)
        'fused'
        >>> choose_method(700, False, 1, "cuda", True, n_components=1, largest_component=1_392)
        'scan'
    """
    if fused and (device_type == "cpu" or fused_fills_device(n_components * n_samples, largest_component)):
        return "fused"
    if depth <= 2:
        return "levels"
    if device_type != "cpu":
        return "scan" if depth > SHALLOW_DEPTH else "levels"
    if depth <= SHALLOW_DEPTH:
        return "levels"
    if n_samples >= LARGE_BATCH and depth <= LARGE_BATCH_DEPTH:
        return "levels"
    if n_samples >= BRANCHED_BATCH and not single_path:
        return "levels"
    return "scan"


def single_path(topo: Topology) -> bool:
    """Whether the scan engine builds ``topo`` as one path without gathers (a chain), cheaply.

    Whole-array passes over the rows, no plan built: the table computes it once
    when it is made, so that `auto_method` reads a plain ``bool``. True
    when every fully referenced row is a ``PARENT`` row of the frame tree
    (`frame_tree`) and they form one unbranched path below the table's
    only third seed atom; tables without fully referenced rows count as one
    path too. Tables with rows placed from positions (several scan rounds)
    count as branched.

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf.engines.dispatch import single_path
        >>> single_path(bn.ConstructionTable.chain(6).topology)
        True
        >>> forked = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [2, 1, 3]]
        >>> single_path(bn.ConstructionTable(forked).topology)
        False
    """
    full = topo.kind == FULL
    if not full.any():
        return True
    if int((topo.kind == THIRD).sum()) != 1:
        return False
    if np.bincount(topo.refs[full, 0], minlength=topo.n_atoms).max() > 1:  # a branch: cheap to see
        return False
    tree = frame_tree(topo)
    if not (tree.frame[full] == PARENT).all():  # rows hanging from a seed's anchor or placed from positions
        return False
    return bool(np.bincount(tree.parent[full], minlength=topo.n_atoms).max() <= 1)


def auto_method(table: Any, n_samples: int, device_type: str, compiled: bool = False) -> str:
    """`choose_method` for a [`ConstructionTable`][batched_nerf.ConstructionTable].

    Reads only plain values fixed when the table is made (``table.depth``,
    ``table.single_path``, ``table.n_components``, ``table.largest_component``)
    and whether a fused backend imports (and has not failed,
    `backends.auto_may_use`): no plan is built to dispatch. ``compiled``:
    the choice of a ``torch.compile``-d build (never the fused engine; also
    implied while ``torch.compile`` traces).
    """
    fused = not (compiled or torch.compiler.is_compiling()) and backends.auto_may_use(device_type)
    return choose_method(
        table.depth,
        table.single_path,
        n_samples,
        device_type,
        fused,
        n_components=table.n_components,
        largest_component=table.largest_component,
    )
