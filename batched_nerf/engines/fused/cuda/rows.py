"""The fused plan on a device, as the Triton build kernels read it: the CPU kernels' row array
(`batched_nerf.engines.fused.rows`) as an ``int32`` device copy, with the components' runs and
the atom <-> row maps, made once per plan and device and kept with the plan."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from .. import rows as R

__all__ = ["DeviceRows", "device_rows"]


class DeviceRows(NamedTuple):
    """The fused plan's arrays on a device, as the kernels read them.

    ``rows``: ``(12, N)`` ``int32``, the plan's ``index`` (fields of `rows`); ``run_start``,
    ``run_len``: ``(C,)`` ``int32`` first row and row count of each component (a lane each);
    ``row_of_atom``, ``atom_of_row``: ``(N,)`` ``int64`` the row that places each atom and
    its inverse (the scratch is by row, the inputs and outputs by atom); ``seed_slot``: ``(N,)``
    ``int64`` each atom's seeded component (the pose it moves by; ``S``: none).
    """

    rows: Tensor
    run_start: Tensor
    run_len: Tensor
    row_of_atom: Tensor
    atom_of_row: Tensor
    seed_slot: Tensor
    n_units: int
    max_len: int


def device_rows(plan: Any, device: torch.device | str) -> DeviceRows:
    """`DeviceRows` of a fused plan (`batched_nerf.engines.fused.build.FusedPlan`) on ``device``,
    made once per plan and device and kept with the plan."""
    device = torch.device(device)
    key = ("device_rows", device)
    made = plan._reference.get(key)
    if made is None:
        index = torch.from_numpy(plan.index)
        runs = torch.from_numpy(plan.runs)
        made = DeviceRows(
            rows=index.to(device=device, dtype=torch.int32).contiguous(),
            run_start=runs[:-1].to(device=device, dtype=torch.int32),
            run_len=runs.diff().to(device=device, dtype=torch.int32),
            row_of_atom=torch.argsort(index[R.ATOM]).to(device),
            atom_of_row=index[R.ATOM].to(device),
            seed_slot=torch.tensor(plan.topology.seed_slot, dtype=torch.long, device=device),
            n_units=int(runs.numel() - 1),
            max_len=int(runs.diff().max()) if runs.numel() > 1 else 0,
        )
        plan._reference[key] = made
    return made
