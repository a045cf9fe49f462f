"""Fused rows: the fused engines next to the torch engines, the per-atom loop and the numba floor.

Both maps on the rows of :func:`benchmarks.workloads.fused_rows`:

* inverse (``to_internal``): ``fused`` and ``torch`` (``method=``) and the floor
  probe (forward only), passes ``forward``, ``forward_backward``
  (``(ic . w).sum().backward()``), ``committor`` (``q`` reads the internal
  coordinates; ``g = dq/dx`` with ``create_graph=True``; ``(g**2).sum().backward()``)
  and ``flow`` (``to_internal`` + :func:`batched_nerf.log_det_jacobian`, a prior on
  the internal coordinates, backward);
* forward map (``to_cartesian``): ``fused`` (where this build offers it), the torch
  engines ``scan`` and ``levels``, the per-atom torch loop and the floor probe
  (forward only), passes ``forward``,
  ``forward_backward`` and ``committor`` of :func:`benchmarks.timing.make_step`
  (the committor network reads ``to_internal``: ``auto`` for our engines, the torch
  inverse, a gather and the atan2 formulas, for the per-atom loop's user).

numba kernels and torch share the cores, so the contenders of one pass run in
interleaved rounds (each torch step right after a kernel step) and each gets the
median of its rounds; a step under 50 ms is timed right after an untimed call of
itself (:func:`benchmarks.timing.warm_call`: the first torch op after other work
is slow on this machine, ``docs/repro/repro_cold_first_op.py``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import batched_nerf as bn
from benchmarks import floor
from benchmarks.timing import Committor, Progress, cotangent, fmt_seconds, make_step, short_error, warm_call
from benchmarks.workloads import Workload, in_build_order, make_inputs

INVERSE_PASSES = ("forward", "forward_backward", "committor", "flow")
CARTESIAN_PASSES = ("forward", "forward_backward", "committor")
INVERSE_METHODS = ("fused", "torch", "floor")
CARTESIAN_METHODS = ("fused", "scan", "levels", "torch-loop", "floor")
Step = Callable[[], object]


# --------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------


class InternalCommittor(torch.nn.Module):
    """:class:`benchmarks.timing.Committor` with a fixed ``to_internal`` method."""

    def __init__(self, table: bn.ConstructionTable, method: str) -> None:
        super().__init__()
        self.inner = Committor(table)
        self.method = method

    def forward(self, xyz: torch.Tensor) -> torch.Tensor:
        ic = bn.to_internal(xyz, self.inner.table, method=self.method)  # type: ignore[arg-type]
        a, d = ic.angles, ic.dihedrals
        feats = torch.stack([ic.bonds, a.sin(), a.cos(), d.sin(), d.cos()], dim=-1)
        return torch.sigmoid(self.inner.mlp(feats).mean(dim=(-2, -1)))


def inverse_step(table: bn.ConstructionTable, method: str, xyz: torch.Tensor, pass_: str) -> Step:
    """A timed step of ``pass_`` of ``to_internal(method=method)`` (``"floor"``: the probe, forward only)."""
    if method == "floor":
        if pass_ != "forward":
            raise NotImplementedError("n/a: the floor probe has no derivatives")
        probe = floor.internal(np.asarray(table.refs, dtype=np.int64))
        return lambda: probe(xyz)
    g = torch.Generator().manual_seed(1)
    w = [torch.randn(xyz.shape[:-1], generator=g) for _ in range(3)]
    leaf = xyz.clone().requires_grad_(pass_ != "forward")
    q = InternalCommittor(table, method)

    def forward() -> object:
        with torch.no_grad():
            return bn.to_internal(leaf, table, method=method)  # type: ignore[arg-type]

    def forward_backward() -> object:
        leaf.grad = None
        ic = bn.to_internal(leaf, table, method=method)  # type: ignore[arg-type]
        sum((c * wk).sum() for c, wk in zip(ic, w)).backward()
        return leaf.grad

    def committor() -> object:
        leaf.grad = None
        (gx,) = torch.autograd.grad(q(leaf).sum(), leaf, create_graph=True)
        (gx**2).sum().backward()
        return leaf.grad

    def flow() -> object:
        leaf.grad = None
        ic = bn.to_internal(leaf, table, method=method)  # type: ignore[arg-type]
        prior = 0.5 * ((ic.bonds - 1.5) ** 2).sum(-1) - ic.dihedrals.cos().sum(-1) - ic.angles.sin().sum(-1)
        (prior - bn.log_det_jacobian(*ic, table)).sum().backward()
        return leaf.grad

    steps = {"forward": forward, "forward_backward": forward_backward, "committor": committor, "flow": flow}
    return steps[pass_]


def cartesian_step(wl: Workload, table: bn.ConstructionTable, method: str, batch: int, pass_: str) -> Step:
    """One timed step of ``pass_`` of the forward map by ``method`` (ours, the loop or the floor)."""
    ordered, _ = in_build_order(wl.refs)
    ic = make_inputs(wl.n_atoms, batch, torch.float32, 0, "cpu")
    if method == "floor":
        if pass_ != "forward":
            raise NotImplementedError("n/a: the floor probe has no derivatives")
        probe = floor.cartesian(ordered)
        return lambda: probe(*ic)
    if method == "torch-loop":
        from benchmarks import peers

        refs_t = torch.from_numpy(ordered)
        q_table = bn.ConstructionTable(ordered)

        def build(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
            return peers.loop_build(b, a, d, refs_t)
    else:
        q_table = table

        def build(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
            return bn.to_cartesian(b, a, d, table, method=method)  # type: ignore[arg-type]

        try:
            build(*(t[:1] for t in ic))
        except ValueError as exc:
            if "method must be one of" in str(exc):
                raise NotImplementedError(
                    f"n/a: to_cartesian has no method={method!r} in this build"
                ) from None
            raise
    # the loop's user writes their own vectorised inverse (a gather and the atan2 formulas): the torch one
    q = InternalCommittor(q_table, "torch") if method == "torch-loop" else Committor(q_table)
    return make_step(build, ic, pass_, cotangent(batch, wl.n_atoms, torch.float32, "cpu"), q)


# --------------------------------------------------------------------------
# Interleaved timing
# --------------------------------------------------------------------------


def interleaved(steps: dict[str, Step], rounds: int, budget_s: float, limit_s: float) -> dict[str, Any]:
    """Median seconds per contender over interleaved rounds (one warm-up each; see :func:`warm_call`).

    A contender whose second warm-up still takes more than ``limit_s`` is timed
    by that run only (``runs = 1``); rounds stop after ``budget_s`` once each has 3.
    Returns ``{name: (median_s, runs) or "failed: ..."}``.
    """
    out: dict[str, Any] = {}
    times: dict[str, list[float]] = {}
    last: dict[str, float] = {}  # each live contender's latest time
    for name, step in steps.items():
        try:
            warm = 0.0
            for _ in range(2):  # a second warm-up when the first was slow (a compile, a cold cache)
                t0 = time.perf_counter()
                step()
                warm = time.perf_counter() - t0
                if warm <= limit_s:
                    break
        except Exception as exc:
            out[name] = short_error(exc)
            continue
        times[name] = [warm] if warm > limit_s else []
        if warm <= limit_s:
            last[name] = warm
    start = time.perf_counter()
    for r in range(rounds):
        for name in last:
            last[name] = warm_call(steps[name], last[name])
            times[name].append(last[name])
        if r >= 2 and time.perf_counter() - start > budget_s:
            break
    for name, ts in times.items():
        out[name] = (statistics.median(ts), len(ts))
    return out


def _time_map(
    kind: str,
    wl: Workload,
    batch: int,
    passes: tuple[str, ...],
    methods: tuple[str, ...],
    make: Any,
    cfg: dict,
) -> list[dict[str, Any]]:
    recs = []
    for pass_ in passes:
        steps, status = {}, {}
        for m in methods:
            try:
                steps[m] = make(m, pass_)
            except NotImplementedError as exc:
                status[m] = str(exc)
            except Exception as exc:
                status[m] = "skipped: " + short_error(exc).removeprefix("failed: ")
        res = interleaved(steps, cfg["rounds"], cfg["budget_s"], cfg["limit_s"])
        for m in methods:
            rec = {"map": kind, "workload": wl.name, "n_atoms": wl.n_atoms, "batch": batch, "method": m}
            rec.update({"pass": pass_, "median_s": None, "runs": 0, "status": status.get(m, "ok")})
            got = res.get(m)
            if isinstance(got, tuple):
                rec["median_s"], rec["runs"] = got
            elif got is not None:
                rec["status"] = got
            recs.append(rec)
        cfg["progress"].update(f"fused rows: {kind} {wl.name} N={wl.n_atoms} B={batch} {pass_}")
    return recs


def time_fused_rows(
    rows: list[Workload],
    rounds: int = 5,
    budget_s: float = 6.0,
    limit_s: float = 3.0,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Every fused row (CPU, float32): one record per map, row, pass and method.

    Records: ``map`` (``"inverse"`` or ``"cartesian"``), ``workload``, ``n_atoms``,
    ``batch``, ``method``, ``pass``, ``median_s``, ``runs``, ``status`` (``"ok"``,
    ``"n/a: ..."``, ``"skipped: ..."``, ``"failed: ..."``).
    """
    cfg = {
        "rounds": rounds,
        "budget_s": budget_s,
        "limit_s": limit_s,
        "progress": progress or Progress(0, False),
    }
    if not floor.available():
        return [{"map": "all", "status": "skipped: numba is not installed (fused rows and floor probes)"}]
    recs: list[dict[str, Any]] = []
    for wl in rows:
        table = bn.ConstructionTable(wl.refs)
        for batch in wl.batches:
            xyz = bn.to_cartesian(*make_inputs(wl.n_atoms, batch, torch.float64, 0, "cpu"), table).float()

            def inv(m: str, p: str, table: bn.ConstructionTable = table, xyz: torch.Tensor = xyz) -> Step:
                return inverse_step(table, m, xyz, p)

            def cart(
                m: str, p: str, wl: Workload = wl, table: bn.ConstructionTable = table, b: int = batch
            ) -> Step:
                return cartesian_step(wl, table, m, b, p)

            recs += _time_map("inverse", wl, batch, INVERSE_PASSES, INVERSE_METHODS, inv, cfg)
            recs += _time_map("cartesian", wl, batch, CARTESIAN_PASSES, CARTESIAN_METHODS, cart, cfg)
    return recs


