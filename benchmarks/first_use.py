"""First use of the fused CPU kernels on an empty numba cache (each measurement its own process).

(a) the committor pattern (builder ``to_cartesian`` forward + backward, then ``to_internal``
with a ``create_graph=True`` gradient and its backward) at 1 sample, then at 64 samples;
(b) a first forward-only ``to_cartesian``; (c) after ``batched_nerf.warmup()`` into the same
(then warm) cache, the committor pattern's first call in a new process. (a) runs with the
default tiered compilation (the 64-sample calls take the per-sample kernels until the blocked
ones are cached or have become worth their compile, ``batched_nerf/engines/fused/cpu/tiers.py``);
``a_untiered_total_s`` is (a) with ``BATCHED_NERF_TIERED=0``, every blocked kernel compiled at
its first call.
Targets: (a) <= 10 s total, (b) <= 3 s, (c) < 1 s. Timings on a shared machine are noisy.

Run: ``python benchmarks/first_use.py`` (minutes: everything compiles from scratch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_PATTERN = """
import json, sys, time
t_import = time.perf_counter()
import torch
import batched_nerf as bn
from batched_nerf.data import load
t_import = time.perf_counter() - t_import
mol = load("alanine_dipeptide")

def committor(n):
    b0, a0, d0 = (v.float() for v in (mol.bonds, mol.angles, mol.dihedrals))
    b = b0.expand(n, -1).clone().requires_grad_()
    a = a0.expand(n, -1).clone().requires_grad_()
    d = (d0 + 0.1 * torch.randn(n, d0.numel())).requires_grad_()
    xyz = bn.to_cartesian(b, a, d, mol.table, method="fused")
    xyz.sum().backward()
    x = xyz.detach().requires_grad_()
    ic = bn.to_internal(x, mol.table, method="fused")
    (g,) = torch.autograd.grad(ic.dihedrals.sin().sum() + ic.bonds.sum(), x, create_graph=True)
    (g * g).sum().backward()

def forward(n):
    b, a, d = (v.float().expand(n, -1) for v in (mol.bonds, mol.angles, mol.dihedrals))
    bn.to_cartesian(b, a, d, mol.table, method="fused")

out = {"import_s": t_import}
for what in sys.argv[1:]:
    kind, n = what.split(":")
    t = time.perf_counter()
    (committor if kind == "committor" else forward)(int(n))
    out[what] = time.perf_counter() - t
print("RESULT", json.dumps(out))
"""


def _run(cache: str, *what: str, tiered: bool = True) -> dict[str, float]:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    env.pop("BATCHED_NERF_TIERED", None)  # the default: tiered compilation of the blocked kernels
    if not tiered:
        env["BATCHED_NERF_TIERED"] = "0"
    proc = subprocess.run(
        [sys.executable, "-c", _PATTERN, *what], env=env, capture_output=True, text=True, check=True
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def main() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        with tempfile.TemporaryDirectory() as c:
            untiered = _run(c, "committor:1", "committor:64", tiered=False)
        cold = _run(a, "committor:1", "committor:64")
        first_forward = _run(b, "forward:1")
        env = dict(os.environ, NUMBA_CACHE_DIR=b, PYTHONPATH=str(ROOT))
        warm_cmd = [sys.executable, "-m", "batched_nerf", "warmup", "-q"]
        subprocess.run(warm_cmd, env=env, check=True, capture_output=True)
        warm = _run(b, "committor:1", "committor:64")
    result = {
        "a_committor_1_s": cold["committor:1"],
        "a_committor_64_s": cold["committor:64"],
        "a_total_s": cold["committor:1"] + cold["committor:64"],
        "a_untiered_total_s": untiered["committor:1"] + untiered["committor:64"],
        "b_first_forward_s": first_forward["forward:1"],
        "c_after_warmup_first_call_s": warm["committor:1"],
        "c_after_warmup_64_s": warm["committor:64"],
        "import_s": warm["import_s"],
    }
    targets = {"a_total_s": 10.0, "b_first_forward_s": 3.0, "c_after_warmup_first_call_s": 1.0}
    for key, value in result.items():
        mark = (
            f"  (target {'<=' if key != 'c_after_warmup_first_call_s' else '<'} {targets[key]} s)"
            if key in targets
            else ""
        )
        print(f"{key:32s} {value:8.2f}{mark}")
    return result


if __name__ == "__main__":
    main()
