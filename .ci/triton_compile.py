"""Compile every Triton kernel of batched_nerf with the real compiler for GPU targets, without a GPU.

Usage::

    python .ci/triton_compile.py [--targets 80,86,90] [--kernels NAME,...] [--dtypes float32,float64]
                                 [--json OUT]

What it compiles: the launches the engines make. Each kernel module's entry points
(``cuda.build.build`` / ``build_vjp``, ``cuda.inverse.internal`` /
``internal_vjp``: the engines' entries) run on CPU tensors with their launches intercepted
(``gpu_policy.launch``), once per accumulation / input dtype (float32, float64) on a
packed table of two components (alanine dipeptide and a 7-atom chain, 5 samples: no
integer argument is 1 or a multiple of 16). Each intercepted launch is specialised
the way Triton's JIT specialises it (its own argument binder: dtypes, 16-byte
alignment, integer specialisation, ``num_warps``) and compiled with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` down to a cubin
by the wheel's ``ptxas`` (as triton's own tests do for a target without a device).
Every ``@triton.jit`` function of those modules whose name ends in ``_kernel`` must
be launched by some entry point (the helpers are inlined into them).

It prints, per kernel, variant and target: registers, stack frame, spill stores and
loads (``ptxas -v``), local and shared memory (``cuobjdump -res-usage`` of the cubin)
and compile seconds. Exit status: 0 when everything compiled without spills, 1 on a
compile error or a spill (bytes of spill stores or loads > 0), 2 when triton is
missing. A stack frame without spills is not an error: CUDA's float64 ``sin``/``cos``
keep a small local array for their slow-path argument reduction.
"""

from __future__ import annotations

import os
import sys
import tempfile

# the real compiler, not the interpreter, and a fresh cache so that ptxas runs (and logs) every time
os.environ.pop("TRITON_INTERPRET", None)
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="batched-nerf-triton-")

import argparse
import contextlib
import io
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGETS = (80, 86, 90)
DTYPES = ("float32", "float64")


def _room(module: str) -> str:
    """``"cuda.build"`` for ``batched_nerf.engines.fused.cuda.build``: the label of a kernel's module."""
    return ".".join(module.split(".")[-2:])


def _record(dtype_name: str) -> list[dict[str, Any]]:
    """Run each entry point of the kernel modules on CPU tensors; return their launches (not run)."""
    import torch

    import batched_nerf as bn
    from batched_nerf.engines.fused.build import configure, fused_plan
    from batched_nerf.engines.fused.cuda import build as ft
    from batched_nerf.engines.fused.cuda import inverse as inv

    dtype = getattr(torch, dtype_name)
    launches: list[dict[str, Any]] = []

    def record(name: str, kernel: Any, grid: tuple[int, ...], *args: Any, **options: Any) -> None:
        launches.append({"name": name, "kernel": kernel, "args": args, "options": options})

    table = bn.pack_tables([bn.data.load("alanine_dipeptide").table, bn.ConstructionTable.chain(7)])
    n, batch = table.n_atoms, 5
    gen = torch.Generator().manual_seed(0)
    b = torch.rand(batch, n, generator=gen, dtype=dtype) + 1.0
    a = torch.rand(batch, n, generator=gen, dtype=dtype) + 1.0
    d = torch.rand(batch, n, generator=gen, dtype=dtype)
    f = torch.zeros(batch, 0, 3, dtype=dtype)
    xyz = torch.rand(batch, n, 3, generator=gen, dtype=dtype)
    inverse_plan = table.plan("inverse", "cpu")
    saved = ft.launch, inv.launch
    ft.launch = inv.launch = record  # type: ignore[assignment]
    try:
        plan = configure(fused_plan(table.topology), dtype, False)  # the scratch in the inputs' dtype
        ft.build(plan, b, a, d, f, None, None)
        ft.build_vjp(plan, b, a, d, f, None, None, torch.ones(batch, n, 3, dtype=dtype))
        inv.internal(inverse_plan, xyz)
        inv.internal_vjp(inverse_plan, xyz, b, a, d)
    finally:
        ft.launch, inv.launch = saved
    return launches


def kernel_names() -> list[str]:
    """``module.name`` of every launchable ``@triton.jit`` function of the kernel modules."""
    from triton.runtime.jit import JITFunction

    from batched_nerf.engines.fused.cuda import build as ft
    from batched_nerf.engines.fused.cuda import inverse as inv

    return [
        f"{_room(mod.__name__)}.{name}"
        for mod in (ft, inv)
        for name, obj in vars(mod).items()
        if isinstance(obj, JITFunction) and name.endswith("_kernel")
    ]


def _specialise(fn: Any, args: tuple[Any, ...], options: dict[str, Any], target: Any) -> tuple[Any, ...]:
    """What Triton's JIT hands ``triton.compile`` for ``fn[grid](*args, **options)`` on ``target``."""
    from triton import knobs
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = dict(options, debug=fn.debug or knobs.runtime.debug)
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound, specialization, opts = binder(*args, **kwargs)
    return fn._pack_args(backend, kwargs, bound, specialization, opts)


