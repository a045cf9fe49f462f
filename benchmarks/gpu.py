"""GPU check and timing in one short command (about 5 minutes on a GPU machine), JSON out.

Usage::

    python benchmarks/gpu.py OUT.json [--device cuda] [--quick]

1. Correctness on the device, float64: every ``to_cartesian`` method against the
   float64 per-atom reference (:func:`benchmarks.workloads.reference_xyz`), every
   ``to_internal`` method against the torch engine on the CPU, and gradcheck of
   both maps on a small branched table.
2. Timings (float32, ``torch.cuda.synchronize`` around each step, median of
   repeats after warm-up): 1,000 heavy-atom proteins of 163 residues
   (:func:`batched_nerf.protein.build_batch`: 10 sequences x a leading batch of
   100) forward and forward+backward; alanine dipeptide x 65,536 forward
   (``to_cartesian`` and ``to_internal``); chain 64 x 1024 forward and
   forward+backward. Each part records the engine ``auto`` picked.
3. The GPU dispatch rule (``rule_grid``, :mod:`batched_nerf.engines.gpu_policy`):
   chains of 32 to 2,048 atoms x 256 to 65,536 samples (at most 2**24
   atom-samples), fused vs scan forward and forward+backward, next to the engine
   the rule picks there, so that a device run shows whether ``FUSED_MIN_LANES``
   and ``FUSED_MAX_COMPONENT`` sit where the engines cross.

``--device cpu --quick`` runs the same code on tiny sizes (a smoke test, see
``tests/test_bench.py``). Every part records its error instead of stopping the run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import batched_nerf as bn  # noqa: E402
from batched_nerf.engines import dispatch, gpu_policy  # noqa: E402
from benchmarks.workloads import alanine_refs, make_inputs, reference_xyz, tree_refs  # noqa: E402

CARTESIAN_METHODS = ("levels", "scan", "fused", "auto")
INTERNAL_METHODS = ("torch", "fused", "auto")
AMINO = "ACDEFGHIKLMNPQRSTVWY"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time(step: Callable[[], object], device: str, repeats: int) -> dict[str, Any]:
    for _ in range(2):
        step()
        _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "runs": repeats}


def _guard(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # record and go on
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}


# --------------------------------------------------------------------------
# Correctness
# --------------------------------------------------------------------------


def check_cartesian(device: str) -> dict[str, Any]:
    """Max |x - reference| (float64) per method and table."""
    out: dict[str, Any] = {}
    for name, refs in (("alanine_dipeptide", alanine_refs()), ("tree", tree_refs(60))):
        table = bn.ConstructionTable(refs)
        b, a, d = make_inputs(len(refs), 3, torch.float64, 1)
        ref = np.stack([reference_xyz(b[k].numpy(), a[k].numpy(), d[k].numpy(), refs) for k in range(3)])
        for method in CARTESIAN_METHODS:

            def run(method: str = method, table: Any = table, ic: Any = (b, a, d), ref: Any = ref) -> float:
                x = bn.to_cartesian(*(t.to(device) for t in ic), table, method=method)  # type: ignore[arg-type]
                return float(np.abs(x.cpu().numpy() - ref).max())

            out[f"{name}/{method}"] = _guard(run)
    return out


def check_internal(device: str) -> dict[str, Any]:
    """Max |ic - torch engine on the CPU| (float64) per method."""
    table = bn.ConstructionTable(alanine_refs())
    x = bn.to_cartesian(*make_inputs(table.n_atoms, 4, torch.float64, 2), table)
    ref = bn.to_internal(x, table, method="torch")
    out: dict[str, Any] = {}
    for method in INTERNAL_METHODS:

        def run(method: str = method) -> float:
            ic = bn.to_internal(x.to(device), table, method=method)  # type: ignore[arg-type]
            return max(float((c.cpu() - r).abs().max()) for c, r in zip(ic, ref))

        out[method] = _guard(run)
    return out


def check_gradients(device: str) -> dict[str, Any]:
    """gradcheck (and gradgradcheck) of both maps on a small branched table, float64."""
    table = bn.ConstructionTable(tree_refs(8))
    b, a, d = (t.to(device).requires_grad_() for t in make_inputs(8, 2, torch.float64, 3))
    out: dict[str, Any] = {}
    for method in CARTESIAN_METHODS:

        def cart(method: str = method) -> bool:
            fn = lambda b, a, d: bn.to_cartesian(b, a, d, table, method=method)  # type: ignore[arg-type]  # noqa: E731
            return bool(
                torch.autograd.gradcheck(fn, (b, a, d)) and torch.autograd.gradgradcheck(fn, (b, a, d))
            )

        out[f"to_cartesian/{method}"] = _guard(cart)
    x = bn.to_cartesian(b.detach(), a.detach(), d.detach(), table).requires_grad_()
    for method in INTERNAL_METHODS:

        def inv(method: str = method) -> bool:
            fn = lambda x: tuple(bn.to_internal(x, table, method=method))  # type: ignore[arg-type]  # noqa: E731
            return bool(torch.autograd.gradcheck(fn, (x,)) and torch.autograd.gradgradcheck(fn, (x,)))

        out[f"to_internal/{method}"] = _guard(inv)
    return out


# --------------------------------------------------------------------------
# Timings
# --------------------------------------------------------------------------


def _auto(table: Any, n_samples: int, device: str) -> str:
    """The engine ``method="auto"`` takes for ``n_samples`` builds of ``table`` on ``device``."""
    return dispatch.auto_method(table, n_samples, torch.device(device).type)


def _fwd_bwd(build: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    leaves = [t.clone().requires_grad_() for t in inputs]
    w = None

    def step() -> object:
        nonlocal w
        for t in leaves:
            t.grad = None
        out = build(*leaves)
        if w is None:
            w = torch.randn_like(out)
        (out * w).sum().backward()
        return leaves[0].grad

    return step


def time_proteins(device: str, quick: bool, repeats: int) -> dict[str, Any]:
    """``bn.protein.build_batch`` of ``n_seq`` 163-residue sequences x a leading batch."""
    n_seq, lead, length = (2, 2, 20) if quick else (10, 100, 163)
    rng = np.random.default_rng(0)
    seqs = ["".join(rng.choice(list(AMINO), length)) for _ in range(n_seq)]
    g = torch.Generator().manual_seed(0)
    phi = (torch.rand(lead, n_seq, length, generator=g) * 2 - 1).mul(3.14).to(device)
    psi = (torch.rand(lead, n_seq, length, generator=g) * 2 - 1).mul(3.14).to(device)
    t0 = time.perf_counter()
    first = bn.protein.build_batch(seqs, phi, psi)
    _sync(device)
    out: dict[str, Any] = {
        "proteins": n_seq * lead,
        "residues": length,
        "first_call_s": time.perf_counter() - t0,
    }
    out["atoms_per_protein_max"] = int(first.xyz.shape[-2])
    out["auto_picks"] = _auto(bn.protein.packed_proteins(seqs).table, lead, device)
    for method in ("auto", "scan", "levels"):

        def build(phi: torch.Tensor, psi: torch.Tensor, method: str = method) -> torch.Tensor:
            return bn.protein.build_batch(seqs, phi, psi, method=method).xyz

        def fwd(method: str = method) -> object:
            with torch.no_grad():
                return build(phi, psi, method)

        out[f"{method}/forward"] = _guard(lambda fwd=fwd: _time(fwd, device, repeats))
        out[f"{method}/forward_backward"] = _guard(
            lambda build=build: _time(_fwd_bwd(build, (phi, psi)), device, repeats)
        )
    return out


def time_alanine(device: str, quick: bool, repeats: int) -> dict[str, Any]:
    batch = 256 if quick else 65_536
    table = bn.ConstructionTable(alanine_refs()).prepare(device)
    b, a, d = (t.to(device) for t in make_inputs(table.n_atoms, batch, torch.float32, 0))
    x = bn.to_cartesian(b, a, d, table)
    out: dict[str, Any] = {"batch": batch, "auto_picks": _auto(table, batch, device)}
    for method in ("auto", "levels", "scan"):

        def fwd(method: str = method) -> object:
            with torch.no_grad():
                return bn.to_cartesian(b, a, d, table, method=method)  # type: ignore[arg-type]

        out[f"to_cartesian/{method}/forward"] = _guard(lambda fwd=fwd: _time(fwd, device, repeats))
    for method in INTERNAL_METHODS:

        def inv(method: str = method) -> object:
            with torch.no_grad():
                return bn.to_internal(x, table, method=method)  # type: ignore[arg-type]

        out[f"to_internal/{method}/forward"] = _guard(lambda inv=inv: _time(inv, device, repeats))
    return out


def time_chain(device: str, quick: bool, repeats: int) -> dict[str, Any]:
    batch = 64 if quick else 1024
    table = bn.ConstructionTable.chain(64).prepare(device)
    ic = tuple(t.to(device) for t in make_inputs(64, batch, torch.float32, 0))
    out: dict[str, Any] = {"batch": batch, "auto_picks": _auto(table, batch, device)}
    for method in ("auto", "levels", "scan"):

        def build(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor, method: str = method) -> torch.Tensor:
            return bn.to_cartesian(b, a, d, table, method=method)  # type: ignore[arg-type]

        def fwd(build: Callable[..., torch.Tensor] = build) -> object:
            with torch.no_grad():
                return build(*ic)

        out[f"{method}/forward"] = _guard(lambda fwd=fwd: _time(fwd, device, repeats))
        out[f"{method}/forward_backward"] = _guard(
            lambda build=build: _time(_fwd_bwd(build, ic), device, repeats)
        )
    return out


def time_rule_grid(device: str, quick: bool, repeats: int) -> dict[str, Any]:
    """Fused vs scan on chains x batch sizes around the GPU rule's thresholds (float32)."""
    sizes, batches = ((8, 32), (4, 4096)) if quick else ((32, 128, 512, 2048), (256, 4096, 65_536))
    cap = 2**15 if quick else 2**24
    out: dict[str, Any] = {
        "rule": gpu_policy.RULE["cuda"],
        "fused_min_lanes": gpu_policy.FUSED_MIN_LANES,
        "fused_max_component": gpu_policy.FUSED_MAX_COMPONENT,
        "cells": [],
    }
    for n in sizes:
        table = bn.ConstructionTable.chain(n).prepare(device)
        for batch in batches:
            if n * batch > cap:
                continue
            ic = tuple(t.to(device) for t in make_inputs(n, batch, torch.float32, 0))
            cell: dict[str, Any] = {"atoms": n, "samples": batch, "lanes": batch}
            cell["rule_picks"] = dispatch.choose_method(
                table.depth, table.single_path, batch, "cuda", True, n_components=1, largest_component=n
            )
            for method in ("fused", "scan"):

                def build(b: Any, a: Any, d: Any, method: str = method, table: Any = table) -> torch.Tensor:
                    return bn.to_cartesian(b, a, d, table, method=method)  # type: ignore[arg-type]

                def fwd(build: Callable[..., torch.Tensor] = build, ic: Any = ic) -> object:
                    with torch.no_grad():
                        return build(*ic)

                cell[f"{method}/forward"] = _guard(lambda fwd=fwd: _time(fwd, device, repeats))
                cell[f"{method}/forward_backward"] = _guard(
                    lambda build=build, ic=ic: _time(_fwd_bwd(build, ic), device, repeats)
                )
            out["cells"].append(cell)
    return out


