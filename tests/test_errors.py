"""Bad input: every error names the row (tables) or the shapes (conversions); never IndexError."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import batched_nerf as bn

R, S = [-1, -1, -1], [0, -1, -1]


def table_error(refs, fixed=None) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as info:
        bn.ConstructionTable(refs, fixed=fixed)
    return str(info.value)


# ------------------------------------------------------------------ tables
@pytest.mark.parametrize(
    ("refs", "match"),
    [
        ([[-1, -1]], r"refs must have shape \(N, 3\), got \(1, 2\)"),
        ([-1, -1, -1], r"refs must have shape \(N, 3\), got \(3,\)"),
        (np.full((2, 3, 1), -1), r"refs must have shape \(N, 3\), got \(2, 3, 1\)"),
        ([], r"refs must have shape \(N, 3\), got \(0,\)"),
        ([[-1, -1, -1, -1]], r"refs must have shape \(N, 3\), got \(1, 4\)"),
    ],
)
def test_table_shape(refs, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        bn.ConstructionTable(refs)


def test_table_ragged_rows() -> None:
    """Rows of different lengths are a shape error, reported by the table (not by numpy)."""
    with pytest.raises(ValueError, match=r"refs must have shape \(N, 3\)"):
        bn.ConstructionTable([R, [0, -1]])


@pytest.mark.parametrize(
    "refs",
    [
        np.array([R, S], dtype=np.float64),
        torch.tensor([R, S], dtype=torch.float32),
        [[-1.0, -1.0, -1.0]],
        np.array([[True, False, True]]),
        [["a", "b", "c"]],
    ],
    ids=["numpy-float", "torch-float", "list-float", "bool", "str"],
)
def test_table_dtype(refs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"refs must hold integers, got dtype"):
        bn.ConstructionTable(refs)


@pytest.mark.parametrize("bad", [4, -2, 100])
def test_table_out_of_range(bad: int) -> None:
    msg = table_error([R, S, [1, 0, -1], [2, 1, bad]])
    assert re.match(rf"row 3: reference {bad} out of range", msg), msg
    assert "[0, 3]" in msg


def test_table_not_filled_from_left() -> None:
    assert table_error([R, S, [1, -1, 0]]).startswith("row 2: references must be filled from the left")
    assert table_error([R, [-1, 0, -1]]).startswith("row 1: references must be filled from the left")


def test_table_self_reference() -> None:
    assert table_error([R, S, [1, 0, -1], [3, 1, 0]]).startswith("row 3: atom 3 references itself")
    assert table_error([R, [1, -1, -1]]).startswith("row 1: atom 1 references itself")


def test_table_repeated_atoms() -> None:
    assert table_error([R, S, [1, 0, -1], [2, 1, 1]]).startswith("row 3: repeated atom in references")
    assert table_error([R, S, [1, 1, -1]]).startswith("row 2: repeated atom in references")


def test_table_cycle() -> None:
    msg = table_error([R, S, [1, 0, -1], [4, 1, 0], [3, 1, 0]])
    assert msg.startswith("row 3: reference cycle 3 -> 4 -> 3"), msg
    msg = table_error([R, S, [1, 0, -1], [5, 1, 0], [3, 2, 1], [4, 2, 1]])
    assert re.match(r"row \d: reference cycle (\d -> ){3}\d", msg), msg


@pytest.mark.parametrize(
    ("refs", "match"),
    [
        # two roots linked into one component
        (
            [R, R, [0, 1, -1]],
            r"row 0: the component of atoms \[0, 1, 2\] has 2 seed rows of the form \(-1, -1, -1\)",
        ),
        # no (b, -1, -1) row
        ([R, [0, 2, -1], [0, 1, -1]], r"has 0 seed rows of the form \(b, -1, -1\); expected exactly 1"),
        # two (b, -1, -1) rows in a three-atom component
        ([R, S, S], r"row 1: the component of atoms \[0, 1, 2\] has 2 seed rows of the form \(b, -1, -1\)"),
        # two (b, a, -1) rows
        ([R, S, [1, 0, -1], [0, 1, -1]], r"row 2: .* has 2 seed rows of the form \(b, a, -1\)"),
        # no (b, a, -1) row in a four-atom component
        ([R, S, [1, 0, 3], [1, 0, 2]], r"has 0 seed rows of the form \(b, a, -1\)"),
        # second seed not on the root
        (
            [R, [2, -1, -1], [0, 1, -1]],
            r"row 1: the seed row \(b, -1, -1\) must reference its component's root",
        ),
        # third seed not on the first two
        ([R, S, [3, 0, -1], [1, 0, 2]], r"row 2: the seed row \(b, a, -1\) must reference the root atom 0"),
    ],
)
def test_table_seed_patterns(refs, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        bn.ConstructionTable(refs)


def test_table_not_connected_to_seed() -> None:
    msg = table_error([R, S, [1, 0, -1], [2, 1, 0], [5, 6, 7], [4, 6, 7], [4, 5, 7], [4, 5, 6]])
    assert msg.startswith("row 4: atoms [4, 5, 6, 7] are not connected to any seed atom"), msg
    msg = table_error([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])
    assert msg.startswith("row 0: atoms [0, 1, 2, 3] are not connected"), msg


@pytest.mark.parametrize(
    ("fixed", "match"),
    [
        ([4], r"fixed atom 4 out of range \[0, 3\]"),
        ([-1], r"fixed atom -1 out of range"),
        ([0, 1, 0], r"fixed atom 0 listed twice"),
        ([[0, 1]], r"fixed must be a 1-D sequence of atom indices, got shape \(1, 2\)"),
        (np.int64(0), r"fixed must be a 1-D sequence of atom indices, got shape \(\)"),
        ([0.0, 1.0], r"fixed must hold integers, got dtype float64"),
        (torch.tensor([0.0]), r"fixed must hold integers"),
        ([0, 1, 3], r"row 3: fixed atom must have references \(-1, -1, -1\), got \[0, 1, 2\]"),
        (
            [0, 1],
            r"row 2: component of atoms \[0, 1, 2, 3\] is anchored by fixed atoms \[0, 1\] "
            r"and must not contain seed rows",
        ),
    ],
)
def test_bad_fixed_atoms(fixed, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        bn.ConstructionTable([R, R, R, [0, 1, 2]], fixed=fixed)


def test_fixed_with_seed_rows_in_component() -> None:
    with pytest.raises(
        ValueError, match=r"row 1: component of atoms \[0, 1\] is anchored by fixed atoms \[0\]"
    ):
        bn.ConstructionTable([R, S], fixed=[0])


def test_fixed_not_a_sequence() -> None:
    """A bare int is a bad `fixed` argument: an error that says so, not "'int' object is not iterable"."""
    with pytest.raises((ValueError, TypeError), match="fixed"):
        bn.ConstructionTable([R, S], fixed=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "3", None])
def test_chain_length(n) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"chain length must be a positive integer, got"):
        bn.ConstructionTable.chain(n)


@settings(max_examples=150)
@given(
    st.integers(1, 6).flatmap(
        lambda n: st.tuples(
            st.lists(st.lists(st.integers(-2, n + 1), min_size=3, max_size=3), min_size=n, max_size=n),
            st.none() | st.lists(st.integers(-2, n + 1), max_size=3),
        )
    )
)
def test_random_tables_raise_only_value_error(args) -> None:  # type: ignore[no-untyped-def]
    """Fuzz: any integer table is either valid or a ValueError naming the reason; never IndexError."""
    refs, fixed = args
    try:
        table = bn.ConstructionTable(refs, fixed=fixed)
    except ValueError as err:
        assert str(err)
        return
    # a valid table converts
    n = table.n_atoms
    f = (
        torch.zeros(table.n_fixed, 3)
        + torch.arange(table.n_fixed)[:, None] * torch.tensor([1.0, 0.3, 0.1]) ** 2
    )
    x = bn.to_cartesian(
        torch.ones(n), torch.full((n,), 1.9), torch.ones(n), table, fixed_xyz=f if table.n_fixed else None
    )
    assert x.shape == (n, 3)
    assert bn.to_internal(x, table).bonds.shape == (n,)


# ----------------------------------------------------------- conversions
TABLE = bn.ConstructionTable.chain(4)
FIXED = bn.ConstructionTable([R, R, R, [0, 1, 2]], fixed=[0, 1, 2])


def ones(*shape: int) -> torch.Tensor:
    return torch.ones(shape)


@pytest.mark.parametrize("fn", ["to_cartesian", "to_internal"])
@pytest.mark.parametrize("table", [[R, S], None, "chain", np.array([R])])
def test_not_a_table(fn: str, table) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match=r"table must be a ConstructionTable, got"):
        if fn == "to_cartesian":
            bn.to_cartesian(ones(2), ones(2), ones(2), table)
        else:
            bn.to_internal(ones(2, 3), table)


def test_unknown_method() -> None:
    expected = r"method must be one of \('auto', 'scan', 'levels', 'fused'\), got 'fast'"
    with pytest.raises(ValueError, match=expected):
        bn.to_cartesian(ones(4), ones(4), ones(4), TABLE, method="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("shapes", "name", "got"),
    [
        (((5,), (4,), (4,)), "bonds", r"\(5,\)"),
        (((4,), (2, 3), (4,)), "angles", r"\(2, 3\)"),
        (((4,), (4,), (4, 1)), "dihedrals", r"\(4, 1\)"),
        (((), (4,), (4,)), "bonds", r"\(\)"),
    ],
)
def test_last_dim_mismatch(shapes, name: str, got: str, method: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(
        ValueError, match=rf"{name} must have shape \(\.\.\., N\) with N = 4 atoms of the table, got {got}"
    ):
        bn.to_cartesian(*(ones(*s) for s in shapes), TABLE, method=method)


def test_non_broadcasting(method: str) -> None:
    with pytest.raises(
        ValueError, match=r"bonds, angles and dihedrals do not broadcast: shapes \(2, 4\), \(3, 4\), \(4,\)"
    ):
        bn.to_cartesian(ones(2, 4), ones(3, 4), ones(4), TABLE, method=method)


def test_fixed_xyz_errors(method: str) -> None:
    with pytest.raises(
        ValueError, match=r"the table has 3 fixed atoms: pass fixed_xyz of shape \(\.\.\., 3, 3\)"
    ):
        bn.to_cartesian(ones(4), ones(4), ones(4), FIXED, method=method)
    with pytest.raises(ValueError, match=r"fixed_xyz was given but the table has no fixed atoms"):
        bn.to_cartesian(ones(4), ones(4), ones(4), TABLE, fixed_xyz=ones(3, 3), method=method)
    for shape in [(2, 3), (3, 2), (3,), (2, 4, 3)]:
        with pytest.raises(
            ValueError, match=rf"fixed_xyz must have shape \(\.\.\., 3, 3\), got {re.escape(str(shape))}"
        ):
            bn.to_cartesian(ones(4), ones(4), ones(4), FIXED, fixed_xyz=ones(*shape), method=method)
    with pytest.raises(
        ValueError,
        match=r"fixed_xyz of shape \(5, 3, 3\) does not broadcast with internal coordinates "
        r"of shape \(2, 4\)",
    ):
        bn.to_cartesian(ones(2, 4), ones(4), ones(4), FIXED, fixed_xyz=ones(5, 3, 3), method=method)
    with pytest.raises(TypeError, match=r"fixed_xyz must be a real floating tensor"):
        bn.to_cartesian(ones(4), ones(4), ones(4), FIXED, fixed_xyz=torch.ones(3, 3, dtype=torch.complex64))


@pytest.mark.parametrize("shape", [(4,), (4, 2), (5, 3), (2, 3, 4), (3, 4), ()])
def test_xyz_shape(shape: tuple[int, ...]) -> None:
    with pytest.raises(
        ValueError, match=rf"xyz must have shape \(\.\.\., N, 3\) with N = 4, got {re.escape(str(shape))}"
    ):
        bn.to_internal(torch.ones(shape), TABLE)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bool])
def test_non_real_dtypes(dtype: torch.dtype, method: str) -> None:
    with pytest.raises(TypeError, match=r"angles must be a real floating tensor, got dtype"):
        bn.to_cartesian(ones(4), torch.ones(4, dtype=dtype), ones(4), TABLE, method=method)
    with pytest.raises(TypeError, match=r"xyz must be a real floating tensor, got dtype"):
        bn.to_internal(torch.ones(4, 3, dtype=dtype), TABLE)


def test_unknown_plan_kind() -> None:
    with pytest.raises(ValueError, match=r"unknown plan kind 'bogus'"):
        TABLE.plan("bogus")


# ------------------------------------------------------------ wrong types
def _xyz4() -> torch.Tensor:
    b, a, d = torch.ones(4), torch.full((4,), 2.0), torch.ones(4)
    return bn.to_cartesian(b, a, d, TABLE)


def _entry_points() -> dict:  # type: ignore[type-arg]
    """Public functions that take array-likes, each as ``bad -> call`` with ``bad`` in one argument."""
    from batched_nerf.losses import clash_loss, committor_loss

    xyz = _xyz4()
    ic = bn.to_internal(xyz, TABLE)
    q_x = torch.zeros(2, 4, 3, requires_grad=True)
    return {
        "to_cartesian:bonds": lambda v: bn.to_cartesian(v, ic.angles, ic.dihedrals, TABLE),
        "to_cartesian:dihedrals": lambda v: bn.to_cartesian(ic.bonds, ic.angles, v, TABLE),
        "to_cartesian:fixed_xyz": lambda v: bn.to_cartesian(ones(4), ones(4), ones(4), FIXED, fixed_xyz=v),
        "to_internal:xyz": lambda v: bn.to_internal(v, TABLE),
        "log_det_jacobian:angles": lambda v: bn.log_det_jacobian(ic.bonds, v, ic.dihedrals, TABLE),
        "pose_log_det:bonds": lambda v: bn.pose_log_det(v, ic.angles, ic.dihedrals, TABLE),
        "extract_pose:xyz": lambda v: bn.extract_pose(v, TABLE),
        "apply_pose:rotation": lambda v: bn.apply_pose(xyz, TABLE, rotation=v),
        "rotation_from_angles:angles": bn.rotation_from_angles,
        "rotation_angles:rotation": bn.rotation_angles,
        "ZMatrix:bonds": lambda v: bn.ZMatrix(TABLE, v, ic.angles, ic.dihedrals),
        "ZMatrix.from_cartesian:xyz": lambda v: bn.ZMatrix.from_cartesian(v, TABLE),
        "clash_loss:xyz": lambda v: clash_loss(v, TABLE, min_distance=1.0),
        "committor_loss:masses": lambda v: committor_loss(q_x.sum((1, 2)), q_x, masses=v),
        "committor_loss:weights": lambda v: committor_loss(q_x.sum((1, 2)), q_x, weights=v),
        "protein.build:phi": lambda v: bn.protein.build("GA", v, torch.zeros(2)),
        "protein.torsions:xyz": lambda v: bn.protein.torsions(v, "GA"),
    }


@pytest.mark.parametrize("entry", list(_entry_points()))
@pytest.mark.parametrize(
    ("bad", "type_name"),
    [(None, "NoneType"), ("1.0", "str"), ({"x": 1.0}, "dict"), (object(), "object"), (["a", "b"], "list")],
    ids=["None", "str", "dict", "object", "list-of-str"],
)
def test_a_wrong_type_is_a_type_error_naming_the_argument(entry: str, bad: object, type_name: str) -> None:
    """Not a tensor or array of numbers: a TypeError naming the argument and the type (not torch's
    RuntimeError "Could not infer dtype of NoneType", which names neither)."""
    name = entry.split(":")[1]
    defaults = ("apply_pose:rotation", "to_cartesian:fixed_xyz", "committor_loss:masses")
    defaults += ("committor_loss:weights",)
    if bad is None and entry in defaults:
        pytest.skip(f"{name}=None is the default (none given)")
    with pytest.raises(
        TypeError, match=rf"^{name} must be a tensor or an array-like of numbers, got {type_name}"
    ):
        _entry_points()[entry](bad)


@pytest.mark.parametrize("entry", ["to_cartesian:bonds", "to_internal:xyz", "rotation_from_angles:angles"])
def test_a_ragged_list_is_a_value_error_naming_the_argument(entry: str) -> None:
    name = entry.split(":")[1]
    with pytest.raises(
        ValueError, match=rf"^{name} could not be read as an array: expected sequence of length"
    ):
        _entry_points()[entry]([[1.0, 2.0, 3.0], [1.0]])


def test_numpy_arrays_are_still_taken_where_array_likes_are() -> None:
    xyz = _xyz4()
    ic = bn.to_internal(xyz.numpy(), TABLE)
    torch.testing.assert_close(bn.to_cartesian(*(t.numpy() for t in ic), TABLE), xyz)
    np.testing.assert_allclose(bn.rotation_from_angles(np.zeros(3)).numpy(), np.eye(3))


@pytest.mark.parametrize("pose", [False, True])
def test_flow_inverse_of_numpy_arrays_is_a_type_error_naming_the_type(pose: bool) -> None:
    """Issue 23: numpy ICs once gave "bonds must have shape (..., 4), got ndarray"."""
    flow = bn.InternalCoordinateTransform(bn.ConstructionTable.chain(5), pose=pose)
    z = flow(torch.randn(3, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    pose_args = (z.rotation, z.translation) if pose else ()
    values = [z.bonds, z.angles, z.dihedrals]
    for k, name in enumerate(("bonds", "angles", "dihedrals")):
        args = list(values)
        args[k] = args[k].numpy()
        with pytest.raises(
            TypeError,
            match=rf"^{name} must be a torch.Tensor, got ndarray; convert it with torch.as_tensor\({name}\)$",
        ):
            flow.inverse(*args, *pose_args)
    back, _ = flow.inverse(*(torch.as_tensor(v.numpy()) for v in values), *pose_args)  # converted: fine
    assert back.shape == (3, 5, 3)
