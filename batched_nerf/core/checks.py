"""Input checks shared by every public entry point: each check and its message exists once.

* `check_table`: the ``table`` argument is a [`ConstructionTable`][batched_nerf.ConstructionTable];
* `check_tensor`: an argument that must be a tensor is one (a ``TypeError`` naming the type);
* `to_tensor`: an array-like as a tensor (a ``TypeError`` naming the argument and the
  type for what is none: ``None``, strings, dicts, other objects);
* `as_float`: a real floating tensor from array-likes;
* `cast_like`: a value in the dtype of the coordinates it goes with, never losing precision;
* `broadcast_internal`: ``bonds``, ``angles``, ``dihedrals`` to one ``(..., N)`` shape;
* `broadcast_fixed`: ``fixed_xyz`` ``(..., F, 3)`` for a table's fixed atoms;
* `check_xyz`: ``xyz`` ``(..., N, 3)``;
* `as_box`: a periodic box ``(..., 6)`` or ``(..., 3, 3)`` for coordinates;
* `check_device`: tensors that must share a device do.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._geometry import batch_shape
from .table import ConstructionTable

__all__ = [
    "DEG",
    "as_box",
    "as_float",
    "broadcast_fixed",
    "broadcast_internal",
    "cast_like",
    "check_device",
    "check_table",
    "check_tensor",
    "check_xyz",
    "to_tensor",
]

#: Radians per degree.
DEG = math.pi / 180.0


def check_table(table: Any, name: str = "table") -> ConstructionTable:
    """``table`` itself, after checking that it is a [`ConstructionTable`][batched_nerf.ConstructionTable].

    Raises:
        TypeError: naming the argument and the type it got.
    """
    if not isinstance(table, ConstructionTable):
        raise TypeError(f"{name} must be a ConstructionTable, got {type(table).__name__}")
    return table


def check_tensor(value: Any, name: str) -> Tensor:
    """``value`` itself, after checking that it is a ``torch.Tensor`` (arguments that take no array-likes).

    Raises:
        TypeError: naming the argument and the type it got (for numpy arrays,
            how to convert them).
    """
    if not isinstance(value, Tensor):
        convertible = isinstance(value, (np.ndarray, list, tuple))
        hint = f"; convert it with torch.as_tensor({name})" if convertible else ""
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}{hint}")
    return value


def to_tensor(
    value: Any, name: str, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Tensor:
    """``value`` as a tensor (in ``dtype`` on ``device`` where given), as ``torch.as_tensor`` makes it.

    The one conversion of the public functions' array-like arguments, so that
    every wrong type gets one message. Read-only numpy arrays are copied.

    Raises:
        TypeError: ``value`` is no array of numbers (``None``, a string, a dict,
            another object, a list holding such), naming the argument and the type.
        ValueError: a ragged nested list, naming the argument.
    """
    if isinstance(value, Tensor):  # as torch.as_tensor: cast (and moved) only where asked
        return value if dtype is None and device is None else value.to(dtype=dtype, device=device)
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        value = value.copy()
    what = f"{name} must be a tensor or an array-like of numbers, got {type(value).__name__}"
    if value is None or isinstance(value, (str, bytes, dict)):
        raise TypeError(what)
    try:
        return torch.as_tensor(value, dtype=dtype, device=device)
    except (TypeError, RuntimeError) as exc:  # "Could not infer dtype of ...", "new(): invalid data type ..."
        raise TypeError(f"{what} ({exc})") from None
    except ValueError as exc:  # ragged nested lists, or lists of strings ("too many dimensions 'str'")
        try:
            kind = np.asarray(value).dtype
        except ValueError:  # ragged: numpy refuses it too
            kind = None
        if kind is not None and kind.kind not in "biufc":
            held = {"U": "strings", "S": "bytes", "O": "objects"}.get(kind.kind, str(kind))
            raise TypeError(f"{what} of {held}") from None
        raise ValueError(f"{name} could not be read as an array: {exc}") from None


def as_float(
    value: Any, name: str, like: Tensor | None = None, default_dtype: torch.dtype | None = None
) -> Tensor:
    """A real floating tensor from ``value`` (dtype and device of ``like`` for non-tensors).

    Integer tensors become the default floating dtype.

    Raises:
        TypeError: a complex or boolean value, or no tensor or array-like at all
            (`to_tensor`), naming the argument.
        ValueError: a ragged nested list.
    """
    if not isinstance(value, Tensor):
        value = to_tensor(
            value,
            name,
            dtype=like.dtype if like is not None else default_dtype,
            device=like.device if like is not None else None,
        )
    if value.dtype.is_complex or value.dtype == torch.bool:  # dtype attributes: constants under torch.compile
        raise TypeError(f"{name} must be a real floating tensor, got dtype {value.dtype}")
    if not value.dtype.is_floating_point:
        value = value.to(torch.get_default_dtype())
    return value


def cast_like(value: Any, name: str, like: Tensor, like_name: str) -> Tensor:
    """``value`` as a real tensor in the dtype (and, for array-likes, on the device) of ``like``.

    Array-likes and integer tensors take ``like``'s dtype; a floating tensor of
    a lower precision is promoted. A floating tensor of a higher (or
    incomparable) precision is not cast down silently.

    Raises:
        TypeError: a complex or boolean value, or a floating tensor whose dtype
            ``like.dtype`` cannot hold (naming both dtypes).
    """
    t = as_float(value, name, like)
    if (
        isinstance(value, Tensor)
        and value.is_floating_point()
        and torch.promote_types(value.dtype, like.dtype) != like.dtype
    ):
        raise TypeError(
            f"{name} has dtype {value.dtype} but {like_name} {like.dtype}: casting {name} down would lose "
            f"precision; convert one of them (e.g. {name}.to({like.dtype}))"
        )
    return t.to(like.dtype)


def check_device(named: dict[str, Any], expected: torch.device | None = None) -> None:
    """All given tensors live on one device (``expected`` if given); non-tensors are skipped.

    Raises:
        ValueError: naming both arguments and both devices.
    """
    first: tuple[str, torch.device] | None = None
    for name, t in named.items():
        if not isinstance(t, Tensor):
            continue
        if first is None:
            first = (name, t.device if expected is None else expected)
            if expected is None:
                continue
        if t.device != first[1]:
            what = first[0] if expected is None else "the inputs"
            raise ValueError(
                f"{name} is on device {t.device} but {what} {'is' if expected is None else 'are'} on "
                f"{first[1]}; move them to one device (e.g. {name}.to({str(first[1])!r}))"
            )


def _ready(bonds: Any, angles: Any, dihedrals: Any, n: int) -> bool:
    """Whether the three are floating tensors of one dtype, device and shape ``(..., n)``."""
    if not (isinstance(bonds, Tensor) and isinstance(angles, Tensor) and isinstance(dihedrals, Tensor)):
        return False
    shape, dtype, device = bonds.shape, bonds.dtype, bonds.device
    return (
        dtype.is_floating_point
        and len(shape) > 0
        and shape[-1] == n
        and angles.shape == shape
        and dihedrals.shape == shape
        and angles.dtype == dtype
        and dihedrals.dtype == dtype
        and angles.device == device
        and dihedrals.device == device
    )


def broadcast_internal(
    bonds: Any,
    angles: Any,
    dihedrals: Any,
    table: ConstructionTable,
    degrees: bool = False,
    default_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Check, promote and broadcast internal coordinates to one ``(..., N)`` shape.

    Angles and dihedrals in degrees (``degrees=True``) come back in radians.
    Array-likes take the dtype and device of the first tensor among the three,
    else ``default_dtype``.

    Raises:
        TypeError: a complex or boolean value.
        ValueError: a last dimension other than ``N``, shapes that do not
            broadcast, or values on different devices.
    """
    if _ready(bonds, angles, dihedrals, table.n_atoms):  # the common call: nothing to convert or broadcast
        return (bonds, angles * DEG, dihedrals * DEG) if degrees else (bonds, angles, dihedrals)
    first = next((v for v in (bonds, angles, dihedrals) if isinstance(v, Tensor)), None)
    names = ("bonds", "angles", "dihedrals")
    tensors = [as_float(v, name, first, default_dtype) for v, name in zip((bonds, angles, dihedrals), names)]
    check_device(dict(zip(names, tensors)))
    n = table.n_atoms
    for t, name in zip(tensors, names):
        if t.ndim == 0 or t.shape[-1] != n:
            raise ValueError(
                f"{name} must have shape (..., N) with N = {n} atoms of the table, got {tuple(t.shape)}"
            )
    dtype = torch.promote_types(torch.promote_types(tensors[0].dtype, tensors[1].dtype), tensors[2].dtype)
    try:
        if all(t.shape == tensors[0].shape and t.dtype == dtype for t in tensors):
            b, a, d = tensors  # nothing to broadcast or promote (the common case: a few us saved)
        else:
            b, a, d = torch.broadcast_tensors(*(t.to(dtype) for t in tensors))
    except RuntimeError:
        raise ValueError(
            "bonds, angles and dihedrals do not broadcast: shapes "
            f"{tuple(tensors[0].shape)}, {tuple(tensors[1].shape)}, {tuple(tensors[2].shape)}"
        ) from None
    if degrees:
        a = a * DEG
        d = d * DEG
    return b, a, d


