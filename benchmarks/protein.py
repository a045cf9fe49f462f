"""Protein benchmark: all heavy atoms from torsions, batched_nerf.protein vs MP-NeRF and NeRFax.

Workloads (the peers' own): single chains of 10 to 1,000 residues and 1,000
chains of 163 residues (one sequence, NeRFax's multi-chain benchmark),
float32, forward and forward+backward (loss ``sum(xyz * w)``, gradient with
respect to the torsions / angles). Times are medians over interleaved rounds
in one process (every implementation runs once per round, in turn).

* batched_nerf: ``bn.protein.build(sequence, phi, psi, omega, chi)``; the
  sequence's table is built once (cached) before timing, as in a training loop.
* MP-NeRF (``pip install mp-nerf``): ``mp_nerf.proteins.protein_fold`` on
  scaffolds from ``build_scaffolds_from_scn_angles`` made before timing (its
  own benchmark's protocol); one chain per call (no batch dimension), so the
  1,000-chain workload is ``--mpnerf-chains`` calls scaled to 1,000.
* NeRFax (a checkout: ``--nerfax PATH``): ``jit(get_jax_protein_fold(scaffolds))``,
  ``fully_sequential`` mode (its CPU choice), ``jit(vmap(...))`` for many
  chains, forward+backward ``jit(grad(sum(x * w)))`` with respect to the
  angles; the per-sequence compilation (trace + XLA compile, on first call)
  is timed separately and added in the "with compile" column, per chain.

Also reports the float32 heavy-atom error of batched_nerf against its float64
build at ``--error-residues`` residues (same torsions), and with ``--all-atom``
the all-atom build (``hydrogens=True``) of 1,000 x 163 residues and of one
1,000-residue chain (times and float32 error).

Run with the peers' interpreter so all three import in one process::

    PYTHONPATH=$PWD:/path/to/nerfax /path/to/peers-venv/bin/python benchmarks/protein.py \\
        --nerfax /path/to/nerfax
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

ALPHABET = "ARNDCQEGHILKMFPSTWYV"


def random_sequence(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return "".join(rng.choice(list(ALPHABET), n))


def random_torsions(n: int, batch: tuple[int, ...], seed: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(seed)
    phi = torch.empty(*batch, n, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g)
    psi = torch.empty(*batch, n, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g)
    omega = math.pi + 0.05 * torch.randn(*batch, n, dtype=torch.float64, generator=g)
    chi = torch.empty(*batch, n, 4, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g)
    return [t.to(dtype) for t in (phi, psi, omega, chi)]


# ----------------------------------------------------------------- implementations
def ours(seq: str, batch: int, dtype: torch.dtype, seed: int) -> dict[str, Callable[[], object]]:
    import batched_nerf as bn

    bn.protein.protein_table(seq)  # analysed once, like a training loop's first step
    shape = (batch,) if batch > 1 else ()
    ins = random_torsions(len(seq), shape, seed, dtype)
    leaves = [t.clone().requires_grad_(True) for t in ins]
    n = bn.protein.protein_table(seq).n_atoms
    w = torch.randn(*shape, n, 3, dtype=dtype, generator=torch.Generator().manual_seed(seed))

    def forward():
        with torch.no_grad():
            return bn.protein.build(seq, *ins).xyz

    def forward_backward():
        for t in leaves:
            t.grad = None
        (bn.protein.build(seq, *leaves).xyz * w).sum().backward()
        return leaves[0].grad

    forward_backward()
    return {"forward": forward, "forward_backward": forward_backward}


def scn_angles(seq: str, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """sidechainnet-style (L, 12) angles: phi, psi, omega, 3 bond angles, 6 side-chain angles."""
    phi, psi, omega, chi = random_torsions(len(seq), (), seed, torch.float64)
    bond = torch.tensor([111.2, 116.2, 121.7], dtype=torch.float64).deg2rad().expand(len(seq), 3)
    side = torch.cat([chi, torch.zeros(len(seq), 2, dtype=torch.float64)], dim=1)
    return torch.cat([torch.stack([phi, psi, omega], 1), bond, side], 1).to(dtype)


class MpNerf:
    def __init__(self) -> None:
        import mp_nerf.proteins  # noqa: F401

        self.info: dict[str, str] = {}

    def setup(self, seq: str, batch: int, dtype: torch.dtype, seed: int) -> dict[str, Callable[[], object]]:
        from mp_nerf.proteins import build_scaffolds_from_scn_angles, protein_fold

        angles = scn_angles(seq, seed, dtype)
        scaffolds = build_scaffolds_from_scn_angles(seq, angles, device="cpu")

        def forward():
            with torch.no_grad():
                for _ in range(batch):
                    out = protein_fold(**scaffolds)
            return out

        steps = {"forward": forward}
        try:
            leaf = angles.clone().requires_grad_(True)
            s = build_scaffolds_from_scn_angles(seq, leaf, device="cpu")
            protein_fold(**s)[0].sum().backward()
        except RuntimeError as exc:
            self.info["forward_backward"] = "fails: " + str(exc).split("\n")[0][:90]
        else:

            def forward_backward():
                for _ in range(batch):
                    leaf.grad = None
                    s = build_scaffolds_from_scn_angles(seq, leaf, device="cpu")
                    protein_fold(**s)[0].sum().backward()
                return leaf.grad

            steps["forward_backward"] = forward_backward
        return steps


class Nerfax:
    def __init__(self, path: str | None) -> None:
        if path and path not in sys.path:
            sys.path.insert(0, path)
        import jax  # noqa: F401
        import nerfax.plugin  # noqa: F401

        self.compile: dict[str, float] = {}

    def setup(self, seq: str, batch: int, dtype: torch.dtype, seed: int) -> dict[str, Callable[[], object]]:
        from functools import partial

        import jax
        import jax.numpy as jnp
        from mp_nerf.proteins import build_scaffolds_from_scn_angles
        from nerfax.plugin import convert_scnet_to_natural, get_jax_protein_fold
        from nerfax.reconstruct import reconstruct_from_internal_coordinates

        scaffolds = build_scaffolds_from_scn_angles(seq, scn_angles(seq, seed, torch.float32), device="cpu")
        inputs = convert_scnet_to_natural(
            {k: jnp.array(v.cpu().numpy()) for k, v in scaffolds.items() if k in ("angles_mask", "bond_mask")}
        )
        fold = get_jax_protein_fold(
            scaffolds, reconstruct_fn=partial(reconstruct_from_internal_coordinates, mode="fully_sequential")
        )
        angles, bonds = inputs["angles_mask"], inputs["bond_mask"]
        if batch > 1:
            fn = jax.vmap(fold)
            angles = jnp.broadcast_to(angles, (batch, *angles.shape))
            bonds = jnp.broadcast_to(bonds, (batch, *bonds.shape))
        else:
            fn = fold
        w = jnp.asarray(
            np.random.default_rng(seed).standard_normal(fn(angles, bonds).shape[-3:]).astype(np.float32)
        )
        fwd = jax.jit(fn)
        grad = jax.jit(jax.grad(lambda a, b: jnp.sum(fn(a, b) * w)))
        t0 = time.perf_counter()
        jax.block_until_ready(fwd(angles, bonds))
        self.compile["forward"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        jax.block_until_ready(grad(angles, bonds))
        self.compile["forward_backward"] = time.perf_counter() - t0
        return {
            "forward": lambda: jax.block_until_ready(fwd(angles, bonds)),
            "forward_backward": lambda: jax.block_until_ready(grad(angles, bonds)),
        }


# ----------------------------------------------------------------- timing
def interleaved(steps: dict[str, Callable[[], object]], rounds: int, budget: float) -> dict[str, float]:
    """Median seconds per call of each step, running them in turn, round after round.

    Python's cyclic garbage collector is off while a step is timed (as ``timeit`` does) and runs
    between steps: a per-atom loop leaves many objects behind, and a collection of them would
    otherwise land in whichever step allocates next."""
    times: dict[str, list[float]] = {k: [] for k in steps}
    start = time.perf_counter()
    for r in range(rounds):
        for name, step in steps.items():
            gc.disable()
            t0 = time.perf_counter()
            step()
            elapsed = time.perf_counter() - t0
            gc.enable()
            times[name].append(elapsed)
        if r >= 2 and time.perf_counter() - start > budget:
            break
    return {k: statistics.median(v) for k, v in times.items()}


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"


def float32_error(n_res: int, seed: int, method: str = "auto") -> float:
    """Max heavy-atom distance (A) between float32 and float64 builds of the same torsions."""
    import batched_nerf as bn

    seq = random_sequence(n_res, seed)
    ins = random_torsions(n_res, (), seed, torch.float64)
    ref = bn.protein.build(seq, *ins, method=method).xyz
    f32 = bn.protein.build(seq, *(t.float() for t in ins), method=method).xyz
    return float((f32.double() - ref).norm(dim=-1).max())


def mixed_batch(n_chains: int, seed: int, rounds: int, budget: float) -> str:
    """First call (analysis, packing) and steady-state times of ``build_batch``, lengths 50-300."""
    import batched_nerf as bn

    rng = np.random.default_rng(seed)
    seqs = [random_sequence(int(n), seed + k) for k, n in enumerate(rng.integers(50, 301, n_chains))]
    ins = random_torsions(300, (n_chains,), seed, torch.float32)  # padded to 300
    leaves = [t.clone().requires_grad_(True) for t in ins]
    t0 = time.perf_counter()
    for s in seqs:
        bn.protein.protein_table(s)
    t1 = time.perf_counter()
    bn.protein.packed_proteins(seqs)
    t2 = time.perf_counter()

    def forward():
        with torch.no_grad():
            return bn.protein.build_batch(seqs, *ins).xyz

    def forward_backward():
        for t in leaves:
            t.grad = None
        bn.protein.build_batch(seqs, *leaves).xyz.sum().backward()

    forward()
    forward_backward()
    med = interleaved({"forward": forward, "forward_backward": forward_backward}, rounds, budget)
    n_atoms = bn.protein.packed_proteins(seqs).table.n_atoms
    return (
        f"mixed batch of {n_chains} chains (50-300 residues, {n_atoms} atoms): per-sequence tables "
        f"{t1 - t0:.1f} s, packing {t2 - t1:.1f} s (first call only, cached); then forward "
        f"{fmt(med['forward'])}, forward+backward {fmt(med['forward_backward'])}"
    )


def all_atom(workloads: list[tuple[int, int]], seed: int, rounds: int, budget: float) -> list[str]:
    """All-atom builds (``hydrogens=True``): forward and forward+backward times, float32 error vs float64."""
    import batched_nerf as bn

    lines = []
    for n_res, batch in workloads:
        seq = random_sequence(n_res, seed)
        shape = (batch,) if batch > 1 else ()
        ins = random_torsions(n_res, shape, seed, torch.float32)
        leaves = [t.clone().requires_grad_(True) for t in ins]
        t0 = time.perf_counter()
        table = bn.protein.protein_table(seq, hydrogens=True)
        t1 = time.perf_counter()

        def forward(seq=seq, ins=ins):
            with torch.no_grad():
                return bn.protein.build(seq, *ins, hydrogens=True).xyz

        def forward_backward(seq=seq, leaves=leaves):
            for t in leaves:
                t.grad = None
            bn.protein.build(seq, *leaves, hydrogens=True).xyz.sum().backward()

        forward()
        forward_backward()
        med = interleaved({"forward": forward, "forward_backward": forward_backward}, rounds, budget)
        one = [t[0] if batch > 1 else t for t in ins]
        ref = bn.protein.build(seq, *(t.double() for t in one), hydrogens=True).xyz
        f32 = bn.protein.build(seq, *one, hydrogens=True).xyz
        err = float((f32.double() - ref).norm(dim=-1).max())
        label = f"{n_res} x {batch}" if batch > 1 else f"{n_res}"
        lines.append(
            f"all-atom {label} residues ({table.n_atoms} atoms per chain): table {t1 - t0:.1f} s "
            f"(first call, cached), forward {fmt(med['forward'])}, "
            f"forward+backward {fmt(med['forward_backward'])}, float32 max atom error {err:.1e} A"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[10, 100, 300, 1000])
    parser.add_argument("--chains", type=int, default=1000, help="chains of the batched workload (0: skip)")
    parser.add_argument("--chain-length", type=int, default=163)
    parser.add_argument("--nerfax", default=None, help="path of a NeRFax checkout")
    parser.add_argument("--no-mpnerf", action="store_true")
    parser.add_argument("--mpnerf-chains", type=int, default=20, help="MP-NeRF calls timed for the batch")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per workload")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--error-residues", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixed", type=int, default=0, help="chains of a mixed-length batch (0: skip)")
    parser.add_argument(
        "--all-atom",
        action="store_true",
        help="also time all-atom builds (1,000 x 163 and one 1,000-residue chain)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    peers: dict[str, object] = {}
    notes = []
    if not args.no_mpnerf:
        try:
            peers["MP-NeRF"] = MpNerf()
        except ImportError as exc:
            notes.append(f"MP-NeRF unavailable: {exc}")
    try:
        peers["NeRFax"] = Nerfax(args.nerfax)
    except ImportError as exc:
        notes.append(f"NeRFax unavailable: {exc} (pass --nerfax PATH)")

    rows = []
    workloads = [(n, 1) for n in args.lengths] + ([(args.chain_length, args.chains)] if args.chains else [])
    for n_res, batch in workloads:
        seq = random_sequence(n_res, args.seed)
        steps = {f"ours/{k}": v for k, v in ours(seq, batch, torch.float32, args.seed).items()}
        compile_s: dict[str, float] = {}
        scale: dict[str, float] = {}
        for name, peer in peers.items():
            calls = batch
            if name == "MP-NeRF" and batch > 1:
                calls = min(batch, args.mpnerf_chains)
            try:
                peer_steps = peer.setup(seq, calls, torch.float32, args.seed)  # type: ignore[attr-defined]
            except Exception as exc:  # a peer failing must not stop the table
                notes.append(f"{name} failed at {n_res} x {batch}: {type(exc).__name__}: {exc}"[:200])
                continue
            for k, v in peer_steps.items():
                steps[f"{name}/{k}"] = v
                scale[f"{name}/{k}"] = batch / calls
            for k, msg in getattr(peer, "info", {}).items():
                notes.append(f"{name} {k} at {n_res} x {batch}: {msg}")
            for k, sec in getattr(peer, "compile", {}).items():
                compile_s[f"{name}/{k}"] = sec
        med = interleaved(steps, args.rounds, args.budget)
        med = {k: v * scale.get(k, 1.0) for k, v in med.items()}
        for mode in ("forward", "forward_backward"):
            mine = med.get(f"ours/{mode}")
            row = [f"{n_res} x {batch}" if batch > 1 else f"{n_res}", mode, fmt(mine)]
            for name in ("MP-NeRF", "NeRFax"):
                t = med.get(f"{name}/{mode}")
                row.append(fmt(t) + (f" ({t / mine:.1f}x)" if t and mine else ""))
            c = compile_s.get(f"NeRFax/{mode}")
            t = med.get(f"NeRFax/{mode}")
            row.append(
                f"{fmt(c)}; {fmt((t + c) / batch)} per chain ({(t + c) / mine:.1f}x)"
                if c and t and mine
                else "-"
            )
            rows.append(row)
        print(f"done {n_res} x {batch}", file=sys.stderr, flush=True)

    head = [
        "residues",
        "step",
        "batched_nerf",
        "MP-NeRF (ratio)",
        "NeRFax (ratio)",
        "NeRFax compile; with compile (ratio)",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.error_residues:
        print()
        for method in ("auto", "scan", "levels"):
            err = float32_error(args.error_residues, args.seed, method)
            print(f"float32 vs float64 max atom error, {args.error_residues} residues, {method}: {err:.2e} A")
    if args.mixed:
        print("\n" + mixed_batch(args.mixed, args.seed, args.rounds, args.budget))
    if args.all_atom:
        print()
        for line in all_atom(
            [(args.chain_length, args.chains or 1000), (1000, 1)], args.seed, args.rounds, args.budget
        ):
            print(line)
    print(
        f"\ntorch {torch.__version__}, {args.threads} torch thread(s); ratio = peer time / batched_nerf time"
    )
    for note in notes:
        print(f"- {note}")


if __name__ == "__main__":
    main()
