"""Ours (``method="auto"``) vs NeRFax (every mode) and chemcoord's ``Zmat.get_cartesian()`` on chain rows.

Chains 64 x 1024, 512 x 256 and 4096 x 1, float32, forward and forward+backward,
interleaved rounds (7 per pass after a warm-up call, which includes compiling;
each timed call of a short step right after an untimed one, see
:func:`benchmarks.timing.warm_call`), medians; ratio = the peer's time / ours::

    python benchmarks/fused_vs_peers.py --nerfax /path/to/nerfax

NeRFax needs ``jax==0.4.30 jaxlib==0.4.30 mdtraj biopython`` (see ``PEERS.md``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import batched_nerf as bn
from benchmarks.peers import get_peers, make_refs
from benchmarks.timing import warm_call

ROWS = [(64, 1024), (512, 256), (4096, 1)]
PASSES = ("forward", "forward_backward")
Steps = dict[str, Callable[[], object]]


def ours(n: int, batch: int) -> Steps:
    """Forward and forward+backward steps of ``bn.to_cartesian`` (``method="auto"``)."""
    table = bn.ConstructionTable(make_refs(n).numpy())
    gen = torch.Generator().manual_seed(0)
    bonds = 1.3 + 0.2 * torch.rand(batch, n, generator=gen)
    angles = 1.6 + 0.6 * torch.rand(batch, n, generator=gen)
    dihedrals = (2 * torch.rand(batch, n, generator=gen) - 1) * 3.14
    w = torch.randn(batch, n, 3, generator=gen)

    def forward() -> None:
        with torch.no_grad():
            bn.to_cartesian(bonds, angles, dihedrals, table)

    def forward_backward() -> None:
        b, a, d = (x.clone().requires_grad_() for x in (bonds, angles, dihedrals))
        (bn.to_cartesian(b, a, d, table) * w).sum().backward()

    return {"forward": forward, "forward_backward": forward_backward}


def interleaved(steps: dict[str, Steps], pass_: str, rounds: int = 7) -> dict[str, float]:
    """Median seconds of each contender's ``pass_``, rounds interleaved after one warm-up call each.

    Each timed call of a step under 50 ms follows an untimed call of the same step
    (:func:`benchmarks.timing.warm_call`).
    """
    runnable = {name: s[pass_] for name, s in steps.items() if pass_ in s}
    last: dict[str, float] = {}
    for name, step in runnable.items():
        start = time.perf_counter()
        step()
        last[name] = time.perf_counter() - start
    samples: dict[str, list[float]] = {name: [] for name in runnable}
    for _ in range(rounds):
        for name, step in runnable.items():
            last[name] = warm_call(step, last[name])
            samples[name].append(last[name])
    return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nerfax", metavar="PATH", help="NeRFax checkout")
    peers = {p.name: p for p in get_peers(parser.parse_args().nerfax, None)}
    names = [name for name in peers if name.startswith("nerfax") or name == "chemcoord"]
    print("torch", torch.__version__, "threads", torch.get_num_threads(), bn.backends())
    for n, batch in ROWS:
        steps = {"ours": ours(n, batch)}
        for name in names:
            peer = peers[name]
            if not peer.available:
                print(name, peer.reason)
            elif name != "chemcoord" or batch == 1:  # chemcoord builds one molecule per call
                steps[name] = peer.setup(n, batch, torch.float32, 0, "linear")
        for pass_ in PASSES:
            res = interleaved(steps, pass_)
            mine = res.pop("ours")
            cells = "; ".join(f"{k} {v * 1e3:.3f} ms ({v / mine:.2f}x)" for k, v in res.items())
            print(f"| chain {n} x {batch} | {pass_} | {mine * 1e3:.3f} ms | {cells} |", flush=True)


if __name__ == "__main__":
    main()
