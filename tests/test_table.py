"""ConstructionTable: constructors, properties, row order, plan cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import batched_nerf as bn

R = [-1, -1, -1]


@pytest.mark.parametrize(
    ("n", "refs"),
    [
        (1, [R]),
        (2, [R, [0, -1, -1]]),
        (3, [R, [0, -1, -1], [1, 0, -1]]),
        (5, [R, [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1]]),
    ],
)
def test_chain(n: int, refs: list[list[int]]) -> None:
    table = bn.ConstructionTable.chain(n)
    assert table.refs.tolist() == refs
    assert table.n_atoms == len(table) == n
    assert table.n_components == 1 and table.n_fixed == 0
    assert table.depth == max(0, n - 3)
    assert table == bn.ConstructionTable(refs)
    assert bn.ConstructionTable.chain(np.int64(n)) == table


def test_properties_and_copies() -> None:
    refs = np.array([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [-1, -1, -1], [4, -1, -1]], np.int32)
    table = bn.ConstructionTable(refs)
    assert table.refs.dtype == torch.long and table.refs.shape == (6, 3)
    assert table.fixed.dtype == torch.long and table.fixed.shape == (0,)
    assert table.components.tolist() == [0, 0, 0, 0, 1, 1]
    assert table.n_components == 2 and table.depth == 1
    # properties are copies: mutating them does not touch the table
    table.refs[0, 0] = 5
    table.components[0] = 3
    assert table.refs[0, 0] == -1 and table.components[0] == 0
    refs[0, 0] = 3  # nor does mutating the input
    assert table.refs[0, 0] == -1
    assert "n_atoms=6" in repr(table) and "n_components=2" in repr(table)


@pytest.mark.parametrize(
    "make",
    [
        lambda r: r,
        lambda r: np.asarray(r, dtype=np.int16),
        lambda r: np.asarray(r, dtype=np.int64),
        lambda r: torch.tensor(r, dtype=torch.int32),
        lambda r: torch.tensor(r),
        lambda r: tuple(tuple(row) for row in r),
    ],
)
def test_accepts_integer_array_likes(make) -> None:  # type: ignore[no-untyped-def]
    refs = bn.ConstructionTable.chain(5).refs.tolist()
    assert bn.ConstructionTable(make(refs)) == bn.ConstructionTable.chain(5)


def test_equality_and_hash() -> None:
    a = bn.ConstructionTable.chain(4)
    assert a == bn.ConstructionTable.chain(4)
    assert a != bn.ConstructionTable.chain(5)
    anchored = bn.ConstructionTable([R, R, R, [0, 1, 2]], fixed=[0, 1, 2])
    assert anchored != bn.ConstructionTable([R, R, R, [0, 1, 2]], fixed=[1, 0, 2])
    assert a != "table"
    assert {a: 1}[a] == 1  # hashable (by identity)


def test_rows_in_any_order() -> None:
    """The same molecule with rows permuted is a valid table with the permuted references."""
    chain = bn.ConstructionTable.chain(6).refs.numpy()
    perm = np.array([3, 5, 0, 1, 4, 2])  # new index of old atom k
    refs = np.empty_like(chain)
    refs[perm] = np.where(chain >= 0, perm[np.clip(chain, 0, None)], -1)
    table = bn.ConstructionTable(refs)
    assert table.depth == 3 and table.n_components == 1
    assert table.refs[perm[3]].tolist() == [perm[2], perm[1], perm[0]]


def test_small_and_many_components() -> None:
    refs = [R, R, [1, -1, -1], R, [3, -1, -1], [4, 3, -1], [5, 4, 3]]
    table = bn.ConstructionTable(refs)
    assert table.n_components == 3
    assert table.components.tolist() == [0, 1, 1, 2, 2, 2, 2]


def test_fixed_atoms() -> None:
    table = bn.ConstructionTable([R, [0, 2, 3], R, R, [1, 0, 2]], fixed=torch.tensor([3, 0, 2]))
    assert table.fixed.tolist() == [3, 0, 2] and table.n_fixed == 3
    assert table.n_components == 1
    assert table.depth == 2
    lone = bn.ConstructionTable([R, R, [1, -1, -1]], fixed=np.array([0]))
    assert lone.n_components == 2 and lone.fixed.tolist() == [0]
    assert bn.ConstructionTable.chain(3) == bn.ConstructionTable(bn.ConstructionTable.chain(3).refs, fixed=[])


@pytest.mark.parametrize("kind", ["levels", "inverse"])
def test_plan_is_cached(kind: str, device: torch.device) -> None:
    table = bn.ConstructionTable.chain(7)
    first = table.plan(kind, device)
    assert table.plan(kind, device) is first
    assert table.plan(kind, str(device)) is first
    if device.type == "cpu":
        assert table.plan(kind) is first


def test_plan_reused_by_conversions(method: str) -> None:
    table = bn.ConstructionTable.chain(7)
    levels = table.plan("levels")
    inverse = table.plan("inverse")
    x = bn.to_cartesian(torch.ones(7), torch.ones(7), torch.ones(7), table, method=method)
    bn.to_internal(x, table)
    assert table.plan("levels") is levels and table.plan("inverse") is inverse


def test_depth_of_branched_table() -> None:
    # a star: every atom built on the first three
    table = bn.ConstructionTable([R, [0, -1, -1], [1, 0, -1]] + [[2, 1, 0]] * 5)
    assert table.depth == 1
    # a chain hanging off the star doubles the depth
    refs = [R, [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [4, 3, 2], [2, 1, 0]]
    assert bn.ConstructionTable(refs).depth == 3
