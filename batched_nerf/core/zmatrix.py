"""The [`ZMatrix`][batched_nerf.ZMatrix] container: a construction table with its values, atoms and labels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..topology.analysis import as_index_array
from ..topology.auto import link_components
from .checks import as_float, broadcast_fixed, broadcast_internal, check_table, to_tensor
from .convert import Method, to_cartesian, to_internal
from .table import ConstructionTable

__all__ = ["ZMatrix"]


def _as_values(value: Any, name: str, like: Tensor | None) -> Tensor:
    return as_float(value, name, like, default_dtype=torch.float64)


def _as_names(values: Sequence[str] | None, n: int, what: str) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        raise TypeError(f"{what} must be a sequence of {n} strings, not a single string")
    out = [str(v) for v in values]
    if len(out) != n:
        raise ValueError(f"got {len(out)} {what} for {n} rows of the table")
    return out


class ZMatrix:
    """A Z-matrix: construction table, internal coordinates, atoms, labels and bond graph.

    The one container of the package for a molecule in internal coordinates:
    the file readers return it, shipped molecules load as one
    ([`batched_nerf.data.load`][batched_nerf.data.load]), and the command line works on it.

    The values are tensors ``(..., N)`` over the ``N`` rows of ``table``
    (bond lengths in any length unit, angles and IUPAC dihedrals in
    **radians**); leading dimensions are a batch of conformations and broadcast
    against each other. Rows may be *dummy* atoms, which take part in the build
    but are not atoms of the molecule: chemcoord's absolute references
    ``origin``/``e_x``/``e_y``/``e_z`` (fixed atoms, see
    [`from_chemcoord`][batched_nerf.formats.from_chemcoord]) and Gaussian's ``X`` atoms.
    [`real`][batched_nerf.ZMatrix.real] marks the others; [`to_cartesian`][batched_nerf.ZMatrix.to_cartesian]
    returns only those.

    Args:
        table: the [`ConstructionTable`][batched_nerf.ConstructionTable] of the ``N`` rows.
        bonds: ``(..., N)`` bond lengths (entries a row does not use are ignored).
        angles: ``(..., N)`` bond angles in radians.
        dihedrals: ``(..., N)`` IUPAC dihedrals in radians.
        fixed_xyz: ``(..., F, 3)`` positions of the ``table.fixed`` atoms; required
            when the table has fixed atoms.
        elements: optional ``N`` element symbols (``"X"`` for dummies).
        labels: optional ``N`` atom labels (names such as ``"CA"``).
        real: optional ``(N,)`` boolean mask of the rows that are atoms of the
            molecule; all rows by default.
        connectivity: optional ``(E, 2)`` integer pairs of bonded rows: the
            chemical bond graph (ring closures included), which the table's
            references need not follow.
        name: optional name of the molecule.
        metadata: optional dictionary of extras (provenance, named rows, ...).

    Raises:
        TypeError: ``table`` is not a ConstructionTable, a value is complex or
            boolean, or ``elements``/``labels`` is a single string.
        ValueError: values whose last dimension is not ``N`` or that do not
            broadcast, a missing, superfluous or misshaped ``fixed_xyz``, or
            ``elements``/``labels``/``real`` of the wrong length, or a
            ``connectivity`` that is not ``(E, 2)`` row pairs.

    Example:
        >>> import torch, batched_nerf as bn
        >>> from batched_nerf.core.zmatrix import ZMatrix
        >>> table = bn.ConstructionTable([[-1, -1, -1], [0, -1, -1], [0, 1, -1]])
        >>> water = ZMatrix(table, [0.0, 0.96, 0.96], [0.0, 0.0, 1.824], [0.0, 0.0, 0.0],
        ...                 elements=["O", "H", "H"])
        >>> water
        ZMatrix(n_atoms=3, batch_shape=(), dtype=torch.float64, elements='H2O')
        >>> water.to_cartesian().shape
        torch.Size([3, 3])
    """

    def __init__(
        self,
        table: ConstructionTable,
        bonds: Any,
        angles: Any,
        dihedrals: Any,
        fixed_xyz: Any = None,
        elements: Sequence[str] | None = None,
        labels: Sequence[str] | None = None,
        *,
        real: Any = None,
        connectivity: Any = None,
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        n = check_table(table).n_atoms
        b, a, d = broadcast_internal(bonds, angles, dihedrals, table, default_dtype=torch.float64)
        fixed = broadcast_fixed(fixed_xyz, table, b)
        if real is None:
            mask = torch.ones(n, dtype=torch.bool)
        else:
            mask = to_tensor(real, "real").detach().cpu()
            if mask.dtype != torch.bool or mask.shape != (n,):
                raise ValueError(
                    f"real must be a boolean mask of shape ({n},), got {mask.dtype} {tuple(mask.shape)}"
                )
            mask = mask.clone()
        self._table = table
        self._bonds, self._angles, self._dihedrals = b, a, d
        self._fixed_xyz = fixed
        self._elements = _as_names(elements, n, "elements")
        self._labels = _as_names(labels, n, "labels")
        self._real = mask
        self._connectivity = None if connectivity is None else _as_connectivity(connectivity, n)
        self._name = None if name is None else str(name)
        self._metadata = dict(metadata or {})

    # ------------------------------------------------------------- properties
    @property
    def table(self) -> ConstructionTable:
        """The [`ConstructionTable`][batched_nerf.ConstructionTable] of all rows (dummies included)."""
        return self._table

    @property
    def bonds(self) -> Tensor:
        """``(..., N)`` bond lengths."""
        return self._bonds

    @property
    def angles(self) -> Tensor:
        """``(..., N)`` bond angles in radians."""
        return self._angles

    @property
    def dihedrals(self) -> Tensor:
        """``(..., N)`` IUPAC dihedrals in radians."""
        return self._dihedrals

    @property
    def fixed_xyz(self) -> Tensor | None:
        """``(..., F, 3)`` positions of the fixed atoms, or ``None`` without fixed atoms."""
        return self._fixed_xyz

    @property
    def elements(self) -> list[str] | None:
        """``N`` element symbols of all rows, or ``None``."""
        return None if self._elements is None else list(self._elements)

    @property
    def labels(self) -> list[str] | None:
        """``N`` labels of all rows, or ``None``."""
        return None if self._labels is None else list(self._labels)

    @property
    def real(self) -> Tensor:
        """``(N,)`` boolean mask of the rows that are atoms of the molecule (not dummies)."""
        return self._real.clone()

    @property
    def real_elements(self) -> list[str] | None:
        """Element symbols of the real atoms (matching [`to_cartesian`][batched_nerf.ZMatrix.to_cartesian]),
        or ``None``."""
        if self._elements is None:
            return None
        return [e for e, keep in zip(self._elements, self._real.tolist()) if keep]

    @property
    def real_labels(self) -> list[str] | None:
        """Labels of the real atoms (matching [`to_cartesian`][batched_nerf.ZMatrix.to_cartesian]), or
        ``None``."""
        if self._labels is None:
            return None
        return [e for e, keep in zip(self._labels, self._real.tolist()) if keep]

    @property
    def connectivity(self) -> np.ndarray | None:
        """``(E, 2)`` ``int64`` bonded row pairs ``i < j`` (read-only), or ``None`` if unknown."""
        return self._connectivity

    @property
    def name(self) -> str | None:
        """Name of the molecule, or ``None``."""
        return self._name

    @property
    def metadata(self) -> dict[str, Any]:
        """Extras (a copy): provenance, named rows such as ``"phi_row"``, ..."""
        return dict(self._metadata)

    @property
    def n_atoms(self) -> int:
        """Number of rows ``N``, dummy atoms included (as ``table.n_atoms``)."""
        return self._table.n_atoms

    @property
    def n_real(self) -> int:
        """Number of real atoms: the rows [`to_cartesian`][batched_nerf.ZMatrix.to_cartesian] returns."""
        return int(self._real.sum())

    @property
    def batch_shape(self) -> torch.Size:
        """The broadcast leading shape of the values and ``fixed_xyz``."""
        shape = self._bonds.shape[:-1]
        if self._fixed_xyz is not None:
            shape = torch.broadcast_shapes(shape, self._fixed_xyz.shape[:-2])
        return shape

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the values."""
        return self._bonds.dtype

    @property
    def device(self) -> torch.device:
        """Device of the values."""
        return self._bonds.device

    def __len__(self) -> int:
        shape = self.batch_shape
        if not shape:
            raise TypeError("len() of an unbatched ZMatrix")
        return shape[0]

    def __repr__(self) -> str:
        parts = [f"name={self._name!r}"] if self._name else []
        parts.append(f"n_atoms={self.n_atoms}")
        if self.n_real != self.n_atoms:
            parts.append(f"n_dummies={self.n_atoms - self.n_real}")
        parts += [f"batch_shape={tuple(self.batch_shape)}", f"dtype={self.dtype}"]
        if self.device.type != "cpu":
            parts.append(f"device={self.device}")
        if self._elements is not None:
            parts.append(f"elements={formula(self.real_elements or [])!r}")
        return f"ZMatrix({', '.join(parts)})"

    # ---------------------------------------------------------------- methods
    def _replace(self, bonds: Tensor, angles: Tensor, dihedrals: Tensor, fixed: Tensor | None) -> ZMatrix:
        return ZMatrix(
            self._table,
            bonds,
            angles,
            dihedrals,
            fixed,
            self._elements,
            self._labels,
            real=self._real,
            connectivity=self._connectivity,
            name=self._name,
            metadata=self._metadata,
        )

    def to_cartesian(self, method: Method = "auto", *, dummies: bool = False) -> Tensor:
        """Cartesian coordinates of the real atoms, in row order.

        Args:
            method: the engine, see [`to_cartesian`][batched_nerf.to_cartesian].
            dummies: also return the dummy rows (all ``N`` rows).

        Returns:
            ``(..., n_real, 3)`` (``(..., N, 3)`` with ``dummies=True``), dtype
            and device of the values; differentiable.

        Example:
            >>> import torch, batched_nerf as bn
            >>> from batched_nerf.core.zmatrix import ZMatrix
            >>> z = ZMatrix(bn.ConstructionTable.chain(4), torch.ones(5, 4), torch.full((5, 4), 2.0),
            ...             torch.linspace(-3, 3, 5)[:, None].expand(5, 4))
            >>> z.to_cartesian().shape
            torch.Size([5, 4, 3])
        """
        xyz = to_cartesian(
            self._bonds, self._angles, self._dihedrals, self._table, fixed_xyz=self._fixed_xyz, method=method
        )
        if dummies or bool(self._real.all()):
            return xyz
        return xyz[..., self._real.to(xyz.device), :]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> ZMatrix:
        """A copy with the values (and ``fixed_xyz``) on ``device`` and/or in ``dtype``.

        Args:
            device: target device (unchanged if ``None``).
            dtype: target floating dtype (unchanged if ``None``).

        Returns:
            A new [`ZMatrix`][batched_nerf.ZMatrix] sharing the table, elements and labels.

        Raises:
            TypeError: for a non-floating ``dtype``.

        Example:
            >>> import torch, batched_nerf as bn
            >>> from batched_nerf.core.zmatrix import ZMatrix
            >>> z = ZMatrix(bn.ConstructionTable.chain(3), [0.0, 1.0, 1.0], [0.0, 0.0, 2.0], [0.0] * 3)
            >>> z.to(dtype=torch.float32).dtype
            torch.float32
        """
        if dtype is not None and not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating dtype, got {dtype}")

        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device=device, dtype=dtype)

        b, a, d = (move(t) for t in (self._bonds, self._angles, self._dihedrals))
        assert b is not None and a is not None and d is not None
        return self._replace(b, a, d, move(self._fixed_xyz))

    def __getitem__(self, index: Any) -> ZMatrix:
        """Index the batch dimensions: ``z[3]``, ``z[:10]``, ``z[mask]``.

        Raises:
            IndexError: for an unbatched ZMatrix or an out-of-range index.

        Example:
            >>> import torch, batched_nerf as bn
            >>> from batched_nerf.core.zmatrix import ZMatrix
            >>> ones = torch.ones(8, 4)
            >>> z = ZMatrix(bn.ConstructionTable.chain(4), ones, ones, 0 * ones)
            >>> z[2:5].batch_shape, z[0].batch_shape
            (torch.Size([3]), torch.Size([]))
        """
        shape = self.batch_shape
        if not shape:
            raise IndexError("cannot index an unbatched ZMatrix (batch_shape is ())")
        n = self.n_atoms
        b, a, d = (t.expand(*shape, n)[index] for t in (self._bonds, self._angles, self._dihedrals))
        fixed = None
        if self._fixed_xyz is not None:
            fixed = self._fixed_xyz.expand(*shape, *self._fixed_xyz.shape[-2:])[index]
        if b.ndim == 0 or b.shape[-1] != n:
            raise IndexError("a ZMatrix index may only select along the batch dimensions")
        return self._replace(b, a, d, fixed)

    @classmethod
    def from_cartesian(
        cls,
        xyz: Any,
        table: ConstructionTable | None = None,
        elements: Sequence[str] | None = None,
        labels: Sequence[str] | None = None,
        *,
        link_fragments: bool = True,
    ) -> ZMatrix:
        """The Z-matrix of Cartesian coordinates, for a given or an automatic construction table.

        Without ``table``, the table is
        [`ConstructionTable.from_xyz`][batched_nerf.ConstructionTable.from_xyz] of the first conformation
        (bonds perceived from ``elements``). A table of several seeded
        components (the molecules of a dimer, the ions of a salt, each with its
        own seed triple) would drop their placement relative to each other, so
        by default its components are linked into one build first
        (`batched_nerf.topology.auto.link_components`: each further
        component's seed rows reference the nearest atoms already placed, in the
        first conformation); the returned [`table`][batched_nerf.ZMatrix.table] is then that linked
        table, and [`nonbonded_references`][batched_nerf.nonbonded_references] marks the links.
        With ``link_fragments=False`` the components keep their own seeds and
        each is reproduced only up to its own rigid motion.

        Args:
            xyz: ``(..., N, 3)`` coordinates of the ``N`` rows of ``table``; the
                positions of fixed atoms become ``fixed_xyz``. Floating tensors
                keep their dtype; integer tensors and all array-likes become
                ``float64``.
            table: the [`ConstructionTable`][batched_nerf.ConstructionTable], or ``None`` to
                choose one from the bonds (needs ``elements``).
            elements: optional ``N`` element symbols (required without ``table``).
            labels: optional ``N`` labels.
            link_fragments: link separate components into one build (default).

        Returns:
            A [`ZMatrix`][batched_nerf.ZMatrix] (all rows real) whose
            [`to_cartesian`][batched_nerf.ZMatrix.to_cartesian]
            reproduces ``xyz`` up to one rigid motion (exactly, for tables
            anchored by fixed atoms).

        Raises:
            TypeError: ``table`` is neither a ConstructionTable nor ``None``,
                or ``xyz`` is complex or boolean.
            ValueError: ``xyz`` is not ``(..., N, 3)``, no ``table`` and no
                ``elements``, bad ``elements``/``labels``, or a row whose
                position the Z-matrix cannot hold (naming the row and the
                conformation): its dihedral reference triple ``b-a-d`` is linear
                while the angle ``i-b-a`` is not (the dihedral is undefined), or
                its angle references coincide.

        Example:
            >>> import torch, batched_nerf as bn
            >>> from batched_nerf.core.zmatrix import ZMatrix
            >>> xyz = torch.tensor([[0.0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
            >>> z = ZMatrix.from_cartesian(xyz, bn.ConstructionTable.chain(4))
            >>> torch.allclose(z.to_cartesian(), xyz)
            True
        """
        if table is not None:
            check_table(table)
        if isinstance(xyz, Tensor) and (xyz.is_complex() or xyz.dtype == torch.bool):
            raise TypeError(f"xyz must hold real coordinates, got dtype {xyz.dtype}")
        floating = isinstance(xyz, Tensor) and xyz.is_floating_point()
        x = xyz if floating else to_tensor(xyz, "xyz", dtype=torch.float64)  # integers: float64
        if x.ndim < 2 or x.shape[-1] != 3:
            raise ValueError(f"xyz must have shape (..., N, 3), got {tuple(x.shape)}")
        first = x.detach().reshape(-1, *x.shape[-2:])[0].cpu().double().numpy()
        if table is None:
            if elements is None:
                raise ValueError("from_cartesian without a table needs elements (to perceive the bonds)")
            table = ConstructionTable.from_xyz(first, elements, link_fragments=link_fragments)
        elif link_fragments and table.n_components > 1 and first.shape[0] == table.n_atoms:
            refs = link_components(table.refs.numpy(), first, fixed=table.fixed.numpy())
            if not np.array_equal(refs, table.refs.numpy()):
                table = ConstructionTable(refs, fixed=table.fixed)
        ic = to_internal(x, table)
        _check_rebuildable(x, table)
        fixed = None
        if table.n_fixed:
            fixed = x.index_select(-2, table.fixed.to(x.device))
        return cls(table, ic.bonds, ic.angles, ic.dihedrals, fixed, elements, labels)


