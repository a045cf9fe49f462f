"""The benchmark suite (benchmarks/, outside the package) runs end to end on a tiny configuration.

No timing assertions: only that every part of the report is there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import batched_nerf as bn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the repository's benchmarks package

from benchmarks.suite import run_benchmarks  # noqa: E402
from benchmarks.workloads import (  # noqa: E402
    alanine_refs,
    make_inputs,
    protein_refs,
    reference_xyz,
    tree_refs,
)


def test_run_benchmarks_tiny(tmp_path: Path) -> None:
    report = run_benchmarks(
        quick=True,
        out_dir=str(tmp_path),
        peers=True,  # the per-atom loop only, in quick mode
        compile=False,
        progress=False,
        sizes=[24],  # the smallest row the targets apply to: N >= 22, B >= 64
        batches=[64],
        repeats=1,
        memory=False,  # a subprocess per row and method: seconds each
        errors=False,
    )
    assert report.startswith("# batched_nerf benchmarks")
    for section in ("## Headline", "## Targets (issue 11)", "## Timings", "## Peak memory"):
        assert section in report
    for name in ("results.md", "results.json"):
        assert (tmp_path / name).is_file()
    data = json.loads((tmp_path / "results.json").read_text())
    assert {"machine", "config", "timings", "headline", "speedups", "errors", "memory", "targets"} <= set(
        data
    )
    assert {"torch", "torch_threads", "cpu", "loadavg_start", "loadavg_end"} <= set(data["machine"])
    methods = {(t["method"], t["pass"]) for t in data["timings"]}
    for method in ("levels", "scan", "auto", "torch-loop"):
        for pass_ in ("forward", "forward_backward", "committor"):
            assert (method, pass_) in methods
    for t in data["timings"]:
        assert {"workload", "n_atoms", "batch", "status", "median_s", "runs"} <= set(t)
        assert t["status"] == "ok" or t["status"].split(":")[0] in ("skipped", "failed", "n/a")
    head = {(e["n_atoms"], e["batch"], e["pass"]): e for e in data["headline"]}
    fwd = head[(24, 64, "forward")]
    assert fwd["ours_engine"] in ("levels", "scan", "auto")
    assert fwd["vs_loop"] == pytest.approx(fwd["loop_s"] / fwd["ours_s"])
    assert {t["target"] for t in fwd["targets"]} >= {">= 5x loop", "auto <= 1.25x best"}
    assert all(
        t["status"] in ("met", "missed") or t["status"].startswith("not measured") for t in fwd["targets"]
    )
    assert ">= 5x loop" in {t["target"] for t in data["targets"]}
    assert data["memory"] == []


def test_reference_xyz_matches_float64_build() -> None:
    for refs in (tree_refs(40), protein_refs(5), alanine_refs()):
        b, a, d = make_inputs(len(refs), 1, torch.float64, 1)
        ref = reference_xyz(b[0].numpy(), a[0].numpy(), d[0].numpy(), refs)
        ours = bn.to_cartesian(b, a, d, bn.ConstructionTable(refs), method="levels")[0].numpy()
        np.testing.assert_allclose(ours, ref, atol=1e-9)
