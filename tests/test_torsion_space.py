"""Rotatable bonds and torsion updates against a per-bond reference of DiffDock's loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import batched_nerf as bn

# ----------------------------------------------------------------- molecules


def with_hydrogens(heavy: list[tuple[int, int]], valence: list[int]) -> tuple[list[tuple[int, int]], int]:
    """The heavy-atom graph with hydrogens added up to each atom's valence."""
    pairs, n = list(heavy), len(valence)
    degree = [0] * n
    for i, j in heavy:
        degree[i] += 1
        degree[j] += 1
    for i in range(len(valence)):
        for _ in range(valence[i] - degree[i]):
            pairs.append((i, n))
            n += 1
    return pairs, n


def isopentane():  # 2-methylbutane: C0-C1(-C4)-C2-C3
    return with_hydrogens([(0, 1), (1, 2), (2, 3), (1, 4)], [4] * 5)


def ring_molecule():  # cyclohexane with a methyl, an ethyl and a hydroxyl
    ring = [(k, (k + 1) % 6) for k in range(6)]
    return with_hydrogens([*ring, (0, 6), (3, 7), (7, 8), (1, 9)], [4] * 9 + [2])


def biphenyl_like():  # two cyclohexyl rings joined by one bond: equal sides, the tie rule
    ring_a = [(k, (k + 1) % 6) for k in range(6)]
    ring_b = [(6 + k, 6 + (k + 1) % 6) for k in range(6)]
    return with_hydrogens(ring_a + ring_b + [(0, 6)], [4] * 12)


def coordinates(pairs, n, seed):
    """Float64 coordinates with bond lengths, angles and dihedrals of a plausible molecule."""
    gen = torch.Generator().manual_seed(seed)
    table = bn.ConstructionTable.from_connectivity(pairs, n)
    bonds = 1.0 + 0.5 * torch.rand(n, generator=gen, dtype=torch.float64)
    angles = 1.85 + 0.2 * torch.rand(n, generator=gen, dtype=torch.float64)
    dihedrals = (2 * torch.rand(n, generator=gen, dtype=torch.float64) - 1) * math.pi
    return bn.to_cartesian(bonds, angles, dihedrals, table)  # ring closures at any distance: fine here


# ----------------------------------------------------------------- the reference


