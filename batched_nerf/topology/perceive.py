"""Bond perception from coordinates: covalent radii, coincident atoms, a unit check.

Two atoms ``i, j`` are bonded when ``|x_i - x_j| < scale * (r_i + r_j)`` with
the single-bond covalent radii ``r`` of Cordero et al. (see
`COVALENT_RADII`) and ``scale = 1.3`` by default. The default sits in an
empty gap of the distance ratios ``|x_i - x_j| / (r_i + r_j)`` of ASE's G2 and
S22 sets: the longest bonds there (F2 at 1.25, the O-O of peroxides, S-S
bridges, Cl2, Br2, I2 below it) and the shortest non-bonded contacts (1,3
distances and hydrogen bonds, above 1.35).

Nothing silent: coincident or near-coincident atoms raise (naming both atoms),
and coordinates in which most atoms have no bond at all (as coordinates in
bohr read as Angstrom) give a warning naming the closest pair.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "COINCIDENT_FRACTION",
    "COVALENT_RADII",
    "DEFAULT_SCALE",
    "as_xyz",
    "atomic_number",
    "element_symbol",
    "perceive_connectivity",
]

#: Single-bond covalent radii in Angstrom for the elements ``Z = 1 .. 96``, in
#: order of ``Z``: B. Cordero, V. Gomez, A. E. Platero-Prats, M. Reves,
#: J. Echeverria, E. Cremades, F. Barragan and S. Alvarez, "Covalent radii
#: revisited", Dalton Trans. 2008, 2832-2838 (table 2; sp3 carbon, low-spin
#: Mn, Fe and Co). The same values as ``ase.data.covalent_radii``.
COVALENT_RADII: dict[str, float] = {
    "H": 0.31, "He": 0.28, "Li": 1.28, "Be": 0.96, "B": 0.84, "C": 0.76, "N": 0.71, "O": 0.66,
    "F": 0.57, "Ne": 0.58, "Na": 1.66, "Mg": 1.41, "Al": 1.21, "Si": 1.11, "P": 1.07, "S": 1.05,
    "Cl": 1.02, "Ar": 1.06, "K": 2.03, "Ca": 1.76, "Sc": 1.70, "Ti": 1.60, "V": 1.53, "Cr": 1.39,
    "Mn": 1.39, "Fe": 1.32, "Co": 1.26, "Ni": 1.24, "Cu": 1.32, "Zn": 1.22, "Ga": 1.22, "Ge": 1.20,
    "As": 1.19, "Se": 1.20, "Br": 1.20, "Kr": 1.16, "Rb": 2.20, "Sr": 1.95, "Y": 1.90, "Zr": 1.75,
    "Nb": 1.64, "Mo": 1.54, "Tc": 1.47, "Ru": 1.46, "Rh": 1.42, "Pd": 1.39, "Ag": 1.45, "Cd": 1.44,
    "In": 1.42, "Sn": 1.39, "Sb": 1.39, "Te": 1.38, "I": 1.39, "Xe": 1.40, "Cs": 2.44, "Ba": 2.15,
    "La": 2.07, "Ce": 2.04, "Pr": 2.03, "Nd": 2.01, "Pm": 1.99, "Sm": 1.98, "Eu": 1.98, "Gd": 1.96,
    "Tb": 1.94, "Dy": 1.92, "Ho": 1.92, "Er": 1.89, "Tm": 1.90, "Yb": 1.87, "Lu": 1.87, "Hf": 1.75,
    "Ta": 1.70, "W": 1.62, "Re": 1.51, "Os": 1.44, "Ir": 1.41, "Pt": 1.36, "Au": 1.36, "Hg": 1.32,
    "Tl": 1.45, "Pb": 1.46, "Bi": 1.48, "Po": 1.40, "At": 1.50, "Rn": 1.50, "Fr": 2.60, "Ra": 2.21,
    "Ac": 2.15, "Th": 2.06, "Pa": 2.00, "U": 1.96, "Np": 1.90, "Pu": 1.87, "Am": 1.80, "Cm": 1.69,
}  # fmt: skip

#: Symbols accepted besides the elements: the hydrogen isotopes (bonded as H)
#: and the dummy atom ``X`` (Gaussian's symbol; never bonded).
_EXTRA = {"D": 1, "T": 1, "X": 0}
_NUMBER = {**{s: z for z, s in enumerate(COVALENT_RADII, start=1)}, **_EXTRA}

#: Default tolerance factor on the sum of covalent radii.
DEFAULT_SCALE = 1.3

#: Atoms closer than this fraction of the sum of their covalent radii are
#: rejected as coincident (the shortest real bond, H2, is 1.19 times the sum).
COINCIDENT_FRACTION = 0.4

#: Ratio bohr / Angstrom, quoted in the unit warning.
_ANGSTROM_PER_BOHR = 0.529177210903


def element_symbol(symbol: str, index: int | None = None) -> str:
    """The canonical spelling (``"Cl"``) of an element, ``"D"``, ``"T"`` or ``"X"``, any case.

    Raises:
        ValueError: an unknown symbol (naming ``index`` when given).

    Example:
        >>> from batched_nerf.topology.perceive import element_symbol
        >>> element_symbol("CL"), element_symbol("d"), element_symbol("x")
        ('Cl', 'D', 'X')
    """
    s = str(symbol).strip()
    s = s[:1].upper() + s[1:].lower()
    if s not in _NUMBER:
        where = "" if index is None else f" at index {index}"
        raise ValueError(
            f"unknown element {symbol!r}{where}; known: the elements H to Cm, D and T (hydrogen "
            "isotopes) and X (dummy atom)"
        )
    return s


def atomic_number(symbol: str) -> int:
    """Atomic number ``Z`` of a symbol (``1`` for ``D``/``T``, ``0`` for the dummy ``X``).

    Example:
        >>> from batched_nerf.topology.perceive import atomic_number
        >>> atomic_number("C"), atomic_number("D"), atomic_number("X")
        (6, 1, 0)
    """
    return _NUMBER[element_symbol(symbol)]


def _radius(symbol: str) -> float:
    z = _NUMBER[symbol]
    return 0.0 if z == 0 else COVALENT_RADII["H" if z == 1 else symbol]


def _symbols(elements: Sequence[Any]) -> list[str]:
    """Canonical symbols of ``elements`` (each distinct spelling checked once), naming the first bad index."""
    names = [str(el) for el in elements]
    canonical: dict[str, str] = {}
    for name in set(names):
        try:
            canonical[name] = element_symbol(name)
        except ValueError:
            k = names.index(name)
            element_symbol(elements[k], k)  # raises, naming the index
    return [canonical[name] for name in names]


def as_xyz(xyz: Any, n_atoms: int | None = None, what: str = "xyz") -> np.ndarray:
    """``(N, 3)`` float64 numpy copy of coordinates (numpy, lists or torch, also inside ``torch.func``
    transforms other than ``vmap``); checks shape, finiteness."""
    if hasattr(xyz, "detach"):
        from ..runtime.torch_compat import values_of

        xyz = values_of(xyz, what)
    arr = np.asarray(xyz, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 3 or (n_atoms is not None and arr.shape[0] != n_atoms):
        want = f"({n_atoms}, 3)" if n_atoms is not None else "(N, 3)"
        raise ValueError(f"{what} must have shape {want}, got {tuple(arr.shape)}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} contains NaN or infinite values")
    return arr


#: Neighbour search backend: ``"auto"`` (scipy's cKDTree when importable, else numpy), ``"numpy"``
#: (a cell list) or ``"scipy"``. Both give identical results: candidates are filtered with the
#: same numpy distance test.
_BACKEND = "auto"

#: Candidate pairs handled per numpy step of the cell list (bounds the memory).
_CHUNK = 1 << 21


@contextlib.contextmanager
def neighbour_backend(name: str) -> Iterator[None]:
    """Use the ``"numpy"`` cell list or scipy's ``"scipy"`` cKDTree (or ``"auto"``) for neighbour search.

    Raises:
        ValueError: an unknown backend name.

    Example:
        >>> from batched_nerf.topology.perceive import close_pairs, neighbour_backend
        >>> import numpy as np
        >>> with neighbour_backend("numpy"):
        ...     close_pairs(np.array([[0.0, 0, 0], [1.0, 0, 0], [5.0, 0, 0]]), np.full(3, 0.6)).tolist()
        [[0, 1]]
    """
    global _BACKEND
    if name not in ("auto", "numpy", "scipy"):
        raise ValueError(f"unknown neighbour backend {name!r}; expected 'auto', 'numpy' or 'scipy'")
    old, _BACKEND = _BACKEND, name
    try:
        yield
    finally:
        _BACKEND = old


def _kdtree() -> Any:
    """scipy's ``cKDTree`` class when the backend allows it and scipy is importable, else ``None``."""
    if _BACKEND == "numpy":
        return None
    try:
        from scipy.spatial import cKDTree
    except ImportError:  # pragma: no cover - depends on the environment
        if _BACKEND == "scipy":
            raise ImportError("neighbour backend 'scipy' needs scipy: pip install scipy") from None
        return None
    return cKDTree


