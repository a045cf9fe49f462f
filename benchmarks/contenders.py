"""Timing of the contenders on one row: our engines (eager and compiled), the per-atom loop, the peers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import batched_nerf as bn
from benchmarks.records import COMPILED, LOOP, State, Timing
from benchmarks.timing import (
    PASS_LABEL,
    PASSES,
    Build,
    Committor,
    Progress,
    cotangent,
    make_step,
    measure,
    short_error,
    sync,
)
from benchmarks.workloads import Workload, in_build_order, make_inputs

ROOT = Path(__file__).resolve().parent.parent
#: Seconds a compiled row's subprocess may take (compile and timing, all passes).
COMPILE_TIMEOUT_S = 300


def bind(table: bn.ConstructionTable, method: str) -> Build:
    """``(bonds, angles, dihedrals) -> xyz`` with our engine ``method``."""

    def fn(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return bn.to_cartesian(b, a, d, table, method=method)  # type: ignore[arg-type]

    return fn


def compiled(table: bn.ConstructionTable) -> Build:
    """``bn.compile_builder(table, method="auto")`` (``fullgraph=True``), compiled afresh."""
    torch._dynamo.reset()  # fresh compile per row (and no recompile-limit fallback)
    return bn.compile_builder(table, method="auto")


def time_passes(
    state: State,
    wl: Workload,
    batch: int,
    method: str,
    kind: str,
    build: Build,
    q: Committor,
    progress: Progress,
    passes: tuple[str, ...] = PASSES,
) -> None:
    """Time ``build`` for each pass on one row and append a :class:`Timing` per pass.

    The first call of a compiled build is timed apart as its compile time.
    """
    dev, n = state.device, wl.n_atoms
    ic = make_inputs(n, batch, torch.float32, 0, dev)
    w = cotangent(batch, n, torch.float32, dev)
    for pass_ in passes:
        rec = Timing(wl.name, n, batch, method, kind, pass_)
        if state.emit:
            print(json.dumps({"start": pass_}), flush=True)
        reason = state.skip_reason(wl.name, n, batch, method, pass_)
        if reason:
            rec.status = reason
        else:
            try:
                step = make_step(build, ic, pass_, w, q)
                if method == COMPILED:  # first call compiles; report it separately
                    t0 = time.perf_counter()
                    step()
                    sync(dev)
                    rec.compile_s = time.perf_counter() - t0
                rec.median_s, rec.runs = measure(step, state.repeats, state.budget_s, dev)
            except Exception as exc:  # record and keep going
                rec.status = short_error(exc)
        state.timings.append(rec)
        if state.emit:
            print(json.dumps(rec.as_dict()), flush=True)
        progress.update(f"{wl.name} N={n} B={batch} {method} {PASS_LABEL[pass_]}")


def time_ours(state: State, wl: Workload, batch: int, methods: list[str], progress: Progress) -> None:
    """Our engines (``state.engines``, and :data:`COMPILED` when listed) on one row."""
    table = bn.ConstructionTable(wl.refs)
    if state.device != "cpu":
        table.prepare(state.device)
    q = Committor(table).to(state.device)
    for method in methods:
        if method == COMPILED and state.isolate_compile:
            time_compiled_isolated(state, wl, batch, progress)
        else:
            build = compiled(table) if method == COMPILED else bind(table, method)
            time_passes(state, wl, batch, method, "ours", build, q, progress)


# --------------------------------------------------------------------------
# Compiled rows, each in a fresh subprocess
# --------------------------------------------------------------------------

_COMPILE_CHILD = r"""
import json, sys
spec = json.loads(sys.stdin.read())
sys.path[:0] = spec["path"]
import numpy as np
import batched_nerf as bn
from benchmarks import contenders, records, timing, workloads
state = records.State(quick=False, device=spec["device"], repeats=spec["repeats"], budget_s=spec["budget_s"],
                      step_limit_s=float("inf"), deadline=float("inf"), isolate_compile=False, emit=True)
wl = workloads.Workload(spec["workload"], np.asarray(spec["refs"], dtype=np.int64), [spec["batch"]])
table = bn.ConstructionTable(wl.refs).prepare(spec["device"])
q = timing.Committor(table).to(spec["device"])
contenders.time_passes(state, wl, spec["batch"], records.COMPILED, "ours", contenders.compiled(table), q,
                       timing.Progress(0, False), passes=tuple(spec["passes"]))
