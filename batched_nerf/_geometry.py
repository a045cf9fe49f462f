"""Gradient-safe vector math shared by the engines and the inverse map.

Every function here works on tensors of any leading shape ``(..., 3)`` and
stays finite, together with its first and second derivatives, at the singular
inputs that real molecules produce: zero-length vectors (coincident atoms),
parallel vectors (straight or zero angles, collinear reference atoms).

Two devices make that possible, both compatible with ``torch.func`` and
``torch.compile`` (no data-dependent Python control flow):

* the *double where* trick for square roots and ``atan2``: the singular input is
  replaced by a harmless one before the function is applied, and the result is
  replaced back afterwards, so neither the value nor the gradient sees the
  singularity. The masks test for the exact singular value (``== 0``), never
  ``> 0``, so that a NaN is never mistaken for it and passes through;
* normalisation divides by ``max(|v|, EPS)``: exact for ``|v| >= EPS`` and a
  finite (``1 / EPS``-sized) derivative below it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

#: Length below which a vector counts as zero when it is normalised
#: (in the caller's length unit). Above it normalisation is exact; below it the
#: vector is divided by ``EPS`` instead of its length, which keeps values and
#: derivatives finite.
EPS = 1e-8

_TWO_PI = 2.0 * math.pi


def nan_negative_bonds(bonds: Tensor) -> Tensor:
    """``bonds`` with negative entries NaN: outside the domain, that atom and all built from it are NaN."""
    return torch.where(bonds < 0, torch.nan, bonds)


def dot(u: Tensor, v: Tensor, dim: int = -1) -> Tensor:
    """Dot product over the component dimension ``dim``: ``(..., 3), (..., 3) -> (...)``."""
    return (u * v).sum(dim)


def cross(u: Tensor, v: Tensor, dim: int = -1) -> Tensor:
    """Cross product over the component dimension ``dim`` (``-1``: ``(..., 3)``; ``0``: ``(3, ...)``).

    Written out elementwise rather than ``torch.linalg.cross`` so that it
    broadcasts freely and lowers to plain elementwise kernels under
    ``torch.compile``.
    """
    u0, u1, u2 = u.unbind(dim)
    v0, v1, v2 = v.unbind(dim)
    return torch.stack((u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0), dim=dim)


def safe_norm(v: Tensor, dim: int = -1) -> Tensor:
    """Euclidean norm over ``dim`` with a zero gradient at ``v = 0``.

    ``(..., 3) -> (...)``. The value is exact everywhere (``0`` at ``0``); a NaN
    component gives a NaN norm (only an exact zero is replaced, so NaN, which
    compares unequal to everything, passes through).
    """
    sq = (v * v).sum(dim)
    zero = sq == 0
    root = torch.sqrt(torch.where(zero, torch.ones_like(sq), sq))
    return torch.where(zero, torch.zeros_like(root), root)


def safe_normalize(v: Tensor, eps: float = EPS, dim: int = -1) -> Tensor:
    """``v / max(|v|, eps)`` over the component dimension ``dim``."""
    return v / safe_norm(v, dim).clamp_min(eps).unsqueeze(dim)


def safe_atan2(y: Tensor, x: Tensor) -> Tensor:
    """``atan2(y, x)`` that returns ``0`` with finite derivatives at ``(0, 0)``."""
    singular = (x == 0) & (y == 0)
    return torch.atan2(y, torch.where(singular, torch.ones_like(x), x))


def wrap_angle(phi: Tensor) -> Tensor:
    """Map ``[-pi, pi]`` onto ``(-pi, pi]`` (only ``-pi`` itself moves)."""
    return torch.where(phi <= -math.pi, phi + _TWO_PI, phi)


def distance(p0: Tensor, p1: Tensor) -> Tensor:
    """``|p0 - p1|``: ``(..., 3), (..., 3) -> (...)``, zero gradient when equal."""
    return safe_norm(p0 - p1)


def angle(p0: Tensor, p1: Tensor, p2: Tensor) -> Tensor:
    """Angle ``p0-p1-p2`` at ``p1`` in ``[0, pi]``: ``(..., 3) x 3 -> (...)``.

    Computed as ``atan2(|u x v|, u . v)`` with ``u = p0 - p1``, ``v = p2 - p1``,
    which is accurate near ``0`` and ``pi`` (unlike ``acos``) and finite, with
    finite derivatives, for straight angles and coincident atoms (value ``0``
    when an arm has zero length).
    """
    u = p0 - p1
    v = p2 - p1
    return safe_atan2(safe_norm(cross(u, v)), dot(u, v))


def dihedral(p0: Tensor, p1: Tensor, p2: Tensor, p3: Tensor) -> Tensor:
    """IUPAC dihedral of ``p0-p1-p2-p3`` in ``(-pi, pi]``: ``(..., 3) x 4 -> (...)``.

    ``atan2(|b1| b0 . (b1 x b2), (b0 x b1) . (b1 x b2))`` with ``b0 = p1 - p0``,
    ``b1 = p2 - p1``, ``b2 = p3 - p2`` (the formula of mdtraj and MDAnalysis):
    positive when, looking along ``p1 -> p2``, ``p3`` is turned clockwise from
    ``p0``. Symmetric: ``dihedral(p0, p1, p2, p3) == dihedral(p3, p2, p1, p0)``.
    Returns ``0`` with finite derivatives when the dihedral is undefined
    (collinear or coincident atoms).
    """
    b0 = p1 - p0
    b1 = p2 - p1
    b2 = p3 - p2
    n2 = cross(b1, b2)
    y = safe_norm(b1) * dot(b0, n2)
    x = dot(cross(b0, b1), n2)
    return wrap_angle(safe_atan2(y, x))


def nerf_frame(xb: Tensor, xa: Tensor, xd: Tensor, dim: int = -1) -> tuple[Tensor, Tensor, Tensor]:
    """The NeRF frame ``(e1, e2, e3)`` that places an atom with references ``(b, a, d)``.

    Arguments in the order of a table row (bond, angle, dihedral reference);
    vectors along ``dim`` (``-1``: ``(..., 3)``; ``0``: component-major ``(3, ...)``):

    ```text
    e1 = (x_b - x_a) / |x_b - x_a|
    e3 = ((x_a - x_d) x e1) / |(x_a - x_d) x e1|
    e2 = e3 x e1
    ```

    Finite, with finite derivatives, when the references are collinear or
    coincident (``e3`` and ``e2`` then collapse to zero).
    """
    e1 = safe_normalize(xb - xa, dim=dim)
    e3 = safe_normalize(cross(xa - xd, e1, dim), dim=dim)
    return e1, cross(e3, e1, dim), e3


def place(
    xb: Tensor, xa: Tensor, xd: Tensor, local: tuple[Tensor, Tensor, Tensor] | Sequence[Tensor], dim: int = -1
) -> Tensor:
    """NeRF placement ``x = x_b + d1 e1 + d2 e2 + d3 e3`` in the frame of `nerf_frame`.

    ``local = (d1, d2, d3) = r (-cos(theta), sin(theta) cos(phi), sin(theta) sin(phi))``,
    each ``(...)``, puts the atom at distance ``r`` from ``x_b``, at the angle
    ``x-x_b-x_a = theta`` and the IUPAC dihedral ``(x, x_b, x_a, x_d) = phi``.

    Args:
        xb, xa, xd: bond, angle and dihedral reference positions, vectors along ``dim``.
        local: the three local offsets, each shaped like the positions without ``dim``.
        dim: the component dimension (``-1`` or ``0``).

    Returns:
        The placed positions, shaped like ``xb``.

    Example:
        >>> import math, torch
        >>> from batched_nerf._geometry import place
        >>> xb, xa, xd = torch.tensor([1.0, 0, 0]), torch.zeros(3), torch.tensor([0.0, 1, 0])
        >>> r, t, p = torch.tensor(1.0), torch.tensor(math.pi / 2), torch.tensor(0.0)
        >>> local = (-r * torch.cos(t), r * torch.sin(t) * torch.cos(p), r * torch.sin(t) * torch.sin(p))
        >>> place(xb, xa, xd, local)
        tensor([1., 1., 0.])
    """
    e1, e2, e3 = nerf_frame(xb, xa, xd, dim)
    d1, d2, d3 = (d.unsqueeze(dim) for d in local)
    return xb + d1 * e1 + d2 * e2 + d3 * e3


def batch_shape(*shapes: Sequence[int]) -> torch.Size:
    """``torch.broadcast_shapes(*shapes)``, without its Python cost (~20 us) where every non-empty shape
    is the same.

    Raises:
        RuntimeError: the shapes do not broadcast (as ``torch.broadcast_shapes``).

    Example:
        >>> from batched_nerf._geometry import batch_shape
        >>> batch_shape((4, 1), (4, 1)), batch_shape((4, 1), (3,)), batch_shape((), (2,))
        (torch.Size([4, 1]), torch.Size([4, 3]), torch.Size([2]))
    """
    given = [tuple(s) for s in shapes if len(s)]  # an empty shape broadcasts with every other
    first = given[0] if given else ()
    if all(s == first for s in given[1:]):
        return torch.Size(first)
    return torch.broadcast_shapes(*shapes)


# ------------------------------------------------------------------ superposition
# Optimal superposition of point sets (Kabsch / Horn), batched, masked and differentiable.
#
# For centred point sets ``a_i`` (mobile) and ``b_i`` (reference) with
# ``S = sum_i a_i b_i^T``, the rotation ``R`` maximising ``sum_i b_i . R a_i`` is
# that of the unit quaternion ``q`` of the largest eigenvalue ``lambda`` of
# Horn's symmetric ``4 x 4`` matrix ``K(S)``, and the minimal mean square deviation
# is ``(sum |a_i|^2 + sum |b_i|^2 - 2 lambda) / n``. Always a proper rotation (no
# reflection), no SVD sign fix, differentiable through ``torch.linalg.eigh``
# (where the largest eigenvalue is simple), and ``vmap``-safe. Non-finite input
# gives NaN for that set only (the eigen solver sees an identity in its place).


def centered(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Padded sets ``(..., n, 3)`` minus their centroids (padding stays zero), and the centroids.

    ``mask`` ``(..., n)`` marks the real points of each set.
    """
    w = mask[..., None].to(x.dtype)
    centroid = (x * w).sum(-2, keepdim=True) / w.sum(-2, keepdim=True)
    return (x - centroid) * w, centroid


