"""Where ``method="auto"`` should switch engines: levels vs scan, side by side.

Times both engines (forward and forward+backward, float32, median of 7 after a
warm-up, whole batch per step) on alanine dipeptide, chains, a random tree and a
protein-like backbone over batch sizes, and prints what ``auto`` picks next to
the faster engine. The dispatch rule in ``batched_nerf/engines/dispatch.py``
was fitted to this table; rerun it after changing an engine::

    python benchmarks/crossover.py [--batches 1 64 256 1024 4096] [--max-work 2200000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # this checkout's batched_nerf and benchmarks

import batched_nerf as bn  # noqa: E402
from batched_nerf.engines.dispatch import auto_method  # noqa: E402
from benchmarks import timing, workloads  # noqa: E402


def tables() -> list[tuple[str, bn.ConstructionTable]]:
    out = [("alanine_dipeptide", bn.data.load("alanine_dipeptide").table)]
    out += [(f"chain{n}", bn.ConstructionTable.chain(n)) for n in (16, 64, 256, 512, 4096)]
    out.append(("tree512", bn.ConstructionTable(workloads.tree_refs(512))))
    out.append(("protein100", bn.ConstructionTable(workloads.protein_refs(100))))
    return out


def _sum_q(x: torch.Tensor) -> torch.Tensor:
    return x.sum((-2, -1))


def _median_ms(table: bn.ConstructionTable, method: str, ic: tuple, w: torch.Tensor) -> list[float]:
    def build(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return bn.to_cartesian(b, a, d, table, method=method)  # type: ignore[arg-type]

    steps = [timing.make_step(build, ic, pass_, w, _sum_q) for pass_ in ("forward", "forward_backward")]
    return [timing.measure(step, 7, 30.0)[0] * 1e3 for step in steps]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256, 1024, 4096])
    parser.add_argument("--max-work", type=int, default=2_200_000, help="skip rows with more atom-samples")
    args = parser.parse_args(argv)
    print("table               depth      B  levels fwd / f+b ms   scan fwd / f+b ms   auto    faster")
    for name, table in tables():
        for batch in args.batches:
            if table.n_atoms * batch > args.max_work:
                continue
            ic = workloads.make_inputs(table.n_atoms, batch, torch.float32, seed=0)
            w = torch.randn(batch, table.n_atoms, 3)
            times = {method: _median_ms(table, method, ic, w) for method in ("levels", "scan")}
            faster = min(times, key=lambda m: sum(times[m]))
            lv, sc = times["levels"], times["scan"]
            auto = auto_method(table, batch, "cpu")
            print(
                f"{name:18s} {table.depth:6d} {batch:6d}  {lv[0]:8.2f} / {lv[1]:8.2f}"
                f"   {sc[0]:8.2f} / {sc[1]:8.2f}   {auto:7s} {faster}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
