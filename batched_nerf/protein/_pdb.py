"""PDB output of built proteins: one MODEL per structure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

import numpy as np

from ..core.files import PathOrFile, open_text
from ..residues.templates import base_residue
from ._build import Protein
from ._sequence import residue_names


def _atom_line(
    serial: int, name: str, resname: str, chain: str, resseq: int, xyz: np.ndarray, element: str
) -> str:
    # PDB v3.3 ATOM record; names of fewer than 4 characters start in column 14
    label = f" {name:<3}" if len(name) < 4 else name
    x, y, z = xyz
    return (
        f"ATOM  {serial % 100000:5d} {label:4s} {resname:3s} {chain:1s}{resseq % 10000:4d}    "
        f"{x:8.3f}{y:8.3f}{z:8.3f}{1.0:6.2f}{0.0:6.2f}          {element:>2s}  "
    )


def _check_coord(xyz: np.ndarray) -> None:
    if not np.isfinite(xyz).all():
        raise ValueError("coordinates contain NaN or infinity; a PDB file cannot hold them")
    if np.abs(xyz).max(initial=0.0) >= 9999.9995 or xyz.min(initial=0.0) <= -999.9995:
        raise ValueError(
            f"coordinates in [{xyz.min():.1f}, {xyz.max():.1f}] A do not fit the PDB format's "
            "8.3f columns (-999.999 to 9999.999)"
        )


def _conect(protein: Protein, disulfides: Sequence[tuple[int, int]]) -> list[str]:
    """CONECT records of the SG-SG bonds of residue pairs (serials as written, 1-based)."""
    if not disulfides:
        return []
    if isinstance(protein.sequence, tuple):
        raise ValueError("disulfides need a batch of one sequence (build), not a mixed batch (build_batch)")
    where = {
        (int(r), n): k + 1 for k, (r, n) in enumerate(zip(protein.residue_index.tolist(), protein.atom_names))
    }
    lines = []
    for pair in disulfides:
        if len(pair) != 2:
            raise ValueError(f"each disulfide must be a pair of residue indices, got {pair!r}")
        serials = []
        for r in pair:
            if (int(r), "SG") not in where:
                raise ValueError(f"disulfide {tuple(pair)}: residue {r} has no SG atom (a CYS/CYX)")
            serials.append(where[(int(r), "SG")])
        a, b = serials
        lines += [f"CONECT{a:5d}{b:5d}", f"CONECT{b:5d}{a:5d}"]
    return lines


def write_pdb(
    protein: Protein,
    path_or_file: PathOrFile | None = None,
    *,
    chain: str = "A",
    disulfides: Sequence[tuple[int, int]] = (),
) -> str | None:
    """Write a built [`Protein`][batched_nerf.protein.Protein] (or a mixed batch) as PDB, one ``MODEL`` per
    structure.

    Every leading batch index of ``protein.xyz`` becomes one model (row-major);
    for a mixed batch ([`build_batch`][batched_nerf.protein.build_batch]) each sequence of each batch entry is
    one model with its own atoms (readers that need one topology for all
    models, like mdtraj, load batches of one sequence). Residues are numbered
    from 1, atoms serially per model; the chain ends with ``TER``. Protonation
    variants are written under their PDB residue names (``HID``/``HIE``/``HIP``
    as ``HIS``, ``CYX`` as ``CYS``, ``ASH`` as ``ASP``, ``GLH`` as ``GLU``, ``LYN``
    as ``LYS``): their hydrogens tell the state, as OpenMM reads it; caps
    ``ACE``/``NME`` keep their names.

    Args:
        protein: the result of [`build`][batched_nerf.protein.build] or
            [`build_batch`][batched_nerf.protein.build_batch].
        path_or_file: a file name or an open text file; ``None`` returns the text.
        chain: one-character chain identifier.
        disulfides: pairs of residue indices (0-based) whose SG atoms are bonded
            (``CYX``): written as ``CONECT`` records, the only ones the PDB
            format needs here (OpenMM reads them as bonds).

    Returns:
        The PDB text when ``path_or_file`` is ``None``, else ``None``.

    Raises:
        ValueError: a chain id that is not one character, coordinates that are
            not finite or do not fit the PDB columns, or a disulfide residue
            without SG.

    Example:
        >>> import torch, batched_nerf as bn
        >>> p = bn.protein.build("GA", torch.zeros(2, 2), torch.zeros(2, 2))
        >>> text = bn.protein.write_pdb(p)
        >>> text.count("MODEL"), text.splitlines()[1][:26]
        (2, 'ATOM      1  N   GLY A   1')
    """
    if not isinstance(chain, str) or len(chain) != 1:
        raise ValueError(f"chain must be a single character, got {chain!r}")
    xyz = protein.xyz.detach().cpu().double().numpy()
    mixed = isinstance(protein.sequence, tuple)
    if mixed:
        models = xyz.reshape(-1, *xyz.shape[-3:])
        items = [
            (m[k, : len(protein.atom_names[k])], k) for m in models for k in range(len(protein.sequence))
        ]
    else:
        items = [(m, None) for m in xyz.reshape(-1, *xyz.shape[-2:])]
    lines: list[str] = []
    for number, (coords, k) in enumerate(items, start=1):
        _check_coord(coords)
        sequence = protein.sequence[k] if mixed else protein.sequence
        names = protein.atom_names[k] if mixed else protein.atom_names
        elements = protein.elements[k] if mixed else protein.elements
        residues = (protein.residue_index[k] if mixed else protein.residue_index).tolist()
        res_names = tuple(base_residue(r) for r in residue_names(sequence))
        lines.append(f"MODEL     {number:4d}")
        for j, (name, element) in enumerate(zip(names, elements)):
            r = residues[j]
            lines.append(_atom_line(j + 1, name, res_names[r], chain, r + 1, coords[j], element))
        last = len(names)
        lines.append(f"TER   {last + 1:5d}      {res_names[-1]:3s} {chain}{len(res_names):4d}")
        lines.append("ENDMDL")
    lines += _conect(protein, disulfides)
    lines.append("END")
    text = "\n".join(lines) + "\n"
    if path_or_file is None:
        return text
    handle: IO[str]
    with open_text(path_or_file, "w") as handle:
        handle.write(text)
    return None
