"""Data-parallel training with torch.distributed (gloo, CPU) through batched_nerf.

Each rank draws its own batch of latent vectors, a small network turns them
into internal coordinates of a chain, :func:`batched_nerf.to_cartesian` builds
the coordinates and :func:`batched_nerf.losses.clash_loss` plus a target
end-to-end distance make the loss. ``DistributedDataParallel`` averages the
gradients, so every rank ends with identical parameters; the script checks
that with an ``all_gather`` and prints ``PARAMS_MAX_DIFF <value>``.

Launch: ``torchrun --nproc_per_node=2 examples/distributed_training.py --quick``.
Run without torchrun it trains on a single process (world size 1).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import batched_nerf as bn
from batched_nerf.losses import clash_loss

N_ATOMS = 16
#: Collective work objects kept alive until the interpreter exits (see the all_gather in main).
_KEEP_UNTIL_EXIT: list[object] = []
TARGET_END_TO_END = 10.0  # Angstrom


class ICNet(torch.nn.Module):
    def __init__(self, n: int, latent: int = 8) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(latent, 64), torch.nn.SiLU(), torch.nn.Linear(64, 3 * n)
        )

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raw_b, raw_a, raw_d = self.body(z).chunk(3, dim=-1)
        return (
            1.53 + 0.05 * torch.tanh(raw_b),
            math.radians(111.0) + 0.2 * torch.tanh(raw_a),
            math.pi * torch.tanh(raw_d),
        )


def main(quick: bool = False) -> float:
    """Train; returns the largest parameter difference between ranks (0.0 on one process)."""
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)  # same initial parameters on every rank (DDP also broadcasts them)
    table = bn.ConstructionTable.chain(N_ATOMS)
    net = ICNet(N_ATOMS)
    model = DistributedDataParallel(net) if distributed else net
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1000 + rank)  # different data on every rank
    steps, batch = (5, 32) if quick else (300, 128)
    start = time.perf_counter()
    loss = torch.zeros(())
    for _ in range(steps):
        bonds, angles, dihedrals = model(torch.randn(batch, 8, generator=gen))
        xyz = bn.to_cartesian(bonds, angles, dihedrals, table)
        end_to_end = (xyz[:, -1] - xyz[:, 0]).norm(dim=-1)
        loss = (
            clash_loss(xyz, table, min_distance=3.0, exclude_14=True).mean()
            + 0.01 * ((end_to_end - TARGET_END_TO_END) ** 2).mean()
        )
        opt.zero_grad()
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    max_diff = 0.0
    if distributed:
        gathered = [torch.empty_like(flat) for _ in range(world)]
        work = dist.all_gather(gathered, flat, async_op=True)
        work.wait()
        # Keep the collective's Work (and with it its tensors) referenced from Python until exit.
        # Otherwise gloo's worker thread may drop the last reference to these Python-made tensors
        # after this function returns, while the interpreter is already finalizing: freeing them
        # needs the GIL there, CPython ends the thread, and the unwind through gloo's noexcept
        # destructor calls std::terminate (SIGABRT, "terminate called without an active
        # exception"; docs/known_issues.md).
        _KEEP_UNTIL_EXIT.append(work)
        max_diff = max(float((g - gathered[0]).abs().max()) for g in gathered)
    if rank == 0:
        print(
            f"world size {world}: {steps} steps x {batch} per rank in {time.perf_counter() - start:.1f} s, "
            f"final loss {float(loss.detach()):.4f}"
        )
        print(f"PARAMS_MAX_DIFF {max_diff:.3e}")
    if distributed:
        dist.destroy_process_group()
    return max_diff


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps only")
    main(parser.parse_args().quick)
