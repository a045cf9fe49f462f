"""Automatic construction tables: refs_from_connectivity and refs_from_xyz (one seed triple per fragment)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batched_nerf import ConstructionTable, perceive_connectivity, to_cartesian, to_internal
from batched_nerf.data import available, load
from batched_nerf.data._reference import angle
from batched_nerf.topology.auto import COVALENT_RADII, refs_from_connectivity, refs_from_xyz

LINEAR_DEG = 5.0


def table_from_connectivity(connectivity: object, n: int, **kwargs: object) -> ConstructionTable:
    """The per-fragment table (fragments not linked; linking is tested in test_real_molecules.py)."""
    kwargs.setdefault("link_fragments", False)
    return ConstructionTable(refs_from_connectivity(connectivity, n, **kwargs).refs)  # type: ignore[arg-type]


def table_from_xyz(xyz: object, elements: list[str], **kwargs: object) -> ConstructionTable:
    kwargs.setdefault("link_fragments", False)
    return ConstructionTable(refs_from_xyz(xyz, elements, **kwargs).refs)  # type: ignore[arg-type]


def _adjacency(bonds: np.ndarray | list[tuple[int, int]], n: int) -> list[set[int]]:
    adj: list[set[int]] = [set() for _ in range(n)]
    for i, j in np.asarray(bonds, dtype=np.int64).reshape(-1, 2).tolist():
        adj[i].add(j)
        adj[j].add(i)
    return adj


def _components(adj: list[set[int]]) -> list[int]:
    comp = [-1] * len(adj)
    c = 0
    for s in range(len(adj)):
        if comp[s] >= 0:
            continue
        stack = [s]
        comp[s] = c
        while stack:
            u = stack.pop()
            for v in adj[u]:
                if comp[v] < 0:
                    comp[v] = c
                    stack.append(v)
        c += 1
    return comp


def pdist(x: torch.Tensor) -> torch.Tensor:
    """Exact pairwise distances (``torch.cdist`` loses digits through its matmul form)."""
    return (x[..., :, None, :] - x[..., None, :, :]).norm(dim=-1)


def check_table(
    table: ConstructionTable,
    bonds: np.ndarray | list[tuple[int, int]],
    n: int,
    *,
    real_bonds: bool | str = True,
) -> None:
    """Every atom covered, bond refs are bonds (``real_bonds``), refs stay in their fragment."""
    refs = table.refs.numpy()
    assert refs.shape == (n, 3)
    adj = _adjacency(bonds, n)
    comp = _components(adj)
    for i, (b, a, d) in enumerate(refs.tolist()):
        # the third seed row may leave the bond graph when every bonded choice is
        # near-linear in the coordinates (documented in refs_from_connectivity);
        # with real_bonds="full", only fully referenced rows must use real bonds
        if b >= 0 and real_bonds and (real_bonds is True or d >= 0):
            assert b in adj[i], f"atom {i}: bond ref {b} is not bonded"
        for r in (a, d):
            if r >= 0:
                assert comp[r] == comp[i], f"atom {i}: reference {r} in another fragment"
    # one seed triple per fragment
    n_frag = len(set(comp))
    assert int((refs[:, 0] < 0).sum()) == n_frag
    assert table.n_components == n_frag


def check_not_linear(table: ConstructionTable, xyz: np.ndarray) -> None:
    refs = table.refs.numpy()
    lo, hi = np.deg2rad(LINEAR_DEG), np.deg2rad(180 - LINEAR_DEG)
    for i, (b, a, d) in enumerate(refs.tolist()):
        if a >= 0:
            t = angle(xyz[i], xyz[b], xyz[a])
            assert lo < t < hi, f"atom {i}: angle {i}-{b}-{a} is {np.degrees(t):.1f} deg"
        if d >= 0:
            t = angle(xyz[b], xyz[a], xyz[d])
            assert lo < t < hi, f"atom {i}: triple {b}-{a}-{d} is {np.degrees(t):.1f} deg"


def test_ethane_siblings() -> None:
    ethane = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 5), (1, 6), (1, 7)]
    table = table_from_connectivity(ethane, 8, root=0)
    refs = table.refs.tolist()
    assert refs[0] == [-1, -1, -1] and refs[1] == [0, -1, -1]
    check_table(table, ethane, 8)
    # the hydrogens of each methyl share bond and angle refs; later ones reference a sibling
    h1 = [refs[k] for k in (5, 6, 7)]
    assert {tuple(r[:2]) for r in h1} == {(1, 0)}
    assert h1[1][2] == h1[2][2] == 5
    assert h1[0][2] in (2, 3, 4)  # proper torsion H-C-C-H


def test_chain_gets_proper_torsions() -> None:
    n = 10
    bonds = [(k, k + 1) for k in range(n - 1)]
    refs = table_from_connectivity(bonds, n).refs.numpy()
    adj = _adjacency(bonds, n)
    for i, (b, a, d) in enumerate(refs.tolist()):
        if d >= 0:
            assert a in adj[b] and d in adj[a], f"atom {i}: {b, a, d} is not a proper torsion"


def test_isolated_atoms_and_small_fragments() -> None:
    table = table_from_connectivity([(1, 2), (3, 4), (4, 5)], 6)
    refs = table.refs.tolist()
    assert refs[0] == [-1, -1, -1]
    assert table.n_components == 3
    check_table(table, [(1, 2), (3, 4), (4, 5)], 6)
    assert table_from_connectivity([], 0).n_atoms == 0
    assert table_from_connectivity(np.zeros((0, 2), dtype=np.int64), 2).refs.tolist() == [[-1, -1, -1]] * 2


def test_ring_closure_ignored() -> None:
    ring = [(k, (k + 1) % 6) for k in range(6)]
    table = table_from_connectivity(ring, 6)
    check_table(table, ring, 6)


def test_torch_inputs_and_root() -> None:
    bonds = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 4]])
    table = table_from_connectivity(bonds, 5, root=4)
    assert table.refs[4].tolist() == [-1, -1, -1]
    assert table.refs[3].tolist() == [4, -1, -1]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    """Random forests plus a few extra (ring-closing) edges."""
    n = draw(st.integers(1, 40))
    bonds: list[tuple[int, int]] = []
    for i in range(1, n):
        if draw(st.booleans()) or i < 2:  # sometimes start a new fragment
            j = draw(st.integers(0, i - 1))
            bonds.append((j, i))
    extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=5))
    bonds += [(i, j) for i, j in extra if i != j]
    return n, bonds


@settings(max_examples=40, deadline=None)
@given(graphs())
def test_random_graphs(graph: tuple[int, list[tuple[int, int]]]) -> None:
    n, bonds = graph
    check_table(table_from_connectivity(bonds, n), bonds, n)


@settings(max_examples=20, deadline=None)
@given(graphs(), st.integers(0, 2**31 - 1))
def test_random_graphs_with_coordinates(graph: tuple[int, list[tuple[int, int]]], seed: int) -> None:
    n, bonds = graph
    xyz = np.random.default_rng(seed).normal(size=(n, 3)) * 2.0
    table = table_from_connectivity(bonds, n, xyz=xyz)
    check_table(table, bonds, n, real_bonds="full")
    # round trip through the core: the table really determines the geometry
    x = torch.as_tensor(xyz)
    ic = to_internal(x, table)
    back = to_cartesian(ic.bonds, ic.angles, ic.dihedrals, table)
    d0 = pdist(x)
    d1 = pdist(back)
    comp = table.components
    same = comp[:, None] == comp[None, :]
    assert torch.allclose(d0[same], d1[same], atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(graphs(), st.integers(0, 2**31 - 1))
def test_random_graphs_with_collinear_coordinates(
    graph: tuple[int, list[tuple[int, int]]], seed: int
) -> None:
    """Points on a line or a small grid: many exactly linear triples, the fallbacks must stay valid."""
    n, bonds = graph
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.arange(4.0)] * 3, indexing="ij"), -1).reshape(-1, 3)
    xyz = grid[rng.permutation(len(grid))[:n]]  # distinct points: coincident atoms are rejected
    xyz[: n // 2] = np.stack([4.0 + np.arange(n // 2), 0 * xyz[: n // 2, 0], 0 * xyz[: n // 2, 0]], 1)
    # half of the atoms on the x axis
    table = table_from_connectivity(bonds, n, xyz=xyz)
    check_table(table, bonds, n, real_bonds=False)


@pytest.mark.parametrize("name", available())
def test_shipped_molecules_from_bonds(name: str) -> None:
    mol = load(name)
    table = table_from_connectivity(mol.connectivity, mol.n_atoms)
    check_table(table, mol.connectivity, mol.n_atoms)
    check_not_linear(table, mol.to_cartesian().numpy())


@pytest.mark.parametrize("name", available())
def test_shipped_molecules_from_xyz(name: str) -> None:
    mol = load(name)
    xyz = mol.to_cartesian().numpy()
    assert perceive_connectivity(xyz, mol.elements).tolist() == mol.connectivity.tolist()
    table = table_from_xyz(xyz, mol.elements)
    check_table(table, mol.connectivity, mol.n_atoms)
    check_not_linear(table, xyz)
    x = torch.tensor(xyz)
    ic = to_internal(x, table)
    back = to_cartesian(ic.bonds, ic.angles, ic.dihedrals, table)
    assert torch.allclose(pdist(back), pdist(x), atol=1e-9)


def test_linear_triples_avoided() -> None:
    # acetonitrile H3C-C#N: C-C-N is linear, N must take another angle reference
    xyz = np.array(
        [
            [0.0, 0.0, 0.0],
            [1.46, 0.0, 0.0],
            [2.62, 0.0, 0.0],
            [-0.36, 1.03, 0.0],
            [-0.36, -0.51, 0.89],
            [-0.36, -0.51, -0.89],
        ]
    )
    elements = ["C", "C", "N", "H", "H", "H"]
    bonds = perceive_connectivity(xyz, elements)
    for root in (None, 0, 1, 2, 3):
        table = table_from_connectivity(bonds, 6, xyz=xyz, root=root)
        # rooted at N, the third seed has no bonded non-linear choice and takes a non-bonded one
        check_table(table, bonds, 6, real_bonds=root != 2)
        check_not_linear(table, xyz)
    check_not_linear(table_from_xyz(xyz, elements), xyz)


def test_linear_chain_with_branch() -> None:
    # but-2-yne-like chain C-C#C-C with hydrogens on the ends: two linear triples in a row
    xyz = np.array(
        [
            [0.0, 0.0, 0.0],
            [1.46, 0.0, 0.0],
            [2.66, 0.0, 0.0],
            [4.12, 0.0, 0.0],
            [-0.36, 1.03, 0.0],
            [-0.36, -0.51, 0.89],
            [-0.36, -0.51, -0.89],
            [4.48, 1.03, 0.0],
            [4.48, -0.51, 0.89],
            [4.48, -0.51, -0.89],
        ]
    )
    elements = ["C"] * 4 + ["H"] * 6
    table = table_from_xyz(xyz, elements)
    check_table(table, perceive_connectivity(xyz, elements), 10)
    check_not_linear(table, xyz)


def test_fully_linear_molecule_still_gets_a_table() -> None:
    xyz = np.array([[0.0, 0.0, 0.0], [1.16, 0.0, 0.0], [-1.16, 0.0, 0.0], [2.5, 0.0, 0.0]])
    table = table_from_connectivity([(0, 1), (0, 2), (1, 3)], 4, xyz=xyz)
    assert table.n_atoms == 4


def test_element_names_are_case_insensitive() -> None:
    xyz = [[0.0, 0.0, 0.0], [1.8, 0.0, 0.0]]
    assert perceive_connectivity(xyz, ["c", "CL"]).tolist() == [[0, 1]]
    assert {"H", "C", "N", "O", "S", "P", "Ar", "Br", "I", "Se"} <= set(COVALENT_RADII)


def test_scale() -> None:
    xyz = [[0.0, 0.0, 0.0], [1.7, 0.0, 0.0]]
    assert perceive_connectivity(xyz, ["C", "C"]).tolist() == [[0, 1]]
    with pytest.warns(UserWarning, match="no bond perceived for 2 of 2 atoms"):
        assert perceive_connectivity(xyz, ["C", "C"], scale=1.0).tolist() == []


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: table_from_connectivity([(0, 5)], 3),
            r"connectivity pair 0 \(0, 5\): atom index 5 out of range \[0, 2\]",
        ),
        (lambda: table_from_connectivity([(0, -1)], 3), r"atom index -1 out of range"),
        (lambda: table_from_connectivity([(1, 1)], 3), r"cannot be bonded to itself"),
        (lambda: table_from_connectivity([(0, 1, 2)], 3), r"sequence of \(i, j\) pairs"),
        (lambda: table_from_connectivity(np.array([[0.0, 1.0]]), 3), r"integer atom indices"),
        (lambda: table_from_connectivity([], -1), r"n_atoms must be a non-negative integer"),
        (lambda: table_from_connectivity([(0, 1)], 2, root=2), r"root must be an atom index in \[0, 1\]"),
        (lambda: table_from_connectivity([(0, 1)], 2, xyz=np.zeros((3, 3))), r"xyz must have shape \(2, 3\)"),
        (lambda: table_from_connectivity([(0, 1)], 2, xyz=np.full((2, 3), np.nan)), r"NaN or infinite"),
        (lambda: table_from_xyz([[0, 0, 0], [1, 0, 0]], ["C", "Xx"]), r"unknown element 'Xx' at index 1"),
        (lambda: table_from_xyz([[0, 0, 0], [1, 0, 0]], ["C"]), r"got 1 elements for 2 atoms"),
        (lambda: table_from_xyz([0, 0, 0], ["C"]), r"xyz must have shape \(N, 3\)"),
        (lambda: perceive_connectivity([[0, 0, 0]], ["C"], scale=0.0), r"scale must be positive"),
    ],
)
def test_errors(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


# ------------------------------------------------- at scale: vectorised, same tables
def water_box(n_side: int, seed: int = 0, spacing: float = 3.1) -> np.ndarray:
    """``n_side**3`` randomly turned waters on a cubic grid (``(3 n_side**3, 3)``, O first)."""
    rng = np.random.default_rng(seed)
    water = np.array([[0.0, 0.0, 0.0], [0.9572, 0.0, 0.0], [-0.24, 0.9266, 0.0]])
    grid = np.stack(np.meshgrid(*[np.arange(n_side)] * 3, indexing="ij"), -1).reshape(-1, 3) * spacing
    turns = np.linalg.qr(rng.normal(size=(len(grid), 3, 3)))[0]
    return (np.einsum("wij,aj->wai", turns, water) + grid[:, None, :]).reshape(-1, 3)


def mixed_system(seed: int) -> tuple[np.ndarray, list[str]]:
    """A solute (alanine dipeptide) among waters, CO2 (linear), ions and methane, at random places."""
    rng = np.random.default_rng(seed)
    mol = load("alanine_dipeptide")
    parts = [mol.to_cartesian().numpy().reshape(-1, 3)]
    elements = list(mol.elements or [])
    kinds = {
        "water": (["O", "H", "H"], [[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]]),
        "co2": (["C", "O", "O"], [[0, 0, 0], [1.16, 0, 0], [-1.16, 0, 0]]),
        "ion": (["Na"], [[0, 0, 0]]),
        "pair": (["H", "F"], [[0, 0, 0], [0.92, 0, 0]]),
        "methane": (["C", "H", "H", "H", "H"], [[0, 0, 0], [0.63, 0.63, 0.63], [-0.63, -0.63, 0.63],
                                                 [-0.63, 0.63, -0.63], [0.63, -0.63, -0.63]]),
    }  # fmt: skip
    grid = np.stack(np.meshgrid(*[np.arange(5)] * 3, indexing="ij"), -1).reshape(-1, 3) * 4.0 - 8.0
    grid = grid[np.linalg.norm(grid, axis=1) > 6.0]
    for centre in grid[rng.permutation(len(grid))[:60]]:
        name = list(kinds)[int(rng.integers(len(kinds)))]
        els, xyz = kinds[name]
        turn = np.linalg.qr(rng.normal(size=(3, 3)))[0]
        parts.append(np.asarray(xyz, dtype=np.float64) @ turn.T + centre + rng.normal(size=3) * 0.3)
        elements += els
    return np.concatenate(parts), elements


@pytest.mark.parametrize("backend", ["numpy", "scipy"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_neighbour_backends_give_identical_results(backend: str, seed: int) -> None:
    """The numpy cell list and scipy's cKDTree (optional) find the same bonds and build the same tables."""
    if backend == "scipy":
        pytest.importorskip("scipy", reason="the scipy backend needs scipy")
    from batched_nerf.topology.perceive import close_pairs, neighbour_backend

    rng = np.random.default_rng(seed)
    points = rng.uniform(0, 12, size=(800, 3))
    reach = rng.uniform(0.2, 1.0, size=800)
    xyz, elements = mixed_system(seed)
    with neighbour_backend("numpy"):
        pairs0 = close_pairs(points, reach)
        auto0 = refs_from_xyz(xyz, elements)
    with neighbour_backend(backend):
        pairs1 = close_pairs(points, reach)
        auto1 = refs_from_xyz(xyz, elements)
    brute = np.argwhere(np.triu(pdist(torch.from_numpy(points)).numpy() < reach[:, None] + reach[None, :], 1))
    np.testing.assert_array_equal(pairs0, brute)
    np.testing.assert_array_equal(pairs1, brute)
    for a, b in zip(auto0, auto1):
        np.testing.assert_array_equal(a, b)


