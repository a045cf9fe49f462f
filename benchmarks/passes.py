"""The passes users run, against the bare kernels of the same batch: pose, the flow layer, bgflow.

Rows (float32, 2 torch threads by default, interleaved rounds after a warm-up
call each, medians; see :func:`benchmarks.fused_vs_peers.interleaved`):

* **pose**: ``to_cartesian`` with and without ``rotation=``/``translation=``
  (forward, and forward+backward with gradients of every input), and
  ``to_internal`` with and without ``return_pose=True``; alanine dipeptide x
  4,096 and a 613-atom single molecule (AdK residues 1-40 with hydrogens, built
  by :mod:`batched_nerf.protein`) x 9,800 frames (``--quick``: x 980);
* **flow**: ``InternalCoordinateTransform(table, pose=True)`` forward, inverse
  and inverse forward+backward (the log-det included), against the bare
  ``to_internal`` / ``to_cartesian`` of the same batch, and against bgflow's
  ``GlobalInternalCoordinateTransformation`` (``--bgflow PATH``: a checkout of
  noegroup/bgflow; it needs ``einops``, and ``np.infty`` is restored for it on
  NumPy 2);
* **committor**: the committor pass (``q`` on ``to_internal(x)``, ``|dq/dx|^2``
  backward) against the same network on internal-coordinate leaves; the
  difference is the library's share (target <= 0.35x the network alone), on
  alanine dipeptide x 4,096, chain 64 x 1,024 and chain 512 x 256.

Ratio columns: ``with / without`` (the target is <= 1.15x for the pose), ``flow / bare``
(<= 1.3x) and ``bgflow / flow`` (>= 20x)::

    python benchmarks/passes.py [--bgflow /path/to/bgflow] [--quick] [--threads 2] [--only committor]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

import batched_nerf as bn
from benchmarks.fused_vs_peers import interleaved
from benchmarks.timing import Committor, fmt_seconds

Steps = dict[str, Callable[[], object]]
#: AdK's first 40 residues (613 atoms with hydrogens, as in MDAnalysisTests' PSF/DCD)
ADK_40 = "MRIILLGAPGAGKGTQAQFIMEKYGIPQISTGDMLRAAVK"


def _inputs(table: bn.ConstructionTable, batch: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    n = table.n_atoms
    bonds = 1.0 + 0.5 * torch.rand(batch, n, generator=gen)
    angles = 1.7 + 0.5 * torch.rand(batch, n, generator=gen)
    dihedrals = (2 * torch.rand(batch, n, generator=gen) - 1) * math.pi
    u = torch.rand(batch, 3, generator=gen) * torch.tensor([2 * math.pi, 2.0, 2 * math.pi])
    rotation = bn.rotation_from_angles(u - torch.tensor([math.pi, 1.0, math.pi]))
    translation = torch.randn(batch, 3, generator=gen)
    return bonds, angles, dihedrals, rotation, translation


def pose_steps(table: bn.ConstructionTable, batch: int) -> dict[str, Steps]:
    """``to_cartesian`` / ``to_internal`` with and without the pose."""
    b, a, d, r, t = _inputs(table, batch)
    w = torch.randn(batch, table.n_atoms, 3, generator=torch.Generator().manual_seed(1))
    xyz = bn.to_cartesian(b, a, d, table, rotation=r, translation=t)

    def build(pose: bool) -> Steps:
        def forward() -> None:
            with torch.no_grad():
                bn.to_cartesian(b, a, d, table, **({"rotation": r, "translation": t} if pose else {}))

        def forward_backward() -> None:
            leaves = [x.clone().requires_grad_() for x in ((b, a, d, r, t) if pose else (b, a, d))]
            kw = {"rotation": leaves[3], "translation": leaves[4]} if pose else {}
            (bn.to_cartesian(*leaves[:3], table, **kw) * w).sum().backward()

        def inverse() -> None:
            with torch.no_grad():
                bn.to_internal(xyz, table, return_pose=pose)

        return {"forward": forward, "forward_backward": forward_backward, "to_internal": inverse}

    return {"without pose": build(False), "with pose": build(True)}


def flow_steps(table: bn.ConstructionTable, batch: int, bgflow: str | None) -> dict[str, Steps]:
    """The flow layer (pose=True) against the bare conversions, and bgflow's global transform."""
    b, a, d, r, t = _inputs(table, batch)
    xyz = bn.to_cartesian(b, a, d, table, rotation=r, translation=t)
    flow = bn.InternalCoordinateTransform(table, pose=True, normalize_angles=False)
    z = flow(xyz)
    w = torch.randn(batch, table.n_atoms, 3, generator=torch.Generator().manual_seed(1))

    def ours_forward() -> None:
        with torch.no_grad():
            flow(xyz)

    def ours_inverse() -> None:
        with torch.no_grad():
            flow.inverse(z.bonds, z.angles, z.dihedrals, z.rotation, z.translation)

    def ours_inverse_backward() -> None:
        leaves = [
            x.clone().requires_grad_() for x in (z.bonds, z.angles, z.dihedrals, z.rotation, z.translation)
        ]
        out, ld = flow.inverse(*leaves)
        ((out * w).sum() + ld.sum()).backward()

    def bare_forward() -> None:
        with torch.no_grad():
            bn.to_internal(xyz, table)

    def bare_inverse() -> None:
        with torch.no_grad():
            bn.to_cartesian(b, a, d, table)

    def bare_inverse_backward() -> None:
        leaves = [x.clone().requires_grad_() for x in (b, a, d)]
        (bn.to_cartesian(*leaves, table) * w).sum().backward()

    steps = {
        "flow (pose=True)": {
            "forward": ours_forward,
            "inverse": ours_inverse,
            "inverse fwd+bwd": ours_inverse_backward,
        },
        "bare": {
            "forward": bare_forward,
            "inverse": bare_inverse,
            "inverse fwd+bwd": bare_inverse_backward,
        },
    }
    if bgflow:
        steps["bgflow Global IC"] = _bgflow_steps(table, xyz, w, bgflow)
    return steps


