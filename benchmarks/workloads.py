"""Workloads: topologies, inputs, the float64 reference build and the grid of the suite."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

import batched_nerf as bn


@dataclass
class Workload:
    """One molecule topology at one size, timed at several batch sizes."""

    name: str  # "chain", "tree", "protein", "alanine_dipeptide"
    refs: np.ndarray  # (N, 3)
    batches: list[int]
    label: str = ""

    @property
    def n_atoms(self) -> int:
        return int(self.refs.shape[0])


def chain_refs(n: int) -> np.ndarray:
    """Linear chain: row i = (i-1, i-2, i-3), -1 where negative."""
    idx = np.arange(n)[:, None] - np.arange(1, 4)[None, :]
    return np.where(idx >= 0, idx, -1)


def tree_refs(n: int, seed: int = 0, window: int = 8) -> np.ndarray:
    """Random tree (seeded): atom i >= 3 hangs off an atom drawn uniformly from the
    previous ``window`` atoms (index >= 2); angle and dihedral refs follow the path
    to the root.  Branchy, with dependency depth about ``2 n / window``."""
    rng = np.random.default_rng(seed)
    parent = [-1, 0, 1]
    refs = [[-1, -1, -1], [0, -1, -1], [1, 0, -1]]
    for i in range(3, n):
        p = int(rng.integers(max(2, i - window), i))
        a = parent[p]
        d = parent[a] if a > 0 else (2 if p != 2 else -1)
        if d < 0 or d in (p, a):
            d = 0 if 0 not in (p, a) else 1
        parent.append(p)
        refs.append([p, a, d])
    return np.asarray(refs[:n], dtype=np.int64)


def protein_refs(n_residues: int) -> np.ndarray:
    """Protein-like backbone: N-CA-C per residue, an O on C, and a CB-CG side chain on CA.

    Atom order per residue: N, CA, C, O, CB, CG (6 atoms).
    """
    refs: list[list[int]] = []
    for r in range(n_residues):
        base = 6 * r
        n_, ca, c, o, cb, cg = range(base, base + 6)
        if r == 0:
            refs += [[-1, -1, -1], [n_, -1, -1], [ca, n_, -1]]
        else:
            pn, pca, pc = base - 6, base - 5, base - 4
            refs += [[pc, pca, pn], [n_, pc, pca], [ca, n_, pc]]
        refs += [[c, ca, n_], [ca, n_, c], [cb, ca, n_]]
        del o, cg
    return np.asarray(refs, dtype=np.int64)


def molecule_refs(name: str) -> np.ndarray:
    """The construction table ``(N, 3)`` of a shipped molecule (:func:`batched_nerf.data.load`)."""
    table = bn.data.load(name).table
    return np.asarray(table.refs, dtype=np.int64)


def alanine_refs() -> np.ndarray:
    """The shipped 22-atom alanine dipeptide table (rows not in build order)."""
    return molecule_refs("alanine_dipeptide")


#: Heavy-atom protein of the solvated system (160 residues: every amino acid 8 times).
SOLVATED_SEQUENCE = "ACDEFGHIKLMNPQRSTVWY" * 8
WATER_REFS = np.array([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])


def solvated_refs(n_waters: int = 10_000) -> np.ndarray:
    """A protein (heavy atoms of :data:`SOLVATED_SEQUENCE`) and ``n_waters`` waters, packed.

    ``bn.pack_tables`` of the protein's table and ``n_waters`` three-atom water
    tables (O, H1 on O, H2 on O at an angle to H1): about 31,300 atoms for the
    default, each water its own seeded component.
    """
    protein = bn.protein.protein_table(SOLVATED_SEQUENCE).table
    packed = bn.pack_tables([protein] + [bn.ConstructionTable(WATER_REFS)] * n_waters)
    return np.asarray(packed.refs, dtype=np.int64)


def fused_rows(quick: bool) -> list[Workload]:
    """Rows of the fused comparison (fused engines, the per-atom loop and the numba floor side by side).

    Alanine dipeptide B = 4096, chains 64 x 1024, 512 x 256, 4096 x 1 and the
    solvated system (:func:`solvated_refs`) x 1; quick mode: alanine x 512, chains
    64 x 128 and 1024 x 1, the protein with 500 waters x 1.
    """
    if quick:
        return [
            Workload("alanine_dipeptide", alanine_refs(), [512]),
            Workload("chain", chain_refs(64), [128]),
            Workload("chain", chain_refs(1024), [1]),
            Workload("solvated", solvated_refs(500), [1]),
        ]
    return [
        Workload("alanine_dipeptide", alanine_refs(), [4096]),
        Workload("chain", chain_refs(64), [1024]),
        Workload("chain", chain_refs(512), [256]),
        Workload("chain", chain_refs(4096), [1]),
        Workload("solvated", solvated_refs(), [1]),
    ]


def build_order(refs: np.ndarray) -> np.ndarray:
    """An atom order in which every atom comes after its references."""
    n = len(refs)
    done = np.zeros(n, dtype=bool)
    order: list[int] = []
    while len(order) < n:
        progressed = False
        for i in range(n):
            if not done[i] and all(r < 0 or done[r] for r in refs[i]):
                done[i] = True
                order.append(i)
                progressed = True
        if not progressed:
            raise ValueError("reference cycle")
    return np.asarray(order)


def in_build_order(refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(permuted refs, order): row k of the result is atom order[k], refs renumbered."""
    order = build_order(refs)
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    new = refs[order].copy()
    new[new >= 0] = inv[new[new >= 0]]
    return new, order


