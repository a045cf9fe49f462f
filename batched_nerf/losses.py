r"""Differentiable loss terms for learning with molecular coordinates.

* [`committor_loss`][batched_nerf.losses.committor_loss]: the variational (Kolmogorov) committor loss with
  boundary terms, for training a committor network ``q(x)``.
* [`clash_loss`][batched_nerf.losses.clash_loss]: a smooth flat-bottom penalty on non-bonded atom pairs
  that come closer than a minimum distance, with bond-graph exclusions
  derived from the chemical bonds (``connectivity``, or those of a
  [`ZMatrix`][batched_nerf.ZMatrix]) and a [`ConstructionTable`][batched_nerf.ConstructionTable].

Both are plain tensor code, differentiable twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

import numpy as np
import torch
from torch import Tensor

from ._geometry import safe_norm
from .core.box import cell, nearest_image
from .core.checks import as_box, as_float, check_device, check_tensor, check_xyz, to_tensor
from .core.table import ConstructionTable
from .core.zmatrix import ZMatrix, _as_connectivity
from .topology.analysis import Topology

__all__ = ["clash_loss", "clash_pairs", "committor_loss"]

Reduction = Literal["mean", "sum", "none"]


# ----------------------------------------------------------------- committor
def _as_mask(value: Any, name: str, n: int, like: Tensor) -> Tensor | None:
    if value is None:
        return None
    t = to_tensor(value, name, device=like.device)
    if t.shape != (n,):
        raise ValueError(f"{name} must have shape (B,) = ({n},) like q, got {tuple(t.shape)}")
    return t.to(like.dtype)


def committor_loss(
    q: Tensor,
    x: Tensor,
    *,
    masses: Tensor | None = None,
    weights: Tensor | None = None,
    in_a: Tensor | None = None,
    in_b: Tensor | None = None,
    boundary_weight: float = 1.0,
) -> Tensor:
    r"""Variational committor loss: Kolmogorov functional plus boundary terms.

    For samples ``x_k`` (``k = 1..B``) with weights ``w_k`` and committor values
    ``q_k = q(x_k)``:

    ```text
    L = sum_k w_k [ sum_i |grad_{x_i} q(x_k)|^2 / m_i ] / sum_k w_k
      + boundary_weight * sum_k w_k [ a_k q_k^2 + b_k (1 - q_k)^2 ] / sum_k w_k
    ```

    The first term is the Kolmogorov (Dirichlet-form) functional
    ``E[|grad q|^2_{M^-1}]`` whose minimiser with ``q = 0`` on state ``A`` and
    ``q = 1`` on state ``B`` is the committor; the second softly imposes
    those boundary conditions on samples flagged by ``in_a`` / ``in_b``. Both
    are normalised by the total weight (not by the number of samples in each
    state), so the loss of a batch without boundary samples is well defined.
    Use ``weights = exp(beta V_bias)`` to reweight biased samples.

    The gradient ``grad_x q`` is taken with ``torch.autograd.grad(create_graph=True)``
    of ``q.sum()``, which assumes sample ``k``'s value depends only on
    ``x_k`` (no batch normalisation across samples). The returned loss is
    differentiable with respect to the network parameters (double backward).

    Args:
        q: ``(B,)`` or ``(B, 1)`` committor values, computed from ``x`` with
            autograd recording (typically ``sigmoid`` of a network output).
        x: ``(B, N, 3)`` (or ``(B, D)``) coordinates with ``requires_grad``
            and ``q`` computed from it. Units ``L``: the loss is in ``1/L^2``
            (over mass units).
        masses: ``(N,)`` atomic masses (``(D,)`` for flat ``x``); ``None`` for all 1.
        weights: ``(B,)`` non-negative sample weights; ``None`` for uniform.
        in_a: ``(B,)`` bool or ``{0, 1}`` mask (or soft membership) of state ``A``.
        in_b: ``(B,)`` same for state ``B``.
        boundary_weight: factor of the boundary term.

    Returns:
        Scalar loss tensor; ``0`` (with zero gradients) for an empty batch
        ``B = 0``.

    Raises:
        TypeError: ``q`` or ``x`` is not a tensor (naming its type).
        ValueError: ``q`` is not ``(B,)`` / ``(B, 1)``, ``x`` has a different
            leading size, ``masses``/``weights``/``in_a``/``in_b`` are misshapen,
            ``x`` does not require grad, or ``q`` does not depend on ``x`` (no
            autograd path from ``x`` to ``q``: computed from a detached copy,
            under ``no_grad``, or a constant).

    Example:
        >>> import torch
        >>> from batched_nerf.losses import committor_loss
        >>> x = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]], requires_grad=True)
        >>> q = 0.5 * x[:, 1, 0]                        # grad_x q = 0.5 on one coordinate
        >>> committor_loss(q, x, masses=torch.tensor([1.0, 2.0]), in_b=torch.tensor([True]))
        tensor(0.3750, grad_fn=<AddBackward0>)
    """
    check_tensor(q, "q")
    check_tensor(x, "x")
    if q.ndim == 2 and q.shape[1] == 1:
        q = q[:, 0]
    if q.ndim != 1:
        raise ValueError(f"q must have shape (B,) or (B, 1), got {tuple(q.shape)}")
    n = q.shape[0]
    if x.ndim < 2 or x.shape[0] != n:
        raise ValueError(f"x must have shape (B, ...) with B = {n} like q, got {tuple(x.shape)}")
    if not x.requires_grad:
        raise ValueError("x must require grad and q must be computed from it")
    w = _as_mask(weights, "weights", n, q)
    a = _as_mask(in_a, "in_a", n, q)
    b = _as_mask(in_b, "in_b", n, q)
    if n == 0:  # an empty batch (e.g. one rank's share): nothing to average, zero loss and gradient
        return q.sum() * 0.0
    g = None
    if q.requires_grad:
        (g,) = torch.autograd.grad(q.sum(), x, create_graph=True, allow_unused=True)
    if g is None:
        raise ValueError(
            "q does not depend on x (no autograd path from x to q): compute q from x itself, "
            "not from a detached copy or under torch.no_grad()"
        )
    sq = g * g
    if masses is not None:
        m = to_tensor(masses, "masses", dtype=x.dtype, device=x.device)
        per_atom = x.shape[1:-1] if x.ndim > 2 else x.shape[1:]
        if tuple(m.shape) != tuple(per_atom):
            raise ValueError(
                f"masses must have shape {tuple(per_atom)} for x of shape {tuple(x.shape)}, "
                f"got {tuple(m.shape)}"
            )
        sq = sq / (m.unsqueeze(-1) if x.ndim > 2 else m)
    kin = sq.reshape(n, -1).sum(-1)
    w = torch.ones_like(q) if w is None else w
    total = w.sum()
    loss = (w * kin).sum() / total
    if a is not None or b is not None:
        bnd = q.new_zeros(n)
        if a is not None:
            bnd = bnd + a * q * q
        if b is not None:
            bnd = bnd + b * (1.0 - q) ** 2
        loss = loss + boundary_weight * (w * bnd).sum() / total
    return loss


# --------------------------------------------------------------------- clash
@dataclass(frozen=True)
class _Exclusions:
    """Excluded pairs ``i < j`` of a table, sorted by ``i`` (numpy, CPU)."""

    i: np.ndarray
    j: np.ndarray
    n_pairs: int  # number of included pairs


@dataclass(frozen=True)
class _Graph:
    """What the exclusions are derived from: the table, its bond graph and the unscored rows."""

    table: ConstructionTable
    connectivity: np.ndarray  # (E, 2) sorted unique pairs i < j
    dummies: np.ndarray  # (D,) rows that are never scored (dummy atoms of a ZMatrix)

    def key(self, depth: int) -> tuple[Any, ...]:
        return (_exclusions, depth, self.connectivity.tobytes(), self.dummies.tobytes())


_NO_ROWS = np.zeros(0, dtype=np.int64)


def _graph(table: Any, connectivity: Any) -> _Graph:
    """Table and bond graph of a ``table`` argument (ConstructionTable, ZMatrix or protein table)."""
    if not isinstance(table, (ZMatrix, ConstructionTable)) and isinstance(
        getattr(table, "table", None), ConstructionTable
    ):  # a container with its own bond graph, e.g. bn.protein.ProteinTable
        if connectivity is None:
            connectivity = getattr(table, "connectivity", None)
        table = table.table
    if isinstance(table, ZMatrix):
        tab, dummies = table.table, np.flatnonzero(~table.real.numpy())
        if connectivity is None:
            connectivity = table.connectivity
    elif isinstance(table, ConstructionTable):
        tab, dummies = table, _NO_ROWS
    else:
        raise TypeError(f"table must be a ConstructionTable or a ZMatrix, got {type(table).__name__}")
    n = tab.n_atoms
    if connectivity is None:
        pairs = np.zeros((0, 2), dtype=np.int64)
    elif isinstance(table, ZMatrix) and connectivity is table.connectivity:
        pairs = connectivity  # checked and normalised when the ZMatrix was made
    else:
        pairs = _as_connectivity(connectivity, n)
    return _Graph(tab, pairs, dummies)


def _graph_exclusions(graph: _Graph, depth: int) -> _Exclusions:
    """Pairs within ``depth`` bonds (computed once per table, bond graph and depth, cached)."""
    return graph.table.cached(
        graph.key(depth), lambda topo: _exclusions(topo, depth, graph.connectivity, graph.dummies)
    )


def _exclusions(topo: Topology, depth: int, connectivity: np.ndarray, dummies: np.ndarray) -> _Exclusions:
    refs = topo.refs
    n = len(refs)
    adj: list[list[int]] = [[] for _ in range(n)]
    edges = [(i, b) for i, b in enumerate(refs[:, 0].tolist()) if b >= 0] + connectivity.tolist()
    for i, b in edges:
        adj[i].append(b)
        adj[b].append(i)
    pairs: set[tuple[int, int]] = set()
    for s in range(n):
        seen = {s}
        frontier = [s]
        for _ in range(depth):
            nxt = []
            for u in frontier:
                for v in adj[u]:
                    if v not in seen:
                        seen.add(v)
                        nxt.append(v)
            frontier = nxt
        pairs.update((s, v) for v in seen if v > s)
    for d in dummies.tolist():
        pairs.update((min(d, v), max(d, v)) for v in range(n) if v != d)
    arr = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    return _Exclusions(arr[:, 0].copy(), arr[:, 1].copy(), n * (n - 1) // 2 - len(arr))


def _depth(exclude_14: bool) -> int:
    return 3 if exclude_14 else 2


TableLike = Union[ConstructionTable, ZMatrix]


def clash_pairs(table: TableLike, *, connectivity: Any = None, exclude_14: bool = False) -> Tensor:
    r"""The atom pairs [`clash_loss`][batched_nerf.losses.clash_loss] scores, in its order: ``(P, 2)`` long,
    ``i < j``.

    All pairs ``i < j`` except those within 2 bonds (1-2 and 1-3 pairs, or 3
    bonds with ``exclude_14``) in the bond graph, whose edges are the pairs of
    ``connectivity`` and the bond references ``(i, refs[i, 0])`` of the table
    (see [`clash_loss`][batched_nerf.losses.clash_loss]), and except every pair with a dummy row of a
    ``ZMatrix``. Sorted by ``i``, then ``j``. Materialises ``O(N^2)``
    indices; [`clash_loss`][batched_nerf.losses.clash_loss] itself does not.

    Args:
        table: a [`ConstructionTable`][batched_nerf.ConstructionTable], a
            [`ZMatrix`][batched_nerf.ZMatrix] (its table, its ``connectivity``
            unless one is given, and its dummy rows), or an object with
            ``table`` and ``connectivity`` (e.g. a protein table).
        connectivity: optional ``(E, 2)`` bonded pairs (ring closures included).
        exclude_14: also exclude pairs three bonds apart.

    Raises:
        TypeError: ``table`` is neither a ConstructionTable nor a ZMatrix.
        ValueError: ``connectivity`` is not ``(E, 2)`` pairs of distinct rows.

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf.losses import clash_pairs
        >>> clash_pairs(bn.ConstructionTable.chain(5)).tolist()
        [[0, 3], [0, 4], [1, 4]]
        >>> clash_pairs(bn.ConstructionTable.chain(5), connectivity=[(0, 4)]).tolist()  # a 5-ring
        []
    """
    graph = _graph(table, connectivity)
    ex = _graph_exclusions(graph, _depth(exclude_14))
    n = graph.table.n_atoms
    keep = np.triu(np.ones((n, n), dtype=bool), 1)
    keep[ex.i, ex.j] = False
    i, j = np.nonzero(keep)
    return torch.as_tensor(np.stack([i, j], axis=1).astype(np.int64)).reshape(-1, 2)


def _device_exclusions(graph: _Graph, depth: int, device: torch.device) -> tuple[Tensor, Tensor]:
    ex = _graph_exclusions(graph, depth)
    return graph.table.cached(
        (_device_exclusions, *graph.key(depth), device),
        lambda topo: (torch.as_tensor(ex.i, device=device), torch.as_tensor(ex.j, device=device)),
    )


def _min_distance(value: Any, batch: torch.Size, like: Tensor) -> Tensor:
    """``min_distance`` as a tensor of a shape broadcasting with ``batch``: ``()`` or ``(...)``."""
    dm = as_float(value, "min_distance", like)
    check_device({"min_distance": dm}, like.device)
    dm = dm.to(like.dtype)
    if dm.ndim == len(batch) + 1 and dm.shape[-1] == 1:  # (..., 1): one value per sample
        dm = dm.squeeze(-1)
    try:
        torch.broadcast_shapes(dm.shape, batch)
    except RuntimeError:
        raise ValueError(
            f"min_distance must be a scalar or one value per sample, of shape (...) or (..., 1) "
            f"broadcasting with the batch shape {tuple(batch)} of xyz, got shape {tuple(dm.shape)}"
        ) from None
    return dm


ChunkSize = Union[int, Literal["auto"], None]
_AUTO_ELEMENTS = 1 << 22


def clash_loss(
    xyz: Tensor,
    table: TableLike,
    *,
    connectivity: Any = None,
    min_distance: float | Tensor | None = None,
    radii: Tensor | Sequence[float] | None = None,
    scale: float = 1.0,
    tolerance: float = 0.0,
    exclude_14: bool = False,
    power: float = 2.0,
    reduction: Reduction = "mean",
    chunk_size: ChunkSize = "auto",
    box: Any = None,
) -> Tensor:
    r"""Smooth flat-bottom penalty on non-bonded atom pairs that come too close.

    For every scored pair ``(i, j)`` (see [`clash_pairs`][batched_nerf.losses.clash_pairs]):

    ```text
    penalty_ij = relu(d_min_ij - tolerance - |x_i - x_j|) ** power
    ```

    zero (flat) beyond ``d_min - tolerance``; with the default ``power = 2``
    it is continuously differentiable and its gradient grows linearly with
    the overlap. ``d_min_ij`` is ``min_distance`` (one value, or one per
    sample) or ``scale * (r_i + r_j)`` from per-atom ``radii``. Distances use
    `batched_nerf._geometry.safe_norm`, so values and gradients are
    finite even for coincident atoms.

    Periodic boxes. With ``box`` (MDAnalysis's ``[a, b, c, alpha, beta, gamma]``
    or box vectors in rows, per frame or shared, orthorhombic or triclinic),
    ``|x_i - x_j|`` is the length of the
    [`minimum_image`][batched_nerf.minimum_image] of ``x_i - x_j``: atoms may
    be wrapped into the box, and a molecule clashes with its neighbouring
    images across the faces. Only the nearest image of each pair counts, so
    ``d_min`` must stay below half the smallest perpendicular width of the box
    (as for any cutoff under the minimum-image convention); the image shift is
    piecewise constant, so the loss stays differentiable in ``xyz`` (and in
    the box).

    Exclusions. Pairs bonded to each other (1-2) or sharing a neighbour (1-3),
    and with ``exclude_14`` also 1-4 pairs, are not scored. The bond graph
    has two kinds of edges:

    * the chemical bonds ``connectivity`` (ring closures included), given
      explicitly or taken from a [`ZMatrix`][batched_nerf.ZMatrix] passed as
      ``table`` (its [`connectivity`][batched_nerf.ZMatrix.connectivity]);
    * the table's bond references ``(i, refs[i, 0])`` (their distance is an
      internal coordinate; links between fragments count as bonds too).

    Without ``connectivity`` only the references are known, so a ring's
    closing bond is missing and the pairs across it are scored as clashes
    (benzene at its own geometry scores ``> 0`` for ``min_distance = 2.5``):
    pass the bond graph for molecules with rings (prolines and aromatic side
    chains too): for a protein, pass its
    [`ProteinTable`][batched_nerf.protein.ProteinTable] as ``table`` (its
    ``connectivity`` holds the residue templates' ring bonds); for a table from an
    mdtraj/OpenMM topology, ``[(a.index, b.index) for a, b in top.bonds]``. Dummy rows of a
    ``ZMatrix`` (``real`` false) are never scored. The pair lists are derived
    once per table and bond graph and cached.

    Memory: pairs are scored in blocks of ``chunk_size`` rows ``i`` (each
    block ``(..., chunk, N)``); ``"auto"`` keeps a block under ``2**22``
    elements, ``None`` scores all ``N^2`` at once. Results do not depend on it.

    Args:
        xyz: ``(..., N, 3)`` coordinates of all ``N`` rows (length unit ``L``;
            for a ZMatrix with dummies, ``z.to_cartesian(dummies=True)``).
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable] of the ``N`` atoms,
            a [`ZMatrix`][batched_nerf.ZMatrix] (its table and bond graph), or any
            object with a ``table`` and a ``connectivity`` attribute, such as
            [`ProteinTable`][batched_nerf.protein.ProteinTable].
        connectivity: optional ``(E, 2)`` bonded pairs (numpy, lists or torch);
            overrides a ZMatrix's own.
        min_distance: minimum distance (``L``): a scalar, or one value per
            sample of shape ``(...)`` or ``(..., 1)`` broadcasting with the
            batch shape of ``xyz``; exclusive with ``radii``.
        radii: ``(N,)`` per-atom radii (``L``), e.g. van der Waals radii by
            element; exclusive with ``min_distance``.
        scale: factor on ``r_i + r_j`` (e.g. ``0.8`` for a soft vdW clash).
        tolerance: slack subtracted from ``d_min`` (``L``).
        exclude_14: also exclude pairs three bonds apart.
        power: exponent of the overlap (``1``: hinge, ``2``: smooth).
        reduction: ``"mean"``: mean over the ``P`` scored pairs, shape ``(...)``;
            ``"sum"``: sum over pairs, ``(...)``; ``"none"``: ``(..., P)`` in
            the order of [`clash_pairs`][batched_nerf.losses.clash_pairs]. Batch dimensions are never reduced.
        chunk_size: rows per block, ``"auto"`` or ``None``.
        box: optional periodic box, ``(..., 6)`` lengths (``L``) and angles
            (degrees) or ``(..., 3, 3)`` box vectors in rows, one per sample
            (leading dimensions broadcasting with those of ``xyz``) or shared.

    Returns:
        ``(...)`` (``"mean"``, ``"sum"``) or ``(..., P)`` (``"none"``), in
        ``L^power``; the batch shape is that of ``xyz`` broadcast with ``min_distance``.

    Raises:
        TypeError: ``table`` is neither a ConstructionTable nor a ZMatrix, or
            ``min_distance`` is complex or boolean.
        ValueError: ``xyz`` is not ``(..., N, 3)`` (or holds only the real
            atoms of a ZMatrix with dummies); neither or both of
            ``min_distance`` and ``radii``; ``min_distance`` of a shape that
            does not broadcast with the batch (naming both shapes) or on
            another device; ``radii`` not ``(N,)``; ``connectivity`` not ``(E, 2)``
            pairs of distinct rows; an unknown ``reduction``; ``power < 1``;
            ``chunk_size`` not a positive int, ``"auto"`` or None; ``box`` of
            another shape (naming it) or leading dimensions that do not
            broadcast with those of ``xyz``.

    Example:
        >>> import torch, batched_nerf as bn
        >>> from batched_nerf.losses import clash_loss
        >>> table = bn.ConstructionTable.chain(4)
        >>> xyz = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [0.5, 0, 0]])
        >>> # only pair (0, 3): (1 - 0.5)^2
        >>> clash_loss(xyz, table, min_distance=1.0, reduction="sum")
        tensor(0.2500)
        >>> # a ring
        >>> clash_loss(xyz, table, connectivity=[(0, 3)], min_distance=1.0, reduction="sum")
        tensor(0.)
        >>> benzene = bn.data.load("benzene")
        >>> # with its own bonds
        >>> float(clash_loss(benzene.to_cartesian(), benzene, min_distance=2.4))
        0.0
        >>> # ring not closed
        >>> float(clash_loss(benzene.to_cartesian(), benzene.table, min_distance=2.4)) > 0
        True
        >>> # periodic: atom 3 at x = 4 is 0.5 from the image of atom 0 at x = 4.5
        >>> wrapped = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [4, 0, 0]])
        >>> clash_loss(wrapped, table, min_distance=1.0, reduction="sum")
        tensor(0.)
        >>> clash_loss(wrapped, table, min_distance=1.0, reduction="sum", box=[4.5, 4.5, 4.5, 90, 90, 90])
        tensor(0.2500)
    """
    graph = _graph(table, connectivity)
    tab = graph.table
    if (
        len(graph.dummies)
        and isinstance(xyz, Tensor)
        and xyz.ndim >= 2
        and xyz.shape[-2] == tab.n_atoms - len(graph.dummies)
    ):
        raise ValueError(
            f"xyz has the {xyz.shape[-2]} real atoms of the ZMatrix, but clash_loss needs all "
            f"{tab.n_atoms} rows (dummies are skipped): pass z.to_cartesian(dummies=True)"
        )
    xyz = check_xyz(xyz, tab)
    n = tab.n_atoms
    _check_clash_options(min_distance is None, radii is None, power, reduction, chunk_size)
    dev, dtype = xyz.device, xyz.dtype
    batch = xyz.shape[:-2]
    periodic = None if box is None else cell(as_box(box, xyz))  # (H, H^-1), once for every block
    if periodic is not None:
        batch = torch.broadcast_shapes(batch, periodic[0].shape[:-2])
    rad: Tensor | None = None
    if radii is not None:
        rad = to_tensor(radii, "radii", dtype=dtype, device=dev)
        if tuple(rad.shape) != (n,):
            raise ValueError(f"radii must have shape (N,) = ({n},), got {tuple(rad.shape)}")
        rad = rad * scale
    else:
        dm = _min_distance(min_distance, batch, xyz)
        batch = torch.broadcast_shapes(dm.shape, batch)
        dm = dm[..., None, None]  # against (..., R, N) blocks
    depth = _depth(exclude_14)
    ex = _graph_exclusions(graph, depth)
    ex_i, ex_j = _device_exclusions(graph, depth, dev)
    rows = _block_rows(chunk_size, math.prod(batch), n)
    cols = torch.arange(n, device=dev)
    starts = np.searchsorted(ex.i, np.arange(0, n + rows, rows)) if n else np.zeros(1, dtype=np.int64)
    pieces = []
    for k, i0 in enumerate(range(0, n, rows)):
        i1 = min(i0 + rows, n)
        r_idx = torch.arange(i0, i1, device=dev)
        keep = cols.unsqueeze(0) > r_idx.unsqueeze(1)  # (R, N): upper triangle
        lo, hi = int(starts[k]), int(starts[k + 1])
        if hi > lo:
            keep = keep.index_put(
                (ex_i[lo:hi] - i0, ex_j[lo:hi]), torch.zeros((), dtype=torch.bool, device=dev)
            )
        diff = xyz[..., i0:i1, None, :] - xyz[..., None, :, :]  # (..., R, N, 3)
        if periodic is not None:
            diff = nearest_image(diff.flatten(-3, -2), *periodic).unflatten(-2, tuple(diff.shape[-3:-1]))
        d = safe_norm(diff)  # (..., R, N)
        dmin = dm if rad is None else rad[i0:i1, None] + rad[None, :]
        pen = torch.relu(dmin - tolerance - d) ** power
        if reduction == "none":
            flat = keep.flatten().nonzero().squeeze(-1)
            pieces.append(pen.flatten(-2).index_select(-1, flat))
        else:
            pieces.append(torch.where(keep, pen, pen.new_zeros(())).sum((-1, -2)))
    if reduction == "none":
        return torch.cat(pieces, -1) if pieces else xyz.new_zeros((*batch, 0))
    total = torch.stack(pieces, 0).sum(0) if pieces else xyz.new_zeros(batch)
    if reduction == "mean":
        return total / max(ex.n_pairs, 1)
    return total


def _check_clash_options(
    no_min_distance: bool, no_radii: bool, power: float, reduction: str, chunk_size: Any
) -> None:
    """`clash_loss`'s options checked (each message names the option and the value given)."""
    if no_min_distance == no_radii:
        raise ValueError("give exactly one of min_distance (a scalar or per sample) and radii (shape (N,))")
    if not power >= 1.0:
        raise ValueError(f"power must be >= 1 (finite gradients at the flat bottom), got {power!r}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if chunk_size is not None and chunk_size != "auto":
        if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, 'auto' or None, got {chunk_size!r}")


def _block_rows(chunk_size: Any, batch_numel: int, n: int) -> int:
    """Rows of the ``(..., R, N)`` distance blocks of `clash_loss`: all ``n`` (``chunk_size=None``),
    about `_AUTO_ELEMENTS` elements a block (``"auto"``) or ``chunk_size``."""
    if chunk_size is None:
        return max(n, 1)
    if chunk_size == "auto":
        return max(1, _AUTO_ELEMENTS // max(1, batch_numel * n))
    return int(chunk_size)
