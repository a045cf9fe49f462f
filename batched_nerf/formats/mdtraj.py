"""Adapter for [mdtraj](https://www.mdtraj.org) trajectories (an optional dependency).

mdtraj is imported only when these functions are called (it is part of the
``protein`` extra). mdtraj stores coordinates and unit cells in
**nanometres**; everything returned here is in **Angstrom**, the unit of the
rest of the library's adapters:

```python
import mdtraj as md
import batched_nerf as bn
from batched_nerf.formats.mdtraj import from_mdtraj

# (F, N, 3) and (F, 3, 3) in Angstrom
batch = from_mdtraj(md.load("traj.xtc", top="top.pdb"))
ic = bn.to_internal(batch.xyz, batch.topology.table)     # every frame in one call
```
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..core.files import optional_import

__all__ = ["MDTrajFrames", "from_mdtraj"]

#: Angstrom per nanometre.
NM = 10.0


class MDTrajFrames(NamedTuple):
    """An mdtraj ``Trajectory`` as tensors in Angstrom, with its construction table.

    Attributes:
        xyz: ``(F, N, 3)`` coordinates in Angstrom (``traj.xyz * 10``).
        box: ``(F, 3, 3)`` unit-cell vectors in rows, in Angstrom
            (``traj.unitcell_vectors * 10``), or ``None`` for a trajectory
            without unit cells.
        topology: the [`TopologyTable`][batched_nerf.protein.TopologyTable] of
            ``traj.topology`` (table, atom labels, backbone and side-chain
            torsion rows), or ``None`` with ``table=False``.
    """

    xyz: Tensor
    box: Tensor | None
    topology: Any


def from_mdtraj(
    traj: Any, *, dtype: torch.dtype = torch.float64, table: bool = True, link_fragments: bool = True
) -> MDTrajFrames:
    """Coordinates, unit cells and construction table of an mdtraj ``Trajectory``, in Angstrom.

    The table is [`batched_nerf.protein.table_from_topology`][batched_nerf.protein.table_from_topology] of
    ``traj.topology`` with the first frame's coordinates (near-linear
    references avoided; chains, ligands and waters linked into one build
    unless ``link_fragments=False``); its rows are the trajectory's atoms in
    their order, as are the coordinates.

    Args:
        traj: an ``mdtraj.Trajectory``.
        dtype: a floating torch dtype (mdtraj stores float32; the nm -> Angstrom
            factor is applied in that dtype).
        table: also build the table (``False``: coordinates and boxes only).
        link_fragments: passed to ``table_from_topology``.

    Returns:
        [`MDTrajFrames`][batched_nerf.formats.MDTrajFrames] ``(xyz, box, topology)``.

    Raises:
        ImportError: mdtraj is not installed.
        TypeError: ``traj`` is not an ``mdtraj.Trajectory``, or ``dtype`` not floating.
        ValueError: a trajectory without frames or atoms, or unit cells that are
            not finite (mdtraj gives NaN for some boxes it cannot read).

    Example:
        >>> import pytest, torch, batched_nerf as bn
        >>> md = pytest.importorskip("mdtraj")  # optional: skips this example without mdtraj
        >>> data = pytest.importorskip("MDAnalysisTests.datafiles")
        >>> from batched_nerf.formats.mdtraj import from_mdtraj
        >>> batch = from_mdtraj(md.load(data.TRJ_NCBOX, top=data.PRM_NCBOX))
        >>> tuple(batch.xyz.shape), tuple(batch.box.shape)
        ((10, 1398, 3), (10, 3, 3))
        >>> # Angstrom: O-H bonds near 0.96
        >>> ic = bn.to_internal(batch.xyz, batch.topology.table)
        >>> bool(((ic.bonds > 0.9) & (ic.bonds < 1.0)).any())
        True
    """
    md = optional_import("mdtraj", "mdtraj", extra="protein")
    if not isinstance(traj, md.Trajectory):
        raise TypeError(f"expected an mdtraj.Trajectory, got {type(traj).__name__}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch dtype, got {dtype!r}")
    if traj.n_frames == 0 or traj.n_atoms == 0:
        raise ValueError(
            f"the trajectory has {traj.n_frames} frames of {traj.n_atoms} atoms; nothing to convert"
        )
    xyz = torch.from_numpy(np.ascontiguousarray(traj.xyz)).to(dtype) * NM
    box = None
    cells = traj.unitcell_vectors
    if cells is not None:
        cells = np.asarray(cells)
        if not np.isfinite(cells).all():
            bad = np.flatnonzero(~np.isfinite(cells).reshape(len(cells), -1).all(-1))
            raise ValueError(
                f"the unit cells of frames {bad[:5].tolist()} are not finite (mdtraj could not read them); "
                "remove them (traj.unitcell_vectors = None) or fix the file"
            )
        box = torch.from_numpy(np.ascontiguousarray(cells)).to(dtype) * NM
    topology = None
    if table:
        from ..residues.topology import table_from_topology

        topology = table_from_topology(
            traj.topology, xyz=xyz[0].to(torch.float64).numpy(), link_fragments=link_fragments
        )
    return MDTrajFrames(xyz, box, topology)
