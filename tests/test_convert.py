"""to_cartesian / to_internal: conventions, seeds, fixed atoms, broadcasting, dtypes, devices."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from reference import dihedral as np_dihedral
from reference import reference_to_cartesian, reference_to_internal

import batched_nerf as bn

R, F64 = [-1, -1, -1], torch.float64


def rand_ic(n: int, batch: tuple[int, ...] = (), dtype: torch.dtype = F64, seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    b = 1.0 + 0.5 * torch.rand(*batch, n, generator=g, dtype=F64)
    a = 0.5 + 2.1 * torch.rand(*batch, n, generator=g, dtype=F64)
    d = math.pi * (2 * torch.rand(*batch, n, generator=g, dtype=F64) - 1)
    return b.to(dtype), a.to(dtype), d.to(dtype)


def tol(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 0.0, "atol": 1e-9 if dtype == F64 else 1e-4}


# ------------------------------------------------------------ conventions
def test_known_geometry(method: str, dtype: torch.dtype) -> None:
    """Right angles and a +90 degree dihedral give the corners of a unit cube."""
    table = bn.ConstructionTable.chain(4)
    h = math.pi / 2
    x = bn.to_cartesian(
        torch.ones(4, dtype=dtype),
        torch.full((4,), h, dtype=dtype),
        torch.full((4,), h, dtype=dtype),
        table,
        method=method,
    )
    want = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=dtype)
    # IUPAC: dihedral (x3, x2, x1, x0) of these corners is +90
    torch.testing.assert_close(x, want, **tol(dtype))
    assert np_dihedral(*want.double().numpy()) == pytest.approx(math.pi / 2)
    assert np_dihedral(*np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, -1.0]])) == pytest.approx(
        -math.pi / 2
    )


def test_iupac_sign_and_symmetry(dtype: torch.dtype) -> None:
    table = bn.ConstructionTable.chain(4)
    # cis = 0, trans = pi; looking along 1 -> 2, 3 turned clockwise from 0 is positive
    pts = {
        0.0: [[0, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0]],
        math.pi: [[0, 1, 0], [0, 0, 0], [1, 0, 0], [1, -1, 0]],
        math.pi / 2: [[0, 1, 0], [0, 0, 0], [1, 0, 0], [1, 0, 1]],
        -math.pi / 2: [[0, 1, 0], [0, 0, 0], [1, 0, 0], [1, 0, -1]],
    }
    for want, p in pts.items():
        x = torch.tensor(p, dtype=dtype)
        got = bn.to_internal(x, table).dihedrals[3]
        assert float(got) == pytest.approx(want, abs=1e-6)  # trans is +pi, never -pi
        assert np_dihedral(*np.asarray(p, float)) == pytest.approx(want, abs=1e-12)
        # same value for the reversed quadruple (x_i, x_b, x_a, x_d) -> (x_d, x_a, x_b, x_i)
        rev = bn.to_internal(x.flip(0), table).dihedrals[3]
        assert float(rev) == pytest.approx(want, abs=1e-6)


def test_dihedral_range_includes_pi_excludes_minus_pi(method: str) -> None:
    table = bn.ConstructionTable.chain(4)
    for phi in (math.pi, -math.pi):
        x = bn.to_cartesian(
            torch.ones(4), torch.full((4,), 2.0), torch.tensor([0, 0, 0, phi]), table, method=method
        )
        d = bn.to_internal(x.double(), table).dihedrals[3]
        assert -math.pi < float(d) <= math.pi
        assert abs(abs(float(d)) - math.pi) < 1e-5


def test_to_internal_docstring_values() -> None:
    xyz = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    ic = bn.to_internal(xyz, bn.ConstructionTable.chain(4), degrees=True)
    assert isinstance(ic, bn.InternalCoordinates) and ic._fields == ("bonds", "angles", "dihedrals")
    torch.testing.assert_close(ic.bonds, torch.tensor([0.0, 1, 1, 1]))
    torch.testing.assert_close(ic.angles, torch.tensor([0.0, 0, 90, 90]))
    torch.testing.assert_close(ic.dihedrals, torch.tensor([0.0, 0, 0, 90]))


def test_matches_reference_on_branched_shuffled_table(method: str, dtype: torch.dtype) -> None:
    refs = [[4, -1, -1], [4, 0, 2], [0, 4, -1], [4, 0, 1], R, [2, 0, 4], [5, 2, 0], [6, 5, 2]]
    table = bn.ConstructionTable(refs)
    b, a, d = rand_ic(8, batch=(3,), dtype=dtype)
    x = bn.to_cartesian(b, a, d, table, method=method)
    want = np.stack([reference_to_cartesian(refs, b[k], a[k], d[k]) for k in range(3)])
    np.testing.assert_allclose(x.double().numpy(), want, **tol(dtype))
    back = bn.to_internal(x, table)
    ref_ic = reference_to_internal(refs, x[0].double().numpy())
    for got, want_k in zip(back, ref_ic):
        np.testing.assert_allclose(got[0].double().numpy(), want_k, atol=1e-9 if dtype == F64 else 1e-4)


def test_degrees(method: str) -> None:
    table = bn.ConstructionTable.chain(5)
    b, a, d = rand_ic(5, batch=(2,))
    rad = bn.to_cartesian(b, a, d, table, method=method)
    deg = bn.to_cartesian(b, torch.rad2deg(a), torch.rad2deg(d), table, degrees=True, method=method)
    torch.testing.assert_close(deg, rad)
    ic_deg = bn.to_internal(rad, table, degrees=True)
    ic_rad = bn.to_internal(rad, table)
    torch.testing.assert_close(ic_deg.bonds, ic_rad.bonds)
    torch.testing.assert_close(ic_deg.angles, torch.rad2deg(ic_rad.angles))
    torch.testing.assert_close(ic_deg.dihedrals, torch.rad2deg(ic_rad.dihedrals))


def test_engines_agree(dtype: torch.dtype) -> None:
    refs = [[4, -1, -1], [4, 0, 2], [0, 4, -1], [4, 0, 1], R, [2, 0, 4], [5, 2, 0], [6, 5, 2], R, [8, -1, -1]]
    table = bn.ConstructionTable(refs)
    ic = rand_ic(10, batch=(4,), dtype=dtype)
    outs = [bn.to_cartesian(*ic, table, method=m) for m in ("levels", "scan", "auto")]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], **tol(dtype))


# ------------------------------------------------------------------ seeds
@pytest.mark.parametrize("third", [[0, 1, -1], [1, 0, -1]], ids=["third_on_root", "third_on_second"])
def test_seed_frame(third: list[int], method: str, dtype: torch.dtype) -> None:
    table = bn.ConstructionTable([R, [0, -1, -1], third, [2, 1, 0] if third[0] == 1 else [2, 0, 1]])
    b, a, d = rand_ic(4, batch=(5,), dtype=dtype)
    x = bn.to_cartesian(b, a, d, table, method=method)
    assert torch.all(x[:, 0] == 0)
    torch.testing.assert_close(x[:, 1], torch.stack([b[:, 1], 0 * b[:, 1], 0 * b[:, 1]], -1), **tol(dtype))
    assert torch.all(x[:, 2, 2] == 0) and torch.all(x[:, 2, 1] > 0)
    ic = bn.to_internal(x, table)
    torch.testing.assert_close(ic.bonds[:, 2], b[:, 2], **tol(dtype))
    torch.testing.assert_close(ic.angles[:, 2], a[:, 2], **tol(dtype))


def test_several_components_each_in_own_seed_frame(method: str) -> None:
    # molecule A (4 atoms), a lone atom, a 2-atom molecule, molecule A again with rows shuffled
    refs = [
        R,
        [0, -1, -1],
        [1, 0, -1],
        [2, 1, 0],
        R,
        R,
        [5, -1, -1],
        [9, 8, 10],
        [10, -1, -1],
        [8, 10, -1],
        R,
    ]
    table = bn.ConstructionTable(refs)
    assert table.n_components == 4
    b, a, d = rand_ic(11, batch=(2,))
    copy = [10, 8, 9, 7]  # atom k of the first molecule is atom copy[k] of the last
    for t in (b, a, d):
        t[:, copy] = t[:, :4]
    x = bn.to_cartesian(b, a, d, table, method=method)
    torch.testing.assert_close(x[:, copy], x[:, :4], rtol=0, atol=1e-12)
    assert torch.all(x[:, 4] == 0) and torch.all(x[:, 5] == 0)  # lone atom and root at the origin
    torch.testing.assert_close(x[:, 6], torch.stack([b[:, 6], 0 * b[:, 6], 0 * b[:, 6]], -1))


def test_one_and_two_atom_tables(method: str) -> None:
    x1 = bn.to_cartesian(
        torch.tensor([3.0]),
        torch.tensor([1.0]),
        torch.tensor([2.0]),
        bn.ConstructionTable.chain(1),
        method=method,
    )
    assert x1.tolist() == [[0.0, 0.0, 0.0]]
    x2 = bn.to_cartesian(
        torch.tensor([3.0, 1.5]), torch.ones(2), torch.ones(2), bn.ConstructionTable.chain(2), method=method
    )
    assert x2.tolist() == [[0.0, 0.0, 0.0], [1.5, 0.0, 0.0]]
    ic = bn.to_internal(x2, bn.ConstructionTable.chain(2))
    assert ic.bonds.tolist() == [0.0, 1.5] and ic.angles.tolist() == [0.0, 0.0]


def test_unused_entries_ignored(method: str) -> None:
    table = bn.ConstructionTable([R, [0, -1, -1], [1, 0, -1], [2, 1, 0], R, [4, -1, -1]])
    b, a, d = rand_ic(6, batch=(2,))
    x = bn.to_cartesian(b, a, d, table, method=method)
    used = table.refs >= 0
    noisy = []
    for k, t in enumerate((b, a, d)):
        t = t.clone()
        t[:, ~used[:, k]] = 1e3 * torch.randn(2, int((~used[:, k]).sum()), dtype=F64)
        noisy.append(t)
    torch.testing.assert_close(bn.to_cartesian(*noisy, table, method=method), x, rtol=0, atol=0)
    ic = bn.to_internal(x, table)
    for k, t in enumerate(ic):
        assert torch.all(t[:, ~used[:, k]] == 0)


# ------------------------------------------------------------ fixed atoms
ANCHORED = bn.ConstructionTable(
    [[-1, -1, -1], [3, 0, 5], [1, 3, 0], [-1, -1, -1], [2, 1, 3], [-1, -1, -1], R, [6, -1, -1]],
    fixed=[3, 0, 5],
)


def anchor(batch: tuple[int, ...] = (), dtype: torch.dtype = F64) -> torch.Tensor:
    base = torch.tensor([[0.3, -0.2, 0.1], [1.6, 0.1, 0.0], [2.1, 1.5, 0.4]], dtype=F64)
    return (base + 0.1 * torch.randn(*batch, 3, 3, dtype=F64, generator=torch.Generator().manual_seed(9))).to(
        dtype
    )


def test_fixed_atoms_copied_and_others_relative(method: str, dtype: torch.dtype) -> None:
    b, a, d = rand_ic(8, batch=(2,), dtype=dtype)
    f = anchor((2,), dtype)
    x = bn.to_cartesian(b, a, d, ANCHORED, fixed_xyz=f, method=method)
    assert torch.equal(x[:, [3, 0, 5]], f)
    ic = bn.to_internal(x, ANCHORED)
    for k, t in enumerate((b, a, d)):
        torch.testing.assert_close(ic[k][:, [1, 2, 4]], t[:, [1, 2, 4]], **tol(dtype))
        assert torch.all(ic[k][:, [0, 3, 5, 6]] == 0)  # fixed atoms and the root: 0
    # the seeded two-atom molecule ignores the anchor
    torch.testing.assert_close(x[:, 7], torch.stack([b[:, 7], 0 * b[:, 7], 0 * b[:, 7]], -1))
    # moving the anchor rigidly moves the anchored atoms with it
    c, s = math.cos(0.7), math.sin(0.7)
    rot = torch.tensor([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=dtype)
    shift = torch.tensor([1.0, -2.0, 0.5], dtype=dtype)
    moved = bn.to_cartesian(b, a, d, ANCHORED, fixed_xyz=f @ rot.T + shift, method=method)
    torch.testing.assert_close(moved[:, :6], x[:, :6] @ rot.T + shift, **tol(dtype))
    # against the sequential reference
    want = np.stack(
        [reference_to_cartesian(ANCHORED.refs.numpy(), b[k], a[k], d[k], [3, 0, 5], f[k]) for k in range(2)]
    )
    np.testing.assert_allclose(x.double().numpy(), want, **tol(dtype))


def test_fixed_xyz_broadcasts(method: str) -> None:
    b, a, d = rand_ic(8)
    f = anchor((4,))
    x = bn.to_cartesian(b, a, d, ANCHORED, fixed_xyz=f, method=method)  # ICs () x fixed (4,)
    assert x.shape == (4, 8, 3)
    torch.testing.assert_close(x[2], bn.to_cartesian(b, a, d, ANCHORED, fixed_xyz=f[2], method=method))
    x = bn.to_cartesian(b.expand(4, 8), a, d, ANCHORED, fixed_xyz=f[0], method=method)  # ICs (4,) x fixed ()
    assert x.shape == (4, 8, 3)
    x = bn.to_cartesian(b.expand(2, 1, 8), a, d, ANCHORED, fixed_xyz=f, method=method)  # (2, 1) x (4,)
    assert x.shape == (2, 4, 8, 3)
    # list input, cast to the dtype of the internal coordinates
    x = bn.to_cartesian(b.float(), a.float(), d.float(), ANCHORED, fixed_xyz=f[0].tolist(), method=method)
    assert x.dtype == torch.float32


# ------------------------------------------------- shapes, dtypes, devices
@pytest.mark.parametrize(
    ("shapes", "out"),
    [
        (((6,), (6,), (6,)), ()),
        (((2, 6), (6,), (1, 6)), (2,)),
        (((3, 1, 6), (4, 6), (6,)), (3, 4)),
        (((0, 6), (6,), (6,)), (0,)),
        (((2, 3, 4, 6), (2, 3, 4, 6), (2, 3, 4, 6)), (2, 3, 4)),
    ],
)
def test_broadcasting(shapes, out, method: str) -> None:  # type: ignore[no-untyped-def]
    table = bn.ConstructionTable.chain(6)
    inputs = [rand_ic(6, batch=s[:-1], seed=k)[k] for k, s in enumerate(shapes)]
    x = bn.to_cartesian(*inputs, table, method=method)
    assert x.shape == (*out, 6, 3)
    if x.numel():
        bb = torch.broadcast_tensors(*inputs)
        flat = [t.reshape(-1, 6) for t in bb]
        k = flat[0].shape[0] - 1
        want = reference_to_cartesian(table.refs.numpy(), flat[0][k], flat[1][k], flat[2][k])
        np.testing.assert_allclose(x.reshape(-1, 6, 3)[k].numpy(), want, atol=1e-9)
    ic = bn.to_internal(x, table)
    assert all(t.shape == (*out, 6) for t in ic)


def test_python_and_integer_inputs(method: str) -> None:
    table = bn.ConstructionTable.chain(3)
    x = bn.to_cartesian([1, 1, 1], [2.0, 2.0, 2.0], [0.0, 0.0, 0.0], table, method=method)
    assert x.dtype == torch.get_default_dtype() and x.shape == (3, 3)
    xi = bn.to_cartesian(
        torch.ones(3, dtype=torch.int64), torch.full((3,), 2.0), torch.zeros(3), table, method=method
    )
    torch.testing.assert_close(xi, x)
    ic = bn.to_internal(x.tolist(), table)
    torch.testing.assert_close(ic.angles[2], torch.tensor(2.0))


def test_dtypes_follow_inputs(method: str, dtype: torch.dtype) -> None:
    table = bn.ConstructionTable.chain(5)
    b, a, d = rand_ic(5, dtype=dtype)
    x = bn.to_cartesian(b, a, d, table, method=method)
    assert x.dtype == dtype
    assert all(t.dtype == dtype for t in bn.to_internal(x, table))
    mixed = bn.to_cartesian(b.float(), a.double(), d.float(), table, method=method)
    assert mixed.dtype == torch.float64


def test_device(device: torch.device, method: str, dtype: torch.dtype) -> None:
    """The table is created on CPU and moves to the input's device by itself."""
    table = bn.ConstructionTable([[4, -1, -1], [4, 0, 2], [0, 4, -1], [4, 0, 1], R, [2, 0, 4]])
    b, a, d = (t.to(device) for t in rand_ic(6, batch=(3,), dtype=dtype))
    x = bn.to_cartesian(b, a, d, table, method=method)
    assert x.device.type == device.type and x.dtype == dtype
    cpu = bn.to_cartesian(b.cpu(), a.cpu(), d.cpu(), table, method=method)
    torch.testing.assert_close(x.cpu(), cpu, **tol(dtype))
    ic = bn.to_internal(x, table)
    assert all(t.device.type == device.type for t in ic)
    torch.testing.assert_close(ic.angles.cpu()[:, [2, 1, 3, 5]], a.cpu()[:, [2, 1, 3, 5]], **tol(dtype))
    assert table.plan("inverse", device) is table.plan("inverse", device)


def test_fixed_on_device(device: torch.device, method: str) -> None:
    b, a, d = (t.to(device) for t in rand_ic(8))
    f = anchor().to(device)
    x = bn.to_cartesian(b, a, d, ANCHORED, fixed_xyz=f, method=method)
    assert x.device.type == device.type and torch.equal(x[[3, 0, 5]], f)


def test_empty_table() -> None:
    """A table without atoms: refused when made, or converted to empty outputs (not an obscure error)."""
    try:
        table = bn.ConstructionTable(np.zeros((0, 3), dtype=np.int64))
    except ValueError as err:
        assert "atom" in str(err)
        return
    x = bn.to_cartesian(torch.zeros(2, 0), torch.zeros(2, 0), torch.zeros(2, 0), table)
    assert x.shape == (2, 0, 3)
    assert bn.to_internal(x, table).bonds.shape == (2, 0)
