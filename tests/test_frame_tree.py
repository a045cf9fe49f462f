"""The frame tree (engines/frame_tree.py): classification and the float64 definition it encodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from reference import batched, frames_to_cartesian, reference_frame_tree, reference_to_cartesian
from test_scan import IRREGULAR

import batched_nerf as bn
from batched_nerf import data
from batched_nerf.testing import construction_tables, fixed_positions, internal_coordinates
from batched_nerf.topology.frame_tree import ANCHOR, NONE, PARENT, POSITIONS, frame_tree

FIELDS = ("frame", "parent", "dihedral_ref", "phi_from", "flip_on")
#: rows hanging from a third seed (3, 4), irregular rows (5, 9) and primary rows (6, 7) with
#: siblings (8 of 7, 10 of 9)
SIBLINGS = [
    [-1, -1, -1],
    [0, -1, -1],
    [0, 1, -1],
    [0, 1, 2],
    [0, 1, 3],
    [1, 0, 2],
    [5, 1, 0],
    [6, 5, 1],
    [6, 5, 7],
    [6, 0, 3],
    [6, 0, 9],
]


def _tables() -> list[bn.ConstructionTable]:
    return [
        bn.ConstructionTable(IRREGULAR),
        bn.ConstructionTable(SIBLINGS),
        bn.ConstructionTable.chain(12),
        data.load("alanine_dipeptide").table,
        bn.protein.protein_table("GAWKC").table,
    ]


def _check_fields(table: bn.ConstructionTable) -> None:
    tree = frame_tree(table.topology)
    want = reference_frame_tree(table.topology.refs)
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(tree, name), want[name], err_msg=name)
        assert getattr(tree, name).dtype == np.int64


@pytest.mark.parametrize("k", range(5))
def test_fields_match_the_loop_reference(k: int) -> None:
    _check_fields(_tables()[k])


@given(construction_tables(max_atoms=30, fixed=None))
def test_fields_match_the_loop_reference_random(table: bn.ConstructionTable) -> None:
    _check_fields(table)


def test_classification_of_known_rows() -> None:
    tree = frame_tree(bn.ConstructionTable(SIBLINGS).topology)
    F, A, P, X = NONE, ANCHOR, PARENT, POSITIONS
    assert tree.frame.tolist() == [F, F, A, A, A, X, P, P, P, X, X]
    assert tree.parent.tolist() == [-1, -1, 2, 2, 2, -1, 5, 6, 6, -1, -1]
    assert tree.dihedral_ref.tolist() == [-1, -1, -1, 2, 2, 2, 0, 1, 1, 3, 3]
    assert tree.phi_from.tolist() == [-1, -1, -1, -1, 3, -1, -1, -1, 7, -1, 9]
    assert tree.flip_on.tolist() == [-1, -1, -1, 2, 3, -1, -1, -1, 7, -1, 9]


def _inputs(table: bn.ConstructionTable, batch: int, degenerate: bool, seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    n = table.n_atoms
    b = 0.8 + torch.rand(batch, n, generator=g, dtype=torch.float64)
    a = 0.3 + 2.5 * torch.rand(batch, n, generator=g, dtype=torch.float64)
    d = 6 * torch.rand(batch, n, generator=g, dtype=torch.float64) - 3
    if degenerate:
        pick = torch.rand(3, batch, n, generator=g)
        b = torch.where(pick[0] < 0.2, 0.0, b)
        special = torch.tensor([0.0, torch.pi, -torch.pi, 4.0, -1.0, 2 * torch.pi], dtype=torch.float64)
        choice = special[torch.randint(0, len(special), (batch, n), generator=g)]
        a = torch.where(pick[1] < 0.3, choice, a)
        d = torch.where(pick[2] < 0.1, torch.pi, d)
    return b, a, d


def _reference(table: bn.ConstructionTable, b, a, d, fixed=None):  # type: ignore[no-untyped-def]
    kwargs = {"fixed": table.fixed.tolist()} if fixed is not None else {}
    arrays = [b.numpy(), a.numpy(), d.numpy()] + (
        [fixed.reshape(fixed.shape[0], -1).numpy()] if fixed is not None else []
    )

    def one(bb, aa, dd, ff=None):  # type: ignore[no-untyped-def]
        fx = None if ff is None else ff.reshape(-1, 3)
        return frames_to_cartesian(table.topology.refs, bb, aa, dd, fixed_xyz=fx, **kwargs)

    return torch.from_numpy(batched(one, *arrays))


@pytest.mark.parametrize("k", range(5))
@pytest.mark.parametrize("degenerate", [False, True], ids=["regular", "degenerate"])
def test_definition_is_the_scan_engine(k: int, degenerate: bool) -> None:
    table = _tables()[k]
    b, a, d = _inputs(table, 3, degenerate, seed=k)
    want = _reference(table, b, a, d)
    got = bn.to_cartesian(b, a, d, table, method="scan")
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)


@given(data=st.data(), table=construction_tables(max_atoms=30, fixed=None))
def test_definition_is_the_scan_engine_random(data: st.DataObject, table: bn.ConstructionTable) -> None:
    seed = data.draw(st.integers(0, 2**16))
    b, a, d = _inputs(table, 2, data.draw(st.booleans()), seed)
    fixed = data.draw(fixed_positions(table, batch_shape=(2,)))
    want = _reference(table, b, a, d, fixed)
    got = bn.to_cartesian(b, a, d, table, method="scan", fixed_xyz=fixed)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)


@given(data=st.data(), table=construction_tables(max_atoms=20, fixed=None))
def test_definition_equals_positions_for_regular_inputs(
    data: st.DataObject, table: bn.ConstructionTable
) -> None:
    b, a, d = data.draw(internal_coordinates(table, batch_shape=(2,), dtype=torch.float64))
    fixed = data.draw(fixed_positions(table, batch_shape=(2,), dtype=torch.float64))
    kwargs = {"fixed": table.fixed.tolist()} if fixed is not None else {}
    refs = table.topology.refs
    for s in range(2):
        fx = None if fixed is None else fixed[s].numpy()
        want = reference_to_cartesian(refs, b[s].numpy(), a[s].numpy(), d[s].numpy(), fixed_xyz=fx, **kwargs)
        got = frames_to_cartesian(refs, b[s].numpy(), a[s].numpy(), d[s].numpy(), fixed_xyz=fx, **kwargs)
        np.testing.assert_allclose(got, want, atol=1e-9, rtol=0)
