"""Adapters that time other internal -> Cartesian builders next to batched_nerf.

Every peer is optional.  A peer object exposes

* ``name`` (str), ``topologies`` (tuple of supported chain kinds),
* ``available`` (bool, imports the peer lazily on first access) and
  ``reason`` (``"unavailable: ..."`` when not available, else ``""``),
* ``notes`` (str): caveats worth printing next to the numbers,
* ``setup(n_atoms, batch, dtype, seed, topology)`` -> dict of zero-argument
  callables, ``{"forward": f, "forward_backward": g, ...}``.  Each callable
  runs one whole timed step and blocks until the result exists.  A key the
  peer cannot offer for that size is left out and explained in
  ``peer.skipped[key]``; one-off costs (JIT compiles) land in ``peer.info``.
* ``error_vs_float64(n_atoms, seed, topology)`` -> max |x - x_ref| in the
  input length unit, where x is the peer's float32 build (float64 for
  chemcoord, which has nothing else) and x_ref our float64 loop build of the
  same float32-rounded internal coordinates.  Peers that place the first
  atoms in another frame are compared after an optimal rigid (Kabsch) fit.

Conventions shared by all adapters: internal coordinates in radians (bonds
in any length unit), refs table ``(N, 3)`` with row ``i = (bond_ref,
angle_ref, dihedral_ref)`` and ``-1`` for none; first atom at the origin,
second on +x, third in the xy-plane with y > 0; the dihedral of atom ``i``
is the IUPAC dihedral of ``(x_d, x_a, x_b, x_i)`` computed with mdtraj's
atan2 formula (see :func:`dihedral`).

Peer code is never vendored: chemcoord and mp-nerf are imported from their
installed packages; NeRFax and bgflow from a checkout whose path is given
(``--nerfax PATH``, ``--bgflow PATH``) or from an installed package.

Run ``python benchmarks/peers.py --help`` for the side-by-side table.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import Step, fmt_seconds, measure
from benchmarks.workloads import chain_refs
from benchmarks.workloads import make_inputs as make_internal_coords

TOPOLOGIES = ("linear", "branched")


# --------------------------------------------------------------------------
# Chains, inputs and the reference loop
# --------------------------------------------------------------------------


def linear_refs(n_atoms: int) -> torch.Tensor:
    """Refs of a linear chain (torch): row i = (i-1, i-2, i-3), -1 where negative."""
    return torch.from_numpy(chain_refs(n_atoms))


def branched_refs(n_atoms: int) -> torch.Tensor:
    """A comb: every backbone atom from the third on carries one pendant.

    The pendant shares (bond, angle, dihedral) refs with the next backbone
    atom (like a hydrogen on a carbon chain), so about half the atoms are
    leaves and the dependency depth is about n_atoms / 2.
    """
    refs: list[tuple[int, int, int]] = []
    backbone: list[int] = []
    while len(refs) < n_atoms:
        last3 = (backbone[::-1] + [-1, -1, -1])[:3]
        refs.append((last3[0], last3[1], last3[2]))
        backbone.append(len(refs) - 1)
        if len(backbone) >= 3 and len(refs) < n_atoms:
            refs.append((backbone[-1], backbone[-2], backbone[-3]))
    return torch.tensor(refs, dtype=torch.long)


def make_refs(n_atoms: int, topology: str = "linear") -> torch.Tensor:
    if topology == "linear":
        return linear_refs(n_atoms)
    if topology == "branched":
        return branched_refs(n_atoms)
    raise ValueError(f"unknown topology {topology!r}; use one of {TOPOLOGIES}")


def dihedral(p0: torch.Tensor, p1: torch.Tensor, p2: torch.Tensor, p3: torch.Tensor) -> torch.Tensor:
    """IUPAC dihedral of p0-p1-p2-p3 with mdtraj's atan2 formula."""
    b1, b2, b3 = p1 - p0, p2 - p1, p3 - p2
    c12 = torch.linalg.cross(b1, b2)
    c23 = torch.linalg.cross(b2, b3)
    y = (b1 * c23).sum(-1) * b2.norm(dim=-1)
    x = (c12 * c23).sum(-1)
    return torch.atan2(y, x)


def bond_angle(p0: torch.Tensor, p1: torch.Tensor, p2: torch.Tensor) -> torch.Tensor:
    """Angle at p1 between p0 and p2."""
    u, v = p0 - p1, p2 - p1
    return torch.atan2(torch.linalg.cross(u, v).norm(dim=-1), (u * v).sum(-1))


