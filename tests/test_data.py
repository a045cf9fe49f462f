"""Shipped molecules: files, loader, and consistency with the core."""

from __future__ import annotations

import json
import math
from importlib import resources

import numpy as np
import pytest
import torch

from batched_nerf import ConstructionTable, ZMatrix, to_cartesian, to_internal
from batched_nerf.data import available, load
from batched_nerf.data._generate import molecules
from batched_nerf.data._reference import build_xyz, dihedral, internal_coordinates

NAMES = available()


def _stored(name: str) -> dict:
    """The shipped file itself (reference coordinates, degrees)."""
    return json.loads(resources.files("batched_nerf.data").joinpath(f"{name}.json").read_text())


def _refs(mol: ZMatrix) -> np.ndarray:
    return mol.table.topology.refs


def _xyz(mol: ZMatrix) -> np.ndarray:
    return mol.to_cartesian().numpy()


def pdist(x: np.ndarray) -> np.ndarray:
    return np.linalg.norm(x[..., :, None, :] - x[..., None, :, :], axis=-1)


def test_available() -> None:
    assert {"alanine_dipeptide", "chain_20", "polyethylene", "benzene"} <= set(NAMES)
    assert NAMES == sorted(NAMES)


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"unknown molecule 'nope'; available: alanine_dipeptide"):
        load("nope")


@pytest.mark.parametrize("name", NAMES)
def test_fields(name: str) -> None:
    mol = load(name)
    assert isinstance(mol, ZMatrix) and mol.name == name
    n = mol.n_atoms
    assert isinstance(mol.table, ConstructionTable) and mol.table.n_atoms == n == mol.n_real
    for t in (mol.bonds, mol.angles, mol.dihedrals):
        assert t.shape == (n,) and t.dtype == torch.float64
    assert len(mol.elements) == len(mol.labels) == n
    assert mol.connectivity.ndim == 2 and mol.connectivity.shape[1] == 2
    assert (mol.connectivity[:, 0] < mol.connectivity[:, 1]).all()
    assert not mol.connectivity.flags.writeable
    assert name in repr(mol) and mol.metadata["description"]
    # every bond reference is a bond of the graph
    pairs = {tuple(p) for p in mol.connectivity.tolist()}
    for i, b in enumerate(_refs(mol)[:, 0].tolist()):
        if b >= 0:
            assert (min(i, b), max(i, b)) in pairs
    # angles within (0, pi), used entries only
    used = torch.as_tensor(_refs(mol)[:, 1] >= 0)
    assert ((mol.angles[used] > 0) & (mol.angles[used] < np.pi)).all()


