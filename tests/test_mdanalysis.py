"""MD trajectories: MDAnalysis AtomGroups and BAT, mdtraj trajectories (formats.mdanalysis, formats.mdtraj).

BAT (``MDAnalysis.analysis.bat``) is the oracle: our values from its table equal
``results.bat``, and our Cartesian from ``results.bat`` equals ``BAT.Cartesian``,
on MDAnalysisTests' capped alanine in water and ring-bearing ligand (fast) and
AdK residues 1-40 (slow: BAT's own setup takes 15-20 s there).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf.core.files import optional_import

mda = pytest.importorskip("MDAnalysis", reason="MDAnalysis is an optional dependency (batched-nerf[md])")
data = pytest.importorskip(
    "MDAnalysisTests.datafiles", reason="MDAnalysisTests (test trajectories) is an optional dependency"
)
from MDAnalysis.analysis.bat import BAT  # noqa: E402

from batched_nerf.formats.mdanalysis import (  # noqa: E402
    AtomGroupTable,
    BATTable,
    frames,
    from_bat,
    table_from_atomgroup,
    table_from_bat,
    to_bat,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

#: columns of a BAT frame that are angles on the circle (phi, omega; theta and a012 are in [0, pi])
ANGULAR = (3, 5)


def _universe(*files, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mda.Universe(*files, **kwargs)


def _bat_gap(ours: np.ndarray, theirs: np.ndarray) -> float:
    """Largest difference of two BAT arrays, torsions and phi/omega compared on the circle."""
    n = theirs.shape[-1] // 3
    gap = np.abs(ours - theirs)
    circ = np.zeros(theirs.shape[-1], dtype=bool)
    circ[list(ANGULAR)] = True
    circ[9 + 2 * (n - 3) :] = True
    gap[..., circ] = np.abs(np.angle(np.exp(1j * (ours - theirs)[..., circ])))
    return float(gap.max())


def _run_bat(ag) -> BAT:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BAT(ag).run()


@pytest.fixture(scope="module")
def ala():
    """Capped alanine (ACE-ALA-NME) in TIP3P water, 11 frames (prmtop + mdcrd), solute BAT."""
    u = _universe(data.PRMpbc, data.TRJpbc_bz2, in_memory=True)
    return u, _run_bat(u.select_atoms("not resname WAT"))


@pytest.fixture(scope="module")
def ligand():
    """A 297-atom peptide ligand with a phenyl ring (mol2 bonds), one frame."""
    u = _universe(data.mol2_ligand)
    return u, _run_bat(u.atoms)


@pytest.fixture(scope="module")
def adk():
    """AdK residues 1-40 (613 atoms), 98 frames of PSF/DCD, and its BAT (slow to set up)."""
    u = _universe(data.PSF, data.DCD)
    return u, _run_bat(u.select_atoms("resid 1-40"))


@pytest.fixture(scope="module")
def adk_universe():
    return _universe(data.PSF, data.DCD)


def _bat_checks(bat: BAT, every_frame: bool = True) -> None:
    bt = table_from_bat(bat)
    values = bat.results.bat
    xyz = frames(bat.atoms)
    assert xyz.dtype == torch.float64 and xyz.shape == (len(values), bat.atoms.n_atoms, 3)
    # coordinates -> BAT layout: equal to BAT's own run
    ic, pose = bn.to_internal(xyz, bt.table, return_pose=True)
    ours = to_bat(ic, pose, bt)
    assert ours.shape == values.shape and ours.dtype == torch.float64
    assert _bat_gap(ours.numpy(), values) < 1e-6
    # BAT layout -> coordinates, every frame in one to_cartesian call: equal to BAT.Cartesian
    ic, pose = from_bat(values, bt)
    rebuilt = bn.to_cartesian(*ic, bt.table, rotation=pose.rotation, translation=pose.translation)
    frames_checked = range(len(values)) if every_frame else range(0, len(values), max(1, len(values) // 4))
    for k in frames_checked:
        assert np.abs(rebuilt[k].numpy() - bat.Cartesian(values[k])).max() < 1e-5, f"frame {k}"
    # and the trajectory itself, up to its float32 storage
    assert (rebuilt - xyz).abs().max() < 1e-4


def test_bat_capped_alanine(ala):
    _bat_checks(ala[1])


def test_bat_ligand_with_ring(ligand):
    _bat_checks(ligand[1])


@pytest.mark.slow
def test_bat_adk_residues_1_40_every_frame(adk):
    u, bat = adk
    assert bat.atoms.n_atoms == 613 and len(bat.results.bat) == 98
    _bat_checks(bat)


def test_bat_table_follows_bats_tree(ala):
    _, bat = ala
    bt = table_from_bat(bat)
    assert isinstance(bt, BATTable) and bt.table.n_atoms == 22 and bt.table.n_components == 1
    pos = {int(i): k for k, i in enumerate(bat.atoms.indices)}
    refs = bt.table.refs
    r0, r1, r2 = (pos[int(a.index)] for a in bat._root)
    assert bt.root.tolist() == [r0, r1, r2]
    assert refs[r0].tolist() == [-1, -1, -1] and refs[r1].tolist() == [r0, -1, -1]
    assert refs[r2].tolist() == [r1, r0, -1]
    for k, torsion in enumerate(bat._torsions):
        a0, a1, a2, a3 = (pos[int(a.index)] for a in torsion)
        assert refs[a0].tolist() == [a1, a2, a3] and bt.torsions[k].tolist() == [a0, a1, a2, a3]
    assert torch.equal(bt.indices, torch.as_tensor(bat.atoms.indices, dtype=torch.long))
    # improper torsions exist here (methyl and amide branches) and are stored as differences
    improper = bt.primary != torch.arange(len(bt.primary))
    assert improper.sum() > 0
    ic = bn.to_internal(frames(bat.atoms), bt.table)
    a0 = bt.torsions[:, 0]
    d = ic.dihedrals[:, a0]
    diff = d[:, improper] - d[:, bt.primary[improper]]
    stored = torch.from_numpy(bat.results.bat[:, 9 + 2 * 19 :][:, improper.numpy()])
    assert torch.angle(torch.polar(torch.ones_like(diff), diff - stored)).abs().max() < 1e-6


def test_from_bat_and_to_bat_are_inverse():
    """Synthetic BAT values (no MDAnalysis data): from_bat then to_bat gives them back."""
    u = _universe(data.PRMpbc, data.TRJpbc_bz2)
    bt = table_from_bat(BAT(u.select_atoms("not resname WAT")))
    g = torch.Generator().manual_seed(0)
    n = bt.table.n_atoms
    m = n - 3
    f = 16
    values = torch.cat(
        (
            torch.randn(f, 3, generator=g, dtype=torch.float64) * 10,
            torch.rand(f, 1, generator=g, dtype=torch.float64) * 2 * math.pi - math.pi,  # phi
            torch.rand(f, 1, generator=g, dtype=torch.float64) * 2.8 + 0.17,  # theta in (0, pi)
            torch.rand(f, 1, generator=g, dtype=torch.float64) * 2 * math.pi - math.pi,  # omega
            torch.rand(f, 2, generator=g, dtype=torch.float64) + 1.0,  # r01, r12
            torch.rand(f, 1, generator=g, dtype=torch.float64) * 1.5 + 1.2,  # a012
            torch.rand(f, m, generator=g, dtype=torch.float64) + 1.0,
            torch.rand(f, m, generator=g, dtype=torch.float64) * 1.5 + 1.2,
            torch.rand(f, m, generator=g, dtype=torch.float64) * 2 * math.pi - math.pi,
        ),
        -1,
    )
    ic, pose = from_bat(values, bt)
    assert ic.bonds.shape == (f, n) and pose.rotation.shape == (f, 3, 3) and pose.translation.shape == (f, 3)
    eye = torch.eye(3, dtype=torch.float64)
    assert torch.allclose(pose.rotation.transpose(-1, -2) @ pose.rotation, eye.expand(f, 3, 3), atol=1e-12)
    assert torch.allclose(torch.linalg.det(pose.rotation), torch.ones(f, dtype=torch.float64))
    assert ((ic.dihedrals > -math.pi) & (ic.dihedrals <= math.pi)).all()
    assert _bat_gap(to_bat(ic, pose, bt).numpy(), values.numpy()) < 1e-10
    # through Cartesian coordinates and back
    xyz = bn.to_cartesian(*ic, bt.table, rotation=pose.rotation, translation=pose.translation)
    back = to_bat(*bn.to_internal(xyz, bt.table, return_pose=True), bt)
    assert _bat_gap(back.numpy(), values.numpy()) < 1e-9
    # BAT's own wrapping: torsions in [-pi, pi)
    tors = back[:, 9 + 2 * m :]
    assert ((tors >= -math.pi) & (tors < math.pi)).all()
    # one frame, float32 and numpy in give their shapes and dtypes
    ic1, pose1 = from_bat(values[0].float(), bt)
    assert ic1.bonds.shape == (n,) and ic1.bonds.dtype == torch.float32 and pose1.rotation.shape == (3, 3)
    assert from_bat(values.numpy(), bt)[0].bonds.dtype == torch.float64
    # to_bat casts up to the widest input, never down
    assert to_bat(ic1, pose, bt).dtype == torch.float64 and to_bat(ic1, pose1, bt).dtype == torch.float32


def test_bat_converters_are_differentiable_and_vmap(ala):
    _, bat = ala
    bt = table_from_bat(bat)
    v = torch.from_numpy(bat.results.bat[:1].copy()).requires_grad_(True)

    def cartesian(values):
        ic, pose = from_bat(values, bt)
        return bn.to_cartesian(*ic, bt.table, rotation=pose.rotation, translation=pose.translation)

    def back(values):
        return to_bat(*bn.to_internal(cartesian(values), bt.table, return_pose=True), bt)

    assert torch.autograd.gradcheck(cartesian, (v,))
    assert torch.autograd.gradcheck(back, (v,))
    assert torch.autograd.gradgradcheck(cartesian, (v,), fast_mode=True)  # the full one takes 30 s here
    every = torch.from_numpy(bat.results.bat)
    assert torch.allclose(torch.func.vmap(cartesian)(every), cartesian(every), atol=1e-12)
    assert torch.allclose(torch.func.vmap(back)(every), back(every), atol=1e-12)


# ------------------------------------------------------------------- table_from_atomgroup


def _round_trip(agt: AtomGroupTable, xyz: torch.Tensor) -> None:
    ic, pose = bn.to_internal(xyz, agt.table, return_pose=True)
    back = bn.to_cartesian(*ic, agt.table, rotation=pose.rotation, translation=pose.translation)
    assert (back - xyz).abs().max() < 1e-9


def test_several_molecules_linked_or_apart(adk_universe):
    u = adk_universe
    ag = u.select_atoms("resid 1-10 or resid 30-40")  # one chain cut in two: two molecules
    assert len(ag.fragments) == 1  # MDAnalysis's fragments are of the whole universe ...
    xyz = frames(ag, stop=5)
    linked = table_from_atomgroup(ag)
    assert linked.table.n_components == 1 and bn.pose_components(linked.table) == 1
    _round_trip(linked, xyz)
    apart = table_from_atomgroup(ag, link_fragments=False)
    assert apart.table.n_components == 2 and bn.pose_components(apart.table) == 2
    ic, pose = bn.to_internal(xyz, apart.table, return_pose=True)
    assert pose.rotation.shape == (5, 2, 3, 3)
    _round_trip(apart, xyz)
    assert torch.equal(linked.indices, torch.as_tensor(ag.indices))


def test_solute_with_waters_which_bat_refuses(ala):
    u, _ = ala
    ag = u.select_atoms("not resname WAT or (resname WAT and resid 10:14)")
    assert ag.n_atoms == 22 + 15
    with pytest.raises(ValueError, match="more than one molecule"):
        BAT(ag)
    agt = table_from_atomgroup(ag)
    assert agt.table.n_components == 1
    _round_trip(agt, frames(ag))
    assert table_from_atomgroup(ag, link_fragments=False).table.n_components == 6


def test_heavy_atoms_only(adk_universe):
    heavy = adk_universe.select_atoms("resid 1-40 and not name H*")
    agt = table_from_atomgroup(heavy)
    assert agt.table.n_atoms == heavy.n_atoms and agt.table.n_components == 1
    xyz = frames(heavy, step=10)
    _round_trip(agt, xyz)
    # every bond reference is a chemical bond (hydrogens gone, their bonds too)
    ic = bn.to_internal(xyz, agt.table)
    used = agt.table.refs[:, 0] >= 0
    assert ic.bonds[:, used].max() < 2.0 and ic.bonds[:, used].min() > 1.1


def test_table_from_atomgroup_keeps_atomgroup_order(adk_universe):
    u = adk_universe
    ag = u.select_atoms("resid 3")
    shuffled = ag[np.random.default_rng(0).permutation(ag.n_atoms)]
    a, b = table_from_atomgroup(ag), table_from_atomgroup(shuffled)
    assert torch.equal(b.indices, torch.as_tensor(shuffled.indices))
    # row i is shuffled[i]: every bond reference of row i is a chemical bond of atom shuffled[i]
    bonded = {tuple(sorted(p)) for p in ag.bonds.indices.tolist()}
    for t, group in ((a, ag), (b, shuffled)):
        idx = group.indices.tolist()
        pairs = [tuple(sorted((idx[i], idx[r]))) for i, r in enumerate(t.table.refs[:, 0].tolist()) if r >= 0]
        assert len(pairs) == ag.n_atoms - 1 and set(pairs) <= bonded
    assert torch.equal(frames(u, stop=1, indices=b)[0], frames(shuffled, stop=1)[0])
    _round_trip(b, frames(shuffled, stop=3))


def test_torsions_become_rows(adk_universe):
    u = adk_universe
    ag = u.select_atoms("resid 1-40")
    quads = [r.phi_selection() for r in ag.residues] + [r.psi_selection() for r in ag.residues]
    quads = [q if q is not None and np.isin(q.indices, ag.indices).all() else None for q in quads]
    agt = table_from_atomgroup(ag, torsions=quads)
    assert agt.torsion_rows.shape == (len(quads),)
    assert quads[0] is None and (agt.torsion_rows[0] == -1)  # residue 1 has no phi
    made = [(k, int(r)) for k, r in enumerate(agt.torsion_rows) if r >= 0]
    assert len(made) >= 0.9 * sum(q is not None for q in quads)
    xyz = frames(ag, step=20)
    ic = bn.to_internal(xyz, agt.table)
    for k, row in made:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = [math.radians(quads[k].dihedral.value()) for _ in u.trajectory[::20]]
        got = ic.dihedrals[:, row]
        assert np.allclose(np.angle(np.exp(1j * (got.numpy() - np.array(expected)))), 0, atol=1e-5), k
    _round_trip(agt, xyz)
    # positions in the AtomGroup work too
    rows = table_from_atomgroup(ag, torsions=[[0, 4, 6, 7]]).torsion_rows
    assert rows.shape == (1,)


def test_topology_without_coordinates():
    u = _universe(data.PSF)  # no trajectory: the bond graph only, molecules not linked
    agt = table_from_atomgroup(u.select_atoms("resid 1-3 or resid 7"))
    assert agt.table.n_atoms == 69 and agt.table.n_components == 2
    with pytest.raises(ValueError, match="needs xyz"):
        table_from_atomgroup(u.select_atoms("resid 1-3"), link_fragments=True)


def test_root_is_placed_at_the_origin(adk_universe):
    ag = adk_universe.select_atoms("resid 5")
    for root in (3, ag[3]):
        agt = table_from_atomgroup(ag, root=root)
        assert agt.table.refs[3].tolist() == [-1, -1, -1]


# ------------------------------------------------------------------------------ frames


def test_frames_slices_dtypes_and_boxes(ala, adk_universe):
    u = adk_universe
    ca = u.select_atoms("name CA")
    u.trajectory[7]
    xyz = frames(ca, 2, 20, 3)
    assert u.trajectory.ts.frame == 7  # left where it was
    assert xyz.shape == (6, 214, 3) and xyz.dtype == torch.float64
    for k, _ in enumerate(u.trajectory[2:20:3]):
        assert np.array_equal(xyz[k].numpy(), ca.positions.astype(np.float64))
    u.trajectory[0]
    assert frames(u, stop=2, dtype=torch.float32).dtype == torch.float32
    assert frames(u, -1).shape == (1, u.atoms.n_atoms, 3)
    reorder = ca.indices[::-1]
    assert torch.equal(frames(u, stop=3, indices=reorder), frames(ca, stop=3).flip(1))
    water_u, _ = ala
    xyz, box = frames(water_u, stop=4, return_box=True)
    assert xyz.shape == (4, water_u.atoms.n_atoms, 3) and box.shape == (4, 3, 3)
    for k, ts in enumerate(water_u.trajectory[:4]):
        assert np.allclose(box[k].numpy(), ts.triclinic_dimensions)


# ---------------------------------------------------------------------------- errors


def test_error_messages(ala, adk_universe):
    u, bat = ala
    with pytest.raises(TypeError, match="Universe or AtomGroup, got int"):
        table_from_atomgroup(42)
    with pytest.raises(ValueError, match="empty"):
        table_from_atomgroup(u.select_atoms("name XYZ"))
    with pytest.raises(ValueError, match="more than once"):
        table_from_atomgroup(u.atoms[[0, 1, 2, 1]])
    no_bonds = _universe(data.PDB_small)
    with pytest.raises(ValueError, match="has no bonds"):
        table_from_atomgroup(no_bonds.atoms)
    solute = u.select_atoms("not resname WAT")
    with pytest.raises(ValueError, match="root must be"):
        table_from_atomgroup(solute, root=22)
    with pytest.raises(ValueError, match="is not in the AtomGroup"):
        table_from_atomgroup(solute, root=u.atoms[100])
    with pytest.raises(ValueError, match=r"torsions\[0\] has 3 atoms"):
        table_from_atomgroup(solute, torsions=[solute[:3]])
    with pytest.raises(ValueError, match=r"torsions\[0\] has atoms outside"):
        table_from_atomgroup(solute, torsions=[u.atoms[[0, 1, 2, 100]]])
    with pytest.raises(ValueError, match=r"torsions\[1\] must be"):
        table_from_atomgroup(solute, torsions=[[0, 1, 2, 3], [0, 1, 2]])
    with pytest.raises(TypeError, match="floating torch dtype"):
        frames(u, dtype=torch.int64)
    with pytest.raises(ValueError, match="holds no frame"):
        frames(u, 5, 5)
    with pytest.raises(ValueError, match="universe atom indices"):
        frames(u, indices=[0, u.atoms.n_atoms])
    with pytest.raises(ValueError, match="has no unit cell"):
        frames(adk_universe, stop=1, return_box=True)
    with pytest.raises(TypeError, match="expected an MDAnalysis.analysis.bat.BAT"):
        table_from_bat(solute)
    bt = table_from_bat(bat)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 66\)"):
        from_bat(np.zeros((2, 65)), bt)
    with pytest.raises(TypeError, match="must be a BATTable"):
        from_bat(bat.results.bat, bt.table)
    with pytest.raises(TypeError, match="values must be real"):
        from_bat(torch.zeros(66, dtype=torch.complex128), bt)
    ic, pose = from_bat(bat.results.bat, bt)
    with pytest.raises(ValueError, match=r"bonds must have shape \(\.\.\., 22\)"):
        to_bat((ic.bonds[:, :5], ic.angles, ic.dihedrals), pose, bt)
    with pytest.raises(ValueError, match=r"rotation must have shape \(\.\.\., 3, 3\)"):
        to_bat(ic, (pose.rotation[..., :2], pose.translation), bt)
    with pytest.raises(ValueError, match=r"translation must have shape \(\.\.\., 3\)"):
        to_bat(ic, (pose.rotation, pose.translation[..., :2]), bt)
    with pytest.raises(ValueError, match="do not broadcast"):
        to_bat(ic, (pose.rotation[:3], pose.translation[:3]), bt)
    with pytest.raises(TypeError, match="internal must be"):
        to_bat(ic.bonds, pose, bt)
    broken = BAT(solute)
    broken._torsion_XYZ_inds = broken._torsion_XYZ_inds[:-1]
    with pytest.raises(ValueError, match="exactly once"):
        table_from_bat(broken)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[md\]'"):
        optional_import("batched_nerf_no_such_package", extra="md")


# ------------------------------------------------------------------------------ mdtraj


@pytest.fixture(scope="module")
def md():
    return pytest.importorskip("mdtraj", reason="mdtraj is an optional dependency (batched-nerf[protein])")


def test_mdtraj_frames_in_angstrom(md):
    from batched_nerf.formats.mdtraj import from_mdtraj

    traj = md.load(data.TRJ_NCBOX, top=data.PRM_NCBOX)  # ACE-NME-like solute in TIP3P, 10 frames
    batch = from_mdtraj(traj)
    u = _universe(data.PRM_NCBOX, data.TRJ_NCBOX)
    assert batch.xyz.shape == (10, u.atoms.n_atoms, 3) and batch.xyz.dtype == torch.float64
    assert batch.box.shape == (10, 3, 3)
    for k, ts in enumerate(u.trajectory):  # MDAnalysis reads the same file in Angstrom
        assert np.abs(batch.xyz[k].numpy() - u.atoms.positions).max() < 1e-4
        assert np.abs(batch.box[k].numpy() - ts.triclinic_dimensions).max() < 1e-4
    table = batch.topology.table
    assert table.n_atoms == traj.n_atoms and table.n_components == 1
    ic, pose = bn.to_internal(batch.xyz, table, return_pose=True)
    back = bn.to_cartesian(*ic, table, rotation=pose.rotation, translation=pose.translation)
    assert (back - batch.xyz).abs().max() < 1e-9
    # Angstrom, not nm: the bonds of the table's chemical bonds lie between 0.9 and 1.6
    pairs = np.array([(a.index, b.index) for a, b in traj.topology.bonds])
    refs = table.refs.numpy()
    bonded = {(int(i), int(j)) for i, j in pairs} | {(int(j), int(i)) for i, j in pairs}
    rows = [i for i in range(len(refs)) if (i, int(refs[i, 0])) in bonded]
    assert 0.9 < ic.bonds[:, rows].min() and ic.bonds[:, rows].max() < 1.6
    only = from_mdtraj(traj, dtype=torch.float32, table=False)
    assert only.topology is None and only.xyz.dtype == torch.float32 and only.box.dtype == torch.float32


def test_mdtraj_triclinic_box_and_errors(md):
    from batched_nerf.formats.mdtraj import from_mdtraj

    traj = md.load(data.GRO)  # AdK in a rhombic dodecahedron, one frame
    batch = from_mdtraj(traj, table=False)
    u = _universe(data.GRO)
    assert np.abs(batch.box[0].numpy() - u.trajectory.ts.triclinic_dimensions).max() < 1e-3
    assert batch.box[0, 2, 0] > 1.0  # triclinic: the third vector leans
    assert from_mdtraj(traj[:1].atom_slice(range(3)), table=False).box.shape == (1, 3, 3)
    with pytest.raises(TypeError, match="expected an mdtraj.Trajectory"):
        from_mdtraj(traj.xyz)
    with pytest.raises(TypeError, match="floating torch dtype"):
        from_mdtraj(traj, dtype=torch.int32)
    with pytest.raises(ValueError, match="nothing to convert"):
        from_mdtraj(traj.atom_slice([]), table=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = md.load(data.DCD_TRICLINIC, top=data.PSF_TRICLINIC)  # mdtraj reads NaN cells here
    with pytest.raises(ValueError, match="are not finite"):
        from_mdtraj(bad)


# ------------------------------------------------------------------------- benchmark


def test_md_bat_benchmark_runs_on_a_tiny_selection(monkeypatch):
    """benchmarks/md_bat.py end to end on AdK residues 1-3, 4 frames (no timing assertion); numba's
    thread count as it was after it (it set numba's to torch's, which left later tests of the
    process on one numba thread)."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    from benchmarks.md_bat import report, run

    numba = pytest.importorskip("numba")
    numba_threads, torch_threads = numba.get_num_threads(), torch.get_num_threads()
    numba.set_num_threads(1)  # numba's count apart from torch's (a caller limiting numba alone)
    try:
        result = run("resid 1-3", stop=4, repeats=1, threads=[1, 2])
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(numba_threads)
        torch.set_num_threads(torch_threads)
    assert result["atoms"] == 62 and result["frames"] == 4 and list(result["ours"]) == [1, 2]
    assert result["max_cartesian_deviation_A"] < 1e-5 and result["max_bat_deviation"] < 1e-6
    text = report(result)
    assert "results.bat -> Cartesian" in text and "target >= 300x" in text


