"""The whole run: :func:`run_benchmarks`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks import accuracy, contenders, fused_rows, report, summary
from benchmarks.memory import measure_memory
from benchmarks.records import COMPILED, ENGINES, LOOP, MEMORY_BUDGET_BYTES, State
from benchmarks.timing import PASSES, Progress
from benchmarks.workloads import Workload, chain_refs, compile_rows, default_grid
from benchmarks.workloads import fused_rows as fused_grid

#: Peers of the quick mode (NeRFax's fastest mode when ``nerfax`` is given); full mode runs them all.
QUICK_PEERS = (LOOP, "nerfax-fully_sequential")


def run_benchmarks(
    quick: bool = True,
    out_dir: str | None = None,
    nerfax: str | None = None,
    bgflow: str | None = None,
    peers: bool = True,
    compile: bool | None = None,
    progress: bool = True,
    *,
    device: str = "cpu",
    repeats: int | None = None,
    sizes: list[int] | None = None,
    batches: list[int] | None = None,
    time_budget_s: float | None = None,
    memory: bool = True,
    workloads: list[str] | None = None,
    errors: bool = True,
    engines: tuple[str, ...] = ENGINES,
    fused: bool | None = None,
) -> str:
    """Run the benchmark suite and return its results as a Markdown report.

    Times forward, forward+backward (``(x * w).sum().backward()`` for a fixed
    random ``w``) and a committor pass (``q`` = a fixed tiny MLP on
    :func:`batched_nerf.to_internal` features; ``g = dq/dx`` with
    ``create_graph=True``; ``(g**2).sum().backward()``) of our engines
    (``engines``, and ``scan`` under ``torch.compile(fullgraph=True)`` on a few
    rows), of the per-atom torch loop on every row and of the other peers of
    :mod:`benchmarks.peers` on linear chains; chains, random trees, a
    protein-like backbone and alanine dipeptide in one run.  Also: the
    headline table (ours vs loop, NeRFax, chemcoord, with the issue 11
    targets), speed-ups vs each peer, float32 error vs a float64 reference
    loop (with an error-vs-length curve) and peak memory of forward+backward
    for every timed row.  Rows that would exceed a 12 GB memory estimate, a
    per-step time limit or the run-time budget are reported as ``"skipped: why"``.

    Args:
        quick: small grid (chains N 64/512/4096 and branched molecules, batch
            1/64; peers: the torch loop, and NeRFax's fully sequential mode when
            ``nerfax`` is given; no compile unless asked; memory on two rows),
            about 1-2 minutes on 2 CPU cores. ``False``: the whole
            grid, all peers, compile, memory on every row, about 30-40 minutes.
        out_dir: when given, writes ``results.md``, ``results.json`` (all raw
            numbers and machine information), ``time_vs_atoms.png`` and
            ``error_vs_atoms.png`` there; created if missing.
        nerfax: path of a NeRFax checkout.
        bgflow: path of a bgflow checkout (full mode only).
        peers: compare with the peers of :mod:`benchmarks.peers`.
        compile: time ``scan`` under ``torch.compile`` on a few rows (compile
            time reported separately). ``None``: on in full mode, off in quick.
        progress: show a progress bar (tqdm if installed, else a counter on stderr).
        device: ``"cpu"`` or ``"cuda"`` (timed with ``torch.cuda.synchronize``;
            peers always run on the CPU).
        repeats: timed runs per measurement after one warm-up (default 3 quick, 5 full).
        sizes: time only linear chains of these sizes (no branched workloads;
            error curve over these sizes; memory on the first row); for small test runs.
        batches: batch sizes of every workload (replacing the defaults).
        time_budget_s: wall-clock budget of the timing part; later rows are
            skipped with a note (default 150 s quick, 1800 s full).
        memory: measure peak memory of forward+backward (in a worker process).
        workloads: time only these workloads (``"chain"``, ``"tree"``,
            ``"protein"``, ``"alanine_dipeptide"``).
        errors: measure the float32 error (and error-vs-length curve).
        engines: our ``method=`` names to time (default ``("levels", "scan", "auto")``;
            add any other engine the package offers).
        fused: time the fused rows (:mod:`benchmarks.fused_rows`: fused engines, torch
            engines, the per-atom loop and the numba floor, interleaved; CPU only).
            ``None``: on for CPU runs without ``sizes``.

    Returns:
        The Markdown report (also ``results.md`` when ``out_dir`` is given).

    Raises:
        ValueError: unknown ``device``, or no engine to time.
    """
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if not engines:
        raise ValueError("engines must name at least one method of ours, e.g. ('levels', 'scan', 'auto')")
    t_start = time.perf_counter()
    budget = time_budget_s if time_budget_s is not None else (150.0 if quick else 1800.0)
    state = State(
        quick=quick,
        device=device,
        repeats=repeats or (3 if quick else 5),
        budget_s=2.0 if quick else 6.0,
        step_limit_s=1.5 if quick else 12.0,
        deadline=t_start + budget,
        engines=tuple(engines),
    )
    machine = summary.machine(device)
    grid = _grid(quick, sizes, batches, workloads)
    peers_mod, peers_list = _select_peers(state, peers, quick, nerfax, bgflow)
    rows_c = _compiled_rows(state, quick, (not quick) if compile is None else bool(compile))
    n_err = 0 if not errors else len(sizes) if sizes is not None else (3 if quick else 6)
    with_fused = (sizes is None and device == "cpu") if fused is None else bool(fused)
    f_rows = fused_grid(quick) if with_fused else []
    n_fused = fused_rows.count_steps(f_rows)
    bar = Progress(_count_steps(state, grid, peers_list, rows_c) + n_err + n_fused, progress)
    fused_recs: list[dict[str, Any]] = []
    try:
        _time_grid(state, grid, peers_mod, peers_list, rows_c, bar)
        if f_rows:
            fused_recs = fused_rows.time_fused_rows(
                f_rows, state.repeats, state.budget_s, state.step_limit_s, progress=bar
            )
        err = _errors(state, peers_mod, peers_list, bar, sizes) if errors else accuracy.not_measured()
        mem = _memory(state, grid, peers_list, bar, sizes is not None) if memory else []
    finally:
        bar.close()
    machine["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    machine["wall_s"] = time.perf_counter() - t_start
    summary.add_peer_versions(machine)
    machine["peers"] = [p.name for p in peers_list]
    speedups = summary.speedups(state)
    headline = summary.headline(state, mem)
    targets = summary.targets(headline, mem)
    text = report.markdown(state, machine, err, mem, speedups, headline, targets)
    if fused_recs:
        text += "\n" + "\n".join(fused_rows.markdown(fused_recs)) + "\n"
    if out_dir is None:
        return text
    payload = {
        "machine": machine,
        "config": _config(state, grid, rows_c, budget, nerfax, bgflow),
        "timings": [t.as_dict() for t in state.timings],
        "headline": headline,
        "speedups": speedups,
        "errors": err,
        "memory": mem,
        "targets": targets,
        "notes": state.notes,
        "fused_rows": fused_recs,
    }
    return report.write(Path(out_dir), text, payload, state, err)


def _config(
    state: State,
    grid: list[Workload],
    rows_c: set[tuple[str, int, int]],
    budget: float,
    nerfax: str | None,
    bgflow: str | None,
) -> dict[str, Any]:
    """The settings of the run, for ``results.json``."""
    return {
        "quick": state.quick,
        "device": state.device,
        "repeats": state.repeats,
        "measure_budget_s": state.budget_s,
        "step_limit_s": state.step_limit_s,
        "time_budget_s": budget,
        "memory_budget_bytes": MEMORY_BUDGET_BYTES,
        "engines": list(state.engines),
        "compile": bool(rows_c),
        "compile_rows": sorted(rows_c),
        "nerfax": nerfax,
        "bgflow": bgflow,
        "dtype": "float32",
        "workloads": [{"name": w.name, "n_atoms": w.n_atoms, "batches": w.batches} for w in grid],
    }


def _errors(
    state: State, peers_mod: ModuleType | None, peers_list: list[Any], bar: Progress, sizes: list[int] | None
) -> dict[str, Any]:
    """The float32 error part (one minute quick, five full), with the reference check against the loop."""
    deadline = time.perf_counter() + (60.0 if state.quick else 300.0)
    err = accuracy.errors(state.quick, state.device, peers_list, deadline, bar, sizes)
    if peers_mod is not None:
        err["reference_check"] = accuracy.reference_check(peers_mod)
    return err


def _memory(
    state: State, grid: list[Workload], peers_list: list[Any], bar: Progress, small: bool
) -> list[dict[str, Any]]:
    """The memory part (one minute quick, ten full); a ``sizes=`` run measures its first row only."""
    rows = [(grid[0].name, grid[0].n_atoms, grid[0].batches[-1])] if small and grid else None
    refs_of = {(w.name, w.n_atoms): w.refs for w in grid}
    with_loop = any(p.name == LOOP for p in peers_list)
    return measure_memory(state, refs_of, with_loop, bar, rows, 60.0 if state.quick else 600.0)


def _grid(
    quick: bool, sizes: list[int] | None, batches: list[int] | None, workloads: list[str] | None
) -> list[Workload]:
    if sizes is None:
        grid = default_grid(quick)
    else:
        grid = [Workload("chain", chain_refs(n), [1, 64]) for n in sizes]
    if workloads is not None:
        grid = [w for w in grid if w.name in workloads]
    if batches is not None:
        for w in grid:
            w.batches = list(batches)
    return grid


def _select_peers(
    state: State, peers: bool, quick: bool, nerfax: str | None, bgflow: str | None
) -> tuple[ModuleType | None, list[Any]]:
    """The peers module and the available peers of this run (the others noted with the reason)."""
    if not peers:
        state.notes.append("peers disabled (peers=False)")
        return None, []
    from benchmarks import peers as peers_mod

    chosen = []
    for p in peers_mod.get_peers(nerfax_path=nerfax, bgflow_path=bgflow):
        if quick and p.name not in QUICK_PEERS:
            continue
        if p.name.startswith("nerfax") and not nerfax:
            state.notes.append(f"{p.name}: skipped, no --nerfax PATH given")
        elif p.name == "bgflow" and not bgflow:
            state.notes.append("bgflow: skipped, no --bgflow PATH given")
        elif not p.available:
            state.notes.append(f"{p.name}: {p.reason}")
        else:
            chosen.append(p)
    if quick:
        state.notes.append(
            f"quick mode: the peers are {' and '.join(QUICK_PEERS)} (with --nerfax); full mode runs them all"
        )
    if state.device != "cpu" and chosen:
        state.notes.append("peers run on the CPU even with device=cuda")
    return peers_mod, chosen


def _compiled_rows(state: State, quick: bool, compile_: bool) -> set[tuple[str, int, int]]:
    if not compile_:
        return set()
    rows = compile_rows(quick)
    state.notes.append(
        "torch.compile(fullgraph=True) of scan is timed only on rows "
        + ", ".join(f"{w} N={n} B={b}" for w, n, b in sorted(rows))
        + " (each compile costs tens of seconds)"
    )
    return rows


def _methods(state: State, wl: Workload, batch: int, rows_c: set[tuple[str, int, int]]) -> list[str]:
    return [*state.engines, *([COMPILED] if (wl.name, wl.n_atoms, batch) in rows_c else [])]


def _count_steps(
    state: State, grid: list[Workload], peers_list: list[Any], rows_c: set[tuple[str, int, int]]
) -> int:
    """Progress-bar steps of the timing part."""
    has_loop = any(p.name == LOOP for p in peers_list)
    chain_peers = sum(p.name != LOOP for p in peers_list)
    total = 0
    for wl in grid:
        for batch in wl.batches:
            total += (len(_methods(state, wl, batch, rows_c)) + has_loop) * len(PASSES)
            total += chain_peers if wl.name == "chain" else 0
    return total


def _time_grid(
    state: State,
    grid: list[Workload],
    peers_mod: ModuleType | None,
    peers_list: list[Any],
    rows_c: set[tuple[str, int, int]],
    bar: Progress,
) -> None:
    """Every row: our engines, the per-atom loop (any topology), the other peers (chains)."""
    has_loop = peers_mod is not None and any(p.name == LOOP for p in peers_list)
    chain_peers = [p for p in peers_list if p.name != LOOP]
    for wl in grid:
        for batch in wl.batches:
            contenders.time_ours(state, wl, batch, _methods(state, wl, batch, rows_c), bar)
            if has_loop:
                contenders.time_torch_loop(state, peers_mod, wl, batch, bar)  # type: ignore[arg-type]
            if wl.name == "chain":
                for peer in chain_peers:
                    contenders.time_peer_chain(state, peer, wl.n_atoms, batch, bar)
