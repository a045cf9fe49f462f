"""MDAnalysis BAT vs batched_nerf on a trajectory: BAT layout -> Cartesian, and Cartesian -> BAT layout.

Workload (issue 24): AdK residues 1-40 (613 atoms) of MDAnalysisTests' PSF/DCD,
all 98 frames, in one process:

* **to Cartesian**: ``BAT.Cartesian(frame)`` for every frame of ``results.bat``
  (a Python loop over atoms per frame) vs ours: ``from_bat`` + one
  ``bn.to_cartesian`` call with the pose for all frames (float64, the BAT
  values' dtype), and the bare ``bn.to_cartesian`` of float32 internal
  coordinates without pose (the issue's "3.1 ms");
* **to BAT**: ``BAT.run()`` (reads the frames and computes the values frame by
  frame) vs ours: ``frames`` (reading the same frames) + one
  ``bn.to_internal(..., return_pose=True)`` + ``to_bat``, and without the reading.

Each of ours is the best of ``--repeats`` calls after a warm-up call (the first
call compiles the numba kernels when the cache is cold), at one thread and at
torch's default thread count in turn (``--threads``: on a machine shared with
other jobs, multi-threaded torch and numba calls wait for busy cores, and one
thread is often faster); each of BAT's the best of ``--bat-repeats``. The
results are checked: our Cartesian equals ``BAT.Cartesian`` (max deviation
printed), our values equal ``results.bat`` (compared on the circle). Timings on
a shared machine are noisy; the ratios, measured in one process, are what to
compare.

    python benchmarks/md_bat.py                       # ~1 min: BAT's own setup takes 15-20 s
    python benchmarks/md_bat.py --selection "resid 1-10" --stop 20 --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: this checkout's batched_nerf
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import batched_nerf as bn

#: speed-up of the 98-frame BAT -> Cartesian conversion over BAT.Cartesian (issue 24)
TARGET = 300.0


def best(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of ``repeats`` calls, in seconds."""
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def set_threads(n: int, numba_threads: int | None = None) -> int | None:
    """Set torch's thread count to ``n`` and numba's to ``numba_threads`` (default: ``n``, at most
    numba's pool); returns numba's count before (None without numba)."""
    torch.set_num_threads(n)
    try:
        import numba
    except ImportError:
        return None
    before = numba.get_num_threads()
    numba.set_num_threads(min(n if numba_threads is None else numba_threads, numba.config.NUMBA_NUM_THREADS))
    return before


