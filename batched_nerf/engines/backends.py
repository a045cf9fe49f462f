"""Optional compiled backends of the fused engine, imported lazily.

* CPU: numba (the extra ``fast``: ``pip install -e ".[fast]"``), kernels
  in `fused.cpu.build`;
* GPU (CUDA): triton (the CUDA builds of torch ship it), kernels in
  `fused.cuda.build` and `fused.cuda.inverse`; their tests run them in
  Triton's interpreter on the CPU (``TRITON_INTERPRET=1``).

Nothing is imported until a fused build, ``method="auto"`` or [`backends`][batched_nerf.backends]
asks; an import that fails counts as absent (and is not retried).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from . import gpu_policy

__all__ = ["INSTALL", "auto_may_use", "available", "backends", "require"]

#: How to get the CPU backend.
INSTALL = 'pip install "numba>=0.59" scipy (from a clone: pip install -e ".[fast]")'

#: device type -> (backend package, kernel module of this package)
_BACKENDS = {"cpu": ("numba", "fused.cpu.build"), "cuda": ("triton", "fused.cuda.build")}
_kernels: dict[str, ModuleType | None] = {}
_errors: dict[str, str] = {}


def _load(device_type: str) -> ModuleType | None:
    if device_type in _kernels:
        return _kernels[device_type]
    module = None
    if device_type in _BACKENDS:
        package, kernels = _BACKENDS[device_type]
        try:
            importlib.import_module(package)
            module = importlib.import_module(f"{__package__}.{kernels}")
            if package == "numba":  # say when a kernel compiles (a cache miss)
                importlib.import_module(f"{__package__}.fused.cpu.cache").watch()
        except ImportError as exc:  # absent package, or no kernels for it yet
            _errors[device_type] = f"{type(exc).__name__}: {exc}"
    _kernels[device_type] = module
    return module


def available(device_type: str) -> bool:
    """Whether the fused engine has working kernels on ``device_type`` (``"cpu"``, ``"cuda"``, ...)."""
    return _load(device_type) is not None


def require(device_type: str) -> ModuleType:
    """The fused kernels for ``device_type``.

    Raises:
        RuntimeError: no backend for the device (naming how to install one).
    """
    module = _load(device_type)
    if module is None:
        package = _BACKENDS.get(device_type, ("none",))[0]
        reason = _errors.get(device_type, f"no fused backend exists for device type {device_type!r}")
        hint = f"install it with {INSTALL}" if device_type == "cpu" else "use method='scan' or 'levels'"
        raise RuntimeError(
            f"method='fused' needs {package} on {device_type} ({reason}); {hint}, "
            "or use method='auto', which picks the fused engine only where it is available"
        )
    return module


def _version(package: str) -> str | None:
    try:
        return str(importlib.import_module(package).__version__)
    except ImportError:
        return None


def backends() -> dict[str, Any]:
    """Which compiled backends the fused engine (``method="fused"``) can use here.

    Returns:
        A dict with ``"numba"`` and ``"triton"`` (the installed version, or
        None), ``"fused"`` (device type -> whether fused kernels work there),
        ``"auto"`` (device type -> whether ``method="auto"`` may pick the fused
        engine there; it still follows the dispatch rule), ``"rule"`` (device
        type -> when ``auto`` picks it, and why: see
        `batched_nerf.engines.gpu_policy`), ``"disabled"`` (device type ->
        the kernel error after which ``auto`` stopped picking the fused kernels
        there in this process; empty while none failed), ``"tiered"`` (whether
        the CPU's blocked kernels wait until they are cached or worth their
        compile: ``BATCHED_NERF_TIERED``, `batched_nerf.engines.fused.cpu.tiers`),
        ``"layouts"`` (each blocked CPU kernel a call asked for in this
        process -> ``"blocked"`` or ``"per sample (x s of 10 s)"``: what such a
        call runs now; both layouts give the same bits, so this changes speed
        only) and ``"install"``.

    Example:
        >>> import batched_nerf as bn
        >>> info = bn.backends()
        >>> sorted(info)
        ['auto', 'disabled', 'fused', 'install', 'layouts', 'numba', 'rule', 'tiered', 'triton']
        >>> info["install"]
        'pip install "numba>=0.59" scipy (from a clone: pip install -e ".[fast]")'
        >>> info["rule"]["cuda"].startswith("fused when n_components * n_samples >= 4096 lanes")
        True
    """
    from .fused.cpu import tiers  # plain Python: no numba needed to read the setting

    fused = {device: available(device) for device in _BACKENDS}
    disabled = {device: gpu_policy.disabled(device) for device in _BACKENDS}
    return {
        "numba": _version("numba"),
        "triton": _version("triton"),
        "fused": fused,
        "auto": {device: ok and disabled[device] is None for device, ok in fused.items()},
        "rule": dict(gpu_policy.RULE),
        "disabled": {device: why for device, why in disabled.items() if why is not None},
        "tiered": not tiers.disabled(),
        "layouts": tiers.report(),
        "install": INSTALL,
    }


def auto_may_use(device_type: str) -> bool:
    """Whether ``method="auto"`` may pick the fused kernels on ``device_type``: they import and
    none of them failed there in this process (`gpu_policy.fall_back`)."""
    return available(device_type) and gpu_policy.disabled(device_type) is None