def loop_build(
    bonds: torch.Tensor,
    angles: torch.Tensor,
    dihedrals: torch.Tensor,
    refs: torch.Tensor,
) -> torch.Tensor:
    """The plain per-atom PyTorch loop users write today (NeRF, not in place).

    bonds/angles/dihedrals: (B, N) radians; refs: (N, 3) int, -1 = none.
    Atoms are built in index order into a Python list and stacked at the end,
    so autograd sees no in-place writes.  Trig is precomputed in one shot.
    Returns (B, N, 3).
    """
    batch, n_atoms = bonds.shape
    like = {"dtype": bonds.dtype, "device": bonds.device}
    refs_list = refs.tolist()
    e_x = torch.tensor([1.0, 0.0, 0.0], **like)
    e_y = torch.tensor([0.0, 1.0, 0.0], **like)
    cos_a, sin_a = torch.cos(angles), torch.sin(angles)
    cos_d, sin_d = torch.cos(dihedrals), torch.sin(dihedrals)
    # per-atom columns, each (B, 1)
    r = bonds.unsqueeze(-1).unbind(1)
    ca, sa = cos_a.unsqueeze(-1).unbind(1), sin_a.unsqueeze(-1).unbind(1)
    cd, sd = cos_d.unsqueeze(-1).unbind(1), sin_d.unsqueeze(-1).unbind(1)
    zero = torch.zeros(batch, 1, **like)
    one = torch.ones(batch, 1, **like)
    pos: list[torch.Tensor] = []
    for i in range(n_atoms):
        ib, ia, id_ = refs_list[i]
        if ib < 0:
            pos.append(torch.zeros(batch, 3, **like))
            continue
        c = pos[ib]
        if ia < 0:
            pos.append(c + r[i] * e_x)
            continue
        b = pos[ia]
        if id_ < 0:
            # third atom: pseudo dihedral ref one unit along +y from the angle
            # ref, dihedral 0 -> lands in the xy-plane on the y > 0 side.
            a = b + e_y
            cdi, sdi = one, zero
        else:
            a = pos[id_]
            cdi, sdi = cd[i], sd[i]
        bc = c - b
        bc = bc / bc.norm(dim=-1, keepdim=True)
        n = torch.linalg.cross(b - a, bc)
        n = n / n.norm(dim=-1, keepdim=True)
        m = torch.linalg.cross(n, bc)
        rs = r[i] * sa[i]
        pos.append(c - (r[i] * ca[i]) * bc + (rs * cdi) * m + (rs * sdi) * n)
    return torch.stack(pos, dim=1)


def reference_build(n_atoms: int, seed: int = 0, topology: str = "linear"):
    """float64 loop build of the float32-rounded inputs: (refs, f32 inputs, xyz64 numpy (N, 3))."""
    refs = make_refs(n_atoms, topology)
    b32, a32, d32 = make_internal_coords(n_atoms, 1, torch.float32, seed)
    with torch.no_grad():
        ref = loop_build(b32.double(), a32.double(), d32.double(), refs)[0].numpy()
    return refs, (b32, a32, d32), ref