def _horn(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``K`` with non-finite sets replaced by the identity, and the finite flag ``(...)``."""
    s = a.transpose(-1, -2) @ b  # (..., 3, 3)
    sxx, sxy, sxz, syx, syy, syz, szx, szy, szz = s.flatten(-2).unbind(-1)
    k = torch.stack(
        [
            torch.stack([sxx + syy + szz, syz - szy, szx - sxz, sxy - syx], -1),
            torch.stack([syz - szy, sxx - syy - szz, sxy + syx, szx + sxz], -1),
            torch.stack([szx - sxz, sxy + syx, syy - sxx - szz, syz + szy], -1),
            torch.stack([sxy - syx, szx + sxz, syz + szy, szz - sxx - syy], -1),
        ],
        -2,
    )
    finite = torch.isfinite(k).flatten(-2).all(-1)
    eye = torch.eye(4, dtype=k.dtype, device=k.device)
    return torch.where(finite[..., None, None], k, eye), finite


def superposed_msd(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """``(...)`` mean square deviation of centred padded sets ``(..., n, 3)`` after the best rotation."""
    k, finite = _horn(a, b)
    top = torch.linalg.eigvalsh(k)[..., -1]
    n = mask.sum(-1).to(a.dtype)
    value = (a.square().sum((-1, -2)) + b.square().sum((-1, -2)) - 2 * top) / n
    return torch.where(finite, value.clamp_min(0), torch.full_like(value, float("nan")))


def superposing_rotation(a: Tensor, b: Tensor) -> Tensor:
    """``(..., 3, 3)`` rotation ``R`` with ``R a_i`` closest to ``b_i`` (centred padded ``(..., n, 3)``)."""
    k, finite = _horn(a, b)
    q = torch.linalg.eigh(k)[1][..., -1]  # (..., 4): w, x, y, z
    w, x, y, z = q.unbind(-1)
    r = torch.stack(
        [
            torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            torch.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            torch.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )
    return torch.where(finite[..., None, None], r, torch.full_like(r, float("nan")))


def pose_atoms(x: Tensor, rot: Tensor, tr: Tensor, slot: Tensor) -> Tensor:
    """``R x + t`` per atom (what [`batched_nerf.apply_pose`][batched_nerf.apply_pose] computes for
    several components): ``x`` ``(..., N, 3)``, ``rot`` ``(..., S, 3, 3)`` and ``tr`` ``(..., S, 3)``
    of one batch shape, ``slot`` ``(N,)`` long, each atom's component (``S``: anchored, unchanged)
    -> ``(..., N, 3)``; NaN for the atoms of a component with ``det R < 0``. Differentiable: an
    improper component's atoms give it and its pose no gradient."""
    lead = rot.shape[:-3]
    proper = dot(rot[..., 0], cross(rot[..., 1], rot[..., 2])) >= 0  # (..., S): det as a triple product
    eye = torch.eye(3, dtype=rot.dtype, device=rot.device).expand(*lead, 1, 3, 3)
    r_atom = torch.cat((rot, eye), -3).index_select(-3, slot)  # (..., N, 3, 3)
    t_atom = torch.cat((tr, tr.new_zeros(()).expand(*lead, 1, 3)), -2).index_select(-2, slot)
    ok = torch.cat((proper, proper.new_ones(()).expand(*lead, 1)), -1).index_select(-1, slot)
    out = (r_atom * x.unsqueeze(-2)).sum(-1) + t_atom
    return torch.where(ok.unsqueeze(-1), out, out.new_full((), float("nan")))