def run(
    selection: str = "resid 1-40",
    stop: int | None = None,
    repeats: int = 50,
    bat_repeats: int = 1,
    threads: Sequence[int] | None = None,
) -> dict:
    """Time both directions; returns the times (s), the ratios and the deviations.

    ``threads``: the thread counts ours is timed at, in turn (default: 1 and
    torch's default); BAT (Python loops over numpy) is timed once.
    """
    import MDAnalysis as mda
    from MDAnalysis.analysis.bat import BAT
    from MDAnalysisTests.datafiles import DCD, PSF

    from batched_nerf.formats.mdanalysis import frames, from_bat, table_from_bat, to_bat

    default = torch.get_num_threads()
    counts = list(dict.fromkeys(threads or (1, default)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe(PSF, DCD)
        ag = u.select_atoms(selection)
        t0 = time.perf_counter()
        bat = BAT(ag)
        setup = time.perf_counter() - t0
        t_run = best(lambda: bat.run(stop=stop), bat_repeats)
    values = bat.results.bat
    bt = table_from_bat(bat)

    def ours_cartesian() -> torch.Tensor:
        ic, pose = from_bat(values, bt)
        return bn.to_cartesian(*ic, bt.table, rotation=pose.rotation, translation=pose.translation)

    ic32 = tuple(x.float() for x in from_bat(values, bt)[0])

    def ours_bare() -> torch.Tensor:
        return bn.to_cartesian(*ic32, bt.table)

    def ours_bat(xyz: torch.Tensor) -> torch.Tensor:
        return to_bat(*bn.to_internal(xyz, bt.table, return_pose=True), bt)

    xyz = frames(ag, stop=stop)
    ours = {}
    numba_before = None
    for n in counts:
        before = set_threads(n)
        numba_before = before if numba_before is None else numba_before
        for fn in (ours_cartesian, ours_bare, lambda: ours_bat(xyz)):
            fn()  # warm-up (numba compiles on the first call of a cold cache)
        ours[n] = {
            "cartesian_s": best(ours_cartesian, repeats),
            "bare_float32_s": best(ours_bare, repeats),
            "to_bat_s": best(lambda: ours_bat(xyz), repeats),
            "to_bat_with_reading_s": best(lambda: ours_bat(frames(ag, stop=stop)), max(1, repeats // 4)),
        }
    set_threads(default, numba_before)  # both as they were (numba's count is its own, not torch's)

    ref: list[np.ndarray] = []

    def bat_cartesian() -> None:
        ref[:] = [bat.Cartesian(frame) for frame in values]

    t_bat = best(bat_cartesian, bat_repeats)
    cart_dev = float(np.abs(ours_cartesian().numpy() - np.stack(ref)).max())
    gap = np.angle(np.exp(1j * (ours_bat(xyz).numpy() - values)))
    for times in ours.values():
        times["ratio_cartesian"] = t_bat / times["cartesian_s"]
        times["ratio_cartesian_bare"] = t_bat / times["bare_float32_s"]
        times["ratio_run"] = t_run / times["to_bat_s"]
        times["ratio_run_with_reading"] = t_run / times["to_bat_with_reading_s"]
    return {
        "atoms": ag.n_atoms,
        "frames": len(values),
        "bat_setup_s": setup,
        "bat_cartesian_s": t_bat,
        "bat_run_s": t_run,
        "ours": ours,
        "max_cartesian_deviation_A": cart_dev,
        "max_bat_deviation": float(np.abs(gap).max()),
    }


ROWS = (
    (
        "results.bat -> Cartesian, all frames: BAT.Cartesian per frame vs from_bat + one to_cartesian "
        "with pose (float64)",
        "bat_cartesian_s",
        "cartesian_s",
        "ratio_cartesian",
    ),
    (
        "same, ours bare: to_cartesian of float32 internals, no pose",
        "bat_cartesian_s",
        "bare_float32_s",
        "ratio_cartesian_bare",
    ),
    (
        "Cartesian -> results.bat: BAT.run vs to_internal + to_bat (frames in memory)",
        "bat_run_s",
        "to_bat_s",
        "ratio_run",
    ),
    (
        "same, ours reading the frames too (frames())",
        "bat_run_s",
        "to_bat_with_reading_s",
        "ratio_run_with_reading",
    ),
)


def report(r: dict) -> str:
    ms = 1e3
    counts = list(r["ours"])
    head = " | ".join(f"ours, {n} thread{'s' if n > 1 else ''} | ratio" for n in counts)
    lines = [
        f"AdK selection: {r['atoms']} atoms, {r['frames']} frames (BAT's own setup, not timed below: "
        f"{r['bat_setup_s']:.1f} s); torch {torch.__version__}; best of repeated calls; on a shared "
        "machine the times are noisy: compare the ratios",
        "",
        f"| conversion | BAT | {head} |",
        "|---|---|" + "---|---|" * len(counts),
    ]
    for label, bat_key, key, ratio in ROWS:
        cells = " | ".join(f"{r['ours'][n][key] * ms:.2f} ms | {r['ours'][n][ratio]:.0f}x" for n in counts)
        lines.append(f"| {label} | {r[bat_key] * ms:.1f} ms | {cells} |")
    best_ratio = max(t["ratio_cartesian"] for t in r["ours"].values())
    lines += [
        "",
        f"max |ours - BAT.Cartesian| = {r['max_cartesian_deviation_A']:.2e} A; "
        f"max |to_bat - results.bat| (on the circle) = {r['max_bat_deviation']:.2e}",
        f"target >= {TARGET:.0f}x for results.bat -> Cartesian: "
        + ", ".join(
            f"{'met' if t['ratio_cartesian'] >= TARGET else 'missed'} at {n} thread{'s' if n > 1 else ''} "
            f"({t['ratio_cartesian']:.0f}x)"
            for n, t in r["ours"].items()
        )
        + f"; best {best_ratio:.0f}x",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--selection", default="resid 1-40", help="selection of AdK atoms (one molecule)")
    parser.add_argument("--stop", type=int, default=None, help="last frame (exclusive); default: all 98")
    parser.add_argument("--repeats", type=int, default=50, help="calls of ours (best is reported)")
    parser.add_argument("--bat-repeats", type=int, default=1, help="runs of BAT's loops (best is reported)")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=None, help="thread counts for ours (default: 1 and torch's)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON (for headline.py)")
    args = parser.parse_args(argv)
    result = run(args.selection, args.stop, args.repeats, args.bat_repeats, args.threads)
    print(report(result))
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
