"""The fused plan's row layout, defined once for every backend (numba on the CPU, Triton on CUDA).

`build.fused_plan` writes a ``(N_FIELDS, N)`` integer array, one column per atom in work order
(work units of whole components, each component's rows contiguous and in build order); the CPU
kernels read it as ``int64`` numpy, the Triton kernels as an ``int32`` device copy of the same
array. Field ``f`` of row ``k`` is ``index[f, k]``; reference fields hold *rows* (positions in
this order, ``-1``: none), so both backends keep their scratch (positions, frames, effective
dihedrals) by row and read the inputs and write the outputs by atom (``ATOM``).

Fields:

* ``ATOM``: the atom this row places;
* ``CODE``: how it is placed (the codes below);
* ``REF_B``, ``REF_A``: the rows of its bond and angle references;
* ``REF_D``: the row of its effective dihedral reference (``POSITIONS`` rows only);
* ``PARENT``: the row whose out-frame is its placement frame (``FROM_PARENT`` rows only);
* ``PHI_FROM``: the sibling row whose effective dihedral is added to its own;
* ``FLIP_ON``: the *atom* whose ``sin(angle) < 0`` adds a half turn;
* ``SLOT``: its fixed slot (``FIXED`` rows);
* ``SIGN``: the anchor frame's sign ``s`` (``ANCHOR`` rows; 0 elsewhere);
* ``THIRD``: 1 for a component's third seed (an ``ANCHOR`` row whose dihedral is 0);
* ``POSE``: the seeded component's index in ``topology.seed_root`` (``-1`` in anchored ones).

Codes (``docs/conventions.md``, `batched_nerf.topology.frame_tree`): ``FIXED`` (given
position), ``ROOT`` (origin), ``SECOND`` (``(r, 0, 0)``), ``ANCHOR`` (in the third seed's
anchor frame), ``FROM_PARENT`` (in the parent's out-frame), ``POSITIONS`` (in the NeRF frame
of the reference positions).

The numba kernels compile these values in, and numba's disk cache checks only the kernels' own
source files: a change of a value here needs that cache emptied (the ``*.nbi``/``*.nbc`` files
under ``NUMBA_CACHE_DIR`` or the kernels' ``__pycache__``).
"""

from __future__ import annotations

__all__ = [
    "ANCHOR",
    "ATOM",
    "CODE",
    "FIXED",
    "FLIP_ON",
    "FROM_PARENT",
    "N_FIELDS",
    "PARENT",
    "PHI_FROM",
    "POSE",
    "POSITIONS",
    "REF_A",
    "REF_B",
    "REF_D",
    "ROOT",
    "SECOND",
    "SIGN",
    "SLOT",
    "THIRD",
]

#: Fields (rows of the plan's index array).
ATOM, CODE, REF_B, REF_A, REF_D, PARENT, PHI_FROM, FLIP_ON, SLOT, SIGN, THIRD, POSE = range(12)
N_FIELDS = 12
#: Row codes (``CODE``).
FIXED, ROOT, SECOND, ANCHOR, FROM_PARENT, POSITIONS = range(6)
