"""Torsion-space updates against DiffDock's and torsional diffusion's own loops.

Rows (float32 unless said, CPU, 1 torch thread; times are medians over interleaved
rounds in one process, every implementation once per round in turn; ratio = the
peer's time / ours):

* **one conformer** of DiffDock's shipped ``1a0q`` ligand (RDKit from its
  ``data/1a0q/1a0q_ligand.sdf``, hydrogens removed as DiffDock does): DiffDock's
  ``utils/torsion.py::modify_conformer_torsion_angles`` (a numpy loop over bonds with a
  scipy rotation each) against ``bn.update_torsions``;
* **10 copies x 20 steps** of it (DiffDock's default sampling: 10 samples, 20 steps):
  DiffDock calls the numpy loop per sample and step; ours one call per step, ``(10, N, 3)``;
* **ragged batch of 64 drug-like molecules** (RDKit ETKDG conformers with hydrogens of
  SMILES below, repeated to 64), torsional diffusion's ``utils/torsion.py::perturb_batch``
  on the PyG batch (a loop over molecules, then bonds) against
  ``bn.update_torsions(pos, bn.rotor_tables(batch), tau, batch=batch.batch)``, forward;
  ours also forward+backward (the peers' numpy loops have no backward);
* **analysis** of a new molecule: ``RotorTable`` of a 50-atom molecule (uncached), and
  composing the packed table of 64 already-analysed molecules, against one update call.

Peers from checkouts (``--diffdock PATH`` / ``DIFFDOCK_PATH``, ``--torsional-diffusion
PATH`` / ``TORSIONAL_DIFFUSION_PATH``) with ``torch_geometric``, ``networkx``, ``scipy``
and RDKit installed. A missing peer prints ``-``.

``python benchmarks/torsion_space.py --diffdock PATH --torsional-diffusion PATH``
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

import batched_nerf as bn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.protein import fmt, interleaved

#: drug-like molecules (aspirin, ibuprofen, paracetamol, nicotine, a PEG amine, imatinib, ...)
SMILES = [
    "CC(=O)Oc1ccccc1C(=O)O",
    "CC(C)Cc1ccc(cc1)C(C)C(=O)O",
    "CC(=O)Nc1ccc(O)cc1",
    "CN1CCC[C@H]1c1cccnc1",
    "OCCOCCN(CC)CC",
    "Cc1ccc(NC(=O)c2ccc(CN3CCN(C)CC3)cc2)cc1Nc1nccc(-c2cccnc2)n1",
    "CCOC(=O)C1=C(C)NC(C)=C(C1c1ccccc1[N+](=O)[O-])C(=O)OC",
    "COc1ccc2[nH]cc(CCNC(C)=O)c2c1",
]


def peer_module(root: str | None, module: str) -> object | None:
    """``module`` (e.g. ``utils.torsion``) of a checkout, its own ``utils`` package first on the path."""
    if not root or not (Path(root) / (module.replace(".", "/") + ".py")).is_file():
        return None
    for name in [m for m in sys.modules if m == "utils" or m.startswith("utils.")]:
        del sys.modules[name]  # both peers name their package "utils"
    sys.path.insert(0, root)
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(root)


def rdkit_molecule(smiles: str, seed: int, hydrogens: bool = True):
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
    AllChem.EmbedMolecule(mol, randomSeed=seed)
    return mol if hydrogens else Chem.RemoveHs(mol)


def pyg_data(mol, td_torsion) -> object:
    """A PyG ``Data`` with each bond twice and torsional diffusion's masks (its own function)."""
    from torch_geometric.data import Data

    pairs = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()]
    edge_index = torch.tensor([e for a, b in pairs for e in ((a, b), (b, a))]).T
    pos = torch.tensor(mol.GetConformer().GetPositions(), dtype=torch.float32)
    data = Data(edge_index=edge_index, pos=pos, num_nodes=mol.GetNumAtoms())
    edge_mask, mask_rotate = td_torsion.get_transformation_mask(data)
    data.edge_mask, data.mask_rotate = torch.tensor(edge_mask), mask_rotate
    return data


