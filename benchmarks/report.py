"""The report of a run: Markdown (``results.md``), JSON (``results.json``) and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.records import State
from benchmarks.timing import PASS_LABEL, PASSES, fmt_seconds

#: NeRFax's published CPU figures (2 cores, float32, linear chain, whole batch), seconds
#: (forward, forward+backward); drawn on the time-vs-atoms plot for reference.
NERFAX_FIGURES = {
    (512, 1): (0.055e-3, 0.16e-3),
    (4096, 1): (0.46e-3, 2.3e-3),
    (512, 256): (9.1e-3, 47e-3),
    (4096, 256): (83e-3, 409e-3),
}


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}x"


def _bytes(x: Any) -> str:
    """``"10.6 MiB"``; a status string shortened to its kind (the memory table has the reason)."""
    if x is None:
        return "-"
    return f"{x / 2**20:.1f} MiB" if isinstance(x, (int, float)) else str(x).split(":")[0]


def _loadavg(v: list[float] | None) -> str:
    return "n/a" if not v else " / ".join(f"{x:.2f}" for x in v)


def _cell(t: Any) -> str:
    if t is None:
        return "-"
    return fmt_seconds(t.median_s) + (" (xB)" if t.extrapolated else "") if t.ok else t.status


# --------------------------------------------------------------------------
# Markdown sections
# --------------------------------------------------------------------------


def markdown(
    state: State,
    machine: dict[str, Any],
    errors: dict[str, Any],
    memory: list[dict[str, Any]],
    speedups: list[dict[str, Any]],
    headline: list[dict[str, Any]],
    targets: list[dict[str, Any]],
) -> str:
    """The whole Markdown report."""
    lines = _header(state, machine)
    lines += _headline(headline)
    lines += _targets(targets)
    lines += _timings(state)
    lines += _speedups(speedups)
    lines += _errors(errors)
    lines += _memory(memory)
    if state.notes:
        lines += ["## Notes", ""] + [f"* {n}" for n in state.notes]
    return "\n".join(lines) + "\n"


def _header(state: State, machine: dict[str, Any]) -> list[str]:
    return [
        f"# batched_nerf benchmarks ({'quick' if state.quick else 'full'})",
        "",
        f"torch {machine['torch']}, {machine['torch_threads']} threads, {machine['cpu']} "
        f"({machine['cpu_count']} cores), device {machine['device']}, float32, "
        f"load average at start {_loadavg(machine.get('loadavg_start'))}, "
        f"at end {_loadavg(machine.get('loadavg_end'))}. "
        "Median of repeats after one warm-up (time.perf_counter), whole batch per step. "
        "Compile times (first call) are excluded from medians and listed separately.",
        "",
    ]


def _section(title: str, header: str, align: str, intro: str = "") -> list[str]:
    """The title, the optional paragraph under it and the head of its table."""
    return [f"## {title}", "", *([intro, ""] if intro else []), header, align]


HEADLINE_INTRO = (
    'ours: our fastest eager engine (its name); auto/best: `method="auto"` over it; compiled: '
    "scan under torch.compile where timed. Ratios are the other's time over ours (> 1: ours faster; "
    "vs NeRFax with the faster of eager and compiled, marked c when compiled). peak: forward+backward "
    "peak memory of that engine / of the loop."
)
MEMORY_INTRO = (
    "Peak resident memory above the level just before the step, during one forward+backward in a "
    "fresh worker process per row and method (peak reset through /proc/self/clear_refs just before "
    "the step; CUDA: torch.cuda.max_memory_allocated above the baseline). Includes the autograd graph "
    "and allocator overhead."
)


def _headline(rows: list[dict[str, Any]]) -> list[str]:
    lines = _section(
        "Headline: ours vs the per-atom loop, NeRFax and chemcoord (same run)",
        "| workload | N | B | pass | ours (engine) | auto/best | compiled | loop | vs loop "
        "| NeRFax best (mode) | vs NeRFax | chemcoord get_X | vs chemcoord | peak ours / loop | targets |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        HEADLINE_INTRO,
    )
    for e in rows:
        head = f"| {e['workload']} | {e['n_atoms']} | {e['batch']} | {PASS_LABEL[e['pass']]} "
        if "ours_s" not in e:
            lines.append(head + "| " + e.get("status", "-") + " |" + " |" * 10)
            continue
        loop = fmt_seconds(e["loop_s"]) if "loop_s" in e else e.get("loop_status", "-")
        nerfax = f"{fmt_seconds(e['nerfax_s'])} ({e['nerfax_mode']})" if "nerfax_s" in e else "-"
        vs_nerfax = _ratio(e.get("vs_nerfax")) + (" c" if e.get("vs_nerfax_with") == "compiled" else "")
        cc = fmt_seconds(e.get("chemcoord_s")) + (" (xB)" if e.get("chemcoord_xB") else "")
        peak = "-"
        if "ours_peak_bytes" in e or "loop_peak_bytes" in e:
            peak = f"{_bytes(e.get('ours_peak_bytes'))} / {_bytes(e.get('loop_peak_bytes'))}"
        marks = "; ".join(f"{t['target']}: {t['status']}" for t in e["targets"])
        lines.append(
            head + f"| {fmt_seconds(e['ours_s'])} ({e['ours_engine']}) | {_ratio(e.get('auto_over_best'))} "
            f"| {fmt_seconds(e.get('compiled_s'))} | {loop} | {_ratio(e.get('vs_loop'))} | {nerfax} "
            f"| {vs_nerfax} | {cc} | {_ratio(e.get('vs_chemcoord'))} | {peak} | {marks} |"
        )
    return [*lines, ""]


def _targets(targets: list[dict[str, Any]]) -> list[str]:
    lines = _section(
        "Targets (issue 11)",
        "| target | status | rows met | missed | not measured |",
        "|---|---|---:|---|---|",
    )
    for t in targets:
        missed = "; ".join(t["missed"]) or "-"
        unmeasured = f"{len(t['unmeasured'])}: " + "; ".join(t["unmeasured"][:6]) if t["unmeasured"] else "-"
        if len(t["unmeasured"]) > 6:
            unmeasured += "; ..."
        lines.append(f"| {t['target']} | {t['status']} | {t['met']} | {missed} | {unmeasured} |")
    return [*lines, ""]


def _timings(state: State) -> list[str]:
    lines = _section(
        "Timings",
        "| workload | N | B | method | forward | fwd+bwd | committor | notes |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    )
    keys = dict.fromkeys((t.workload, t.n_atoms, t.batch, t.method) for t in state.timings)
    for wl, n, batch, method in keys:
        cells, notes = [], []
        for pass_ in PASSES:
            t = state.get(wl, n, batch, method, pass_)
            cells.append(_cell(t))
            if t is not None and t.compile_s is not None:
                notes.append(f"compile {PASS_LABEL[pass_]} {t.compile_s:.1f} s")
            if t is not None and t.note and t.note not in notes and not t.extrapolated:
                notes.append(t.note)
        extra = state.get(wl, n, batch, method, "forward_numba")
        if extra is not None and extra.ok:
            notes.append(f"numba core get_X {_cell(extra)}")
        lines.append(f"| {wl} | {n} | {batch} | {method} | {' | '.join(cells)} | {'; '.join(notes)} |")
    return [*lines, "", "(xB): peer without batching, B x its B=1 time.", ""]


def _speedups(speedups: list[dict[str, Any]]) -> list[str]:
    if not speedups:
        return []
    lines = _section(
        "Speed-up of ours vs each peer (peer time / our best eager time, same run)",
        "| workload | N | B | pass | peer | peer time | ours (method) | speed-up |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    )
    for s in speedups:
        lines.append(
            f"| {s['workload']} | {s['n_atoms']} | {s['batch']} | {s['pass']} | {s['peer']} | "
            f"{fmt_seconds(s['peer_s'])}{' (xB)' if s['peer_extrapolated'] else ''} | "
            f"{fmt_seconds(s['ours_s'])} ({s['ours_method']}) | {s['speedup']:.3g}x |"
        )
    return [*lines, ""]


def _error_value(e: dict[str, Any]) -> str:
    return f"{e['max_abs_error']:.2e}" if e["status"] == "ok" else e["status"]


def _errors(errors: dict[str, Any]) -> list[str]:
    curve = errors["chain_curve"]
    sizes = list(dict.fromkeys(e["n_atoms"] for e in curve))
    lines = [
        "## float32 max coordinate error vs float64 reference (linear chain)",
        "",
        f"Reference: {errors['reference']}.",
        "",
        "| variant | " + " | ".join(f"N={n}" for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for v in dict.fromkeys(e["variant"] for e in curve):
        found = {e["n_atoms"]: e for e in curve if e["variant"] == v}
        cells = [_error_value(found[n]) if n in found else "-" for n in sizes]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    lines.append("")
    if errors["branched"]:
        lines += ["| branched workload | N | variant | max error |", "|---|---:|---|---:|"]
        for e in errors["branched"]:
            lines.append(f"| {e['workload']} | {e['n_atoms']} | {e['variant']} | {_error_value(e)} |")
        lines.append("")
    if errors["peers"]:
        lines += ["| peer | N | max error | notes |", "|---|---:|---:|---|"]
        for e in errors["peers"]:
            extra = ["after Kabsch fit"] if e.get("aligned") else []
            extra += ["float64 only"] if e.get("dtype") == "float64" else []
            lines.append(f"| {e['peer']} | {e['n_atoms']} | {_error_value(e)} | {', '.join(extra)} |")
        lines.append("")
    return lines


def _memory(memory: list[dict[str, Any]]) -> list[str]:
    lines = _section(
        "Peak memory of one forward+backward",
        "| workload | N | B | method | peak | bytes per atom |",
        "|---|---:|---:|---|---:|---:|",
        MEMORY_INTRO,
    )
    absent: dict[tuple[str, int, int, str], list[str]] = {}  # methods sharing a row and a reason: one line
    for m in memory:
        if m["status"] != "ok":
            absent.setdefault((m["workload"], m["n_atoms"], m["batch"], m["status"]), []).append(m["method"])
            continue
        bound = " (lower bound)" if m.get("lower_bound") else ""
        lines.append(
            f"| {m['workload']} | {m['n_atoms']} | {m['batch']} | {m['method']} | "
            f"{_bytes(m['peak_bytes'])}{bound} | {m['bytes_per_atom']:.0f} |"
        )
    for (wl, n, batch, status), methods in absent.items():
        lines.append(f"| {wl} | {n} | {batch} | {', '.join(methods)} | {status} | |")
    return [*lines, ""]


# --------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------


def write(out: Path, report: str, payload: dict[str, Any], state: State, errors: dict[str, Any]) -> str:
    """Write ``results.md`` (with the plots linked), ``results.json`` and the plots; return the report."""
    out.mkdir(parents=True, exist_ok=True)
    plots = plot(state, errors, out)
    if plots:
        report += "\n" + "\n".join(f"![{p}]({p})" for p in plots) + "\n"
    (out / "results.md").write_text(report)
    payload["nerfax_published_figures_s"] = {f"{n}x{b}": list(v) for (n, b), v in NERFAX_FIGURES.items()}
    (out / "results.json").write_text(json.dumps(payload, indent=1))
    return report


def plot(state: State, errors: dict[str, Any], out: Path) -> list[str]:
    """``time_vs_atoms.png`` and ``error_vs_atoms.png`` (none, with a note, without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        state.notes.append("matplotlib not installed: no plots")
        return []
    _plot_times(plt, state, out / "time_vs_atoms.png")
    if not any(e["status"] == "ok" for e in errors["chain_curve"]):
        return ["time_vs_atoms.png"]
    _plot_errors(plt, errors, out / "error_vs_atoms.png")
    return ["time_vs_atoms.png", "error_vs_atoms.png"]


#: What the time plot draws: one line per tool a user knows (our ``auto``, the default; our compiled
#: path; each peer, NeRFax as its fastest mode per point), not every engine.
_PLOT_TOOLS = (
    ("batched_nerf, method='auto' (fused kernels)", ("auto",)),
    ("batched_nerf, compiled", ("compiled (auto)",)),
    ("per-atom torch loop", ("torch-loop",)),
    ("NeRFax (fastest mode)", ("nerfax-associative", "nerfax-sequential", "nerfax-fully_sequential")),
    ("chemcoord", ("chemcoord",)),
    ("MP-NeRF", ("mp-nerf",)),
    ("bgflow", ("bgflow",)),
)


def _plot_times(plt: Any, state: State, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2), sharey=True)
    chain = [t for t in state.timings if t.workload == "chain" and t.ok]
    colors = plt.get_cmap("tab10")
    styles = {"forward": "-", "forward_backward": "--"}
    for ax, batch in zip(axes, (1, 64)):
        for i, (label, methods) in enumerate(_PLOT_TOOLS):
            for pass_, style in styles.items():
                best: dict[int, float] = {}
                for t in chain:
                    if t.method in methods and t.pass_ == pass_ and t.batch == batch:
                        best[t.n_atoms] = min(best.get(t.n_atoms, float("inf")), t.median_s)
                if best:
                    xs, ys = zip(*sorted(best.items()))
                    name = label if pass_ == "forward" else None
                    ax.plot(xs, ys, style, marker="o", ms=4, color=colors(i), label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("atoms N (linear chain)")
        ax.set_title(f"{batch} sample{'s' if batch > 1 else ''} per call")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("median time per call (s, log scale)")
    handles, labels = axes[0].get_legend_handles_labels()
    for h, lab in zip(*axes[1].get_legend_handles_labels()):
        if lab not in labels:
            handles.append(h)
            labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, frameon=False)
    fig.suptitle("Time per call, float32 CPU: solid = forward, dashed = forward + backward")
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_errors(plt: Any, errors: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 5))
    curve = errors["chain_curve"]
    for variant in dict.fromkeys(e["variant"] for e in curve):
        ok = [e for e in curve if e["variant"] == variant and e["status"] == "ok"]
        pts = [(e["n_atoms"], e["max_abs_error"]) for e in ok]
        if pts:
            ax.plot(*zip(*pts), "-o", label=variant)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("atoms N (linear chain)")
    ax.set_ylabel("max |x_float32 - x_float64 reference| (Angstrom)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title("float32 coordinate error vs chain length")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
