"""Mixed devices: one ValueError naming the argument and both devices.

The ``meta`` device stands in for an accelerator, so these run on any machine.
"""

from __future__ import annotations

import pytest
import torch

import batched_nerf as bn

META = torch.device("meta")


def _inputs(n: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.ones(n), torch.full((n,), 2.0), torch.zeros(n)


def test_values_on_two_devices() -> None:
    b, a, d = _inputs()
    with pytest.raises(ValueError, match=r"angles is on device meta but bonds is on cpu"):
        bn.to_cartesian(b, a.to(META), d, bn.ConstructionTable.chain(4))


def test_fixed_xyz_on_another_device() -> None:
    table = bn.ConstructionTable([[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2]], fixed=[0, 1, 2])
    b, a, d = _inputs()
    with pytest.raises(ValueError, match=r"fixed_xyz is on device meta but the inputs are on cpu"):
        bn.to_cartesian(b, a, d, table, fixed_xyz=torch.eye(3, device=META))


@pytest.mark.parametrize("name", ["rotation", "translation"])
def test_pose_on_another_device(name: str) -> None:
    b, a, d = _inputs()
    pose = {"rotation": torch.eye(3, device=META), "translation": torch.zeros(3, device=META)}
    with pytest.raises(ValueError, match=rf"{name} is on device meta but the inputs are on cpu"):
        bn.to_cartesian(b, a, d, bn.ConstructionTable.chain(4), **{name: pose[name]})


def test_plans_follow_the_inputs_device() -> None:
    """A table is not tied to a device: plans are copied for the inputs' device (documented)."""
    table = bn.ConstructionTable.chain(5)
    assert table.plan("scan", META).inverse.device.type == "meta"
    assert table.plan("scan").inverse.device.type == "cpu"
