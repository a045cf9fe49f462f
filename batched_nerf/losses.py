r"""Differentiable loss terms for learning with molecular coordinates.

* :func:`committor_loss`: the variational (Kolmogorov) committor loss with
  boundary terms, for training a committor network ``q(x)``.
* :func:`clash_loss`: a smooth flat-bottom penalty on non-bonded atom pairs
  that come closer than a minimum distance, with bond-graph exclusions
  derived from a :class:`~batched_nerf.ConstructionTable`.

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

from ._checks import check_table, check_xyz
from ._geometry import safe_norm
from ._table import ConstructionTable
from ._topology import Topology

__all__ = ["clash_loss", "clash_pairs", "committor_loss"]

Reduction = Literal["mean", "sum", "none"]


# ----------------------------------------------------------------- committor
def _as_mask(value: Any, name: str, n: int, like: Tensor) -> Tensor | None:
    if value is None:
        return None
    t = torch.as_tensor(value, device=like.device)
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
    ``q_k = q(x_k)``::

        L = sum_k w_k [ sum_i |grad_{x_i} q(x_k)|^2 / m_i ] / sum_k w_k
          + boundary_weight * sum_k w_k [ a_k q_k^2 + b_k (1 - q_k)^2 ] / sum_k w_k

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
        Scalar loss tensor.

    Raises:
        ValueError: ``q`` is not ``(B,)`` / ``(B, 1)``, ``x`` has a different
            leading size, ``masses``/``weights``/``in_a``/``in_b`` are misshapen,
            or ``x`` does not require grad.

    Example:
        >>> import torch
        >>> from batched_nerf.losses import committor_loss
        >>> x = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]], requires_grad=True)
        >>> q = 0.5 * x[:, 1, 0]                        # grad_x q = 0.5 on one coordinate
        >>> committor_loss(q, x, masses=torch.tensor([1.0, 2.0]), in_b=torch.tensor([True]))
        tensor(0.3750, grad_fn=<AddBackward0>)
    """
    if not isinstance(q, Tensor) or not isinstance(x, Tensor):
        raise ValueError("q and x must be tensors")
    if q.ndim == 2 and q.shape[1] == 1:
        q = q[:, 0]
    if q.ndim != 1:
        raise ValueError(f"q must have shape (B,) or (B, 1), got {tuple(q.shape)}")
    n = q.shape[0]
    if x.ndim < 2 or x.shape[0] != n:
        raise ValueError(f"x must have shape (B, ...) with B = {n} like q, got {tuple(x.shape)}")
    if not x.requires_grad:
        raise ValueError("x must require grad and q must be computed from it")
    (g,) = torch.autograd.grad(q.sum(), x, create_graph=True)
    sq = g * g
    if masses is not None:
        m = torch.as_tensor(masses, dtype=x.dtype, device=x.device)
        per_atom = x.shape[1:-1] if x.ndim > 2 else x.shape[1:]
        if tuple(m.shape) != tuple(per_atom):
            raise ValueError(
                f"masses must have shape {tuple(per_atom)} for x of shape {tuple(x.shape)}, "
                f"got {tuple(m.shape)}"
            )
        sq = sq / (m.unsqueeze(-1) if x.ndim > 2 else m)
    kin = sq.reshape(n, -1).sum(-1)
    w = _as_mask(weights, "weights", n, q)
    w = torch.ones_like(q) if w is None else w
    total = w.sum()
    loss = (w * kin).sum() / total
    a = _as_mask(in_a, "in_a", n, q)
    b = _as_mask(in_b, "in_b", n, q)
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


def _graph_exclusions(table: ConstructionTable, depth: int) -> _Exclusions:
    """Pairs within ``depth`` bonds (computed once per table and depth, cached)."""
    return table.cached((_graph_exclusions, depth), lambda topo: _exclusions(topo, depth))


