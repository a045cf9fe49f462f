"""float32 inputs on the GPU kernels: error of float32 vs float64 accumulation, in Angstrom.

Usage::

    python benchmarks/accumulate.py [OUT.json] [--device cpu|cuda] [--samples 8] [--quick]

For chains of 100, 1,000 and 10,000 atoms and alanine dipeptide, ``--samples``
random float32 conformers (:func:`benchmarks.workloads.make_inputs`: bonds
1.3-1.6, angles 95-125 degrees, dihedrals uniform) are built by the fused Triton
kernel (:func:`batched_nerf.engines.fused.cuda.build.triton_build`) with float64
scratch (the default) and with float32 scratch (``accumulate_dtype=torch.float32``),
and, for comparison, by the scan and level engines in float32 (what a float32
call gets where ``auto`` does not take the fused kernels). Each is compared with
:func:`benchmarks.workloads.reference_xyz`, a float64 per-atom NeRF loop in plain
Python floats on the same float32-rounded inputs: the max and the RMS distance
over atoms and conformers.

``--device cpu`` (default) runs the Triton kernel in Triton's interpreter
(``TRITON_INTERPRET=1``, set here before triton is imported): the same kernel
code, its loads, stores and arithmetic in the scratch dtype, NumPy's float32
``cos``/``sin`` instead of CUDA's and no fused multiply-adds, so a GPU's errors
are expected alike (FMAs round less). ``--device cuda`` runs them on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if "--device" not in sys.argv or "cpu" in sys.argv[sys.argv.index("--device") + 1 :][:1]:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import batched_nerf as bn  # noqa: E402
from benchmarks.workloads import alanine_refs, chain_refs, make_inputs, reference_xyz  # noqa: E402

SIZES = (100, 1_000, 10_000)


def _tables(quick: bool) -> list[tuple[str, np.ndarray]]:
    sizes = (100,) if quick else SIZES
    return [(f"chain {n}", chain_refs(n)) for n in sizes] + [("alanine dipeptide", alanine_refs())]


def _stats(x: torch.Tensor, ref: np.ndarray) -> dict[str, float]:
    dist = np.linalg.norm(x.double().cpu().numpy() - ref, axis=-1)
    return {"max_A": float(dist.max()), "rms_A": float(np.sqrt((dist**2).mean()))}


def measure(name: str, refs: np.ndarray, samples: int, device: str) -> dict[str, Any]:
    """Errors of each build of ``samples`` float32 conformers of ``refs`` against the float64 reference."""
    from batched_nerf.engines.fused.build import fused_plan
    from batched_nerf.engines.fused.cuda.build import device_rows, triton_build

    table = bn.ConstructionTable(refs)
    b, a, d = make_inputs(table.n_atoms, samples, torch.float32, 0, device)
    ref = np.stack(
        [reference_xyz(*(t[k].double().cpu().numpy() for t in (b, a, d)), refs) for k in range(samples)]
    )
    plan = device_rows(fused_plan(table.topology), device)
    row: dict[str, Any] = {"table": name, "n_atoms": table.n_atoms, "samples": samples}
    for label, acc in (("fused, float64 accumulation", torch.float64), ("fused, float32", torch.float32)):
        t0 = time.perf_counter()
        x = triton_build(plan, b, a, d, None, accumulate=acc)
        row[label] = {**_stats(x, ref), "seconds": round(time.perf_counter() - t0, 1)}
    for method in ("scan", "levels"):
        if method == "levels" and table.depth > 2_000:
            continue  # thousands of small torch steps: the scan engine says enough
        with torch.no_grad():
            x = bn.to_cartesian(b, a, d, table, method=method)
        row[f"{method}, float32"] = _stats(x, ref)
    return row


def run(device: str, samples: int, quick: bool) -> list[dict[str, Any]]:
    """One row per table (see the module docstring)."""
    return [measure(name, refs, samples, device) for name, refs in _tables(quick)]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table: max (RMS) error in Angstrom per build."""
    builds = [k for k in rows[0] if isinstance(rows[0][k], dict)]
    lines = ["| table | " + " | ".join(builds) + " |", "|---" * (len(builds) + 1) + "|"]
    for r in rows:
        cells = [f"{r[b]['max_A']:.1e} ({r[b]['rms_A']:.1e})" if b in r else "-" for b in builds]
        lines.append(f"| {r['table']} x {r['samples']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", nargs="?", default="", help="path of the JSON result")
    parser.add_argument("--device", default="cpu", help="cpu (Triton's interpreter, default) or cuda")
    parser.add_argument("--samples", type=int, default=8, help="conformers per table")
    parser.add_argument("--quick", action="store_true", help="chain 100 and alanine dipeptide only")
    args = parser.parse_args(argv)
    rows = run(args.device, args.samples, args.quick)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
