"""Committor of alanine dipeptide between C7eq and C7ax with the variational loss.

Configurations are generated in internal coordinates: the shipped reference
Z-matrix (``batched_nerf.data.load("alanine_dipeptide")``) with small Gaussian
noise on bonds, angles and dihedrals and the backbone dihedrals phi and psi
drawn uniformly. A small MLP on ``sin``/``cos`` of phi and psi, read back from
the Cartesian coordinates with :func:`batched_nerf.to_internal`, is trained
with :func:`batched_nerf.losses.committor_loss` (mass-weighted Kolmogorov
term plus boundary terms on the two states), then ``q`` is drawn over
``(phi, psi)``.

With uniformly drawn dihedrals and no energy the "committor" is the
mass-metric harmonic function between the two states, which is what the
picture shows; add Boltzmann weights (``weights=``) for a physical one.

Run: ``python examples/committor_alanine.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

import batched_nerf as bn
from batched_nerf.data import load
from batched_nerf.losses import committor_loss

MASSES = {"H": 1.008, "C": 12.011, "N": 14.007, "O": 15.999}
# state centres (phi, psi) in degrees and radius
STATE_A = (-80.0, 75.0)  # C7eq
STATE_B = (70.0, -70.0)  # C7ax
RADIUS = 35.0
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "examples" / "img"


def _torus_distance(phi: torch.Tensor, psi: torch.Tensor, centre: tuple[float, float]) -> torch.Tensor:
    dphi = torch.remainder(phi - math.radians(centre[0]) + math.pi, 2 * math.pi) - math.pi
    dpsi = torch.remainder(psi - math.radians(centre[1]) + math.pi, 2 * math.pi) - math.pi
    return torch.rad2deg(torch.sqrt(dphi**2 + dpsi**2))


class Committor(torch.nn.Module):
    """q(x) = sigmoid(MLP(sin, cos of phi and psi of x))."""

    def __init__(self, table: bn.ConstructionTable, phi_row: int, psi_row: int, hidden: int = 32) -> None:
        super().__init__()
        self.table, self.rows = table, [phi_row, psi_row]
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(4, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, 1),
        )

    def forward(self, xyz: torch.Tensor) -> torch.Tensor:
        dih = bn.to_internal(xyz, self.table).dihedrals[..., self.rows]  # (B, 2): phi, psi
        return torch.sigmoid(self.mlp(torch.cat([torch.sin(dih), torch.cos(dih)], -1))).squeeze(-1)


def sample(mol, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n configurations (B, 22, 3) with uniform phi/psi; also returns phi and psi."""
    b0, a0, d0 = (v.float() for v in (mol.bonds, mol.angles, mol.dihedrals))
    b = b0 + 0.02 * torch.randn(n, b0.numel(), generator=gen) * (b0 > 0)
    a = a0 + 0.03 * torch.randn(n, a0.numel(), generator=gen) * (a0 > 0)
    d = d0 + 0.10 * torch.randn(n, d0.numel(), generator=gen)
    phi = (2 * torch.rand(n, generator=gen) - 1) * math.pi
    psi = (2 * torch.rand(n, generator=gen) - 1) * math.pi
    # the rows whose dihedral *is* phi and psi (atoms referenced from them follow rigidly)
    d[:, mol.metadata["phi_row"]] = phi
    d[:, mol.metadata["psi_row"]] = psi
    return bn.to_cartesian(b, a, d, mol.table), phi, psi


def plot(net: Committor, mol, path: Path) -> Path | None:
    """Draw q over (phi, psi) to ``path``; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - optional dependency
        print("matplotlib not installed: no picture")
        return None
    grid = torch.linspace(-math.pi, math.pi, 73)
    phi, psi = torch.meshgrid(grid, grid, indexing="xy")
    b0, a0, d0 = (v.float() for v in (mol.bonds, mol.angles, mol.dihedrals))
    d = d0.expand(phi.numel(), -1).clone()
    d[:, mol.metadata["phi_row"]] = phi.reshape(-1)
    d[:, mol.metadata["psi_row"]] = psi.reshape(-1)
    with torch.no_grad():
        q = net(bn.to_cartesian(b0, a0, d, mol.table)).reshape(phi.shape)
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    cs = ax.contourf(torch.rad2deg(phi), torch.rad2deg(psi), q, levels=21, cmap="coolwarm", vmin=0, vmax=1)
    ax.contour(torch.rad2deg(phi), torch.rad2deg(psi), q, levels=[0.5], colors="k", linewidths=1.5)
    for (cx, cy), label in ((STATE_A, "A (C7eq)"), (STATE_B, "B (C7ax)")):
        ax.add_patch(plt.Circle((cx, cy), RADIUS, fill=False, ls="--", color="k"))
        ax.annotate(label, (cx, cy), ha="center", va="center")
    ax.set(
        xlabel="phi (deg)",
        ylabel="psi (deg)",
        title="alanine dipeptide: learned committor q",
        xlim=(-180, 180),
        ylim=(-180, 180),
    )
    fig.colorbar(cs, ax=ax, label="q")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(quick: bool = False, out_dir: str | Path | None = None) -> dict[str, float]:
    """Train the committor; returns the final loss, q in both states and the run time."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    mol = load("alanine_dipeptide")
    table = mol.table
    masses = torch.tensor([MASSES[e] for e in mol.elements])
    net = Committor(table, mol.metadata["phi_row"], mol.metadata["psi_row"])
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    steps, batch = (15, 64) if quick else (400, 128)
    start = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        xyz, phi, psi = sample(mol, batch, gen)
        xyz.requires_grad_(True)
        in_a = _torus_distance(phi, psi, STATE_A) < RADIUS
        in_b = _torus_distance(phi, psi, STATE_B) < RADIUS
        loss = committor_loss(net(xyz), xyz, masses=masses, in_a=in_a, in_b=in_b, boundary_weight=10.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        xyz, phi, psi = sample(mol, 2048, gen)
        q = net(xyz)
        q_a = float(q[_torus_distance(phi, psi, STATE_A) < RADIUS].mean())
        q_b = float(q[_torus_distance(phi, psi, STATE_B) < RADIUS].mean())
    print(
        f"{steps} steps x {batch} samples in {elapsed:.1f} s, loss {float(loss.detach()):.4f}, "
        f"mean q in A {q_a:.3f}, in B {q_b:.3f}"
    )
    out = Path(out_dir) if out_dir is not None else DEFAULT_OUT
    path = plot(net, mol, out / "committor_alanine.png")
    if path is not None:
        print(f"wrote {path}")
    return {"loss": float(loss.detach()), "q_a": q_a, "q_b": q_b, "seconds": elapsed}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps only")
    parser.add_argument("--out", default=None, help=f"folder for the picture (default {DEFAULT_OUT})")
    args = parser.parse_args()
    main(args.quick, args.out)
