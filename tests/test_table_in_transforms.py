"""Tables made from coordinates inside torch.func transforms (issue 43, item 4).

A table is topology: ``xyz`` only chooses the references, so making one inside
``grad``/``jacrev``/``jacfwd``/``hessian`` reads the values under the wrappers and
gives the table made outside. Under ``vmap`` there is no one table for the batch:
a ValueError says so.
"""

from __future__ import annotations

import pytest
import torch

import batched_nerf as bn

BONDS = [(0, 1), (1, 2), (2, 3), (3, 4), (1, 5)]
N = 6


def _xyz() -> torch.Tensor:
    return torch.randn(N, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))


def _energy(x: torch.Tensor, table: bn.ConstructionTable | None = None) -> torch.Tensor:
    table = bn.ConstructionTable.from_connectivity(BONDS, N, xyz=x) if table is None else table
    ic = bn.to_internal(x, table)
    return ic.dihedrals.sin().sum() + ic.angles.square().sum()


@pytest.mark.parametrize("transform", ["grad", "jacrev", "jacfwd"])
def test_from_connectivity_inside_first_order_transforms(transform: str) -> None:
    x = _xyz()
    outside = bn.ConstructionTable.from_connectivity(BONDS, N, xyz=x)
    got = getattr(torch.func, transform)(_energy)(x)
    want = getattr(torch.func, transform)(lambda y: _energy(y, outside))(x)
    torch.testing.assert_close(got, want)


def test_from_connectivity_inside_hessian() -> None:
    x = _xyz()
    outside = bn.ConstructionTable.from_connectivity(BONDS, N, xyz=x)
    torch.testing.assert_close(
        torch.func.hessian(_energy)(x), torch.func.hessian(lambda y: _energy(y, outside))(x)
    )


def test_from_xyz_inside_grad() -> None:
    mol = bn.data.load("alanine_dipeptide")
    x = bn.to_cartesian(mol.bonds, mol.angles, mol.dihedrals, mol.table)
    outside = bn.ConstructionTable.from_xyz(x, mol.elements)

    def f(y: torch.Tensor, table: bn.ConstructionTable | None = None) -> torch.Tensor:
        table = bn.ConstructionTable.from_xyz(y, mol.elements) if table is None else table
        return bn.to_internal(y, table).dihedrals.cos().sum()

    torch.testing.assert_close(torch.func.grad(f)(x), torch.func.grad(lambda y: f(y, outside))(x))


def test_from_connectivity_under_vmap_is_refused_by_name() -> None:
    batch = _xyz().expand(2, N, 3)
    with pytest.raises(ValueError, match=r"xyz is batched by torch\.func\.vmap.*outside vmap"):
        torch.func.vmap(_energy)(batch)