def _bgflow_steps(table: bn.ConstructionTable, xyz: torch.Tensor, w: torch.Tensor, path: str) -> Steps:
    sys.path.insert(0, path)
    if not hasattr(np, "infty"):
        setattr(np, "infty", np.inf)  # noqa: B010 - bgflow predates NumPy 2
    from bgflow.nn.flow.crd_transform.ic import GlobalInternalCoordinateTransformation

    zmat, _ = bn.formats.table_to_bgflow(table)  # every row, seeds with -1: bgflow's global transform
    tr = GlobalInternalCoordinateTransformation(
        zmat, normalize_angles=False, enforce_boundaries=False, raise_warnings=False
    )
    flat = xyz.reshape(xyz.shape[0], -1)
    z = [v.detach() for v in tr(flat)[:5]]  # bonds, angles, torsions, x0, Euler angles

    def forward() -> None:
        with torch.no_grad():
            tr(flat)

    def inverse() -> None:
        with torch.no_grad():
            tr(*z, inverse=True)

    def inverse_backward() -> None:
        leaves = [x.clone().requires_grad_() for x in z]
        out, ld = tr(*leaves, inverse=True)
        ((out.reshape(w.shape) * w).sum() + ld.sum()).backward()

    return {"forward": forward, "inverse": inverse, "inverse fwd+bwd": inverse_backward}


