"""batched_nerf: batched, twice-differentiable Z-matrix <-> Cartesian conversion in PyTorch.

Core conversion ([`to_cartesian`][batched_nerf.to_cartesian], [`to_internal`][batched_nerf.to_internal]) over
a
[`ConstructionTable`][batched_nerf.ConstructionTable]; learning tools (exact log-det, global pose, a flow
layer, [`batched_nerf.losses`][batched_nerf.losses]); file formats and adapters
([`batched_nerf.formats`][batched_nerf.formats]) and shipped molecules
([`batched_nerf.data`][batched_nerf.data]).
Hypothesis strategies for property tests live in [`batched_nerf.testing`][batched_nerf.testing]
(imported on demand: it needs ``hypothesis``).

The public surface is what ``__all__`` lists here and in the public modules
(``losses``, ``formats.*``, ``protein``, ``data``, ``testing``). Modules starting
with ``_`` are private, and so are the layer folders, bottom up: ``topology``
(numpy table analysis), ``runtime`` (what every compiled call shares), ``engines``
(planners and kernels), ``core`` (the table and the two maps), ``learning``,
``torsion_space`` and ``residues`` (residue templates, tables from MD topologies);
their public names are re-exported here and in ``protein``.
"""

from . import losses
from ._geometry import EPS
from ._version import __version__
from ._warmup import warmup
from .core.box import box_vectors, check_box, minimum_image, unwrap, wrap
from .core.compile import compile_builder
from .core.convert import InternalCoordinates, to_cartesian, to_internal
from .core.pack import pack_tables, split_atoms
from .core.pose import Pose, apply_pose, extract_pose, pose_components, rotation_angles, rotation_from_angles
from .core.table import ConstructionTable
from .core.zmatrix import ZMatrix
from .engines.backends import backends
from .learning.flow import FlowCoordinates, InternalCoordinateTransform
from .learning.logdet import log_det_jacobian, pose_log_det
from .runtime.state import cache_budget, cache_info
from .topology.analysis import Topology
from .topology.auto import nonbonded_references, perceive_connectivity
from .torsion_space.inputs import rotor_tables
from .torsion_space.ops import match_torsions, set_torsions, torsion_angles, torsion_log_volume
from .torsion_space.rotors import RotorTable, rotatable_bonds
from .torsion_space.update import update_torsions

_LAZY_SUBMODULES = ("data", "formats", "protein", "testing")
# Adapters live in `formats` (which the core never imports): loaded on first use.
_LAZY_NAMES = {"from_chemcoord": "formats.chemcoord", "to_chemcoord": "formats.chemcoord"}


def __getattr__(name: str) -> object:
    """``bn.data``, ``bn.formats``, ``bn.protein``, ``bn.testing`` and the adapters import on first use."""
    import importlib

    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EPS",
    "ConstructionTable",
    "FlowCoordinates",
    "InternalCoordinateTransform",
    "InternalCoordinates",
    "Pose",
    "RotorTable",
    "Topology",
    "ZMatrix",
    "__version__",
    "apply_pose",
    "backends",
    "box_vectors",
    "cache_budget",
    "cache_info",
    "check_box",
    "compile_builder",
    "extract_pose",
    "from_chemcoord",
    "log_det_jacobian",
    "losses",
    "match_torsions",
    "minimum_image",
    "nonbonded_references",
    "pack_tables",
    "perceive_connectivity",
    "pose_components",
    "pose_log_det",
    "rotatable_bonds",
    "rotation_angles",
    "rotation_from_angles",
    "rotor_tables",
    "set_torsions",
    "split_atoms",
    "to_cartesian",
    "to_chemcoord",
    "to_internal",
    "torsion_angles",
    "torsion_log_volume",
    "unwrap",
    "update_torsions",
    "warmup",
    "wrap",
]
