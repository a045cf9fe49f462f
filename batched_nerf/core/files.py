"""Shared helpers of the file-format modules: file handling and array conversion."""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from typing import IO, Any, Union

import numpy as np

#: A decimal number (digits, point, exponent), finite or not once read.
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")

#: A file name, a path, or an open text file.
PathOrFile = Union[str, "os.PathLike[str]", IO[str]]


@contextlib.contextmanager
def open_text(path_or_file: PathOrFile, mode: str) -> Iterator[IO[str]]:
    """Yield a text handle; files we open are closed again, handles passed in are not."""
    if hasattr(path_or_file, "read" if mode == "r" else "write"):
        yield path_or_file  # type: ignore[misc]
    else:
        with open(os.fspath(path_or_file), mode, encoding="utf-8") as handle:  # type: ignore[arg-type]
            yield handle


def read_text(path_or_file: PathOrFile | IO[bytes]) -> str:
    """The whole text of a file or stream, as UTF-8; a leading byte-order mark (Windows editors) is dropped.

    Binary streams are decoded as UTF-8.

    Raises:
        ValueError: the bytes are not UTF-8 text.
    """
    if hasattr(path_or_file, "read"):
        data = path_or_file.read()  # type: ignore[union-attr]
        where = "the stream"
    else:
        where = repr(os.fspath(path_or_file))  # type: ignore[arg-type]
        with open(os.fspath(path_or_file), "rb") as handle:  # type: ignore[arg-type]
            data = handle.read()
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where} is not UTF-8 text: byte {exc.start} cannot be decoded") from None
    return str(data).removeprefix("\ufeff")


def finite_float(
    token: str, where: str, what: str, *, pattern: re.Pattern[str] | None = None, fortran: bool = False
) -> float:
    """``token`` of a text file as a finite ``float``: the one number check of every reader.

    Refused, naming ``where`` (e.g. ``"line 4"``): a token that is not a number
    (or does not match the format's ``pattern``), digit separators (``1_0``,
    which Python's ``float`` would take), ``nan``/``inf`` and decimals beyond
    float64 (``1e400``, which ``float`` reads as ``inf``). ``fortran``: the
    exponent may be written ``d``/``D`` (``1.0D-3``, Gaussian files).

    Raises:
        ValueError: ``"{where}: could not parse {what} {token!r} as a finite number ..."``
            (``"... as a number"`` for what is no number at all).

    Example:
        >>> finite_float("1.0D-3", "line 2", "value", fortran=True)
        0.001
        >>> finite_float("1e400", "line 2", "bond")
        Traceback (most recent call last):
        ...
        ValueError: line 2: could not parse bond '1e400' as a finite number (it overflows float64)
    """
    text = token.replace("d", "e").replace("D", "e") if fortran else token
    try:
        value: float | None = float(text)
    except ValueError:
        value = None
    if value is None:
        kind = "a number"
    elif "_" in token:
        kind = "a number (no '_' digit separators)"
    elif not math.isfinite(value):
        overflow = _DECIMAL.fullmatch(text) is not None
        kind = "a finite number (it overflows float64)" if overflow else "a finite number"
    elif pattern is not None and not pattern.fullmatch(token):
        kind = "a number"  # e.g. digits of other scripts, which float() reads
    else:
        return value
    raise ValueError(f"{where}: could not parse {what} {token!r} as {kind}")


def check_precision(precision: Any, name: str = "precision") -> int:
    """``precision`` as an ``int`` of decimals, refusing a negative or non-integer value."""
    if isinstance(precision, bool) or not isinstance(precision, (int, np.integer)) or precision < 0:
        raise ValueError(f"{name} must be a non-negative integer (decimals per value), got {precision!r}")
    return int(precision)


def as_numpy(value: Any, dtype: Any = np.float64) -> np.ndarray:
    """numpy copy of an array-like or (detached, CPU) torch tensor."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.array(value, dtype=dtype)


def refs_of(table_or_refs: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(refs (N, 3), fixed (F,))`` as ``np.int64`` from a ConstructionTable or an array."""
    if hasattr(table_or_refs, "refs") and hasattr(table_or_refs, "fixed"):
        return as_numpy(table_or_refs.refs, np.int64), as_numpy(table_or_refs.fixed, np.int64).reshape(-1)
    refs = as_numpy(table_or_refs, np.int64)
    if refs.ndim != 2 or refs.shape[1] != 3:
        raise ValueError(f"refs must have shape (N, 3), got {tuple(refs.shape)}")
    return refs, np.zeros(0, dtype=np.int64)


def optional_import(module: str, package: str | None = None, extra: str = "interop") -> Any:
    """Import an optional dependency, or raise ImportError saying how to install it.

    ``extra`` names the optional-dependency group of ``pyproject.toml`` that brings it.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        name = package or module
        raise ImportError(
            f"this function needs {name}, an optional dependency: pip install {name} "
            f"(from a clone of batched_nerf: pip install -e '.[{extra}]')"
        ) from exc


def require_one_conformation(zmatrix: Any, what: str) -> None:
    """Raise ValueError unless ``zmatrix`` has element symbols and one conformation.

    ``what`` names the target format in the messages, e.g. ``"a chemcoord Zmat"``.
    """
    if zmatrix.elements is None:
        raise ValueError(f"the ZMatrix has no elements; {what} needs element symbols")
    if zmatrix.batch_shape.numel() != 1:
        raise ValueError(
            f"{what} holds one conformation; the ZMatrix has batch shape {tuple(zmatrix.batch_shape)}"
        )