def ratio_row(name: str, peer: float | None, ours: float) -> None:
    ratio = f"{peer / ours:.3g}x" if peer else "-"
    print(f"| {name} | {fmt(peer)} | {fmt(ours)} | {ratio} |")


def bench_diffdock(root: str | None, budget: float) -> None:
    dd = peer_module(root, "utils.torsion")
    sdf = Path(root or "") / "data" / "1a0q" / "1a0q_ligand.sdf"
    if dd is None or not sdf.is_file():
        print("| 1a0q (DiffDock checkout not given) | - | - | - |")
        return
    from rdkit import Chem

    mol = Chem.RemoveHs(Chem.MolFromMolFile(str(sdf), sanitize=True))
    rotors = bn.rotor_tables(mol)[0]
    n, r = mol.GetNumAtoms(), rotors.n_bonds
    pos = torch.tensor(mol.GetConformer().GetPositions(), dtype=torch.float32)
    edges, masks = rotors.bonds.numpy(), rotors.moving.numpy()
    gen = torch.Generator().manual_seed(0)
    taus = (torch.rand(20, 10, r, generator=gen) * 2 - 1) * 3.14159
    print(f"\n1a0q ligand: {n} heavy atoms, {r} rotatable bonds")
    one = taus[0, 0]
    got = bn.update_torsions(pos.double(), rotors, one.double())
    ref = dd.modify_conformer_torsion_angles(
        pos.double().numpy(), torch.from_numpy(edges), masks, one.double().numpy(), as_numpy=True
    )
    print(f"max |x_DiffDock - x_ours| (float64): {np.abs(got.numpy() - ref).max():.1e} A")
    t = interleaved(
        {
            "peer": lambda: dd.modify_conformer_torsion_angles(
                pos, torch.from_numpy(edges), masks, one.numpy()
            ),
            "ours": lambda: bn.update_torsions(pos, rotors, one),
        },
        rounds=2000,
        budget=budget,
    )
    print("\n| workload | DiffDock | batched_nerf | ratio |\n|---|---|---|---|")
    ratio_row("one conformer, forward", t["peer"], t["ours"])
    copies = pos.expand(10, n, 3)

    def peer_steps() -> None:
        x = [pos.numpy()] * 10
        for s in range(20):
            x = [
                dd.modify_conformer_torsion_angles(
                    x[c], torch.from_numpy(edges), masks, taus[s, c].numpy(), as_numpy=True
                )
                for c in range(10)
            ]

    def our_steps() -> None:
        x = copies
        for s in range(20):
            x = bn.update_torsions(x, rotors, taus[s])

    t = interleaved({"peer": peer_steps, "ours": our_steps}, rounds=200, budget=budget)
    ratio_row("10 copies x 20 steps, forward", t["peer"], t["ours"])