def _cells(points: np.ndarray, origin: np.ndarray, h: float) -> np.ndarray:
    return np.floor((points - origin) / h).astype(np.int64) + 1  # one empty layer of padding


#: The 27 cell offsets of a neighbourhood, and the 14 of a half one (each unordered cell pair once).
_OFFSETS = list(itertools.product((-1, 0, 1), repeat=3))
_HALF = [o for o in _OFFSETS if o >= (0, 0, 0)]


def _cell_candidates(
    a: np.ndarray, b: np.ndarray, radius: float, offsets: list[tuple[int, ...]] = _OFFSETS
) -> Iterator[tuple[np.ndarray, np.ndarray, bool]]:
    """Chunks ``(ia, ib, same_cell)`` of index pairs of points in neighbouring cells of side ``>= radius``.

    Every pair closer than ``radius`` is among them (and more); no Python loop over points.
    With ``a is b`` and the half neighbourhood `_HALF`, the same-cell
    chunks hold each pair in both orders, the others each pair once.
    """
    both = np.concatenate([a, b])
    lo = both.min(0)
    extent = float((both.max(0) - lo).max())
    h = max(float(radius), extent / 2**16, 1e-300)  # at most 2^16 cells per axis
    ca, cb = _cells(a, lo, h), _cells(b, lo, h)
    dims = np.maximum(ca.max(0), cb.max(0)) + 2
    key_a = (ca[:, 0] * dims[1] + ca[:, 1]) * dims[2] + ca[:, 2]
    key_b = (cb[:, 0] * dims[1] + cb[:, 1]) * dims[2] + cb[:, 2]
    order = np.argsort(key_b, kind="stable")
    sorted_b = key_b[order]
    n_cells = int(np.prod(dims))
    dense = n_cells <= max(8 * len(b), 1 << 16)  # a table per cell, else binary search
    if dense:
        cell_count = np.bincount(key_b, minlength=n_cells)
        cell_first = np.cumsum(cell_count) - cell_count
    for dx, dy, dz in offsets:
        nid = key_a + (dx * dims[1] + dy) * dims[2] + dz
        if dense:
            first, counts = cell_first[nid], cell_count[nid]
        else:
            first = np.searchsorted(sorted_b, nid, "left")
            counts = np.searchsorted(sorted_b, nid, "right") - first
        total = np.cumsum(counts)
        start = 0
        while start < len(a):  # chunks of about _CHUNK pairs
            base = int(total[start - 1]) if start else 0
            stop = max(int(np.searchsorted(total, base + _CHUNK, "right")), start + 1)
            cnt = counts[start:stop]
            ia = np.repeat(np.arange(start, stop), cnt)
            offset = np.repeat(first[start:stop] - (total[start:stop] - cnt - base), cnt)
            yield ia, order[offset + np.arange(len(ia))], (dx, dy, dz) == (0, 0, 0)
            start = stop