def make_inputs(
    n_atoms: int, batch: int = 1, dtype: torch.dtype = torch.float32, seed: int = 0, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random, chemically sane ``(bonds, angles, dihedrals)``, each ``(batch, n_atoms)``.

    Bonds in [1.3, 1.6] (Angstrom-like), bond angles in [95, 125] degrees,
    dihedrals uniform in [-pi, pi); angles in radians.  Drawn in float64 and
    then cast, so a float32 draw is the rounded float64 draw; ours and the
    peers (:mod:`benchmarks.peers`) use this one recipe.
    """
    g = torch.Generator().manual_seed(seed)
    shape = (batch, n_atoms)
    f64 = torch.float64
    bonds = 1.3 + 0.3 * torch.rand(shape, generator=g, dtype=f64)
    angles = torch.deg2rad(95.0 + 30.0 * torch.rand(shape, generator=g, dtype=f64))
    dihedrals = math.pi * (2.0 * torch.rand(shape, generator=g, dtype=f64) - 1.0)
    return tuple(t.to(dtype=dtype, device=device) for t in (bonds, angles, dihedrals))  # type: ignore[return-value]


def reference_xyz(
    bonds: np.ndarray, angles: np.ndarray, dihedrals: np.ndarray, refs: np.ndarray
) -> np.ndarray:
    """float64 per-atom NeRF in plain Python floats (independent of our engines).

    One molecule: ``bonds``/``angles``/``dihedrals`` ``(N,)``, ``refs`` ``(N, 3)``
    in any order; same frame conventions as :func:`batched_nerf.to_cartesian`.
    """
    n = len(refs)
    pos: list[tuple[float, float, float] | None] = [None] * n
    b_, a_, d_ = (np.asarray(x, dtype=np.float64).tolist() for x in (bonds, angles, dihedrals))

    def sub(p, q):
        return (p[0] - q[0], p[1] - q[1], p[2] - q[2])

    def cross(p, q):
        return (p[1] * q[2] - p[2] * q[1], p[2] * q[0] - p[0] * q[2], p[0] * q[1] - p[1] * q[0])

    def unit(p):
        s = math.sqrt(p[0] * p[0] + p[1] * p[1] + p[2] * p[2])
        return (p[0] / s, p[1] / s, p[2] / s)

    for i in build_order(refs).tolist():
        ib, ia, id_ = (int(r) for r in refs[i])
        r = b_[i]
        if ib < 0:
            pos[i] = (0.0, 0.0, 0.0)
            continue
        c = pos[ib]
        if ia < 0:
            pos[i] = (c[0] + r, c[1], c[2])
            continue
        b = pos[ia]
        if id_ < 0:
            a = (b[0], b[1] + 1.0, b[2])
            cd, sd = 1.0, 0.0
        else:
            a = pos[id_]
            cd, sd = math.cos(d_[i]), math.sin(d_[i])
        bc = unit(sub(c, b))
        nv = unit(cross(sub(b, a), bc))
        m = cross(nv, bc)
        ca, sa = math.cos(a_[i]), math.sin(a_[i])
        rs = r * sa
        pos[i] = tuple(c[k] - r * ca * bc[k] + rs * cd * m[k] + rs * sd * nv[k] for k in range(3))  # type: ignore[assignment]
    return np.asarray(pos, dtype=np.float64)


# --------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------


def default_grid(quick: bool) -> list[Workload]:
    """The workloads of one run, chains and branched molecules together.

    Quick: chains N = 64, 512, 4096, a random tree and a protein-like backbone
    (512 atoms) at B = 1, 64, and alanine dipeptide at B = 64, 4096.  Full: the
    target rows first (alanine dipeptide up to B = 4096, chains 64/512/4096 up
    to B = 1024), then the branched molecules, the 32768-atom chain last (the
    first rows to meet the time budget).
    """
    if quick:
        loads = [Workload("chain", chain_refs(n), [1, 64]) for n in (64, 512, 4096)]
        loads += [
            Workload("tree", tree_refs(512), [1, 64]),
            Workload("protein", protein_refs(512 // 6), [1, 64]),
            Workload("alanine_dipeptide", alanine_refs(), [64, 4096]),
        ]
        return loads
    loads = [Workload("alanine_dipeptide", alanine_refs(), [1, 64, 1024, 4096])]
    for n in (64, 512, 4096):
        batches = [1, 64, 256, 1024]
        loads.append(Workload("chain", chain_refs(n), batches))
    loads += [Workload("tree", tree_refs(n), [1, 64]) for n in (512, 4096)]
    loads += [Workload("protein", protein_refs(n // 6), [1, 64]) for n in (512, 4096)]
    loads.append(Workload("chain", chain_refs(32768), [1, 64, 1024]))
    return loads


def compile_rows(quick: bool) -> set[tuple[str, int, int]]:
    """``(workload, N, B)`` rows timed under ``torch.compile`` (each compile costs tens of seconds)."""
    if quick:
        return {("chain", 64, 1), ("chain", 512, 1)}
    return {
        ("chain", 64, 1),
        ("chain", 64, 64),
        ("chain", 64, 256),
        ("chain", 64, 1024),
        ("chain", 512, 1),
        ("chain", 512, 64),
        ("chain", 4096, 1),
        ("chain", 512, 256),
        ("chain", 4096, 64),
        ("chain", 4096, 256),
        ("chain", 512, 1024),
        ("chain", 32768, 64),
        ("alanine_dipeptide", 22, 4096),
    }
