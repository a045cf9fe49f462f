"""The ZMatrix container: construction, conversion, batching, devices, dummies."""

from __future__ import annotations

import io
import json
from importlib import resources

import numpy as np
import pytest
import torch

from batched_nerf import ConstructionTable, ZMatrix, to_cartesian
from batched_nerf.core.zmatrix import formula
from batched_nerf.data import available, load
from batched_nerf.formats import read_zmat


def molecule_zmatrix(name: str) -> ZMatrix:
    return load(name)


@pytest.mark.parametrize("name", available())
def test_to_cartesian_matches_core_and_shipped_xyz(name: str) -> None:
    z = molecule_zmatrix(name)
    assert z.n_atoms == z.n_real == z.table.n_atoms and z.dtype == torch.float64 and z.batch_shape == ()
    x = z.to_cartesian()
    stored = json.loads(resources.files("batched_nerf.data").joinpath(f"{name}.json").read_text())["xyz"]
    np.testing.assert_allclose(x.numpy(), np.reshape(stored, (-1, 3)), atol=1e-10)
    torch.testing.assert_close(x, to_cartesian(z.bonds, z.angles, z.dihedrals, z.table))


def test_from_cartesian_roundtrip_batched(method: str) -> None:
    z = molecule_zmatrix("alanine_dipeptide")
    batch = ZMatrix(z.table, z.bonds, z.angles, z.dihedrals + torch.linspace(-1, 1, 7)[:, None])
    x = batch.to_cartesian(method)  # type: ignore[arg-type]
    assert x.shape == (7, 22, 3)
    again = ZMatrix.from_cartesian(x, z.table, elements=z.elements)
    torch.testing.assert_close(again.to_cartesian(method), x)  # type: ignore[arg-type]
    assert again.elements == z.elements and again.labels is None


def test_broadcasting_batch_shape_len_and_indexing() -> None:
    table = ConstructionTable.chain(5)
    z = ZMatrix(table, torch.ones(5), torch.full((3, 1, 5), 2.0), torch.zeros(4, 5))
    assert z.batch_shape == (3, 4) and len(z) == 3
    assert z.bonds.shape == (3, 4, 5)
    assert z[1].batch_shape == (4,) and z[1:, 2].batch_shape == (2,)
    torch.testing.assert_close(z[2, 3].to_cartesian(), z.to_cartesian()[2, 3])
    with pytest.raises(IndexError, match="unbatched"):
        z[0, 0][0]
    with pytest.raises(TypeError, match="unbatched"):
        len(z[0, 0])
    with pytest.raises(IndexError, match="batch dimensions"):
        z[..., 0]


def test_to_dtype_device_and_gradients() -> None:
    z = molecule_zmatrix("chain_20").to(dtype=torch.float32)
    assert z.dtype == torch.float32 and z.to_cartesian().dtype == torch.float32
    assert z.to(device="cpu").device.type == "cpu"
    with pytest.raises(TypeError, match="floating"):
        z.to(dtype=torch.int64)
    d = z.dihedrals.clone().requires_grad_(True)
    ZMatrix(z.table, z.bonds, z.angles, d).to_cartesian().pow(2).sum().backward()
    assert d.grad is not None and torch.isfinite(d.grad).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_cuda() -> None:
    z = molecule_zmatrix("alanine_dipeptide").to("cuda")
    assert z.to_cartesian().device.type == "cuda"


def test_fixed_atoms_and_dummies() -> None:
    # two fixed anchors; row 3 is a dummy, not returned by to_cartesian
    table = ConstructionTable(
        [[-1, -1, -1], [-1, -1, -1], [0, 1, 4], [2, 0, 1], [-1, -1, -1]], fixed=[0, 1, 4]
    )
    fixed = torch.tensor([[0.0, 0, 0], [1.5, 0, 0], [0, 1, 0]], dtype=torch.float64)
    z = ZMatrix(
        table,
        [0, 0, 1.2, 1.0, 0],
        [0, 0, 1.9, 2.0, 0],
        [0, 0, 0.5, -2.5, 0],
        fixed,
        elements=["C", "C", "O", "X", "X"],
        real=torch.tensor([True, True, True, False, False]),
    )
    assert z.n_real == 3 and z.n_atoms == 5 and z.real_elements == ["C", "C", "O"]
    assert "n_dummies=2" in repr(z)
    full = z.to_cartesian(dummies=True)
    assert full.shape == (5, 3)
    torch.testing.assert_close(z.to_cartesian(), full[:3])
    torch.testing.assert_close(full[[0, 1, 4]], fixed)
    # from_cartesian takes the fixed positions from xyz
    again = ZMatrix.from_cartesian(full, table)
    assert again.fixed_xyz is not None
    torch.testing.assert_close(again.fixed_xyz, fixed)
    torch.testing.assert_close(again.to_cartesian(), full)
    # batched fixed_xyz broadcasts against unbatched values
    zb = ZMatrix(table, z.bonds, z.angles, z.dihedrals, fixed.expand(6, 3, 3))
    assert zb.batch_shape == (6,) and zb[2].fixed_xyz is not None


def test_gaussian_dummy_atoms_are_not_real() -> None:
    text = "C\nX 1 1.0\nH 1 1.09 2 90.0\nH 1 1.09 2 90.0 3 180.0\n"
    z = read_zmat(io.StringIO(text))
    assert z.real.tolist() == [True, False, True, True]
    x = z.to_cartesian()
    assert x.shape == (3, 3)
    # H-C-H is linear (both at 90 deg to the dummy, on opposite sides)
    u, v = (x[1] - x[0]).numpy(), (x[2] - x[0]).numpy()
    assert abs(np.dot(u, v) / np.linalg.norm(u) / np.linalg.norm(v) + 1) < 1e-12


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"bonds": [1.0, 2.0]}, ValueError, "bonds must have shape"),
        ({"angles": torch.zeros(2, 3), "dihedrals": torch.zeros(3, 3)}, ValueError, "do not broadcast"),
        ({"fixed_xyz": torch.zeros(1, 3)}, ValueError, "no fixed atoms"),
        ({"elements": "CCC"}, TypeError, "single string"),
        ({"labels": ["a"]}, ValueError, "1 labels for 3 rows"),
        ({"real": [1, 1, 1]}, ValueError, "boolean mask"),
        ({"bonds": torch.zeros(3, dtype=torch.bool)}, TypeError, "real floating"),
        ({"table": [[-1, -1, -1]]}, TypeError, "ConstructionTable"),
    ],
)
def test_errors(kwargs: dict, error: type, match: str) -> None:
    args = {
        "table": ConstructionTable.chain(3),
        "bonds": [0.0, 1, 1],
        "angles": [0.0, 0, 2],
        "dihedrals": [0.0] * 3,
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ZMatrix(**args)


def test_fixed_xyz_errors() -> None:
    table = ConstructionTable([[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2]], fixed=[0, 1, 2])
    values = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    with pytest.raises(ValueError, match="pass fixed_xyz"):
        ZMatrix(table, *values)
    with pytest.raises(ValueError, match=r"\(\.\.\., 3, 3\)"):
        ZMatrix(table, *values, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        ZMatrix(table, torch.zeros(2, 4), values[1], values[2], torch.eye(3).expand(5, 3, 3))


def test_formula() -> None:
    assert formula(["O", "H", "H"]) == "H2O"
    assert formula(["N", "C", "H", "H", "C", "O"]) == "C2H2NO"
    assert formula([]) == ""
