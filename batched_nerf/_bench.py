"""Benchmark suite: batched_nerf engines next to other builders, in one run.

:func:`run_benchmarks` times forward, forward+backward and a committor pass
(second-order autograd through :func:`~batched_nerf.to_internal`) of our
engines (``levels``, ``scan``, ``auto`` and ``scan`` under ``torch.compile``)
and, when the repository's ``benchmarks/peers.py`` is importable, of the peer
builders it wraps (per-atom torch loop, chemcoord, mp-nerf, NeRFax, bgflow),
on linear chains, random trees, a protein-like backbone with side chains and
alanine dipeptide.  It also measures float32 coordinate error against a
float64 reference loop and the peak memory of forward+backward.

Only torch and numpy are needed; ``tqdm`` (progress bar) and ``matplotlib``
(plot) are used when installed.  Command line: ``python benchmarks/run.py``.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

import batched_nerf as bn

Step = Callable[[], object]

OURS = ("levels", "scan", "auto")
COMPILED = "scan (torch.compile)"
PASSES = ("forward", "forward_backward", "committor")
PASS_LABEL = {"forward": "forward", "forward_backward": "fwd+bwd", "committor": "committor"}
#: Memory budget for one step: half of a 24 GB machine.
MEMORY_BUDGET_BYTES = 12 * 2**30
#: Rough peak bytes per (atom x batch element) of one step, used only to skip
#: rows that would not fit; measured values are in ``results.json["memory"]``.
_BYTES_PER_ATOM = {
    "forward": 400.0,
    "forward_backward": 2000.0,
    "committor": 6000.0,
}
#: NeRFax's published CPU figures (2 cores, float32, linear chain, whole batch), seconds.
NERFAX_TARGETS = {
    (512, 1): (0.055e-3, 0.16e-3),
    (4096, 1): (0.46e-3, 2.3e-3),
    (512, 256): (9.1e-3, 47e-3),
    (4096, 256): (83e-3, 409e-3),
}


# --------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------


@dataclass
class Workload:
    """One molecule topology at one size, timed at several batch sizes."""

    name: str  # "chain", "tree", "protein", "alanine_dipeptide"
    refs: np.ndarray  # (N, 3)
    batches: list[int]
    label: str = ""

    @property
    def n_atoms(self) -> int:
        return int(self.refs.shape[0])


def chain_refs(n: int) -> np.ndarray:
    """Linear chain: row i = (i-1, i-2, i-3), -1 where negative."""
    idx = np.arange(n)[:, None] - np.arange(1, 4)[None, :]
    return np.where(idx >= 0, idx, -1)


def tree_refs(n: int, seed: int = 0, window: int = 8) -> np.ndarray:
    """Random tree (seeded): atom i >= 3 hangs off an atom drawn uniformly from the
    previous ``window`` atoms (index >= 2); angle and dihedral refs follow the path
    to the root.  Branchy, with dependency depth about ``2 n / window``."""
    rng = np.random.default_rng(seed)
    parent = [-1, 0, 1]
    refs = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]]
    for i in range(3, n):
        p = int(rng.integers(max(2, i - window), i))
        a = parent[p]
        d = parent[a] if a > 0 else (2 if p != 2 else -1)
        if d < 0 or d in (p, a):
            d = 0 if 0 not in (p, a) else 1
        parent.append(p)
        refs.append([p, a, d])
    return np.asarray(refs[:n], dtype=np.int64)


def protein_refs(n_residues: int) -> np.ndarray:
    """Protein-like backbone: N-CA-C per residue, an O on C, and a CB-CG side chain on CA.

    Atom order per residue: N, CA, C, O, CB, CG (6 atoms).
    """
    refs: list[list[int]] = []
    for r in range(n_residues):
        base = 6 * r
        n_, ca, c, o, cb, cg = range(base, base + 6)
        if r == 0:
            refs += [[-1, -1, -1], [n_, -1, -1], [ca, n_, -1]]
        else:
            pn, pca, pc = base - 6, base - 5, base - 4
            refs += [[pc, pca, pn], [n_, pc, pca], [ca, n_, pc]]
        refs += [[c, ca, n_], [ca, n_, c], [cb, ca, n_]]
        del o, cg
    return np.asarray(refs, dtype=np.int64)


def alanine_refs() -> np.ndarray:
    """The shipped 22-atom alanine dipeptide table (rows not in build order)."""
    from batched_nerf.data import load

    return load("alanine_dipeptide").table().refs.numpy()


def build_order(refs: np.ndarray) -> np.ndarray:
    """An atom order in which every atom comes after its references."""
    n = len(refs)
    done = np.zeros(n, dtype=bool)
    order: list[int] = []
    while len(order) < n:
        progressed = False
        for i in range(n):
            if not done[i] and all(r < 0 or done[r] for r in refs[i]):
                done[i] = True
                order.append(i)
                progressed = True
        if not progressed:
            raise ValueError("reference cycle")
    return np.asarray(order)


def in_build_order(refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(permuted refs, order): row k of the result is atom order[k], refs renumbered."""
    order = build_order(refs)
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    new = refs[order].copy()
    new[new >= 0] = inv[new[new >= 0]]
    return new, order


