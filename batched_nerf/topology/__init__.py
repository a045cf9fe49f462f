"""Ground layer: what a construction table is, in numpy only.

``analysis`` (the `Topology`: components, levels, seeds), ``order`` (build orders,
dihedral adoption), ``frame_tree`` (which rows share a frame), ``perceive`` (bonds
from coordinates), ``link`` and ``auto`` (tables from a bond graph, non-bonded links).
Nothing here imports torch-level code of the package.
"""
