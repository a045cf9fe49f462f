"""Protein generative-model workloads: FoldingDiff's backbone build and side chains onto a backbone.

Rows (float32, CPU; times are medians over interleaved rounds in one process, every
implementation once per round in turn; ratio = the other's time / ours):

* **FoldingDiff** ``nerf_build_batch`` (from a checkout of microsoft/foldingdiff:
  ``--foldingdiff PATH`` or ``FOLDINGDIFF_PATH``) against
  ``bn.protein.build_backbone(dihedrals, angles, layout="foldingdiff")``, batch 64 x 46
  residues (1CRN, its test protein) and 64 x 128 (its training length), forward and
  forward+backward (loss ``sum(xyz * w)``, gradient with respect to the six angles).
* **mixed lengths**, 64 chains of 40-128 residues, a new mix every step: FoldingDiff
  builds the NaN-padded batch (its practice); ours passes ``lengths``.
* **side chains** for 64 proteins of mixed sequences, 128 residues each, on given
  backbones (N, CA, C, O) from chi: ``bn.protein.place_side_chains`` against a
  per-residue loop of the same formulas (each side-chain atom placed by NeRF from its
  references, residue after residue, protein after protein, the rows and values of
  ``bn.protein.protein_table``), forward and forward+backward (gradient with respect to
  chi and the backbone).

``python benchmarks/protein_models.py --foldingdiff /path/to/foldingdiff``
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import batched_nerf as bn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.protein import fmt, interleaved

ALPHABET = "ARNDCQEGHILKMFPSTWYV"


def foldingdiff_nerf(path: str | None):
    """FoldingDiff's ``foldingdiff/nerf.py`` (torch and numpy only), or None."""
    root = path or os.environ.get("FOLDINGDIFF_PATH")
    if not root or not (Path(root) / "foldingdiff" / "nerf.py").is_file():
        return None
    spec = importlib.util.spec_from_file_location("foldingdiff_nerf", Path(root) / "foldingdiff" / "nerf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def angles_batch(batch: int, n_res: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (B, L, 3) dihedrals and FoldingDiff-like bond angles, float32."""
    g = torch.Generator().manual_seed(seed)
    dihedrals = (torch.rand(batch, n_res, 3, generator=g) * 2 - 1) * math.pi
    angles = torch.deg2rad(torch.tensor([111.0, 116.0, 122.0])) + 0.05 * torch.randn(
        batch, n_res, 3, generator=g
    )
    return dihedrals, angles


def compare(
    label: str, theirs: Callable, ours: Callable, inputs: list[torch.Tensor], rounds: int, budget: float
) -> list[list[str]]:
    """Table rows: forward (no grad) and forward+backward (``sum`` of the output, gradient with respect
    to ``inputs``) of ``theirs`` and ``ours``, both called as ``f(*inputs)``, in interleaved rounds."""
    leaves = [t.clone().requires_grad_(True) for t in inputs]

    def fwd(f):
        def step():
            with torch.no_grad():
                return f(*inputs)

        return step

    def fwd_bwd(f):
        def step():
            f(*leaves).sum().backward()
            # each step frees its own gradients: freeing the ones a per-atom loop's backward left
            # can return its heap to the OS (measured: 113 ms), which would land in the next step
            for t in leaves:
                t.grad = None

        return step

    steps = {
        "theirs/f": fwd(theirs),
        "ours/f": fwd(ours),
        "theirs/fb": fwd_bwd(theirs),
        "ours/fb": fwd_bwd(ours),
    }
    for step in steps.values():  # warm-up (kernel loads, tables)
        step()
    med = interleaved(steps, rounds, budget)
    rows = []
    for k, name in (("f", "forward"), ("fb", "forward+backward")):
        t, o = med[f"theirs/{k}"], med[f"ours/{k}"]
        rows.append([label, name, fmt(t), fmt(o), f"{t / o:.0f}x"])
    return rows


def backbone_rows(nerf, batch: int, n_res: int, seed: int, rounds: int, budget: float) -> list[list[str]]:
    d, a = angles_batch(batch, n_res, seed)
    w = torch.randn(batch, n_res * 3, 3)
    lengths = [torch.full((batch, n_res), v) for v in (1.46, 1.54, 1.34)]  # float32, as the angles

    def theirs(d, a):
        return nerf.nerf_build_batch(*d.unbind(-1), *a.unbind(-1), *lengths) * w

    def ours(d, a):
        return bn.protein.build_backbone(d, a, layout="foldingdiff").flatten(-3, -2) * w

    return compare(f"{batch} x {n_res}", theirs, ours, [d, a], rounds, budget)


def mixed_rows(
    nerf, batch: int, low: int, high: int, seed: int, rounds: int, budget: float
) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    d, a = angles_batch(batch, high, seed)
    lengths = [torch.full((batch, high), v) for v in (1.46, 1.54, 1.34)]

    def mix() -> torch.Tensor:
        return torch.from_numpy(rng.integers(low, high + 1, batch))

    def theirs(d, a):
        pad = torch.arange(high)[None, :] >= mix()[:, None]
        d = d.masked_fill(pad[..., None], float("nan"))
        a = a.masked_fill(pad[..., None], float("nan"))
        return nerf.nerf_build_batch(*d.unbind(-1), *a.unbind(-1), *lengths).nan_to_num()

    def ours(d, a):
        return bn.protein.build_backbone(d, a, lengths=mix(), layout="foldingdiff")

    label = f"{batch} x {low}-{high}, new mix each step"
    return compare(label, theirs, ours, [d, a], rounds, budget)


def _place(a, b, c, bond, angle, torsion):
    """NeRF: the atom d with |d-c| = bond, angle(b, c, d) = angle, dihedral(a, b, c, d) = torsion."""
    bc = (c - b) / (c - b).norm(dim=-1, keepdim=True)
    n = torch.linalg.cross(b - a, bc, dim=-1)
    n = n / n.norm(dim=-1, keepdim=True)
    m = torch.stack([bc, torch.linalg.cross(n, bc, dim=-1), n], dim=-1)
    local = torch.stack(
        [
            -bond * torch.cos(angle),
            bond * torch.sin(angle) * torch.cos(torsion),
            bond * torch.sin(angle) * torch.sin(torsion),
        ],
        dim=-1,
    )
    return c + (m @ local[..., None])[..., 0]


class Loop:
    """Side chains by a per-residue loop: for each protein, each residue, each side-chain atom in turn."""

    def __init__(self, sequences: list[str]) -> None:
        self.plans = []
        for s in sequences:
            t = bn.protein.protein_table(s)
            refs = t.table.refs.tolist()
            names = t.atom_names
            chi_row = {
                int(row): (r, c)
                for r, rows in enumerate(t.torsion_rows[:, 3:].tolist())
                for c, row in enumerate(rows)
                if row >= 0
            }
            residues = []
            for r in range(t.n_residues):
                atoms = [
                    k
                    for k in range(t.n_atoms)
                    if int(t.residue_index[k]) == r and names[k] not in ("N", "CA", "C", "O", "OXT")
                ]
                residues.append([(k, refs[k], chi_row.get(k)) for k in atoms])
            bb = [[t.atom(r, a) for a in ("N", "CA", "C", "O")] for r in range(t.n_residues)]
            self.plans.append((t, residues, bb))

    def __call__(self, backbone: torch.Tensor, chi: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for p, (t, residues, bb) in enumerate(self.plans):
            atoms: dict[int, torch.Tensor] = {}
            for r, rows in enumerate(residues):
                for j, k in enumerate(bb[r]):
                    atoms[k] = backbone[p, r, j]
                for k, (b, a, d), torsion in rows:
                    value = chi[p, torsion[0], torsion[1]] if torsion else t.dihedrals[k].float()
                    atoms[k] = _place(
                        atoms[d], atoms[a], atoms[b], t.bonds[k].float(), t.angles[k].float(), value
                    )
            out.append(torch.stack([atoms[k] for k in sorted(atoms)]))
        return out


def side_chain_rows(batch: int, n_res: int, seed: int, rounds: int, budget: float) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    sequences = ["".join(rng.choice(list(ALPHABET), n_res)) for _ in range(batch)]
    g = torch.Generator().manual_seed(seed)
    phi, psi = (torch.rand(batch, n_res, generator=g) * 6 - 3 for _ in range(2))
    full = bn.protein.build_batch(sequences, phi, psi)
    index = torch.tensor(
        [
            [[t.atom(r, a) for a in ("N", "CA", "C", "O")] for r in range(n_res)]
            for t in (bn.protein.protein_table(s) for s in sequences)
        ]
    )
    backbone = torch.stack([full.xyz[k, index[k]] for k in range(batch)])  # (B, L, 4, 3)
    chi = torch.rand(batch, n_res, 4, generator=g) * 6 - 3
    loop = Loop(sequences)
    check = loop(backbone, chi)
    ours_xyz = bn.protein.place_side_chains(sequences, backbone, chi).xyz
    for k, t in enumerate(loop.plans):  # the loop reproduces ours (outside the timing)
        kept = sorted({i for rows in t[1] for i, _, _ in rows} | {i for row in t[2] for i in row})
        assert (check[k] - ours_xyz[k, kept]).abs().max() < 1e-3

    def theirs(bb, c):
        return torch.stack([x.sum() for x in loop(bb, c)])

    label = f"{batch} mixed proteins x {n_res} residues"
    return compare(
        label,
        theirs,
        lambda bb, c: bn.protein.place_side_chains(sequences, bb, c).xyz,
        [backbone, chi],
        rounds,
        budget,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--foldingdiff", default=None, help="a checkout of microsoft/foldingdiff")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per workload")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    batch, sizes, side = (4, (8,), 6) if args.quick else (args.batch, (46, 128), 128)
    rows, notes = [], []
    nerf = foldingdiff_nerf(args.foldingdiff)
    if nerf is None:
        notes.append(
            "FoldingDiff rows skipped: pass --foldingdiff PATH or set FOLDINGDIFF_PATH (benchmarks/PEERS.md)"
        )
    else:
        for n in sizes:
            rows += backbone_rows(nerf, batch, n, args.seed, args.rounds, args.budget)
            print(f"done {batch} x {n}", file=sys.stderr, flush=True)
        low, high = (4, 8) if args.quick else (40, 128)
        rows += mixed_rows(nerf, batch, low, high, args.seed, args.rounds, args.budget)
    rows += side_chain_rows(batch, side, args.seed, args.rounds, args.budget)
    head = ["workload", "pass", "FoldingDiff / per-residue loop", "batched_nerf", "ratio"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\ntorch {torch.__version__}, {args.threads} torch thread(s), float32; ratio = their time / ours")
    for note in notes:
        print(f"- {note}")


if __name__ == "__main__":
    main()
