"""Run the batched_nerf benchmark suite and write the report.

Usage::

    python benchmarks/run.py [--quick] [--out DIR] [--nerfax PATH] [--bgflow PATH]
                             [--device cpu|cuda] [--no-peers] [--compile | --no-compile]
                             [--no-progress] [--time-budget SECONDS] [--engines NAME ...]
                             [--fused | --no-fused]

Prints the Markdown report; with ``--out DIR`` also writes ``results.md``,
``results.json``, ``time_vs_atoms.png`` and ``error_vs_atoms.png`` there.
See benchmarks/README.md.  The suite is the ``benchmarks`` package next to
this file (``from benchmarks.suite import run_benchmarks``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the checkout's batched_nerf and benchmarks package

from benchmarks.records import ENGINES  # noqa: E402
from benchmarks.suite import run_benchmarks  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The options of ``benchmarks/run.py`` (also forwarded by ``batched-nerf bench``)."""
    parser = argparse.ArgumentParser(description="batched_nerf benchmark suite")
    parser.add_argument("--quick", action="store_true", help="small grid, about 1-2 minutes")
    parser.add_argument(
        "--out", metavar="DIR", help="write results.md, results.json and the plots into this directory"
    )
    parser.add_argument("--nerfax", metavar="PATH", help="NeRFax checkout (see benchmarks/PEERS.md)")
    parser.add_argument("--bgflow", metavar="PATH", help="bgflow checkout (see benchmarks/PEERS.md)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="time only batched_nerf")
    parser.add_argument(
        "--compile",
        dest="compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time scan under torch.compile (default: on in full mode, off with --quick)",
    )
    parser.add_argument(
        "--fused",
        dest="fused",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time the fused rows (fused, torch, per-atom loop, numba floor; default: on for CPU runs)",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    parser.add_argument(
        "--time-budget", type=float, default=None, metavar="SECONDS", help="seconds for the timing part"
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        default=list(ENGINES),
        metavar="NAME",
        help=f"our method= names to time (default: {' '.join(ENGINES)})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = run_benchmarks(
        quick=args.quick,
        out_dir=args.out,
        nerfax=args.nerfax,
        bgflow=args.bgflow,
        peers=args.peers,
        compile=args.compile,
        progress=args.progress,
        device=args.device,
        time_budget_s=args.time_budget,
        engines=tuple(args.engines),
        fused=args.fused,
    )
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