def diffdock_update(pos: np.ndarray, bonds: np.ndarray, masks: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """DiffDock's modify_conformer_torsion_angles, as described: one bond after the other.

    For bond ``(u, v)`` the atoms of its mask (``v``'s side) turn by ``tau`` about the
    axis ``x_u - x_v`` through ``x_v`` (Rodrigues' formula), with the current positions.
    """
    pos = np.array(pos, dtype=np.float64)
    for (u, v), mask, tau in zip(bonds.tolist(), masks, taus.tolist()):
        k = pos[u] - pos[v]
        k = k / np.linalg.norm(k)
        p = pos[mask] - pos[v]
        rotated = (
            p * math.cos(tau) + np.cross(k, p) * math.sin(tau) + np.outer(p @ k, k) * (1 - math.cos(tau))
        )
        pos[mask] = rotated + pos[v]
    return pos


def distances(x):
    x = np.asarray(x)
    return np.linalg.norm(x[:, None] - x[None], axis=-1)


MOLECULES = {"isopentane": isopentane, "ring": ring_molecule, "bicyclohexyl": biphenyl_like}


def molecule(name, seed=0):
    pairs, n = MOLECULES[name]()
    return pairs, n, coordinates(pairs, n, seed)


# ----------------------------------------------------------------- rotatable bonds


def test_rotatable_bonds_rule():
    pairs, n = isopentane()
    bonds = bn.rotatable_bonds(pairs, n)
    # the four C-C bonds (methyls turn too), no C-H bond
    assert set(map(frozenset, bonds.tolist())) == set(map(frozenset, [(0, 1), (1, 2), (2, 3), (1, 4)]))
    # the smaller side turns: the methyl groups, and the ethyl side of C1-C2
    assert {tuple(b) for b in bonds.tolist()} == {(1, 0), (1, 2), (2, 3), (1, 4)}
    larger = bn.rotatable_bonds(pairs, n, moving="larger")
    assert {tuple(b) for b in larger.tolist()} == {(0, 1), (2, 1), (3, 2), (4, 1)}


def test_ring_bonds_are_not_rotatable():
    pairs, n = ring_molecule()
    bonds = {frozenset(b) for b in bn.rotatable_bonds(pairs, n).tolist()}
    assert bonds == {frozenset(b) for b in [(0, 6), (3, 7), (7, 8), (1, 9)]}


def test_tie_breaking():
    pairs, n = biphenyl_like()
    bonds = bn.rotatable_bonds(pairs, n).tolist()
    assert [0, 6] not in bonds and [6, 0] in bonds  # tie: the side of atom 0 turns
    rotors = bn.RotorTable(pairs, n)
    k = rotors.bonds.tolist().index([6, 0])
    assert rotors.moving[k, 0] and not rotors.moving[k, 6]
    assert int(rotors.moving[k].sum()) == n // 2


@pytest.mark.parametrize("name", sorted(MOLECULES))
@pytest.mark.parametrize("moving", ["smaller", "larger"])
def test_rows_across_a_bond_are_its_torsion_rows(name, moving):
    """Every row with atoms strictly on both sides of a rotatable bond is a torsion row of it."""
    pairs, n = MOLECULES[name]()
    rotors = bn.RotorTable(pairs, n, moving=moving)
    refs = rotors.table.refs.numpy()
    rows = set(zip(rotors.rows.tolist(), rotors.row_bonds.tolist()))
    assert rotors.n_bonds > 0 and len(rows) >= rotors.n_bonds
    for k, (u, v) in enumerate(rotors.bonds.tolist()):
        side_v = rotors.moving[k].numpy().copy()
        side_u = ~side_v
        side_v[v] = side_u[u] = False  # the axis atoms are on both sides
        for i in range(n):
            atoms = [i, *(int(r) for r in refs[i] if r >= 0)]
            across = any(side_v[a] for a in atoms) and any(side_u[a] for a in atoms)
            if across:
                b, a, d = refs[i]
                assert {b, a} == {u, v}, (name, k, i, refs[i])
                assert (i, k) in rows
            else:
                assert (i, k) not in rows
        # no row is a torsion row of two bonds, every bond has one
        assert k in rotors.row_bonds.tolist()
    assert len(set(rotors.rows.tolist())) == len(rotors.rows)
    if moving == "smaller":
        assert rotors.keeps_fixed


def test_bad_bonds_are_named():
    pairs, n = ring_molecule()
    with pytest.raises(ValueError, match=r"bonds\[0\] = \(0, 1\) is in a ring"):
        bn.RotorTable(pairs, n, bonds=[(0, 1)])
    with pytest.raises(ValueError, match=r"bonds\[1\] = \(0, 8\) is not a bond"):
        bn.RotorTable(pairs, n, bonds=[(0, 6), (0, 8)])
    h = next(j for i, j in pairs if i == 9)  # the hydroxyl hydrogen
    with pytest.raises(ValueError, match=rf"bonds\[0\] = \(9, {h}\) is terminal: atom {h}"):
        bn.RotorTable(pairs, n, bonds=[(9, h)])
    with pytest.raises(ValueError, match=r"bonds\[1\] = \(6, 0\): the bond is given twice"):
        bn.RotorTable(pairs, n, bonds=[(0, 6), (6, 0)])
    with pytest.raises(ValueError, match="moving must be"):
        bn.rotatable_bonds(pairs, n, moving="left")


def test_rotor_tables_are_cached():
    pairs, n = isopentane()
    a = bn.RotorTable.from_connectivity(pairs, n)
    assert a is bn.RotorTable.from_connectivity(list(reversed(pairs)), n)
    assert a is not bn.RotorTable.from_connectivity(pairs, n, moving="larger")
    assert repr(a) == f"RotorTable(n_atoms={n}, n_bonds=4)"


# ----------------------------------------------------------------- updates against the reference


@pytest.mark.parametrize("name", sorted(MOLECULES))
@pytest.mark.parametrize("moving", ["smaller", "larger"])
def test_matches_diffdock(name, moving):
    pairs, n, xyz = molecule(name, seed=1)
    rotors = bn.RotorTable.from_connectivity(pairs, n, moving=moving)
    taus = torch.linspace(-2.5, 3.0, rotors.n_bonds, dtype=torch.float64)
    new = bn.update_torsions(xyz, rotors, taus)
    ref = diffdock_update(xyz.numpy(), rotors.bonds.numpy(), rotors.moving.numpy(), taus.numpy())
    assert np.abs(distances(new.numpy()) - distances(ref)).max() < 1e-8
    assert np.abs(distances(new.numpy()) - distances(xyz.numpy())).max() > 0.1  # it did move
    if rotors.keeps_fixed:  # the atoms no bond moves stay exactly where they were
        fixed = rotors.fixed.numpy()
        assert fixed.sum() >= 3
        assert np.abs(new.numpy()[fixed] - xyz.numpy()[fixed]).max() < 1e-10
        assert np.abs(new.numpy() - ref).max() < 1e-8  # so it is the peers' result itself
    # the sign: +tau is not the IUPAC dihedral's +tau
    wrong = diffdock_update(xyz.numpy(), rotors.bonds.numpy(), rotors.moving.numpy(), -taus.numpy())
    assert np.abs(distances(new.numpy()) - distances(wrong)).max() > 0.1


def test_sign_in_iupac_terms():
    """tau turns the IUPAC dihedral p-u-v-m by -tau."""
    pairs, n, xyz = molecule("isopentane", seed=2)
    rotors = bn.RotorTable(pairs, n)
    k = rotors.bonds.tolist().index([1, 2])  # the ethyl side turns
    taus = torch.zeros(rotors.n_bonds, dtype=torch.float64)
    taus[k] = 0.7
    new = bn.update_torsions(xyz, rotors, taus)
    chain = bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]])
    before = bn.to_internal(xyz[[0, 1, 2, 3]], chain).dihedrals[3]
    after = bn.to_internal(new[[0, 1, 2, 3]], chain).dihedrals[3]
    delta = math.remainder(float(after - before), 2 * math.pi)
    assert abs(delta + 0.7) < 1e-10


