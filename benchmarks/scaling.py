"""Cost per atom-sample of ``to_cartesian`` from 10^4 to 10^7 atom-samples (it should stay flat).

Rows: alanine dipeptide (22 atoms) and the heavy atoms of a 163-residue protein
(``bn.protein.protein_table``), float32, ``method="auto"`` (the fused kernels on
the CPU), forward (no gradient) and forward+backward (``sum(xyz * w)`` with
respect to the dihedrals). For each batch size: the median of interleaved
rounds, and the time per atom-sample in ns. The summary line per row and pass
is the largest batch's per-atom-sample time over that of the smallest batch that
fills the cores (at least ``SERIAL_WORK`` atom-samples per thread), and over the
lowest per-atom-sample time of the row (the stricter reading).

Run: ``python benchmarks/scaling.py`` (a few minutes); ``--max 1e6`` for a quick look;
``--plot docs/benchmarks/scaling.png`` also draws ns per atom-sample against atom-samples (needs
matplotlib).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

import batched_nerf as bn

SEQUENCE_163 = (
    "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQFEVVHSLAKWKRQTLGQHDFSAGEGLYTHMKALRPDEDRLSPLHSVYVDQWDWERVMGDGERQFSTLKSTVEAIWAGIKATEAAVSEEFGLAPFLPDQIHFVHSQELLSRYP"
)[:163]


def _tables() -> dict[str, bn.ConstructionTable]:
    return {
        "alanine dipeptide (22 atoms)": bn.data.load("alanine_dipeptide").table,
        "protein, 163 residues, heavy atoms": bn.protein.protein_table(SEQUENCE_163).table,
    }


def _inputs(table: bn.ConstructionTable, batch: int):
    gen = torch.Generator().manual_seed(0)
    n = table.n_atoms
    b = 1.3 + 0.2 * torch.rand(batch, n, generator=gen)
    a = 1.8 + 0.3 * torch.rand(batch, n, generator=gen)
    d = 2 * math.pi * torch.rand(batch, n, generator=gen) - math.pi
    return b, a, d


def _steps(table: bn.ConstructionTable, batch: int):
    b, a, d = _inputs(table, batch)
    leaf = d.clone().requires_grad_(True)
    w = torch.randn(batch, table.n_atoms, 3, generator=torch.Generator().manual_seed(1))

    def forward() -> None:
        with torch.no_grad():
            bn.to_cartesian(b, a, d, table)

    def forward_backward() -> None:
        leaf.grad = None
        (bn.to_cartesian(b, a, leaf, table) * w).sum().backward()

    return {"forward": forward, "forward+backward": forward_backward}


def _median(step, budget: float) -> float:
    step()  # compile / warm
    times: list[float] = []
    stop = time.perf_counter() + budget
    while len(times) < 3 or (time.perf_counter() < stop and len(times) < 50):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def plot(curves: dict[str, list[tuple[int, float]]], fill: int, path: Path, title: str) -> None:
    """ns per atom-sample against atom-samples (log x), one line per row and pass; the work that
    fills the cores marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    for label, rows in curves.items():
        ax.plot([w for w, _ in rows], [ns for _, ns in rows], marker="o", label=label)
    ax.axvline(fill, color="grey", linestyle=":", label="fills the cores")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("atom-samples per call")
    ax.set_ylabel("ns per atom-sample")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=float, default=1e7, help="largest atom-samples per call")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--plot", type=Path, default=None, help="also draw the curves here (matplotlib)")
    args = parser.parse_args(argv)
    from batched_nerf.engines.fused.cpu import build as cpu_build

    threads = torch.get_num_threads()
    fill = cpu_build.SERIAL_WORK * threads
    print(f"torch {torch.__version__}, {threads} threads, float32, method='auto'")
    sizes = [s for s in (1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7) if s <= args.max]
    curves: dict[str, list[tuple[int, float]]] = {}
    for name, table in _tables().items():
        print(f"\n### {name}\n")
        print("| atom-samples | batch | pass | time | ns per atom-sample |\n|---|---|---|---|---|")
        per: dict[str, list[tuple[int, float]]] = {}
        for size in sizes:
            batch = max(1, round(size / table.n_atoms))
            for what, step in _steps(table, batch).items():
                t = _median(step, args.budget)
                ns = 1e9 * t / (batch * table.n_atoms)
                per.setdefault(what, []).append((batch * table.n_atoms, ns))
                print(f"| {batch * table.n_atoms:,} | {batch:,} | {what} | {t * 1e3:.3g} ms | {ns:.2f} |")
        for what, rows in per.items():
            curves[f"{name}, {what}"] = rows
            filled = [ns for work, ns in rows if work >= fill] or [rows[-1][1]]
            best = min(ns for _, ns in rows)
            print(
                f"\n{what}: largest / smallest batch filling the cores = {rows[-1][1] / filled[0]:.2f}x, "
                f"largest / lowest = {rows[-1][1] / best:.2f}x"
            )
    if args.plot is not None:
        title = f"to_cartesian (method='auto'), float32, {threads} threads, torch {torch.__version__}"
        plot(curves, fill, args.plot, title)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