def test_frames_takes_a_tables_indices_as_docs_md_shows(ala):
    """``frames(u, indices=agt.indices)`` (docs/md.md's call): a tensor's ``.indices`` is a sparse-tensor
    method, which was taken for the indices; a BATTable's indices likewise (issue 43, item 8)."""
    u, bat = ala
    agt = table_from_atomgroup(u.select_atoms("not resname WAT"))
    bt = table_from_bat(bat)
    for table in (agt, bt):
        ids = table.indices.numpy()
        want = frames(u.atoms[ids], stop=2)
        for given in (table.indices, table, ids, ids.tolist()):
            torch.testing.assert_close(frames(u, stop=2, indices=given), want)
    torch.testing.assert_close(frames(u, stop=2, indices=bt.indices), frames(bat.atoms, stop=2))


@pytest.mark.parametrize(
    ("indices", "error"),
    [
        ([0.5, 1.7], r"indices must hold integers, got dtype float64"),
        (torch.tensor([0.0, 1.0]), r"indices must hold integers, got dtype float32"),
        (np.ones(3, dtype=bool), r"got a boolean mask; select with np\.flatnonzero"),
        (torch.ones(3, dtype=torch.bool), r"got a boolean mask"),
        ([0, 10**9], r"indices must be universe atom indices in \[0, \d+\], got 1000000000"),
        ([-1, 2], r"got -1"),
    ],
    ids=["floats", "float-tensor", "mask", "mask-tensor", "too-large", "negative"],
)
def test_frames_refuses_indices_that_are_not_atom_indices(ala, indices, error):
    """``indices=[0.5, 1.7]`` read atoms 0 and 1 without a word (issue 43, item 5); a mask was reported
    as atoms given more than once (item 8)."""
    u, _ = ala
    with pytest.raises(ValueError, match=error):
        frames(u, stop=1, indices=indices)
