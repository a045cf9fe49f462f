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


# ------------------------------------------------------------ frame-tree definition
# The package's definition of degenerate inputs (docs/conventions.md, "Degenerate
# inputs"): frames are composed along the reference tree instead of being rebuilt
# from positions. Written with plain loops, independently of batched_nerf.
NONE, ANCHOR, PARENT, POSITIONS = 0, 1, 2, 3


def reference_frame_tree(refs: np.ndarray) -> dict[str, np.ndarray]:
    """Row classification (frame, parent, dihedral_ref, phi_from, flip_on), one row at a time."""
    refs = np.asarray(refs, dtype=np.int64).reshape(-1, 3)
    n = len(refs)
    kind = (refs >= 0).sum(1)
    out = {k: np.full(n, -1, dtype=np.int64) for k in ("parent", "dihedral_ref", "phi_from", "flip_on")}
    out["frame"] = np.full(n, NONE, dtype=np.int64)

    def sibling(j: int, d: int) -> bool:
        return bool(kind[d] == 3 and refs[d, 0] == refs[j, 0] and refs[d, 1] == refs[j, 1])

    for j in range(n):
        if kind[j] == 2:
            out["frame"][j], out["parent"][j] = ANCHOR, j
        if kind[j] != 3:
            continue
        b, a, d = (int(x) for x in refs[j])
        if sibling(j, d):
            out["phi_from"][j] = out["flip_on"][j] = d
        e = d
        while sibling(j, e):
            e = int(refs[e, 2])
        out["dihedral_ref"][j] = e
        if kind[b] >= 2 and refs[b, 0] == a and refs[b, 1] == e:
            out["frame"][j], out["parent"][j] = PARENT, b
        elif kind[e] == 2 and refs[e, 0] == b and refs[e, 1] == a:
            out["frame"][j], out["parent"][j] = ANCHOR, e
            if out["flip_on"][j] < 0:
                out["flip_on"][j] = e
        else:
            out["frame"][j] = POSITIONS
    return out


def _local_rotation(theta: float, phi: float) -> np.ndarray:
    """``L = R_x(phi) R_z(pi - theta)``, then ``R_x(pi)`` where ``sin(theta) < 0``."""
    ct, st, cp, sp = np.cos(theta), np.sin(theta), np.cos(phi), np.sin(phi)
    rx = np.array([[1.0, 0, 0], [0, cp, -sp], [0, sp, cp]])
    rz = np.array([[-ct, -st, 0], [st, -ct, 0], [0, 0, 1.0]])
    lr = rx @ rz
    return lr @ np.diag([1.0, -1.0, -1.0]) if st < 0 else lr


def _nerf_frame(xb: np.ndarray, xa: np.ndarray, xd: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """NeRF frame as columns, with zero axes where a direction collapses (|v| < eps: v / eps)."""
    e1 = xb - xa
    e1 = e1 / max(np.linalg.norm(e1), eps)
    e3 = np.cross(xa - xd, e1)
    e3 = e3 / max(np.linalg.norm(e3), eps)
    return np.stack([e1, np.cross(e3, e1), e3], axis=1)


def frames_to_cartesian(
    refs: np.ndarray,
    bonds: np.ndarray,
    angles: np.ndarray,
    dihedrals: np.ndarray,
    fixed: Sequence[int] = (),
    fixed_xyz: np.ndarray | None = None,
) -> np.ndarray:
    """The frame-tree definition, one conformation, float64: ``(N,) x 3 -> (N, 3)``.

    Negative bonds give NaN (outside the domain); zero bonds and angles of 0 or
    pi continue the frames smoothly.
    """
    refs = np.asarray(refs, dtype=np.int64).reshape(-1, 3)
    bonds, angles, dihedrals = (np.asarray(v, dtype=np.float64) for v in (bonds, angles, dihedrals))
    bonds = np.where(bonds < 0, np.nan, bonds)
    tree = reference_frame_tree(refs)
    n = len(refs)
    xyz = np.full((n, 3), np.nan)
    out_frame = np.full((n, 3, 3), np.nan)
    anchor = np.full((n, 3, 3), np.nan)
    phi_eff = np.zeros(n)
    fixed = [int(f) for f in fixed]
    for k, f in enumerate(fixed):
        xyz[f] = np.asarray(fixed_xyz, dtype=np.float64)[k]
    for i in topological_order(refs):
        if i in fixed:
            continue
        b, a, d = (int(x) for x in refs[i])
        if b < 0:
            xyz[i] = 0.0
            continue
        if a < 0:
            xyz[i] = [bonds[i], 0.0, 0.0]
            continue
        if d < 0:  # third seed: constant anchor at its bond reference, dihedral 0
            s = 1.0 if refs[b, 0] >= 0 else -1.0  # bond ref is the second seed: +1, the root: -1
            anchor[i] = np.diag([s, 1.0, s])
            m = anchor[i]
        else:
            p = dihedrals[i]
            if tree["phi_from"][i] >= 0:
                p += phi_eff[tree["phi_from"][i]]
            f = tree["flip_on"][i]
            if f >= 0 and np.sin(angles[f]) < 0:
                p += np.pi
            phi_eff[i] = p
            how = tree["frame"][i]
            if how == PARENT:
                m = out_frame[tree["parent"][i]]
            elif how == ANCHOR:
                m = anchor[tree["parent"][i]]
            else:
                m = _nerf_frame(xyz[b], xyz[a], xyz[tree["dihedral_ref"][i]])
        o = m @ _local_rotation(angles[i], phi_eff[i])
        out_frame[i] = o
        xyz[i] = xyz[b] + bonds[i] * o[:, 0]
    return xyz
