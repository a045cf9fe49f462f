"""Independent float64 numpy oracle for the tests.

Written without any code of ``batched_nerf``: atoms are placed one at a time,
in a topological order found here, with a Rodrigues rotation (not the NeRF
frame of the engines); angles use ``arccos`` and dihedrals the ``atan2``
formula of mdtraj / MDAnalysis.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def bond(p0: np.ndarray, p1: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(p0, float) - np.asarray(p1, float)))


def angle(p0: np.ndarray, p1: np.ndarray, p2: np.ndarray) -> float:
    """Angle p0-p1-p2 at p1, in [0, pi], by arccos."""
    u = np.asarray(p0, float) - p1
    v = np.asarray(p2, float) - p1
    c = np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v))
    return float(np.arccos(np.clip(c, -1.0, 1.0)))


def dihedral(p0: np.ndarray, p1: np.ndarray, p2: np.ndarray, p3: np.ndarray) -> float:
    """IUPAC dihedral p0-p1-p2-p3, mdtraj's ``_dihedral`` formula, in (-pi, pi]."""
    b1 = np.asarray(p1, float) - p0
    b2 = np.asarray(p2, float) - p1
    b3 = np.asarray(p3, float) - p2
    c1 = np.cross(b2, b3)
    c2 = np.cross(b1, b2)
    y = np.dot(b1, c1) * np.linalg.norm(b2)
    x = np.dot(c1, c2)
    phi = float(np.arctan2(y, x))
    return np.pi if phi <= -np.pi else phi


def topological_order(refs: np.ndarray) -> list[int]:
    """Atoms ordered so that every atom comes after all of its references (DFS)."""
    refs = np.asarray(refs)
    n = len(refs)
    order: list[int] = []
    state = [0] * n  # 0 new, 1 visiting, 2 done

    def visit(i: int) -> None:
        stack = [(i, False)]
        while stack:
            j, expanded = stack.pop()
            if expanded:
                state[j] = 2
                order.append(j)
                continue
            if state[j] == 2:
                continue
            if state[j] == 1:
                raise ValueError("cycle")
            state[j] = 1
            stack.append((j, True))
            for r in refs[j]:
                if r >= 0 and state[r] != 2:
                    stack.append((int(r), False))

    for i in range(n):
        if state[i] == 0:
            visit(i)
    return order


def place_rodrigues(
    xb: np.ndarray, xa: np.ndarray, xd: np.ndarray, r: float, theta: float, phi: float
) -> np.ndarray:
    """Atom at distance r from xb, angle theta to xa, dihedral phi to xd.

    Start cis to ``xd`` in the plane (d, a, b) and rotate about the b->a axis.
    """
    u = _unit(xa - xb)
    w = xd - xa
    p = _unit(w - np.dot(w, u) * u)
    v0 = np.cos(theta) * u + np.sin(theta) * p
    # rotation about u by -phi (Rodrigues) gives IUPAC sign (checked against `dihedral`)
    c, s = np.cos(-phi), np.sin(-phi)
    v = v0 * c + np.cross(u, v0) * s + u * np.dot(u, v0) * (1 - c)
    return xb + r * v


def reference_to_cartesian(
    refs: np.ndarray,
    bonds: np.ndarray,
    angles: np.ndarray,
    dihedrals: np.ndarray,
    fixed: Sequence[int] = (),
    fixed_xyz: np.ndarray | None = None,
) -> np.ndarray:
    """Sequential float64 placement of one conformation: ``(N,) x 3 -> (N, 3)``."""
    refs = np.asarray(refs, dtype=np.int64)
    bonds, angles, dihedrals = (np.asarray(v, dtype=np.float64) for v in (bonds, angles, dihedrals))
    n = len(refs)
    xyz = np.full((n, 3), np.nan)
    fixed = [int(f) for f in fixed]
    for k, f in enumerate(fixed):
        xyz[f] = np.asarray(fixed_xyz, dtype=np.float64)[k]
    for i in topological_order(refs):
        if i in fixed:
            continue
        b, a, d = (int(x) for x in refs[i])
        if b < 0:
            xyz[i] = 0.0
        elif a < 0:
            xyz[i] = [bonds[i], 0.0, 0.0]
        elif d < 0:
            u = _unit(xyz[a] - xyz[b])
            xyz[i] = xyz[b] + bonds[i] * (np.cos(angles[i]) * u + np.sin(angles[i]) * np.array([0, 1.0, 0]))
        else:
            xyz[i] = place_rodrigues(xyz[b], xyz[a], xyz[d], bonds[i], angles[i], dihedrals[i])
    return xyz


def reference_to_internal(refs: np.ndarray, xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bonds, angles, dihedrals of one conformation, 0 for unused entries."""
    refs = np.asarray(refs, dtype=np.int64)
    xyz = np.asarray(xyz, dtype=np.float64)
    n = len(refs)
    out = np.zeros((3, n))
    for i, (b, a, d) in enumerate(refs.tolist()):
        if b >= 0:
            out[0, i] = bond(xyz[i], xyz[b])
        if a >= 0:
            out[1, i] = angle(xyz[i], xyz[b], xyz[a])
        if d >= 0:
            out[2, i] = dihedral(xyz[i], xyz[b], xyz[a], xyz[d])
    return out[0], out[1], out[2]


def batched(fn, *arrays: np.ndarray, **kwargs) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Apply a per-conformation oracle over the leading dims of ``arrays``."""
    arrays = tuple(np.asarray(a, dtype=np.float64) for a in arrays)
    lead = arrays[0].shape[:-1]
    flat = [a.reshape(-1, a.shape[-1]) for a in arrays]
    out = [fn(*(f[k] for f in flat), **kwargs) for k in range(flat[0].shape[0])]
    return np.stack(out).reshape(*lead, *np.shape(out[0]))
