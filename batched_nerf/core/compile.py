"""One documented way to get a ``torch.compile``-d builder for a table.

Which passes a compiled build supports:

* forward: every table, every method;
* forward + first-order backward (``loss.backward()``): the scan engine on
  tables whose scanned atoms form single paths (chains), on any torch release; other tables on the CPU
  need torch >= 2.14.1, because torch 2.13's inductor C++ backend miscompiles
  the backward of index gathers (a scatter fused into the loop that reads it;
  an ``index_add`` of a transposed operand). The build refuses there with a
  ``RuntimeError`` naming the torch version, never a wrong gradient;
* committor losses (``g = dq/dx`` with ``create_graph=True`` for a network ``q``,
  then a loss of ``g``): as forward + backward, since only ``q`` is
  differentiated twice and the builder once;
* second order through the builder itself (``gradgradcheck``, Hessians or
  ``create_graph=True`` with respect to the internal coordinates): not
  supported by ``torch.compile`` (AOTAutograd raises); use the eager
  [`to_cartesian`][batched_nerf.to_cartesian].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import engines
from ..engines.compiled import check_compiled_backward
from ..engines.dispatch import auto_method
from .checks import check_table
from .convert import _METHODS, to_cartesian
from .table import ConstructionTable


def _call_plan(table: ConstructionTable, method: str, inputs: tuple[Any, ...]) -> tuple[Any, Any]:
    """The engine and plan one call of the compiled builder uses, built now (outside the trace).

    Returns ``(None, None)`` when the inputs' shapes do not broadcast (the
    compiled ``to_cartesian`` then raises its own error).
    """
    tensors = [t for t in inputs if isinstance(t, Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")
    shapes = [tuple(t.shape[:-1]) for t in inputs[:3] if isinstance(t, Tensor) and t.ndim]
    if isinstance(inputs[3], Tensor) and inputs[3].ndim >= 2:
        shapes.append(tuple(inputs[3].shape[:-2]))
    try:
        samples = math.prod(np.broadcast_shapes(*shapes)) if shapes else 1
    except ValueError:
        return None, None
    name = method if method != "auto" else auto_method(table, samples, device.type, compiled=True)
    engine = engines.get(name)
    return engine, table.plan(name, device, engine.choose_variant(table.n_atoms, samples))


def compile_builder(
    table: ConstructionTable,
    *,
    method: str = "scan",
    device: torch.device | str | None = None,
    **compile_options: Any,
) -> Callable[..., Tensor]:
    """``torch.compile`` of [`to_cartesian`][batched_nerf.to_cartesian] for one table.

    Returns ``build(bonds, angles, dihedrals, fixed_xyz=None) -> (..., N, 3)``,
    the same map as ``bn.to_cartesian(bonds, angles, dihedrals, table,
    method=method, fixed_xyz=fixed_xyz)``, compiled with ``fullgraph=True`` (and
    ``compile_options``, e.g. ``mode="max-autotune"`` or ``dynamic=True``). Each
    call first makes (or finds) the one plan it uses, outside the trace, so a
    new table needs no [`prepare`][batched_nerf.ConstructionTable.prepare]. The first call with a new
    input shape compiles (seconds to a minute on a CPU); compile time does not
    grow with the number of atoms: a chain is at most 64 band steps plus
    ``log2(N)`` jump steps.

    Passes: forward on every table; forward + backward with the scan engine on
    single-path tables (chains) on any torch, on other tables only on CUDA or
    with torch >= 2.14.1 (otherwise a ``RuntimeError`` names the torch version);
    committor losses as forward + backward (only the network is differentiated
    twice); no second order through the builder itself: use the eager
    ``to_cartesian`` for that.

    Args:
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable].
        method: ``"scan"`` (default), ``"levels"``, ``"auto"`` or ``"fused"`` (which compiles
            as ``"scan"``: its kernels are compiled already).
        device: prepare every plan of ``method`` for this device now (default:
            none ahead; each call makes the plan it uses).
        compile_options: passed to `torch.compile`.

    Returns:
        The compiled builder.

    Raises:
        TypeError: ``table`` is not a ConstructionTable.
        ValueError: an unknown ``method``.

    Example:
        >>> import torch, batched_nerf as bn
        >>> table = bn.ConstructionTable.chain(6)
        >>> build = bn.compile_builder(table)
        >>> callable(build)
        True
    """
    check_table(table)
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    method = "scan" if method == "fused" else method  # fused kernels are compiled already: compile scan
    if device is not None:
        table.prepare(device, methods=engines.METHODS if method == "auto" else (method,))

    def build(bonds: Tensor, angles: Tensor, dihedrals: Tensor, fixed_xyz: Tensor | None = None) -> Tensor:
        return to_cartesian(bonds, angles, dihedrals, table, fixed_xyz=fixed_xyz, method=method)  # type: ignore[arg-type]

    compile_options.setdefault("fullgraph", True)
    compiled = torch.compile(build, **compile_options)

    def checked(bonds: Tensor, angles: Tensor, dihedrals: Tensor, fixed_xyz: Tensor | None = None) -> Tensor:
        inputs = (bonds, angles, dihedrals, fixed_xyz)
        engine, plan = _call_plan(table, method, inputs)
        if engine is not None and any(isinstance(t, Tensor) and t.requires_grad for t in inputs):
            device = next(t for t in inputs if isinstance(t, Tensor)).device
            check_compiled_backward(engine.gathers(plan), device, *inputs, tracing=False)  # type: ignore[arg-type]
        return compiled(bonds, angles, dihedrals, fixed_xyz)

    return checked
