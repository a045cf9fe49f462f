"""Small float64 numpy reference geometry: NeRF build and internal coordinates.

This is deliberately independent of the torch engines: it generates the
shipped molecule files offline and serves the tests as a second opinion.
Conventions are those of [`batched_nerf.ConstructionTable`][batched_nerf.ConstructionTable]: angles in
radians, IUPAC dihedral of ``(x_i, x_b, x_a, x_d)``, seeds at the origin, on
``+x`` and in the ``xy``-plane with ``y > 0``.
"""

from __future__ import annotations

import numpy as np


def build_order(refs: np.ndarray) -> list[int]:
    """Atoms in an order where every reference comes before its user.

    Raises:
        ValueError: if the references contain a cycle.
    """
    n = len(refs)
    order: list[int] = []
    state = np.zeros(n, dtype=np.int8)  # 0 new, 1 on stack, 2 done
    for start in range(n):
        if state[start]:
            continue
        stack = [(start, 0)]
        while stack:
            node, k = stack.pop()
            if k == 0:
                if state[node] == 2:
                    continue
                state[node] = 1
            deps = [int(r) for r in refs[node] if r >= 0]
            if k < len(deps):
                stack.append((node, k + 1))
                dep = deps[k]
                if state[dep] == 1:
                    raise ValueError(f"reference cycle through atom {dep}")
                if state[dep] == 0:
                    stack.append((dep, 0))
                continue
            state[node] = 2
            order.append(node)
    return order


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def build_xyz(refs: np.ndarray, bonds: np.ndarray, angles: np.ndarray, dihedrals: np.ndarray) -> np.ndarray:
    """Cartesian ``(N, 3)`` coordinates from one set of internal coordinates (radians)."""
    refs = np.asarray(refs, dtype=np.int64)
    xyz = np.zeros((len(refs), 3))
    for i in build_order(refs):
        b, a, d = (int(r) for r in refs[i])
        r, theta, phi = float(bonds[i]), float(angles[i]), float(dihedrals[i])
        if b < 0:
            xyz[i] = 0.0
        elif a < 0:
            xyz[i] = xyz[b] + np.array([r, 0.0, 0.0])
        elif d < 0:
            u = _unit(xyz[a] - xyz[b])
            v = np.array([-u[1], u[0], 0.0])
            v = _unit(v) if np.linalg.norm(v) > 1e-12 else np.array([0.0, 1.0, 0.0])
            if v[1] < 0:
                v = -v
            xyz[i] = xyz[b] + r * (np.cos(theta) * u + np.sin(theta) * v)
        else:
            bc = _unit(xyz[b] - xyz[a])
            n = _unit(np.cross(xyz[a] - xyz[d], bc))
            m = np.cross(n, bc)
            local = np.array(
                [-r * np.cos(theta), r * np.sin(theta) * np.cos(phi), r * np.sin(theta) * np.sin(phi)]
            )
            xyz[i] = xyz[b] + local[0] * bc + local[1] * m + local[2] * n
    return xyz


def angle(x0: np.ndarray, x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
    """Angle ``x0-x1-x2`` at ``x1`` in radians, broadcasting over leading axes."""
    u, v = x0 - x1, x2 - x1
    cos = (u * v).sum(-1) / (np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1))
    return np.arccos(np.clip(cos, -1.0, 1.0))


def dihedral(x0: np.ndarray, x1: np.ndarray, x2: np.ndarray, x3: np.ndarray) -> np.ndarray:
    """IUPAC dihedral of ``(x0, x1, x2, x3)`` in radians (mdtraj's atan2 form)."""
    b1, b2, b3 = x1 - x0, x2 - x1, x3 - x2
    c1, c2 = np.cross(b2, b3), np.cross(b1, b2)
    y = (b1 * c1).sum(-1) * np.linalg.norm(b2, axis=-1)
    x = (c1 * c2).sum(-1)
    return np.arctan2(y, x)


def internal_coordinates(xyz: np.ndarray, refs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bonds, angles and dihedrals ``(..., N)`` of ``xyz`` ``(..., N, 3)`` (0 where unused)."""
    xyz = np.asarray(xyz, dtype=np.float64)
    refs = np.asarray(refs, dtype=np.int64)
    idx = np.where(refs >= 0, refs, np.arange(len(refs))[:, None])
    xb, xa, xd = (xyz[..., idx[:, k], :] for k in range(3))
    with np.errstate(invalid="ignore", divide="ignore"):
        bonds = np.where(refs[:, 0] >= 0, np.linalg.norm(xyz - xb, axis=-1), 0.0)
        angles = np.where(refs[:, 1] >= 0, angle(xyz, xb, xa), 0.0)
        dihedrals = np.where(refs[:, 2] >= 0, dihedral(xyz, xb, xa, xd), 0.0)
    return bonds, angles, dihedrals
