"""What a ``torch.compile``-d build may do on this torch release.

torch 2.13's inductor C++ (CPU) backend miscompiles the backward of index
gathers: a scatter fused into the loop that reads its output, and an
``index_add`` of a transposed operand (standalone reproductions in
``docs/known_issues.md``); torch 2.14.1 is correct. Engines whose compiled
backward would contain such scatters refuse on the CPU of older releases.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["FIXED_TORCH", "check_compiled_backward", "inductor_scatter_ok"]


#: First torch release whose CPU inductor compiles scatter backward passes correctly.
FIXED_TORCH = (2, 14, 1)


def _torch_version() -> tuple[int, ...]:
    parts = []
    for piece in torch.__version__.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def inductor_scatter_ok(device: torch.device) -> bool:
    """Whether compiled backward passes with index scatters are trusted on ``device``."""
    return device.type != "cpu" or _torch_version() >= FIXED_TORCH


def check_compiled_backward(
    uses_gathers: bool, device: torch.device, *inputs: Tensor | None, tracing: bool = True
) -> None:
    """Refuse a compiled build whose backward would hit torch 2.13's CPU inductor defects.

    Called by the scan engine while ``torch.compile`` traces it (``tracing=True``)
    and by [`batched_nerf.compile_builder`][batched_nerf.compile_builder] before each call; does nothing
    without
    gradients, on other devices and on fixed torch releases.

    Raises:
        RuntimeError: naming the torch version and the ways out.
    """
    if not uses_gathers or (tracing and not torch.compiler.is_compiling()) or inductor_scatter_ok(device):
        return
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs):
        raise RuntimeError(
            f"torch.compile of this table's build with gradients is not supported on the CPU with "
            f"torch {torch.__version__}: its inductor backend miscompiles the backward of index "
            f"gathers (fixed in torch {'.'.join(map(str, FIXED_TORCH))}). Use the eager "
            "bn.to_cartesian for training, compile under torch.no_grad(), or upgrade torch "
            "(chains and other single-path tables compile forward and backward on any release)"
        )
