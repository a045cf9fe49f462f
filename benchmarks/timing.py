"""Timing primitives: the timed step of each pass, the median of repeats, the time formatter.

Shared by the suite and by the peer adapters of :mod:`benchmarks.peers`.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import batched_nerf as bn

Step = Callable[[], object]
Build = Callable[..., torch.Tensor]

PASSES = ("forward", "forward_backward", "committor")
PASS_LABEL = {"forward": "forward", "forward_backward": "fwd+bwd", "committor": "committor"}


def sync(device: str) -> None:
    """Wait for the device (CUDA) to finish queued work; nothing on the CPU."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(
    step: Step, repeats: int = 5, budget_s: float = 6.0, device: str = "cpu", warmup: int = 1
) -> tuple[float, int]:
    """Median seconds of ``step`` over up to ``repeats`` runs after ``warmup`` warm-up runs.

    At least 3 runs, unless one warm-up run alone took more than a third of
    ``budget_s`` (then at least 1).  Stops early once ``budget_s`` is spent.
    Returns ``(median seconds, runs)``.
    """
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
        sync(device)
    warm = (time.perf_counter() - t0) / max(warmup, 1)
    min_runs = 1 if warm > budget_s / 3 else min(3, repeats)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
        if len(times) >= min_runs and time.perf_counter() - start > budget_s:
            break
    return statistics.median(times), len(times)


#: Steps faster than this are timed right after an untimed call of the same step (see :func:`warm_call`).
WARM_BELOW_S = 0.05


def warm_call(step: Callable[[], object], last_s: float) -> float:
    """Seconds of one call of ``step``, right after an untimed call when ``last_s < WARM_BELOW_S``.

    The first torch op after other work is slow on the benchmark machine (~0.1 ms
    per op; ``docs/repro/repro_cold_first_op.py``), which would charge a short
    call for whatever contender ran before it in an interleaved round. Slower
    steps are timed as they come (the effect is noise there, and a second call
    would double the run).
    """
    if last_s < WARM_BELOW_S:
        step()
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def fmt_seconds(seconds: float | None) -> str:
    """``"38 µs"``, ``"4.21 ms"``, ``"1.2 s"``; ``"-"`` for None."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def short_error(exc: BaseException) -> str:
    """``"failed: TypeName: first line of the message"`` (at most 160 characters of it)."""
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    return f"failed: {type(exc).__name__}: {first[:160]}"


# --------------------------------------------------------------------------
# The timed steps
# --------------------------------------------------------------------------


class Committor(torch.nn.Module):
    """q(x) = sigmoid(mean over atoms of MLP(bond, sin/cos angle, sin/cos dihedral of x))."""

    def __init__(self, table: bn.ConstructionTable, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.table = table
        self.mlp = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        for p in self.mlp.parameters():
            p.requires_grad_(False)

    def forward(self, xyz: torch.Tensor) -> torch.Tensor:
        ic = bn.to_internal(xyz, self.table)
        a, d = ic.angles, ic.dihedrals
        feats = torch.stack([ic.bonds, a.sin(), a.cos(), d.sin(), d.cos()], dim=-1)
        return torch.sigmoid(self.mlp(feats).mean(dim=(-2, -1)))


def cotangent(batch: int, n: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """The fixed random upstream gradient ``w`` ``(batch, n, 3)`` of forward+backward steps."""
    rng = np.random.default_rng(seed + 12345)
    return torch.from_numpy(rng.standard_normal((batch, n, 3))).to(dtype=dtype, device=device)


def make_step(
    build: Build,
    ic: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    pass_: str,
    w: torch.Tensor,
    q: Callable[[torch.Tensor], torch.Tensor],
) -> Step:
    """One timed step of ``pass_`` on fresh leaves.

    * ``"forward"``: ``build(ic)`` under ``no_grad``;
    * ``"forward_backward"``: ``(build(ic) * w).sum().backward()``;
    * ``"committor"``: ``x = build(ic)``; ``g = dq/dx`` with ``create_graph=True``;
      ``(g**2).sum().backward()``.
    """
    leaves = [t.clone().requires_grad_(pass_ != "forward") for t in ic]

    def forward() -> object:
        with torch.no_grad():
            return build(*leaves)

    def forward_backward() -> object:
        for t in leaves:
            t.grad = None
        (build(*leaves) * w).sum().backward()
        return leaves[2].grad

    def committor() -> object:
        for t in leaves:
            t.grad = None
        x = build(*leaves)
        g = torch.autograd.grad(q(x).sum(), x, create_graph=True)[0]
        (g**2).sum().backward()
        return leaves[2].grad

    steps = {"forward": forward, "forward_backward": forward_backward, "committor": committor}
    if pass_ not in steps:
        raise ValueError(f"unknown pass {pass_!r}; expected one of {PASSES}")
    return steps[pass_]


# --------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------


class Progress:
    """A tqdm bar on stderr when installed, else a ``[k/total] label`` counter; silent when disabled."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.count, self.enabled = total, 0, enabled
        self.bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc="benchmarks", file=sys.stderr, leave=True)
            except ImportError:
                self.bar = None

    def update(self, label: str) -> None:
        self.count += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(label[:60], refresh=False)
            self.bar.update(1)
        else:
            print(f"[{self.count}/{self.total}] {label}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
