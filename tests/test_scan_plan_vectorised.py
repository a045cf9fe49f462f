"""The vectorised scan planner against the frozen loop planner: identical plans.

``loop_scan_plan`` below is ``engines/scan_plan.py``'s ``scan_plan`` as it was
before it was vectorised (Python loops over rows), kept unchanged as the oracle.
Every field of every plan must be equal: same tensors, dtypes, shapes, tuple
structure, ``Take`` runs and Python values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import batched_nerf as bn
from batched_nerf import data
from batched_nerf.engines.base import as_long
from batched_nerf.engines.scan.path import Take
from batched_nerf.engines.scan.plan import RoundPlan, ScanPlan, scan_plan
from batched_nerf.engines.seeds import seed_atoms, seed_plan
from batched_nerf.testing import construction_tables
from batched_nerf.topology.analysis import FULL, THIRD, Topology
from batched_nerf.topology.frame_tree import ANCHOR, PARENT, frame_tree

BLOCKS = (1, 8, 32)


def assert_same(got: Any, want: Any, where: str = "plan") -> None:
    """Recursive equality of plans: tensors (dtype, shape, values), tuples, dataclasses, values."""
    assert type(got) is type(want), f"{where}: {type(got)} != {type(want)}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{where}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert torch.equal(got, want), f"{where}: values differ"
    elif dataclasses.is_dataclass(want):
        for f in dataclasses.fields(want):
            assert_same(getattr(got, f.name), getattr(want, f.name), f"{where}.{f.name}")
    elif isinstance(want, tuple):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{k}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def check(table: bn.ConstructionTable, blocks: tuple[int, ...] = BLOCKS) -> None:
    for block in blocks:
        assert_same(scan_plan(table.topology, block), loop_scan_plan(table.topology, block), f"plan[{block}]")


# ---------------------------------------------------------------- fixed tables
#: irregular rows in two rounds, siblings of a third seed, a primary row below an irregular one
IRREGULAR = [
    [-1, -1, -1],
    [0, -1, -1],
    [0, 1, -1],
    [0, 1, 2],
    [1, 0, 2],
    [4, 1, 0],
    [5, 4, 3],
    [6, 5, 4],
    [3, 0, 6],
    [8, 3, 0],
    [0, 1, 3],
]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 31, 32, 33, 34, 64, 65, 100, 299, 300])
def test_chains(n: int) -> None:
    check(bn.ConstructionTable.chain(n))


@pytest.mark.parametrize("name", ["alanine_dipeptide", "benzene"])
def test_molecules(name: str) -> None:
    check(data.load(name).table)


def test_irregular_rounds() -> None:
    table = bn.ConstructionTable(IRREGULAR)
    assert len(scan_plan(table.topology).rounds) >= 2
    check(table)


@pytest.mark.parametrize("hydrogens", [False, True])
def test_protein(hydrogens: bool) -> None:
    check(bn.protein.protein_table("ACDEFGHIKLMNPQRSTVWY", hydrogens=hydrogens).table)


def test_packed_tables() -> None:
    parts = [
        bn.protein.protein_table("GAWKC").table,
        bn.ConstructionTable.chain(40),
        data.load("benzene").table,
        bn.ConstructionTable(IRREGULAR),
        bn.ConstructionTable.chain(2),
        bn.ConstructionTable.chain(1),
    ]
    check(bn.pack_tables(parts))


def test_packed_proteins() -> None:
    rng = np.random.default_rng(3)
    seqs = ["".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), 30)) for _ in range(6)]
    check(bn.pack_tables([bn.protein.protein_table(s).table for s in seqs]))


def test_fixed_atoms() -> None:
    refs = [[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2], [3, 0, 1], [4, 3, 0], [3, 0, 4]]
    refs += [[-1, -1, -1], [7, -1, -1], [8, 7, -1], [9, 8, 7], [-1, -1, -1]]
    check(bn.ConstructionTable(refs, fixed=[0, 1, 2, 11]))


def test_empty_and_seed_only_tables() -> None:
    check(bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1]]))
    check(bn.ConstructionTable([[-1, -1, -1], [-1, -1, -1]], fixed=[0, 1]))


@settings(max_examples=60, deadline=None)
@given(construction_tables(max_atoms=40, fixed=None, max_components=4), st.sampled_from(BLOCKS))
def test_random_tables(table: bn.ConstructionTable, block: int) -> None:
    check(table, (block,))


@settings(max_examples=25, deadline=None)
@given(construction_tables(min_atoms=60, max_atoms=200, fixed=None, max_components=3, branched=True))
def test_random_trees(table: bn.ConstructionTable) -> None:
    check(table)


def mixed_table(n: int, seed: int, window: int, p_odd: float, shuffle: bool) -> bn.ConstructionTable:
    """Random tree with primary rows, sibling rows and irregular rows (random angle or
    dihedral references), so that irregular rows read each other over many rounds."""
    rng = np.random.default_rng(seed)
    refs = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]][:n]
    up = [-1, 0, 1]
    kids: dict[int, list[int]] = {}
    for i in range(3, n):
        b = int(rng.integers(max(0, i - window), i))
        a = up[b] if up[b] >= 0 else 1
        d = up[a] if up[a] not in (-1, b, a) else next(k for k in range(i) if k not in (b, a))
        u = rng.random()
        siblings = [k for k in kids.get(b, []) if refs[k][1] == a]
        if u < p_odd:
            d = int(rng.choice([k for k in range(i) if k not in (b, a)]))
        elif u < 2 * p_odd and siblings:
            d = int(rng.choice(siblings))
        elif u < 2.5 * p_odd:
            a = int(rng.choice([k for k in range(i) if k != b]))
            d = int(rng.choice([k for k in range(i) if k not in (b, a)]))
        refs.append([b, a, d])
        up.append(b)
        kids.setdefault(b, []).append(i)
    arr = np.asarray(refs, dtype=np.int64).reshape(-1, 3)
    if shuffle:
        perm = rng.permutation(len(arr))
        new = np.empty_like(arr)
        new[perm] = np.where(arr >= 0, perm[np.clip(arr, 0, None)], -1)
        arr = new
    return bn.ConstructionTable(arr)


MIXED = st.tuples(st.integers(1, 250), st.integers(0, 2**31 - 1), st.integers(1, 12), st.floats(0, 0.4))


@settings(max_examples=40, deadline=None)
@given(MIXED, st.booleans())
def test_many_rounds(args: tuple[int, int, int, float], shuffle: bool) -> None:
    check(mixed_table(*args, shuffle=shuffle))


@settings(max_examples=20, deadline=None)
@given(st.lists(MIXED, min_size=1, max_size=4), construction_tables(max_atoms=20, fixed=True))
def test_many_rounds_packed_with_fixed_atoms(parts: list, anchored: bn.ConstructionTable) -> None:
    tables = [mixed_table(*args, shuffle=True) for args in parts]
    check(bn.pack_tables([tables[0], anchored, *tables[1:]]))


def test_many_rounds_large() -> None:
    table = mixed_table(3000, 7, 6, 0.2, shuffle=True)
    assert len(scan_plan(table.topology).rounds) > 20
    check(table)


# ---------------------------------------------------------------- the frozen oracle
def loop_scan_plan(topo: Topology, block: int = 1) -> ScanPlan:
    """The planner as it was before vectorisation (frozen, Python loops over rows)."""
    refs = topo.refs
    n = len(refs)
    n_refs = topo.kind
    seeds = seed_plan(topo)
    seed_second = np.flatnonzero(n_refs == 1)
    seed_third = np.flatnonzero(n_refs == 2)
    second_atoms = set(seed_second.tolist())
    # the classification is the frame tree's (engines/frame_tree.py, the definition)
    tree = frame_tree(topo)
    full = np.flatnonzero(n_refs == FULL).tolist()
    eff = refs.copy()
    eff[full, 2] = tree.dihedral_ref[full]
    third = set(np.flatnonzero(n_refs == THIRD).tolist())
    # parent in the frame tree: ("atom", b) / ("anchor", T) / None (irregular)
    parent: dict[int, tuple[str, int]] = {}
    for j in np.flatnonzero(tree.frame == PARENT).tolist():
        parent[j] = ("atom", int(tree.parent[j]))
    for j in np.flatnonzero(tree.frame == ANCHOR).tolist():
        parent[j] = ("anchor", int(tree.parent[j]))
    # dihedrals summed into phi_eff (j, then its sibling links) and the atoms whose flip adds pi
    paths = [_chain(tree.phi_from, j, [j]) if n_refs[j] == FULL else [] for j in range(n)]
    flips = [_chain(tree.flip_on, j, []) for j in range(n)]

    # rounds: anchors and seed-fed irregulars are round 0; an irregular atom is
    # one round after the latest scanned atom it reads.
    round_of = np.full(n, -1, dtype=np.int64)
    block0 = set(seed_atoms(topo).tolist())
    children: dict[int, list[int]] = {}
    for j, (kind, p) in parent.items():
        if kind == "atom":
            children.setdefault(p, []).append(j)
    root_of: dict[int, tuple[str, int]] = {}

    def assign(root_key: tuple[str, int], start: list[int], rnd: int) -> None:
        stack = list(start)
        while stack:
            j = stack.pop()
            round_of[j] = rnd
            root_of[j] = root_key
            stack.extend(children.get(j, []))

    for t in sorted(third):
        assign(("anchor", t), [t] + [j for j, pk in parent.items() if pk == ("anchor", t) and j != t], 0)
    # in dependency-level order every reference is assigned before it is read:
    # a scanned reference's root is a frame-tree ancestor, of lower level
    level = topo.level
    for j in sorted((j for j in full if j not in parent), key=lambda j: (level[j], j)):
        # third seeds are in block 0 as positions: readable in round 0
        rnd = max([0] + [int(round_of[r]) + 1 for r in eff[j].tolist() if r not in block0])
        assign(("irregular", j), [j], rnd)
    n_rounds = int(round_of.max()) + 1 if (round_of >= 0).any() else 0
    by_round: list[list[int]] = [[] for _ in range(n_rounds)]
    for j in np.flatnonzero(round_of >= 0).tolist():
        by_round[round_of[j]].append(j)

    # position blocks: 0 = seed block; r + 1 = atoms placed in round r
    block_of = np.full(n, -1, dtype=np.int64)
    slot_of = np.full(n, -1, dtype=np.int64)
    seed_rows = seed_atoms(topo)
    block_of[seed_rows] = 0
    slot_of[seed_rows] = np.arange(seed_rows.size)
    block_sizes = [seed_rows.size]
    rounds: list[RoundPlan] = []
    max_depth = 0
    for rnd in range(n_rounds):
        members = by_round[rnd]
        anchors = sorted(t for t in third if round_of[t] == rnd)
        irr = sorted(j for j in members if root_of[j] == ("irregular", j))
        irr_set = set(irr)
        scanned = [j for j in members if j not in irr_set]
        # depth below the round's roots; bands of `block` depths
        depth = _depths(scanned, parent)
        round_depth = max(depth.values(), default=0)
        max_depth = max(max_depth, round_depth)
        # one path below one root: blocked scan of _scan_path, bands chosen per call
        is_path = len(anchors) + len(irr) == 1 and len(scanned) == round_depth > 0
        k_band = max(1, min(block, round_depth))
        path_order = sorted(scanned, key=lambda j: depth[j]) if is_path else []
        steps_nodes = [
            sorted((j for j in scanned if (depth[j] - 1) % k_band == t), key=lambda j: (depth[j], j))
            for t in range(k_band)
        ]
        order = [j for step in steps_nodes for j in step]
        n_roots = 1 + len(anchors) + len(irr)
        root_key = [("sentinel", -1)] + [("anchor", t) for t in anchors] + [("atom", j) for j in irr]
        boundary = steps_nodes[-1]
        bindex = {key: k for k, key in enumerate(root_key)}
        for k, j in enumerate(boundary):
            bindex[("atom", j)] = n_roots + k
        row_in_step = {j: k for step in steps_nodes for k, j in enumerate(step)}

        step_parent = [as_long([row_in_step[parent[j][1]] for j in step]) for step in steps_nodes[1:]]
        band_parent = np.zeros(n_roots + len(boundary), dtype=np.int64)
        node_root = np.zeros(n_roots + len(order), dtype=np.int64)
        node_root[1:n_roots] = np.arange(n_roots - 1)
        top_of = {j: bindex[_band_top(j, depth, k_band, parent)] for j in order}
        for k, j in enumerate(boundary):
            band_parent[n_roots + k] = top_of[j]
        root_of_b = np.zeros(n_roots + len(boundary), dtype=np.int64)
        root_of_b[:n_roots] = node_root[:n_roots]
        for k in range(n_roots, n_roots + len(boundary)):  # parents come first
            root_of_b[k] = root_of_b[band_parent[k]]
        for k, j in enumerate(order):
            node_root[n_roots + k] = root_of_b[top_of[j]]
        b_depth = -(-round_depth // k_band)  # boundary tree depth: ceil(depth / K)
        steps = int(np.ceil(np.log2(b_depth))) if b_depth > 1 else 0
        if k_band == 1:  # only parents' rotations are needed
            rot_steps = int(np.ceil(np.log2(b_depth - 1))) if b_depth > 2 else 0
        else:  # every band top's rotation is needed by the fix-up
            rot_steps = steps
        jumps = []
        cur = band_parent
        for _ in range(steps):
            jumps.append(as_long(cur))
            cur = cur[cur]
        node_index = {("anchor", t): 1 + k for k, t in enumerate(anchors)}
        for k, j in enumerate(irr):
            node_index[("atom", j)] = 1 + len(anchors) + k
        # a path's block lists its atoms in path order (see _build_path)
        for k, j in enumerate(path_order if is_path else order):
            node_index[("atom", j)] = n_roots + k
        n_nodes = n_roots + len(order)
        # irregular gathers read blocks 0..rnd
        offsets = np.concatenate([[0], np.cumsum(block_sizes)])
        pool_row = offsets[np.maximum(block_of, 0)] + slot_of  # valid for placed atoms
        anchor_origin = [int(pool_row[refs[t, 0]]) for t in anchors]
        anchor_rot = []
        for t in anchors:
            sign = 1.0 if refs[t, 0] in second_atoms else -1.0
            # columns e1 = sign * e_x, e2 = e_y, e3 = e1 x e2 = sign * e_z
            anchor_rot.append([[sign, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, sign]])
        irr_refs = [int(pool_row[r]) for j in irr for r in eff[j][::-1]]
        rounds.append(
            RoundPlan(
                n_anchor=len(anchors),
                anchor_origin=Take.of(anchor_origin),
                anchor_rot=torch.tensor(anchor_rot, dtype=torch.float64).reshape(-1, 3, 3),
                irregular_atoms=as_long(irr),
                irregular_refs=as_long(irr_refs),
                scan_atoms=as_long(order),
                scan_phi_zero=torch.as_tensor(np.array([j in third for j in order], dtype=bool)),
                step_sizes=tuple(len(step) for step in steps_nodes),
                step_parent=tuple(step_parent),
                n_boundary=len(boundary),
                band_parent=as_long(band_parent),
                jumps=tuple(jumps),
                rot_steps=rot_steps,
                scan_band_root=as_long([top_of[j] for j in order]),
                node_root=as_long(node_root),
                pool_blocks=len(block_sizes),
                path=Take.of(path_order) if is_path else None,
            )
        )
        # this round's block: node rows (sentinel and anchors included, never read)
        for j in irr + order:
            if j in third:
                continue  # third seeds keep their closed-form block-0 position
            block_of[j] = rnd + 1
            slot_of[j] = node_index[("atom", j)]
        block_sizes.append(n_nodes)

    offsets = np.concatenate([[0], np.cumsum(block_sizes)])
    inverse = offsets[block_of] + slot_of
    width = max([len(p) for p in paths] + [1])
    phi_paths = np.full((n, width), n, dtype=np.int64)
    for j, p in enumerate(paths):
        phi_paths[j, : len(p)] = p
    # a sibling placed with sin(angle) < 0 sits on the far side of the axis: its
    # frame is turned by pi, so the offset gains pi (third seeds included)
    flip_width = max(len(f) for f in flips) if flips else 0
    flip_paths = None
    if flip_width:
        flip_paths = np.full((n, flip_width), n, dtype=np.int64)
        for j, f in enumerate(flips):
            flip_paths[j, : len(f)] = f
    # seed_block reads a few columns: take them as slices first (an index_select's
    # backward is an index_add, which torch 2.13's CPU inductor miscompiles)
    used = sorted(set(seed_second.tolist()) | set(seed_third.tolist()))
    local = {a: k for k, a in enumerate(used)}
    seeds_local = replace(
        seeds,
        second=as_long([local[a] for a in seed_second.tolist()]),
        third=as_long([local[a] for a in seed_third.tolist()]),
    )
    phi_mask = (
        torch.as_tensor(np.array([p == [j] for j, p in enumerate(paths)], dtype=bool))
        if width == 1 and flip_paths is None and all(p in ([], [j]) for j, p in enumerate(paths))
        else None
    )
    assemble = Take.of(inverse)
    slices_only = (
        phi_mask is not None
        and assemble.runs is not None
        and (not used or Take.of(used).runs is not None)
        and all(
            r.path is not None
            and r.path.runs is not None
            and r.irregular_atoms.numel() == 0
            and (r.n_anchor == 0 or r.anchor_origin.runs is not None)
            for r in rounds
        )
    )
    return ScanPlan(
        gathers=not slices_only,
        seed_inputs=Take.of(used) if used else None,
        seeds_local=seeds_local if used else None,
        phi_mask=phi_mask,
        assemble=assemble,
        seeds=seeds,
        phi_paths=as_long(phi_paths),
        flip_paths=None if flip_paths is None else as_long(flip_paths),
        rounds=tuple(rounds),
        inverse=as_long(inverse),
        depth=max_depth,
    )


def _chain(link: np.ndarray, j: int, start: list[int]) -> list[int]:
    """``start`` followed by ``link[j], link[link[j]], ...`` up to the first ``-1``."""
    out = start
    k = int(link[j])
    while k >= 0:
        out.append(k)
        k = int(link[k])
    return out


def _band_top(
    j: int, depth: dict[int, int], k_band: int, parent: dict[int, tuple[str, int]]
) -> tuple[str, int]:
    """Key of the node above ``j``'s band: ``(depth - 1) % K + 1`` parents up."""
    key: tuple[str, int] = ("atom", j)
    for _ in range((depth[j] - 1) % k_band + 1):
        key = parent[key[1]]
    return key


def _depths(scanned: list[int], parent: dict[int, tuple[str, int]]) -> dict[int, int]:
    """Depth of each scanned atom below its root (children of an anchor or root: 1)."""
    depth: dict[int, int] = {}
    for j in scanned:
        path = []
        node = j
        while node not in depth:
            kind, p = parent.get(node, ("root", node))
            if kind == "root":  # an irregular root
                depth[node] = 0
                break
            path.append(node)
            if kind == "anchor":
                depth[node] = 1
                path.pop()
                break
            node = p
        base = depth[node]
        for k, a in enumerate(reversed(path), start=1):
            depth[a] = base + k
    return depth
