"""Measurement records of one run, and the rules that skip a row before it is timed."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.timing import fmt_seconds

#: Our engines timed on every row (``method=`` of :func:`batched_nerf.to_cartesian`); a run can
#: time more (``run_benchmarks(engines=...)``, ``benchmarks/run.py --engines``).
ENGINES = ("levels", "scan", "auto")
#: Our compiled contender: ``torch.compile(fullgraph=True)`` of ``method="scan"``.
COMPILED = "compiled (auto)"
LOOP = "torch-loop"
#: The committor pass may take this many times the per-step limit (its column is filled where it can be).
COMMITTOR_LIMIT_FACTOR = 2.0
#: Memory budget for one step: half of a 24 GB machine.
MEMORY_BUDGET_BYTES = 12 * 2**30
#: Rough peak bytes per (atom x batch element) of one step, used only to skip
#: rows that would not fit; measured values are in ``results.json["memory"]``.
BYTES_PER_ATOM = {"forward": 400.0, "forward_backward": 2000.0, "committor": 6000.0}


@dataclass
class Timing:
    """One (workload, size, batch, method, pass) measurement or the reason it is absent."""

    workload: str
    n_atoms: int
    batch: int
    method: str
    kind: str  # "ours" | "peer"
    pass_: str
    status: str = "ok"  # "ok", "skipped: ...", "failed: ...", "n/a: ..."
    median_s: float | None = None
    runs: int = 0
    extrapolated: bool = False  # batch B = B x the B=1 time (peers without batching)
    compile_s: float | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.median_s is not None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Timing:
        d = dict(d)
        d["pass_"] = d.pop("pass")
        return cls(**d)


@dataclass
class State:
    """Settings and results of one run."""

    quick: bool
    device: str
    repeats: int
    budget_s: float  # per measurement
    step_limit_s: float  # rows predicted slower than this per step are skipped
    deadline: float  # time.perf_counter() after which rows are skipped
    engines: tuple[str, ...] = ENGINES
    timings: list[Timing] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    isolate_compile: bool = True  # compiled rows run in a subprocess
    emit: bool = False  # child process: print each record as a JSON line

    # ---------------------------------------------------------------- look-ups
    def get(self, workload: str, n: int, batch: int, method: str, pass_: str) -> Timing | None:
        """The record of one row, method and pass (None if never attempted)."""
        for t in self.timings:
            if (t.workload, t.n_atoms, t.batch, t.method, t.pass_) == (workload, n, batch, method, pass_):
                return t
        return None

    def find(self, workload: str, method: str, pass_: str) -> list[Timing]:
        """Every successful record of a workload, method and pass (all sizes and batches)."""
        return [
            t
            for t in self.timings
            if t.workload == workload and t.method == method and t.pass_ == pass_ and t.status == "ok"
        ]

    def best(self, workload: str, n: int, batch: int, pass_: str, methods: list[str]) -> Timing | None:
        """The fastest successful record among ``methods`` on one row and pass."""
        cands = [self.get(workload, n, batch, m, pass_) for m in methods]
        ok = [t for t in cands if t is not None and t.ok]
        return min(ok, key=lambda t: t.median_s or math.inf) if ok else None

    def best_ours(self, workload: str, n: int, batch: int, pass_: str) -> Timing | None:
        """Our fastest eager engine on one row and pass."""
        return self.best(workload, n, batch, pass_, list(self.engines))

    def rows(self) -> list[tuple[str, int, int]]:
        """``(workload, N, B)`` of every row timed so far, in order."""
        return list(dict.fromkeys((t.workload, t.n_atoms, t.batch) for t in self.timings))

    # ---------------------------------------------------------------- skip rules
    def predict(self, workload: str, n: int, batch: int, method: str, pass_: str) -> float | None:
        """Seconds per step expected for a row (None: nothing to go by).

        The committor pass: this row's forward+backward time times the
        committor/forward+backward ratio of the largest smaller row already
        measured.  Otherwise: the largest smaller row's time, scaled linearly in
        atoms x batch (pessimistic for batched engines).
        """
        prev = self._largest_smaller(workload, n, batch, method, pass_)
        if pass_ == "committor" and prev is not None:
            fb_now = self.get(workload, n, batch, method, "forward_backward")
            fb_prev = self.get(workload, prev.n_atoms, prev.batch, method, "forward_backward")
            if fb_now and fb_prev and fb_now.ok and fb_prev.ok and fb_prev.median_s:
                return (fb_now.median_s or 0.0) * (prev.median_s or 0.0) / fb_prev.median_s
        if prev is None or prev.median_s is None:
            return None
        return prev.median_s * (n * max(batch, 1)) / (prev.n_atoms * max(prev.batch, 1))

    def _largest_smaller(self, workload: str, n: int, batch: int, method: str, pass_: str) -> Timing | None:
        best: Timing | None = None
        for t in self.find(workload, method, pass_):
            if t.n_atoms <= n and t.batch <= batch and t.median_s is not None and not t.extrapolated:
                if best is None or t.n_atoms * t.batch > best.n_atoms * best.batch:
                    best = t
        return best

    def skip_reason(self, workload: str, n: int, batch: int, method: str, pass_: str) -> str | None:
        """Why a row should not be timed (memory estimate, run-time budget, predicted time), or None."""
        est_bytes = BYTES_PER_ATOM[pass_] * n * batch
        if method in (*self.engines, COMPILED) and pass_ != "forward":
            est_bytes *= 1.0 + math.log2(max(n, 2)) / 12.0
        if est_bytes > MEMORY_BUDGET_BYTES:
            return (
                f"skipped: memory (est. {est_bytes / 2**30:.0f} GB > "
                f"{MEMORY_BUDGET_BYTES / 2**30:.0f} GB budget of a 24 GB machine)"
            )
        if time.perf_counter() > self.deadline:
            return "skipped: run-time budget of the suite used up"
        est = self.predict(workload, n, batch, method, pass_)
        limit_s = self.step_limit_s * (COMMITTOR_LIMIT_FACTOR if pass_ == "committor" else 1.0)
        if est is not None and est > limit_s:
            limit = fmt_seconds(limit_s)
            return f"skipped: too long (est. {fmt_seconds(est)} per step > {limit} limit)"
        return None
