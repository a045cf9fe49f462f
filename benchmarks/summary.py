"""What a run's records add up to: the machine, speed-ups vs each peer, the headline rows and the targets.

The targets are issue 11's (this 2-core CPU, float32, ratios from one run):

* ``>= 5x loop``: our best eager engine at least 5x the per-atom torch loop, forward, forward+backward
  and committor, on every row with N >= 22 and B >= 64;
* ``>= 1x NeRFax``: ours (eager or compiled, whichever is faster: the table says which) at least as fast
  as NeRFax's fastest mode, forward and forward+backward, on every chain row with B >= 64;
* ``>= 0.5x NeRFax compiled``: the compiled path at least half NeRFax's speed on single chains (B = 1);
* ``>= 2x chemcoord``: our best eager engine at least 2x chemcoord's numba core (``get_X``) on single
  chains of 512 and 4096 atoms, forward;
* ``committor <= 3x fwd+bwd``: our best eager committor pass at most 3x our best forward+backward;
* ``auto <= 1.25x best``: ``method="auto"`` within 1.25x of our fastest engine, every row and pass;
* ``compiled < eager``: compiled faster than our best eager engine on every row and pass it supports;
* memory: forward+backward of ``auto`` at chain N = 4096, B = 256 at most 553 bytes per atom.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
import time
from typing import Any

import numpy as np
import torch

import batched_nerf as bn
from benchmarks.records import COMPILED, LOOP, State, Timing
from benchmarks.timing import PASSES

MEMORY_TARGET = ("chain", 4096, 256, 553.0)  # workload, N, B, bytes per atom (fwd+bwd, auto)
PEER_MODULES = ("chemcoord", "jax", "mp_nerf")


def machine(device: str) -> dict[str, Any]:
    """Versions, CPU, threads, memory, load average and time of the run."""
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "batched_nerf": bn.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": _memory_total(),
        "device": device,
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    add_peer_versions(info)
    return info


def add_peer_versions(info: dict[str, Any]) -> None:
    """The versions of the peer packages imported so far."""
    for mod in PEER_MODULES:
        if mod in sys.modules:
            info[f"{mod}_version"] = getattr(importlib.import_module(mod), "__version__", "?")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def _memory_total() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            return int(fh.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None


# --------------------------------------------------------------------------
# Speed-ups vs each peer
# --------------------------------------------------------------------------


def speedups(state: State) -> list[dict[str, Any]]:
    """Peer time / our best eager time, for every successful peer record."""
    out = []
    for t in state.timings:
        if t.kind != "peer" or not t.ok:
            continue
        pass_ = "forward" if t.pass_ == "forward_numba" else t.pass_
        best = state.best_ours(t.workload, t.n_atoms, t.batch, pass_)
        auto = state.get(t.workload, t.n_atoms, t.batch, "auto", pass_)
        if best is None or not best.median_s:
            continue
        out.append(
            {
                "workload": t.workload,
                "n_atoms": t.n_atoms,
                "batch": t.batch,
                "pass": t.pass_,
                "peer": t.method,
                "peer_s": t.median_s,
                "peer_extrapolated": t.extrapolated,
                "ours_method": best.method,
                "ours_s": best.median_s,
                "speedup": (t.median_s or 0.0) / best.median_s,
                "speedup_vs_auto": (t.median_s or 0.0) / auto.median_s if auto and auto.ok else None,
            }
        )
    return out


# --------------------------------------------------------------------------
# Headline rows and targets
# --------------------------------------------------------------------------


def _ok(t: Timing | None) -> Timing | None:
    return t if t is not None and t.ok else None


def _nerfax_best(state: State, wl: str, n: int, batch: int, pass_: str) -> Timing | None:
    modes = sorted({t.method for t in state.timings if t.method.startswith("nerfax")})
    return state.best(wl, n, batch, pass_, modes)


def _target(name: str, ratio: float | None, ok: bool | None, why: str = "") -> dict[str, Any]:
    status = "not measured" + (f" ({why})" if why else "") if ok is None else ("met" if ok else "missed")
    return {"target": name, "ratio": ratio, "status": status}


def headline(state: State, memory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per row and pass: ours (best eager engine; compiled) vs the loop, NeRFax, chemcoord,
    the ratios, peak memory (forward+backward) and the targets that apply to the row."""
    mem = {(m["workload"], m["n_atoms"], m["batch"], m["method"]): m for m in memory}
    out = []
    for wl, n, batch in state.rows():
        for pass_ in PASSES:
            ours = state.best_ours(wl, n, batch, pass_)
            entry: dict[str, Any] = {"workload": wl, "n_atoms": n, "batch": batch, "pass": pass_}
            if ours is None:
                entry["status"] = "ours not measured"
                out.append(entry)
                continue
            entry.update(ours_s=ours.median_s, ours_engine=ours.method)
            _compare(state, entry, ours, mem)
            entry["targets"] = _row_targets(entry)
            out.append(entry)
    return out


