"""`update_torsions` as rigid turns: each bond's moving side rotated about the bond, nested sides composed.

For rotor tables whose moving sides are nested or disjoint (always with the default
``moving="smaller"``), turning bond ``k`` by ``tau_k`` is the rigid motion

```text
T_k(y) = R_k (y - x_v) + x_v,      R_k = Rodrigues(unit(x_u - x_v), tau_k)   (right-handed; I at a zero axis)
```

of the atoms on ``v``'s side, and the updates of all bonds compose as ``C_k = C_parent(k) o T_k``
(``parent(k)``: the innermost bond whose side holds ``k``'s side), every axis taken from the input.
This is what the peers' sequential loop over bonds computes, in any bond order. An atom moves
by the ``C`` of the innermost bond that turns it (a bond's own ``v`` lies on its axis: by its
parent's); an atom no bond turns is returned as it is.

`turn_plan` derives the bonds' nesting once per packed batch of rotor tables (None where two
sides overlap without nesting: `update_torsions` then takes the internal-coordinate round trip);
`turned` runs the numba kernels (`batched_nerf.engines.fused.cpu.turns`: `TURN` and its backward
`TURN_VJP`, declared as `KernelOp`\\ s) on CPU float32/float64 tensors, and the torch version
below (their reference: twice differentiable, ``torch.func``, any device) elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._geometry import EPS, safe_normalize
from ..engines.backends import available, require
from ..engines.function import KernelOp, lead
from ..runtime import gate
from ..runtime.torch_compat import no_functorch, values_of

__all__ = ["TurnPlan", "turn_plan", "turned"]


@dataclass(frozen=True, eq=False)
class TurnPlan:
    """The nesting of a packed batch's bonds (global atom and bond indices, ``R`` bonds, ``T`` atoms).

    Attributes:
        u, v: ``(R,)`` the bonds' atoms (``v``'s side turns).
        order: ``(R,)`` the bonds, outer sides first (each after its parent).
        parent: ``(R,)`` the innermost bond whose side holds each bond's side (``-1``: none).
        levels: per nesting depth, the bonds at it and their parents (``(k,)`` each).
        atom_rotor: ``(T,)`` the innermost bond that turns each atom (``-1``: none).
    """

    u: np.ndarray
    v: np.ndarray
    order: np.ndarray
    parent: np.ndarray
    levels: tuple[tuple[np.ndarray, np.ndarray], ...]
    atom_rotor: np.ndarray

    def tensors(self, device: torch.device) -> dict[str, Tensor]:
        """The index arrays as tensors on ``device`` (made once per device)."""
        cache = self.__dict__.setdefault("_tensors", {})
        made = cache.get(device)
        if made is None:
            with no_functorch():  # made inside a transform, they would escape it
                made = self._made(device)
            cache[device] = made
        return made

    def _made(self, device: torch.device) -> dict[str, Any]:
        return {
            "u": torch.as_tensor(self.u, device=device),
            "v": torch.as_tensor(self.v, device=device),
            "atom_rotor": torch.as_tensor(
                np.where(self.atom_rotor < 0, self.u.size, self.atom_rotor), device=device
            ),
            "turned": torch.as_tensor(self.atom_rotor >= 0, device=device),
            "levels": [
                (torch.as_tensor(k, device=device), torch.as_tensor(p, device=device)) for k, p in self.levels
            ],
        }


def _nesting(moving: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Parents of one molecule's bonds, the innermost bond of each atom and the bonds' nesting
    depths, from its ``(R, N)`` moving sides; None where two sides overlap without one holding
    the other."""
    if moving.shape[0] == 0:  # no rotatable bond: nothing turns
        none = np.zeros(0, dtype=np.int64)
        return none, np.full(moving.shape[1], -1, dtype=np.int64), none
    m = moving.astype(np.int64)
    size = m.sum(1)
    inter = m @ m.T
    r = size.size
    off = ~np.eye(r, dtype=bool)
    nested = (inter == 0) | (inter == size[:, None]) | (inter == size[None, :])
    if not nested[off].all() or (off & (inter == size[:, None]) & (inter == size[None, :])).any():
        return None
    holds = (
        off & (inter == size[None, :]) & (size[:, None] > size[None, :])
    )  # holds[j, k]: j's side holds k's
    big = np.iinfo(np.int64).max
    parent = np.where(holds.any(0), np.argmin(np.where(holds, size[:, None], big), 0), -1)
    atom = np.where(moving.any(0), np.argmin(np.where(moving, size[:, None], big), 0), -1)
    own = atom[v] == np.arange(r)  # a bond's v lies on its own axis: its parent's turn moves it
    atom[v[own]] = parent[own]
    return parent, atom, _depth(parent)