def assert_json_close(got: object, expected: object, rel: float = 1e-12, where: str = "") -> None:
    """``got == expected`` for JSON data, floats within ``rel`` (relative, or absolute near 0).

    The shipped files were written on one machine; a rebuild on another CPU, BLAS
    or torch build differs in the last bits (seen: 1.8e-15), never more.
    """
    if isinstance(expected, float) or isinstance(got, float):
        assert isinstance(got, (int, float)) and isinstance(expected, (int, float)), where
        assert math.isclose(got, expected, rel_tol=rel, abs_tol=rel), f"{where}: {got!r} != {expected!r}"
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), where
        for key in expected:
            assert_json_close(got[key], expected[key], rel, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for k, (g, e) in enumerate(zip(got, expected)):
            assert_json_close(g, e, rel, f"{where}[{k}]")
    else:  # str, int, bool, None: exact
        assert type(got) is type(expected) and got == expected, f"{where}: {got!r} != {expected!r}"


def test_assert_json_close() -> None:
    assert_json_close({"a": [1.0, 0.0, "x", 2]}, {"a": [1.0 + 1.8e-15, 1.8e-15, "x", 2]})
    for bad in ({"a": [1.0 + 1e-9, 0.0, "x", 2]}, {"a": [1.0, 0.0, "y", 2]}, {"a": [1.0, 0.0, "x"]}):
        with pytest.raises(AssertionError):
            assert_json_close(bad, {"a": [1.0, 0.0, "x", 2]})


@pytest.mark.parametrize("name", NAMES)
def test_files_match_generator(name: str) -> None:
    """The JSON files are what ``python -m batched_nerf.data._generate`` writes (floats to 1e-12)."""
    shipped = _stored(name)
    generated = {m["name"]: m for m in molecules()}[name]
    assert_json_close(json.loads(json.dumps(generated)), shipped)


@pytest.mark.parametrize("name", NAMES)
def test_stored_xyz_is_the_build_of_the_internal_coordinates(name: str) -> None:
    mol = load(name)
    stored = np.asarray(_stored(name)["xyz"]).reshape(-1, 3)
    b, a, d = (t.numpy() for t in (mol.bonds, mol.angles, mol.dihedrals))
    np.testing.assert_allclose(build_xyz(_refs(mol), b, a, d), stored, atol=1e-12)
    x = to_cartesian(mol.bonds, mol.angles, mol.dihedrals, mol.table)
    np.testing.assert_allclose(mol.to_cartesian().numpy(), x.numpy(), atol=0)
    # same geometry up to rigid motion: the same distance matrix
    np.testing.assert_allclose(pdist(x.numpy()), pdist(stored), atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_internal_coordinates_recomputed(name: str) -> None:
    mol = load(name)
    xyz = np.asarray(_stored(name)["xyz"]).reshape(-1, 3)
    ic = to_internal(torch.tensor(xyz), mol.table)
    ref = internal_coordinates(xyz, _refs(mol))
    for got, numpy_value, stored in zip(ic, ref, (t.numpy() for t in (mol.bonds, mol.angles, mol.dihedrals))):
        for value in (got.numpy(), numpy_value):  # dihedrals compared modulo 2 pi (180 == -180)
            np.testing.assert_allclose(np.angle(np.exp(1j * (value - stored))), 0.0, atol=1e-10)


def test_alanine_dipeptide_layout() -> None:
    mol = load("alanine_dipeptide")
    assert mol.n_atoms == 22
    assert mol.labels == [
        "H1", "CH3", "H2", "H3", "C", "O", "N", "H", "CA", "HA", "CB",
        "HB1", "HB2", "HB3", "C", "O", "N", "H", "C", "H1", "H2", "H3",
    ]  # fmt: skip
    assert "".join(mol.elements) == "HCHHCONHCHCHHHCONHCHHH"
    meta = mol.metadata
    assert meta["phi"] == [4, 6, 8, 14] and meta["psi"] == [6, 8, 14, 16]
    # phi and psi are themselves single dihedral entries of the table
    i, j, k, m = meta["phi"]
    assert _refs(mol)[meta["phi_row"]].tolist() == [k, j, i] and meta["phi_row"] == m
    i, j, k, m = meta["psi"]
    assert _refs(mol)[meta["psi_row"]].tolist() == [k, j, i] and meta["psi_row"] == m


def test_alanine_dipeptide_phi_psi_from_xyz() -> None:
    mol = load("alanine_dipeptide")
    meta = mol.metadata
    xyz = _xyz(mol)
    phi = np.degrees(dihedral(*xyz[meta["phi"]]))
    psi = np.degrees(dihedral(*xyz[meta["psi"]]))
    assert phi == pytest.approx(meta["phi_deg"], abs=1e-9)
    assert psi == pytest.approx(meta["psi_deg"], abs=1e-9)
    assert np.degrees(mol.dihedrals[meta["phi_row"]].item()) == pytest.approx(meta["phi_deg"])
    assert np.degrees(mol.dihedrals[meta["psi_row"]].item()) == pytest.approx(meta["psi_deg"])
    # the core agrees
    ic = to_internal(torch.tensor(xyz), mol.table, degrees=True)
    assert ic.dihedrals[meta["phi_row"]].item() == pytest.approx(meta["phi_deg"], abs=1e-9)
    assert ic.dihedrals[meta["psi_row"]].item() == pytest.approx(meta["psi_deg"], abs=1e-9)


def test_alanine_is_l() -> None:
    """L-alanine: seen along HA -> CA, the groups CO, R (CB), N run clockwise."""
    x = _xyz(load("alanine_dipeptide"))
    n, ca, ha, c, cb = x[6], x[8], x[9], x[14], x[10]
    # C -> CB -> N turns clockwise for a viewer at HA looking at CA: its normal points away
    assert np.cross(cb - c, n - c) @ (ca - ha) > 0


@pytest.mark.parametrize("name", NAMES)
def test_no_clashes(name: str) -> None:
    mol = load(name)
    d = pdist(_xyz(mol))
    bonded = np.zeros_like(d, dtype=bool)
    bonded[mol.connectivity[:, 0], mol.connectivity[:, 1]] = True
    bonded |= bonded.T
    np.fill_diagonal(bonded, True)
    assert d[~bonded].min() > 1.5


def test_benzene_ring_closes() -> None:
    mol = load("benzene")
    xyz = _xyz(mol)
    i, j = mol.metadata["ring_closure"]
    assert np.linalg.norm(xyz[i] - xyz[j]) == pytest.approx(1.39, abs=1e-9)
    assert np.abs(xyz[:, 2]).max() < 1e-9