def _exclusions(topo: Topology, depth: int) -> _Exclusions:
    refs = topo.refs
    n = len(refs)
    adj: list[list[int]] = [[] for _ in range(n)]
    for i, b in enumerate(refs[:, 0].tolist()):
        if b >= 0:
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
    arr = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    return _Exclusions(arr[:, 0].copy(), arr[:, 1].copy(), n * (n - 1) // 2 - len(arr))


def _depth(exclude_14: bool) -> int:
    return 3 if exclude_14 else 2


def clash_pairs(table: ConstructionTable, *, exclude_14: bool = False) -> Tensor:
    r"""The atom pairs :func:`clash_loss` scores, in its order: ``(P, 2)`` long, ``i < j``.

    All pairs ``i < j`` except those within 2 bonds (1-2 and 1-3 pairs, or 3
    bonds with ``exclude_14``) in the bond graph of the table, whose edges are
    ``(i, refs[i, 0])``. Sorted by ``i``, then ``j``. Materialises ``O(N^2)``
    indices; :func:`clash_loss` itself does not.

    Raises:
        TypeError: ``table`` is not a ConstructionTable.

    Example:
        >>> import batched_nerf as bn
        >>> from batched_nerf.losses import clash_pairs
        >>> clash_pairs(bn.ConstructionTable.chain(5)).tolist()
        [[0, 3], [0, 4], [1, 4]]
    """
    ex = _graph_exclusions(check_table(table), _depth(exclude_14))
    n = table.n_atoms
    keep = np.triu(np.ones((n, n), dtype=bool), 1)
    keep[ex.i, ex.j] = False
    i, j = np.nonzero(keep)
    return torch.as_tensor(np.stack([i, j], axis=1).astype(np.int64)).reshape(-1, 2)


def _device_exclusions(table: ConstructionTable, depth: int, device: torch.device) -> tuple[Tensor, Tensor]:
    ex = _graph_exclusions(table, depth)
    return table.cached(
        (_device_exclusions, depth, device),
        lambda topo: (torch.as_tensor(ex.i, device=device), torch.as_tensor(ex.j, device=device)),
    )


ChunkSize = Union[int, Literal["auto"], None]
_AUTO_ELEMENTS = 1 << 22


def clash_loss(
    xyz: Tensor,
    table: ConstructionTable,
    *,
    min_distance: float | Tensor | None = None,
    radii: Tensor | Sequence[float] | None = None,
    scale: float = 1.0,
    tolerance: float = 0.0,
    exclude_14: bool = False,
    power: float = 2.0,
    reduction: Reduction = "mean",
    chunk_size: ChunkSize = "auto",
) -> Tensor:
    r"""Smooth flat-bottom penalty on non-bonded atom pairs that come too close.

    For every scored pair ``(i, j)`` (see :func:`clash_pairs`)::

        penalty_ij = relu(d_min_ij - tolerance - |x_i - x_j|) ** power

    zero (flat) beyond ``d_min - tolerance``; with the default ``power = 2``
    it is continuously differentiable and its gradient grows linearly with
    the overlap. ``d_min_ij`` is ``min_distance`` or ``scale * (r_i + r_j)``
    from per-atom ``radii``. Distances use :func:`batched_nerf._geometry.safe_norm`,
    so values and gradients are finite even for coincident atoms.

    Pairs bonded to each other (1-2) or sharing a neighbour (1-3), and with
    ``exclude_14`` also 1-4 pairs, are excluded; the bond graph has the edges
    ``(i, refs[i, 0])`` of the table. The pair lists are derived once per
    table and cached.

    Memory: pairs are scored in blocks of ``chunk_size`` rows ``i`` (each
    block ``(..., chunk, N)``); ``"auto"`` keeps a block under ``2**22``
    elements, ``None`` scores all ``N^2`` at once. Results do not depend on it.

    Args:
        xyz: ``(..., N, 3)`` coordinates (length unit ``L``).
        table: the :class:`~batched_nerf.ConstructionTable` of the ``N`` atoms.
        min_distance: scalar minimum distance (``L``); exclusive with ``radii``.
        radii: ``(N,)`` per-atom radii (``L``), e.g. van der Waals radii by
            element; exclusive with ``min_distance``.
        scale: factor on ``r_i + r_j`` (e.g. ``0.8`` for a soft vdW clash).
        tolerance: slack subtracted from ``d_min`` (``L``).
        exclude_14: also exclude pairs three bonds apart.
        power: exponent of the overlap (``1``: hinge, ``2``: smooth).
        reduction: ``"mean"``: mean over the ``P`` scored pairs, shape ``(...)``;
            ``"sum"``: sum over pairs, ``(...)``; ``"none"``: ``(..., P)`` in
            the order of :func:`clash_pairs`. Batch dimensions are never reduced.
        chunk_size: rows per block, ``"auto"`` or ``None``.

    Returns:
        ``(...)`` (``"mean"``, ``"sum"``) or ``(..., P)`` (``"none"``), in ``L^power``.

    Raises:
        TypeError: ``table`` is not a ConstructionTable.
        ValueError: ``xyz`` is not ``(..., N, 3)``; neither or both of
            ``min_distance`` and ``radii``; ``radii`` not ``(N,)``; an unknown
            ``reduction``; ``power < 1``; ``chunk_size`` not a positive int, ``"auto"`` or None.

    Example:
        >>> import torch, batched_nerf as bn
        >>> from batched_nerf.losses import clash_loss
        >>> table = bn.ConstructionTable.chain(4)
        >>> xyz = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [0.5, 0, 0]])
        >>> clash_loss(xyz, table, min_distance=1.0, reduction="sum")  # only pair (0, 3): (1 - 0.5)^2
        tensor(0.2500)
    """
    xyz = check_xyz(xyz, check_table(table))
    n = table.n_atoms
    if (min_distance is None) == (radii is None):
        raise ValueError("give exactly one of min_distance (a scalar) and radii (shape (N,))")
    if not power >= 1.0:
        raise ValueError(f"power must be >= 1 (finite gradients at the flat bottom), got {power!r}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if chunk_size is not None and chunk_size != "auto":
        if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, 'auto' or None, got {chunk_size!r}")
    dev, dtype = xyz.device, xyz.dtype
    rad: Tensor | None = None
    if radii is not None:
        rad = torch.as_tensor(radii, dtype=dtype, device=dev)
        if tuple(rad.shape) != (n,):
            raise ValueError(f"radii must have shape (N,) = ({n},), got {tuple(rad.shape)}")
        rad = rad * scale
    depth = _depth(exclude_14)
    ex = _graph_exclusions(table, depth)
    ex_i, ex_j = _device_exclusions(table, depth, dev)
    batch = xyz.shape[:-2]
    batch_numel = math.prod(batch)
    if chunk_size is None:
        rows = max(n, 1)
    elif chunk_size == "auto":
        rows = max(1, _AUTO_ELEMENTS // max(1, batch_numel * n))
    else:
        rows = chunk_size
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
        d = safe_norm(xyz[..., i0:i1, None, :] - xyz[..., None, :, :])  # (..., R, N)
        if rad is None:
            dmin = torch.as_tensor(min_distance, dtype=dtype, device=dev)
        else:
            dmin = rad[i0:i1, None] + rad[None, :]
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