def _nesting_of(rotors: Any) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray] | None, np.ndarray]:
    """`_nesting` of one rotor table and its ``(R, 2)`` bonds as numpy, made once and kept on it (a
    batch of analysed molecules is composed from these without a per-molecule analysis)."""
    kept = rotors.__dict__.get("_nesting")
    if kept is None:
        bonds = values_of(rotors.bonds, "bonds")
        found = _nesting(values_of(rotors.moving, "moving"), bonds[:, 1])
        kept = rotors.__dict__["_nesting"] = (found, bonds)
    return kept


def _shifted(parts: list[np.ndarray], offsets: np.ndarray) -> np.ndarray:
    """``parts`` one after another (along the first axis), part ``m``'s entries ``>= 0`` plus
    ``offsets[m]`` (``-1`` kept)."""
    flat = np.concatenate(parts)
    shift = np.repeat(offsets, [len(x) for x in parts]).reshape((-1,) + (1,) * (flat.ndim - 1))
    return np.where(flat >= 0, flat + shift, -1).astype(np.int64)


def _depth(parent: np.ndarray) -> np.ndarray:
    """Nesting depth of each bond: 0 without a parent, else 1 + the parent's (pointer walk)."""
    depth = np.zeros(parent.size, dtype=np.int64)
    for _ in range(parent.size):
        new = np.where(parent >= 0, depth[np.maximum(parent, 0)] + 1, 0)
        if (new == depth).all():
            break
        depth = new
    return depth


def turn_plan(rotors: Sequence[Any]) -> TurnPlan | None:
    """The `TurnPlan` of a batch of rotor tables (`batched_nerf.RotorTable`, packed in this order);
    None where a molecule's sides are not nested."""
    kept = [_nesting_of(r) for r in rotors]
    found = [f for f, _ in kept]
    if any(f is None for f in found):
        return None
    bonds = [b for _, b in kept]
    atom_off = np.cumsum([0] + [r.n_atoms for r in rotors])[:-1]
    bond_off = np.cumsum([0] + [len(b) for b in bonds])[:-1]
    parent = _shifted([f[0] for f in found], bond_off)  # type: ignore[index]
    depth = np.concatenate([f[2] for f in found])  # type: ignore[index]
    order = np.argsort(depth, kind="stable")
    at = [order[depth[order] == d] for d in range(int(depth.max(initial=-1)) + 1)]
    uv = _shifted(bonds, atom_off)
    return TurnPlan(
        u=np.ascontiguousarray(uv[:, 0]),
        v=np.ascontiguousarray(uv[:, 1]),
        order=order.astype(np.int64),
        parent=parent,
        levels=tuple((keys, parent[keys]) for keys in at),
        atom_rotor=_shifted([f[1] for f in found], bond_off),  # type: ignore[index]
    )


#: ``[k]_x = (k[..., _CROSS] * _SIGN)``: the cross-product matrix of ``k`` from 9 gathered entries.
_CROSS = torch.tensor([0, 2, 1, 2, 0, 0, 1, 0, 0])
_SIGN = torch.tensor([0.0, -1.0, 1.0, 1.0, 0.0, -1.0, -1.0, 1.0, 0.0])


def _rodrigues(axis: Tensor, tau: Tensor) -> Tensor:
    """``(..., 3, 3)`` rotations by ``tau`` ``(...)`` about unit ``axis`` ``(..., 3)``, right-handed:
    ``I + sin(tau) [k]_x + (1 - cos(tau)) [k]_x^2`` with ``[k]_x^2 = k k^T - |k|^2 I`` (the identity
    for a zero axis: a bond of zero length turns nothing)."""
    c, s = torch.cos(tau)[..., None, None], torch.sin(tau)[..., None, None]
    sign = _SIGN.to(device=axis.device, dtype=axis.dtype)
    cross = (axis.index_select(-1, _CROSS.to(axis.device)) * sign).unflatten(-1, (3, 3))
    eye = torch.eye(3, dtype=axis.dtype, device=axis.device)
    square = axis.unsqueeze(-1) * axis.unsqueeze(-2) - (axis * axis).sum(-1)[..., None, None] * eye
    return eye + s * cross + (1.0 - c) * square


def _turned_torch(xyz: Tensor, tau: Tensor, plan: TurnPlan) -> Tensor:
    """The torch version of `turned`: ``(..., T, 3)``, ``(..., R)`` -> ``(..., T, 3)``."""
    t = plan.tensors(xyz.device)
    xu, xv = xyz.index_select(-2, t["u"]), xyz.index_select(-2, t["v"])
    rot = _rodrigues(safe_normalize(xu - xv, EPS), tau)  # (..., R, 3, 3)
    shift = xv - (rot @ xv.unsqueeze(-1)).squeeze(-1)  # (..., R, 3)
    total_rot, total_shift = rot, shift
    for keys, parents in t["levels"][1:]:  # compose onto the parents, outer levels first
        pr, ps = total_rot.index_select(-3, parents), total_shift.index_select(-2, parents)
        r_k, s_k = rot.index_select(-3, keys), shift.index_select(-2, keys)
        total_rot = total_rot.index_copy(-3, keys, pr @ r_k)
        total_shift = total_shift.index_copy(-2, keys, (pr @ s_k.unsqueeze(-1)).squeeze(-1) + ps)
    eye = torch.eye(3, dtype=xyz.dtype, device=xyz.device).expand(*total_rot.shape[:-3], 1, 3, 3)
    total_rot = torch.cat([total_rot, eye], -3)  # index R: no turn
    total_shift = torch.cat([total_shift, total_shift.new_zeros(*total_shift.shape[:-2], 1, 3)], -2)
    r_at, s_at = total_rot.index_select(-3, t["atom_rotor"]), total_shift.index_select(-2, t["atom_rotor"])
    moved = (r_at @ xyz.unsqueeze(-1)).squeeze(-1) + s_at
    return torch.where(t["turned"].unsqueeze(-1), moved, xyz)


