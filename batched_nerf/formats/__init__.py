"""Readers and writers for molecular file formats (pure numpy and text).

* :mod:`.xyz`: XYZ coordinate files, single- and multi-frame.
* :mod:`.gaussian`: Gaussian-style Z-matrix text.
* :mod:`.bgflow`: the integer z-matrices of bgflow / bgmol.
"""

from __future__ import annotations

from .bgflow import refs_from_bgflow, refs_to_bgflow, table_from_bgflow, table_to_bgflow
from .gaussian import ZMatrix, read_zmat, write_zmat
from .xyz import read_xyz, write_xyz

__all__ = [
    "ZMatrix",
    "read_xyz",
    "read_zmat",
    "refs_from_bgflow",
    "refs_to_bgflow",
    "table_from_bgflow",
    "table_to_bgflow",
    "write_xyz",
    "write_zmat",
]
