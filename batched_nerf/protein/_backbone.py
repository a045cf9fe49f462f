"""Backbones (N, CA, C) from per-residue torsions, bond angles and bond lengths, and back.

The six backbone angles of FoldingDiff-style models (phi, psi, omega and the three
bond angles) and optionally the three bond lengths, for a batch of chains of mixed
lengths in one call: the chain is one [`ConstructionTable`][batched_nerf.ConstructionTable]
of ``3 L`` atoms (cached per ``L``), built by [`to_cartesian`][batched_nerf.to_cartesian]
and read back by [`to_internal`][batched_nerf.to_internal]. Shorter chains are the
padded chain with their tail masked: the build is causal, so padding never moves
a residue that exists. The atom rows' values come from one gather in which entries
the build does not read (and, by ``torch.where``, residues that do not exist) are
constants, so NaN padding there reaches neither the coordinates nor the gradients.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._geometry import batch_shape
from ..core.checks import to_tensor
from ..core.convert import to_cartesian, to_internal
from ..core.table import ConstructionTable, outside_inference_mode
from ..engines.backends import require
from ..residues.templates import BACKBONE
from ..runtime.state import memo
from . import _bound_backbone as bound
from ._build import _float

Layout = Literal["residue", "foldingdiff"]
LAYOUTS: tuple[str, ...] = ("residue", "foldingdiff")

_GENERIC = BACKBONE["ALA"]
#: per column of (dihedrals, angles) and of bonds: the residue's own value (True) or its peptide bond's
_OWN = (torch.tensor([True, False, False]), torch.tensor([True, True, False]))
#: (tau, CA:C:1N, C:1N:1CA) in degrees and (N:CA, CA:C, C:1N) in Angstrom used where not given:
#: Engh & Huber (1991) for ``layout="residue"``; FoldingDiff's ``NERFBuilder`` defaults for
#: ``layout="foldingdiff"``.
_DEFAULT_ANGLES = {
    "residue": (_GENERIC.n_ca_c, _GENERIC.ca_c_n, _GENERIC.c_n_ca),
    "foldingdiff": (109.0, 115.0, 121.0),
}
_DEFAULT_BONDS = {"residue": (_GENERIC.n_ca, _GENERIC.ca_c, _GENERIC.c_n), "foldingdiff": (1.46, 1.54, 1.34)}
#: FoldingDiff's fixed first residue: N, CA, C of 1CRN's Thr1 (Angstrom).
FOLDINGDIFF_FIRST: tuple[tuple[float, float, float], ...] = (
    (17.047, 14.099, 3.625),
    (16.967, 12.784, 4.338),
    (15.685, 12.755, 5.133),
)


class BackboneInternal(NamedTuple):
    """Per-residue backbone internal coordinates.

    Conventions of [`build_backbone`][batched_nerf.protein.build_backbone].

    Each field is ``(..., L, 3)``: ``dihedrals`` holds (phi, psi, omega), ``angles``
    (tau, CA:C:1N, C:1N:1CA), ``bonds`` (N:CA, CA:C, C:1N). Entries that do not
    exist (phi of the first residue, the link after the last residue, residues
    beyond ``lengths``) are ``0``, as in [`Torsions`][batched_nerf.protein.Torsions].
    """

    dihedrals: Tensor
    angles: Tensor
    bonds: Tensor


@functools.lru_cache(maxsize=64)
def backbone_table(n_residues: int, fixed_first: bool) -> ConstructionTable:
    """The chain table of ``n_residues`` residues (N, CA, C each), its first three atoms fixed or seeds."""
    idx = np.arange(3 * n_residues)[:, None] - np.arange(1, 4)[None, :]
    refs = np.where(idx >= 0, idx, -1)
    if fixed_first:
        refs[:3] = -1
    return ConstructionTable(refs, fixed=[0, 1, 2] if fixed_first else None)


def _per_residue(value: Any, name: str, like: Tensor | None, n_residues: int | None) -> Tensor:
    """``value`` as a floating ``(..., L, 3)`` tensor, or a ValueError naming the shape."""
    t = _float(value, name, like)
    if t.ndim < 2 or t.shape[-1] != 3 or (n_residues is not None and t.shape[-2] != n_residues):
        want = "(..., L, 3)" if n_residues is None else f"(..., {n_residues}, 3)"
        raise ValueError(f"{name} must be {want}, got shape {tuple(t.shape)}")
    return t


def _lengths(lengths: Any, batch: torch.Size, n_residues: int, device: torch.device) -> Tensor:
    """``lengths`` as an integer tensor broadcast to ``batch``, each in ``[1, L]``."""
    t = to_tensor(lengths, "lengths", device=device)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers, got dtype {t.dtype}")
    try:
        t = t.expand(batch)
    except RuntimeError:
        raise ValueError(
            f"lengths of shape {tuple(t.shape)} do not broadcast to the batch shape {tuple(batch)}"
        ) from None
    bad = (t < 1) | (t > n_residues)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"lengths must be in [1, {n_residues}] (the residues given), "
            f"got {int(t[where])} for protein {where}"
        )
    return t


def _defaults(layout: str, like: Tensor) -> tuple[Tensor, Tensor]:
    """The layout's default ``(3,)`` bond angles (radians) and bonds in the dtype and device of ``like``."""
    return _constants(layout, like.dtype, like.device)[:2]