def test_ragged_batch_pyg_layout():
    names = ["isopentane", "ring", "bicyclohexyl"]
    mols = [molecule(name, seed=s) for s, name in enumerate(names)]
    rotors = [bn.RotorTable.from_connectivity(p, n) for p, n, _ in mols]
    xyz = torch.cat([x for _, _, x in mols])
    batch = torch.cat([torch.full((n,), m) for m, (_, n, _) in enumerate(mols)])
    gen = torch.Generator().manual_seed(5)
    total = sum(r.n_bonds for r in rotors)
    taus = (2 * torch.rand(total, generator=gen, dtype=torch.float64) - 1) * math.pi
    new = bn.update_torsions(xyz, rotors, taus, batch=batch)
    assert new.shape == xyz.shape
    assert torch.equal(bn.update_torsions(xyz, rotors, taus), new)  # batch only checks
    parts = bn.split_atoms(new, [r.n_atoms for r in rotors])
    for part, r, (_, _, x), t in zip(parts, rotors, mols, taus.split([r.n_bonds for r in rotors])):
        ref = diffdock_update(x.numpy(), r.bonds.numpy(), r.moving.numpy(), t.numpy())
        assert np.abs(distances(part.numpy()) - distances(ref)).max() < 1e-8
        assert np.abs(part.numpy() - ref).max() < 1e-8


