"""The benchmarks page's first screen: one table of speed-ups against each tool users know, one chart.

Reads the records of one run of the suite (``benchmarks/run.py --out DIR`` writes
``DIR/results.json``) and of ``benchmarks/md_bat.py --json PATH`` (MDAnalysis BAT),
and writes ``headline.md`` (the table) and ``speedups.png`` (a log-scale bar chart)
next to ``results.json``; with ``--page docs/benchmarks.md`` it also replaces the
block between ``<!-- headline:start -->`` and ``<!-- headline:end -->`` of that page.

A ratio is the other tool's time over ours with ``method="auto"`` (the default a user
gets), on the same row, pass and machine, from one run: above 1, ours is faster. Each
cell gives the median over the rows that tool was timed on, and the range. ``python
benchmarks/headline.py docs/benchmarks/results.json --md-bat docs/benchmarks/md_bat.json
--page docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PASSES = ("forward", "forward_backward", "committor")
PASS_NAMES = {"forward": "forward", "forward_backward": "forward + backward", "committor": "committor pass"}

#: peer name in the records -> (tool, what is timed); NeRFax's three modes count as one tool (its
#: fastest mode on each row), chemcoord's two calls as two lines.
TOOLS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("per-atom torch loop", ("torch-loop",), "the `X[:, j] = ...` loop, batched over samples"),
    (
        "NeRFax",
        ("nerfax-associative", "nerfax-sequential", "nerfax-fully_sequential"),
        "JAX, jit-compiled, its fastest of three modes per row (compile time excluded)",
    ),
    ("chemcoord", ("chemcoord",), "`Zmat.get_cartesian()`, one conformer per call"),
    ("chemcoord (core)", ("chemcoord@forward_numba",), "its numba core `get_X`, one conformer per call"),
    ("MP-NeRF", ("mp-nerf",), "its `proteins`/`massive_pnerf` builders, one chain per call"),
    ("bgflow", ("bgflow",), "`GlobalInternalCoordinateTransformation`, batched"),
)

START, END = "<!-- headline:start -->", "<!-- headline:end -->"


def _ratios(records: dict[str, Any]) -> dict[tuple[str, str], list[float]]:
    """(tool, pass) -> the ratios of its rows (their time / ours with ``auto``)."""
    best: dict[tuple[str, str, tuple[Any, ...]], float] = {}
    for s in records["speedups"]:
        peer, pas = s["peer"], s["pass"]
        if pas == "forward_numba":
            peer, pas = f"{peer}@forward_numba", "forward"
        tool = next((name for name, peers, _ in TOOLS if peer in peers), None)
        ratio = s.get("speedup_vs_auto") or s.get("speedup")
        if tool is None or pas not in PASSES or not ratio:
            continue
        row = (s["workload"], s["n_atoms"], s["batch"])
        key = (tool, pas, row)
        best[key] = min(best.get(key, float("inf")), ratio)  # NeRFax: its fastest mode
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (tool, pas, _), ratio in best.items():
        out[tool, pas].append(ratio)
    return out


def _md_bat(result: dict[str, Any]) -> dict[str, float]:
    """MDAnalysis BAT ratios at the thread count where ours did best."""
    ours = max(result["ours"].values(), key=lambda t: t["ratio_cartesian"])
    return {"to Cartesian": ours["ratio_cartesian"], "to BAT": ours["ratio_run"]}


def _x(ratio: float) -> str:
    """``0.72x``, ``5.2x``, ``471x``, ``2,140x``."""
    return f"{ratio:.2g}x" if ratio < 10 else f"{ratio:,.0f}x"


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"**{_x(med)}** (1 row)"
    return f"**{_x(med)}** ({_x(min(values))} to {_x(max(values))}, {len(values)} rows)"


def table(records: dict[str, Any], md_bat: dict[str, Any] | None) -> str:
    """The Markdown table of the first screen."""
    ratios = _ratios(records)
    head = " | ".join(PASS_NAMES[p] for p in PASSES)
    lines = [f"| instead of | what is timed | {head} |", "|---|---|" + "---:|" * len(PASSES)]
    for tool, _, what in TOOLS:
        cells = [_cell(ratios.get((tool, p), [])) for p in PASSES]
        if all(c == "-" for c in cells):
            cells[0] = "not timed in this run"
        lines.append(f"| {tool} | {what} | " + " | ".join(cells) + " |")
    if md_bat is not None:
        bat = _md_bat(md_bat)
        lines.append(
            f"| MDAnalysis BAT | AdK residues 1-40 ({md_bat['atoms']} atoms), {md_bat['frames']} frames: "
            f"`BAT.Cartesian` per frame; `BAT.run` | **{_x(bat['to Cartesian'])}** to Cartesian | "
            f"**{_x(bat['to BAT'])}** to BAT | - |"
        )
    return "\n".join(lines)


def chart(records: dict[str, Any], md_bat: dict[str, Any] | None, path: Path) -> bool:
    """A log-scale bar chart of the median speed-ups (whiskers: the range); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ratios = _ratios(records)
    tools = [t for t, _, _ in TOOLS if any(ratios.get((t, p)) for p in PASSES)]
    series: list[tuple[str, list[list[float]]]] = [
        (PASS_NAMES[p], [ratios.get((t, p), []) for t in tools]) for p in PASSES
    ]
    if md_bat is not None:
        bat = _md_bat(md_bat)
        tools.append("MDAnalysis BAT")
        series[0][1].append([bat["to Cartesian"]])
        series[1][1].append([])
        series[2][1].append([])
    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(tools))]
        med = [statistics.median(v) if v else 0.0 for v in values]
        low = [m - min(v) if v else 0.0 for m, v in zip(med, values)]
        high = [max(v) - m if v else 0.0 for m, v in zip(med, values)]
        ax.bar(xs, med, width, yerr=[low, high], capsize=3, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(tools)), tools, rotation=0, fontsize=8)
    ax.set_ylabel("speed-up: their time / ours (log scale)")
    ax.set_title("batched_nerf (method='auto') against the tools it replaces: median over rows, range")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def machine_line(records: dict[str, Any]) -> str:
    m = records["machine"]
    cpu = m.get("cpu") or m.get("platform", "")
    cores = m.get("cpu_count", m.get("cores", "?"))
    return (
        f"Measured {m.get('time', '')} on {cpu}, {cores} cores, torch {m.get('torch')}, "
        f"batched_nerf {m.get('batched_nerf')}, float32 (the suite's rows)."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="results.json of benchmarks/run.py --out")
    parser.add_argument("--md-bat", metavar="PATH", help="JSON of benchmarks/md_bat.py --json")
    parser.add_argument("--page", metavar="PATH", help="a page whose headline block to replace")
    args = parser.parse_args(argv)
    records = json.loads(Path(args.results).read_text())
    md_bat = json.loads(Path(args.md_bat).read_text()) if args.md_bat else None
    out = Path(args.results).parent
    text = table(records, md_bat)
    (out / "headline.md").write_text(text + "\n")
    drawn = chart(records, md_bat, out / "speedups.png")
    print(text)
    if args.page:
        page = Path(args.page)
        body = page.read_text()
        if START not in body or END not in body:
            print(f"{page} has no {START} ... {END} block", file=sys.stderr)
            return 2
        block = f"{START}\n{text}\n\n{machine_line(records)}\n"
        if drawn:
            block += f"\n![speed-ups against each tool](benchmarks/{(out / 'speedups.png').name})\n"
        head, rest = body.split(START, 1)
        page.write_text(head + block + END + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