def kabsch_align(mobile: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Optimal proper rotation + translation of mobile (N, 3) onto ref, in float64."""
    mobile = np.asarray(mobile, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    mc, rc = mobile.mean(0), ref.mean(0)
    h = (mobile - mc).T @ (ref - rc)
    u, _, vt = np.linalg.svd(h)
    s = np.diag([1.0, 1.0, np.sign(np.linalg.det(vt.T @ u.T))])
    rot = vt.T @ s @ u.T
    return (mobile - mc) @ rot.T + rc


def max_error(xyz: np.ndarray, ref: np.ndarray, align: bool = False) -> float:
    xyz = np.asarray(xyz, dtype=np.float64)
    if align:
        xyz = kabsch_align(xyz, ref)
    return float(np.abs(xyz - ref).max())


def _cotangent(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Fixed random upstream gradient for forward+backward steps."""
    return np.random.default_rng(seed + 12345).standard_normal(shape)


# --------------------------------------------------------------------------
# Peer base class
# --------------------------------------------------------------------------


class Peer:
    name = "peer"
    topologies: tuple[str, ...] = ("linear",)
    notes = ""
    # True when batch B is just B independent calls (no batching in the peer):
    # the CLI then times batch 1 and reports B x that (``--no-extrapolate`` to run it).
    loops_over_batch = False

    def __init__(self) -> None:
        self._probed: tuple[bool, str] | None = None
        self.skipped: dict[str, str] = {}
        self.info: dict[str, float | str] = {}

    # availability -----------------------------------------------------
    def _probe(self) -> None:
        """Import what the peer needs; raise on failure."""

    def _check(self) -> tuple[bool, str]:
        if self._probed is None:
            try:
                self._probe()
                self._probed = (True, "")
            except Exception as exc:  # any import failure means unavailable
                self._probed = (False, f"unavailable: {type(exc).__name__}: {exc}")
        return self._probed

    @property
    def available(self) -> bool:
        return self._check()[0]

    @property
    def reason(self) -> str:
        return self._check()[1]

    def _require(self, topology: str) -> None:
        if not self.available:
            raise RuntimeError(f"{self.name}: {self.reason}")
        if topology not in self.topologies:
            raise ValueError(f"{self.name} supports only {self.topologies}, not {topology!r}")

    # interface ---------------------------------------------------------
    def setup(
        self,
        n_atoms: int,
        batch: int = 1,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        topology: str = "linear",
    ) -> dict[str, Step]:
        raise NotImplementedError

    def build_numpy(self, bonds, angles, dihedrals, refs) -> np.ndarray:
        """One chain (inputs (1, N) torch float32) -> (N, 3) numpy."""
        raise NotImplementedError

    align_for_error = False

    def error_vs_float64(self, n_atoms: int, seed: int = 0, topology: str = "linear") -> float:
        self._require(topology)
        refs, (b, a, d), ref = reference_build(n_atoms, seed, topology)
        b, a, d, ref = self._error_inputs(b, a, d, refs, ref)
        xyz = self.build_numpy(b, a, d, refs)
        return max_error(xyz, ref, align=self.align_for_error)

    def _error_inputs(self, b, a, d, refs, ref):
        return b, a, d, ref

    def __repr__(self) -> str:
        state = "available" if self.available else self.reason
        return f"<{type(self).__name__} {self.name}: {state}>"


# --------------------------------------------------------------------------
# 1. plain per-atom torch loop
# --------------------------------------------------------------------------


class TorchLoopPeer(Peer):
    name = "torch-loop"
    topologies = TOPOLOGIES
    notes = "per-atom Python loop, list + torch.stack (no in-place), batched over B"

    def setup(self, n_atoms, batch=1, dtype=torch.float32, seed=0, topology="linear"):
        self._require(topology)
        refs = make_refs(n_atoms, topology)
        b, a, d = make_internal_coords(n_atoms, batch, dtype, seed)
        w = torch.from_numpy(_cotangent((batch, n_atoms, 3), seed)).to(dtype)

        def forward():
            with torch.no_grad():
                return loop_build(b, a, d, refs)

        leaves = [t.clone().requires_grad_(True) for t in (b, a, d)]

        def forward_backward():
            for t in leaves:
                t.grad = None
            xyz = loop_build(*leaves, refs)
            (xyz * w).sum().backward()
            return leaves[2].grad

        return {"forward": forward, "forward_backward": forward_backward}

    def build_numpy(self, bonds, angles, dihedrals, refs):
        with torch.no_grad():
            return loop_build(bonds, angles, dihedrals, refs)[0].double().numpy()


# --------------------------------------------------------------------------
# 2. chemcoord (numba, float64, one molecule per call)
# --------------------------------------------------------------------------
# Sign convention (checked numerically by error_vs_float64): chemcoord's
# dihedral is the negative of the IUPAC/mdtraj dihedral, so the adapter
# passes -dihedral.  Angles and dihedrals are in degrees.  With the first
# three rows referencing chemcoord's absolute refs as below, chemcoord puts
# atom 0 at the origin, atom 1 on +x and atom 2 in the xy-plane (y > 0),
# i.e. exactly our frame, so no alignment is needed.


class ChemcoordPeer(Peer):
    name = "chemcoord"
    topologies = TOPOLOGIES
    notes = (
        "float64 only; no batching (batch B = B get_cartesian() calls); "
        "forward = Zmat.get_cartesian() (numba builder + pandas wrapping); "
        "forward_numba = the jitted transformation.get_X alone; "
        "forward_backward = get_cartesian + dense (3,N,N,3) get_grad_cartesian "
        "contracted with the cotangent (N <= 1024 only)"
    )
    max_grad_atoms = 1024
    loops_over_batch = True

    def _probe(self):
        import chemcoord  # noqa: F401

    @staticmethod
    def make_zmat(bonds: np.ndarray, angles: np.ndarray, dihedrals: np.ndarray, refs: np.ndarray):
        """A chemcoord Zmat for one molecule (radians in, IUPAC dihedrals)."""
        import chemcoord as cc
        import pandas as pd

        n = len(bonds)
        b_col: list[object] = []
        a_col: list[object] = []
        d_col: list[object] = []
        bond = np.asarray(bonds, dtype=np.float64).copy()
        angle = np.degrees(np.asarray(angles, dtype=np.float64))
        dih = -np.degrees(np.asarray(dihedrals, dtype=np.float64))  # chemcoord sign = -IUPAC
        for i, (ib, ia, id_) in enumerate(np.asarray(refs).tolist()):
            if ib < 0:  # at the origin
                b_col.append("origin")
                a_col.append("e_z")
                d_col.append("e_x")
                bond[i], angle[i], dih[i] = 0.0, 90.0, 0.0
            elif ia < 0:  # on +x from its bond ref (at the origin)
                b_col.append(ib)
                a_col.append("e_z")
                d_col.append("e_x")
                angle[i], dih[i] = 90.0, 0.0
            elif id_ < 0:  # in the xy-plane, cis to +y
                b_col.append(ib)
                a_col.append(ia)
                d_col.append("e_y")
                dih[i] = 0.0
            else:
                b_col.append(ib)
                a_col.append(ia)
                d_col.append(id_)
        frame = pd.DataFrame(
            {
                "atom": ["C"] * n,
                "b": pd.Series(b_col, dtype=object),
                "bond": bond,
                "a": pd.Series(a_col, dtype=object),
                "angle": angle,
                "d": pd.Series(d_col, dtype=object),
                "dihedral": dih,
            },
            index=range(n),
        )
        return cc.Zmat(frame)

    @staticmethod
    def xyz(cartesian) -> np.ndarray:
        return cartesian.loc[:, ["x", "y", "z"]].to_numpy(dtype=np.float64)

    def setup(self, n_atoms, batch=1, dtype=torch.float64, seed=0, topology="linear"):
        self._require(topology)
        from chemcoord._zmat_internal_coordinates import _zmat_transformation as transformation

        self.skipped = {}
        if dtype != torch.float64:
            self.info["dtype"] = "chemcoord computes in float64 whatever dtype is asked"
        refs = make_refs(n_atoms, topology).numpy()
        b, a, d = (t.double().numpy() for t in make_internal_coords(n_atoms, batch, torch.float64, seed))
        t0 = time.perf_counter()
        zmats = [self.make_zmat(b[k], a[k], d[k], refs) for k in range(batch)]
        self.info["zmat_construction_s"] = time.perf_counter() - t0
        # the raw numba builder inputs, as Zmat.get_cartesian prepares them
        cores = []
        for z in zmats:
            c = z.loc[:, ["bond", "angle", "dihedral"]].to_numpy(dtype=np.float64).T.copy()
            c[[1, 2], :] = np.radians(c[[1, 2], :])
            cores.append((c, z._extract_c_table()))
        w = _cotangent((batch, n_atoms, 3), seed)

        def forward():
            return [z.get_cartesian() for z in zmats]

        def forward_numba():
            return [transformation.get_X(c, ct) for c, ct in cores]

        steps = {"forward": forward, "forward_numba": forward_numba}

        if n_atoms <= self.max_grad_atoms:

            def forward_backward():
                grads = []
                for k, z in enumerate(zmats):
                    z.get_cartesian()
                    # jac[i, j, l, m] = d X[j, i] / d C[l, m] (degrees for angles)
                    jac = z.get_grad_cartesian(as_function=False, drop_auto_dummies=False)
                    grads.append(np.einsum("ji,ijlm->lm", w[k], jac))
                return grads

            steps["forward_backward"] = forward_backward
        else:
            self.skipped["forward_backward"] = (
                f"dense Jacobian is O(N^2) memory/time ({n_atoms} atoms > {self.max_grad_atoms})"
            )
        return steps

    def build_numpy(self, bonds, angles, dihedrals, refs):
        one = (t[0].double().numpy() for t in (bonds, angles, dihedrals))
        z = self.make_zmat(*one, refs.numpy())
        return self.xyz(z.get_cartesian())


# --------------------------------------------------------------------------
# 3. mp-nerf (EleutherAI), torch, per-residue loop, one protein per call
# --------------------------------------------------------------------------
# The chain of N atoms is read as a glycine-free backbone N-CA-C repeated
# L = ceil(N / 3) times (padded, extra atoms dropped).  mp-nerf's theta is
# the ordinary bond angle (it uses -cos(theta)), its chi the IUPAC dihedral.
# Its first residue uses built-in N-CA / CA-C bond lengths, so the error
# check feeds our reference those two lengths.  Residue r's angles_mask[:,
# r, 0] / bond_mask[r, 0] place the N of residue r + 1.


class MpNerfPeer(Peer):
    name = "mp-nerf"
    notes = (
        "protein_fold() on an N-CA-C backbone (N/3 residues, sidechain levels empty); "
        "no batching (batch B = B calls); bonds of atoms 1, 2 are mp-nerf constants"
    )
    loops_over_batch = True

    def _probe(self):
        import mp_nerf.proteins  # noqa: F401

    @staticmethod
    def _bb_lengths() -> tuple[float, float]:
        from mp_nerf.kb_proteins import BB_BUILD_INFO

        lens = BB_BUILD_INFO["BONDLENS"]
        return float(lens["n-ca"]), float(lens["ca-c"])

    @staticmethod
    def scaffolds(bonds: torch.Tensor, angles: torch.Tensor, dihedrals: torch.Tensor) -> dict:
        """mp-nerf scaffolds for one chain, built with differentiable ops.

        bonds/angles/dihedrals: (N,) one chain.
        """
        n = bonds.shape[0]
        n_res = -(-n // 3)
        pad = 3 * n_res - n + 3  # pad to whole residues plus one dummy residue
        like = {"dtype": bonds.dtype, "device": bonds.device}

        def padded(x, value):
            return torch.cat([x, torch.full((pad,), value, **like)]).view(n_res + 1, 3)

        bo, an, di = padded(bonds, 1.5), padded(angles, 1.9), padded(dihedrals, 0.0)
        zeros = torch.zeros(n_res, 11, **like)

        def mask(x):
            # column 0 of residue r places N of residue r + 1
            cols = [x[1:, 0], x[:-1, 1], x[:-1, 2]]
            return torch.cat([torch.stack(cols, dim=1), zeros], dim=1)

        cloud = torch.zeros(n_res, 14, dtype=torch.bool, device=bonds.device)
        cloud[:, :3] = True
        return {
            "cloud_mask": cloud,
            "point_ref_mask": torch.zeros(3, n_res, 11, dtype=torch.long, device=bonds.device),
            "angles_mask": torch.stack([mask(an), mask(di)]),
            "bond_mask": mask(bo),
        }

    @staticmethod
    def fold(scaffolds: dict, n_atoms: int) -> torch.Tensor:
        from mp_nerf.proteins import protein_fold

        coords, _ = protein_fold(**scaffolds, device=scaffolds["bond_mask"].device)
        return coords[:, :3].reshape(-1, 3)[:n_atoms]

    def setup(self, n_atoms, batch=1, dtype=torch.float32, seed=0, topology="linear"):
        self._require(topology)
        self.skipped = {}
        b, a, d = make_internal_coords(n_atoms, batch, dtype, seed)
        scaffolds = [self.scaffolds(b[k], a[k], d[k]) for k in range(batch)]
        w = torch.from_numpy(_cotangent((batch, n_atoms, 3), seed)).to(dtype)

        def forward():
            with torch.no_grad():
                return [self.fold(s, n_atoms) for s in scaffolds]

        steps = {"forward": forward}
        leaves = [t.clone().requires_grad_(True) for t in (b, a, d)]

        def forward_backward():
            for t in leaves:
                t.grad = None
            loss = 0.0
            for k in range(batch):
                s = self.scaffolds(leaves[0][k], leaves[1][k], leaves[2][k])
                loss = loss + (self.fold(s, n_atoms) * w[k]).sum()
            loss.backward()
            return leaves[2].grad

        try:  # mp-nerf chains rotations in place; check autograd copes
            small = self.setup_probe_backward(dtype)
        except RuntimeError as exc:  # mp-nerf 1.0.3: mp_nerf_torch does `rotate /= norm(rotate)`
            small = str(exc).split(":")[0] + " (mp_nerf_torch normalises `rotate` in place)"
        if small is None:
            steps["forward_backward"] = forward_backward
        else:
            self.skipped["forward_backward"] = f"autograd fails through protein_fold: {small}"
        return steps

    def setup_probe_backward(self, dtype) -> str | None:
        b, a, d = (t[0].clone().requires_grad_(True) for t in make_internal_coords(12, 1, dtype, 0))
        self.fold(self.scaffolds(b, a, d), 12).sum().backward()
        return None

    def _error_inputs(self, b, a, d, refs, ref):
        n_ca, ca_c = self._bb_lengths()
        b = b.clone()
        b[0, 1], b[0, 2] = n_ca, ca_c
        with torch.no_grad():
            ref = loop_build(b.double(), a.double(), d.double(), refs)[0].numpy()
        return b, a, d, ref

    def build_numpy(self, bonds, angles, dihedrals, refs):
        with torch.no_grad():
            xyz = self.fold(self.scaffolds(bonds[0], angles[0], dihedrals[0]), bonds.shape[1])
        return xyz.double().numpy()


# --------------------------------------------------------------------------
# 4. NeRFax (JAX), from a checkout: --nerfax PATH
# --------------------------------------------------------------------------
# reconstruct_from_internal_coordinates(l, theta, chi, mode) takes (R, 3)
# arrays (3 atoms per "residue"; the chain is padded to a multiple of 3 for
# the residue-wise modes).  theta is the SUPPLEMENT of the bond angle
# (sidechainnet convention: theta = pi - angle); chi is the IUPAC dihedral.
# The first atoms hang off ghost atoms, so its frame differs from ours:
# compare after a Kabsch fit.  Batches use jax.vmap; everything is jitted.


def _put_on_path(path: str | None) -> None:
    if path and path not in sys.path:
        sys.path.insert(0, path)


class NerfaxPeer(Peer):
    modes = ("associative", "sequential", "fully_sequential")
    align_for_error = True

    def __init__(self, mode: str = "associative", path: str | None = None) -> None:
        super().__init__()
        if mode not in ("associative", "sequential", "fully_sequential", "associative_work_inefficient"):
            raise ValueError(f"unknown NeRFax mode {mode!r}")
        self.mode = mode
        self.path = path
        self.name = f"nerfax-{mode}"
        self.notes = (
            f"JAX {mode} mode, jit(vmap(...)), block_until_ready; compile time excluded "
            "(see info['compile_*_s']); forward_backward = jit(grad(sum(x * w)))"
        )

    def _probe(self):
        _put_on_path(self.path)
        import jax  # noqa: F401

        importlib.import_module("nerfax.reconstruct")

    def _inputs(self, b, a, d):
        """torch (B, N) -> NeRFax (B, R, 3) float32 numpy (padded)."""
        batch, n = b.shape
        b, a, d = (t.double().numpy().copy() for t in (b, a, d))
        theta = np.pi - a
        # ghost-relative placement of atoms 0..2: any non-degenerate values
        b[:, 0] = 1.5
        theta[:, :2] = 1.0
        d[:, :3] = np.pi / 2
        pad = (-n) % 3 if self.mode != "fully_sequential" else 0

        def shaped(x, value):
            x = np.concatenate([x, np.full((batch, pad), value)], axis=1)
            return x.reshape(batch, -1, 3) if self.mode != "fully_sequential" else x

        return shaped(b, 1.5), shaped(theta, 1.2), shaped(d, 0.0)

    def _fns(self, n_atoms: int, dtype: torch.dtype):
        import jax
        import jax.numpy as jnp
        from nerfax.reconstruct import reconstruct_from_internal_coordinates

        if dtype == torch.float64:
            jax.config.update("jax_enable_x64", True)  # global JAX switch
        elif dtype != torch.float32:
            raise ValueError("NeRFax adapter supports float32 (and float64 with x64)")
        build = partial(reconstruct_from_internal_coordinates, mode=self.mode)

        def one(l, t, c):
            return build(l, t, c).reshape(-1, 3)[:n_atoms]

        batched = jax.vmap(one)

        def loss(l, t, c, w):
            return jnp.sum(batched(l, t, c) * w)

        return jax.jit(batched), jax.jit(jax.grad(loss, argnums=(0, 1, 2))), jnp

    def setup(self, n_atoms, batch=1, dtype=torch.float32, seed=0, topology="linear"):
        self._require(topology)
        import jax

        self.skipped = {}
        fwd, grad, jnp = self._fns(n_atoms, dtype)
        np_dtype = np.float64 if dtype == torch.float64 else np.float32
        raw = self._inputs(*make_internal_coords(n_atoms, batch, dtype, seed))
        ins = [jnp.asarray(x.astype(np_dtype)) for x in raw]
        w = jnp.asarray(_cotangent((batch, n_atoms, 3), seed).astype(np_dtype))
        t0 = time.perf_counter()
        jax.block_until_ready(fwd(*ins))
        self.info["compile_forward_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        jax.block_until_ready(grad(*ins, w))
        self.info["compile_forward_backward_s"] = time.perf_counter() - t0

        def forward():
            return jax.block_until_ready(fwd(*ins))

        def forward_backward():
            return jax.block_until_ready(grad(*ins, w))

        return {"forward": forward, "forward_backward": forward_backward}

    def build_numpy(self, bonds, angles, dihedrals, refs):
        n = bonds.shape[1]
        fwd, _, jnp = self._fns(n, torch.float32)
        ins = [jnp.asarray(x.astype(np.float32)) for x in self._inputs(bonds, angles, dihedrals)]
        return np.asarray(fwd(*ins))[0].astype(np.float64)


# --------------------------------------------------------------------------
# 5. bgflow (noegroup), torch, from a checkout: --bgflow PATH
# --------------------------------------------------------------------------
# Not on PyPI.  GlobalInternalCoordinateTransformation(inverse=True) builds
# the molecule in dependency blocks (all atoms whose refs exist are placed
# at once), batched, and also returns log|det J| (extra work it always
# does).  Its z-matrix rows are [atom, bond_ref, angle_ref, torsion_ref];
# its angles are bond angles and its torsions IUPAC dihedrals (radians
# with normalize_angles=False).  The first three atoms are placed from
# (x0, Euler angles), so compare after a Kabsch fit.  bgflow still uses
# np.infty, removed in NumPy 2: the adapter sets np.infty = np.inf before
# importing it.


class BgflowPeer(Peer):
    name = "bgflow"
    topologies = TOPOLOGIES
    align_for_error = True
    notes = (
        "GlobalInternalCoordinateTransformation inverse (block-parallel, batched torch, "
        "also computes log|det J|); needs np.infty shim on NumPy 2"
    )

    def __init__(self, path: str | None = None) -> None:
        super().__init__()
        self.path = path

    def _probe(self):
        _put_on_path(self.path)
        if not hasattr(np, "infty"):
            setattr(np, "infty", np.inf)  # noqa: B010 - bgflow predates NumPy 2
        importlib.import_module("bgflow.nn.flow.crd_transform.ic")

    def _transform(self, refs: torch.Tensor):
        ic = importlib.import_module("bgflow.nn.flow.crd_transform.ic")
        idx = torch.arange(len(refs)).unsqueeze(1)
        z = torch.cat([idx, refs], dim=1).numpy()
        return ic.GlobalInternalCoordinateTransformation(
            z, normalize_angles=False, enforce_boundaries=False, raise_warnings=False
        ), z

    @staticmethod
    def _split(z, bonds, angles, dihedrals):
        rel = z[(z[:, 1:] >= 0).all(axis=1), 0]  # atoms with all three refs, z order
        b = torch.cat([bonds[:, 1:3], bonds[:, rel]], dim=1)
        a = torch.cat([angles[:, 2:3], angles[:, rel]], dim=1)
        return b, a, dihedrals[:, rel]

    def setup(self, n_atoms, batch=1, dtype=torch.float32, seed=0, topology="linear"):
        self._require(topology)
        self.skipped = {}
        refs = make_refs(n_atoms, topology)
        tr, z = self._transform(refs)
        tr = tr.to(dtype)
        b, a, d = self._split(z, *make_internal_coords(n_atoms, batch, dtype, seed))
        x0 = torch.zeros(batch, 1, 3, dtype=dtype)
        rot = torch.zeros(batch, 3, dtype=dtype)
        w = torch.from_numpy(_cotangent((batch, 3 * n_atoms), seed)).to(dtype)

        def forward():
            with torch.no_grad():
                return tr(b, a, d, x0, rot, inverse=True)[0]

        leaves = [t.clone().requires_grad_(True) for t in (b, a, d)]

        def forward_backward():
            for t in leaves:
                t.grad = None
            xyz, _ = tr(*leaves, x0, rot, inverse=True)
            (xyz * w).sum().backward()
            return leaves[2].grad

        return {"forward": forward, "forward_backward": forward_backward}

    def build_numpy(self, bonds, angles, dihedrals, refs):
        tr, z = self._transform(refs)
        b, a, d = self._split(z, bonds, angles, dihedrals)
        x0 = torch.zeros(1, 1, 3, dtype=bonds.dtype)
        rot = torch.zeros(1, 3, dtype=bonds.dtype)
        with torch.no_grad():
            xyz, _ = tr.to(bonds.dtype)(b, a, d, x0, rot, inverse=True)
        return xyz.view(-1, 3).double().numpy()


# --------------------------------------------------------------------------
# Registry, timing, CLI
# --------------------------------------------------------------------------


def get_peers(nerfax_path: str | None = None, bgflow_path: str | None = None) -> list[Peer]:
    """All peers; cheap to call (imports happen on first ``.available``)."""
    peers: list[Peer] = [TorchLoopPeer(), ChemcoordPeer(), MpNerfPeer()]
    peers += [NerfaxPeer(mode, nerfax_path) for mode in NerfaxPeer.modes]
    peers.append(BgflowPeer(bgflow_path))
    return peers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nerfax", metavar="PATH", help="NeRFax checkout (put on sys.path)")
    parser.add_argument("--bgflow", metavar="PATH", help="bgflow checkout (put on sys.path)")
    parser.add_argument("--peers", nargs="*", help="only these peer names")
    parser.add_argument("--sizes", nargs="*", type=int, default=[512, 4096])
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 256])
    parser.add_argument("--topology", choices=TOPOLOGIES, default="linear")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--error-atoms", type=int, default=512)
    parser.add_argument(
        "--no-extrapolate",
        dest="extrapolate",
        action="store_false",
        help="really run B calls for peers without batching (default: B x the B=1 time)",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    peers = get_peers(args.nerfax, args.bgflow)
    if args.peers:
        peers = [p for p in peers if p.name in args.peers]
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, dtype {args.dtype}, "
        f"topology {args.topology}"
    )
    print("| peer | N | B | forward | forward+backward | extra |")
    print("|---|---:|---:|---:|---:|---|")
    errors: dict[str, str] = {}
    for peer in peers:
        if not peer.available:
            print(f"| {peer.name} | | | {peer.reason} | | |")
            continue
        if args.topology not in peer.topologies:
            print(f"| {peer.name} | | | unsupported topology | | |")
            continue
        for n in args.sizes:
            single: dict[str, float] = {}
            for batch in args.batches:
                scale = 1
                if peer.loops_over_batch and args.extrapolate and batch > 1 and single:
                    row, scale = dict(single), batch
                else:
                    steps = peer.setup(n, batch, dtype, 0, args.topology)
                    row = {
                        k: measure(f, repeats=args.repeats, budget_s=args.budget)[0] for k, f in steps.items()
                    }
                    if batch == 1:
                        single = dict(row)
                mark = f" (= {batch} x B=1)" if scale > 1 else ""
                extra = [
                    f"{k} {fmt_seconds(v * scale)}"
                    for k, v in row.items()
                    if k not in ("forward", "forward_backward")
                ]
                extra += [f"{k}: {v}" for k, v in peer.skipped.items()]
                extra += [f"{k} {v:.2f} s" for k, v in peer.info.items() if isinstance(v, float)]
                fwd, fb = row.get("forward"), row.get("forward_backward")
                print(
                    f"| {peer.name} | {n} | {batch} | {fmt_seconds(fwd and fwd * scale)}{mark} | "
                    f"{fmt_seconds(fb and fb * scale)}{mark if fb else ''} | {'; '.join(extra)} |",
                    flush=True,
                )
        try:
            errors[peer.name] = f"{peer.error_vs_float64(args.error_atoms, topology=args.topology):.2e}"
        except Exception as exc:  # report, keep going
            errors[peer.name] = f"failed: {exc}"
    print(f"\nmax |x - x_float64_loop| for N={args.error_atoms} ({args.topology}):")
    for name, err in errors.items():
        print(f"  {name}: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