def _compare(state: State, entry: dict[str, Any], ours: Timing, mem: dict[tuple, dict]) -> None:
    wl, n, batch, pass_ = entry["workload"], entry["n_atoms"], entry["batch"], entry["pass"]
    ours_s = ours.median_s or 0.0
    auto = _ok(state.get(wl, n, batch, "auto", pass_))
    if auto is not None and "auto" in state.engines:
        entry["auto_s"], entry["auto_over_best"] = auto.median_s, (auto.median_s or 0.0) / ours_s
    comp = _ok(state.get(wl, n, batch, COMPILED, pass_))
    if comp is not None:
        entry["compiled_s"] = comp.median_s
    loop = state.get(wl, n, batch, LOOP, pass_)
    if loop is not None:
        entry["loop_status"] = loop.status
        if loop.ok:
            entry["loop_s"], entry["vs_loop"] = loop.median_s, (loop.median_s or 0.0) / ours_s
    nerfax = _nerfax_best(state, wl, n, batch, pass_)
    if nerfax is not None:
        fastest = min(ours_s, entry.get("compiled_s") or float("inf"))
        entry.update(nerfax_s=nerfax.median_s, nerfax_mode=nerfax.method.removeprefix("nerfax-"))
        entry["vs_nerfax"] = (nerfax.median_s or 0.0) / fastest
        entry["vs_nerfax_with"] = "compiled" if fastest < ours_s else "eager"
        if "compiled_s" in entry:
            entry["compiled_vs_nerfax"] = (nerfax.median_s or 0.0) / entry["compiled_s"]
    cc = _ok(state.get(wl, n, batch, "chemcoord", "forward_numba")) if pass_ == "forward" else None
    if cc is not None:
        entry.update(chemcoord_s=cc.median_s, chemcoord_xB=cc.extrapolated)
        entry["vs_chemcoord"] = (cc.median_s or 0.0) / ours_s
    if pass_ == "committor":
        fb = state.best_ours(wl, n, batch, "forward_backward")
        if fb is not None and fb.median_s:
            entry["committor_over_fwd_bwd"] = ours_s / fb.median_s
    if pass_ == "forward_backward":
        for key, method in (("ours_peak_bytes", ours.method), ("loop_peak_bytes", LOOP)):
            m = mem.get((wl, n, batch, method))
            if m is not None:
                entry[key] = m.get("peak_bytes") if m["status"] == "ok" else m["status"]


def _row_targets(e: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue 11 targets that apply to one headline entry."""
    n, batch, pass_, chain = e["n_atoms"], e["batch"], e["pass"], e["workload"] == "chain"
    two_pass = pass_ in ("forward", "forward_backward")
    out = []
    if n >= 22 and batch >= 64:
        r = e.get("vs_loop")
        out.append(_target(">= 5x loop", r, None if r is None else r >= 5, e.get("loop_status", "")))
    if chain and batch >= 64 and two_pass:
        r = e.get("vs_nerfax")
        out.append(_target(">= 1x NeRFax", r, None if r is None else r >= 1, "no NeRFax timing"))
    if chain and batch == 1 and two_pass:
        r = e.get("compiled_vs_nerfax")
        why = "no compiled timing" if "compiled_s" not in e else "no NeRFax timing"
        out.append(_target(">= 0.5x NeRFax compiled", r, None if r is None else r >= 0.5, why))
    if chain and batch == 1 and n in (512, 4096) and pass_ == "forward":
        r = e.get("vs_chemcoord")
        out.append(_target(">= 2x chemcoord", r, None if r is None else r >= 2, "no chemcoord timing"))
    if pass_ == "committor":
        r = e.get("committor_over_fwd_bwd")
        out.append(_target("committor <= 3x fwd+bwd", r, None if r is None else r <= 3))
    if "auto_over_best" in e:
        r = e["auto_over_best"]
        out.append(_target("auto <= 1.25x best", r, r <= 1.25))
    if "compiled_s" in e:
        r = e["ours_s"] / e["compiled_s"]
        out.append(_target("compiled < eager", r, r > 1))
    return out


def targets(rows: list[dict[str, Any]], memory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target over the whole run: rows met, missed, not measured, and which rows missed."""
    by_name: dict[str, dict[str, Any]] = {}
    for e in rows:
        for t in e.get("targets", []):
            s = by_name.setdefault(t["target"], _tally(t["target"]))
            where = f"{e['workload']} N={e['n_atoms']} B={e['batch']} {e['pass']}"
            if t["status"] == "met":
                s["met"] += 1
            elif t["status"] == "missed":
                s["missed"].append(f"{where} ({t['ratio']:.3g}x)")
            else:
                s["unmeasured"].append(where)
    out = list(by_name.values())
    wl, n, batch, limit = MEMORY_TARGET
    name = f"fwd+bwd peak <= {limit:.0f} bytes/atom ({wl} N={n} B={batch}, auto)"
    key = (wl, n, batch, "auto")
    m = next((m for m in memory if (m["workload"], m["n_atoms"], m["batch"], m["method"]) == key), None)
    item = _tally(name)
    if m is None or m["status"] != "ok":
        item["unmeasured"].append(m["status"] if m else "row not in this run")
    elif m["bytes_per_atom"] <= limit:
        item["met"] = 1
    else:
        item["missed"].append(f"{m['bytes_per_atom']:.0f} bytes/atom")
    out.append(item)
    for s in out:
        if s["missed"]:
            s["status"] = "missed"
        elif s["met"]:
            s["status"] = "met where measured" if s["unmeasured"] else "met"
        else:
            s["status"] = "not measured"
    return out


def _tally(name: str) -> dict[str, Any]:
    return {"target": name, "met": 0, "missed": [], "unmeasured": []}