def _lead(first: tuple[int, ...], *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast leading shape (no broadcast computed where all are equal: every plain call)."""
    if all(s == first for s in shapes):
        return tuple(first)
    return tuple(torch.broadcast_shapes(first, *shapes))


def _kernel_args(plan: TurnPlan) -> tuple[np.ndarray, ...]:
    return plan.u, plan.v, plan.order, plan.parent, plan.atom_rotor


def _turn_kernel(xyz: Tensor, tau: Tensor, plan: TurnPlan) -> Tensor:
    """`turned` by the numba kernel (plain tensors, any leading shape)."""
    lead, n = _lead(xyz.shape[:-2], tau.shape[:-1]), xyz.shape[-2]
    x = xyz.detach().expand(*lead, n, 3).reshape(-1, n, 3).contiguous().numpy()
    t = tau.detach().to(xyz.dtype).expand(*lead, tau.shape[-1]).reshape(x.shape[0], -1).contiguous().numpy()
    out = require("cpu").turns.turn(x, t, *_kernel_args(plan), EPS)
    return torch.from_numpy(out).reshape(*lead, n, 3)


def _turn_vjp_kernel(xyz: Tensor, tau: Tensor, g: Tensor, plan: TurnPlan) -> tuple[Tensor, Tensor]:
    """Gradients of ``sum(g * turned(xyz, tau))`` by the numba kernel, summed to the inputs' shapes."""
    lead, n, r = _lead(xyz.shape[:-2], tau.shape[:-1], g.shape[:-2]), xyz.shape[-2], tau.shape[-1]
    x = xyz.detach().expand(*lead, n, 3).reshape(-1, n, 3).contiguous().numpy()
    t = tau.detach().to(xyz.dtype).expand(*lead, r).reshape(x.shape[0], r).contiguous().numpy()
    gg = g.detach().to(xyz.dtype).expand(*lead, n, 3).reshape(x.shape[0], n, 3).contiguous().numpy()
    gx, gt = require("cpu").turns.turn_vjp(x, t, gg, *_kernel_args(plan), EPS)
    gx = torch.from_numpy(gx).to(xyz.dtype).reshape(*lead, n, 3)
    gt = torch.from_numpy(gt).to(tau.dtype).reshape(*lead, r)
    return gx.sum_to_size(xyz.shape), gt.sum_to_size(tau.shape)


def _turn_vjp_reference(xyz: Tensor, tau: Tensor, g: Tensor, plan: TurnPlan) -> tuple[Tensor, Tensor]:
    _, pull = torch.func.vjp(lambda x, t: _turned_torch(x, t, plan), xyz, tau)
    return pull(g)


#: ``(xyz, tau, plan)`` -> the turned coordinates by the numba kernel; its backward is `TURN_VJP`.
TURN = KernelOp(
    "TurnSides",
    kernel=_turn_kernel,
    reference=_turned_torch,
    vjp=lambda primals, grads, plan: TURN_VJP.apply(*primals, *grads, plan),
    vmap=lead,
    transforms="reference",
    module=__name__,
    doc="The rigid turns of rotatable bonds' sides (`TURN`).",
)
#: ``(xyz, tau, g, plan)`` -> the gradients of ``sum(g * turned)`` of ``xyz`` and ``tau`` by the numba
#: kernel; its own derivatives are the torch version's graph.
TURN_VJP = KernelOp(
    "TurnSidesVJP",
    kernel=_turn_vjp_kernel,
    reference=_turn_vjp_reference,
    vmap=lead,
    module=__name__,
    doc="The backward of the rigid turns (`TURN_VJP`).",
)


def turned(xyz: Tensor, tau: Tensor, plan: TurnPlan) -> Tensor:
    """``(..., T, 3)`` coordinates with every bond's moving side turned by ``tau`` ``(..., R)``
    (radians, the dtype of ``xyz``; see the module docstring): the numba kernels on CPU
    float32/float64 tensors (`TURN`, whose backward is a kernel too), the torch version under
    ``torch.func`` transforms, forward mode, ``torch.compile`` and elsewhere."""
    if not (gate.kernel_inputs(xyz, tau) and available("cpu")):
        return _turned_torch(xyz, tau, plan)
    return TURN.call(xyz, tau, plan)