def broadcast_fixed(fixed_xyz: Any, table: ConstructionTable, like: Tensor) -> Tensor | None:
    """``fixed_xyz`` checked against the table's fixed atoms, in the dtype of ``like``.

    Returns None for a table without fixed atoms.

    Raises:
        TypeError: a complex or boolean ``fixed_xyz``, or a floating tensor of a
            higher precision than ``like`` (float64 ``fixed_xyz`` with float32
            internal coordinates), naming both dtypes.
        ValueError: missing or superfluous ``fixed_xyz``, a shape other than
            ``(..., F, 3)``, a batch shape that does not broadcast with
            ``like`` ``(..., N)``, or another device than ``like``.
    """
    f = table.n_fixed
    if f == 0:
        if fixed_xyz is not None:
            raise ValueError("fixed_xyz was given but the table has no fixed atoms")
        return None
    if fixed_xyz is None:
        raise ValueError(f"the table has {f} fixed atoms: pass fixed_xyz of shape (..., {f}, 3)")
    check_device({"fixed_xyz": fixed_xyz}, like.device)
    fixed = cast_like(fixed_xyz, "fixed_xyz", like, "the internal coordinates are")
    if fixed.ndim < 2 or tuple(fixed.shape[-2:]) != (f, 3):
        raise ValueError(f"fixed_xyz must have shape (..., {f}, 3), got {tuple(fixed.shape)}")
    try:
        batch_shape(like.shape[:-1], fixed.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"fixed_xyz of shape {tuple(fixed.shape)} does not broadcast with internal "
            f"coordinates of shape {tuple(like.shape)}"
        ) from None
    return fixed


