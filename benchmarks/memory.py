"""Peak memory of one forward+backward, for every timed row, measured in a worker subprocess.

Each (row, method) runs in a fresh worker process (``python -m
benchmarks.memory``, specs as JSON on stdin, one JSON line out per spec): a
process that measured a row before keeps freed memory and under-reports the
next.  On Linux the worker resets the peak resident set size
(``/proc/self/clear_refs``) just before the step and reads ``VmHWM`` after
it: the peak is the increase over the resident size just before the step.
Elsewhere it falls back to the increase of ``ru_maxrss`` (a lower bound when
the imports peaked higher: marked ``lower_bound``).  CUDA:
``torch.cuda.max_memory_allocated`` above the allocation before the step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from benchmarks.contenders import ROOT, crash_reason
from benchmarks.records import LOOP, State
from benchmarks.timing import Progress

#: Rows of the quick mode's memory part (full mode: every timed row).
QUICK_ROWS = (("alanine_dipeptide", 22, 4096), ("chain", 512, 64))


def measure_memory(
    state: State,
    refs_of: dict[tuple[str, int], Any],
    with_loop: bool,
    progress: Progress,
    rows: list[tuple[str, int, int]] | None,
    budget_s: float,
) -> list[dict[str, Any]]:
    """One entry per (row, method): ``peak_bytes`` and ``bytes_per_atom``, or ``status`` saying why not.

    ``rows``: the rows to measure (None: every timed row in full mode, :data:`QUICK_ROWS` in quick
    mode); ``refs_of[(workload, N)]``: the construction table of each workload.
    """
    methods = [*state.engines, *([LOOP] if with_loop else [])]
    wanted = rows if rows is not None else (list(QUICK_ROWS) if state.quick else None)
    entries: list[dict[str, Any]] = []
    specs: list[dict[str, Any]] = []
    for wl, n, batch in _target_rows_first(state.rows()):
        for method in methods:
            entry: dict[str, Any] = {"workload": wl, "n_atoms": n, "batch": batch, "method": method}
            fb = state.get(wl, n, batch, method, "forward_backward")
            if wanted is not None and (wl, n, batch) not in wanted:
                where = ", ".join(f"{w} N={k} B={b}" for w, k, b in wanted)
                entry["status"] = f"skipped: this run measures memory on {where} only (full mode: every row)"
            elif fb is None or not fb.ok:
                entry["status"] = "skipped: no forward+backward timing for this row (skipped or failed)"
            elif (fb.median_s or 0.0) > state.step_limit_s:
                entry["status"] = "skipped: too long"
            else:
                specs.append({**entry, "refs": refs_of[(wl, n)].tolist(), "device": state.device})
            entries.append(entry)
    results = _run_workers(specs, time.perf_counter() + budget_s, progress)
    for entry in entries:
        entry.update(results.get(_key(entry), {}))
        if "status" not in entry:
            entry["status"] = "skipped: memory-measurement budget used up"
    return entries


def _target_rows_first(rows: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    return sorted(rows, key=lambda r: not (r[1] >= 22 and r[2] >= 64))


def _key(entry: dict[str, Any]) -> tuple[str, int, int, str]:
    return (entry["workload"], entry["n_atoms"], entry["batch"], entry["method"])


def _run_workers(specs: list[dict[str, Any]], deadline: float, progress: Progress) -> dict[tuple, dict]:
    """Each spec in a fresh worker process (one process measuring several rows reuses freed memory)."""
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    results: dict[tuple, dict] = {}
    for spec in specs:
        if time.perf_counter() > deadline:
            break
        try:
            res = subprocess.run(
                [sys.executable, "-m", "benchmarks.memory"],
                input=json.dumps([spec]),
                capture_output=True,
                text=True,
                env=env,
                timeout=max(1.0, deadline - time.perf_counter()),
            )
        except subprocess.TimeoutExpired:
            break  # budget used up; this row and the rest are reported as skipped
        lines = res.stdout.strip().splitlines()
        if res.returncode == 0 and lines:
            results[_key(spec)] = json.loads(lines[-1])
        else:
            results[_key(spec)] = {"status": f"failed: {crash_reason(res.returncode, res.stderr)}"}
        progress.update("memory {workload} N={n_atoms} B={batch} {method}".format(**spec))
    return results


# --------------------------------------------------------------------------
# The worker
# --------------------------------------------------------------------------


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _measure_one(spec: dict[str, Any]) -> dict[str, Any]:
    import resource

    import numpy as np
    import torch

    import batched_nerf as bn
    from benchmarks import contenders, timing, workloads

    n, batch, dev = spec["n_atoms"], spec["batch"], spec["device"]
    refs = np.asarray(spec["refs"], dtype=np.int64)
    b, a, d = (t.clone().requires_grad_(True) for t in workloads.make_inputs(n, batch, torch.float32, 0, dev))
    w = timing.cotangent(batch, n, torch.float32, dev)
    if spec["method"] == LOOP:
        from benchmarks import peers

        fn = contenders.loop_build(peers, refs)
    else:
        fn = contenders.bind(bn.ConstructionTable(refs).prepare(dev), spec["method"])
    out: dict[str, Any] = {"status": "ok"}
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    elif _reset_peak():
        base = _rss_bytes("VmRSS")
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out["lower_bound"] = True
    t0 = time.perf_counter()
    (fn(b, a, d) * w).sum().backward()
    timing.sync(dev)
    if dev.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() - base
    elif "lower_bound" not in out:
        peak = _rss_bytes("VmHWM") - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    out.update(peak_bytes=peak, bytes_per_atom=peak / (n * batch), seconds=time.perf_counter() - t0)
    return out


def _worker() -> None:
    for spec in json.loads(sys.stdin.read()):
        print(json.dumps(_measure_one(spec)), flush=True)


if __name__ == "__main__":
    _worker()
