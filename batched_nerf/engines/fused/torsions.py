"""The fused CPU build of a table with fixed bonds and angles from its torsions alone, bound once.

Protein builders call [`batched_nerf.to_cartesian`][batched_nerf.to_cartesian] with the same ideal
bonds and angles on every step and only the torsions new: the dihedrals are a
template with some rows replaced, ``dihedrals[j] = cat([template, values])[source[j]]``.
Through the general path each call checks, broadcasts and gathers its inputs
in torch and then re-derives the plan (about 150 Python calls around an 8 us
kernel for a 10-residue chain). A `TorsionBuild` is made once per table
and layout of the values: it holds the fused plan, the bonds, angles and template
dihedrals as numpy arrays per batch size (within the process's one byte budget over all of
them), and the ``source`` split into the template rows and the rows that read a
value. A call is one gather of the values (numpy for small calls, torch for large
ones), the ``cos``/``sin`` loop and the build kernel (`cpu`).

Derivatives: `TORSION_BUILD` (a `KernelOp`; its node `TorsionFn`) runs the forward
kernel and, for a first-order backward, the backward kernel, whose dihedral
gradients it reads back into the values' columns (each value feeds at most one row: a gather, not a scatter).
Under ``create_graph=True`` its backward goes through `build.FUSED_VJP`
on the torch gather of the values, which is differentiable to any order.
Forward mode, ``torch.func`` transforms and ``torch.compile`` never take this
path: `serves` says no and the caller takes the general one.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...runtime import gate
from ...runtime.state import (
    LOCK,
    budget,
    idle_bytes,
    keep_idle,
    register_pool,
    release_idle,
    touch_idle,
)
from ..backends import available, require
from ..function import KernelOp
from . import workspace
from .build import FUSED_VJP, NO_TURNS, FusedPlan, Turns, with_turns

__all__ = ["POOL", "TORSION_BUILD", "TorsionBuild", "TorsionFn", "kept_bytes", "serves"]

#: The pool's name in the ledger of idle arrays (`runtime.state.keep_idle`) and in
#: `batched_nerf.cache_info`: the broadcast bonds, angles and template arrays of the `TorsionBuild`
#: objects, under the process's one byte budget (least recently used dropped first); a call needing
#: more than a quarter of the budget makes its own.
POOL = "torsion_arrays"
#: Up to this many dihedrals per call the values are gathered in numpy, above with torch.
SMALL_VALUES = 1 << 16


def kept_bytes() -> int:
    """Bytes of the arrays the `TorsionBuild` objects keep now (within the ledger's budget)."""
    with LOCK:
        return idle_bytes(POOL)


def _release() -> None:
    """Drop every kept array now (made again on next use)."""
    with LOCK:
        release_idle(POOL)


register_pool(POOL, kept_bytes, _release)


def _drop_arrays(ref: weakref.ref, key: tuple[Any, ...]) -> None:
    """Let the build behind ``ref`` go of its arrays of ``key`` (called by the ledger, under its lock)."""
    build = ref()
    if build is not None:
        build.__dict__.get("_arrays", {}).pop(key, None)


def serves(values: Tensor) -> bool:
    """Whether a `TorsionBuild` can take ``values``: a non-empty CPU float32/float64 tensor, numba
    installed, no ``torch.func`` transform, forward-mode level or ``torch.compile`` trace active (an
    empty batch goes the general way, which serves it)."""
    return values.numel() > 0 and gate.bound_inputs(values) and available("cpu")


class TorsionBuild:
    """One table's fused CPU build with fixed ``bonds``, ``angles`` and template dihedrals.

    Args:
        plan: the table's `FusedPlan`.
        bonds, angles, template: ``(N,)`` float64 (A, radians, radians).
        source: ``(N,)`` int: row ``j``'s dihedral is ``template[j]`` where
            ``source[j] < N`` (then ``source[j] == j``), else value ``source[j] - N``.
        n_values: ``K``, the values per sample.
        atoms: ``(N,)`` distinct positions of the table's atoms in an output of
            ``n_out`` positions (a padded layout: the kernels write each atom there,
            the other positions are zeros); default the table's own order.

    Raises:
        ValueError: a template row reading another row's template, or a value read
            by two rows (the backward reads gradients back by a gather).
    """

    def __init__(
        self,
        plan: FusedPlan,
        bonds: np.ndarray,
        angles: np.ndarray,
        template: np.ndarray,
        source: np.ndarray,
        n_values: int,
        atoms: np.ndarray | None = None,
        n_out: int | None = None,
    ) -> None:
        n = template.shape[0]
        source = np.asarray(source, dtype=np.int64)
        own = source < n
        if (source[own] != np.arange(n)[own]).any():
            raise ValueError("a template row must read its own template value")
        self.rows = np.flatnonzero(~own)  # (R,) rows reading a value
        self.slots = source[self.rows] - n  # (R,) the value each reads
        if self.slots.size and np.bincount(self.slots).max() > 1:  # O(R): a new batch makes one
            raise ValueError("each value may be read by one row at most")
        self.plan, self.n_atoms, self.n_values = plan, n, int(n_values)
        self.kernel_plan, self.n_out, self.atoms = plan, n, None
        self.pad = np.empty(0, dtype=np.int64)  # output positions of no atom
        values = {"bonds": bonds, "angles": angles, "template": template}
        out_rows = self.rows
        if atoms is not None:  # the kernels read and write the padded layout: remap the atom rows
            self.atoms, self.n_out = np.asarray(atoms, dtype=np.int64), int(n_out or n)
            index = plan.index.copy()
            index[0] = self.atoms[index[0]]
            index[7] = np.where(index[7] >= 0, self.atoms[np.maximum(index[7], 0)], -1)  # FLIP_ON: an atom
            self.kernel_plan = replace(plan, index=index, _reference={}, _configured={})
            taken = np.zeros(self.n_out, dtype=bool)
            taken[self.atoms] = True
            self.pad = np.flatnonzero(~taken)
            out_rows = self.atoms[self.rows]
            for k, v in values.items():
                values[k] = np.zeros(self.n_out)
                values[k][self.atoms] = v
        self.out_rows = out_rows  # (R,) positions of the rows reading a value in the output
        self._values = values
        self._table = {"bonds": bonds, "angles": angles, "template": template}
        self._torch: dict[Any, tuple[Tensor, ...]] = {}

    @classmethod
    def padded(
        cls,
        kernel_plan: FusedPlan,
        parts: Sequence[tuple[np.ndarray, np.ndarray]],
        slots: np.ndarray,
        n_values: int,
        stride: int,
        table_plan: Callable[[], FusedPlan],
    ) -> TorsionBuild:
        """The build of a packed table writing part ``k``'s atom ``j`` at position ``k * stride + j``,
        assembled from its parts' arrays (no per-atom work but the padded value arrays).

        Equal to ``TorsionBuild(plan, ..., atoms=..., n_out=len(parts) * stride)`` of the packed
        table. Its own plan (``table_plan()``, read only by a ``create_graph`` backward), its
        ``atoms`` and the table-layout values are made on first use.

        Args:
            kernel_plan: the packed table's plan in that layout
                (`batched_nerf.engines.compose.compose_padded`, configured).
            parts: per part, its ``(3, N_k)`` float64 bonds, angles and template dihedrals and
                the ``(R_k,)`` ascending atoms of the part that read a value.
            slots: ``(R,)`` the value each of those atoms reads, parts in order (each read once).
            n_values: ``K``, the values per sample.
            stride: output positions per part (at least its atoms).
            table_plan: makes the packed table's own (configured) fused plan.
        """
        tb = cls.__new__(cls)
        sizes = np.array([values.shape[1] for values, _ in parts], dtype=np.int64)
        first = np.cumsum(sizes) - sizes
        tb.n_atoms, tb.n_values, tb.n_out = int(sizes.sum()), int(n_values), len(parts) * stride
        tb.kernel_plan, tb.slots = kernel_plan, np.asarray(slots, dtype=np.int64)
        tb.rows = np.concatenate([rows + f for (_, rows), f in zip(parts, first)])
        tb.out_rows = np.concatenate([rows + k * stride for k, (_, rows) in enumerate(parts)])
        values, taken = np.zeros((3, tb.n_out)), np.zeros(tb.n_out, dtype=bool)
        for k, (v, _) in enumerate(parts):
            values[:, k * stride : k * stride + v.shape[1]] = v
            taken[k * stride : k * stride + v.shape[1]] = True
        tb._values = dict(zip(("bonds", "angles", "template"), values))
        tb.pad = np.flatnonzero(~taken)
        tb._torch = {}

        # made on first use, from the build itself (no closure over it: no reference cycle)
        tb._lazy = {
            "plan": lambda _: table_plan(),
            "atoms": functools.partial(_padded_atoms, sizes.tolist(), stride),
            "_table": lambda self: {k: v[self.atoms] for k, v in self._values.items()},
        }
        return tb

    def __getattr__(self, name: str) -> Any:
        """An attribute that `padded` leaves to first use, made now."""
        make = self.__dict__.get("_lazy", {}).get(name)
        if make is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = self.__dict__[name] = make(self)
        return value

    def arrays(self, dtype: np.dtype, m: int) -> tuple[np.ndarray, ...]:
        """``(bonds, angles)`` ``(m, n_out)`` of ``dtype``, ``fixed`` ``(m, 0, 3)`` and the template
        dihedrals ``(m, n_out)`` (read, never written), kept within the one byte budget over every
        table (a training loop over thousands of sequences keeps only the recent ones)."""
        mine = self.__dict__.setdefault("_arrays", {})
        kept = mine.get((dtype, m))
        if kept is not None:
            with LOCK:
                touch_idle((POOL, id(self), dtype, m))
            return kept
        bonds, angles, template = (
            np.tile(self._values[k].astype(dtype), (m, 1))  # writeable: numba compiles read-only arrays anew
            for k in ("bonds", "angles", "template")
        )
        kept = (bonds, angles, np.empty((m, 0, 3), dtype=dtype), template)
        if 3 * bonds.nbytes <= budget() // 4:
            drop = functools.partial(_drop_arrays, weakref.ref(self), (dtype, m))
            with LOCK:
                mine[(dtype, m)] = kept
                keep_idle((POOL, id(self), dtype, m), POOL, 3 * bonds.nbytes, drop, holder=self)
        return kept

    def dihedrals(self, parts: tuple[Tensor, ...], m: int, out: np.ndarray | None = None) -> np.ndarray:
        """``(m, n_out)`` dihedrals (numpy, the parts' dtype): the template with each value row's value.

        Small calls gather in numpy (fewer dispatches), large ones with one torch ``index_select`` (on
        torch's threads) into ``out`` (``m n_out`` values of that dtype) where given;
        nothing is recorded for autograd.
        """
        if m * self.n_out <= SMALL_VALUES:
            values = np.concatenate([x.detach().numpy().reshape(m, -1) for x in parts], axis=1)
            d = self.arrays(values.dtype, m)[3].copy()
            d[:, self.out_rows] = values[:, self.slots]
            return d
        template, source = self.torch_inputs(parts[0].dtype, out=True)[2:4]
        with torch.no_grad():
            cat = torch.cat([template.expand(m, self.n_out), *(x.reshape(m, -1) for x in parts)], dim=-1)
            if out is None:
                return cat.index_select(-1, source).numpy()
            d = out.reshape(m, self.n_out)
            torch.index_select(cat, -1, source, out=torch.from_numpy(d))
            return d

    def __call__(self, *parts: Tensor, batch: tuple[int, ...] | None = None) -> Tensor:
        """Cartesian coordinates ``(*batch, n_out, 3)`` of the values, given in parts of one dtype and
        batch shape ``batch`` (default all but the first part's last dimension) whose other dimensions
        hold ``K`` values together, in order (radians); differentiable. Call only where
        `serves` holds.

        `TORSION_BUILD` routes the call (`KernelOp.call_bound`: `serves` passed the gate) with its work
        buffers (`_trig_buffers`): the dihedrals are scratch (read by the trig pass) in a borrowed
        workspace buffer; the trig array is borrowed too, or leased to the graph where it is kept for
        the backward (`workspace`).

        Example:
            >>> import torch, batched_nerf as bn
            >>> t = bn.protein.protein_table("GA")
            >>> phi, psi = torch.zeros(2), torch.zeros(2)
            >>> bn.protein.build("GA", phi, psi).xyz.shape  # through a TorsionBuild of t
            torch.Size([10, 3])
        """
        if batch is None:
            batch = tuple(parts[0].shape[:-1])
        return TORSION_BUILD.call_bound(*parts, self, NO_TURNS).view(*batch, self.n_out, 3)

    def forward(self, dtype: np.dtype, cs: np.ndarray) -> np.ndarray:
        """``(m, n_out, 3)`` positions of ``dtype`` from the ``(4, m, n_out)`` trig array of angles and
        dihedrals (`build.trig`); zeros where no atom is."""
        bonds, _, fixed, _ = self.arrays(dtype, cs.shape[1])
        plan, kernels = self.kernel_plan, require("cpu")
        pose = kernels.pose.identity_rows(plan.topology.seed_root.size)
        # fresh zeroed pages (calloc) cost no more than an empty array
        out = np.zeros((cs.shape[1], self.n_out, 3), dtype=dtype) if self.pad.size else None
        return kernels.forward(plan.index, plan.starts, bonds, cs, fixed, pose, plan.width, plan.reach, out)

    def backward(self, cs: np.ndarray, g: Tensor, dtype: np.dtype) -> np.ndarray:
        """``(m, K)`` gradient of ``sum(g * xyz)`` with respect to the values (first order, numpy). The
        kernel's per-atom gradients are scratch, read here: they go into a borrowed workspace buffer."""
        m = cs.shape[1]
        bonds, _, fixed, _ = self.arrays(dtype, m)
        plan = self.kernel_plan
        pose = require("cpu").pose.identity_rows(plan.topology.seed_root.size)
        g = g.detach().reshape(m, self.n_out, 3)
        size = m * self.n_out
        with workspace.borrowed(plan.topology, 6 * size, dtype) as scratch:
            out = gx = None
            if scratch is not None:  # the kernel's gradients, and the cotangent where it needs a copy
                out = tuple(scratch[: 3 * size].reshape(3, m, self.n_out))
                if not (g.is_contiguous() and g.dtype == _TORCH[dtype]):  # e.g. expanded by a sum
                    gx = scratch[3 * size :].reshape(m, self.n_out, 3)
                    np.copyto(gx, g.numpy())
            if gx is None:
                gx = g.contiguous().numpy().astype(dtype, copy=False)
            _, _, gd, _, _ = require("cpu").backward(
                plan.index, plan.starts, bonds, cs, fixed, pose, gx, plan.width, False, out
            )
            gv = np.zeros((m, self.n_values), dtype=gd.dtype)
            gv[:, self.slots] = gd[:, self.out_rows]
        return gv

    def torch_inputs(self, dtype: torch.dtype, out: bool = False) -> tuple[Tensor, ...]:
        """``(bonds, angles, template, source)``, ``slots``, ``rows`` and ``atoms`` as plain CPU tensors,
        made once per dtype: of the table (``(N,)``; ``atoms`` the output position of each atom, None
        without a layout) for the differentiable backward, or of the output layout (``out``,
        ``(n_out,)``) for the gather of the values."""
        key = (dtype, out)
        kept = self._torch.get(key)
        if kept is None:
            v, n, rows = (
                (self._values, self.n_out, self.out_rows) if out else (self._table, self.n_atoms, self.rows)
            )
            source = np.arange(n)
            source[rows] = n + self.slots
            with torch.inference_mode(False), torch.no_grad():
                kept = tuple(torch.tensor(v[k], dtype=dtype) for k in ("bonds", "angles", "template"))
                kept += (torch.from_numpy(source), torch.from_numpy(self.slots), torch.from_numpy(rows))
                kept += (None if self.atoms is None else torch.from_numpy(self.atoms),)
            self._torch[key] = kept
        return kept


def _padded_atoms(sizes: list[int], stride: int, _: TorsionBuild) -> np.ndarray:
    """``(N,)`` output position of each atom of `TorsionBuild.padded`'s parts."""
    return np.concatenate([np.arange(n) + k * stride for k, n in enumerate(sizes)])


def _split(flat: Any, parts: tuple[Tensor, ...]) -> list[Tensor]:
    """``(m, K)`` gradients (numpy or torch) -> one per part, of its shape (numpy: each copied out
    whole, then wrapped)."""
    out, at = [], 0
    for x in parts:
        k = x.numel() // flat.shape[0]
        g = flat[:, at : at + k]
        if isinstance(g, np.ndarray):
            out.append(torch.from_numpy(np.ascontiguousarray(g).reshape(x.shape)))
        else:
            out.append(g.reshape(x.shape))
        at += k
    return out


def _trig_buffers(keep: bool, args: tuple[Any, ...], use: Callable[..., Tensor]) -> Tensor:
    """`TORSION_BUILD`'s work buffers (`KernelOp`'s ``buffers``): the dihedrals (scratch, read by the
    trig pass) borrowed for the call; the trig array kept for the backward (``keep``: leased from the
    table's workspace to the graph) or borrowed too."""
    parts, tb = args[:-2], args[-2]
    n = 0
    for x in parts:  # a loop, not sum(...): this runs on every call
        n += x.numel()
    m = n // tb.n_values
    owner, dtype = tb.kernel_plan.topology, _NP[parts[0].dtype]
    with workspace.borrowed(owner, m * tb.n_out, dtype) as scratch:
        d = tb.dihedrals(parts, m, scratch)
        return with_turns(keep, owner, tb.arrays(dtype, m)[1], d, use, args)


def _torsion_kernel(*args: Any) -> Tensor:
    """``(*parts, tb, turns)`` -> ``(m, n_out, 3)``: the forward kernel on the kept trig array."""
    tb, turns = args[-2:]
    return torch.from_numpy(tb.forward(_NP[args[0].dtype], turns.cs))


def _torsion_vjp(
    parts: tuple[Tensor, ...], grads: tuple[Tensor], tb: TorsionBuild, turns: Turns
) -> list[Tensor]:
    """Gradients of the values ``parts``: the backward kernel for a first-order backward, else (under
    ``create_graph=True``) the torch gather of the values and `build.FUSED_VJP`, both differentiable."""
    (g,) = grads
    dtype = parts[0].dtype
    if not torch.is_grad_enabled():
        return _split(tb.backward(turns.cs, g, _NP[dtype]), parts)
    bonds, angles, template, source, slots, rows, atoms = tb.torch_inputs(dtype)
    m, n = turns.cs.shape[1], tb.n_atoms
    values = torch.cat([x.reshape(m, -1) for x in parts], dim=-1)
    d = torch.cat([template.expand(m, n), values], dim=-1).index_select(-1, source)
    b, a = bonds.expand(m, n).contiguous(), angles.expand(m, n).contiguous()
    f = values.new_zeros((m, 0, 3))
    g = g.reshape(m, tb.n_out, 3).to(dtype)
    if atoms is not None:  # the kept trig array is of the output layout: the table's is made anew
        g, turns = g.index_select(1, atoms), Turns(None)
    gd = FUSED_VJP.apply(b, a, d, f, None, None, g, tb.plan, turns)[2]
    gv = gd.new_zeros((m, tb.n_values)).index_copy(-1, slots, gd.index_select(-1, rows))
    return _split(gv, parts)


#: ``(*parts, tb, turns)`` -> ``(m, n_out, 3)`` positions of a `TorsionBuild` from the values' trig
#: array (``turns``: `NO_TURNS` in a call, `_trig_buffers` makes it). No reference: forward mode and
#: ``torch.func`` never take this path (`serves`).
TORSION_BUILD = KernelOp(
    "TorsionFn",
    kernel=_torsion_kernel,
    consts=2,
    vjp=_torsion_vjp,
    buffers=_trig_buffers,
    module=__name__,
    doc="The bound torsion build (`TORSION_BUILD`).",
)
TorsionFn = TORSION_BUILD.function


_NP = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
_TORCH = {v: k for k, v in _NP.items()}
