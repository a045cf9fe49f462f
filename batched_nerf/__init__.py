"""batched_nerf: batched, twice-differentiable Z-matrix <-> Cartesian conversion in PyTorch.

The public surface is what ``__all__`` lists; everything else is private.
"""

from ._convert import to_cartesian, to_internal
from ._geometry import EPS
from ._inverse import InternalCoordinates
from ._table import ConstructionTable
from ._version import __version__

__all__ = [
    "EPS",
    "ConstructionTable",
    "InternalCoordinates",
    "__version__",
    "to_cartesian",
    "to_internal",
]