def _as_connectivity(value: Any, n: int) -> np.ndarray:
    """``(E, 2)`` bonded pairs of rows ``< n`` as sorted unique read-only int64 pairs ``i < j``.

    Raises:
        ValueError: not ``(E, 2)`` integers, an index out of range, or a self-bond.
    """
    pairs = as_index_array(value, "connectivity")
    if pairs.size == 0:
        pairs = pairs.reshape(0, 2)
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"connectivity must have shape (E, 2), got {tuple(pairs.shape)}")
    bad = (pairs < 0) | (pairs >= n)
    if bad.any():
        k = int(np.flatnonzero(bad.any(1))[0])
        raise ValueError(f"connectivity[{k}] = {pairs[k].tolist()}: atom index out of range [0, {n - 1}]")
    loops = pairs[:, 0] == pairs[:, 1]
    if loops.any():
        k = int(np.flatnonzero(loops)[0])
        raise ValueError(f"connectivity[{k}] = {pairs[k].tolist()} bonds an atom to itself")
    pairs = np.unique(np.sort(pairs, axis=1), axis=0)
    pairs.setflags(write=False)
    return pairs


def _check_rebuildable(xyz: Tensor, table: ConstructionTable) -> None:
    """Raise when a row's position is not determined by its internal coordinates.

    A row ``(b, a, d)`` whose angle ``i-b-a`` is not straight needs a dihedral,
    which is undefined when ``b``, ``a`` and ``d`` are collinear; an angle is
    undefined when ``b`` and ``a`` coincide. Tolerance: ``sqrt(eps)`` of the
    dtype on the sine of the angles.
    """
    refs = table.refs.to(xyz.device)
    x = xyz.detach().reshape(-1, *xyz.shape[-2:])
    tol = torch.finfo(x.dtype).eps ** 0.5 if x.dtype.is_floating_point else 1e-8

    def pos(col: Tensor) -> Tensor:
        return x[:, col.clamp(min=0), :]

    def sin_at(p: Tensor, q: Tensor, r: Tensor) -> Tensor:
        u, v = p - q, r - q
        nu, nv = u.norm(dim=-1), v.norm(dim=-1)
        return torch.linalg.cross(u, v).norm(dim=-1) / (nu * nv).clamp(min=torch.finfo(x.dtype).tiny)

    i = torch.arange(table.n_atoms, device=x.device)
    b, a, d = refs[:, 0], refs[:, 1], refs[:, 2]
    xb, xa = pos(b), pos(a)
    axis = (xb - xa).norm(dim=-1) <= tol * (1 + xb.norm(dim=-1))
    bad_angle = (a >= 0) & axis
    bent = sin_at(x[:, i, :], xb, xa) > tol
    bad_dihedral = (d >= 0) & bent & ~axis & (sin_at(xb, xa, pos(d)) <= tol)
    for mask, what in (
        (bad_angle, "its bond and angle references {b} and {a} coincide, so the angle is undefined"),
        (
            bad_dihedral,
            "its dihedral reference triple {b}-{a}-{d} is collinear while the angle {i}-{b}-{a} is "
            "not, so the dihedral is undefined",
        ),
    ):
        hits = torch.nonzero(mask)
        if hits.numel():
            conf, row = (int(v) for v in hits[0].tolist())
            rb, ra, rd = (int(v) for v in table.refs[row].tolist())
            raise ValueError(
                f"row {row}: in conformation {conf}, "
                + what.format(i=row, b=rb, a=ra, d=rd)
                + f" and the position of atom {row} cannot be rebuilt ({hits.shape[0]} such row(s)); "
                "choose other references (ConstructionTable.from_xyz avoids near-linear triples)"
            )


def formula(elements: Sequence[str]) -> str:
    """Hill formula (C, H, then alphabetical; alphabetical without C): ``['O', 'H', 'H'] -> 'H2O'``."""
    counts: dict[str, int] = {}
    for e in elements:
        counts[e] = counts.get(e, 0) + 1
    first = ["C", "H"] if "C" in counts else []
    order = [e for e in first if e in counts] + sorted(e for e in counts if e not in first)
    return "".join(f"{e}{counts[e] if counts[e] > 1 else ''}" for e in order)