def pairs_within(
    a: np.ndarray,
    b: np.ndarray,
    radius: float,
    allow: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index pairs ``(ia, ib)`` with ``|a[ia] - b[ib]| < radius`` (and ``allow(ia, ib)``), and the distances.

    Unordered; by the numpy cell list. ``allow`` filters candidates before any
    distance is measured.
    """
    empty = np.zeros(0, dtype=np.int64)
    if not len(a) or not len(b) or not radius > 0:
        return empty, empty, np.zeros(0)
    ia_all, ib_all, d_all = [empty], [empty], [np.zeros(0)]
    for ia, ib, _ in _cell_candidates(a, b, radius):
        if allow is not None:
            keep = allow(ia, ib)
            ia, ib = ia[keep], ib[keep]
        dist = np.linalg.norm(b[ib] - a[ia], axis=1)
        keep = dist < radius
        ia_all.append(ia[keep])
        ib_all.append(ib[keep])
        d_all.append(dist[keep])
    return np.concatenate(ia_all), np.concatenate(ib_all), np.concatenate(d_all)


def close_pairs(coords: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """Sorted pairs ``i < j`` with ``|x_i - x_j| < reach_i + reach_j`` (cell list or KD-tree: linear)."""
    n = len(coords)
    if n < 2 or not float(reach.max()) > 0:
        return np.zeros((0, 2), dtype=np.int64)
    radius = 2.0 * float(reach.max())
    tree = _kdtree()
    if tree is not None:
        found = tree(coords).query_pairs(radius * (1 + 1e-9), output_type="ndarray").astype(np.int64)
        chunks = [(found.min(1), found.max(1), True)]
    else:
        chunks = _cell_candidates(coords, coords, radius, _HALF)
    found_i, found_j = [], []
    for i, j, same_cell in chunks:
        if same_cell:  # both orders (and i == j): keep i < j
            keep = i < j
            i, j = i[keep], j[keep]
        else:  # each pair once, in either order
            i, j = np.minimum(i, j), np.maximum(i, j)
        close = np.linalg.norm(coords[i] - coords[j], axis=1) < reach[i] + reach[j]
        found_i.append(i[close])
        found_j.append(j[close])
    i, j = np.concatenate(found_i), np.concatenate(found_j)
    order = np.lexsort((j, i))
    return np.stack([i[order], j[order]], axis=1).astype(np.int64)


def check_not_coincident(coords: np.ndarray, reach: np.ndarray, names: Sequence[str] | None = None) -> None:
    """Raise ValueError naming the closest pair ``i, j`` with ``|x_i - x_j| < reach_i + reach_j``."""
    _refuse_coincident(coords, close_pairs(coords, reach), reach, names)


def _refuse_coincident(
    coords: np.ndarray, pairs: np.ndarray, reach: np.ndarray, names: Sequence[str] | None
) -> None:
    """Raise for the closest of ``pairs`` (candidates) with ``|x_i - x_j| < reach_i + reach_j``."""
    if not len(pairs):
        return
    dist = np.linalg.norm(coords[pairs[:, 0]] - coords[pairs[:, 1]], axis=1)
    close = dist < reach[pairs[:, 0]] + reach[pairs[:, 1]]
    pairs, dist = pairs[close], dist[close]
    if not len(pairs):
        return
    k = int(np.argmin(dist))
    i, j = (int(v) for v in pairs[k])
    label = (lambda a: f"{a} ({names[a]})") if names is not None else str
    more = f" ({len(pairs) - 1} more such pair(s))" if len(pairs) > 1 else ""
    raise ValueError(
        f"atoms {label(i)} and {label(j)} are {dist[k]:.6f} apart, closer than "
        f"{float(reach[i] + reach[j]):.4g}: coincident or near-coincident atoms{more} "
        "(a duplicated line, or coordinates not in Angstrom?)"
    )


def perceive_connectivity(xyz: Any, elements: Sequence[str], *, scale: float = DEFAULT_SCALE) -> np.ndarray:
    """Bonded pairs ``(i, j)``, ``i < j``, with ``|x_i - x_j| < scale * (r_i + r_j)``.

    ``r`` are the covalent radii of `COVALENT_RADII` (Cordero et al.
    2008); ``D`` and ``T`` are bonded as hydrogen, dummy atoms ``X`` never.
    The neighbour search is a cell list in numpy (scipy's ``cKDTree`` when
    scipy is importable: the same pairs, faster), linear in ``N``.

    Args:
        xyz: ``(N, 3)`` coordinates in Angstrom (numpy or torch).
        elements: ``N`` element symbols, case-insensitive (``"C"``, ``"cl"``, ``"BR"``).
        scale: tolerance factor on the sum of covalent radii (default 1.3).

    Returns:
        ``(E, 2)`` ``np.int64`` array of bonded pairs, sorted.

    Raises:
        TypeError: ``elements`` given as one string (``"OHH"``) instead of a sequence.
        ValueError: for an unknown element, mismatched lengths, a bad shape, a
            non-positive ``scale``, or two atoms closer than
            `COINCIDENT_FRACTION` (0.4) times the sum of their radii
            (naming both atoms).

    Warns:
        UserWarning: when at least half of the atoms (and at least two) have no
            bond, as for coordinates in bohr: the message names the closest pair.

    Example:
        >>> import batched_nerf as bn
        >>> bn.perceive_connectivity([[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]], ["O", "H", "H"]).tolist()
        [[0, 1], [0, 2]]
    """
    coords = as_xyz(xyz)
    if isinstance(elements, (str, bytes)):
        raise TypeError(
            f"elements must be a sequence of element symbols such as ['O', 'H', 'H'], got the string "
            f"{elements!r} (a string would be split into characters)"
        )
    elements = list(elements)
    if len(elements) != len(coords):
        raise ValueError(f"got {len(elements)} elements for {len(coords)} atoms")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    symbols = _symbols(elements)
    radius = {sym: _radius(sym) for sym in set(symbols)}
    radii = np.array([radius[sym] for sym in symbols], dtype=np.float64).reshape(-1)
    coincident = np.maximum(COINCIDENT_FRACTION / 2 * radii, 5e-5)
    reach = scale * radii
    # one neighbour search serves both tests: its reach covers either
    found = close_pairs(coords, np.maximum(reach, coincident))
    _refuse_coincident(coords, found, coincident, symbols)
    i, j = found[:, 0], found[:, 1]
    real = (radii[i] > 0) & (radii[j] > 0)  # dummy atoms never bond
    bonded = (np.linalg.norm(coords[i] - coords[j], axis=1) < reach[i] + reach[j]) & real
    pairs = found[bonded]
    _warn_if_unbonded(coords, radii, symbols, pairs, scale)
    return pairs


def _warn_if_unbonded(
    coords: np.ndarray, radii: np.ndarray, symbols: list[str], pairs: np.ndarray, scale: float
) -> None:
    real = radii > 0
    bonded = np.zeros(len(coords), dtype=bool)
    bonded[pairs.reshape(-1)] = True
    lonely = np.flatnonzero(real & ~bonded)
    if lonely.size < 2 or 2 * lonely.size < int(real.sum()):
        return
    near = close_pairs(coords, 2.0 * radii)  # pairs within 4 x the sum of radii
    near = near[real[near[:, 0]] & real[near[:, 1]]]  # dummies have no radius to compare with
    closest = ""
    if len(near):
        ratio = np.linalg.norm(coords[near[:, 0]] - coords[near[:, 1]], axis=1) / (
            radii[near[:, 0]] + radii[near[:, 1]]
        )
        k = int(np.argmin(ratio))
        i, j = (int(v) for v in near[k])
        d = float(np.linalg.norm(coords[i] - coords[j]))
        closest = (
            f"; the closest pair, atoms {i} ({symbols[i]}) and {j} ({symbols[j]}), is {d:.4f} apart, "
            f"{ratio[k]:.2f} times the sum of their covalent radii (bonded below {scale:g})"
        )
    warnings.warn(
        f"no bond perceived for {lonely.size} of {int(real.sum())} atoms{closest}. Are the coordinates "
        f"in bohr? Multiply them by {_ANGSTROM_PER_BOHR} for Angstrom. (Noble gases and free ions have "
        "no bonds: then pass the connectivity explicitly, or ignore this warning.)",
        UserWarning,
        stacklevel=3,
    )
