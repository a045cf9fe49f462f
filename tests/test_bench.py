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


def test_floor_probes_match_the_library() -> None:
    floor = pytest.importorskip("benchmarks.floor")
    if not floor.available():
        pytest.skip("the floor probes need numba")
    from benchmarks.workloads import in_build_order

    ordered, _ = in_build_order(alanine_refs())
    table = bn.ConstructionTable(ordered)
    b, a, d = make_inputs(len(ordered), 4, torch.float32, 2)
    xyz = bn.to_cartesian(b, a, d, table)
    torch.testing.assert_close(floor.cartesian(ordered)(b, a, d), xyz, rtol=0, atol=1e-5)
    for got, want in zip(floor.internal(ordered)(xyz), bn.to_internal(xyz, table, method="torch")):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="floor.cartesian needs refs in build order"):
        floor.cartesian(alanine_refs()[::-1].copy())


def test_fused_rows_tiny() -> None:
    pytest.importorskip("numba", reason="the fused rows need numba")
    from benchmarks import fused_rows
    from benchmarks.workloads import Workload, chain_refs

    recs = fused_rows.time_fused_rows([Workload("chain", chain_refs(12), [2])], rounds=1, budget_s=0.1)
    got = {(r["map"], r["method"], r["pass"]): r for r in recs}
    for pass_ in fused_rows.INVERSE_PASSES:
        for method in ("fused", "torch"):
            assert got[("inverse", method, pass_)]["status"] == "ok"
            assert got[("inverse", method, pass_)]["median_s"] > 0
    assert got[("inverse", "floor", "forward")]["status"] == "ok"
    assert got[("inverse", "floor", "committor")]["status"].startswith("n/a")
    assert got[("cartesian", "torch-loop", "committor")]["status"] == "ok"
    text = "\n".join(fused_rows.markdown(recs))
    assert "## Fused rows" in text and "### to_internal" in text and "### to_cartesian" in text


@pytest.mark.slow
def test_gpu_script_runs_on_cpu(tmp_path: Path) -> None:
    from benchmarks import gpu

    out = tmp_path / "gpu.json"
    assert gpu.main([str(out), "--device", "cpu", "--quick"]) == 0
    data = json.loads(out.read_text())
    assert data["check_internal_f64"]["torch"] == 0.0
    assert all(isinstance(v, float) and v < 1e-10 for v in data["check_internal_f64"].values())
    assert data["check_cartesian_f64"]["alanine_dipeptide/levels"] < 1e-10
    assert data["gradcheck"]["to_internal/torch"] is True and data["gradcheck"]["to_cartesian/scan"] is True
    for part in ("proteins_163", "alanine", "chain_64", "rule_grid"):
        assert "error" not in data[part]
        assert part == "rule_grid" or data[part]["auto_picks"] in ("fused", "levels", "scan")
    assert data["alanine"]["to_internal/fused/forward"]["median_s"] > 0
    cells = data["rule_grid"]["cells"]
    picks = {c["rule_picks"] for c in cells}
    assert "fused" in picks and len(picks) > 1  # the grid spans both sides of the rule
    assert all(c[f"{m}/forward"]["median_s"] > 0 for c in cells for m in ("fused", "scan"))
    assert data["backends_after"]["disabled"] == {}


@pytest.mark.slow
def test_accumulate_script_runs_on_cpu(tmp_path: Path) -> None:
    """benchmarks/accumulate.py --quick: the Triton kernel in the interpreter, both accumulation dtypes."""
    pytest.importorskip("triton", minversion="3.0", reason="the Triton kernels need triton >= 3")
    from benchmarks import accumulate

    out = tmp_path / "acc.json"
    assert accumulate.main([str(out), "--quick", "--samples", "2"]) == 0
    rows = json.loads(out.read_text())
    assert [r["table"] for r in rows] == ["chain 100", "alanine dipeptide"]
    for r in rows:
        assert r["fused, float64 accumulation"]["max_A"] < 1e-5  # float32 rounding of the result only
        assert r["fused, float32"]["max_A"] < 1e-3
        assert r["scan, float32"]["max_A"] < 1e-3


def test_headline_table_takes_nerfax_fastest_mode_and_the_median_over_rows(tmp_path: Path) -> None:
    from benchmarks import headline

    def row(peer: str, pas: str, n: int, ratio: float) -> dict:
        return {
            "peer": peer,
            "pass": pas,
            "workload": "chain",
            "n_atoms": n,
            "batch": 64,
            "speedup_vs_auto": ratio,
        }

    records = {
        "machine": {"time": "t", "cpu": "c", "torch": "2", "batched_nerf": "0"},
        "speedups": [
            row("nerfax-associative", "forward", 64, 3.0),
            row("nerfax-sequential", "forward", 64, 2.0),  # its fastest mode on the row: 2x
            row("nerfax-associative", "forward", 512, 5.0),
            row("torch-loop", "committor", 64, 4.0),
            row("chemcoord", "forward_numba", 64, 20.0),
        ],
    }
    text = headline.table(records, None)
    assert "| NeRFax |" in text and "**3.5x** (2x to 5x, 2 rows)" in text
    assert "**4x** (1 row)" in text.split("| per-atom torch loop |")[1].split("\n")[0]
    assert "**20x** (1 row)" in text.split("| chemcoord (core) |")[1].split("\n")[0]
    assert "not timed in this run" in text.split("| bgflow |")[1].split("\n")[0]
    (tmp_path / "results.json").write_text(json.dumps(records))
    page = tmp_path / "page.md"
    page.write_text(f"# B\n{headline.START}\nold\n{headline.END}\nrest\n")
    assert headline.main([str(tmp_path / "results.json"), "--page", str(page)]) == 0
    body = page.read_text()
    assert "old" not in body and "| NeRFax |" in body and body.endswith(f"{headline.END}\nrest\n")


def test_protein_models_script_quick(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/protein_models.py --quick: its per-residue side-chain loop reproduces place_side_chains
    (asserted inside the script) and a ratio row is printed; without a FoldingDiff checkout those rows are
    skipped with the reason."""
    from benchmarks import protein_models

    monkeypatch.delenv("FOLDINGDIFF_PATH", raising=False)
    protein_models.main(["--quick", "--rounds", "1", "--budget", "0"])
    out = capsys.readouterr().out
    assert "4 mixed proteins x 6 residues | forward+backward" in out
    assert "FoldingDiff rows skipped: pass --foldingdiff PATH" in out