def make_inputs(
    n_atoms: int, batch: int = 1, dtype: torch.dtype = torch.float32, seed: int = 0, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random, chemically sane ``(bonds, angles, dihedrals)``, each ``(batch, n_atoms)``.

    The same recipe as ``benchmarks/peers.py::make_internal_coords`` (drawn in
    float64, then rounded), so ours and the peers see identical numbers.
    """
    g = torch.Generator().manual_seed(seed)
    shape = (batch, n_atoms)
    f64 = torch.float64
    bonds = 1.3 + 0.3 * torch.rand(shape, generator=g, dtype=f64)
    angles = torch.deg2rad(95.0 + 30.0 * torch.rand(shape, generator=g, dtype=f64))
    dihedrals = math.pi * (2.0 * torch.rand(shape, generator=g, dtype=f64) - 1.0)
    return tuple(t.to(dtype=dtype, device=device) for t in (bonds, angles, dihedrals))  # type: ignore[return-value]


def reference_xyz(
    bonds: np.ndarray, angles: np.ndarray, dihedrals: np.ndarray, refs: np.ndarray
) -> np.ndarray:
    """float64 per-atom NeRF in plain Python floats (independent of our engines).

    One molecule: ``bonds``/``angles``/``dihedrals`` ``(N,)``, ``refs`` ``(N, 3)``
    in any order; same frame conventions as :func:`batched_nerf.to_cartesian`.
    """
    n = len(refs)
    pos: list[tuple[float, float, float] | None] = [None] * n
    b_, a_, d_ = (np.asarray(x, dtype=np.float64).tolist() for x in (bonds, angles, dihedrals))

    def sub(p, q):
        return (p[0] - q[0], p[1] - q[1], p[2] - q[2])

    def cross(p, q):
        return (p[1] * q[2] - p[2] * q[1], p[2] * q[0] - p[0] * q[2], p[0] * q[1] - p[1] * q[0])

    def unit(p):
        s = math.sqrt(p[0] * p[0] + p[1] * p[1] + p[2] * p[2])
        return (p[0] / s, p[1] / s, p[2] / s)

    for i in build_order(refs).tolist():
        ib, ia, id_ = (int(r) for r in refs[i])
        r = b_[i]
        if ib < 0:
            pos[i] = (0.0, 0.0, 0.0)
            continue
        c = pos[ib]
        if ia < 0:
            pos[i] = (c[0] + r, c[1], c[2])
            continue
        b = pos[ia]
        if id_ < 0:
            a = (b[0], b[1] + 1.0, b[2])
            cd, sd = 1.0, 0.0
        else:
            a = pos[id_]
            cd, sd = math.cos(d_[i]), math.sin(d_[i])
        bc = unit(sub(c, b))
        nv = unit(cross(sub(b, a), bc))
        m = cross(nv, bc)
        ca, sa = math.cos(a_[i]), math.sin(a_[i])
        rs = r * sa
        pos[i] = tuple(c[k] - r * ca * bc[k] + rs * cd * m[k] + rs * sd * nv[k] for k in range(3))  # type: ignore[assignment]
    return np.asarray(pos, dtype=np.float64)


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(step: Step, repeats: int, budget_s: float, device: str = "cpu") -> tuple[float, int]:
    """Median seconds over up to ``repeats`` runs after one warm-up run.

    At least 3 runs, unless the warm-up alone took more than a third of
    ``budget_s`` (then at least 1).  Stops early once ``budget_s`` is spent.
    """
    t0 = time.perf_counter()
    step()
    _sync(device)
    warm = time.perf_counter() - t0
    min_runs = 1 if warm > budget_s / 3 else min(3, repeats)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if len(times) >= min_runs and time.perf_counter() - start > budget_s:
            break
    return statistics.median(times), len(times)


class _Committor(torch.nn.Module):
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


def committor_step(
    build: Callable[..., torch.Tensor], leaves: list[torch.Tensor], q: Callable[[torch.Tensor], torch.Tensor]
) -> Step:
    """x = build(ic); g = dq/dx (create_graph); loss = sum(g**2); loss.backward()."""

    def step() -> object:
        for t in leaves:
            t.grad = None
        x = build(*leaves)
        g = torch.autograd.grad(q(x).sum(), x, create_graph=True)[0]
        (g**2).sum().backward()
        return leaves[2].grad

    return step


def forward_backward_step(
    build: Callable[..., torch.Tensor], leaves: list[torch.Tensor], w: torch.Tensor
) -> Step:
    """x = build(ic); (x * w).sum().backward() for a fixed random w."""

    def step() -> object:
        for t in leaves:
            t.grad = None
        (build(*leaves) * w).sum().backward()
        return leaves[2].grad

    return step


def make_step(
    build: Callable[..., torch.Tensor],
    ic: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    pass_: str,
    w: torch.Tensor,
    q: Callable[[torch.Tensor], torch.Tensor],
) -> Step:
    """One timed step of ``pass_`` ("forward", "forward_backward" or "committor") on fresh leaves."""
    leaves = [t.clone().requires_grad_(pass_ != "forward") for t in ic]
    if pass_ == "forward_backward":
        return forward_backward_step(build, leaves, w)
    if pass_ != "forward":
        return committor_step(build, leaves, q)

    def step() -> object:
        with torch.no_grad():
            return build(*leaves)

    return step


def _weights(batch: int, n: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed + 12345)
    return torch.from_numpy(rng.standard_normal((batch, n, 3))).to(dtype=dtype, device=device)


# --------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------


def load_peers_module() -> tuple[ModuleType | None, str]:
    """The repository's ``benchmarks/peers.py``, or (None, why not)."""
    here = Path(__file__).resolve().parent.parent / "benchmarks" / "peers.py"
    if here.is_file():
        name = "_batched_nerf_bench_peers"
        if name in sys.modules:
            return sys.modules[name], ""
        spec = importlib.util.spec_from_file_location(name, here)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # a broken checkout: report and go on without peers
                del sys.modules[name]
                return None, f"benchmarks/peers.py failed to import: {exc}"
            return module, ""
    try:
        return importlib.import_module("benchmarks.peers"), ""
    except ImportError:
        return None, (
            "peers skipped: benchmarks/peers.py not found (the package is installed without "
            "the repository; run from a checkout to compare with peers)"
        )


# --------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------


@dataclass
class Timing:
    """One (workload, size, batch, method, pass) measurement or the reason it is absent."""

    workload: str
    n_atoms: int
    batch: int
    method: str
    kind: str  # "ours" | "peer"
    pass_: str
    status: str = "ok"  # "ok", "skipped: ...", "failed: ...", "n/a: ..."
    median_s: float | None = None
    runs: int = 0
    extrapolated: bool = False  # batch B = B x the B=1 time (peers without batching)
    compile_s: float | None = None
    note: str = ""


@dataclass
class _State:
    quick: bool
    device: str
    repeats: int
    budget_s: float
    step_limit_s: float
    deadline: float
    timings: list[Timing] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    isolate_compile: bool = True  # compiled rows run in a subprocess
    emit: bool = False  # child process: print each record as a JSON line

    def find(self, workload: str, method: str, pass_: str) -> list[Timing]:
        return [
            t
            for t in self.timings
            if t.workload == workload and t.method == method and t.pass_ == pass_ and t.status == "ok"
        ]

    def predict(self, workload: str, n: int, batch: int, method: str, pass_: str) -> float | None:
        """Seconds per step, scaled linearly in atoms x batch from the largest
        smaller row already measured (None: nothing to go by)."""
        best: Timing | None = None
        for t in self.find(workload, method, pass_):
            if t.n_atoms <= n and t.batch <= batch and t.median_s is not None and not t.extrapolated:
                if best is None or t.n_atoms * t.batch > best.n_atoms * best.batch:
                    best = t
        if best is None or best.median_s is None:
            return None
        return best.median_s * (n * max(batch, 1)) / (best.n_atoms * max(best.batch, 1))

    def skip_reason(self, workload: str, n: int, batch: int, method: str, pass_: str) -> str | None:
        est_bytes = _BYTES_PER_ATOM[pass_] * n * batch
        if method in ("levels", "scan", "auto", COMPILED):
            est_bytes *= 1.0 + math.log2(max(n, 2)) / 12.0 if pass_ != "forward" else 1.0
        if est_bytes > MEMORY_BUDGET_BYTES:
            return (
                f"skipped: memory (est. {est_bytes / 2**30:.0f} GB > "
                f"{MEMORY_BUDGET_BYTES / 2**30:.0f} GB budget of a 24 GB machine)"
            )
        if time.perf_counter() > self.deadline:
            return "skipped: run-time budget of the suite used up"
        est = self.predict(workload, n, batch, method, pass_)
        if est is not None and est > self.step_limit_s:
            return f"skipped: too long (est. {_fmt(est)} per step > {_fmt(self.step_limit_s)} limit)"
        return None


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def _short_error(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    return f"failed: {type(exc).__name__}: {first[:160]}"


# --------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------


class _Progress:
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


# --------------------------------------------------------------------------
# Grid
# --------------------------------------------------------------------------


def _workloads(quick: bool) -> list[Workload]:
    if quick:
        loads = [Workload("chain", chain_refs(n), [1, 64]) for n in (64, 512, 4096)]
        loads += [
            Workload("tree", tree_refs(512), [1, 64]),
            Workload("protein", protein_refs(512 // 6), [1, 64]),
            Workload("alanine_dipeptide", alanine_refs(), [64, 4096]),
        ]
        return loads
    # the target rows first, the largest chains last (they are the first to hit the time budget)
    loads = []
    for n in (64, 512, 4096):
        batches = [1, 64, 256, 1024] if n in (512, 4096) else [1, 64, 1024]
        loads.append(Workload("chain", chain_refs(n), batches))
    loads.append(Workload("alanine_dipeptide", alanine_refs(), [1, 64, 1024, 4096]))
    loads += [Workload("tree", tree_refs(n), [1, 64]) for n in (512, 4096)]
    loads += [Workload("protein", protein_refs(n // 6), [1, 64]) for n in (512, 4096)]
    loads.append(Workload("chain", chain_refs(32768), [1, 64, 1024]))
    return loads


def _compile_rows(quick: bool) -> set[tuple[str, int, int]]:
    if quick:
        return {("chain", 64, 1), ("chain", 512, 1)}
    return {
        ("chain", 64, 1),
        ("chain", 512, 1),
        ("chain", 4096, 1),
        ("chain", 512, 256),
        ("chain", 4096, 256),
        ("alanine_dipeptide", 22, 4096),
    }


# --------------------------------------------------------------------------
# Our engines
# --------------------------------------------------------------------------


def _time_ours(
    state: _State,
    wl: Workload,
    batch: int,
    methods: list[str],
    progress: _Progress,
    passes: list[str] | None = None,
) -> None:
    dev, n = state.device, wl.n_atoms
    table = bn.ConstructionTable(wl.refs)
    if dev != "cpu":
        table.prepare(dev)
    q = _Committor(table).to(dev)
    b, a, d = make_inputs(n, batch, torch.float32, 0, dev)
    w = _weights(batch, n, torch.float32, dev)
    for method in methods:
        compiled = method == COMPILED
        if compiled and state.isolate_compile:
            _time_compiled_isolated(state, wl, batch, progress)
            continue
        if compiled:
            torch._dynamo.reset()  # fresh compile per row (and no recompile-limit fallback)
            fn = torch.compile(
                lambda b_, a_, d_: bn.to_cartesian(b_, a_, d_, table, method="scan"), fullgraph=True
            )
        else:
            fn = _bind(table, method)
        note = ""
        if method == "auto":
            try:
                from ._dispatch import choose_method

                note = f"auto -> {choose_method(table, torch.Size([batch]), torch.device(dev))}"
            except Exception:  # private helper moved: no annotation
                note = ""
        for pass_ in passes or PASSES:
            label = f"{wl.name} N={n} B={batch} {method} {PASS_LABEL[pass_]}"
            rec = Timing(wl.name, n, batch, method, "ours", pass_, note=note)
            if state.emit:
                print(json.dumps({"start": pass_}), flush=True)
            reason = state.skip_reason(wl.name, n, batch, method, pass_)
            if reason:
                rec.status = reason
            else:
                try:
                    step = make_step(fn, (b, a, d), pass_, w, q)
                    if compiled:  # first call compiles; report it separately
                        t0 = time.perf_counter()
                        step()
                        _sync(dev)
                        rec.compile_s = time.perf_counter() - t0
                    rec.median_s, rec.runs = measure(step, state.repeats, state.budget_s, dev)
                except Exception as exc:  # record and keep going
                    rec.status = _short_error(exc)
            state.timings.append(rec)
            if state.emit:
                print(json.dumps(_timing_dict(rec)), flush=True)
            progress.update(label)


_COMPILE_CHILD = r"""
import json, sys
spec = json.loads(sys.stdin.read())
sys.path[:0] = spec["path"]
import numpy as np
from batched_nerf import _bench as B
state = B._State(quick=False, device=spec["device"], repeats=spec["repeats"], budget_s=spec["budget_s"],
                 step_limit_s=float("inf"), deadline=float("inf"), isolate_compile=False, emit=True)
wl = B.Workload(spec["workload"], np.asarray(spec["refs"], dtype=np.int64), [spec["batch"]])
B._time_ours(state, wl, spec["batch"], [B.COMPILED], B._Progress(0, False), passes=spec["passes"])
"""


def _time_compiled_isolated(state: _State, wl: Workload, batch: int, progress: _Progress) -> None:
    """Compiled rows in a fresh subprocess, so that a crash in generated code
    (segfault) is recorded as a failure instead of ending the suite."""
    n = wl.n_atoms
    recs: dict[str, Timing] = {}
    todo: list[str] = []
    for pass_ in PASSES:
        reason = state.skip_reason(wl.name, n, batch, COMPILED, pass_)
        if reason:
            recs[pass_] = Timing(wl.name, n, batch, COMPILED, "ours", pass_, status=reason)
        else:
            todo.append(pass_)
    if todo:
        spec = {
            "path": [str(Path(__file__).resolve().parent.parent)],
            "device": state.device,
            "repeats": state.repeats,
            "budget_s": state.budget_s,
            "workload": wl.name,
            "refs": wl.refs.tolist(),
            "batch": batch,
            "passes": todo,
        }
        current = todo[0]
        try:
            res = subprocess.run(
                [sys.executable, "-c", _COMPILE_CHILD],
                input=json.dumps(spec),
                capture_output=True,
                text=True,
                timeout=300,
            )
            stdout, stderr, rc = res.stdout, res.stderr, res.returncode
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            stderr, rc = "compile+timing subprocess timed out after 300 s", None
        for line in stdout.splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if "start" in obj:
                current = obj["start"]
            elif "pass" in obj:
                obj["pass_"] = obj.pop("pass")
                recs[obj["pass_"]] = Timing(**obj)
        if rc != 0:
            why = _crash_reason(rc, stderr)
            for pass_ in todo:
                if pass_ not in recs:
                    status = (
                        f"failed: {why}" if pass_ == current else f"skipped: subprocess died in {current}"
                    )
                    recs[pass_] = Timing(wl.name, n, batch, COMPILED, "ours", pass_, status=status)
    for pass_ in PASSES:
        state.timings.append(recs[pass_])
        progress.update(f"{wl.name} N={n} B={batch} {COMPILED} {PASS_LABEL[pass_]}")


def _crash_reason(rc: int | None, stderr: str) -> str:
    import signal

    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    hint = next(
        (
            ln
            for ln in lines
            if "corruption" in ln or "corrupted" in ln or "double free" in ln or "Error" in ln
        ),
        lines[-1] if lines else "",
    )
    if rc is None:
        return hint
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = str(-rc)
        return f"process killed by {name} ({hint[:120]})"
    return f"exit code {rc} ({hint[:120]})"


def _bind(table: bn.ConstructionTable, method: str) -> Callable[..., torch.Tensor]:
    def fn(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return bn.to_cartesian(b, a, d, table, method=method)  # type: ignore[arg-type]

    return fn


# --------------------------------------------------------------------------
# Peers' timings
# --------------------------------------------------------------------------


def _time_torch_loop_general(
    state: _State, peers: ModuleType, wl: Workload, batch: int, progress: _Progress
) -> None:
    """The per-atom loop on any topology (rows put in build order first)."""
    n, dev = wl.n_atoms, state.device
    refs, _ = in_build_order(wl.refs)
    refs_t = torch.from_numpy(refs)
    table = bn.ConstructionTable(refs)
    q = _Committor(table).to(dev)
    b, a, d = make_inputs(n, batch, torch.float32, 0, dev)
    w = _weights(batch, n, torch.float32, dev)

    def build(b_: torch.Tensor, a_: torch.Tensor, d_: torch.Tensor) -> torch.Tensor:
        return peers.loop_build(b_, a_, d_, refs_t)

    for pass_ in PASSES:
        rec = Timing(wl.name, n, batch, "torch-loop", "peer", pass_)
        reason = state.skip_reason(wl.name, n, batch, "torch-loop", pass_)
        if reason:
            rec.status = reason
        else:
            try:
                step = make_step(build, (b, a, d), pass_, w, q)
                rec.median_s, rec.runs = measure(step, state.repeats, state.budget_s, dev)
            except Exception as exc:
                rec.status = _short_error(exc)
        state.timings.append(rec)
        progress.update(f"{wl.name} N={n} B={batch} torch-loop {PASS_LABEL[pass_]}")


def _time_peer_chain(state: _State, peer: Any, n: int, batch: int, progress: _Progress) -> None:
    """A peer adapter on the linear chain (its own setup; extrapolates unbatched peers)."""
    name = peer.name
    passes = ("forward", "forward_backward")
    label = f"chain N={n} B={batch} {name}"
    if peer.loops_over_batch and batch > 1:
        for pass_ in (*passes, "forward_numba"):
            single = [t for t in state.find("chain", name, pass_) if t.n_atoms == n and t.batch == 1]
            rec = Timing("chain", n, batch, name, "peer", pass_, extrapolated=True)
            if single and single[0].median_s is not None:
                rec.median_s = single[0].median_s * batch
                rec.note = f"= {batch} x the B=1 time (no batching in {name})"
            elif pass_ == "forward_numba":
                continue
            else:
                prev = [
                    t
                    for t in state.timings
                    if t.workload == "chain" and t.method == name and t.pass_ == pass_
                ]
                rec.status = next(
                    (t.status for t in prev if t.n_atoms == n and t.batch == 1), "skipped: no B=1 time"
                )
                rec.extrapolated = False
            state.timings.append(rec)
        progress.update(label)
        return
    reasons = {p: state.skip_reason("chain", n, batch, name, p) for p in passes}
    recs: dict[str, Timing] = {}
    if all(reasons.values()):
        for p in passes:
            recs[p] = Timing("chain", n, batch, name, "peer", p, status=str(reasons[p]))
    else:
        try:
            peer.info = {}
            steps = peer.setup(n, batch, torch.float32, 0, "linear")
            for key, step in steps.items():
                rec = Timing("chain", n, batch, name, "peer", key)
                if reasons.get(key):
                    rec.status = str(reasons[key])
                else:
                    try:
                        rec.median_s, rec.runs = measure(step, state.repeats, state.budget_s, "cpu")
                    except Exception as exc:
                        rec.status = _short_error(exc)
                compile_s = peer.info.get(f"compile_{key}_s")
                rec.compile_s = compile_s if isinstance(compile_s, float) else None
                recs[key] = rec
            for key, why in peer.skipped.items():
                recs[key] = Timing("chain", n, batch, name, "peer", key, status=f"n/a: {why}")
        except Exception as exc:
            for p in passes:
                recs[p] = Timing("chain", n, batch, name, "peer", p, status=_short_error(exc))
    for p in passes:
        recs.setdefault(
            p, Timing("chain", n, batch, name, "peer", p, status="n/a: not offered by the adapter")
        )
    state.timings.extend(recs.values())
    progress.update(label)


# --------------------------------------------------------------------------
# Errors and memory
# --------------------------------------------------------------------------


def _error_curve(
    quick: bool,
    device: str,
    peers_list: list[Any],
    deadline: float,
    progress: _Progress | None,
    sizes: list[int] | None = None,
) -> dict[str, Any]:
    small = sizes is not None
    sizes = sizes or ([64, 512, 4096] if quick else [64, 256, 1024, 4096, 16384, 32768])
    has_acc = "accumulate_dtype" in inspect.signature(bn.to_cartesian).parameters
    curve: list[dict[str, Any]] = []
    for n in sizes:
        refs = chain_refs(n)
        table = bn.ConstructionTable(refs)
        b32, a32, d32 = make_inputs(n, 1, torch.float32, 0, device)
        ref = reference_xyz(*(t[0].double().cpu().numpy() for t in (b32, a32, d32)), refs)
        variants: list[tuple[str, dict[str, Any]]] = [
            ("scan float32", {"method": "scan"}),
            ("levels float32", {"method": "levels"}),
        ]
        if has_acc:
            variants.append(
                ("scan float32, float64 accumulation", {"method": "scan", "accumulate_dtype": torch.float64})
            )
        for label, kw in variants:
            entry: dict[str, Any] = {"n_atoms": n, "variant": label}
            if time.perf_counter() > deadline:
                entry["status"] = "skipped: run-time budget used up"
            elif kw["method"] == "levels" and n > (4096 if quick else 32768):
                entry["status"] = "skipped: too long"
            else:
                try:
                    with torch.no_grad():
                        x = bn.to_cartesian(b32, a32, d32, table, **kw)[0].double().cpu().numpy()
                    entry["max_abs_error"] = float(np.abs(x - ref).max())
                    entry["extent"] = float(np.abs(ref).max())
                    entry["status"] = "ok"
                except Exception as exc:
                    entry["status"] = _short_error(exc)
            curve.append(entry)
        if not has_acc:
            curve.append(
                {
                    "n_atoms": n,
                    "variant": "scan float32, float64 accumulation",
                    "status": "n/a: to_cartesian has no accumulate_dtype parameter",
                }
            )
        if progress is not None:
            progress.update(f"error curve N={n}")
    # branched topologies, ours only
    branched: list[dict[str, Any]] = []
    n_br = 512 if quick else 4096
    for name, refs in () if small else (("tree", tree_refs(n_br)), ("protein", protein_refs(n_br // 6))):
        table = bn.ConstructionTable(refs)
        n = len(refs)
        b32, a32, d32 = make_inputs(n, 1, torch.float32, 0, device)
        ref = reference_xyz(*(t[0].double().cpu().numpy() for t in (b32, a32, d32)), refs)
        for method in ("scan", "levels"):
            try:
                with torch.no_grad():
                    x = bn.to_cartesian(b32, a32, d32, table, method=method)[0].double().cpu().numpy()
                branched.append(
                    {
                        "workload": name,
                        "n_atoms": n,
                        "variant": f"{method} float32",
                        "max_abs_error": float(np.abs(x - ref).max()),
                        "status": "ok",
                    }
                )
            except Exception as exc:
                branched.append(
                    {
                        "workload": name,
                        "n_atoms": n,
                        "variant": f"{method} float32",
                        "status": _short_error(exc),
                    }
                )
    # peers (their own float64 loop reference, same float32-rounded inputs)
    peer_err: list[dict[str, Any]] = []
    for peer in peers_list:
        for n in sizes[:1] if small else (512,) if quick else (512, 4096):
            entry = {"peer": peer.name, "n_atoms": n}
            if time.perf_counter() > deadline:
                entry["status"] = "skipped: run-time budget used up"
            else:
                try:
                    entry["max_abs_error"] = float(peer.error_vs_float64(n))
                    entry["status"] = "ok"
                    entry["aligned"] = bool(getattr(peer, "align_for_error", False))
                    entry["dtype"] = "float64" if peer.name == "chemcoord" else "float32"
                except Exception as exc:
                    entry["status"] = _short_error(exc)
            peer_err.append(entry)
    return {
        "reference": "float64 per-atom NeRF loop in plain Python floats on the float32-rounded inputs",
        "accumulate_dtype_available": has_acc,
        "chain_curve": curve,
        "branched": branched,
        "peers": peer_err,
    }


_MEMORY_CHILD = r"""
import json, resource, sys, time
spec = json.loads(sys.argv[1])
sys.path[:0] = spec["path"]
import torch
import batched_nerf as bn
from batched_nerf import _bench as B
n, batch, method, dev = spec["n"], spec["batch"], spec["method"], spec["device"]
refs = B.chain_refs(n) if spec["workload"] == "chain" else B.alanine_refs()
b, a, d = (t.clone().requires_grad_(True) for t in B.make_inputs(n, batch, torch.float32, 0, dev))
w = B._weights(batch, n, torch.float32, dev)
if method == "torch-loop":
    peers, _ = B.load_peers_module()
    r, _ = B.in_build_order(refs)
    rt = torch.from_numpy(r)
    fn = lambda b_, a_, d_: peers.loop_build(b_, a_, d_, rt)
else:
    table = bn.ConstructionTable(refs).prepare(dev)
    fn = B._bind(table, method)
if dev.startswith("cuda"):
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
(fn(b, a, d) * w).sum().backward()
if dev.startswith("cuda"):
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
else:
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
res = {"peak_bytes": peak, "baseline_maxrss_bytes": before * 1024}
print(json.dumps(dict(res, seconds=time.perf_counter() - t0)))
"""


def _memory(
    state: _State, peers_ok: bool, progress: _Progress, rows: list[tuple[str, int, int]] | None = None
) -> list[dict[str, Any]]:
    if rows is None:
        rows = (
            [("chain", 512, 64)]
            if state.quick
            else [
                ("chain", 512, 1),
                ("chain", 4096, 1),
                ("chain", 512, 256),
                ("chain", 4096, 256),
                ("chain", 32768, 64),
                ("alanine_dipeptide", 22, 4096),
            ]
        )
    methods = ["scan", "levels"] + (["torch-loop"] if peers_ok else [])
    root = str(Path(__file__).resolve().parent.parent)
    mem_deadline = time.perf_counter() + (60.0 if state.quick else 300.0)
    out: list[dict[str, Any]] = []
    for wl, n, batch in rows:
        for method in methods:
            entry: dict[str, Any] = {"workload": wl, "n_atoms": n, "batch": batch, "method": method}
            timed = [
                t for t in state.find(wl, method, "forward_backward") if t.n_atoms == n and t.batch == batch
            ]
            if not timed:
                entry["status"] = "skipped: no forward+backward timing for this row (skipped or failed)"
            elif (timed[0].median_s or 0.0) > state.step_limit_s:
                entry["status"] = "skipped: too long"
            elif time.perf_counter() > mem_deadline:
                entry["status"] = "skipped: memory-measurement budget used up"
            else:
                spec = {
                    "path": [root],
                    "workload": wl,
                    "n": n,
                    "batch": batch,
                    "method": method,
                    "device": state.device,
                }
                try:
                    res = subprocess.run(
                        [sys.executable, "-c", _MEMORY_CHILD, json.dumps(spec)],
                        capture_output=True,
                        text=True,
                        timeout=max(60.0, 20 * state.step_limit_s),
                        check=True,
                    )
                    entry.update(json.loads(res.stdout.strip().splitlines()[-1]))
                    entry["bytes_per_atom"] = entry["peak_bytes"] / (n * batch)
                    entry["status"] = "ok"
                except subprocess.CalledProcessError as exc:
                    entry["status"] = f"failed: {(exc.stderr or '').strip().splitlines()[-1:]}"
                except Exception as exc:
                    entry["status"] = _short_error(exc)
            out.append(entry)
            progress.update(f"memory {wl} N={n} B={batch} {method}")
    return out


# --------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------


def _machine(device: str) -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as fh:
            mem = int(fh.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "batched_nerf": bn.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": mem,
        "device": device,
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    for mod in ("chemcoord", "jax", "mp_nerf"):
        try:
            m = importlib.import_module(mod) if mod in sys.modules else None
            if m is not None:
                info[f"{mod}_version"] = getattr(m, "__version__", "?")
        except ImportError:
            pass
    return info


def _get(state: _State, workload: str, n: int, batch: int, method: str, pass_: str) -> Timing | None:
    for t in state.timings:
        if (t.workload, t.n_atoms, t.batch, t.method, t.pass_) == (workload, n, batch, method, pass_):
            return t
    return None


def _best_ours(
    state: _State, workload: str, n: int, batch: int, pass_: str, compiled: bool = False
) -> Timing | None:
    methods = [*OURS, COMPILED] if compiled else list(OURS)
    cands = [_get(state, workload, n, batch, m, pass_) for m in methods]
    ok = [t for t in cands if t is not None and t.status == "ok" and t.median_s is not None]
    return min(ok, key=lambda t: t.median_s or math.inf) if ok else None


def _speedups(state: _State) -> list[dict[str, Any]]:
    out = []
    for t in state.timings:
        if t.kind != "peer" or t.status != "ok" or t.median_s is None:
            continue
        pass_ = "forward" if t.pass_ == "forward_numba" else t.pass_
        best = _best_ours(state, t.workload, t.n_atoms, t.batch, pass_)
        auto = _get(state, t.workload, t.n_atoms, t.batch, "auto", pass_)
        if best is None or best.median_s is None:
            continue
        out.append(
            {
                "workload": t.workload,
                "n_atoms": t.n_atoms,
                "batch": t.batch,
                "pass": t.pass_,
                "peer": t.method,
                "peer_s": t.median_s,
                "peer_extrapolated": t.extrapolated,
                "ours_method": best.method,
                "ours_s": best.median_s,
                "speedup": t.median_s / best.median_s,
                "speedup_vs_auto": (t.median_s / auto.median_s)
                if auto and auto.status == "ok" and auto.median_s
                else None,
            }
        )
    return out


def _targets(state: _State) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for (n, batch), figures in NERFAX_TARGETS.items():
        for pass_, target in zip(("forward", "forward_backward"), figures):
            best = _best_ours(state, "chain", n, batch, pass_, compiled=True)
            item: dict[str, Any] = {
                "target": f"chain N={n} B={batch} {PASS_LABEL[pass_]} <= {_fmt(target)} (NeRFax figure)",
                "target_s": target,
            }
            if best is None or best.median_s is None:
                item.update(status="not measured")
            else:
                item.update(
                    ours_s=best.median_s,
                    ours_method=best.method,
                    ratio=best.median_s / target,
                    status="met" if best.median_s <= target else "missed",
                )
            out.append(item)
    for n in (64, 512, 4096, 32768):
        for pass_ in ("forward", "forward_backward"):
            peer_keys = ["forward", "forward_numba"] if pass_ == "forward" else ["forward_backward"]
            best = _best_ours(state, "chain", n, 1, pass_, compiled=True)
            for key in peer_keys:
                cc = _get(state, "chain", n, 1, "chemcoord", key)
                if cc is None:
                    continue
                item = {"target": f">= 5x chemcoord {key}, chain N={n} B=1"}
                if cc.status != "ok" or best is None or cc.median_s is None or best.median_s is None:
                    item["status"] = f"not measured ({cc.status if cc.status != 'ok' else 'ours missing'})"
                else:
                    ratio = cc.median_s / best.median_s
                    item.update(
                        ratio=ratio, ours_method=best.method, status="met" if ratio >= 5 else "missed"
                    )
                out.append(item)
    for method in (*OURS, COMPILED):
        c = _get(state, "alanine_dipeptide", 22, 4096, method, "committor")
        f = _get(state, "alanine_dipeptide", 22, 4096, method, "forward_backward")
        item = {"target": f"committor <= 4x fwd+bwd, alanine dipeptide (22 atoms) B=4096, {method}"}
        if c and f and c.status == "ok" and f.status == "ok" and c.median_s and f.median_s:
            ratio = c.median_s / f.median_s
            item.update(ratio=ratio, status="met" if ratio <= 4 else "missed")
        else:
            item["status"] = "not measured"
        out.append(item)
    rows = []
    for t in state.timings:
        if t.method != COMPILED:
            continue
        eager = _get(state, t.workload, t.n_atoms, t.batch, "scan", t.pass_)
        if t.status == "ok" and eager and eager.status == "ok" and t.median_s and eager.median_s:
            rows.append((t, eager.median_s / t.median_s))
        else:
            rows.append((t, None))
    if rows:
        measured = [r for _, r in rows if r is not None]
        all_ok = bool(measured) and all(r > 1 for r in measured) and len(measured) == len(rows)
        out.append(
            {
                "target": "torch.compile faster than eager scan on every compiled row",
                "status": "met" if all_ok else ("missed" if measured else "not measured"),
                "rows": [
                    {
                        "workload": t.workload,
                        "n_atoms": t.n_atoms,
                        "batch": t.batch,
                        "pass": t.pass_,
                        "eager_over_compiled": r,
                        "status": t.status,
                    }
                    for t, r in rows
                ],
            }
        )
    return out


def _markdown(
    state: _State,
    machine: dict[str, Any],
    errors: dict[str, Any],
    memory: list[dict[str, Any]],
    speedups: list[dict[str, Any]],
    targets: list[dict[str, Any]],
) -> str:
    lines = [
        f"# batched_nerf benchmarks ({'quick' if state.quick else 'full'})",
        "",
        f"torch {machine['torch']}, {machine['torch_threads']} threads, {machine['cpu']} "
        f"({machine['cpu_count']} cores), device {machine['device']}, float32, "
        f"load average at start {_loadavg(machine.get('loadavg_start'))}, "
        f"at end {_loadavg(machine.get('loadavg_end'))}. "
        "Median of repeats after one warm-up (time.perf_counter), whole batch per step. "
        "Compile times (first call) are excluded from medians and listed separately.",
        "",
        "## Timings",
        "",
        "| workload | N | B | method | forward | fwd+bwd | committor | notes |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    keys: list[tuple[str, int, int, str]] = []
    for t in state.timings:
        k = (t.workload, t.n_atoms, t.batch, t.method)
        if k not in keys:
            keys.append(k)
    for wl, n, batch, method in keys:
        cells, notes = [], []
        for pass_ in PASSES:
            t = _get(state, wl, n, batch, method, pass_)
            if t is None:
                cells.append("-")
                continue
            if t.status == "ok":
                cells.append(_fmt(t.median_s) + (" (xB)" if t.extrapolated else ""))
            else:
                cells.append(t.status)
            if t.compile_s is not None:
                notes.append(f"compile {PASS_LABEL[pass_]} {t.compile_s:.1f} s")
            if t.note and t.note not in notes and not t.extrapolated:
                notes.append(t.note)
        extra = _get(state, wl, n, batch, method, "forward_numba")
        if extra is not None and extra.status == "ok":
            notes.append(f"numba core get_X {_fmt(extra.median_s)}" + (" (xB)" if extra.extrapolated else ""))
        lines.append(f"| {wl} | {n} | {batch} | {method} | {' | '.join(cells)} | {'; '.join(notes)} |")
    lines += ["", "(xB): peer without batching, B x its B=1 time.", ""]

    if speedups:
        lines += [
            "## Speed-up of ours vs each peer (peer time / our best eager time, same run)",
            "",
            "| workload | N | B | pass | peer | peer time | ours (method) | speed-up |",
            "|---|---:|---:|---|---|---:|---:|---:|",
        ]
        for s in speedups:
            lines.append(
                f"| {s['workload']} | {s['n_atoms']} | {s['batch']} | {s['pass']} | {s['peer']} | "
                f"{_fmt(s['peer_s'])}{' (xB)' if s['peer_extrapolated'] else ''} | "
                f"{_fmt(s['ours_s'])} ({s['ours_method']}) | {s['speedup']:.3g}x |"
            )
        lines.append("")

    lines += [
        "## float32 max coordinate error vs float64 reference (linear chain)",
        "",
        f"Reference: {errors['reference']}.",
        "",
    ]
    variants = list(dict.fromkeys(e["variant"] for e in errors["chain_curve"]))
    sizes = list(dict.fromkeys(e["n_atoms"] for e in errors["chain_curve"]))
    lines += ["| variant | " + " | ".join(f"N={n}" for n in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for v in variants:
        cells = []
        for n in sizes:
            e = next((e for e in errors["chain_curve"] if e["variant"] == v and e["n_atoms"] == n), None)
            cells.append(
                "-" if e is None else (f"{e['max_abs_error']:.2e}" if e["status"] == "ok" else e["status"])
            )
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    lines.append("")
    if errors["branched"]:
        lines += ["| branched workload | N | variant | max error |", "|---|---:|---|---:|"]
        for e in errors["branched"]:
            val = f"{e['max_abs_error']:.2e}" if e["status"] == "ok" else e["status"]
            lines.append(f"| {e['workload']} | {e['n_atoms']} | {e['variant']} | {val} |")
        lines.append("")
    if errors["peers"]:
        lines += ["| peer | N | max error | notes |", "|---|---:|---:|---|"]
        for e in errors["peers"]:
            val = f"{e['max_abs_error']:.2e}" if e["status"] == "ok" else e["status"]
            extra = []
            if e.get("aligned"):
                extra.append("after Kabsch fit")
            if e.get("dtype") == "float64":
                extra.append("float64 only")
            lines.append(f"| {e['peer']} | {e['n_atoms']} | {val} | {', '.join(extra)} |")
        lines.append("")

    lines += [
        "## Peak memory of one forward+backward",
        "",
        "Increase of the peak resident set size (getrusage ru_maxrss) during one forward+backward "
        "in a fresh subprocess, after inputs and tables exist (CUDA: torch.cuda.max_memory_allocated "
        "above the baseline). Includes the autograd graph and allocator overhead; a lower bound if the "
        "step peaks below the process's earlier peak.",
        "",
        "| workload | N | B | method | peak | bytes per atom |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for m in memory:
        if m["status"] == "ok":
            lines.append(
                f"| {m['workload']} | {m['n_atoms']} | {m['batch']} | {m['method']} | "
                f"{m['peak_bytes'] / 2**20:.1f} MiB | {m['bytes_per_atom']:.0f} |"
            )
        else:
            lines.append(
                f"| {m['workload']} | {m['n_atoms']} | {m['batch']} | {m['method']} | {m['status']} | |"
            )
    lines += ["", "## Targets", "", "| target | result | status |", "|---|---|---|"]
    for t in targets:
        if "rows" in t:
            meas = [r for r in t["rows"] if r["eager_over_compiled"] is not None]
            res = ", ".join(
                f"N={r['n_atoms']} B={r['batch']} {PASS_LABEL.get(r['pass'], r['pass'])}: "
                f"{r['eager_over_compiled']:.2f}x"
                for r in meas
            )
            bad = [r for r in t["rows"] if r["eager_over_compiled"] is None]
            if bad:
                res += f"; {len(bad)} compiled rows not measured"
            lines.append(f"| {t['target']} | eager/compiled {res} | {t['status']} |")
        elif "ours_s" in t:
            lines.append(
                f"| {t['target']} | {_fmt(t['ours_s'])} ({t['ours_method']}), "
                f"{t['ratio']:.3g}x the target | {t['status']} |"
            )
        elif "ratio" in t:
            lines.append(f"| {t['target']} | {t['ratio']:.3g}x | {t['status']} |")
        else:
            lines.append(f"| {t['target']} | - | {t['status']} |")
    if state.notes:
        lines += ["", "## Notes", ""] + [f"* {n}" for n in state.notes]
    return "\n".join(lines) + "\n"


def _loadavg(v: list[float] | None) -> str:
    return "n/a" if not v else " / ".join(f"{x:.2f}" for x in v)


def _plot(state: _State, errors: dict[str, Any], out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        state.notes.append("matplotlib not installed: no plots")
        return []
    written = []
    fig, axes = plt.subplots(1, 2, figsize=(14, 6), sharey=True)
    methods = list(
        dict.fromkeys(t.method for t in state.timings if t.workload == "chain" and t.pass_ != "forward_numba")
    )
    cmap = plt.get_cmap("tab20")
    styles = {"forward": "-", "forward_backward": "--", "committor": ":"}
    for ax, batch in zip(axes, (1, 64)):
        for i, method in enumerate(methods):
            for pass_ in ("forward", "forward_backward"):
                pts = sorted(
                    (t.n_atoms, t.median_s)
                    for t in state.timings
                    if t.workload == "chain"
                    and t.method == method
                    and t.pass_ == pass_
                    and t.batch == batch
                    and t.status == "ok"
                    and t.median_s is not None
                )
                if not pts:
                    continue
                xs, ys = zip(*pts)
                ax.plot(
                    xs,
                    ys,
                    styles[pass_],
                    marker="o",
                    ms=4,
                    color=cmap(i % 20),
                    label=f"{method} {PASS_LABEL[pass_]}",
                )
        if batch == 1:
            for (n, b), (f, fb) in NERFAX_TARGETS.items():
                if b == 1:
                    ax.plot([n], [f], "k*", ms=10)
                    ax.plot([n], [fb], "kx", ms=9)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("atoms N (linear chain)")
        ax.set_title(
            f"batch {batch}" + (" (black: NeRFax target figures, * fwd, x f+b)" if batch == 1 else "")
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("median time per step (s)")
    handles, labels = axes[0].get_legend_handles_labels()
    h2, l2 = axes[1].get_legend_handles_labels()
    for h, lab in zip(h2, l2):
        if lab not in labels:
            handles.append(h)
            labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("batched_nerf vs peers, float32 CPU: solid = forward, dashed = forward+backward")
    fig.tight_layout(rect=(0, 0.18, 1, 0.95))
    path = out / "time_vs_atoms.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path.name)

    fig, ax = plt.subplots(figsize=(7, 5))
    for variant in dict.fromkeys(e["variant"] for e in errors["chain_curve"]):
        pts = [
            (e["n_atoms"], e["max_abs_error"])
            for e in errors["chain_curve"]
            if e["variant"] == variant and e["status"] == "ok"
        ]
        if pts:
            ax.plot(*zip(*pts), "-o", label=variant)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("atoms N (linear chain)")
    ax.set_ylabel("max |x_float32 - x_float64_ref|")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title("float32 coordinate error vs chain length")
    fig.tight_layout()
    path = out / "error_vs_atoms.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path.name)
    return written


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def _plan(
    quick: bool, compile_: bool, peers_list: list[Any], workloads: list[Workload]
) -> Iterator[tuple[str, Workload, int]]:
    for wl in workloads:
        for batch in wl.batches:
            yield "ours", wl, batch
            if peers_list:
                yield "loop", wl, batch
                if wl.name == "chain":
                    yield "peers", wl, batch


def run_benchmarks(
    quick: bool = True,
    out_dir: str | None = None,
    nerfax: str | None = None,
    bgflow: str | None = None,
    peers: bool = True,
    compile: bool | None = None,
    progress: bool = True,
    *,
    device: str = "cpu",
    repeats: int | None = None,
    sizes: list[int] | None = None,
    batches: list[int] | None = None,
    time_budget_s: float | None = None,
    memory: bool = True,
    workloads: list[str] | None = None,
    errors: bool = True,
) -> str:
    """Run the benchmark suite and return its results as a Markdown report.

    Times forward, forward+backward (``(x * w).sum().backward()`` for a fixed
    random ``w``) and a committor pass (``q`` = a fixed tiny MLP on
    :func:`~batched_nerf.to_internal` features; ``g = dq/dx`` with
    ``create_graph=True``; ``(g**2).sum().backward()``) for our engines
    (``levels``, ``scan``, ``auto``, and ``scan`` under
    ``torch.compile(fullgraph=True)``) and for the peers of
    ``benchmarks/peers.py`` on linear chains, random trees, a protein-like
    backbone with side chains and alanine dipeptide; speed-ups vs each peer
    from the same run; float32 error vs a float64 reference loop (with an
    error-vs-length curve); peak memory of forward+backward; and the target
    checks. Rows that would exceed a 12 GB memory estimate, a per-step time
    limit or the suite's run-time budget are reported as ``"skipped: why"``.

    Args:
        quick: small grid (chains N 64/512/4096 and branched molecules, batch
            1/64; torch-loop the only peer; no compile unless asked), about
            1–2 minutes on 2 CPU cores. ``False``: the whole grid (chains up to
            32768 atoms, batch up to 1024 and 256 for the target rows, all
            peers, compile), about 20–35 minutes.
        out_dir: when given, writes ``results.md``, ``results.json`` (all raw
            numbers and machine information) and ``time_vs_atoms.png`` (plus
            ``error_vs_atoms.png``) there; created if missing.
        nerfax: path of a NeRFax checkout (full mode only).
        bgflow: path of a bgflow checkout (full mode only).
        peers: compare with peers when ``benchmarks/peers.py`` is found (it
            is part of the repository, not of the installed package).
        compile: time ``scan`` under ``torch.compile`` on a few rows (compile
            time reported separately). ``None``: on in full mode, off in quick.
        progress: show a progress bar (tqdm if installed, else a counter on
            stderr).
        device: ``"cpu"`` or ``"cuda"`` (timed with ``torch.cuda.synchronize``;
            peers always run on the CPU).
        repeats: timed runs per measurement after one warm-up (default 3
            quick, 5 full).
        sizes: time only linear chains of these sizes (no branched
            workloads; error curve over these sizes; one memory row); for
            small test runs.
        batches: batch sizes of every workload (replacing the defaults).
        time_budget_s: wall-clock budget of the timing part; later rows are
            skipped with a note (default 150 s quick, 1800 s full).
        memory: measure peak memory of forward+backward in subprocesses.
        workloads: time only these workloads (``"chain"``, ``"tree"``,
            ``"protein"``, ``"alanine_dipeptide"``); error curve and memory
            rows are unaffected.
        errors: measure the float32 error (and error-vs-length curve).

    Returns:
        The Markdown report (also ``results.md`` when ``out_dir`` is given).

    Raises:
        ValueError: unknown ``device``.
    """
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    compile_ = (not quick) if compile is None else bool(compile)
    state = _State(
        quick=quick,
        device=device,
        repeats=repeats or (3 if quick else 5),
        budget_s=2.0 if quick else 6.0,
        step_limit_s=1.5 if quick else 12.0,
        deadline=0.0,
    )
    t_start = time.perf_counter()
    budget = time_budget_s if time_budget_s is not None else (150.0 if quick else 1500.0)
    state.deadline = t_start + budget
    machine = _machine(device)

    grid = _workloads(quick)
    if sizes is not None:
        grid = [Workload("chain", chain_refs(n), [1, 64]) for n in sizes]
    if workloads is not None:
        grid = [w for w in grid if w.name in workloads]
    if batches is not None:
        for w in grid:
            w.batches = list(batches)
    mem_rows = [("chain", grid[0].n_atoms, grid[0].batches[-1])] if sizes is not None and grid else None

    peers_mod: ModuleType | None = None
    peers_list: list[Any] = []
    if peers:
        peers_mod, why = load_peers_module()
        if peers_mod is None:
            state.notes.append(why)
        else:
            all_peers = peers_mod.get_peers(nerfax_path=nerfax, bgflow_path=bgflow)
            wanted = {"torch-loop"} if quick else {p.name for p in all_peers}
            for p in all_peers:
                if p.name not in wanted:
                    continue
                if p.name.startswith("nerfax") and not nerfax:
                    state.notes.append(f"{p.name}: skipped, no --nerfax PATH given")
                elif p.name == "bgflow" and not bgflow:
                    state.notes.append("bgflow: skipped, no --bgflow PATH given")
                elif not p.available:
                    state.notes.append(f"{p.name}: {p.reason}")
                else:
                    peers_list.append(p)
            if quick:
                state.notes.append("quick mode: torch-loop is the only peer (full mode runs them all)")
    else:
        state.notes.append("peers disabled (peers=False)")
    machine["peers"] = [p.name for p in peers_list]
    for mod in ("chemcoord", "jax", "mp_nerf"):
        if mod in sys.modules:
            machine[f"{mod}_version"] = getattr(sys.modules[mod], "__version__", "?")
    if device != "cpu" and peers_list:
        state.notes.append("peers run on the CPU even with device=cuda")

    compile_rows = _compile_rows(quick) if compile_ else set()
    if compile_:
        state.notes.append(
            "torch.compile(fullgraph=True) of scan is timed only on rows "
            + ", ".join(f"{w} N={n} B={b}" for w, n, b in sorted(compile_rows))
            + " (each compile costs tens of seconds)"
        )
    plan = list(_plan(quick, compile_, peers_list, grid))
    chain_peers = [p for p in peers_list if p.name != "torch-loop"]
    n_err = 0 if not errors else len(sizes) if sizes is not None else (3 if quick else 6)
    n_mem = 0
    if memory:
        n_mem = (1 if quick or mem_rows else 6) * (3 if peers_mod is not None and peers_list else 2)
    total = (
        sum(
            (len(OURS) + ((wl.name, wl.n_atoms, b) in compile_rows)) * len(PASSES)
            if kind == "ours"
            else (len(PASSES) if kind == "loop" else len(chain_peers))
            for kind, wl, b in plan
        )
        + n_err
        + n_mem
    )
    bar = _Progress(total, progress)
    try:
        for kind, wl, batch in plan:
            if kind == "ours":
                methods = list(OURS)
                if (wl.name, wl.n_atoms, batch) in compile_rows:
                    methods.append(COMPILED)
                _time_ours(state, wl, batch, methods, bar)
            elif kind == "loop":
                assert peers_mod is not None
                _time_torch_loop_general(state, peers_mod, wl, batch, bar)
            else:
                for peer in chain_peers:
                    _time_peer_chain(state, peer, wl.n_atoms, batch, bar)
        err_deadline = time.perf_counter() + (60.0 if quick else 300.0)
        err = (
            _error_curve(quick, device, peers_list, err_deadline, bar, sizes)
            if errors
            else {"reference": "not measured (errors=False)", "chain_curve": [], "branched": [], "peers": []}
        )
        if peers_mod is not None and errors:
            n = 512
            refs = chain_refs(n)
            b32, a32, d32 = make_inputs(n, 1, torch.float32, 0)
            ref = reference_xyz(*(t[0].double().numpy() for t in (b32, a32, d32)), refs)
            with torch.no_grad():
                loop64 = peers_mod.loop_build(
                    b32.double(), a32.double(), d32.double(), torch.from_numpy(refs)
                )
            err["reference_check"] = {
                "n_atoms": n,
                "max_abs_diff_python_ref_vs_peers_loop_float64": float(np.abs(loop64[0].numpy() - ref).max()),
            }
        mem = _memory(state, peers_mod is not None and bool(peers_list), bar, mem_rows) if memory else []
    finally:
        bar.close()
    machine["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    machine["wall_s"] = time.perf_counter() - t_start
    speedups = _speedups(state)
    targets = _targets(state)
    report = _markdown(state, machine, err, mem, speedups, targets)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        plots = _plot(state, err, out)
        if plots:
            report += "\n" + "\n".join(f"![{p}]({p})" for p in plots) + "\n"
        (out / "results.md").write_text(report)
        payload = {
            "machine": machine,
            "config": {
                "quick": quick,
                "device": device,
                "repeats": state.repeats,
                "measure_budget_s": state.budget_s,
                "step_limit_s": state.step_limit_s,
                "time_budget_s": budget,
                "memory_budget_bytes": MEMORY_BUDGET_BYTES,
                "compile": compile_,
                "compile_rows": sorted(compile_rows),
                "nerfax": nerfax,
                "bgflow": bgflow,
                "dtype": "float32",
                "workloads": [{"name": w.name, "n_atoms": w.n_atoms, "batches": w.batches} for w in grid],
            },
            "timings": [_timing_dict(t) for t in state.timings],
            "speedups": speedups,
            "errors": err,
            "memory": mem,
            "targets": targets,
            "nerfax_target_figures_s": {f"{n}x{b}": list(v) for (n, b), v in NERFAX_TARGETS.items()},
            "notes": state.notes,
        }
        (out / "results.json").write_text(json.dumps(payload, indent=1))
    return report


def _timing_dict(t: Timing) -> dict[str, Any]:
    d = asdict(t)
    d["pass"] = d.pop("pass_")
    return d
