"""When ``method="auto"`` runs the fused Triton kernels on a GPU, and what a kernel failure does.

**The rule** (`fused_fills_device`), until a device has measured the kernels.
The Triton build kernel (`fused.cuda.build`) gives each lane one
``(component, sample)`` pair, which walks its component's atoms one after the
other: the walk of the largest component is a chain of dependent steps (each
reads positions and frames written by earlier steps of the same lane), and
lanes run side by side. So:

* its time is about ``largest_component`` steps whatever the number of lanes,
  until the lanes outnumber the threads the device keeps resident (an H100 /
  H200: 132 SMs; a thread of the build kernel holds ~124 registers, so 16 warps
  per SM, ~67,000 lanes); below `FUSED_MIN_LANES` lanes most of the device
  idles while each lane's dependent steps wait on memory;
* the scan engine composes frames in ``log2(N)`` rounds of whole-batch torch
  kernels: tens of launches, whose cost hardly grows with the batch until memory
  bandwidth binds. One protein at one sample is one lane of 1,392 dependent steps
  for the fused kernel, ~11 rounds for the scan engine.

Hence the fused kernels only where the lanes fill the device and the walks are
short: ``n_components * n_samples >= FUSED_MIN_LANES`` and ``largest_component
<= FUSED_MAX_COMPONENT``. Everything else (a large molecule, a few samples) takes
the engine ``auto`` takes without fused kernels: the scan engine, or the level
engine for shallow tables (``depth <= 8``). Both thresholds are estimates, not
measurements: ``benchmarks/gpu.py`` times both sides of them.

**Failures** (`KernelError`, `fall_back`): a Triton compile or launch
error of a fused kernel under ``method="auto"`` warns once (naming the error),
the call is built by that engine instead, and ``auto`` does not pick the fused
kernels on that device type again in this process (`disabled` says why;
``bn.backends()`` reports it). ``method="fused"`` raises the error.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

__all__ = [
    "FUSED_MAX_COMPONENT",
    "FUSED_MIN_LANES",
    "RULE",
    "KernelError",
    "disabled",
    "fall_back",
    "fused_fills_device",
    "launch",
]

#: Fewest ``(component, sample)`` lanes for which ``auto`` runs the fused kernels on a GPU.
FUSED_MIN_LANES = 4096
#: Largest component (atoms: dependent steps of one lane) for which it does.
FUSED_MAX_COMPONENT = 512

#: The rule in words (``bn.backends()["rule"]``).
RULE = {
    "cpu": "fused whenever numba imports (fastest on every shape measured)",
    "cuda": (
        f"fused when n_components * n_samples >= {FUSED_MIN_LANES} lanes and the largest component has "
        f"<= {FUSED_MAX_COMPONENT} atoms (one lane walks one component serially: few lanes leave the "
        "device idle, long walks are long dependency chains), else scan (levels for depth <= 8); "
        "estimated, not yet measured on a device"
    ),
}

_disabled: dict[str, str] = {}


class KernelError(RuntimeError):
    """A fused Triton kernel failed to compile or to launch (the message names the kernel and the error)."""


def fused_fills_device(n_lanes: int, largest_component: int) -> bool:
    """Whether ``auto`` runs the fused kernels on a GPU (the rule in the module docstring).

    Args:
        n_lanes: ``(component, sample)`` pairs of the call: ``n_components * n_samples``.
        largest_component: atoms of the table's largest component (the longest walk).

    Example:
        >>> from batched_nerf.engines.gpu_policy import fused_fills_device
        >>> fused_fills_device(65_536, 22), fused_fills_device(1, 1_392), fused_fills_device(1_024, 22)
        (True, False, False)
    """
    return n_lanes >= FUSED_MIN_LANES and largest_component <= FUSED_MAX_COMPONENT


def launch(name: str, kernel: Any, grid: tuple[int, ...], *args: Any, **options: Any) -> None:
    """``kernel[grid](*args, **options)``; any error of the compile or the launch as `KernelError`.

    (Errors a launch reports later, asynchronously, e.g. an illegal memory access seen at
    the next synchronisation, are outside this call and are not caught.)

    Raises:
        KernelError: naming ``name`` and the original error (chained).
    """
    try:
        kernel[grid](*args, **options)
    except Exception as exc:  # compile (CompilationError, PTXASError, OutOfResources) or launch errors
        first = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else ""
        raise KernelError(f"Triton kernel {name} failed: {type(exc).__name__}: {first}") from exc


def fall_back(device_type: str, error: KernelError, build: Callable[[], Any]) -> Any:
    """Warn once for ``device_type``, stop ``auto`` picking the fused kernels there; return ``build()``."""
    if device_type not in _disabled:
        _disabled[device_type] = str(error)
        warnings.warn(
            f"method='auto': {error}; building with the scan engine (levels for shallow tables) instead, "
            f"and method='auto' takes it on {device_type} from now on in this process "
            "(method='fused' raises this error)",
            RuntimeWarning,
            stacklevel=2,
        )
    return build()


def guarded(device_type: str, fallback: bool, kernel: Callable[[], Any], reference: Callable[[], Any]) -> Any:
    """``kernel()`` (a Triton call). With ``fallback`` (``method="auto"``) a `KernelError` warns once
    (`fall_back`) and returns ``reference()``, as does every later call on ``device_type``; without
    (``method="fused"``) the error is raised. The one GPU fallback of the fused engine's passes.

    Raises:
        KernelError: the kernel failed and ``fallback`` is off.
    """
    if fallback and disabled(device_type) is not None:
        return reference()
    try:
        return kernel()
    except KernelError as exc:
        if not fallback:
            raise
        return fall_back(device_type, exc, reference)


def disabled(device_type: str) -> str | None:
    """Why ``auto`` no longer picks the fused kernels on ``device_type`` (None: it may)."""
    return _disabled.get(device_type)
