"""Side-by-side probe of the scan engine on chains: ours vs the per-atom loop, NeRFax, chemcoord.

Every contender of a row is timed in the same process, interleaved call by call
(median of ``--repeats`` rounds), float32, ``torch.get_num_threads()`` threads.

Run (peers need the peers venv, which sees the system torch)::

    PYTHONPATH=$PWD /work/peers/venv/bin/python benchmarks/scan_probe.py --nerfax /work/peers/nerfax

Options select rows (``--rows 512x256 4096x1``), passes, the compiled path
(``--compiled``), float32 errors vs float64 (``--errors 4096 30000``) and the
peak memory of forward+backward (``--memory 4096x256``, in a subprocess).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers

import batched_nerf as bn

Step = Callable[[], object]
DEFAULT_ROWS = ("512x256", "512x1024", "4096x64", "4096x256", "512x1", "4096x1")


class Committor(torch.nn.Module):
    """q(x) = sigmoid(mean MLP(bond, sin/cos angle, sin/cos dihedral)) of x's internal coordinates."""

    def __init__(self, table: bn.ConstructionTable) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = table
        self.mlp = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        for p in self.mlp.parameters():
            p.requires_grad_(False)

    def forward(self, xyz: torch.Tensor) -> torch.Tensor:
        ic = bn.to_internal(xyz, self.table)
        a, d = ic.angles, ic.dihedrals
        feats = torch.stack([ic.bonds, a.sin(), a.cos(), d.sin(), d.cos()], dim=-1)
        return torch.sigmoid(self.mlp(feats).mean(dim=(-2, -1)))


def steps_for(build: Callable[..., torch.Tensor], ic, w, q, passes) -> dict[str, Step]:
    out: dict[str, Step] = {}
    leaves = [t.clone().requires_grad_(True) for t in ic]
    plain = [t.clone() for t in ic]

    def forward() -> object:
        with torch.no_grad():
            return build(*plain)

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

    for name, fn in (("forward", forward), ("fwd+bwd", forward_backward), ("committor", committor)):
        if name in passes:
            out[name] = fn
    return out


def interleaved(steps: dict[str, Step], repeats: int, budget_s: float, pause: float) -> dict[str, float]:
    """Median seconds of each step, all steps called in turn each round.

    ``pause`` seconds of sleep before each call let the other runtime's worker
    threads (JAX's spin-waiting pool, torch's OpenMP team) go idle first: on a
    2-core machine a call right after another runtime's can run 10x slower.
    """
    for f in steps.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in steps}
    start = time.perf_counter()
    for r in range(repeats):
        for k, f in steps.items():
            time.sleep(pause)
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
        if r >= 2 and time.perf_counter() - start > budget_s:
            break
    return {k: statistics.median(v) for k, v in times.items()}


