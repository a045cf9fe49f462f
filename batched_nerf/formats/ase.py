"""Adapter for [ASE](https://wiki.fysik.dtu.dk/ase/) ``Atoms`` (an optional dependency).

ASE is imported only when these functions are called. Coordinates are in
Angstrom on both sides; nothing is converted. ASE reads and writes dozens of
file formats (``ase.io.read``/``ase.io.write``), so these two functions open
all of them to batched_nerf:

```python
import ase.io
import batched_nerf as bn
from batched_nerf.formats import from_ase, to_ase

elements, xyz = from_ase(ase.io.read("molecule.pdb"))
table = bn.ConstructionTable.from_xyz(xyz, elements)
...
ase.io.write("conformers.extxyz", to_ase(elements, new_xyz))  # (F, N, 3) -> list of Atoms
```
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.files import as_numpy, optional_import

__all__ = ["from_ase", "to_ase"]


def _import_ase() -> Any:
    return optional_import("ase", "ase")


def from_ase(atoms: Any) -> tuple[list[str], np.ndarray]:
    """Element symbols and coordinates of an ``ase.Atoms`` (or a list of them).

    Args:
        atoms: an ``ase.Atoms``, or a sequence of ``Atoms`` with the same
            elements (a trajectory, e.g. from ``ase.io.read(path, index=":")``).

    Returns:
        ``(elements, xyz)``: ``N`` element symbols and ``(N, 3)`` (one ``Atoms``)
        or ``(F, N, 3)`` (a sequence) ``float64`` coordinates in Angstrom.

    Raises:
        ImportError: ASE is not installed.
        TypeError: ``atoms`` is not an ``Atoms`` or a sequence of them.
        ValueError: an empty sequence, or frames with different elements.
    """
    ase = _import_ase()
    if isinstance(atoms, ase.Atoms):
        return list(atoms.get_chemical_symbols()), np.array(atoms.get_positions(), dtype=np.float64)
    frames = list(atoms) if isinstance(atoms, Sequence) else None
    if not frames or not all(isinstance(a, ase.Atoms) for a in frames):
        raise TypeError(f"expected an ase.Atoms or a non-empty sequence of them, got {type(atoms).__name__}")
    elements = list(frames[0].get_chemical_symbols())
    for k, a in enumerate(frames[1:], start=1):
        if list(a.get_chemical_symbols()) != elements:
            raise ValueError(f"frame {k} has different elements than frame 0")
    return elements, np.stack([np.asarray(a.get_positions(), dtype=np.float64) for a in frames])


def to_ase(elements: Sequence[str], xyz: Any) -> Any:
    """``ase.Atoms`` from element symbols and coordinates.

    Args:
        elements: ``N`` element symbols.
        xyz: ``(N, 3)`` coordinates, or ``(F, N, 3)`` for several conformations
            (numpy, lists, or torch tensors, which are detached and moved to
            the CPU).

    Returns:
        One ``ase.Atoms`` for ``(N, 3)``, a list of ``F`` of them for ``(F, N, 3)``.

    Raises:
        ImportError: ASE is not installed.
        ValueError: a wrong shape or an element count that does not match.
    """
    ase = _import_ase()
    coords = as_numpy(xyz)
    symbols = [str(e) for e in elements]
    if coords.ndim not in (2, 3) or coords.shape[-1] != 3 or coords.shape[-2] != len(symbols):
        raise ValueError(
            f"xyz must have shape (N, 3) or (F, N, 3) with N = {len(symbols)} elements, got {coords.shape}"
        )
    if coords.ndim == 2:
        return ase.Atoms(symbols=symbols, positions=coords)
    return [ase.Atoms(symbols=symbols, positions=frame) for frame in coords]
