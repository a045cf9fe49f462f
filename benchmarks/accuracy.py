"""float32 coordinate error vs a float64 reference: chains (error vs length), branched molecules, peers."""

from __future__ import annotations

import inspect
import time
from types import ModuleType
from typing import Any

import numpy as np
import torch

import batched_nerf as bn
from benchmarks.timing import Progress, short_error
from benchmarks.workloads import chain_refs, make_inputs, protein_refs, reference_xyz, tree_refs

REFERENCE = "float64 per-atom NeRF loop in plain Python floats on the float32-rounded inputs"
ACCUMULATE = "scan float32, float64 accumulation"


def errors(
    quick: bool,
    device: str,
    peers_list: list[Any],
    deadline: float,
    progress: Progress | None,
    sizes: list[int] | None = None,
) -> dict[str, Any]:
    """Max |x_float32 - x_ref| of our engines on chains of ``sizes`` (default: the grid's), on a
    random tree and a protein-like backbone (not with ``sizes``), and of each peer."""
    has_acc = "accumulate_dtype" in inspect.signature(bn.to_cartesian).parameters
    small = sizes is not None
    sizes = sizes or ([64, 512, 4096] if quick else [64, 256, 1024, 4096, 16384, 32768])
    curve: list[dict[str, Any]] = []
    for n in sizes:
        curve += _chain_errors(n, quick, device, has_acc, deadline)
        if progress is not None:
            progress.update(f"error curve N={n}")
    peer_sizes = sizes[:1] if small else [512] if quick else [512, 4096]
    return {
        "reference": REFERENCE,
        "accumulate_dtype_available": has_acc,
        "chain_curve": curve,
        "branched": [] if small else _branched_errors(512 if quick else 4096, device),
        "peers": [_peer_error(p, n, deadline) for p in peers_list for n in peer_sizes],
    }


def not_measured() -> dict[str, Any]:
    """The ``errors`` entry of a run that skips the error part."""
    return {"reference": "not measured (errors=False)", "chain_curve": [], "branched": [], "peers": []}


def _float32_error(refs: np.ndarray, device: str, **kwargs: Any) -> tuple[float, float]:
    """(max error, extent) of one float32 build of random inputs against :func:`reference_xyz`."""
    n = len(refs)
    b32, a32, d32 = make_inputs(n, 1, torch.float32, 0, device)
    ref = reference_xyz(*(t[0].double().cpu().numpy() for t in (b32, a32, d32)), refs)
    with torch.no_grad():
        x = bn.to_cartesian(b32, a32, d32, bn.ConstructionTable(refs), **kwargs)
    return float(np.abs(x[0].double().cpu().numpy() - ref).max()), float(np.abs(ref).max())


def _chain_errors(n: int, quick: bool, device: str, has_acc: bool, deadline: float) -> list[dict[str, Any]]:
    variants: list[tuple[str, dict[str, Any]]] = [
        ("scan float32", {"method": "scan"}),
        ("levels float32", {"method": "levels"}),
    ]
    if has_acc:
        variants.append((ACCUMULATE, {"method": "scan", "accumulate_dtype": torch.float64}))
    out: list[dict[str, Any]] = []
    for label, kw in variants:
        entry: dict[str, Any] = {"n_atoms": n, "variant": label}
        if time.perf_counter() > deadline:
            entry["status"] = "skipped: run-time budget used up"
        elif kw["method"] == "levels" and n > (4096 if quick else 32768):
            entry["status"] = "skipped: too long"
        else:
            try:
                entry["max_abs_error"], entry["extent"] = _float32_error(chain_refs(n), device, **kw)
                entry["status"] = "ok"
            except Exception as exc:
                entry["status"] = short_error(exc)
        out.append(entry)
    if not has_acc:
        out.append(
            {
                "n_atoms": n,
                "variant": ACCUMULATE,
                "status": "n/a: to_cartesian has no accumulate_dtype parameter",
            }
        )
    return out


def _branched_errors(n: int, device: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, refs in (("tree", tree_refs(n)), ("protein", protein_refs(n // 6))):
        for method in ("scan", "levels"):
            entry: dict[str, Any] = {"workload": name, "n_atoms": len(refs), "variant": f"{method} float32"}
            try:
                entry["max_abs_error"] = _float32_error(refs, device, method=method)[0]
                entry["status"] = "ok"
            except Exception as exc:
                entry["status"] = short_error(exc)
            out.append(entry)
    return out


def _peer_error(peer: Any, n: int, deadline: float) -> dict[str, Any]:
    """A peer's own float32 error (its float64 loop reference, same float32-rounded inputs)."""
    entry: dict[str, Any] = {"peer": peer.name, "n_atoms": n}
    if time.perf_counter() > deadline:
        entry["status"] = "skipped: run-time budget used up"
        return entry
    try:
        entry["max_abs_error"] = float(peer.error_vs_float64(n))
        entry["status"] = "ok"
        entry["aligned"] = bool(getattr(peer, "align_for_error", False))
        entry["dtype"] = "float64" if peer.name == "chemcoord" else "float32"
    except Exception as exc:
        entry["status"] = short_error(exc)
    return entry


def reference_check(peers: ModuleType, n: int = 512) -> dict[str, Any]:
    """Max difference between :func:`reference_xyz` and the peers' float64 torch loop (the same build)."""
    refs = chain_refs(n)
    b32, a32, d32 = make_inputs(n, 1, torch.float32, 0)
    ref = reference_xyz(*(t[0].double().numpy() for t in (b32, a32, d32)), refs)
    with torch.no_grad():
        loop64 = peers.loop_build(b32.double(), a32.double(), d32.double(), torch.from_numpy(refs))
    return {
        "n_atoms": n,
        "max_abs_diff_python_ref_vs_peers_loop_float64": float(np.abs(loop64[0].numpy() - ref).max()),
    }
