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
call compiles the numba kernels when the cache is cold); each of BAT's the best
of ``--bat-repeats``. The results are checked: our Cartesian equals
``BAT.Cartesian`` (max deviation printed), our values equal ``results.bat``
(compared on the circle). Timings on a shared machine are noisy; the ratios,
measured in one process, are what to compare.

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


def run(
    selection: str = "resid 1-40", stop: int | None = None, repeats: int = 20, bat_repeats: int = 1
) -> dict:
    """Time both directions; returns the times (s), the ratios and the deviations."""
    import MDAnalysis as mda
    from MDAnalysis.analysis.bat import BAT
    from MDAnalysisTests.datafiles import DCD, PSF

    from batched_nerf.formats.mdanalysis import frames, from_bat, table_from_bat, to_bat

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
    for fn in (ours_cartesian, ours_bare, lambda: ours_bat(xyz)):
        fn()  # warm-up (numba compiles on the first call of a cold cache)
    t_ours = best(ours_cartesian, repeats)
    t_bare = best(ours_bare, repeats)
    t_inv = best(lambda: ours_bat(xyz), repeats)
    t_inv_read = best(lambda: ours_bat(frames(ag, stop=stop)), max(1, repeats // 4))

    ref: list[np.ndarray] = []

    def bat_cartesian() -> None:
        ref[:] = [bat.Cartesian(frame) for frame in values]

    t_bat = best(bat_cartesian, bat_repeats)
    cart_dev = float(np.abs(ours_cartesian().numpy() - np.stack(ref)).max())
    gap = np.angle(np.exp(1j * (ours_bat(xyz).numpy() - values)))
    return {
        "atoms": ag.n_atoms,
        "frames": len(values),
        "bat_setup_s": setup,
        "bat_cartesian_s": t_bat,
        "ours_cartesian_s": t_ours,
        "ours_bare_float32_s": t_bare,
        "bat_run_s": t_run,
        "ours_to_bat_s": t_inv,
        "ours_to_bat_with_reading_s": t_inv_read,
        "ratio_cartesian": t_bat / t_ours,
        "ratio_cartesian_bare": t_bat / t_bare,
        "ratio_run": t_run / t_inv,
        "ratio_run_with_reading": t_run / t_inv_read,
        "max_cartesian_deviation_A": cart_dev,
        "max_bat_deviation": float(np.abs(gap).max()),
    }


def report(r: dict) -> str:
    ms = 1e3
    lines = [
        f"AdK selection: {r['atoms']} atoms, {r['frames']} frames "
        f"(BAT's own setup, not timed below: {r['bat_setup_s']:.1f} s); torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; a shared machine: compare the ratios",
        "",
        "| conversion | BAT | ours | ratio |",
        "|---|---|---|---|",
        f"| results.bat -> Cartesian, all frames (BAT.Cartesian per frame vs from_bat + one to_cartesian "
        f"with pose, float64) | {r['bat_cartesian_s'] * ms:.1f} ms | {r['ours_cartesian_s'] * ms:.2f} ms | "
        f"{r['ratio_cartesian']:.0f}x |",
        "| same, ours bare: to_cartesian of float32 internals, no pose | | "
        f"{r['ours_bare_float32_s'] * ms:.2f} ms | {r['ratio_cartesian_bare']:.0f}x |",
        f"| Cartesian -> results.bat (BAT.run vs to_internal + to_bat, frames in memory) | "
        f"{r['bat_run_s'] * ms:.1f} ms | {r['ours_to_bat_s'] * ms:.2f} ms | {r['ratio_run']:.0f}x |",
        f"| same, ours reading the frames too (frames()) | | {r['ours_to_bat_with_reading_s'] * ms:.2f} ms | "
        f"{r['ratio_run_with_reading']:.0f}x |",
        "",
        f"max |ours - BAT.Cartesian| = {r['max_cartesian_deviation_A']:.2e} A; "
        f"max |to_bat - results.bat| (on the circle) = {r['max_bat_deviation']:.2e}",
        f"target >= {TARGET:.0f}x for results.bat -> Cartesian: "
        f"{'met' if r['ratio_cartesian'] >= TARGET else 'missed'} ({r['ratio_cartesian']:.0f}x)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--selection", default="resid 1-40", help="selection of AdK atoms (one molecule)")
    parser.add_argument("--stop", type=int, default=None, help="last frame (exclusive); default: all 98")
    parser.add_argument("--repeats", type=int, default=20, help="calls of ours (best is reported)")
    parser.add_argument("--bat-repeats", type=int, default=1, help="runs of BAT's loops (best is reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch and numba threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        try:
            import numba

            numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        except ImportError:
            pass
    result = run(args.selection, args.stop, args.repeats, args.bat_repeats)
    print(report(result))
    return result


if __name__ == "__main__":
    main()
