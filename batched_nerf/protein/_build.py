"""Heavy-atom coordinates from backbone and side-chain torsions, one sequence or a mixed batch."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._geometry import batch_shape
from ..core.checks import to_tensor
from ..core.convert import to_cartesian
from ..core.pack import pack_tables
from ..core.table import _static_tensors, outside_inference_mode
from ..engines.compose import compose_padded
from ..engines.dispatch import auto_method
from ..engines.fused.build import configure
from ..engines.fused.torsions import TorsionBuild
from ..engines.fused.torsions import serves as _serves
from ..runtime.state import memo
from ._sequence import protein_table, public_state

#: Mixed batches (tuples of sequences) whose packed tables are kept.
PACK_CACHE_SIZE = 16
_DEG = math.pi / 180.0


class Protein(NamedTuple):
    """Result of [`build`][batched_nerf.protein.build].

    Attributes:
        xyz: ``(..., N, 3)`` heavy-atom coordinates (A); for a mixed batch of
            ``B`` sequences ``(..., B, N_max, 3)``, padded with zeros.
        atom_names: ``N`` PDB atom names (mixed batch: one tuple per sequence).
        residue_index: ``(N,)`` residue of each atom (mixed batch: ``(B, N_max)``,
            ``-1`` in padding).
        elements: ``N`` element symbols (mixed batch: one tuple per sequence).
        sequence: the one-letter sequence (mixed batch: a tuple of them).
        mask: ``(N,)`` (mixed batch ``(B, N_max)``) bool, ``True`` for real atoms.
    """

    xyz: Tensor
    atom_names: tuple
    residue_index: Tensor
    elements: tuple
    sequence: Any
    mask: Tensor


def _float(value: Any, name: str, like: Tensor | None) -> Tensor:
    if not isinstance(value, Tensor):
        keep = isinstance(value, (np.ndarray, np.floating)) and np.issubdtype(
            np.asarray(value).dtype, np.floating
        )
        if like is None and keep:  # numpy floats keep their dtype (float64 stays float64)
            value = to_tensor(np.asarray(value), name)
        else:
            value = to_tensor(
                value,
                name,
                dtype=like.dtype if like is not None else torch.get_default_dtype(),
                device=like.device if like is not None else None,
            )
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got dtype {value.dtype}")
    return value


def templates(owner: Any, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, ...]:
    """Template ``(bonds, angles, dihedrals, omega, chi)`` (radians) of a table, cast once per dtype/device.

    ``owner`` is a [`ProteinTable`][batched_nerf.protein.ProteinTable] or
    [`PackedProteins`][batched_nerf.protein.PackedProteins]; ``omega`` is
    trans everywhere, ``chi`` the default rotamers. The casts are made outside
    ``torch.inference_mode`` (a first call in a validation pass must not cache
    inference tensors that a later backward would have to save).
    """
    cache = memo(owner, "cast", dict)
    key = (dtype, device)
    if key not in cache:
        cache[key] = outside_inference_mode(_cast)(owner, dtype, device)
    return cache[key]


def _cast(owner: Any, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, ...]:
    chi = owner.default_chi
    omega = torch.full(chi.shape[:-1], math.pi, dtype=torch.float64)
    return tuple(
        t.to(dtype=dtype, device=device) for t in (owner.bonds, owner.angles, owner.dihedrals, omega, chi)
    )


def _torsion_values(
    phi: Any, psi: Any, omega: Any, chi: Any, shape: tuple[int, ...], owner: Any, degrees: bool
) -> list[Tensor]:
    """Checked torsions in radians: phi, psi, omega ``(..., P)`` and chi ``(..., 4P)``, ``P = prod(shape)``.

    ``shape`` is ``(L,)`` for one sequence, ``(B, L_max)`` for a mixed batch.
    """
    like = next((v for v in (phi, psi, omega, chi) if isinstance(v, Tensor)), None)
    if like is None:  # numpy torsions only: the first floating array sets the dtype
        arrays = [v for v in (phi, psi, omega, chi) if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
        like = torch.as_tensor(arrays[0]) if arrays else None
    scale = _DEG if degrees else 1.0
    dims = ", ".join(map(str, shape))
    what = "(..., L)" if len(shape) == 1 else "(..., B, L_max)"
    phi, psi = _float(phi, "phi", like), _float(psi, "psi", like)
    defaults = {name for name, value in (("omega", omega), ("chi", chi)) if value is None}
    if defaults:  # template values, already in radians
        _, _, _, default_omega, default_chi = templates(owner, phi.dtype, phi.device)
        omega = default_omega if omega is None else omega
        chi = default_chi if chi is None else chi
    out, leading = [], []
    for value, name, trailing in (
        (phi, "phi", shape),
        (psi, "psi", shape),
        (omega, "omega", shape),
        (chi, "chi", (*shape, 4)),
    ):
        t = _float(value, name, like)
        k = len(trailing)
        if len(shape) == 2 and t.ndim >= k and t.shape[t.ndim - k + 1] > shape[1]:
            # a mixed batch padded beyond its longest sequence: drop the extra columns
            t = t.narrow(t.ndim - k + 1, 0, shape[1])
        if t.ndim < k or tuple(t.shape[t.ndim - k :]) != trailing:
            want = what if name != "chi" else what[:-1] + ", 4)"
            raise ValueError(
                f"{name} must have shape {want} = (..., {dims}{', 4' if name == 'chi' else ''}), "
                f"got {tuple(t.shape)}"
            )
        t = t.flatten(t.ndim - k) if k > 1 else t
        if degrees and name not in defaults:
            t = t * scale
        out.append(t)
        leading.append(t.shape[: t.ndim - 1])
    try:
        batch = batch_shape(*leading)
    except RuntimeError:
        raise ValueError(
            "phi, psi, omega and chi do not broadcast: batch shapes "
            + ", ".join(str(tuple(s)) for s in leading)
        ) from None
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in out))
    return [t.to(dtype).expand(*batch, t.shape[-1]) for t in out]


def _assemble(
    template: Any,
    geometry: Any,
    n: int,
    torsions: list[Tensor],
    source: Tensor,
    degrees: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Bonds, angles, dihedrals ``(..., N)`` of ``template`` (a table) or ``geometry``, with the torsions."""
    like = torsions[0]
    if geometry is None:
        bonds, angles, dihedrals = templates(template, like.dtype, like.device)[:3]
    else:
        if len(geometry) != 3:
            raise ValueError(
                f"geometry must be (bonds, angles, dihedrals), e.g. to_internal(xyz, table); "
                f"got {len(geometry)} items"
            )
        bonds, angles, dihedrals = (
            _float(g, name, like) for g, name in zip(geometry, ("bonds", "angles", "dihedrals"))
        )
        for g, name in ((bonds, "bonds"), (angles, "angles"), (dihedrals, "dihedrals")):
            if g.ndim == 0 or g.shape[-1] != n:
                raise ValueError(
                    f"geometry {name} must have shape (..., N) with N = {n} atoms, got {tuple(g.shape)}"
                )
        if degrees:
            angles, dihedrals = angles * _DEG, dihedrals * _DEG
    dtype = functools.reduce(torch.promote_types, (like.dtype, bonds.dtype, angles.dtype, dihedrals.dtype))
    try:
        batch = batch_shape(like.shape[:-1], bonds.shape[:-1], angles.shape[:-1], dihedrals.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"geometry of batch shapes {tuple(bonds.shape[:-1])}, {tuple(angles.shape[:-1])}, "
            f"{tuple(dihedrals.shape[:-1])} does not broadcast with torsions of batch shape "
            f"{tuple(like.shape[:-1])}"
        ) from None
    parts = [dihedrals.to(dtype).expand(*batch, n)]
    parts += [t.to(dtype).expand(*batch, t.shape[-1]) for t in torsions]
    if source.device != like.device:
        source = source.to(like.device)
    values = torch.cat(parts, dim=-1).index_select(-1, source)
    return bonds.to(dtype), angles.to(dtype), values


