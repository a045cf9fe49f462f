"""``warmup``: compile (or load) every numba kernel of the fused engine ahead of use."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .core.convert import to_cartesian, to_internal
from .core.pose import extract_pose
from .core.table import ConstructionTable

__all__ = ["PASSES", "warmup"]

#: The passes :func:`warmup` can compile, in the order it runs them.
PASSES = ("forward", "backward", "inverse", "second", "flow", "torsions", "backbone")
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_ATOMS = 12  # a chain: small inputs, every row kind of a chain (seeds, NeRF frames)


@contextlib.contextmanager
def _thresholds(threaded: bool) -> Iterator[None]:
    """With ``threaded``, the kernels' serial-below-this-size thresholds set to 0 (tiny calls take the
    threaded kernels), restored afterwards."""
    from .engines.fused.cpu import build as fused_numba
    from .engines.fused.cpu import entries as fused_entries
    from .engines.fused.cpu import inverse as fused_inverse_numba
    from .engines.fused.cpu import trig as fused_numba_trig
    from .engines.fused.cpu import turns as fused_turns

    names = (
        (fused_numba, "SERIAL_WORK"),
        (fused_numba, "WORKQUEUE_SERIAL_WORK"),
        (fused_numba, "TBB_SERIAL_WORK"),
        (fused_numba_trig, "SERIAL_VALUES"),
        (fused_numba_trig, "WORKQUEUE_SERIAL_VALUES"),
        (fused_entries, "SERIAL_VALUES"),
        (fused_entries, "WORKQUEUE_SERIAL_VALUES"),
        (fused_inverse_numba, "PARALLEL_ROWS"),
        (fused_turns, "SERIAL_WORK"),
        (fused_turns, "WORKQUEUE_SERIAL_WORK"),
    )
    saved = [getattr(m, n) for m, n in names]
    try:
        if threaded:
            for m, n in names:
                setattr(m, n, 0)
        yield
    finally:
        for (m, n), v in zip(names, saved):
            setattr(m, n, v)


def _inputs(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    bonds = (1.5 + 0.1 * torch.rand(n, _ATOMS, generator=gen, dtype=torch.float64)).to(dtype)
    angles = (1.9 + 0.1 * torch.rand(n, _ATOMS, generator=gen, dtype=torch.float64)).to(dtype)
    dihedrals = (3.0 * torch.rand(n, _ATOMS, generator=gen, dtype=torch.float64) - 1.5).to(dtype)
    return bonds, angles, dihedrals


def _builder(table: ConstructionTable, n: int, dtype: torch.dtype, backward: bool) -> None:
    b, a, d = (t.requires_grad_(backward) for t in _inputs(n, dtype))
    rotation = torch.eye(3, dtype=dtype).requires_grad_(backward)  # the pose rows' kernel too
    translation = torch.zeros(3, dtype=dtype)
    xyz = to_cartesian(b, a, d, table, method="fused", rotation=rotation, translation=translation)
    if backward:
        xyz.sum().backward()


def _inverse(table: ConstructionTable, n: int, dtype: torch.dtype, second: bool) -> None:
    b, a, d = _inputs(n, dtype)
    x = to_cartesian(b, a, d, table, method="fused").detach().requires_grad_()
    ic = to_internal(x, table, method="fused")
    extract_pose(x.detach(), table)  # the pose's kernel (nothing to differentiate)
    q = ic.bonds.sum() + ic.angles.sin().sum() + ic.dihedrals.sin().sum()
    (g,) = torch.autograd.grad(q, x, create_graph=second)
    if second:
        (g * g).sum().backward()


def _flow(table: ConstructionTable, n: int, dtype: torch.dtype) -> None:
    """Both directions of the flow layer with gradients, with its pose (the kernels it runs)."""
    from .learning.flow import InternalCoordinateTransform

    flow = InternalCoordinateTransform(table, pose=True)
    b, a, d = _inputs(n, dtype)
    x = to_cartesian(b, a, d, table).requires_grad_()
    z = flow(x)
    (z.bonds.sum() + z.log_det.sum()).backward()
    leaves = [v.detach().requires_grad_() for v in (z.bonds, z.angles, z.dihedrals)]
    xyz, log_det = flow.inverse(*leaves, z.rotation.detach(), z.translation.detach())
    (xyz.sum() + log_det.sum()).backward()


def _torsions(n: int, dtype: torch.dtype) -> None:
    """`update_torsions` with its gradient (its turns' forward and backward kernels)."""
    from .torsion_space.rotors import RotorTable
    from .torsion_space.update import update_torsions

    rotors = RotorTable.from_connectivity([(k, k + 1) for k in range(_ATOMS - 1)], _ATOMS)
    b, a, d = _inputs(1, dtype)
    x = to_cartesian(b, a, d, ConstructionTable.chain(_ATOMS)).expand(n, _ATOMS, 3).contiguous()
    tau = torch.full((n, rotors.n_bonds), 0.5, dtype=dtype, requires_grad=True)
    update_torsions(x, rotors, tau).sum().backward()


def _backbone(n: int, dtype: torch.dtype) -> None:
    """What `protein.build_backbone` runs besides the builder's kernels, on ``n`` chains: the gather of
    its atom rows with their cosines and sines (`cpu.trig.gathered_trig`), alone and in one call
    with the blocked forward (`cpu.build.gathered_forward`), and the zeros past each chain's length in
    the forward's and the backward's layouts (`cpu.build.zero_past`)."""
    from .engines.backends import require

    plan = ConstructionTable.chain(_ATOMS).plan("fused")
    values = tuple(torch.zeros(n, _ATOMS, dtype=dtype).numpy() for _ in range(3))
    consts = np.zeros(7, values[0].dtype)
    index = np.zeros((3, _ATOMS), dtype=np.int64)
    count = np.full(n, _ATOMS, dtype=np.int64)
    first = np.zeros((0, 3), values[0].dtype)
    kernels = require("cpu")
    pose = kernels.pose.identity_rows(plan.topology.seed_root.size)
    kernels.gathered_trig(values, consts, index, index, count, index, n)
    source = (index, index, index)
    for rows in (count, None):  # mixed lengths, all rows: the same compiled call
        kernels.gathered_forward(
            values, consts, source, rows, plan.index, plan.starts, first, pose, plan.width, plan.reach, n
        )
    kernels.zero_past(np.zeros((n, _ATOMS, 3), values[0].dtype), count)
    kernels.zero_past(np.zeros((n, 3, _ATOMS), values[0].dtype).transpose(0, 2, 1), count)


Step = tuple[str, Callable[[], None]]


def _steps(dtypes: Sequence[str], passes: Sequence[str], threads: int) -> list[Step]:
    """``(label, run)`` per kernel layout: per sample and blocked, serial and (``threads > 1``) threaded."""
    table = ConstructionTable.chain(_ATOMS)
    # samples per call: per sample (1; threaded: one per thread, too few blocks for the blocked
    # kernels), blocked (32; threaded: a block of 32 per thread). The inverse's threaded per-sample
    # kernels have two schedules: fewer samples than threads (rows in parallel) or not.
    sizes = [("per sample", 1, False), ("blocked", 32, False)]
    if threads > 1:
        sizes += [("per sample, threaded", threads, True), ("blocked, threaded", 32 * threads, True)]
    inverse_sizes = sizes + ([("per sample, threaded rows", 1, True)] if threads > 1 else [])
    steps: list[Step] = []
    for name in dtypes:
        dt = _DTYPES[name]
        for label, n, threaded in sizes:
            if "backward" in passes:
                what = f"to_cartesian forward + backward, {label}, {name}"
                steps.append((what, _run(_builder, table, n, dt, True, threaded)))
            elif "forward" in passes:
                what = f"to_cartesian forward, {label}, {name}"
                steps.append((what, _run(_builder, table, n, dt, False, threaded)))
        for label, n, threaded in inverse_sizes:
            if "second" in passes:
                what = f"to_internal forward + backward + second order, {label}, {name}"
                steps.append((what, _run(_inverse, table, n, dt, True, threaded)))
            elif "inverse" in passes:
                what = f"to_internal forward + backward, {label}, {name}"
                steps.append((what, _run(_inverse, table, n, dt, False, threaded)))
        if "flow" in passes:  # one layout: on this thread and (a chunk per thread) threaded
            flow_sizes = [("", 1, False)] + ([(", threaded", 64 * threads, True)] if threads > 1 else [])
            for label, n, threaded in flow_sizes:
                what = f"InternalCoordinateTransform forward + inverse + backward{label}, {name}"
                steps.append((what, _run(_flow, table, n, dt, threaded)))
        if "torsions" in passes:  # one layout: on this thread and threaded
            for label, threaded in [("", False)] + ([(", threaded", True)] if threads > 1 else []):
                what = f"update_torsions forward + backward{label}, {name}"
                steps.append((what, _run(_torsions, 1, dt, threaded)))
        if "backbone" in passes:  # blocked: on this thread (one call) and threaded (two passes)
            for label, n, threaded in [("", 32, False)] + (
                [(", threaded", 32 * threads, True)] if threads > 1 else []
            ):
                what = f"protein.build_backbone gather{label}, {name}"
                steps.append((what, _run(_backbone, n, dt, threaded)))
    return steps


def _run(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
    *head, threaded = args

    def run() -> None:
        with _thresholds(threaded):
            fn(*head)

    return run


class _Bar:
    """tqdm when installed, else one plain ``[k/n] label`` line per step on stderr; silent when disabled."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.k, self.enabled, self.bar = total, 0, enabled, None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="step", desc="batched_nerf warmup", file=sys.stderr)
            except ImportError:
                self.bar = None

    def start(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=True)
        elif self.enabled:
            print(f"batched_nerf warmup [{self.k + 1}/{self.total}] {label}", file=sys.stderr, flush=True)

    def done(self) -> None:
        self.k += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def warmup(
    dtypes: str | torch.dtype | Sequence[str | torch.dtype] = ("float32", "float64"),
    passes: str | Sequence[str] = PASSES,
    *,
    threaded: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Compile (or load from numba's on-disk cache) every CPU kernel of the fused engine, ahead of use.

    A kernel compiles on its first call with new argument types (dtype, layout):
    seconds per kernel, tens of seconds for a first training step. This runs
    each pass on a small chain (`_ATOMS` atoms) in every layout the
    dispatch rule can pick: per sample and blocked (32 samples innermost), on
    the calling thread and threaded (with ``threaded`` and more than one numba
    thread: the small-call thresholds are lifted for the call), for each dtype;
    ``passes``: ``"forward"`` ([`to_cartesian`][batched_nerf.to_cartesian]), ``"backward"`` (its
    gradient), ``"inverse"`` ([`to_internal`][batched_nerf.to_internal] and its gradient),
    ``"second"`` (a ``create_graph=True`` gradient of [`to_internal`][batched_nerf.to_internal] and
    its backward: the inverse's second-order kernels; implies ``"inverse"``),
    ``"flow"`` ([`InternalCoordinateTransform`][batched_nerf.InternalCoordinateTransform] both ways with
    gradients and its pose: the builder's and the inverse's kernels it runs), ``"torsions"``
    ([`update_torsions`][batched_nerf.update_torsions] with its gradient), ``"backbone"``
    (what [`protein.build_backbone`][batched_nerf.protein.build_backbone] runs besides the
    builder's kernels).
    The values computed are thrown away.

    Where the compiled code goes: numba's cache, chosen when the kernels are
    imported: ``NUMBA_CACHE_DIR`` when set; else ``__pycache__`` next to the
    kernel modules (``batched_nerf/engines/fused/cpu/``); where that is not writable
    (a read-only site-packages), a per-user folder
    (``~/.cache/numba/cpu_<hash>``). For a container image or a CI cache,
    run ``NUMBA_CACHE_DIR=/path batched-nerf warmup`` while building it and keep
    the same ``NUMBA_CACHE_DIR`` (and the same files: numba checks the source
    files' time stamps and sizes, and the CPU) where it runs; several processes
    may share one folder. On a warm cache this takes about a second.

    Args:
        dtypes: ``"float32"`` and/or ``"float64"`` (names or torch dtypes; one alone is one dtype).
        passes: a subset of `PASSES` (one name alone is one pass).
        threaded: also the threaded kernels (only where numba has more than one thread).
        progress: a progress bar on stderr (tqdm when installed, else a line per step).

    Returns:
        ``{"steps": int, "compiled": int (kernels compiled: cache misses), "seconds": float,
        "cache_dir": str, "threads": int}``.

    Raises:
        ValueError: an unknown dtype or pass.
        RuntimeError: ``NUMBA_CACHE_DIR`` is set but numba cannot use it (a file, a folder that
            cannot be written nor already holds the cache): the kernels would be cached elsewhere.
        RuntimeError: numba (the CPU backend) is not installed (names how to install it).

    Example:
        >>> import batched_nerf as bn
        >>> info = bn.warmup(dtypes=("float64",), passes=("forward",), threaded=False, progress=False)
        >>> info["steps"], sorted(info)
        (2, ['cache_dir', 'compiled', 'seconds', 'steps', 'threads'])
    """
    if isinstance(dtypes, (str, torch.dtype)):  # one dtype, not its characters
        dtypes = (dtypes,)
    if isinstance(passes, str):
        passes = (passes,)
    names = {v: k for k, v in _DTYPES.items()}
    dtypes = tuple(names.get(d, str(d)) if isinstance(d, torch.dtype) else d for d in dtypes)
    passes = tuple(passes)
    bad = [d for d in dtypes if d not in _DTYPES]
    if bad or not dtypes:
        raise ValueError(f"warmup: dtypes must be among {tuple(_DTYPES)}, got {tuple(dtypes)!r}")
    unknown = [p for p in passes if p not in PASSES]
    if unknown or not passes:
        raise ValueError(f"warmup: passes must be among {PASSES}, got {tuple(passes)!r}")
    from .engines import backends

    backends.require("cpu")
    import numba

    from .engines.fused.cpu import cache as fused_compile
    from .engines.fused.cpu import tiers

    asked, where = numba.config.CACHE_DIR, fused_compile.cache_dir()
    if asked and not os.path.abspath(where).startswith(os.path.abspath(asked)):
        raise RuntimeError(
            f"warmup: NUMBA_CACHE_DIR={asked!r} {fused_compile._problem(asked)}, so the kernels would "
            f"be cached in {where} instead, not where asked: point NUMBA_CACHE_DIR at a writable folder"
        )
    threads = numba.get_num_threads() if threaded else 1
    steps = _steps(dtypes, passes, threads)
    before, t0 = len(fused_compile.COMPILES), time.perf_counter()
    bar = _Bar(len(steps), progress)
    try:
        with tiers.always():  # every layout, blocked ones included (no tiered compilation)
            for label, run in steps:
                bar.start(label)
                run()
                bar.done()
    finally:
        bar.close()
    return {
        "steps": len(steps),
        "compiled": len(fused_compile.COMPILES) - before,
        "seconds": time.perf_counter() - t0,
        "cache_dir": fused_compile.cache_dir(),
        "threads": threads,
    }
