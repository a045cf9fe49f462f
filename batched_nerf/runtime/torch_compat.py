"""Every private torch API of the package, in one place, each with its fallback.

Checked on torch 2.3.0 (the oldest release the package admits, CI's second run)
and on the newest release pip gives CI (2.14 at the time of writing). A name
that a torch release lacks is ``None`` here (a context manager: a no-op), and
each caller says what it does then; nothing else in the package touches
``torch._C``, ``torch._functorch`` or ``torch._dynamo``.

Each name, its torch API and its use:

* `IS_FUNCTORCH_WRAPPED`: `torch._C._functorch.is_functorch_wrapped_tensor`; the
  kernels' gates (a `torch.func` wrapper goes the reference way);
* `TRANSFORMS_ACTIVE`: `torch._C._are_functorch_transforms_active`; the eager
  `Function.apply` fast path and the bound torsion build;
* `UNWRAP_DEAD_WRAPPERS`: `torch._functorch.utils.unwrap_dead_wrappers`; what
  torch's `apply` does to the arguments, in the fast path;
* `no_functorch`: `torch._C._DisableFuncTorch`; plans and cached tensors made
  outside the transforms;
* `clear_transforms`: `torch._functorch.pyfunctorch.temporarily_clear_interpreter_stack`;
  the same, and reading values under `grad`/`jacrev`;
* `current_level`: `torch._C._functorch.maybe_current_level`; whether a transform
  encloses the call;
* `forward_mode_levels`: `retrieve_all_functorch_interpreters`, `TransformType`;
  how many `jvp`/`jacfwd` enclose a call;
* `forward_ad_level`: `torch.autograd.forward_ad._current_level`; whether a level of the
  older forward-mode API is open (the gate, the engines' `jvp`);
* `forward_grad_on`: `torch.autograd.forward_ad._set_fwd_grad_enabled`; forward grad mode back
  on inside a Function's ``jvp`` (the engines' `jvp` on the older API);
* `values_of`: `get_unwrapped`, `is_batchedtensor`; a tensor's values under
  `grad`/`jacrev`/`jacfwd` wrappers;
* `import_dynamo_early`: `torch._dynamo`; torch < 2.4 imports it outside transforms;
* `dynamo_loaded`: whether `torch._dynamo` is imported (`sys.modules`); the table wraps its eager
  plan maker for ``torch.compile`` only then (the import costs about 2 s).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "IS_FUNCTORCH_WRAPPED",
    "TRANSFORMS_ACTIVE",
    "UNWRAP_DEAD_WRAPPERS",
    "clear_transforms",
    "current_level",
    "dynamo_loaded",
    "forward_ad_level",
    "forward_grad_on",
    "forward_mode_levels",
    "import_dynamo_early",
    "no_functorch",
    "values_of",
]

_FUNCTORCH = getattr(torch._C, "_functorch", None)

#: ``t -> bool``: a ``torch.func`` wrapper (grad, vmap, jvp level); None where torch lacks it (the
#: callers then take their reference path on every call).
IS_FUNCTORCH_WRAPPED: Callable[[Any], bool] | None = getattr(_FUNCTORCH, "is_functorch_wrapped_tensor", None)

#: ``() -> bool``: a ``torch.func`` transform encloses this call; None where torch lacks it.
TRANSFORMS_ACTIVE: Callable[[], bool] | None = getattr(torch._C, "_are_functorch_transforms_active", None)

try:  # what torch's Function.apply does to the arguments before its C implementation
    from torch._functorch.utils import unwrap_dead_wrappers as UNWRAP_DEAD_WRAPPERS
except ImportError:  # pragma: no cover - another torch layout: torch's own apply throughout
    UNWRAP_DEAD_WRAPPERS = None

try:  # tensors made inside torch.func transforms are wrapped at their level
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack as _clear
except ImportError:  # pragma: no cover - other torch releases
    _clear = None

_DISABLE = getattr(torch._C, "_DisableFuncTorch", None)


def no_functorch() -> Any:
    """Context: functorch dispatch off (``torch._C._DisableFuncTorch``); a no-op where torch lacks it."""
    return contextlib.nullcontext() if _DISABLE is None else _DISABLE()


def clear_transforms() -> Any:
    """Context: the transforms' interpreter stack cleared; a no-op where torch lacks it."""
    return contextlib.nullcontext() if _clear is None else _clear()


def current_level() -> int | None:
    """The innermost ``torch.func`` level enclosing this call, None outside every transform."""
    return _FUNCTORCH.maybe_current_level()  # type: ignore[union-attr]


def forward_mode_levels() -> int:
    """How many ``torch.func`` forward-mode transforms (``jvp``, ``jacfwd``) enclose this call
    (0 where torch's interpreter API differs)."""
    if TRANSFORMS_ACTIVE is not None and not TRANSFORMS_ACTIVE():  # none at all: the common call
        return 0
    try:
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    except ImportError:  # pragma: no cover - private torch API moved
        return 0
    return sum(i.key() == TransformType.Jvp for i in retrieve_all_functorch_interpreters())


def forward_ad_level() -> int:
    """The innermost open ``torch.autograd.forward_ad`` level, ``-1`` for none (``-1`` where torch
    lacks the attribute: no level can then be open through that API)."""
    return getattr(torch.autograd.forward_ad, "_current_level", -1)


def forward_grad_on() -> Any:
    """Context: forward grad mode on (a Function's ``jvp`` runs with it off); a no-op where torch
    lacks the switch."""
    switch = getattr(torch.autograd.forward_ad, "_set_fwd_grad_enabled", None)
    return contextlib.nullcontext() if switch is None else switch(True)


def values_of(t: torch.Tensor, what: str) -> Any:
    """The values of ``t`` as a numpy array, also under ``grad``/``jacrev``/``jacfwd``/``hessian``
    wrappers (read outside the transforms, nothing recorded), and for a plain tensor captured by a
    function under a transform (whose ``detach()`` there has no storage).

    Raises:
        ValueError: ``t`` is batched by ``torch.func.vmap`` (one value per sample, named ``what``).
    """
    if IS_FUNCTORCH_WRAPPED is None or current_level() is None:  # outside every transform: plain
        return t.detach().cpu().numpy()
    while IS_FUNCTORCH_WRAPPED(t):
        if _FUNCTORCH.is_batchedtensor(t):  # type: ignore[union-attr]
            raise ValueError(
                f"{what} is batched by torch.func.vmap: a construction table is one topology for "
                "the whole batch, so it cannot be chosen per sample; make the table outside vmap "
                "(from one conformer) and use it inside"
            )
        t = _FUNCTORCH.get_unwrapped(t)  # type: ignore[union-attr]
    with no_functorch(), clear_transforms():  # torch 2.3 has only the first; both suffice alone
        return t.detach().cpu().numpy()


def dynamo_loaded() -> bool:
    """Whether ``torch._dynamo`` is imported in this process (a ``torch.compile`` may trace what runs
    next); a dict lookup, importing nothing. Any torch release."""
    return "torch._dynamo" in sys.modules


def import_dynamo_early() -> None:
    """torch < 2.4 imports ``torch._dynamo`` the first time an autograd.Function runs under a
    ``torch.func`` transform (vmap, jacrev of the fused engines); that import then runs module code
    inside the transform and fails ("partially initialized module 'torch._dynamo'"). Importing it
    once, outside any transform, avoids it."""
    if torch.__version__ < "2.4":  # pragma: no cover - exercised by CI's oldest-torch run
        importlib.import_module("torch._dynamo")