def fmt(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def row(n: int, batch: int, args: argparse.Namespace) -> None:
    table = bn.ConstructionTable.chain(n)
    refs = peers.make_refs(n)
    ic = peers.make_internal_coords(n, batch, torch.float32, 0)
    w = torch.from_numpy(peers._cotangent((batch, n, 3), 0)).float()
    q = Committor(table)
    passes = args.passes
    steps: dict[str, Step] = {}
    info: list[str] = []

    def ours(b, a, d):
        return bn.to_cartesian(b, a, d, table, method="scan")

    for k, f in steps_for(ours, ic, w, q, passes).items():
        steps[f"ours/{k}"] = f
    if args.compiled:
        from batched_nerf import compile_builder

        t0 = time.perf_counter()
        comp = compile_builder(table)
        cpasses = [p for p in passes if p != "committor"]
        csteps = steps_for(comp, ic, w, q, cpasses)
        for f in csteps.values():
            f()
        info.append(f"compile {time.perf_counter() - t0:.1f} s")
        for k, f in csteps.items():
            steps[f"compiled/{k}"] = f
    if not args.no_loop and n * batch <= args.loop_max:

        def loop(b, a, d):
            return peers.loop_build(b, a, d, refs)

        for k, f in steps_for(loop, ic, w, q, passes).items():
            steps[f"loop/{k}"] = f
    if args.nerfax:
        for mode in peers.NerfaxPeer.modes:
            peer = peers.NerfaxPeer(mode, args.nerfax)
            if not peer.available:
                info.append(f"nerfax {mode}: {peer.reason}")
                continue
            s = peer.setup(n, batch, torch.float32, 0)
            steps[f"nerfax-{mode}/forward"] = s["forward"]
            if "fwd+bwd" in passes:
                steps[f"nerfax-{mode}/fwd+bwd"] = s["forward_backward"]
    if batch == 1:
        cc = peers.ChemcoordPeer()
        if cc.available:
            steps["chemcoord-get_X/forward"] = cc.setup(n, 1, torch.float64, 0)["forward_numba"]
    t = interleaved(steps, args.repeats, args.budget, args.pause)
    print(f"\n### chain N={n} B={batch} ({'; '.join(info)})")
    for k, v in t.items():
        print(f"  {k:32s} {fmt(v)}")
    for p in passes:
        base = t.get(f"ours/{p}")
        if base is None:
            continue
        for k, v in t.items():
            if k.endswith(f"/{p}") and not k.startswith("ours/"):
                print(f"  ratio {p}: ours eager is {v / base:.2f}x faster than {k.split('/')[0]}")
        if f"compiled/{p}" in t:
            c = t[f"compiled/{p}"]
            for k, v in t.items():
                if k.endswith(f"/{p}") and not k.startswith(("ours/", "compiled/")):
                    print(f"  ratio {p}: ours compiled is {v / c:.2f}x faster than {k.split('/')[0]}")
    if "committor" in passes and "ours/committor" in t:
        print(f"  committor / fwd+bwd (ours eager): {t['ours/committor'] / t['ours/fwd+bwd']:.2f}")
    if batch == 1 and "chemcoord-get_X/forward" in t:
        print(
            "  ratio forward: ours eager is "
            f"{t['chemcoord-get_X/forward'] / t['ours/forward']:.2f}x chemcoord"
        )


def errors(sizes: list[int], nerfax: str | None) -> None:
    print("\n### float32 max |x - x_float64| (same float32-rounded inputs)")
    for n in sizes:
        refs, (b, a, d), ref = peers.reference_build(n, 0)
        table = bn.ConstructionTable.chain(n)
        with torch.no_grad():
            x = bn.to_cartesian(b, a, d, table, method="scan")[0].double().numpy()
        line = f"  N={n}: ours {np.abs(x - ref).max():.2e}"
        if nerfax:
            for mode in peers.NerfaxPeer.modes:
                peer = peers.NerfaxPeer(mode, nerfax)
                if peer.available:
                    line += f"; nerfax-{mode} {peer.error_vs_float64(n):.2e}"
        print(line, flush=True)


_MEMORY_CHILD = r"""
import json, sys
sys.path[:0] = {path!r}
import torch, batched_nerf as bn, peers
torch.set_num_threads(1)
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
n, batch = {n}, {batch}
table = bn.ConstructionTable.chain(n)
b, a, d = (t.clone().requires_grad_(True) for t in peers.make_internal_coords(n, batch, torch.float32, 0))
w = torch.from_numpy(peers._cotangent((batch, n, 3), 0)).float()
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current RSS
    f.write("5")
(bn.to_cartesian(b, a, d, table, method="scan") * w).sum().backward()
peak = status("VmHWM:") - before
print(json.dumps({{"peak_bytes": peak, "bytes_per_atom": peak / (n * batch)}}))
"""


def memory(n: int, batch: int) -> None:
    here = Path(__file__).resolve().parent
    code = _MEMORY_CHILD.format(path=[str(here.parent), str(here)], n=n, batch=batch)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"\n### peak memory of forward+backward, chain N={n} B={batch}: "
        f"{res['peak_bytes'] / 2**20:.0f} MiB, {res['bytes_per_atom']:.0f} bytes per atom-sample"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS), help="NxB")
    parser.add_argument("--passes", nargs="*", default=["forward", "fwd+bwd", "committor"])
    parser.add_argument("--nerfax", metavar="PATH")
    parser.add_argument("--compiled", action="store_true", help="also time bn.compile_builder")
    parser.add_argument("--no-loop", action="store_true")
    parser.add_argument("--loop-max", type=int, default=1 << 21, help="skip the loop above N*B")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per row")
    parser.add_argument("--pause", type=float, default=0.05, help="sleep before each timed call")
    parser.add_argument("--errors", nargs="*", type=int, default=[])
    parser.add_argument("--memory", nargs="*", default=[], help="NxB rows")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, float32")
    for spec in args.rows:
        n, batch = (int(v) for v in spec.split("x"))
        row(n, batch, args)
    if args.errors:
        errors(args.errors, args.nerfax)
    for spec in args.memory:
        memory(*(int(v) for v in spec.split("x")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