@functools.lru_cache(maxsize=32)
@outside_inference_mode
def _constants(layout: str, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, ...]:
    """``(default angles, default bonds, FoldingDiff's first residue, the gather's 7 constants)`` made
    once per dtype and device (read, never written)."""
    angles = torch.tensor(_DEFAULT_ANGLES[layout], dtype=dtype, device=device).deg2rad()
    bonds = torch.tensor(_DEFAULT_BONDS[layout], dtype=dtype, device=device)
    consts = torch.cat([angles.new_zeros(1), angles, bonds])  # the gather's last 7 entries
    return angles, bonds, torch.tensor(FOLDINGDIFF_FIRST, dtype=dtype, device=device), consts


def build_backbone(
    dihedrals: Any,
    angles: Any = None,
    bonds: Any = None,
    *,
    first: Any = None,
    lengths: Any = None,
    layout: Layout = "residue",
    degrees: bool = False,
    method: str = "auto",
) -> Tensor:
    r"""Backbone atoms N, CA, C of chains from per-residue torsions, bond angles and bond lengths.

    For residue ``i`` (0-based, ``L`` residues), IUPAC signs, radians (degrees with
    ``degrees=True``), lengths in Angstrom, ``layout="residue"``:

    ```text
    dihedrals[..., i, 0] = phi[i]   = dihedral(C[i-1], N[i], CA[i], C[i])     unused for i = 0
    dihedrals[..., i, 1] = psi[i]   = dihedral(N[i], CA[i], C[i], N[i+1])     unused for i = L-1
    dihedrals[..., i, 2] = omega[i] = dihedral(CA[i], C[i], N[i+1], CA[i+1])  unused for i = L-1
    angles[..., i, 0]    = tau[i]   = angle(N[i], CA[i], C[i])
    angles[..., i, 1]    = angle(CA[i], C[i], N[i+1])                        unused for i = L-1
    angles[..., i, 2]    = angle(C[i], N[i+1], CA[i+1])                      unused for i = L-1
    bonds[..., i, 0]     = |CA[i] - N[i]|
    bonds[..., i, 1]     = |C[i] - CA[i]|
    bonds[..., i, 2]     = |N[i+1] - C[i]|                                   unused for i = L-1
    ```

    that is, each residue's own values and those of the peptide bond after it.
    ``layout="foldingdiff"`` reads FoldingDiff's arrays as they are (``foldingdiff``'s
    ``nerf_build_batch`` and ``canonical_distances_and_dihedrals``): its row ``i`` of
    tau, N:CA and CA:C belongs to residue ``i+1`` (the residue row ``i`` places);
    phi, psi, omega, CA:C:1N, C:1N:1CA and 0C:1N are as above. That layout's
    defaults are FoldingDiff's: ``first`` = 1CRN's first residue, bonds (1.46, 1.54,
    1.34), angles (109, 115, 121) degrees; those of ``"residue"`` are Engh & Huber's
    (1991) with the first residue's N at the origin, CA on ``+x`` and C in the
    ``xy``-plane (``y > 0``).

    Unused entries (above, and every entry of a residue at or beyond ``lengths``)
    are never read: NaN padding there changes nothing and gets zero gradient. One
    padded build serves any mix of lengths (the chain is causal), so a new mix each
    step costs what a padded batch costs. Differentiable to any order and
    ``torch.func`` compatible (through [`to_cartesian`][batched_nerf.to_cartesian]).

    Args:
        dihedrals: ``(..., L, 3)`` phi, psi, omega.
        angles: ``(..., L, 3)`` tau, CA:C:1N, C:1N:1CA (default: the layout's).
        bonds: ``(..., L, 3)`` N:CA, CA:C, C:1N in Angstrom (default: the layout's).
        first: ``(..., 3, 3)`` positions of the first residue's N, CA, C, cast to the
            dtype of ``dihedrals``; replaces its tau, N:CA and CA:C.
        lengths: ``(...)`` integer residues of each chain, ``1 <= lengths <= L``
            (default: all ``L``).
        layout: ``"residue"`` or ``"foldingdiff"``, as above.
        degrees: read ``dihedrals`` and ``angles`` in degrees.
        method: the engine, as in [`to_cartesian`][batched_nerf.to_cartesian].

    Returns:
        ``(..., L, 3, 3)``: ``xyz[..., i, k]`` is atom ``k`` (N, CA, C) of residue ``i``;
        residues at or beyond ``lengths`` are ``0``. ``xyz.flatten(-3, -2)`` is
        FoldingDiff's ``(..., 3 L, 3)``.

    Raises:
        TypeError: a non-floating ``dihedrals``, ``angles``, ``bonds`` or ``first``, or
            non-integer ``lengths``.
        ValueError: a shape other than those above (naming it), inputs that do not
            broadcast, ``lengths`` outside ``[1, L]`` (naming the protein), no
            residues, or an unknown ``layout``.

    Example:
        >>> import torch, batched_nerf as bn
        >>> dihedrals = torch.tensor([-1.0, 2.4, 3.1]).expand(2, 5, 3)  # 2 chains of 5 residues
        >>> xyz = bn.protein.build_backbone(dihedrals, lengths=torch.tensor([5, 3]))
        >>> xyz.shape, bool(xyz[1, 3:].eq(0).all())
        (torch.Size([2, 5, 3, 3]), True)
        >>> back = bn.protein.backbone_internal(xyz[:1])
        >>> torch.allclose(back.dihedrals[0, 1:-1], dihedrals[0, 1:-1], atol=1e-4)
        True
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if first is None and not degrees and method in ("auto", "fused"):
        out = _plain(dihedrals, angles, bonds, lengths, layout, method)
        if out is not None:
            return out
    d = _per_residue(dihedrals, "dihedrals", None, None)
    n_res = d.shape[-2]
    if n_res == 0:
        raise ValueError("dihedrals must hold at least one residue, got shape " f"{tuple(d.shape)}")
    a = None if angles is None else _per_residue(angles, "angles", d, n_res)
    b = None if bonds is None else _per_residue(bonds, "bonds", d, n_res)
    dtype = d.dtype
    for t in (a, b):
        dtype = dtype if t is None else torch.promote_types(dtype, t.dtype)
    default_angles, default_bonds = _defaults(layout, d.to(dtype))
    d = d.to(dtype)
    a = default_angles.expand(n_res, 3) if a is None else a.to(dtype)
    b = default_bonds.expand(n_res, 3) if b is None else b.to(dtype)
    if degrees:
        d, a = d.deg2rad(), (a if angles is None else a.deg2rad())
    fixed = None
    if layout == "foldingdiff" and first is None:
        fixed = _constants(layout, dtype, d.device)[2]
    elif first is not None:
        fixed = _float(first, "first", d).to(dtype=dtype, device=d.device)
        if fixed.ndim < 2 or fixed.shape[-2:] != (3, 3):
            raise ValueError(
                f"first must be (..., 3, 3) (N, CA, C of the first residue), got shape {tuple(fixed.shape)}"
            )
    try:
        batch = batch_shape(
            d.shape[:-2], a.shape[:-2], b.shape[:-2], *(() if fixed is None else (fixed.shape[:-2],))
        )
    except RuntimeError:
        shapes = {"dihedrals": d.shape, "angles": a.shape, "bonds": b.shape}
        if fixed is not None:
            shapes["first"] = fixed.shape
        raise ValueError(
            "the leading shapes do not broadcast: " + ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
        ) from None
    if fixed is not None:
        fixed = fixed.expand(*batch, 3, 3)
    if first is None and method in ("auto", "fused"):  # broadcast inputs: the bound build, expanded
        out = _plain(*(t.expand(*batch, n_res, 3) for t in (d, a, b)), lengths, layout, method)
        if out is not None:
            return out
    consts = _constants(layout, dtype, d.device)[3]
    count = None if lengths is None else _lengths(lengths, batch, n_res, d.device)
    return _gather_build(d, a, b, batch, layout, fixed, count, consts, method)


def _plain(d: Any, a: Any, b: Any, lengths: Any, layout: str, method: str) -> Tensor | None:
    """`build_backbone`'s common call (no ``first``, radians; CPU float tensors of one shape and dtype,
    None for a default: `bound.serves`) through the bound build, with only the checks it needs (a
    call that runs right after a model's own work pays for every torch call on the way, cold); None
    where it does not serve (the general path then checks and builds)."""
    given = [t for t in (d, a, b) if t is not None]
    if any(type(t) is not Tensor for t in given):
        return None
    shape = d.shape
    if len(shape) < 2 or shape[-1] != 3 or not bound.serves(*given):  # serves: float32/64 only
        return None
    n_res = shape[-2]
    count = None if lengths is None else _lengths(lengths, shape[:-2], n_res, d.device)

    def general(*values: Tensor) -> Tensor:  # the reference: the general path
        it = iter(values)
        v = [next(it) if t is not None else None for t in (d, a, b)]
        return build_backbone(*v, lengths=count, layout=layout, method=method)  # type: ignore[arg-type]

    constants = _bound_constants(n_res, layout, d.dtype)
    return bound.bound_build((d, a, b), constants, general, count)


def _gather_build(
    d: Tensor,
    a: Tensor,
    b: Tensor,
    batch: torch.Size,
    layout: str,
    fixed: Tensor | None,
    count: Tensor | None,
    consts: Tensor,
    method: str,
) -> Tensor:
    """``(*batch, L, 3, 3)`` positions from per-residue ``(..., L, 3)`` dihedrals, angles and bonds
    (radians, Angstrom): the atom rows' values in one torch gather, then `to_cartesian`; residues at
    or past ``count`` ``(*batch)`` are built from constants and written as zeros."""
    n_res = d.shape[-2]
    # the atom rows' (bonds, angles, dihedrals) in one gather: entries the build does not read are
    # never gathered (constants instead), so NaN there reaches no value and no gradient
    source, fallback = (t.to(d.device) for t in _atom_source(n_res, layout, fixed is not None))
    flat = torch.cat(
        [t.expand(*batch, n_res, 3).flatten(-2) for t in (d, a, b)] + [consts.expand(*batch, 7)], dim=-1
    )
    values = flat.index_select(-1, source.flatten()).unflatten(-1, (3, 3 * n_res))
    if count is not None:  # residues at or beyond lengths: constants
        exists = torch.arange(3 * n_res, device=d.device) // 3 < count[..., None, None]
        values = torch.where(exists, values, consts[fallback])
    atom_b, atom_a, atom_d = values.unbind(-2)
    table = backbone_table(n_res, fixed is not None)
    xyz = to_cartesian(
        atom_b,
        atom_a,
        atom_d,
        table,
        fixed_xyz=fixed,
        method=method,  # type: ignore[arg-type]
    ).unflatten(-2, (n_res, 3))
    if count is not None:
        xyz = torch.where(
            (torch.arange(n_res, device=d.device)[:, None] < count[..., None, None])[..., None], xyz, 0.0
        )
    return xyz


def _atom_source(n_residues: int, layout: str, fixed_first: bool) -> tuple[Tensor, Tensor]:
    """`_new_atom_source`, kept with its chain table (`backbone_table`: `cache_info` reports it,
    ``release`` frees it)."""
    table = backbone_table(n_residues, fixed_first)
    return memo(table, ("atom source", layout), lambda: _new_atom_source(n_residues, layout, fixed_first))


def _new_atom_source(n_residues: int, layout: str, fixed_first: bool) -> tuple[Tensor, Tensor]:
    """``(3, 3 L)`` positions of each atom row's bond, angle and dihedral in
    ``cat([dihedrals (3 L), angles (3 L), bonds (3 L), 0, default angles (3), default bonds (3)])``, and
    ``(3, 3 L)`` positions in the last 7 (the constants) of the value a row takes where its residue is
    past ``lengths``.

    Row ``3 i + k`` is atom ``k`` (N, CA, C) of residue ``i``: N and CA close the peptide bond after
    residue ``i - 1`` (its C:1N, CA:C:1N, C:1N:1CA, psi, omega), C is residue ``i``'s own (tau, phi).
    FoldingDiff's layout reads tau, N:CA and CA:C one residue earlier. The first residue's entries that
    a seed or a fixed atom does not read are constants."""
    n = n_residues
    d_at, a_at, b_at, zero = 0, 3 * n, 6 * n, 9 * n
    const_a, const_b = zero + 1, zero + 4
    shifted = layout == "foldingdiff"
    source = np.zeros((3, 3 * n), dtype=np.int64)
    for i in range(n):
        prev = i - 1
        bonds = [
            b_at + 3 * prev + 2 if i else const_b + 2,
            (b_at + 3 * prev if i else const_b) if shifted else b_at + 3 * i,
            (b_at + 3 * prev + 1 if i else const_b + 1) if shifted else b_at + 3 * i + 1,
        ]
        angles = [
            a_at + 3 * prev + 1 if i else const_a + 1,
            a_at + 3 * prev + 2 if i else const_a + 2,
            (a_at + 3 * prev if i else const_a) if shifted else a_at + 3 * i,
        ]
        dihedrals = [
            d_at + 3 * prev + 1 if i else zero,
            d_at + 3 * prev + 2 if i else zero,
            d_at + 3 * i if i else zero,
        ]
        source[:, 3 * i : 3 * i + 3] = [bonds, angles, dihedrals]
    if fixed_first:  # the first residue's atoms are fixed: nothing of theirs is read
        source[:, :3] = [[const_b + 2, const_b, const_b + 1], [const_a + 1, const_a + 2, const_a], [zero] * 3]
    fallback = np.tile(np.array([[6, 4, 5], [2, 3, 1], [0, 0, 0]]), (1, n))
    return torch.from_numpy(source), torch.from_numpy(fallback)


def _bound_constants(n_residues: int, layout: str, dtype: torch.dtype) -> bound.Constants:
    """What the bound build of ``n_residues`` residues in ``layout`` and ``dtype`` reads besides its
    inputs (`bound.Constants`): made once, numpy, read only, kept with its chain table
    (`backbone_table`: `cache_info` reports it, ``release`` frees it)."""
    table = backbone_table(n_residues, layout == "foldingdiff")
    return memo(
        table, ("bound constants", layout, dtype), lambda: _new_bound_constants(n_residues, layout, dtype)
    )


def _new_bound_constants(n_residues: int, layout: str, dtype: torch.dtype) -> bound.Constants:
    """`_bound_constants`, made."""
    fixed_first = layout == "foldingdiff"
    source, fallback = (t.numpy() for t in _atom_source(n_residues, layout, fixed_first))
    which = np.minimum(source // (3 * n_residues), 3)
    angles, bonds, first, consts = (t.numpy() for t in _constants(layout, dtype, torch.device("cpu")))
    table = backbone_table(n_residues, fixed_first)
    return bound.Constants(
        table=table,
        source=(source, which, source - 3 * n_residues * which, fallback),
        consts=consts,
        defaults=(np.tile(angles, n_residues)[None], np.tile(bonds, n_residues)[None]),
        first=first if fixed_first else np.zeros((0, 3), dtype=first.dtype),
        pose=require("cpu").pose.identity_rows(table.plan("fused").topology.seed_root.size),
    )


def backbone_internal(
    xyz: Any,
    *,
    lengths: Any = None,
    layout: Layout = "residue",
    degrees: bool = False,
    method: str = "auto",
) -> BackboneInternal:
    r"""Per-residue torsions, bond angles and bond lengths of backbones (N, CA, C).

    The inverse of [`build_backbone`][batched_nerf.protein.build_backbone].

    Conventions and ``layout`` as in [`build_backbone`][batched_nerf.protein.build_backbone]; with
    ``layout="foldingdiff"`` the values are FoldingDiff's ``canonical_distances_and_dihedrals``
    columns (phi, psi, omega / tau, CA:C:1N, C:1N:1CA / N:CA, CA:C, 0C:1N), with ``0``
    where FoldingDiff has NaN or padding. Entries that do not exist are ``0``: phi of
    the first residue, the peptide bond after the last, everything of residues at
    or beyond ``lengths`` (``"foldingdiff"``: also the last row's tau, N:CA, CA:C).
    Differentiable to any order (through [`to_internal`][batched_nerf.to_internal]).

    Args:
        xyz: ``(..., L, 3, 3)`` N, CA, C of each residue (FoldingDiff's ``(..., 3 L, 3)``
            is ``xyz.unflatten(-2, (L, 3))``).
        lengths: ``(...)`` integer residues of each chain (default: all ``L``).
        layout: ``"residue"`` or ``"foldingdiff"``.
        degrees: give dihedrals and angles in degrees.
        method: the engine, as in [`to_internal`][batched_nerf.to_internal].

    Returns:
        [`BackboneInternal`][batched_nerf.protein.BackboneInternal] ``(dihedrals, angles, bonds)``,
        each ``(..., L, 3)``.

    Raises:
        TypeError: a non-floating ``xyz`` or non-integer ``lengths``.
        ValueError: ``xyz`` not ``(..., L, 3, 3)`` with ``L >= 1``, ``lengths`` outside
            ``[1, L]`` (naming the protein), or an unknown ``layout``.

    Example:
        >>> import torch, batched_nerf as bn
        >>> xyz = bn.protein.build_backbone(torch.tensor([[-1.0, 2.4, 3.0]] * 4))
        >>> bn.protein.backbone_internal(xyz).dihedrals[1:-1]
        tensor([[-1.0000,  2.4000,  3.0000],
                [-1.0000,  2.4000,  3.0000]])
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    x = _float(xyz, "xyz", None)
    if x.ndim < 3 or x.shape[-2:] != (3, 3) or x.shape[-3] == 0:
        raise ValueError(
            f"xyz must be (..., L, 3, 3) (N, CA, C of L >= 1 residues), got shape {tuple(x.shape)}; "
            "a (..., 3 L, 3) array is xyz.unflatten(-2, (L, 3))"
        )
    n_res, batch = x.shape[-3], x.shape[:-3]
    ic = to_internal(x.flatten(-3, -2), backbone_table(n_res, False), degrees=degrees, method=method)  # type: ignore[arg-type]
    atom_b, atom_a, atom_d = (t.unflatten(-1, (n_res, 3)) for t in (ic.bonds, ic.angles, ic.dihedrals))
    # the atom rows of residue i+1's N and CA hold the peptide bond after residue i
    d = torch.stack([atom_d[..., 2], _next(atom_d[..., 0]), _next(atom_d[..., 1])], dim=-1)
    a = torch.stack([atom_a[..., 2], _next(atom_a[..., 0]), _next(atom_a[..., 1])], dim=-1)
    b = torch.stack([atom_b[..., 1], atom_b[..., 2], _next(atom_b[..., 0])], dim=-1)
    index = torch.arange(n_res, device=x.device)[:, None]
    count = n_res if lengths is None else _lengths(lengths, batch, n_res, x.device)[..., None, None]
    residue, link = index < count, index < count - 1
    own, own_bonds = (t.to(x.device) for t in _OWN)
    d = torch.where(torch.where(own, residue & (index > 0), link), d, 0.0)
    a = torch.where(torch.where(own, residue, link), a, 0.0)
    b = torch.where(torch.where(own_bonds, residue, link), b, 0.0)
    if layout == "foldingdiff":  # its row i of tau, N:CA, CA:C is residue i+1's
        a = torch.stack([_next(a[..., 0]), a[..., 1], a[..., 2]], dim=-1)
        b = torch.stack([_next(b[..., 0]), _next(b[..., 1]), b[..., 2]], dim=-1)
    return BackboneInternal(d, a, b)


def _next(x: Tensor) -> Tensor:
    """``(..., L)`` -> the value of the residue after (``0`` for the last)."""
    return torch.cat([x[..., 1:], torch.zeros_like(x[..., :1])], dim=-1)