def _ptxas_numbers(log: str) -> dict[str, int]:
    def grab(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else -1

    return {
        "registers": grab(r"Used (\d+) registers"),
        "stack": grab(r"(\d+) bytes stack frame"),
        "spill_stores": grab(r"(\d+) bytes spill stores"),
        "spill_loads": grab(r"(\d+) bytes spill loads"),
    }


def _res_usage(cubin: bytes) -> dict[str, int]:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        text = subprocess.run([str(tool), "-res-usage", fh.name], capture_output=True, text=True).stdout
    out = {}
    for key in ("REG", "STACK", "LOCAL", "SHARED"):
        m = re.search(rf"\b{key}:(\d+)", text)
        out[key.lower()] = int(m.group(1)) if m else -1
    return out


def compile_one(fn: Any, args: tuple[Any, ...], options: dict[str, Any], cc: int) -> dict[str, Any]:
    """Compile one launch for compute capability ``cc``; registers, stack, spills, memory and time."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", cc, 32)
    opts, signature, constexprs, attrs = _specialise(fn, args, options, target)
    log = io.StringIO()
    t0 = time.perf_counter()
    with knobs.nvidia.scope(), contextlib.redirect_stdout(log):
        knobs.nvidia.dump_ptxas_log = True
        compiled = triton.compile(
            triton.compiler.ASTSource(fn, signature, constexprs, attrs), target=target, options=opts.__dict__
        )
    seconds = time.perf_counter() - t0
    row = {"num_warps": compiled.metadata.num_warps, "seconds": round(seconds, 1)}
    row.update(_ptxas_numbers(log.getvalue()))
    usage = _res_usage(compiled.asm["cubin"])
    row.update(local=usage["local"], shared=usage["shared"])
    if row["registers"] < 0:  # no ptxas log (cached?): the cubin's own numbers
        row.update(registers=usage["reg"], stack=usage["stack"])
    return row


def run(
    targets: tuple[int, ...], kernels: set[str] | None, dtypes: tuple[str, ...]
) -> tuple[list[dict[str, Any]], int]:
    """Compile the selected launches; returns the rows and the exit status."""
    rows: list[dict[str, Any]] = []
    status = 0
    launched: set[str] = set()
    for dtype in dtypes:
        seen: set[str] = set()
        for rec in _record(dtype):
            module = _room(rec["kernel"].fn.__module__)
            name = f"{module}.{rec['name']}"
            launched.add(name)
            if (kernels and name not in kernels and rec["name"] not in kernels) or name in seen:
                continue
            seen.add(name)
            for cc in targets:
                row: dict[str, Any] = {"kernel": name, "dtype": dtype, "target": f"sm_{cc}"}
                try:
                    row.update(compile_one(rec["kernel"], rec["args"], rec["options"], cc))
                except Exception as exc:  # a compile error: report it, fail at the end
                    row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
                    status = 1
                if row.get("spill_stores", 0) > 0 or row.get("spill_loads", 0) > 0:
                    row["error"] = "spills to local memory"
                    status = 1
                rows.append(row)
                _print_row(row)
    missing = [k for k in kernel_names() if k not in launched]
    if missing and not kernels:
        print(f"not launched by any entry point (add them to .ci/triton_compile.py): {missing}")
        status = 1
    return rows, status


_COLUMNS = ("kernel", "dtype", "target", "num_warps", "registers", "stack", "spill_stores", "spill_loads")
_COLUMNS += ("local", "shared", "seconds")


def _print_row(row: dict[str, Any]) -> None:
    cells = [str(row.get(c, "-")) for c in _COLUMNS]
    widths = (36, 8, 6, 9, 9, 5, 12, 11, 5, 6, 7)
    line = " ".join(c.ljust(w) for c, w in zip(cells, widths))
    print(line + (f"  ERROR {row['error']}" if "error" in row else ""), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--targets", default=",".join(map(str, TARGETS)), help="compute capabilities")
    parser.add_argument("--kernels", default="", help="only these (module.name or name), comma-separated")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="float32,float64")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args(argv)
    try:
        import triton
    except ImportError as exc:
        print(f"triton is not installed ({exc}): nothing to compile")
        return 2
    targets = tuple(int(t) for t in args.targets.split(",") if t)
    kernels = {k for k in args.kernels.split(",") if k} or None
    dtypes = tuple(d for d in args.dtypes.split(",") if d)
    print(f"triton {triton.__version__}: compiling for {', '.join(f'sm_{t}' for t in targets)}")
    _print_row({c: c for c in _COLUMNS})
    rows, status = run(targets, kernels, dtypes)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("OK: compiled without spills" if status == 0 else "FAILED: a compile error or a spill (see above)")
    return status


if __name__ == "__main__":
    sys.exit(main())