def count_steps(rows: list[Workload]) -> int:
    """Progress-bar steps of :func:`time_fused_rows`."""
    return sum(len(wl.batches) for wl in rows) * (len(INVERSE_PASSES) + len(CARTESIAN_PASSES))


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r.get("map"), r.get("workload"), r.get("n_atoms"), r.get("batch"), r.get("pass"))


def _get(recs: list[dict[str, Any]], key: tuple[Any, ...], method: str) -> dict[str, Any] | None:
    for r in recs:
        if _key(r) == key and r.get("method") == method:
            return r
    return None


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    return fmt_seconds(r["median_s"]) if r["status"] == "ok" and r["median_s"] is not None else r["status"]


def _fastest(cands: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    ok = [c for c in cands if c and c.get("status") == "ok" and c.get("median_s")]
    return min(ok, key=lambda c: c["median_s"]) if ok else None


def _ratio(num: dict[str, Any] | None, den: dict[str, Any] | None) -> str:
    if not (num and den and num.get("median_s") and den.get("median_s")):
        return "-"
    return f"{num['median_s'] / den['median_s']:.3g}x"


def markdown(recs: list[dict[str, Any]]) -> list[str]:
    """The ``## Fused rows`` section of the report."""
    lines = ["## Fused rows", ""]
    if len(recs) == 1 and recs[0].get("map") == "all":
        return [*lines, recs[0]["status"], ""]
    lines += [
        "Interleaved rounds, medians, float32, CPU. Ratios > 1: the fused engine is faster; "
        "`fused / floor` > 1: slower than the plain numba loop.",
        "",
    ]
    for kind, methods, refs in (
        ("inverse", INVERSE_METHODS, ("torch",)),
        ("cartesian", CARTESIAN_METHODS, ("scan", "levels")),
    ):
        ref = " or ".join(refs) if len(refs) == 1 else f"best of {'/'.join(refs)}"
        keys = [k for k in dict.fromkeys(_key(r) for r in recs) if k[0] == kind]
        if not keys:
            continue
        lines += [f"### {'to_internal' if kind == 'inverse' else 'to_cartesian'}", ""]
        lines.append("| row | pass | " + " | ".join(methods) + f" | {ref} / fused | fused / floor |")
        lines.append("|" + "---|" * (len(methods) + 4))
        for key in keys:
            cells = [_cell(_get(recs, key, m)) for m in methods]
            fused, flo = _get(recs, key, "fused"), _get(recs, key, "floor")
            other = _fastest([_get(recs, key, m) for m in refs])
            row = f"{key[1]} N={key[2]} B={key[3]}"
            lines.append(
                f"| {row} | {key[4]} | "
                + " | ".join(cells)
                + f" | {_ratio(other, fused)} | {_ratio(fused, flo)} |"
            )
        lines.append("")
    return lines