def test_neighbour_backend_refuses_unknown_names() -> None:
    from batched_nerf.topology.perceive import neighbour_backend

    with pytest.raises(
        ValueError, match=r"unknown neighbour backend 'kd'; expected 'auto', 'numpy' or 'scipy'"
    ):
        with neighbour_backend("kd"):
            pass


@pytest.mark.parametrize("backend", ["numpy", "auto"])
@pytest.mark.parametrize("system", ["waters", "mixed0", "mixed1", "anchored"])
def test_vectorised_tables_equal_the_atom_by_atom_rules(
    system: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small fragments done at once and fragments linked at once: exactly the sequential rows."""
    import batched_nerf.topology.auto as autotable
    import batched_nerf.topology.link as autolink
    from batched_nerf.topology.perceive import neighbour_backend

    if system == "waters":
        xyz = water_box(6, seed=3)
        elements = ["O", "H", "H"] * (len(xyz) // 3)
    else:
        xyz, elements = mixed_system(int(system[-1]) if system != "anchored" else 5)
    with neighbour_backend(backend):
        fast = refs_from_xyz(xyz, elements)
        per_fragment = refs_from_xyz(xyz, elements, link_fragments=False).refs
        fixed = np.arange(22) if system == "anchored" else None  # the dipeptide's atoms fixed
        if fixed is not None:
            anchored = per_fragment.copy()
            anchored[fixed] = -1
            linked = autolink.link_components(anchored, xyz, fixed=fixed)
        monkeypatch.setattr(autotable, "_SMALL", 0)
        monkeypatch.setattr(autolink, "_SEQUENTIAL", True)
        slow = refs_from_xyz(xyz, elements)
        np.testing.assert_array_equal(refs_from_xyz(xyz, elements, link_fragments=False).refs, per_fragment)
        if fixed is not None:
            np.testing.assert_array_equal(autolink.link_components(anchored, xyz, fixed=fixed), linked)
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)
    table = ConstructionTable(fast.refs)
    assert table.n_components == 1
    x = torch.from_numpy(xyz)
    back = to_cartesian(*to_internal(x, table), table)
    pick = torch.from_numpy(np.random.default_rng(0).permutation(len(xyz))[:200])
    torch.testing.assert_close(pdist(back[pick]), pdist(x[pick]), atol=1e-9, rtol=0)


def test_components_in_numpy_match_a_graph_search() -> None:
    from batched_nerf.topology.link import components

    rng = np.random.default_rng(4)
    for n in (1, 7, 300):
        edges = rng.integers(0, n, size=(int(rng.integers(0, 2 * n)), 2))
        edges = edges[edges[:, 0] != edges[:, 1]]
        comp, count = components(n, edges[:, 0], edges[:, 1])
        expected = _components(_adjacency(edges, n))
        assert comp.tolist() == expected and count == max(expected) + 1
    # a long chain numbered backwards: pointer jumping, not one step per bond
    n = 5000
    comp, count = components(n, np.arange(n - 1)[::-1] + 1, np.arange(n - 1)[::-1])
    assert count == 1 and not comp.any()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70), st.integers(0, 2**31 - 1), st.floats(0.0, 1.0), st.booleans(), st.booleans())
def test_vectorised_linking_equals_linking_one_by_one(
    n: int, seed: int, p_new: float, grid: bool, anchor: bool
) -> None:
    """Random forests at random or grid positions (exact ties and straight lines): the same rows."""
    import batched_nerf.topology.link as autolink

    rng = np.random.default_rng(seed)
    pairs = [(int(rng.integers(0, i)), i) for i in range(1, n) if rng.random() > p_new]
    if grid:
        points = np.stack(np.meshgrid(*[np.arange(5.0)] * 3, indexing="ij"), -1).reshape(-1, 3) * 1.5
        xyz = points[rng.permutation(len(points))[:n]]
    else:
        xyz = rng.normal(size=(n, 3)) * 4.0
    refs = refs_from_connectivity(pairs, n, xyz=xyz, link_fragments=False).refs
    fixed = None
    if anchor:  # the first fragment fixed: the others link to it
        comp = np.array(_components(_adjacency(np.array(pairs).reshape(-1, 2), n)))
        fixed = np.flatnonzero(comp == 0)
        refs = refs.copy()
        refs[fixed] = -1
    fast = autolink.link_components(refs, xyz, fixed=fixed)
    autolink._SEQUENTIAL = True
    try:
        slow = autolink.link_components(refs, xyz, fixed=fixed)
    finally:
        autolink._SEQUENTIAL = False
    np.testing.assert_array_equal(fast, slow)


@pytest.mark.parametrize(("n_a", "n_b"), [(50, 1), (5, 3), (700, 400)])
def test_nearest_distances_are_exact_with_either_backend(n_a: int, n_b: int) -> None:
    """The shell order of fragment linking: distances to the first fragment, bit for bit as brute force."""
    from batched_nerf.topology.link import _nearest_distance
    from batched_nerf.topology.perceive import neighbour_backend

    rng = np.random.default_rng(n_a)
    a, b = rng.uniform(-40, 40, (n_a, 3)), rng.uniform(-15, 15, (n_b, 3))
    brute = np.linalg.norm(a[:, None] - b[None], axis=-1).min(1)
    backends = ["numpy"] + (["scipy"] if importlib.util.find_spec("scipy") else [])
    for backend in backends:
        with neighbour_backend(backend):
            np.testing.assert_array_equal(_nearest_distance(a, b), brute)
