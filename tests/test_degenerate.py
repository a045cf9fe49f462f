"""Degenerate inputs (docs/conventions.md, "Degenerate inputs"): one answer for every engine,
batch size and device, and NaN never hidden."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import METHODS
from reference import frames_to_cartesian

import batched_nerf as bn
from batched_nerf import data
from batched_nerf.losses import clash_loss


def _molecule() -> tuple[bn.ConstructionTable, torch.Tensor]:
    z = data.load("alanine_dipeptide").to(dtype=torch.float64)
    return z.table, z.to_cartesian()


# ------------------------------------------------------------------ NaN propagation
@pytest.mark.parametrize("component", [0, None], ids=["x", "xyz"])
def test_nan_atom_gives_nan_in_exactly_the_coordinates_that_read_it(component: int | None) -> None:
    table, xyz = _molecule()
    refs = table.topology.refs
    for atom in range(table.n_atoms):
        x = xyz.clone()
        x[atom, slice(None) if component is None else component] = math.nan
        ic = bn.to_internal(x, table)
        for name, col, values in zip(("bonds", "angles", "dihedrals"), range(3), ic):
            # entry i reads atom i and its references up to this column
            reads = (np.arange(table.n_atoms) == atom) | (refs[:, : col + 1] == atom).any(1)
            reads &= refs[:, col] >= 0  # unused entries are exact zeros
            np.testing.assert_array_equal(values.isnan().numpy(), reads, err_msg=f"{name}, atom {atom}")


def test_nan_atom_gives_nan_log_det_and_clash_loss() -> None:
    table, xyz = _molecule()
    x = xyz.clone()
    x[5, 1] = math.nan
    flow = bn.InternalCoordinateTransform(table, pose=False)
    assert flow(x).log_det.isnan().item()
    assert clash_loss(x, table, min_distance=1.0).isnan().item()
    assert clash_loss(x, table, min_distance=1.0, reduction="none").isnan().any().item()
    assert torch.isfinite(flow(xyz).log_det).item() and torch.isfinite(clash_loss(xyz, table, min_distance=1.0)).item()


def test_geometry_helpers_let_nan_through_and_stay_smooth_at_zero() -> None:
    from batched_nerf._geometry import angle, dihedral, distance, safe_norm

    nan = torch.tensor([math.nan, 0.0, 0.0], dtype=torch.float64)
    zero = torch.zeros(3, dtype=torch.float64)
    ex, ey = torch.eye(3, dtype=torch.float64)[:2]
    assert safe_norm(nan).isnan() and distance(nan, zero).isnan()
    assert angle(nan, zero, ex).isnan() and dihedral(nan, zero, ex, ey).isnan()
    # exactly zero vectors: value 0, finite first and second derivatives
    v = zero.clone().requires_grad_()
    (g,) = torch.autograd.grad(safe_norm(v), v, create_graph=True)
    assert safe_norm(v).item() == 0 and torch.isfinite(g).all()
    (h,) = torch.autograd.grad(g.sum(), v)
    assert torch.isfinite(h).all()
