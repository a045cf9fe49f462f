"""The first torch op after other work is slow on this machine: a timing artefact, not a defect.

Plain torch, no batched_nerf. After ~10,000 tiny eager ops (or 30 ms of pure
Python, or a 50 ms sleep) the next ``torch.sin`` of 4,096 floats takes ~100 us
instead of ~4 us; a second call right after is fast again. A call made of a
few torch ops pays it per op, so short calls (a 4,096-atom chain, one sample)
measured right after a per-atom Python loop look 3-5x slower than when
repeated. ``benchmarks/fused_rows.py`` and ``benchmarks/fused_vs_peers.py``
therefore time the second of two back-to-back calls of each contender.

Run: ``python docs/repro/repro_cold_first_op.py``. Seen here (2-core AMD EPYC
VM, torch 2.13.0 CPU): ~4 us alone, ~110 us after 10,000+ tiny ops, ~7 us when
one warm-up call sits in between.
"""

import statistics
import time

import torch

x0, b, out = torch.rand(64, 1), torch.rand(4096), torch.empty(4096)


def tiny_ops(n: int) -> None:
    x = x0
    for _ in range(n):
        x = x * 1.0 + 0.0


def sin() -> None:
    torch.sin(b, out=out)


def timed(before: object = None, rounds: int = 15) -> float:
    ts = []
    for _ in range(rounds):
        if callable(before):
            before()
        t0 = time.perf_counter()
        sin()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def warm_then(n: int) -> None:
    tiny_ops(n)
    sin()


if __name__ == "__main__":
    print(f"torch.sin(4096) alone:                       {timed():7.1f} us")
    for n in (1_000, 10_000, 50_000):
        print(f"after {n:6d} tiny ops:                     {timed(lambda n=n: tiny_ops(n)):7.1f} us")
    print(f"after 20,000 tiny ops and one warm-up call: {timed(lambda: warm_then(20_000)):7.1f} us")