def _features(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return torch.stack([b, a.sin(), a.cos(), d.sin(), d.cos()], dim=-1)


def committor_steps(table: bn.ConstructionTable, batch: int) -> dict[str, Steps]:
    """The committor pass against the same network on internal-coordinate leaves.

    ``q`` is :class:`benchmarks.timing.Committor`'s MLP (5 -> 16 -> 1, tanh,
    sigmoid of the mean). Our pass: ``x`` a leaf, ``q(to_internal(x))``, ``g =
    dq/dx`` with ``create_graph=True``, ``sum(g**2).backward()``. The network
    alone: the same on leaves ``b, a, d`` (``g = dq/d(b, a, d)``). Our pass minus
    the network alone is what the library costs (issue 22: <= 0.35x the network).
    """
    b, a, d, _, _ = _inputs(table, batch)
    xyz = bn.to_cartesian(b, a, d, table)
    ic = bn.to_internal(xyz, table)
    mlp = Committor(table).mlp

    def q(b: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(mlp(_features(b, a, d)).mean(dim=(-2, -1)))

    def ours() -> None:
        x = xyz.clone().requires_grad_()
        z = bn.to_internal(x, table)
        (g,) = torch.autograd.grad(q(z.bonds, z.angles, z.dihedrals).sum(), x, create_graph=True)
        g.square().sum().backward()

    def network() -> None:
        leaves = [v.clone().requires_grad_() for v in (ic.bonds, ic.angles, ic.dihedrals)]
        gs = torch.autograd.grad(q(*leaves).sum(), leaves, create_graph=True)
        sum(g.square().sum() for g in gs).backward()

    return {"network alone": {"committor": network}, "our pass": {"committor": ours}}


def committor_rows(rows: list[tuple[str, bn.ConstructionTable, int]], rounds: int = 21) -> list[str]:
    """One markdown row per workload: our pass, the network alone, and the library's share.

    More rounds than the other rows: the share is a difference of two similar times.
    """
    lines = [
        "### committor pass: the library's share",
        "",
        "| row | our pass | network alone | library share (ours - network) / network |",
        "|---|---|---|---|",
    ]
    for name, table, batch in rows:
        med = interleaved(committor_steps(table, batch), "committor", rounds=rounds)
        ours, net = med["our pass"], med["network alone"]
        lines.append(f"| {name} | {fmt_seconds(ours)} | {fmt_seconds(net)} | {(ours - net) / net:.2f}x |")
    return [*lines, ""]


def table_rows(
    title: str,
    steps: dict[str, Steps],
    passes: tuple[str, ...],
    base: str,
    extra: tuple[str, str] | None = None,
) -> list[str]:
    """A markdown table: one row per pass, one column per contender, ratios to ``base``.

    ``extra = (a, b)`` adds the ratio ``a / b`` of two other contenders (e.g. bgflow / our flow layer).
    """
    others = [name for name in steps if name != base]
    pairs = [(o, base) for o in others] + ([extra] if extra and all(e in steps for e in extra) else [])
    head = " | ".join([base, *others]) + " | " + " | ".join(f"{a} / {b}" for a, b in pairs)
    lines = [f"### {title}", "", f"| pass | {head} |", "|---" * (2 + len(others) + len(pairs)) + "|"]
    for pass_ in passes:
        med = interleaved({k: v for k, v in steps.items() if pass_ in v}, pass_)
        cells = [fmt_seconds(med.get(base))] + [fmt_seconds(med.get(o)) for o in others]
        ratios = [f"{med[a] / med[b]:.2f}x" if a in med and b in med else "-" for a, b in pairs]
        lines.append(f"| {pass_} | " + " | ".join(cells + ratios) + " |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bgflow", metavar="PATH", help="noegroup/bgflow checkout (put on sys.path)")
    parser.add_argument("--quick", action="store_true", help="613 atoms x 980 frames instead of x 9,800")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=("pose", "flow", "committor"), help="one group of rows")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ala = bn.data.load("alanine_dipeptide").table
    adk = bn.protein.protein_table(ADK_40, hydrogens=True).table
    frames = 980 if args.quick else 9800
    out = [
        f"torch {torch.__version__}, {args.threads} threads, float32, backends {bn.backends()['fused']}",
        "",
    ]
    pose_passes = ("forward", "forward_backward", "to_internal")
    if args.only in (None, "pose"):
        ala_pose = pose_steps(ala, 4096)
        out += table_rows("alanine dipeptide x 4,096: pose", ala_pose, pose_passes, "without pose")
        out += table_rows(
            f"AdK 1-40 ({adk.n_atoms} atoms) x {frames:,}: pose",
            pose_steps(adk, frames),
            pose_passes,
            "without pose",
        )
    if args.only in (None, "flow"):
        out += table_rows(
            "alanine dipeptide x 4,096: flow layer",
            flow_steps(ala, 4096, args.bgflow),
            ("forward", "inverse", "inverse fwd+bwd"),
            "bare",
            extra=("bgflow Global IC", "flow (pose=True)"),
        )
    if args.only in (None, "committor"):
        out += committor_rows(
            [
                ("alanine dipeptide x 4,096", ala, 4096),
                ("chain 64 x 1,024", bn.ConstructionTable.chain(64), 1024),
                ("chain 512 x 256", bn.ConstructionTable.chain(512), 256),
            ]
        )
    print("\n".join(out))


if __name__ == "__main__":
    main()
