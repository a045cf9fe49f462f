r"""Optimal superposition of point sets (Kabsch / Horn), batched, masked and differentiable.

For centred point sets ``a_i`` (mobile) and ``b_i`` (reference) with
``S = sum_i a_i b_i^T``, the rotation ``R`` maximising ``sum_i b_i . R a_i`` is
that of the unit quaternion ``q`` of the largest eigenvalue ``lambda`` of
Horn's symmetric ``4 x 4`` matrix ``K(S)``, and the minimal mean square deviation
is ``(sum |a_i|^2 + sum |b_i|^2 - 2 lambda) / n``. Always a proper rotation (no
reflection), no SVD sign fix, differentiable through ``torch.linalg.eigh``
(where the largest eigenvalue is simple), and ``vmap``-safe. Non-finite input
gives NaN for that set only (the eigen solver sees an identity in its place).
"""

from __future__ import annotations

import torch
from torch import Tensor


def centered(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Padded sets ``(..., n, 3)`` minus their centroids (padding stays zero), and the centroids.

    ``mask`` ``(..., n)`` marks the real points of each set.
    """
    w = mask[..., None].to(x.dtype)
    centroid = (x * w).sum(-2, keepdim=True) / w.sum(-2, keepdim=True)
    return (x - centroid) * w, centroid


def _horn(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
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
    return torch.where(finite[..., None, None], k, eye), finite, s


def msd(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """``(...)`` mean square deviation of centred padded sets ``(..., n, 3)`` after the best rotation."""
    k, finite, _ = _horn(a, b)
    top = torch.linalg.eigvalsh(k)[..., -1]
    n = mask.sum(-1).to(a.dtype)
    value = (a.square().sum((-1, -2)) + b.square().sum((-1, -2)) - 2 * top) / n
    return torch.where(finite, value.clamp_min(0), torch.full_like(value, float("nan")))


def rotation(a: Tensor, b: Tensor) -> Tensor:
    """``(..., 3, 3)`` rotation ``R`` with ``R a_i`` closest to ``b_i`` (centred padded ``(..., n, 3)``)."""
    k, finite, _ = _horn(a, b)
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