def test_shared_rotor_table_with_batch_and_copies():
    pairs, n, xyz = molecule("ring", seed=3)
    rotors = bn.RotorTable.from_connectivity(pairs, n)
    taus = torch.randn(3, rotors.n_bonds, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    copies = torch.stack([xyz, xyz + 1.0, 2 * xyz])
    batched = bn.update_torsions(copies, rotors, taus)
    flat = bn.update_torsions(
        copies.reshape(-1, 3), rotors, taus.reshape(-1), batch=torch.arange(3).repeat_interleave(n)
    )
    assert torch.allclose(batched.reshape(-1, 3), flat, atol=1e-12)
    for c in range(3):
        ref = diffdock_update(copies[c].numpy(), rotors.bonds.numpy(), rotors.moving.numpy(), taus[c].numpy())
        assert np.abs(batched[c].numpy() - ref).max() < 1e-8


@pytest.mark.parametrize("name", sorted(MOLECULES))
def test_zero_update_is_identity(name):
    pairs, n, xyz = molecule(name, seed=4)
    rotors = bn.RotorTable.from_connectivity(pairs, n, moving="larger")
    new = bn.update_torsions(xyz, rotors, torch.zeros(rotors.n_bonds, dtype=torch.float64))
    assert (new - xyz).abs().max() < 1e-10


def test_molecule_without_rotatable_bonds():
    rotors = bn.RotorTable([(0, 1), (0, 2)], 3)
    xyz = torch.tensor([[0.0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]], dtype=torch.float64)
    assert rotors.n_bonds == 0 and rotors.rows.numel() == 0
    assert (bn.update_torsions(xyz, rotors, torch.zeros(0, dtype=torch.float64)) - xyz).abs().max() < 1e-12


# ----------------------------------------------------------------- derivatives


def small():
    pairs, n = with_hydrogens([(0, 1), (1, 2), (2, 3)], [4, 4, 4, 2])  # propanol
    return pairs, n, coordinates(pairs, n, seed=6)


def test_gradcheck_updates_and_coordinates():
    pairs, n, xyz = small()
    rotors = bn.RotorTable.from_connectivity(pairs, n)
    assert rotors.n_bonds == 3  # the methyl, C1-C2 and the hydroxyl
    taus = torch.tensor([0.3, -1.1, 2.0], dtype=torch.float64)
    xyz = xyz.clone().requires_grad_()
    taus = taus.clone().requires_grad_()

    def f(x, t):
        return bn.update_torsions(x, rotors, t)

    assert torch.autograd.gradcheck(f, (xyz, taus))
    assert torch.autograd.gradgradcheck(f, (xyz, taus))


def test_jacrev_and_vmap_over_updates():
    pairs, n, xyz = small()
    rotors = bn.RotorTable.from_connectivity(pairs, n)
    taus = torch.zeros(rotors.n_bonds, dtype=torch.float64)
    jac = torch.func.jacrev(lambda t: bn.update_torsions(xyz, rotors, t))(taus)
    assert jac.shape == (n, 3, rotors.n_bonds)
    # at tau = 0, d x_m / d tau_k = k_hat x (x_m - x_v) on the moving side of bond k, k_hat ~ x_u - x_v
    for k, (u, v) in enumerate(rotors.bonds.tolist()):
        axis = (xyz[u] - xyz[v]) / (xyz[u] - xyz[v]).norm()
        expected = torch.linalg.cross(axis.expand(n, 3), xyz - xyz[v]) * rotors.moving[k, :, None]
        assert (jac[..., k] - expected).abs().max() < 1e-10
    many = torch.randn(5, rotors.n_bonds, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mapped = torch.func.vmap(lambda t: bn.update_torsions(xyz, rotors, t))(many)
    direct = bn.update_torsions(xyz.expand(5, n, 3), rotors, many)
    assert (mapped - direct).abs().max() < 1e-12


# ----------------------------------------------------------------- bad input


def ragged():
    mols = [molecule("isopentane", 0), molecule("ring", 1)]
    rotors = [bn.RotorTable.from_connectivity(p, n) for p, n, _ in mols]
    xyz = torch.cat([x for _, _, x in mols])
    batch = torch.cat([torch.full((n,), m) for m, (_, n, _) in enumerate(mols)])
    taus = torch.zeros(sum(r.n_bonds for r in rotors), dtype=torch.float64)
    return xyz, rotors, taus, batch


def test_unsorted_batch():
    xyz, rotors, taus, batch = ragged()
    bad = batch.clone()
    bad[[0, -1]] = bad[[-1, 0]]
    with pytest.raises(ValueError, match=r"batch must be sorted.*batch\[0\] = 1 > batch\[1\] = 0"):
        bn.update_torsions(xyz, rotors, taus, batch=bad)
    with pytest.raises(TypeError, match="batch must be a 1-D integer tensor"):
        bn.update_torsions(xyz, rotors, taus, batch=batch.double())


def test_atom_counts_named_by_molecule():
    xyz, rotors, taus, batch = ragged()
    bad = batch.clone()
    bad[rotors[0].n_atoms] = 0  # the first atom of molecule 1 given to molecule 0
    with pytest.raises(ValueError, match=rf"molecule 0 has {rotors[0].n_atoms + 1} atoms in batch"):
        bn.update_torsions(xyz, rotors, taus, batch=bad)
    with pytest.raises(ValueError, match=r"xyz has \d+ atoms, but the molecules have \d+ \(per molecule"):
        bn.update_torsions(xyz[:-1], rotors, taus)
    with pytest.raises(TypeError, match=r"rotors\[1\] \(molecule 1\) must be a RotorTable"):
        bn.update_torsions(xyz, [rotors[0], rotors[1].table], taus)


def test_update_count():
    xyz, rotors, taus, batch = ragged()
    counts = [r.n_bonds for r in rotors]
    with pytest.raises(
        ValueError,
        match=rf"updates has {len(taus) - 1} values, .* {len(taus)} rotatable bonds "
        rf"\(per molecule: \[{counts[0]}, {counts[1]}\]\)",
    ):
        bn.update_torsions(xyz, rotors, taus[:-1], batch=batch)
    with pytest.raises(TypeError, match="updates must be a real floating tensor"):
        bn.update_torsions(xyz, rotors, taus.long(), batch=batch)
    with pytest.raises(ValueError, match="need the leading shape"):
        bn.update_torsions(xyz, rotors, taus.expand(2, -1), batch=batch)


def test_nan_update_stays_in_its_molecule():
    xyz, rotors, taus, batch = ragged()
    taus = taus.clone()
    k = rotors[0].n_bonds + 1  # a bond of molecule 1
    taus[k] = float("nan")
    new = bn.update_torsions(xyz, rotors, taus, batch=batch)
    first, second = bn.split_atoms(new, [r.n_atoms for r in rotors])
    assert torch.allclose(first, xyz[: rotors[0].n_atoms], atol=1e-10)
    moved = rotors[1].moving[1] & ~rotors[1].fixed
    assert torch.isnan(second[moved]).all()
    assert torch.isfinite(second[rotors[1].fixed]).all()


# ----------------------------------------------------------------- rigid turns: kernel, torch, fallback


def test_a_fixed_side_neighbour_collinear_with_the_bond_turns_exactly():
    """p-u-v collinear (an sp atom on the fixed side): the dihedral p-u-v-m is undefined, the turn is
    not. The internal-coordinate round trip collapsed atom 0 onto atom 1 here (bond 1 -> 1e-8)."""
    rotors = bn.RotorTable.from_connectivity([(0, 1), (1, 2), (2, 3)], 4)
    assert rotors.bonds.tolist() == [[2, 1]]
    xyz = torch.tensor([[1.0, 1, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0]], dtype=torch.float64)
    want = torch.tensor([[1.0, 0, 1], [1, 0, 0], [2, 0, 0], [3, 0, 0]], dtype=torch.float64)
    tau = torch.tensor([math.pi / 2], dtype=torch.float64)
    for x in (xyz, xyz.clone().requires_grad_()):  # the kernel, and the torch path
        torch.testing.assert_close(bn.update_torsions(x, rotors, tau), want, rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_the_kernel_and_the_torch_turns_agree(dtype):
    pytest.importorskip("numba", reason='the kernel needs numba: pip install -e ".[fast]"')
    xyz, rotors, taus, batch = ragged()
    xyz = torch.stack([xyz, xyz.flip(-1)]).to(dtype)  # two frames of the ragged batch
    taus = torch.linspace(-2.5, 3.0, taus.shape[-1], dtype=torch.float64)
    taus = torch.stack([taus, -0.5 * taus]).to(dtype)
    plain = bn.update_torsions(xyz, rotors, taus, batch=batch)  # nothing to differentiate: the kernel
    graph = bn.update_torsions(xyz.clone().requires_grad_(), rotors, taus, batch=batch)  # torch
    assert graph.grad_fn is not None and plain.dtype == dtype
    torch.testing.assert_close(plain, graph.detach(), rtol=0, atol=1e-12 if dtype == torch.float64 else 2e-5)
    fixed = torch.cat([r.fixed for r in rotors])
    assert torch.equal(plain[:, fixed], xyz[:, fixed])  # copied, bit for bit
    assert torch.equal(graph.detach()[:, fixed], xyz[:, fixed])


def test_nested_sides_compose_and_overlapping_sides_take_the_round_trip():
    from batched_nerf.torsion_space.packed import _packed

    pairs, n, xyz = molecule("ring", seed=4)
    smaller = bn.RotorTable.from_connectivity(pairs, n)
    plan = _packed((smaller,)).turns
    assert plan is not None and (plan.parent >= 0).any()  # some side lies inside another
    larger = bn.RotorTable(pairs, n, moving="larger")
    assert _packed((larger,)).turns is None  # sides overlapping without nesting: the round trip serves
    taus = torch.linspace(-1.0, 1.5, larger.n_bonds, dtype=torch.float64)
    new = bn.update_torsions(xyz, larger, taus)
    ref = diffdock_update(xyz.numpy(), larger.bonds.numpy(), larger.moving.numpy(), taus.numpy())
    assert np.abs(distances(new.numpy()) - distances(ref)).max() < 1e-8


def test_the_backward_kernel_is_the_torch_turns_gradient():
    pytest.importorskip("numba", reason='the kernels need numba: pip install -e ".[fast]"')
    from batched_nerf.torsion_space.packed import _packed
    from batched_nerf.torsion_space.turns import _turned_torch

    xyz, rotors, taus, batch = ragged()
    taus = torch.linspace(-2.5, 3.0, taus.shape[-1], dtype=torch.float64)
    x, t = xyz.clone().requires_grad_(), taus.clone().requires_grad_()
    new = bn.update_torsions(x, rotors, t, batch=batch)
    assert type(new.grad_fn).__name__ == "TurnSidesBackward"  # the kernel, whose backward is a kernel
    g = torch.randn(new.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    got = torch.autograd.grad(new, (x, t), g)
    want = torch.autograd.grad(_turned_torch(x, t, _packed(tuple(rotors)).turns), (x, t), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # second order through the torch version's graph
    assert torch.autograd.gradgradcheck(lambda a, b: bn.update_torsions(a, rotors, b, batch=batch), (x, t))


def test_the_backward_kernel_at_a_zero_length_bond():
    """Both atoms of the bond at one point: no turn, and the kernel's gradient is the torch turns'
    (the axis divided by the clamp ``EPS``, as ``safe_normalize`` does), finite."""
    pytest.importorskip("numba", reason='the kernels need numba: pip install -e ".[fast]"')
    from batched_nerf.torsion_space.packed import _packed
    from batched_nerf.torsion_space.turns import _turn_vjp_kernel, _turned_torch

    rotors = bn.RotorTable.from_connectivity([(0, 1), (1, 2), (2, 3)], 4)
    xyz = torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 0, 0], [2, 1, 0]], dtype=torch.float64)
    tau = torch.tensor([0.3], dtype=torch.float64)
    assert torch.equal(bn.update_torsions(xyz, rotors, tau), xyz)
    plan = _packed((rotors,)).turns
    g = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    x, t = xyz.clone().requires_grad_(), tau.clone().requires_grad_()
    want = torch.autograd.grad(_turned_torch(x, t, plan), (x, t), g)
    got = _turn_vjp_kernel(xyz, tau, g, plan)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