def _machine(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "batched_nerf": bn.__version__,
        "device": device,
        "cpu_threads": torch.get_num_threads(),
        "backends": bn.backends(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def run(out_path: str, device: str = "cuda", quick: bool = False) -> dict[str, Any]:
    """Run every check and timing and write the JSON to ``out_path``; returns it too."""
    t_start = time.perf_counter()
    repeats = 3 if quick else 10
    result: dict[str, Any] = {"machine": _machine(device), "quick": quick}
    parts: dict[str, Callable[[], Any]] = {
        "check_cartesian_f64": lambda: check_cartesian(device),
        "check_internal_f64": lambda: check_internal(device),
        "gradcheck": lambda: check_gradients(device),
        "proteins_163": lambda: time_proteins(device, quick, repeats),
        "alanine": lambda: time_alanine(device, quick, repeats),
        "chain_64": lambda: time_chain(device, quick, repeats),
        "rule_grid": lambda: time_rule_grid(device, quick, 3 if quick else 5),
    }
    for name, part in parts.items():
        t0 = time.perf_counter()
        try:
            result[name] = part()
        except Exception:  # a whole part failed: keep the traceback
            result[name] = {"error": traceback.format_exc(limit=3)}
        result.setdefault("part_s", {})[name] = time.perf_counter() - t0
        Path(out_path).write_text(json.dumps(result, indent=1))  # partial results survive a timeout
    result["backends_after"] = bn.backends()  # "disabled": a Triton kernel that failed under auto
    result["wall_s"] = time.perf_counter() - t_start
    Path(out_path).write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", help="path of the JSON result")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    res = run(args.out, args.device, args.quick)
    print(json.dumps({k: v for k, v in res.items() if k.startswith("check") or k == "gradcheck"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
