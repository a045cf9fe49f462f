"""Degenerate inputs (docs/conventions.md, "Degenerate inputs"): one answer for every engine,
batch size and device, and NaN never hidden."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import METHODS
from reference import frames_to_cartesian
from test_scan import IRREGULAR

import batched_nerf as bn
from batched_nerf import data
from batched_nerf.engines.dispatch import auto_method
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
    assert (
        torch.isfinite(flow(xyz).log_det).item()
        and torch.isfinite(clash_loss(xyz, table, min_distance=1.0)).item()
    )


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


# ------------------------------------------------------------------ one answer for every engine
def _tables() -> dict[str, bn.ConstructionTable]:
    return {
        "chain": bn.ConstructionTable.chain(20),  # auto: scan below 4,096 samples, levels from there
        "protein": bn.protein.protein_table("GAWKC").table,  # auto: levels from 1,024 samples
        "alanine_dipeptide": data.load("alanine_dipeptide").table,  # irregular (POSITIONS) rows
        "irregular": bn.ConstructionTable(IRREGULAR),
    }


def _degenerate(table: bn.ConstructionTable, batch: int, seed: int = 0, negative: bool = False):  # type: ignore[no-untyped-def]
    """float64 inputs with zero bonds, angles of exactly 0, pi, -pi, 2 pi, > pi and < 0, dihedrals of pi."""
    g = torch.Generator().manual_seed(seed)
    n = table.n_atoms
    b = 0.8 + torch.rand(batch, n, generator=g, dtype=torch.float64)
    a = 0.3 + 2.5 * torch.rand(batch, n, generator=g, dtype=torch.float64)
    d = 6 * torch.rand(batch, n, generator=g, dtype=torch.float64) - 3
    pick = torch.rand(4, batch, n, generator=g)
    b = torch.where(pick[0] < 0.2, 0.0, b)
    special = torch.tensor([0.0, math.pi, -math.pi, 2 * math.pi, 4.0, -1.0], dtype=torch.float64)
    a = torch.where(pick[1] < 0.3, special[torch.randint(0, len(special), (batch, n), generator=g)], a)
    d = torch.where(pick[2] < 0.1, math.pi, d)
    if negative:
        b = torch.where(pick[3] < 0.05, -b - 0.5, b)
    return b, a, d


def _frames_reference(table: bn.ConstructionTable, b, a, d) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    """The definition, and the atoms that hang on an ill-conditioned row placed from positions."""
    refs = table.topology.refs
    out = [
        frames_to_cartesian(refs, *(t[s].numpy() for t in (b, a, d)), conditioning=True)
        for s in range(len(b))
    ]
    return torch.from_numpy(np.stack([x for x, _ in out])), torch.from_numpy(np.stack([m for _, m in out]))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["chain", "protein", "alanine_dipeptide", "irregular"])
@pytest.mark.parametrize("negative", [False, True], ids=["valid", "negative_bonds"])
def test_degenerate_inputs_follow_the_definition(method: str, name: str, negative: bool) -> None:
    table = _tables()[name]
    b, a, d = _degenerate(table, 6, seed=1, negative=negative)
    want, ill = _frames_reference(table, b, a, d)
    got = bn.to_cartesian(b, a, d, table, method=method)
    np.testing.assert_array_equal(got.isnan().numpy(), want.isnan().numpy())
    # rows placed from the positions of coincident or collinear references are decided by
    # rounding (and so is everything built on them): compared elsewhere
    if name in ("chain", "protein"):
        assert not ill.any()  # no such rows: everything is compared
    assert (~ill).sum() > 0.5 * ill.numel()
    ok = ~ill.unsqueeze(-1).expand_as(got)
    torch.testing.assert_close(got[ok], want[ok], atol=1e-9, rtol=0, equal_nan=True)
    if not negative:
        assert torch.isfinite(got).all()


@pytest.mark.parametrize("name", ["chain", "protein", "alanine_dipeptide"])
def test_auto_gives_one_answer_for_every_batch_size(name: str) -> None:
    table = _tables()[name]
    b, a, d = _degenerate(table, 4096, seed=2, negative=True)
    full = bn.to_cartesian(b, a, d, table)
    if name == "chain":  # the torch engines' switch (with numba, auto is the fused engine at every size)
        rule = [auto_method(table, size, "cpu", compiled=True) for size in (4095, 4096)]
        assert rule[0] != rule[1]
    for size in (1, 4095):
        part = bn.to_cartesian(b[:size], a[:size], d[:size], table)
        torch.testing.assert_close(part, full[:size], atol=1e-9, rtol=0, equal_nan=True)
    want, ill = _frames_reference(table, b[:3], a[:3], d[:3])
    ok = ~ill.unsqueeze(-1).expand_as(want)
    torch.testing.assert_close(full[:3][ok], want[ok], atol=1e-9, rtol=0, equal_nan=True)


def test_negative_bond_gives_nan_only_in_the_atoms_built_from_it() -> None:
    # 0-1-2-3-4 chain; 5 and 6 hang from 3 as siblings of 4 (methyl-like), 7 is built on 6
    refs = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [3, 2, 4], [3, 2, 5], [6, 3, 2]]
    table = bn.ConstructionTable(refs)
    b = torch.ones(8, dtype=torch.float64)
    a = torch.full((8,), 1.9, dtype=torch.float64)
    d = torch.full((8,), 2.0, dtype=torch.float64)
    for atom, nan_atoms in ((5, {5}), (6, {6, 7}), (3, {3, 4, 5, 6, 7}), (1, set(range(1, 8)))):
        bb = b.clone()
        bb[atom] = -1.0
        for method in METHODS:
            x = bn.to_cartesian(bb, a, d, table, method=method)
            assert set(torch.nonzero(x.isnan().any(-1)).flatten().tolist()) == nan_atoms, (method, atom)
            assert x.isnan().any(-1).eq(x.isnan().all(-1)).all()
    # the other atoms do not move, and zero bonds are valid
    bb = b.clone()
    bb[5] = -1.0
    x, y = bn.to_cartesian(bb, a, d, table), bn.to_cartesian(b, a, d, table)
    keep = [0, 1, 2, 3, 4, 6, 7]
    torch.testing.assert_close(x[keep], y[keep], rtol=0, atol=0)
    bb[5] = 0.0
    assert torch.isfinite(bn.to_cartesian(bb, a, d, table)).all()


def test_negative_bond_gradients_agree_between_engines() -> None:
    # the fused kernels make NaN for negative bonds per atom (no torch.where): same values and gradients
    table = bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [3, 2, 4]])
    gen = torch.Generator().manual_seed(5)
    b = 1.0 + torch.rand(3, 6, dtype=torch.float64, generator=gen)
    b[0, 5], b[1, 1], b[2, 3] = -0.5, -1.0, -2.0  # a leaf, the second seed, a mid-chain atom
    a = 1.5 + 0.5 * torch.rand(3, 6, dtype=torch.float64, generator=gen)
    d = torch.rand(3, 6, dtype=torch.float64, generator=gen)
    w = torch.randn(3, 6, 3, dtype=torch.float64, generator=gen)
    got = {}
    for method in METHODS:
        leaves = [t.clone().requires_grad_() for t in (b, a, d)]
        x = bn.to_cartesian(*leaves, table, method=method)
        x.nan_to_num(0.0).mul(w).sum().backward()
        got[method] = (x, *(t.grad for t in leaves))
    for method, outs in got.items():
        assert outs[1][b < 0].eq(0).all(), method  # no gradient for an out-of-domain bond
        for o, want in zip(outs, got["scan"]):
            torch.testing.assert_close(o, want, atol=1e-9, rtol=0, equal_nan=True, msg=method)


@pytest.mark.parametrize(
    "name", ["chain", "protein"]
)  # no rows placed from positions (ill-conditioned there)
def test_gradients_at_degenerate_inputs_agree_between_engines(name: str) -> None:
    table = _tables()[name]
    b, a, d = _degenerate(table, 3, seed=3)
    w = torch.randn(3, table.n_atoms, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    grads = {}
    for method in ("scan", "levels"):
        leaves = [t.clone().requires_grad_() for t in (b, a, d)]
        x = bn.to_cartesian(*leaves, table, method=method)
        grads[method] = torch.autograd.grad((x * w).sum(), leaves)
    for gs, gl in zip(grads["scan"], grads["levels"]):
        assert torch.isfinite(gs).all() and torch.isfinite(gl).all()
        torch.testing.assert_close(gs, gl, atol=1e-8, rtol=1e-8)
