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
  singularity;
* normalisation divides by ``max(|v|, EPS)``: exact for ``|v| >= EPS`` and a
  finite (``1 / EPS``-sized) derivative below it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: Length below which a vector counts as zero when it is normalised
#: (in the caller's length unit). Above it normalisation is exact; below it the
#: vector is divided by ``EPS`` instead of its length, which keeps values and
#: derivatives finite.
EPS = 1e-8

_TWO_PI = 2.0 * math.pi


def dot(u: Tensor, v: Tensor) -> Tensor:
    """Dot product over the last dimension: ``(..., 3), (..., 3) -> (...)``."""
    return (u * v).sum(-1)


def cross(u: Tensor, v: Tensor) -> Tensor:
    """Cross product written out elementwise (``(..., 3) -> (..., 3)``).

    Written out rather than ``torch.linalg.cross`` so that it broadcasts
    freely and lowers to plain elementwise kernels under ``torch.compile``.
    """
    u0, u1, u2 = u.unbind(-1)
    v0, v1, v2 = v.unbind(-1)
    return torch.stack((u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0), dim=-1)


def safe_norm(v: Tensor) -> Tensor:
    """Euclidean norm over the last dimension with a zero gradient at ``v = 0``.

    ``(..., 3) -> (...)``. The value is exact everywhere (``0`` at ``0``).
    """
    sq = (v * v).sum(-1)
    positive = sq > 0
    root = torch.sqrt(torch.where(positive, sq, torch.ones_like(sq)))
    return torch.where(positive, root, torch.zeros_like(root))


def safe_normalize(v: Tensor, eps: float = EPS) -> Tensor:
    """``v / max(|v|, eps)`` over the last dimension (``(..., 3) -> (..., 3)``)."""
    return v / safe_norm(v).clamp_min(eps).unsqueeze(-1)


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


def place(a: Tensor, b: Tensor, c: Tensor, bond: Tensor, angle_: Tensor, torsion: Tensor) -> Tensor:
    """Natural extension reference frame (NeRF) placement of one atom.

    Places ``x`` with ``|x - c| = bond``, angle ``x-c-b = angle_`` and IUPAC
    dihedral ``(a, b, c, x) = torsion``::

        e1 = (c - b) / |c - b|
        e3 = ((b - a) x e1) / |(b - a) x e1|
        e2 = e3 x e1
        x  = c + bond * (-cos(angle_) e1 + sin(angle_) cos(torsion) e2
                         + sin(angle_) sin(torsion) e3)

    Args:
        a, b, c: reference positions ``(..., 3)`` (dihedral, angle and bond
            reference in that order).
        bond, angle_, torsion: ``(...)`` length and radians.

    Returns:
        ``(..., 3)``. Finite, with finite derivatives, when ``a, b, c`` are
        collinear (the torsion is then undefined and ``e3`` collapses).
    """
    sin_t = torch.sin(angle_)
    d1 = -bond * torch.cos(angle_)
    d2 = bond * sin_t * torch.cos(torsion)
    d3 = bond * sin_t * torch.sin(torsion)
    return place_local(a, b, c, torch.stack((d1, d2, d3), dim=-1))


def place_local(a: Tensor, b: Tensor, c: Tensor, local: Tensor) -> Tensor:
    """``c + [e1, e2, e3] local``: NeRF placement from a precomputed local offset.

    ``local = bond * (-cos(angle), sin(angle) cos(torsion), sin(angle) sin(torsion))``
    ``(..., 3)``; the frame ``e1, e2, e3`` is that of :func:`place`.
    """
    e1 = safe_normalize(c - b)
    e3 = safe_normalize(cross(b - a, e1))
    e2 = cross(e3, e1)
    d1, d2, d3 = local.unbind(-1)
    return c + d1.unsqueeze(-1) * e1 + d2.unsqueeze(-1) * e2 + d3.unsqueeze(-1) * e3


# Component-major variants: vectors as ``(3, ...)``, so that each component is a
# contiguous array (the engines' hot loops work on these).


def cross0(u: Tensor, v: Tensor) -> Tensor:
    """Cross product of component-major vectors ``(3, ...)``."""
    u0, u1, u2 = u.unbind(0)
    v0, v1, v2 = v.unbind(0)
    return torch.stack((u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0))


def safe_normalize0(v: Tensor, eps: float = EPS) -> Tensor:
    """:func:`safe_normalize` for component-major vectors ``(3, ...)``."""
    sq = (v * v).sum(0)
    positive = sq > 0
    norm = torch.where(positive, torch.sqrt(torch.where(positive, sq, torch.ones_like(sq))), 0.0)
    return v / norm.clamp_min(eps)


def place0(a: Tensor, b: Tensor, c: Tensor, local: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    """:func:`place_local` for component-major positions ``(3, ...)``."""
    e1 = safe_normalize0(c - b)
    e3 = safe_normalize0(cross0(b - a, e1))
    e2 = cross0(e3, e1)
    d1, d2, d3 = local
    return c + d1 * e1 + d2 * e2 + d3 * e3
