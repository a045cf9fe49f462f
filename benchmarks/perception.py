"""Automatic tables at scale: bond perception and ``ConstructionTable.from_xyz`` on water boxes.

Workloads: 4,000 randomly turned waters on a 3.1 A grid (12,000 atoms, one
linked build), a 100k-atom water box (33,333 waters) and a solvated molecule
(alanine dipeptide in 8,000 waters, the waters within 2.5 A of it removed).
Rows, each the best of ``--repeat`` runs (one run for the 100k box):

* ``cKDTree.query_pairs``: scipy's bond search on the same coordinates
  (radius ``1.3 * 2 * max covalent radius``), the yardstick of the target;
* ``perceive_connectivity``: the bonds only;
* ``tables (refs)``: perception, per-fragment rows and fragment linking, the
  arrays ``ConstructionTable.from_xyz`` wraps (``bn.nonbonded_references`` and
  the checks included);
* ``ConstructionTable.from_xyz``: the whole call, also the table's analysis and
  its engine plans (built when a table is made);

each with scipy's cKDTree (used when scipy is importable) and with the numpy
cell list alone (scipy hidden from the import system, as on a machine without
it); both give identical tables. ``--sequential`` adds the one-by-one linking
(the former algorithm, quadratic in the number of fragments) on the 4,000
waters. Targets: 4,000 waters linked within 10x of ``cKDTree.query_pairs``; a
100k-atom box in at most 5 s.

Run from the repository root::

    PYTHONPATH=$PWD python benchmarks/perception.py            # ~1 min on 2 cores
    PYTHONPATH=$PWD python benchmarks/perception.py --quick    # without the 100k box
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import batched_nerf as bn

WATER = np.array([[0.0, 0.0, 0.0], [0.9572, 0.0, 0.0], [-0.24, 0.9266, 0.0]])


def water_box(n_waters: int, seed: int = 0, spacing: float = 3.1) -> tuple[np.ndarray, list[str]]:
    """``n_waters`` randomly turned waters on a cubic grid (O, H, H each), as ``(3 n, 3)`` coordinates."""
    side = int(np.ceil(n_waters ** (1 / 3)))
    rng = np.random.default_rng(seed)
    grid = (
        np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3)[:n_waters] * spacing
    )
    turns = np.linalg.qr(rng.normal(size=(n_waters, 3, 3)))[0]
    xyz = (np.einsum("wij,aj->wai", turns, WATER) + grid[:, None, :]).reshape(-1, 3)
    return xyz, ["O", "H", "H"] * n_waters


def solvated(n_waters: int) -> tuple[np.ndarray, list[str]]:
    """Alanine dipeptide at the centre of a water box, waters within 2.5 A of it removed."""
    mol = bn.data.load("alanine_dipeptide")
    solute = mol.to_cartesian().numpy().reshape(-1, 3)
    xyz, _ = water_box(n_waters, seed=1)
    waters = xyz.reshape(-1, 3, 3)
    solute = solute - solute.mean(0) + xyz.mean(0)
    gap = np.linalg.norm(waters[:, :, None, :] - solute[None, None], axis=-1).min((1, 2))
    waters = waters[gap > 2.5]
    return np.concatenate([solute, waters.reshape(-1, 3)]), list(mol.elements or []) + ["O", "H", "H"] * len(
        waters
    )


@contextlib.contextmanager
def without_scipy() -> Iterator[None]:
    """Hide scipy.spatial from the import system: the numpy cell list is used, as without scipy."""
    saved = {k: v for k, v in sys.modules.items() if k == "scipy.spatial" or k.startswith("scipy.spatial.")}
    sys.modules["scipy.spatial"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        del sys.modules["scipy.spatial"]
        sys.modules.update(saved)


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def rows_for(name: str, xyz: np.ndarray, elements: list[str], repeat: int) -> list[tuple[str, str, float]]:
    from scipy.spatial import cKDTree

    from batched_nerf.topology.auto import refs_from_xyz  # the arrays ConstructionTable.from_xyz wraps
    from batched_nerf.topology.perceive import COVALENT_RADII

    radius = 1.3 * 2 * max(COVALENT_RADII[e] for e in set(elements))
    out = [(name, "cKDTree.query_pairs", best_of(lambda: cKDTree(xyz).query_pairs(radius), repeat))]
    refs_from_xyz(xyz, elements)  # warm up (imports)
    for backend, ctx in (("scipy", contextlib.nullcontext), ("numpy", without_scipy)):
        with ctx():
            out.append(
                (
                    name,
                    f"perceive_connectivity ({backend})",
                    best_of(lambda: bn.perceive_connectivity(xyz, elements), repeat),
                )
            )
            out.append(
                (name, f"tables (refs) ({backend})", best_of(lambda: refs_from_xyz(xyz, elements), repeat))
            )
            out.append(
                (
                    name,
                    f"ConstructionTable.from_xyz ({backend})",
                    best_of(lambda: bn.ConstructionTable.from_xyz(xyz, elements), repeat),
                )
            )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 100k-atom box")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per row (best taken); the 100k box runs once"
    )
    parser.add_argument("--sequential", action="store_true", help="also link the 4,000 waters one by one")
    args = parser.parse_args(argv)
    rows: list[tuple[str, str, float]] = []
    xyz, elements = water_box(4000)
    rows += rows_for("4,000 waters (12,000 atoms)", xyz, elements, args.repeat)
    if args.sequential:
        import batched_nerf.topology.link as autolink
        from batched_nerf.topology.auto import refs_from_xyz

        autolink._SEQUENTIAL = True
        try:
            rows.append(
                (
                    "4,000 waters (12,000 atoms)",
                    "tables, linked one by one",
                    best_of(lambda: refs_from_xyz(xyz, elements), 1),
                )
            )
        finally:
            autolink._SEQUENTIAL = False
    xyz, elements = solvated(8000)
    rows += rows_for(f"solvated dipeptide ({len(xyz)} atoms)", xyz, elements, args.repeat)
    if not args.quick:
        xyz, elements = water_box(33333)
        rows += rows_for(f"water box ({len(xyz)} atoms)", xyz, elements, 1)
    print("| system | step | time (s) | vs cKDTree.query_pairs |")
    print("|---|---|---:|---:|")
    base = 0.0
    for system, step, seconds in rows:
        if step == "cKDTree.query_pairs":
            base = seconds
        print(f"| {system} | {step} | {seconds:.4f} | {seconds / base:.1f}x |")


if __name__ == "__main__":
    main()