def _set_rotors(dihedrals: Tensor, rotors: Any, t: Any, degrees: bool) -> Tensor:
    """``dihedrals`` with the rotor rows replaced by ``rotors`` ``(..., K)``."""
    r = _float(rotors, "rotors", dihedrals)
    k = int(t.rotor_rows.numel())
    if r.ndim == 0 or r.shape[-1] != k:
        raise ValueError(f"rotors must have shape (..., K) with K = {k} rotors, got {tuple(r.shape)}")
    r = r * _DEG if degrees else r
    dtype = torch.promote_types(dihedrals.dtype, r.dtype)
    try:
        batch = batch_shape(dihedrals.shape[:-1], r.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"rotors of batch shape {tuple(r.shape[:-1])} do not broadcast with torsions of batch shape "
            f"{tuple(dihedrals.shape[:-1])}"
        ) from None
    d = dihedrals.to(dtype).expand(*batch, dihedrals.shape[-1])
    return d.index_copy(-1, t.rotor_rows.to(d.device), r.to(dtype).expand(*batch, k))


def build(
    sequence: str | Sequence[str],
    phi: Any,
    psi: Any,
    omega: Any = None,
    chi: Any = None,
    *,
    geometry: Any = None,
    hydrogens: bool = False,
    rotors: Any = None,
    degrees: bool = False,
    method: str = "auto",
    accumulate_dtype: torch.dtype | None = None,
) -> Protein:
    r"""All heavy atoms of a protein (every atom with ``hydrogens=True``) from its torsions.

    Torsions follow IUPAC-IUB (1970), ``i`` the residue (0-based, ``L``
    residues), radians (degrees with ``degrees=True``), IUPAC sign:

    ```text
    phi[i]    = dihedral(C[i-1], N[i], CA[i], C[i])      phi[..., 0] is ignored
    psi[i]    = dihedral(N[i], CA[i], C[i], N[i+1])      last residue: (N, CA, C, OXT)
    omega[i]  = dihedral(CA[i], C[i], N[i+1], CA[i+1])   omega[..., L-1] is ignored
    chi[i, k] = chi(k+1) of residue i, on the atoms of mdtraj's compute_chi1..4;
                entries beyond the residue's side chain are ignored
    ```

    Bond lengths and angles are Engh & Huber (1991) ideal values (or those of
    ``geometry``); hydrogens take Amber ff14SB's. The first residue's N (an
    ``ACE`` cap's CH3) sits at the origin, its CA on ``+x``,
    its C in the ``xy``-plane (``y > 0``). Every CA is L. Caps count as residues
    (``"ACE ALA NME"``: ``L = 3``; ALA's phi and psi at index 1). Differentiable to any
    order and ``torch.func`` compatible: the torsions enter through one gather,
    then [`batched_nerf.to_cartesian`][batched_nerf.to_cartesian]. The table is analysed once per
    sequence ([`protein_table`][batched_nerf.protein.protein_table], cached).

    Args:
        sequence: one-letter string (``"ACDEF"``), or three-letter names
            (variants, caps) separated by spaces or listed
            ([`parse_sequence`][batched_nerf.protein.parse_sequence]).
        phi: ``(..., L)`` torsions (numpy arrays keep their float dtype).
        psi: ``(..., L)`` torsions, like ``phi``.
        omega: ``(..., L)``; default trans (``pi``) everywhere.
        chi: ``(..., L, 4)``; default one common rotamer per residue type
            ([`batched_nerf.protein.DEFAULT_CHI`][batched_nerf.protein.DEFAULT_CHI]).
        hydrogens: also build every hydrogen (Amber / PDB names, after each
            residue's heavy atoms; ideal geometry, Amber ff14SB bond lengths and
            angles). The heavy atoms are the same as without hydrogens.
        rotors: ``(..., K)`` dihedrals of the ``K`` hydrogen rotors (methyl,
            ammonium, amine, hydroxyl, thiol groups:
            `ProteinTable.rotor_rows` / ``rotor_names``); default staggered.
        geometry: optional ``(bonds, angles, dihedrals)`` each ``(..., N)`` (e.g.
            [`internal_coordinates`][batched_nerf.protein.internal_coordinates] of a structure) replacing the
            ideal bond
            lengths and angles and the fixed (non-torsion) dihedrals.
        degrees: torsions (and ``geometry``'s angles and dihedrals) in degrees.
        method: passed to [`batched_nerf.to_cartesian`][batched_nerf.to_cartesian].
        accumulate_dtype: passed to [`batched_nerf.to_cartesian`][batched_nerf.to_cartesian].

    Returns:
        [`Protein`][batched_nerf.protein.Protein] ``(xyz (..., N, 3), atom_names, residue_index, elements,
        sequence, mask)``.

    Raises:
        ValueError: an unknown residue; torsions, ``rotors`` or ``geometry`` of the wrong shape.
        TypeError: a sequence of the wrong type, non-floating torsions.

    Example:
        >>> import torch, batched_nerf as bn
        >>> phi = torch.full((2, 3), -57.0)
        >>> psi = torch.full((2, 3), -47.0)
        >>> p = bn.protein.build("ACD", phi, psi, degrees=True)
        >>> p.xyz.shape, p.atom_names[:5], p.residue_index[-1].item()
        (torch.Size([2, 20, 3]), ('N', 'CA', 'C', 'O', 'CB'), 2)
        >>> dipeptide = bn.protein.build("ACE ALA NME", torch.zeros(3), torch.zeros(3), hydrogens=True)
        >>> dipeptide.xyz.shape, dipeptide.atom_names[:4]
        (torch.Size([22, 3]), ('CH3', 'C', 'O', 'H1'))
    """
    t = protein_table(sequence, hydrogens=hydrogens)
    given = None if geometry is not None else _given_torsions(phi, psi, omega, chi, t.n_residues)
    if given is not None and rotors is None and accumulate_dtype is None and method in ("auto", "fused"):
        xyz = _bound(t, given, degrees, method)  # the kernels with no per-call checks, where they serve
        if xyz is not None:
            return Protein(xyz, t.atom_names, t.residue_index, t.elements, t.sequence, _mask(t, xyz.device))
    if given is not None:  # the common call: one gather, no broadcasting or casts to make
        bonds, angles, template = templates(t, phi.dtype, phi.device)[:3]
        dihedrals = _gather(t, template, given, degrees)
    else:
        torsions = _torsion_values(phi, psi, omega, chi, (t.n_residues,), t, degrees)
        bonds, angles, dihedrals = _assemble(t, geometry, t.n_atoms, torsions, t.source, degrees)
    if rotors is not None:
        dihedrals = _set_rotors(dihedrals, rotors, t, degrees)
    xyz = to_cartesian(bonds, angles, dihedrals, t.table, method=method, accumulate_dtype=accumulate_dtype)
    residue_index, mask = t.residue_index.to(xyz.device), _mask(t, xyz.device)
    return Protein(xyz, t.atom_names, residue_index, t.elements, t.sequence, mask)


