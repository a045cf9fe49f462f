"""The frame tree: how every engine obtains the frame that places each atom.

This is the package's definition of ``to_cartesian`` (``docs/conventions.md``,
"Degenerate inputs"). Every fully referenced row ``j`` with references
``(b, a, d)`` is placed as

    x_j = x_b + r_j M_j u(theta_j, phi_eff_j),   u = (-cos t, sin t cos p, sin t sin p)

in a placement frame ``M_j`` (a rotation, columns ``e1, e2, e3``), and carries
its *out-frame* ``O_j = M_j L(theta_j, phi_eff_j)`` to the rows below it, with
``L(t, p) = R_x(p) R_z(pi - t)`` (first column ``u``), followed by a half turn
``R_x(pi)`` where ``sin t < 0``. How ``M_j`` is obtained (`FrameTree.frame`):

* ``PARENT``: *primary* rows ``(b, a, d) = (b, bond_ref(b), angle_ref(b))``
  (after following sibling links, below) use ``M_j = O_b``, ``b = parent[j]``;
* ``ANCHOR``: a component's third seed ``T`` and the rows hanging from it
  (``(b, a) = (bond_ref(T), angle_ref(T))`` with effective dihedral reference
  ``T``) use ``T``'s constant *anchor frame*: origin ``x_{bond_ref(T)}``,
  columns ``e1 = s e_x, e2 = e_y, e3 = s e_z`` with ``s = +1`` when ``bond_ref(T)``
  is the second seed atom and ``-1`` when it is the root; ``parent[j] = T``.
  The third seed itself has ``phi_eff = 0`` and ``O_T = anchor L(theta_T, 0)``;
* ``POSITIONS``: every other (*irregular*) fully referenced row: ``M_j`` is the
  NeRF frame of the positions of ``(dihedral_ref[j], refs[j, 1], refs[j, 0])``
  (`_geometry.nerf_frame`);
* ``NONE``: roots, second seeds and fixed atoms (closed form, no frame).

*Sibling* links: a row whose dihedral reference ``d`` is a fully referenced row
with the same bond and angle references ``(b, a)`` shares ``d``'s frame; its
dihedral is measured from ``d``: ``phi_from[j] = d`` and the link is followed
(transitively) to `FrameTree.dihedral_ref`. The effective dihedral is

    phi_eff_j = phi_j + phi_eff[phi_from[j]] + pi [sin(theta[flip_on[j]]) < 0]

(terms with index ``-1`` left out; ``flip_on[j]`` is the sibling ``d``, or the
third seed ``T`` for a row whose link chain ends at ``T``: an atom placed with
``sin(theta) < 0`` sits on the far side of the axis).

For non-degenerate inputs this equals position-based NeRF (every row from the
positions of its own references) exactly; at zero bonds and angles of ``0`` or
``pi`` the frames continue smoothly where positions would collapse. Numpy only,
vectorised (pointer jumping along sibling chains), once per table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .analysis import FULL, THIRD, Topology

__all__ = ["ANCHOR", "NONE", "PARENT", "POSITIONS", "FrameTree", "frame_tree"]

#: How row ``j``'s placement frame ``M_j`` is obtained (:attr:`FrameTree.frame`).
NONE, ANCHOR, PARENT, POSITIONS = 0, 1, 2, 3


@dataclass(frozen=True, eq=False)
class FrameTree:
    """Per-row frame classification of a table (see the module docstring).

    Attributes:
        frame: ``(N,)`` ``int64``: ``NONE`` (roots, second seeds, fixed atoms),
            ``ANCHOR`` (third seeds and rows hanging from a third seed's anchor
            frame), ``PARENT`` (``M_j`` = out-frame of ``parent[j]``),
            ``POSITIONS`` (from the positions of ``(dihedral_ref[j], refs[j, 1], refs[j, 0])``).
        parent: ``(N,)`` ``int64``: for ``PARENT`` the bond reference whose
            out-frame is used; for ``ANCHOR`` the third seed whose anchor is
            used (itself for a third seed); else ``-1``.
        dihedral_ref: ``(N,)`` ``int64`` effective dihedral reference after
            following sibling links (``-1``: none, rows that are not fully referenced).
        phi_from: ``(N,)`` ``int64`` the sibling ``d`` whose effective dihedral is
            added to ``phi_j``, else ``-1``.
        flip_on: ``(N,)`` ``int64`` atom whose ``sin(angle) < 0`` adds ``pi`` to
            ``phi_eff_j``, else ``-1``.
    """

    frame: np.ndarray
    parent: np.ndarray
    dihedral_ref: np.ndarray
    phi_from: np.ndarray
    flip_on: np.ndarray


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    arr.setflags(write=False)
    return arr


def frame_tree(topo: Topology) -> FrameTree:
    """Classify every row of ``topo`` (see `FrameTree`).

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf.topology.frame_tree import frame_tree
        >>> # methyl-like: 4 is primary below 3, 5 and 6 are siblings of 4
        >>> refs = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1], [3, 2, 4], [3, 2, 5]]
        >>> tree = frame_tree(bn.ConstructionTable(refs).topology)
        >>> tree.frame.tolist(), tree.parent.tolist()
        ([0, 0, 1, 2, 2, 2, 2], [-1, -1, 2, 2, 3, 3, 3])
        >>> tree.dihedral_ref.tolist(), tree.phi_from.tolist(), tree.flip_on.tolist()
        ([-1, -1, -1, 0, 1, 1, 1], [-1, -1, -1, -1, -1, 4, 5], [-1, -1, -1, -1, -1, 4, 5])
    """
    refs = np.asarray(topo.refs, dtype=np.int64).reshape(-1, 3)
    kind = np.asarray(topo.kind, dtype=np.int64)
    n = refs.shape[0]
    idx = np.arange(n, dtype=np.int64)
    full = kind == FULL
    third = kind == THIRD
    b, a, d = refs[:, 0], refs[:, 1], refs[:, 2]
    bs, ds = np.maximum(b, 0), np.maximum(d, 0)
    # sibling link: d is fully referenced with the same (bond, angle) references
    sib = full & full[ds] & (refs[ds, 0] == b) & (refs[ds, 1] == a)
    phi_from = np.where(sib, d, -1)
    # pointer jumping to the last sibling of each chain; its dihedral reference is the effective one
    last = np.where(sib, d, idx)
    while True:
        nxt = last[last]
        if np.array_equal(nxt, last):
            break
        last = nxt
    eff = np.where(full, refs[last, 2], -1)
    es = np.maximum(eff, 0)
    has_frame = full[bs] | third[bs]
    primary = full & has_frame & (refs[bs, 0] == a) & (refs[bs, 1] == eff)
    hangs = full & ~primary & third[es] & (refs[es, 0] == b) & (refs[es, 1] == a)
    frame = np.full(n, NONE, dtype=np.int64)
    frame[third] = ANCHOR
    frame[hangs] = ANCHOR
    frame[primary] = PARENT
    frame[full & ~primary & ~hangs] = POSITIONS
    parent = np.full(n, -1, dtype=np.int64)
    parent[third] = idx[third]
    parent[hangs] = eff[hangs]
    parent[primary] = b[primary]
    flip_on = np.where(sib, d, np.where(hangs, eff, -1))
    return FrameTree(
        frame=_readonly(frame),
        parent=_readonly(parent),
        dihedral_ref=_readonly(eff),
        phi_from=_readonly(phi_from),
        flip_on=_readonly(flip_on),
    )