def bench_torsional_diffusion(root: str | None, budget: float) -> None:
    td = peer_module(root, "utils.torsion")
    try:
        from torch_geometric.data import Batch
    except ImportError:
        td = None
    if td is None:
        print("\n| 64 molecules (torsional diffusion checkout or torch_geometric missing) | - | - | - |")
        return
    datas = [
        pyg_data(rdkit_molecule(SMILES[k % len(SMILES)], seed=k), td) for k in range(64)
    ]  # 8 x 8 conformers
    data = Batch.from_data_list(datas)
    data.mask_rotate = [d.mask_rotate for d in datas]
    rotors = bn.rotor_tables(data)
    total = sum(r.n_bonds for r in rotors)
    assert total == int(data.edge_mask.sum()), "the same rotatable bonds as the peer"
    tau = (torch.rand(total, generator=torch.Generator().manual_seed(1)) * 2 - 1) * 3.14159
    print(f"\n64 molecules: {data.num_nodes} atoms, {total} rotatable bonds")
    # the peer's bonds are its edge order; ours per molecule in sorted pair order: map the updates
    ours_order = []
    offset_atoms, offset_bonds = 0, 0
    peer_edges = data.edge_index.T[data.edge_mask].tolist()
    for r in rotors:
        for u, v in (r.bonds + offset_atoms).tolist():
            ours_order.append(peer_edges.index([u, v]) if [u, v] in peer_edges else peer_edges.index([v, u]))
        offset_atoms += r.n_atoms
        offset_bonds += r.n_bonds
    tau_ours = tau[torch.tensor(ours_order)]
    pos = data.pos.clone()
    x64 = bn.update_torsions(pos.double(), rotors, tau_ours.double(), batch=data.batch)
    peer = copy.copy(data)
    peer.pos = pos.clone()  # the peer turns the atoms of data.pos in place as well (numpy views)
    ref = td.perturb_batch(peer, tau.numpy())  # float32 inside the peer
    d = lambda x: torch.cdist(x.double(), x.double())  # noqa: E731
    print(f"max |pairwise distance difference| (peer in float32): {(d(x64) - d(ref)).abs().max():.1e} A")
    weight = torch.randn(pos.shape, generator=torch.Generator().manual_seed(2))
    tau_grad = tau_ours.clone().requires_grad_(True)

    def our_backward() -> None:
        (bn.update_torsions(pos, rotors, tau_grad, batch=data.batch) * weight).sum().backward()

    t = interleaved(
        {
            "peer": lambda: td.perturb_batch(peer, tau.numpy()),
            "ours": lambda: bn.update_torsions(pos, rotors, tau_ours, batch=data.batch),
            "ours_tables": lambda: bn.update_torsions(pos, bn.rotor_tables(data), tau_ours, batch=data.batch),
            "ours_bwd": our_backward,
        },
        rounds=500,
        budget=budget,
    )
    print("\n| workload | torsional diffusion | batched_nerf | ratio |\n|---|---|---|---|")
    ratio_row("64 molecules, forward (rotor tables made ahead, as the peer's masks)", t["peer"], t["ours"])
    ratio_row("64 molecules, forward, bn.rotor_tables(batch) inside every call", t["peer"], t["ours_tables"])
    ratio_row("64 molecules, forward+backward (ours only)", None, t["ours_bwd"])
    analysis(rotors, pos, tau_ours, data.batch)


def analysis(rotors, pos, tau, batch) -> None:
    """A new 50-atom molecule's analysis, and composing 64 analysed ones, against one update."""
    mol = rdkit_molecule("CC(C)Cc1ccc(cc1)C(C)C(=O)NCCOCCO", seed=3)
    pairs = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()]
    n = mol.GetNumAtoms()
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        bn.RotorTable(pairs, n)
        times.append(time.perf_counter() - t0)
    compose = []
    from batched_nerf.torsion_space import packed as _torsion_space

    for _ in range(20):
        _torsion_space._PACKED_CACHE.clear()
        t0 = time.perf_counter()
        bn.update_torsions(pos, rotors, tau, batch=batch)
        compose.append(time.perf_counter() - t0)
    warm = interleaved(
        {"u": lambda: bn.update_torsions(pos, rotors, tau, batch=batch)}, rounds=200, budget=3
    )["u"]
    print(f"\nanalysis of a new {n}-atom molecule (RotorTable, uncached): {fmt(float(np.median(times)))}")
    composed = float(np.median(compose))
    print(
        f"64 analysed molecules composed (packed batch made anew) + one update: {fmt(composed)} = "
        f"{composed / warm:.2f}x one update call with the packed table cached ({fmt(warm)})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diffdock", default=os.environ.get("DIFFDOCK_PATH"))
    parser.add_argument("--torsional-diffusion", default=os.environ.get("TORSIONAL_DIFFUSION_PATH"))
    parser.add_argument("--budget", type=float, default=5.0, help="seconds per row")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bench_diffdock(args.diffdock, args.budget)
    bench_torsional_diffusion(args.torsional_diffusion, args.budget)


if __name__ == "__main__":
    main()