def as_box(box: Any, like: Tensor, name: str = "box") -> Tensor:
    """``box`` checked against coordinates ``like`` ``(..., M, 3)``, in their dtype and device.

    A box is ``(..., 6)`` ``[a, b, c, alpha, beta, gamma]`` (MDAnalysis: lengths
    in the unit of ``like``, angles in degrees) or ``(..., 3, 3)`` box vectors in
    rows (mdtraj / OpenMM); its leading dimensions broadcast against those of
    ``like`` (per frame) or are absent (one box for every frame). Values are not
    read here (an impossible box gives NaN downstream; ``bn.check_box`` names it).

    Raises:
        TypeError: a complex or boolean box, or a floating tensor of a higher
            precision than ``like`` (naming both dtypes).
        ValueError: another shape, leading dimensions that do not broadcast, or
            another device than ``like``.
    """
    check_device({name: box}, like.device)
    b = cast_like(box, name, like, "xyz")
    if not ((b.ndim >= 1 and b.shape[-1] == 6) or (b.ndim >= 2 and tuple(b.shape[-2:]) == (3, 3))):
        raise ValueError(
            f"{name} must have shape (..., 6) ([a, b, c, alpha, beta, gamma]: lengths in the unit of the "
            f"coordinates, angles in degrees) or (..., 3, 3) (box vectors in rows), got {tuple(b.shape)}"
        )
    batch = b.shape[:-1] if b.shape[-1] == 6 else b.shape[:-2]
    try:
        torch.broadcast_shapes(batch, like.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(b.shape)} (one box per leading index {tuple(batch)}) does not "
            f"broadcast with coordinates of shape {tuple(like.shape)} (frames {tuple(like.shape[:-2])})"
        ) from None
    return b


def check_xyz(xyz: Any, table: ConstructionTable, name: str = "xyz") -> Tensor:
    """``xyz`` as a real floating tensor of shape ``(..., N, 3)`` for ``table``.

    Raises:
        TypeError: a complex or boolean value.
        ValueError: another shape.
    """
    x = as_float(xyz, name)
    n = table.n_atoms
    if x.ndim < 2 or x.shape[-1] != 3 or x.shape[-2] != n:
        raise ValueError(f"{name} must have shape (..., N, 3) with N = {n}, got {tuple(x.shape)}")
    return x