"""


def time_compiled_isolated(state: State, wl: Workload, batch: int, progress: Progress) -> None:
    """Compiled rows in a fresh subprocess, so that a crash in generated code
    (segfault) is recorded as a failure instead of ending the suite."""
    n = wl.n_atoms
    recs: dict[str, Timing] = {}
    todo: list[str] = []
    for pass_ in PASSES:
        reason = state.skip_reason(wl.name, n, batch, COMPILED, pass_)
        if reason:
            recs[pass_] = Timing(wl.name, n, batch, COMPILED, "ours", pass_, status=reason)
        else:
            todo.append(pass_)
    if todo:
        spec = {
            "path": [str(ROOT)],
            "device": state.device,
            "repeats": state.repeats,
            "budget_s": state.budget_s,
            "workload": wl.name,
            "refs": wl.refs.tolist(),
            "batch": batch,
            "passes": todo,
        }
        recs.update(_run_compile_child(spec, wl, batch))
    for pass_ in PASSES:
        state.timings.append(recs[pass_])
        progress.update(f"{wl.name} N={n} B={batch} {COMPILED} {PASS_LABEL[pass_]}")


def _run_compile_child(spec: dict[str, Any], wl: Workload, batch: int) -> dict[str, Timing]:
    """The records the child printed; passes it did not reach get the reason it died."""
    todo: list[str] = spec["passes"]
    current = todo[0]
    try:
        res = subprocess.run(
            [sys.executable, "-c", _COMPILE_CHILD],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        stdout, stderr, rc = res.stdout, res.stderr, res.returncode
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr, rc = f"compile+timing subprocess timed out after {COMPILE_TIMEOUT_S} s", None
    recs: dict[str, Timing] = {}
    for line in stdout.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if "start" in obj:
            current = obj["start"]
        elif "pass" in obj:
            rec = Timing.from_dict(obj)
            recs[rec.pass_] = rec
    if rc != 0:
        why = crash_reason(rc, stderr)
        for pass_ in todo:
            if pass_ not in recs:
                status = f"failed: {why}" if pass_ == current else f"skipped: subprocess died in {current}"
                recs[pass_] = Timing(wl.name, wl.n_atoms, batch, COMPILED, "ours", pass_, status=status)
    return recs


def crash_reason(rc: int | None, stderr: str) -> str:
    """A short reason for a dead subprocess: the signal or exit code and the telling stderr line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    telling = ("corruption", "corrupted", "double free", "Error")
    hint = next((ln for ln in lines if any(word in ln for word in telling)), lines[-1] if lines else "")
    if rc is None:
        return hint
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = str(-rc)
        return f"process killed by {name} ({hint[:120]})"
    return f"exit code {rc} ({hint[:120]})"


# --------------------------------------------------------------------------
# The per-atom loop and the peers
# --------------------------------------------------------------------------


def loop_build(peers: ModuleType, refs: Any) -> Build:
    """The per-atom torch loop of :mod:`benchmarks.peers` on any topology (rows put in build order)."""
    ordered, _ = in_build_order(refs)
    refs_t = torch.from_numpy(ordered)

    def build(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return peers.loop_build(b, a, d, refs_t)

    return build


def time_torch_loop(state: State, peers: ModuleType, wl: Workload, batch: int, progress: Progress) -> None:
    """The per-atom loop on one row, all three passes (the committor reads our table of the same rows)."""
    ordered, _ = in_build_order(wl.refs)
    q = Committor(bn.ConstructionTable(ordered)).to(state.device)
    time_passes(state, wl, batch, LOOP, "peer", loop_build(peers, wl.refs), q, progress)


def time_peer_chain(state: State, peer: Any, n: int, batch: int, progress: Progress) -> None:
    """A peer adapter on the linear chain (its own setup; extrapolates unbatched peers)."""
    if peer.loops_over_batch and batch > 1:
        state.timings.extend(_extrapolated(state, peer.name, n, batch))
    else:
        state.timings.extend(_timed_peer(state, peer, n, batch))
    progress.update(f"chain N={n} B={batch} {peer.name}")


def _extrapolated(state: State, name: str, n: int, batch: int) -> list[Timing]:
    """B x the B = 1 time of a peer without batching (or why there is none)."""
    out = []
    for pass_ in ("forward", "forward_backward", "forward_numba"):
        single = state.get("chain", n, 1, name, pass_)
        rec = Timing("chain", n, batch, name, "peer", pass_, extrapolated=True)
        if single is not None and single.ok:
            rec.median_s = (single.median_s or 0.0) * batch
            rec.note = f"= {batch} x the B=1 time (no batching in {name})"
        elif pass_ == "forward_numba":
            continue
        else:
            rec.status = single.status if single is not None else "skipped: no B=1 time"
            rec.extrapolated = False
        out.append(rec)
    return out


def _timed_peer(state: State, peer: Any, n: int, batch: int) -> list[Timing]:
    passes = ("forward", "forward_backward")
    reasons = {p: state.skip_reason("chain", n, batch, peer.name, p) for p in passes}
    if all(reasons.values()):
        return [Timing("chain", n, batch, peer.name, "peer", p, status=str(reasons[p])) for p in passes]
    recs: dict[str, Timing] = {}
    try:
        peer.info = {}
        steps = peer.setup(n, batch, torch.float32, 0, "linear")
        for key, step in steps.items():
            rec = Timing("chain", n, batch, peer.name, "peer", key)
            if reasons.get(key):
                rec.status = str(reasons[key])
            else:
                try:
                    rec.median_s, rec.runs = measure(step, state.repeats, state.budget_s, "cpu")
                except Exception as exc:
                    rec.status = short_error(exc)
            compile_s = peer.info.get(f"compile_{key}_s")
            rec.compile_s = compile_s if isinstance(compile_s, float) else None
            recs[key] = rec
        for key, why in peer.skipped.items():
            recs[key] = Timing("chain", n, batch, peer.name, "peer", key, status=f"n/a: {why}")
    except Exception as exc:
        for p in passes:
            recs[p] = Timing("chain", n, batch, peer.name, "peer", p, status=short_error(exc))
    for p in passes:
        recs.setdefault(
            p, Timing("chain", n, batch, peer.name, "peer", p, status="n/a: not offered by the adapter")
        )
    return list(recs.values())
