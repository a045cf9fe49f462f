"""One range for dihedrals on every engine: ``(-pi, pi]``, tested at exactly +-pi (issue 43, item 3).

A planar trans dihedral reads ``atan2(y, x)`` with ``x < 0`` and ``y`` zero or a rounding
error either side of it; ``-pi`` must read ``+pi`` on the fused kernels as on the torch
operations, so that the flow layer's normalised dihedrals stay in ``(0, 1]``.
"""

from __future__ import annotations

import math

import pytest
import torch

import batched_nerf as bn

pytest.importorskip("numba")

DTYPES = [torch.float64, torch.float32]


def _planar(y: float, dtype: torch.dtype) -> torch.Tensor:
    """A four-atom chain whose last dihedral is pi, the fourth atom ``y`` off the plane."""
    xyz = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, -1.0, y]]
    return torch.tensor(xyz, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("y", [0.0, -0.0, -1e-300, -1e-17, 1e-17], ids=repr)
@pytest.mark.parametrize("method", ["fused", "torch"])
def test_trans_dihedral_is_plus_pi(method: str, y: float, dtype: torch.dtype) -> None:
    table = bn.ConstructionTable.chain(4)
    d = bn.to_internal(_planar(y, dtype), table, method=method).dihedrals[3]
    assert d.item() == pytest.approx(math.pi, abs=1e-6)
    assert d > -math.pi


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_alanine_dipeptide_planar_rows_agree_across_engines(dtype: torch.dtype) -> None:
    """Row 18 of alanine dipeptide is planar: the fused kernel gave -pi where torch gave +pi."""
    mol = bn.data.load("alanine_dipeptide")
    xyz = bn.to_cartesian(*(v.to(dtype) for v in (mol.bonds, mol.angles, mol.dihedrals)), mol.table)
    batch = xyz.expand(3, -1, -1).contiguous()
    fused = bn.to_internal(batch, mol.table, method="fused").dihedrals
    reference = bn.to_internal(batch, mol.table, method="torch").dihedrals
    assert (fused > -math.pi).all() and (reference > -math.pi).all()
    torch.testing.assert_close(fused, reference)


def test_normalised_flow_dihedrals_stay_in_the_open_closed_unit_interval() -> None:
    mol = bn.data.load("alanine_dipeptide")
    xyz = bn.to_cartesian(mol.bonds, mol.angles, mol.dihedrals, mol.table).unsqueeze(0)
    z = bn.InternalCoordinateTransform(mol.table, normalize_angles=True)(xyz)
    assert (z.dihedrals > 0).all() and (z.dihedrals <= 1).all()
