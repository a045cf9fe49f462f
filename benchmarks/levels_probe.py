"""Side-by-side probe of the level engine against the per-atom torch loop.

Times forward, forward+backward and a committor pass (x = build(ic);
q = tanh(<W, x>) per sample; g = dq/dx with create_graph; (g**2).sum().backward())
for alanine dipeptide and chains, every contender interleaved round by round in
one process, and prints medians and ratios vs the loop. ``--baseline PATH``
adds the level engine of another checkout (a directory holding a
``batched_nerf`` package, e.g. ``git archive REV batched_nerf | tar -x -C PATH``)
as contender ``base``. ``--profile`` prints torch.profiler kernel counts per call
(aten calls that run a kernel, views excluded). ``--crossover`` times levels
against scan on shallow tables over batch sizes, next to what ``auto`` picks.
On a shared machine use ``--threads 1 --clock thread`` (CPU time of this thread,
not the time it waited for a core) and quote ratios.

Run from the repository root::

    git archive 5315758 batched_nerf | tar -x -C /tmp/levels-base   # the engine before issue 11
    PYTHONPATH=$PWD python benchmarks/levels_probe.py --baseline /tmp/levels-base --threads 1 --clock thread
    PYTHONPATH=$PWD python benchmarks/levels_probe.py --profile --repeats 1 --threads 1
    PYTHONPATH=$PWD python benchmarks/levels_probe.py --crossover --threads 1 --clock thread
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers

import batched_nerf as bn

PASSES = ("forward", "fwd+bwd", "committor")


def load_package(root: str, name: str = "bn_base"):
    """Import the ``batched_nerf`` package found under ``root`` as module ``name``."""
    init = Path(root) / "batched_nerf" / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build_order_refs(table: bn.ConstructionTable) -> tuple[torch.Tensor, np.ndarray]:
    """Refs renumbered so that every atom comes after its references (for the loop)."""
    refs = table.refs.numpy()
    order: list[int] = []
    placed: set[int] = set()
    while len(order) < len(refs):
        for i, row in enumerate(refs):
            if i not in placed and all(r < 0 or r in placed for r in row):
                order.append(i)
                placed.add(i)
    order_a = np.array(order)
    new_of_old = np.empty_like(order_a)
    new_of_old[order_a] = np.arange(len(order_a))
    out = np.where(refs[order_a] >= 0, new_of_old[np.maximum(refs[order_a], 0)], -1)
    return torch.from_numpy(out), order_a


def workloads(names: list[str]) -> list[tuple[str, bn.ConstructionTable, int]]:
    out = []
    for name in names:
        kind, batch = name.rsplit("x", 1)
        table = (
            bn.data.load(kind).table
            if not kind.startswith("chain")
            else bn.ConstructionTable.chain(int(kind[5:]))
        )
        out.append((name, table, int(batch)))
    return out


def make_step(
    build: Callable, ic: tuple[torch.Tensor, ...], pass_: str, w: torch.Tensor
) -> Callable[[], object]:
    leaves = [t.clone().requires_grad_(pass_ != "forward") for t in ic]

    def forward() -> object:
        with torch.no_grad():
            return build(*leaves)

    def fwd_bwd() -> object:
        for t in leaves:
            t.grad = None
        (build(*leaves) * w).sum().backward()
        return leaves[2].grad

    def committor() -> object:
        for t in leaves:
            t.grad = None
        x = build(*leaves)
        q = torch.tanh((x * w).sum((-2, -1)))
        g = torch.autograd.grad(q.sum(), x, create_graph=True)[0]
        (g**2).sum().backward()
        return leaves[2].grad

    return {"forward": forward, "fwd+bwd": fwd_bwd, "committor": committor}[pass_]


def contenders(table: bn.ConstructionTable, base) -> dict[str, Callable]:
    refs, order = build_order_refs(table)
    perm = torch.from_numpy(order)
    out = {
        "loop": lambda b, a, d: peers.loop_build(b[:, perm], a[:, perm], d[:, perm], refs),
        "levels": lambda b, a, d: bn.to_cartesian(b, a, d, table, method="levels"),
        "scan": lambda b, a, d: bn.to_cartesian(b, a, d, table, method="scan"),
    }
    if base is not None:
        base_table = base.ConstructionTable(table.refs.numpy())
        out["base"] = lambda b, a, d: base.to_cartesian(b, a, d, base_table, method="levels")
    return out


def inputs(table: bn.ConstructionTable, batch: int) -> tuple[torch.Tensor, ...]:
    b, a, d = peers.make_internal_coords(table.n_atoms, batch, torch.float32, 0)
    return b, a, d


def run(args: argparse.Namespace) -> None:
    base = load_package(args.baseline) if args.baseline else None
    torch.set_num_threads(args.threads)
    rows = []
    # thread CPU time ignores the time this process is descheduled on a shared machine (1 thread only)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    if args.clock == "thread" and args.threads != 1:
        raise SystemExit("--clock thread needs --threads 1")
    for name, table, batch in workloads(args.workloads):
        ic = inputs(table, batch)
        w = torch.randn(batch, table.n_atoms, 3, generator=torch.Generator().manual_seed(1))
        cons = {k: v for k, v in contenders(table, base).items() if k in args.contenders}
        for pass_ in PASSES:
            steps = {k: make_step(f, ic, pass_, w) for k, f in cons.items()}
            for step in steps.values():
                step()  # warm-up (plans, allocator)
            times: dict[str, list[float]] = {k: [] for k in steps}
            for _ in range(args.repeats):
                for k, step in steps.items():
                    t0 = clock()
                    step()
                    times[k].append(clock() - t0)
            stat = min if args.stat == "min" else statistics.median
            med = {k: stat(v) for k, v in times.items()}
            rows.append((name, pass_, med))
            cells = "  ".join(
                f"{k} {1e3 * t:8.2f} ms ({med['loop'] / t:5.2f}x)"
                if "loop" in med
                else f"{k} {1e3 * t:8.2f} ms"
                for k, t in med.items()
            )
            print(f"{name:26s} {pass_:9s} {cells}", flush=True)
    if args.profile:
        profile(args, base)


#: aten ops that only make views or metadata (no kernel runs)
VIEW_OPS = {
    "view",
    "select",
    "slice",
    "as_strided",
    "unbind",
    "expand",
    "expand_as",
    "permute",
    "reshape",
    "unflatten",
    "narrow",
    "split",
    "split_with_sizes",
    "t",
    "transpose",
    "unsqueeze",
    "squeeze",
    "alias",
    "detach",
    "empty",
    "empty_like",
    "empty_strided",
    "resize_",
    "_reshape_alias",
    "lift_fresh",
    "result_type",
    "to",
    "_to_copy_view",
    "chunk",
    "movedim",
    "contiguous",
}


def kernel_count(events) -> tuple[int, dict[str, int]]:
    """Aten calls that run a kernel (not views); nested calls counted only at the innermost level."""
    counts: dict[str, int] = {}
    for e in events:
        name = e.key.removeprefix("aten::")
        if not e.key.startswith("aten::") or name in VIEW_OPS:
            continue
        counts[name] = counts.get(name, 0) + e.count
    return sum(counts.values()), counts


def profile(args: argparse.Namespace, base) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    for name, table, batch in workloads(args.workloads):
        ic = inputs(table, batch)
        w = torch.randn(batch, table.n_atoms, 3)
        depth = table.depth
        for k, f in contenders(table, base).items():
            if k not in args.contenders:
                continue
            for pass_ in PASSES:
                step = make_step(f, ic, pass_, w)
                step()
                with prof(activities=[ProfilerActivity.CPU]) as p:
                    step()
                # only leaf events: an op whose children ran the kernels is not counted twice
                leaves = [
                    e for e in p.events() if not any(c.name.startswith("aten::") for c in e.cpu_children)
                ]
                total, counts = kernel_count(_Averaged(leaves))
                print(
                    f"PROFILE {name:24s} {k:7s} {pass_:9s} kernels {total:6d}"
                    f"  per level {total / max(depth, 1):6.1f} (depth {depth})"
                )
                if args.profile_top:
                    top = sorted(counts.items(), key=lambda kv: -kv[1])[: args.profile_top]
                    print("    " + ", ".join(f"{n}:{c}" for n, c in top))


class _Averaged(list):
    """Events as (key, count) pairs, like key_averages() but over the given events."""

    def __init__(self, events) -> None:
        agg: dict[str, int] = {}
        for e in events:
            agg[e.name] = agg.get(e.name, 0) + 1
        super().__init__(type("E", (), {"key": k, "count": c})() for k, c in agg.items())


def crossover(args: argparse.Namespace) -> None:
    """levels vs scan on shallow tables over batch sizes, with the engine ``auto`` picks today."""
    from batched_nerf.engines.dispatch import auto_method

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    tables = [("alanine_dipeptide", bn.data.load("alanine_dipeptide").table)]
    tables += [(f"chain{n}", bn.ConstructionTable.chain(n)) for n in (8, 16, 32, 64)]
    print("table               depth     B  pass      levels ms   scan ms  scan/levels  auto")
    for name, table in tables:
        for batch in args.batches:
            ic = inputs(table, batch)
            w = torch.randn(batch, table.n_atoms, 3)
            cons = {k: v for k, v in contenders(table, None).items() if k in ("levels", "scan")}
            for pass_ in ("forward", "fwd+bwd"):
                steps = {k: make_step(f, ic, pass_, w) for k, f in cons.items()}
                for step in steps.values():
                    step()
                times: dict[str, list[float]] = {k: [] for k in steps}
                for _ in range(args.repeats):
                    for k, step in steps.items():
                        t0 = clock()
                        step()
                        times[k].append(clock() - t0)
                med = {k: statistics.median(v) for k, v in times.items()}
                auto = auto_method(table, batch, "cpu")
                print(
                    f"{name:18s} {table.depth:5d} {batch:5d}  {pass_:8s} {1e3 * med['levels']:9.3f} "
                    f"{1e3 * med['scan']:9.3f} {med['scan'] / med['levels']:11.2f}  {auto}",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workloads", nargs="+", default=["alanine_dipeptidex4096", "chain64x64", "chain64x1024"]
    )
    parser.add_argument("--contenders", nargs="+", default=["loop", "levels", "base"])
    parser.add_argument("--baseline", default=None, help="directory holding another batched_nerf package")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--stat", choices=("median", "min"), default="median", help="min is robust on a shared machine"
    )
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--crossover", action="store_true", help="levels vs scan on shallow tables")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64, 256, 1024, 4096])
    parser.add_argument("--profile-top", type=int, default=0)
    args = parser.parse_args()
    if args.crossover:
        crossover(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
