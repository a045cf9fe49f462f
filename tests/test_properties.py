"""Property tests on random valid tables and random internal coordinates (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from reference import batched, reference_to_cartesian, reference_to_internal

import batched_nerf as bn
from batched_nerf.testing import (
    assert_same_geometry,
    construction_tables,
    fixed_positions,
    internal_coordinates,
    rigid_motions,
    used_entries,
)
from batched_nerf.testing import reference_to_cartesian as public_reference

# The `method` / `dtype` fixtures do not change between examples; each property
# runs once per (method, dtype), so each run gets a share of the profile's examples.
FIXTURES_OK = settings(
    max_examples=max(5, settings.default.max_examples // 4), suppress_health_check=list(HealthCheck)
)
NO_SHRINK = settings(database=None, phases=[Phase.generate], max_examples=200)

TABLES = construction_tables(min_atoms=1, max_atoms=16, max_components=3, fixed=None)


def tol(dtype: torch.dtype, scale: float = 1.0) -> float:
    """float64 tight, float32 loose relative to the coordinate scale."""
    return 1e-9 * max(1.0, scale) if dtype == torch.float64 else 1e-4 * max(1.0, scale)


def oracle(
    table: bn.ConstructionTable, ic: bn.InternalCoordinates, fixed_xyz: torch.Tensor | None
) -> np.ndarray:
    refs = table.refs.numpy()
    b, a, d = (t.double().cpu().numpy() for t in ic)
    lead = b.shape[:-1]
    n = table.n_atoms
    out = np.empty((*lead, n, 3)).reshape(-1, n, 3)
    flat = [v.reshape(-1, n) for v in (b, a, d)]
    fx = None
    if fixed_xyz is not None:
        fx = np.broadcast_to(fixed_xyz.double().cpu().numpy(), (*lead, table.n_fixed, 3)).reshape(
            -1, table.n_fixed, 3
        )
    for k in range(out.shape[0]):
        out[k] = reference_to_cartesian(
            refs,
            flat[0][k],
            flat[1][k],
            flat[2][k],
            fixed=table.fixed.tolist(),
            fixed_xyz=None if fx is None else fx[k],
        )
    return out.reshape(*lead, n, 3)


def emax(t: torch.Tensor) -> float:
    """Largest entry, 0 for an empty tensor."""
    return float(t.max()) if t.numel() else 0.0


def wrapped_diff(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """|x - y| modulo 2 pi."""
    d = torch.remainder(x.double() - y.double() + math.pi, 2 * math.pi) - math.pi
    return d.abs()


@st.composite
def systems(draw: st.DrawFn, dtype: torch.dtype, batch: tuple[int, ...] = (2,), tables=TABLES):  # type: ignore[no-untyped-def]
    table = draw(tables)
    ic = draw(internal_coordinates(table, batch_shape=batch, dtype=dtype))
    fixed = draw(fixed_positions(table, batch_shape=batch, dtype=dtype))
    return table, ic, fixed


@FIXTURES_OK
@given(data=st.data())
def test_to_cartesian_matches_sequential_reference(
    data: st.DataObject, method: str, dtype: torch.dtype
) -> None:
    table, ic, fixed = data.draw(systems(dtype))
    xyz = bn.to_cartesian(*ic, table, fixed_xyz=fixed, method=method)
    assert xyz.shape == (2, table.n_atoms, 3) and xyz.dtype == dtype
    ref = oracle(table, ic, fixed)
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(xyz.double().numpy(), ref, rtol=0, atol=tol(dtype, scale))
    if table.n_fixed:
        assert torch.equal(xyz[..., table.fixed, :], fixed)


@FIXTURES_OK
@given(data=st.data())
def test_output_has_the_requested_internal_coordinates(data: st.DataObject, method: str) -> None:
    """Bonds, angles and dihedrals of the output, recomputed by numpy formulas, match the inputs."""
    table, ic, fixed = data.draw(systems(torch.float64))
    xyz = bn.to_cartesian(*ic, table, fixed_xyz=fixed, method=method).numpy()
    got = batched(
        lambda x: np.stack(reference_to_internal(table.refs.numpy(), x.reshape(-1, 3))), xyz.reshape(2, -1)
    )
    masks = used_entries(table)
    for k, (want, mask) in enumerate(zip(ic, masks)):
        g = torch.from_numpy(got[:, k])[:, mask]
        w = want[:, mask]
        err = wrapped_diff(g, w) if k == 2 else (g - w).abs()
        assert emax(err) < 1e-9


@FIXTURES_OK
@given(data=st.data())
def test_round_trip_internal(data: st.DataObject, method: str, dtype: torch.dtype) -> None:
    table, ic, fixed = data.draw(systems(dtype))
    xyz = bn.to_cartesian(*ic, table, fixed_xyz=fixed, method=method)
    back = bn.to_internal(xyz, table)
    assert isinstance(back, bn.InternalCoordinates)
    scale = float(xyz.abs().max()) if xyz.numel() else 1.0
    eps = tol(dtype, scale) * (1 if dtype == torch.float64 else 10)
    for k, (got, want, mask) in enumerate(zip(back, ic, used_entries(table))):
        assert got.dtype == dtype and got.shape == want.shape
        err = wrapped_diff(got, want) if k == 2 else (got.double() - want.double()).abs()
        assert emax(err[..., mask]) < eps, k
        assert torch.all(got[..., ~mask] == 0)
    assert back.dihedrals.min() > -math.pi and back.dihedrals.max() <= math.pi
    assert back.angles.min() >= 0 and back.angles.max() <= math.pi


@FIXTURES_OK
@given(data=st.data())
def test_round_trip_cartesian_up_to_rigid_motion(
    data: st.DataObject, method: str, dtype: torch.dtype
) -> None:
    table, ic, fixed = data.draw(systems(torch.float64))
    rot, shift = data.draw(rigid_motions(batch_shape=(2,)))
    x = bn.to_cartesian(*ic, table, fixed_xyz=fixed, method=method)
    y = (x @ rot.mT + shift[:, None, :]).to(dtype)
    fixed_y = y[..., table.fixed, :] if table.n_fixed else None
    z = bn.to_cartesian(*bn.to_internal(y, table), table, fixed_xyz=fixed_y, method=method)
    assert z.dtype == dtype
    scale = float(y.abs().max())
    assert_same_geometry(z, y, atol=tol(dtype, scale) * 10, components=table.components)
    if table.n_fixed:
        # anchored atoms are not moved: the whole anchored component is reproduced exactly
        anchored = torch.isin(table.components, table.components[table.fixed])
        torch.testing.assert_close(
            z[..., anchored, :], y[..., anchored, :], rtol=0, atol=tol(dtype, scale) * 10
        )


@FIXTURES_OK
@given(data=st.data())
def test_to_internal_invariant_under_rigid_motion(data: st.DataObject, dtype: torch.dtype) -> None:
    table, ic, fixed = data.draw(systems(torch.float64))
    rot, shift = data.draw(rigid_motions(batch_shape=(2,)))
    x = bn.to_cartesian(*ic, table, fixed_xyz=fixed)
    y = x @ rot.mT + shift[:, None, :]
    a = bn.to_internal(x.to(dtype), table)
    b = bn.to_internal(y.to(dtype), table)
    scale = float(y.abs().max())
    for k, (u, v) in enumerate(zip(a, b)):
        err = wrapped_diff(u, v) if k == 2 else (u - v).abs()
        assert float(err.max()) < tol(dtype, scale) * 10


@FIXTURES_OK
@given(data=st.data())
def test_to_internal_matches_numpy_formulas(data: st.DataObject, dtype: torch.dtype) -> None:
    """to_internal of arbitrary (random, unstructured) coordinates against the numpy oracle."""
    table = data.draw(TABLES)
    seed = data.draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    x = 2.0 * torch.randn(3, table.n_atoms, 3, generator=g, dtype=torch.float64)
    got = bn.to_internal(x.to(dtype), table)
    want = batched(
        lambda v: np.stack(reference_to_internal(table.refs.numpy(), v.reshape(-1, 3))), x.reshape(3, -1)
    )
    # random points can be nearly collinear: compare where the oracle is well conditioned
    for k in range(3):
        w = torch.from_numpy(want[:, k])
        err = wrapped_diff(got[k], w) if k == 2 else (got[k].double() - w).abs()
        assert float(err.max()) < (1e-9 if dtype == torch.float64 else 2e-3), k


# ------------------------------------------------------------ testing module
@settings(max_examples=40)
@given(
    table=construction_tables(min_atoms=2, max_atoms=20, max_components=4, fixed=None, shuffle=True),
)
def test_generated_tables_are_valid_and_varied(table: bn.ConstructionTable) -> None:
    assert 2 <= table.n_atoms <= 20
    refs = table.refs
    # seed rows: one root, at most one second and third seed row per seeded component
    n_refs = (refs >= 0).sum(1)
    fixed = set(table.fixed.tolist())
    for c in range(table.n_components):
        members = (table.components == c).nonzero().flatten().tolist()
        roots = [i for i in members if n_refs[i] == 0 and i not in fixed]
        assert len(roots) == (0 if fixed & set(members) else 1)


@settings(max_examples=20)
@given(table=construction_tables(min_atoms=3, max_atoms=12, fixed=True))
def test_generated_tables_with_fixed(table: bn.ConstructionTable) -> None:
    assert table.n_fixed >= 1
    assert bn.ConstructionTable(table.refs, fixed=table.fixed) == table


def test_table_strategy_options() -> None:
    from hypothesis import find

    t = find(
        construction_tables(min_atoms=6, max_atoms=6, shuffle=False, max_components=1, branched=False),
        lambda t: True,
        settings=NO_SHRINK,
    )
    assert t.refs[3:, 0].tolist() == [2, 3, 4] and t.refs[0].tolist() == [-1, -1, -1]
    shuffled = find(
        construction_tables(min_atoms=6, max_atoms=6, max_components=1),
        lambda t: t.refs[0, 0] != -1,
        settings=NO_SHRINK,
    )
    assert shuffled.n_atoms == 6
    branched = find(
        construction_tables(min_atoms=8, max_atoms=8, max_components=1, branched=True, shuffle=False),
        lambda t: len(set(t.refs[3:, 0].tolist())) < 5,
        settings=NO_SHRINK,
    )
    assert branched.n_components == 1
    multi = find(
        construction_tables(min_atoms=5, max_atoms=9, max_components=3),
        lambda t: t.n_components == 3,
        settings=NO_SHRINK,
    )
    assert multi.n_components == 3
    with pytest.raises(ValueError, match="min_atoms"):
        find(construction_tables(min_atoms=0), lambda t: True, settings=NO_SHRINK)


@settings(max_examples=15)
@given(data=st.data())
def test_public_reference_agrees_with_test_oracle(data: st.DataObject) -> None:
    table, ic, fixed = data.draw(systems(torch.float64))
    ours = public_reference(*ic, table, fixed_xyz=fixed)
    np.testing.assert_allclose(ours.numpy(), oracle(table, ic, fixed), atol=1e-10)


def test_assert_same_geometry_detects_mirror_and_distortion() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    assert_same_geometry(x, x + 5.0, atol=1e-9)
    mirror = x * torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    with pytest.raises(AssertionError, match="mirror"):
        assert_same_geometry(x, mirror, atol=1e-6)
    distorted = x.clone()
    distorted[1, 2, 0] += 1e-3
    with pytest.raises(AssertionError, match="distance"):
        assert_same_geometry(x, distorted, atol=1e-6)
    # two groups moving independently are fine only with `components`
    moved = x.clone()
    moved[..., 3:, :] += 1.0
    with pytest.raises(AssertionError):
        assert_same_geometry(x, moved, atol=1e-6)
    assert_same_geometry(x, moved, atol=1e-9, components=torch.tensor([0, 0, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match="N, 3"):
        assert_same_geometry(x[..., :2], x[..., :2])


@settings(max_examples=10)
@given(data=st.data())
def test_strategies_shapes_dtypes(data: st.DataObject) -> None:
    table = data.draw(construction_tables(max_atoms=8, fixed=True))
    ic = data.draw(internal_coordinates(table, batch_shape=(2, 3), dtype=torch.float32, angle_margin=0.5))
    assert all(t.shape == (2, 3, table.n_atoms) and t.dtype == torch.float32 for t in ic)
    assert float(ic.angles.min()) >= 0.5 - 1e-6 and float(ic.angles.max()) <= math.pi - 0.5 + 1e-6
    fx = data.draw(fixed_positions(table, batch_shape=(3,), dtype=torch.float32))
    assert fx is not None and fx.shape == (3, table.n_fixed, 3) and fx.dtype == torch.float32
    rot, t = data.draw(rigid_motions(batch_shape=(4,), dtype=torch.float32))
    torch.testing.assert_close(rot @ rot.mT, torch.eye(3).expand(4, 3, 3), atol=1e-5, rtol=0)
    assert torch.allclose(torch.linalg.det(rot), torch.ones(4), atol=1e-5) and t.shape == (4, 3)
    assert data.draw(fixed_positions(bn.ConstructionTable.chain(3))) is None


def test_import_does_not_need_hypothesis() -> None:
    """``import batched_nerf`` must not import the testing module (hypothesis is a test-only dependency)."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, batched_nerf; "
        "assert 'hypothesis' not in sys.modules and 'batched_nerf.testing' not in sys.modules"
    )
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)