def _given_torsions(phi: Any, psi: Any, omega: Any, chi: Any, n_residues: int) -> list[Tensor] | None:
    """``[phi, psi, omega or None, chi (..., L, 4) or None]`` when they need no cast, broadcast or check.

    That is: floating tensors of one dtype and device, ``phi`` and ``psi`` (and
    ``omega``) of one shape ``(..., L)``, ``chi`` ``(..., L, 4)`` with the same
    leading shape. Anything else (numpy, broadcasting, mixed dtypes, wrong
    shapes) returns None and takes the checked path, which raises or promotes.
    """
    if not isinstance(phi, Tensor) or not phi.is_floating_point():
        return None
    shape = phi.shape
    if not shape or shape[-1] != n_residues:
        return None
    for value, want, required in ((psi, shape, True), (omega, shape, False), (chi, (*shape, 4), False)):
        if value is None and not required:
            continue
        if not isinstance(value, Tensor) or value.shape != want:
            return None
        if value.dtype != phi.dtype or value.device != phi.device:
            return None
    return [phi, psi, omega, chi]


def _bound(t: Any, given: list[Tensor | None], degrees: bool, method: str) -> Tensor | None:
    """``(..., N, 3)`` heavy atoms of ``given`` torsions (`_given_torsions`) through the table's
    `TorsionBuild`, or None where it does not serve the call
    (not a CPU float tensor, numba absent, a ``torch.func`` transform or forward-mode level active, or
    ``method="auto"`` choosing another engine for this batch): the general path then builds it."""
    phi = given[0]
    if not _serves(phi):
        return None
    bound = memo(t, "bound", dict)
    if method == "auto" and _auto(bound, t.table, phi.numel() // max(t.n_residues, 1)) != "fused":
        return None
    key = (given[2] is not None, given[3] is not None)
    tb = bound.get(key)
    if tb is None:
        tb = bound[key] = _torsion_build(t, *key)
    parts = [v if not degrees else v * _DEG for v in given if v is not None]
    return tb(*parts)


def _auto(bound: dict, table: Any, m: int) -> str:
    """``method="auto"``'s engine for ``table`` at ``m`` samples (kept in ``bound`` per batch size)."""
    chosen = bound.get(("auto", m))
    if chosen is None:
        if len(bound) > 64:  # batch sizes seen: keep the dict small
            for k in [k for k in bound if k[0] == "auto"]:
                del bound[k]
        chosen = bound[("auto", m)] = auto_method(table, m, "cpu")
    return chosen


def _torsion_build(t: Any, omega: bool, chi: bool) -> TorsionBuild:
    """The `TorsionBuild` of ``t`` reading ``cat([phi, psi, omega?, chi?])`` (one per layout)."""
    plan = configure(t.table.plan("fused", torch.device("cpu")), None, True)
    k = (2 + omega + 4 * chi) * t.n_residues
    values = (x.numpy().astype(np.float64) for x in (t.bonds, t.angles, t.dihedrals))
    return TorsionBuild(plan, *values, _remapped(t, omega, chi).numpy(), k)


def _gather(t: Any, template: Tensor, given: list[Tensor | None], degrees: bool) -> Tensor:
    """``(..., N)`` dihedrals: the template's with the given torsions in their rows (one gather).

    ``cat([template (N), phi, psi, omega, chi])`` over the torsions given, read
    through `_source` (rows of an omitted omega or chi keep the
    template's value: its default).
    """
    parts = [v if not degrees else v * _DEG for v in given[:3] if v is not None]
    if given[3] is not None:
        chi = given[3].flatten(-2)
        parts.append(chi * _DEG if degrees else chi)
    batch = parts[0].shape[:-1]
    source = _source(t, given[2] is not None, given[3] is not None, template.device)
    return torch.cat([template.expand(*batch, template.shape[-1]), *parts], dim=-1).index_select(-1, source)


def _source(t: Any, omega: bool, chi: bool, device: torch.device) -> Tensor:
    """``(N,)`` gather index into ``cat([template (N), phi (L), psi (L), omega (L)?, chi (4L)?])`` (cached).

    ``t.source`` indexes ``cat([template, phi, psi, omega, chi])`` with every
    block present; an omitted block's entries point at the row itself (whose
    template value is the default), a later block moves up by the omitted ``L``.
    """
    cache = memo(t, "sources", dict)
    key = (omega, chi, device)
    if key not in cache:
        with _static_tensors():  # plain tensors, also on a first call in inference mode or torch.func
            cache[key] = _remapped(t, omega, chi).to(device)
    return cache[key]


def _remapped(t: Any, omega: bool, chi: bool) -> Tensor:
    """`_source` on the CPU (numpy)."""
    n, length = t.n_atoms, t.n_residues
    src = t.source.numpy().copy()
    rows = np.arange(n)
    in_omega = (src >= n + 2 * length) & (src < n + 3 * length)
    in_chi = src >= n + 3 * length
    if not chi:
        src[in_chi] = rows[in_chi]
    elif not omega:
        src[in_chi] -= length
    if not omega:
        src[in_omega] = rows[in_omega]
    return torch.from_numpy(src)


def _mask(t: Any, device: torch.device) -> Tensor:
    """``(N,)`` all-True atom mask of one sequence (cached per device, a plain tensor)."""
    cache = memo(t, "masks", dict)
    if device not in cache:
        with _static_tensors():
            cache[device] = torch.ones(t.n_atoms, dtype=torch.bool, device=device)
    return cache[device]


class _Layout(NamedTuple):
    """A [`ProteinTable`][batched_nerf.protein.ProteinTable]'s arrays that
    [`PackedProteins`][batched_nerf.protein.PackedProteins] concatenates (numpy, made once)."""

    n: int
    n_residues: int
    base: np.ndarray  # (N,) and weights (4, N): the packed source, see PackedProteins
    weights: np.ndarray
    arange: np.ndarray  # (N,)
    values: np.ndarray  # (3, N) template bonds, angles, dihedrals (radians)
    chi: np.ndarray  # (L, 4) default chi (radians)
    residue_index: np.ndarray  # (N,)


def _layout(t: Any) -> _Layout:
    """The `_Layout` of a [`ProteinTable`][batched_nerf.protein.ProteinTable] (kept on it).

    The table's own ``source`` is ``src < n`` (its template), ``n + c L + r`` (phi,
    psi, omega of residue ``r``, ``c < 3``) or ``n + 3 L + 4 r + c'`` (chi). Packed as
    sequence ``k`` of ``B`` (first atom ``f``, ``P = B L_max`` positions), these
    become ``src + f``, ``N + c P + (k L_max + r)`` and ``N + 3 P + 4 (k L_max + r) + c'``:
    ``base + weights . (N, P, k L_max, f)``.
    """
    return memo(t, "layout", lambda: _new_layout(t))


def _new_layout(t: Any) -> _Layout:
    """`_layout`, made."""
    src = t.source.numpy()
    n, n_res = t.n_atoms, t.n_residues
    own = src < n
    rel = src - n
    backbone = ~own & (rel < 3 * n_res)
    chi = ~own & ~backbone
    col, res = np.divmod(np.where(backbone, rel, 0), max(n_res, 1))
    chi_res, chi_col = np.divmod(np.where(chi, rel - 3 * n_res, 0), 4)
    base = np.where(own, src, np.where(backbone, res, 4 * chi_res + chi_col))
    weights = np.stack([~own, np.where(backbone, col, 0) + 3 * chi, backbone + 4 * chi, own]).astype(np.int64)
    return _Layout(
        n=n,
        n_residues=n_res,
        base=base.astype(np.int64),
        weights=weights.astype(np.int64),
        arange=np.arange(n),
        values=torch.stack([t.bonds, t.angles, t.dihedrals]).numpy(),
        chi=t.default_chi.numpy(),
        residue_index=t.residue_index.numpy(),
    )


class PackedProteins:
    """Several sequences in one packed table, with the index maps of a padded layout (cached per tuple).

    Attributes:
        tables: the [`ProteinTable`][batched_nerf.protein.ProteinTable] of each sequence.
        table: their [`batched_nerf.pack_tables`][batched_nerf.pack_tables].
        n_max, l_max: most atoms / residues of a sequence.
        source: ``(N_total,)`` gather index of the packed dihedrals into
            ``cat([template (N_total), phi (B*L_max), psi, omega, chi (4*B*L_max)])``.
        unpad: ``(N_total,)`` index of each packed atom in the flattened ``(B*N_max)`` layout.
        pad: ``(B*N_max,)`` index of each padded slot in the packed atoms, ``N_total`` for padding.
        bonds, angles, dihedrals: ``(N_total,)`` the packed template values (radians).

    ``source``, ``unpad``, ``pad`` and the template values are made on first use
    (the checked path; the bound build of [`build_batch`][batched_nerf.protein.build_batch] reads the
    sequences'
    own arrays). Its tensors are made outside ``torch.inference_mode`` (a tuple
    first packed in a validation pass still serves training).
    """

    def __getstate__(self) -> dict[str, Any]:
        return public_state(self)

    @outside_inference_mode
    def __init__(self, sequences: tuple[str | tuple[str, ...], ...], hydrogens: bool = False) -> None:
        self.hydrogens = hydrogens
        self.tables = [protein_table(s, hydrogens=hydrogens) for s in sequences]
        self.sequences = tuple(t.sequence for t in self.tables)  # canonical
        self.table = pack_tables([t.table for t in self.tables])
        parts = [_layout(t) for t in self.tables]
        self.n_max = max(p.n for p in parts)
        self.l_max = max(p.n_residues for p in parts)
        chi = np.zeros((len(parts), self.l_max, 4))
        residue_index = np.full((len(parts), self.n_max), -1, dtype=np.int64)
        for k, p in enumerate(parts):
            chi[k, : p.n_residues] = p.chi
            residue_index[k, : p.n] = p.residue_index
        self.default_chi = torch.from_numpy(chi)
        self.residue_index = torch.from_numpy(residue_index)
        self.mask = self.residue_index >= 0

    @functools.cached_property
    @outside_inference_mode
    def _maps(self) -> tuple[Tensor, ...]:
        """``(source, unpad, pad, bonds, angles, dihedrals)``, from each sequence's cached numpy layout,
        part by part (small arrays), then one concatenation per field."""
        parts = [_layout(t) for t in self.tables]
        n_total, positions = self.table.n_atoms, len(parts) * self.l_max
        # packed dihedrals = cat([template (N_total), phi (B*L_max), psi, omega, chi])[source]: each
        # part's source is base + weights . (n_total, positions, k * l_max, first atom), see _layout
        sources, unpad, first = [], [], 0
        for k, p in enumerate(parts):
            w = p.weights
            sources.append(
                p.base + w[0] * n_total + w[1] * positions + w[2] * (k * self.l_max) + w[3] * first
            )
            unpad.append(p.arange + k * self.n_max)
            first += p.n
        source, unpad_ = np.concatenate(sources), np.concatenate(unpad)
        pad = np.full(len(parts) * self.n_max, n_total, dtype=np.int64)
        pad[unpad_] = np.arange(n_total)
        values = tuple(torch.from_numpy(np.concatenate([p.values[k] for p in parts])) for k in range(3))
        return (torch.from_numpy(source), torch.from_numpy(unpad_), torch.from_numpy(pad), *values)

    source = property(lambda self: self._maps[0])
    unpad = property(lambda self: self._maps[1])
    pad = property(lambda self: self._maps[2])
    bonds = property(lambda self: self._maps[3])
    angles = property(lambda self: self._maps[4])
    dihedrals = property(lambda self: self._maps[5])

    def padded(self, packed: Tensor) -> Tensor:
        """``(..., N_total, 3)`` packed coordinates -> ``(..., B, N_max, 3)``, zeros in padding."""
        zero = packed.new_zeros(()).expand(*packed.shape[:-2], 1, 3)
        flat = torch.cat([packed, zero], dim=-2).index_select(-2, self.pad.to(packed.device))
        return flat.unflatten(-2, (len(self.tables), self.n_max))

    def packed(self, padded: Tensor) -> Tensor:
        """``(..., B, N_max, 3)`` padded coordinates -> ``(..., N_total, 3)``."""
        return padded.flatten(-3, -2).index_select(-2, self.unpad.to(padded.device))


@functools.lru_cache(maxsize=PACK_CACHE_SIZE)
def _packed(sequences: tuple[tuple[str, ...], ...], hydrogens: bool) -> PackedProteins:
    return PackedProteins(sequences, hydrogens)


def packed_proteins(sequences: Sequence[str | Sequence[str]], *, hydrogens: bool = False) -> PackedProteins:
    """The (cached) [`PackedProteins`][batched_nerf.protein.PackedProteins] of a tuple of sequences
    (``hydrogens``: all atoms).

    Raises:
        ValueError: an empty list, or a bad sequence (see
            [`protein_table`][batched_nerf.protein.protein_table]).

    Example:
        >>> import batched_nerf as bn
        >>> p = bn.protein.packed_proteins(["GA", "W"])
        >>> p.table.n_atoms, p.n_max, p.mask.sum(1).tolist()
        (25, 15, [10, 15])
    """
    if isinstance(sequences, str) or not len(sequences):
        raise ValueError("sequences must be a non-empty list of sequences (one string per chain)")
    given = tuple(sequences)
    if all(isinstance(s, str) for s in given):  # a training loop's batch again: no per-sequence parsing
        return _packed_strings(given, bool(hydrogens))
    return _packed(tuple(protein_table(s).residues for s in given), bool(hydrogens))


@functools.lru_cache(maxsize=PACK_CACHE_SIZE)
def _packed_strings(sequences: tuple[str, ...], hydrogens: bool) -> PackedProteins:
    # by residue names, not canonical strings: a lone name ("HID") would read as one-letter codes
    return _packed(tuple(protein_table(s).residues for s in sequences), hydrogens)


def build_batch(
    sequences: Sequence[str | Sequence[str]],
    phi: Any,
    psi: Any,
    omega: Any = None,
    chi: Any = None,
    *,
    hydrogens: bool = False,
    degrees: bool = False,
    method: str = "auto",
    accumulate_dtype: torch.dtype | None = None,
) -> Protein:
    r"""A mixed batch of ``B`` different sequences in one call (conventions of
    [`build`][batched_nerf.protein.build]).

    Torsions are padded to ``(..., B, L_pad)`` (``chi``: ``(..., B, L_pad, 4)``)
    with ``L_pad`` at least the longest sequence ``L_max``; entries beyond each
    sequence are ignored (they get zero gradient). All
    chains are built by one [`batched_nerf.to_cartesian`][batched_nerf.to_cartesian] call on the
    packed table ([`batched_nerf.pack_tables`][batched_nerf.pack_tables]), analysed once per tuple of
    sequences ([`packed_proteins`][batched_nerf.protein.packed_proteins], cached; the per-sequence tables are
    cached separately). ``hydrogens=True`` builds every atom (hydrogen rotors at
    their staggered defaults).

    Returns:
        [`Protein`][batched_nerf.protein.Protein] with ``xyz`` ``(..., B, N_max, 3)`` (zeros in padding),
        ``mask`` and ``residue_index`` ``(B, N_max)`` (``-1`` in padding), and
        per-sequence tuples of ``atom_names``, ``elements`` and ``sequence``.

    Raises:
        ValueError: an empty list, an unknown residue or torsions of the wrong shape.

    Example:
        >>> import torch, batched_nerf as bn
        >>> phi, psi = torch.full((2, 3), -1.0), torch.full((2, 3), -0.8)
        >>> p = bn.protein.build_batch(["ACD", "GW"], phi, psi)
        >>> p.xyz.shape, p.mask.sum(1).tolist()
        (torch.Size([2, 20, 3]), [20, 19])
    """
    packed = packed_proteins(sequences, hydrogens=hydrogens)
    shape = (len(packed.tables), packed.l_max)
    padded = None
    if accumulate_dtype is None and method in ("auto", "fused"):
        padded = _bound_batch(packed, phi, psi, omega, chi, degrees, method)
    if padded is None:
        torsions = _torsion_values(phi, psi, omega, chi, shape, packed, degrees)
        bonds, angles, dihedrals = _assemble(
            packed, None, packed.table.n_atoms, torsions, packed.source, False
        )
        xyz = to_cartesian(
            bonds, angles, dihedrals, packed.table, method=method, accumulate_dtype=accumulate_dtype
        )
        padded = packed.padded(xyz)
    return Protein(
        padded,
        tuple(t.atom_names for t in packed.tables),
        packed.residue_index.to(padded.device),
        tuple(t.elements for t in packed.tables),
        packed.sequences,
        packed.mask.to(padded.device),
    )


def _bound_batch(
    packed: PackedProteins, phi: Any, psi: Any, omega: Any, chi: Any, degrees: bool, method: str
) -> Tensor | None:
    """``(..., B, N_max, 3)`` padded coordinates through the packed table's bound build (written in the
    padded layout by the kernels), or None where it does not serve the call: torsions that are not
    tensors of one dtype, device and shape ``(..., B, L_pad)``, ``L_pad >= L_max`` (chi
    ``(..., B, L_pad, 4)``), or see `_bound`. The build (one per ``L_pad``) is bound on the
    first call (`_packed_build`)."""
    b = len(packed.tables)
    length = phi.shape[-1] if isinstance(phi, Tensor) and phi.ndim >= 2 else -1
    if length < packed.l_max:
        return None
    given = _given_torsions(phi, psi, omega, chi, length)
    if given is None or phi.shape[-2] != b or not _serves(phi):
        return None
    batch = tuple(phi.shape[:-2])
    bound = memo(packed, "bound", dict)
    if method == "auto" and _auto(bound, packed.table, math.prod(batch)) != "fused":
        return None
    tb = bound.get(("build", length))
    if tb is None:
        tb = bound[("build", length)] = _packed_build(packed, length)
    parts = [v * _DEG if degrees and v is not None else v for v in given]
    if parts[2] is None or parts[3] is None:  # the template's trans omega and default chi (radians)
        default_omega, default_chi = _defaults(packed, phi.dtype, phi.device, length)
        parts[2] = default_omega.expand(*batch, b, length) if parts[2] is None else parts[2]
        parts[3] = default_chi.expand(*batch, b, length, 4) if parts[3] is None else parts[3]
    return tb(*parts, batch=batch).unflatten(-2, (b, packed.n_max))


def _defaults(
    packed: PackedProteins, dtype: torch.dtype, device: torch.device, length: int
) -> tuple[Tensor, ...]:
    """Trans omega ``(B, L_pad)`` and the default chi ``(B, L_pad, 4)`` (zeros past ``L_max``; radians),
    plain tensors cast once per dtype, device and ``L_pad``."""
    cache = memo(packed, "defaults", dict)
    key = (dtype, device, length)
    if key not in cache:
        with _static_tensors():
            chi = torch.zeros(len(packed.tables), length, 4, dtype=torch.float64)
            chi[:, : packed.l_max] = packed.default_chi
            omega = torch.full(chi.shape[:-1], math.pi, dtype=torch.float64)
            cache[key] = (omega.to(dtype=dtype, device=device), chi.to(dtype=dtype, device=device))
    return cache[key]


def _packed_build(packed: PackedProteins, length: int | None = None) -> TorsionBuild:
    """The `TorsionBuild` of a packed table, writing the padded ``(B N_max)`` layout and reading
    torsions padded to ``length`` residues (default ``L_max``), assembled from the sequences' cached plans
    and arrays (`_bound_part`): a new combination of cached sequences costs the concatenation of
    their plans with offsets and the padded value arrays, no re-planning."""
    parts = [_bound_part(t) for t in packed.tables]
    b, l_max = len(parts), packed.l_max if length is None else length
    kernel_plan = compose_padded([p.plan for p in parts], packed.table.topology, packed.n_max)
    # value k of the packed layout cat([phi, psi, omega (B L_max each), chi (4 B L_max)]), see _layout
    slots = np.concatenate(
        [p.base + p.column * (b * l_max) + p.step * (k * l_max) for k, p in enumerate(parts)]
    )
    return TorsionBuild.padded(
        configure(kernel_plan, None, True),
        [(p.values, p.rows) for p in parts],
        slots,
        7 * b * l_max,
        packed.n_max,
        functools.partial(_table_plan, packed.table),
    )


def _table_plan(table: Any) -> Any:
    return configure(table.plan("fused", torch.device("cpu")), None, True)


class _BoundPart(NamedTuple):
    """A sequence's share of a packed `TorsionBuild` (numpy, made once per sequence)."""

    plan: Any  # its fused plan (CPU)
    values: np.ndarray  # (3, N) float64 template bonds, angles, dihedrals
    rows: np.ndarray  # (R,) atoms reading a torsion
    base: np.ndarray  # (R,), column, step: the torsion read, base + column P + step k L_max (see _layout)
    column: np.ndarray
    step: np.ndarray


def _bound_part(t: Any) -> _BoundPart:
    """The `_BoundPart` of a [`ProteinTable`][batched_nerf.protein.ProteinTable] (kept on it)."""
    return memo(t, "bound_part", lambda: _new_bound_part(t))


def _new_bound_part(t: Any) -> _BoundPart:
    """`_bound_part`, made."""
    layout = _layout(t)
    rows = np.flatnonzero(layout.weights[0])
    return _BoundPart(
        plan=t.table.plan("fused", torch.device("cpu")),
        values=layout.values.astype(np.float64),
        rows=rows,
        base=layout.base[rows],
        column=layout.weights[1][rows],
        step=layout.weights[2][rows],
    )
