"""The benchmark suite runs end to end on a tiny configuration (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batched_nerf._bench import reference_xyz, run_benchmarks


def test_run_benchmarks_tiny(tmp_path: Path) -> None:
    report = run_benchmarks(
        quick=True,
        out_dir=str(tmp_path),
        peers=False,
        compile=False,
        progress=False,
        sizes=[64],
        batches=[1],
        repeats=2,
        memory=False,  # subprocesses cost seconds each; the full suite covers memory
    )
    assert report.startswith("# batched_nerf benchmarks")
    for name in ("results.md", "results.json"):
        assert (tmp_path / name).is_file()
    data = json.loads((tmp_path / "results.json").read_text())
    assert {"machine", "config", "timings", "speedups", "errors", "memory", "targets", "notes"} <= set(data)
    assert {"torch", "torch_threads", "cpu", "loadavg_start", "loadavg_end"} <= set(data["machine"])
    methods = {(t["method"], t["pass"]) for t in data["timings"]}
    for method in ("levels", "scan", "auto"):
        for pass_ in ("forward", "forward_backward", "committor"):
            assert (method, pass_) in methods
    for t in data["timings"]:
        assert {"workload", "n_atoms", "batch", "status", "median_s", "runs"} <= set(t)
        assert t["status"] == "ok" or t["status"].split(":")[0] in ("skipped", "failed", "n/a")
    assert any(e["status"] == "ok" for e in data["errors"]["chain_curve"])
    assert data["memory"] == []
    assert "peers disabled (peers=False)" in data["notes"]
    pytest.importorskip("matplotlib")
    assert (tmp_path / "time_vs_atoms.png").is_file()


def test_reference_xyz_matches_float64_build() -> None:
    import numpy as np
    import torch

    import batched_nerf as bn
    from batched_nerf._bench import alanine_refs, make_inputs, protein_refs, tree_refs

    for refs in (tree_refs(40), protein_refs(5), alanine_refs()):
        b, a, d = make_inputs(len(refs), 1, torch.float64, 1)
        ref = reference_xyz(b[0].numpy(), a[0].numpy(), d[0].numpy(), refs)
        ours = bn.to_cartesian(b, a, d, bn.ConstructionTable(refs), method="levels")[0].numpy()
        np.testing.assert_allclose(ours, ref, atol=1e-9)
