"""The package's imports point one way: down the layers, never in a circle.

Every import statement of every module counts, also those inside functions and
under ``if TYPE_CHECKING:``: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "batched_nerf"

#: Layers, bottom first. A module may import modules of its own layer or below. A name covers
#: the module and everything under it (the longest name decides), except the package itself,
#: which covers only its ``__init__``: a new module outside every layer fails the test.
LAYERS: list[tuple[str, ...]] = [
    # ground: numpy build orders, topology, geometry, the runtime, file helpers; the folders'
    # ``__init__`` (docstrings only)
    (
        "batched_nerf._version",
        "batched_nerf._geometry",
        "batched_nerf.topology",
        "batched_nerf.topology.order",
        "batched_nerf.topology.analysis",
        "batched_nerf.runtime",
        "batched_nerf.core",
        "batched_nerf.core.files",
        "batched_nerf.learning",
        "batched_nerf.torsion_space",
        "batched_nerf.residues",
    ),
    (
        "batched_nerf.topology.perceive",
        "batched_nerf.topology.link",
        "batched_nerf.topology.auto",
        "batched_nerf.topology.frame_tree",
    ),
    # engines: planners and builders behind a registry (their own layers: ENGINE_LAYERS)
    ("batched_nerf.engines",),
    # core: the table (owns the plan cache), the input checks, then the maps
    ("batched_nerf.core.table",),
    ("batched_nerf.core.checks",),
    ("batched_nerf.core.pose", "batched_nerf.core.box", "batched_nerf.learning.entries"),
    (
        "batched_nerf.core.convert",
        "batched_nerf.core.pack",
        "batched_nerf.learning.logdet",
    ),
    # learning tools and the containers on the maps
    (
        "batched_nerf.learning.flow",
        "batched_nerf.core.zmatrix",
        "batched_nerf.losses",
    ),
    (
        "batched_nerf.core.compile",
        "batched_nerf.torsion_space.turns",
        "batched_nerf.torsion_space.packed",
        "batched_nerf.torsion_space.rotors",
        "batched_nerf.torsion_space.update",
        "batched_nerf.torsion_space.ops",
        "batched_nerf.torsion_space.inputs",
    ),
    ("batched_nerf._warmup",),  # runs every kernel family, the torsion turns' included
    # residue chemistry (templates, tables from MD topologies), then proteins and the file
    # adapters side by side (neither imports the other), shipped data, test helpers, the CLI
    ("batched_nerf.residues.templates",),
    ("batched_nerf.residues.topology",),
    ("batched_nerf.protein", "batched_nerf.formats"),
    ("batched_nerf.data", "batched_nerf.testing"),
    ("batched_nerf.cli", "batched_nerf.__main__"),
    ("batched_nerf",),  # the package's __init__ only
]

#: Layers inside ``batched_nerf.engines``, bottom first: compiled loops, then what plans and
#: launches them, then the engines, then the registry.
ENGINE_LAYERS: list[tuple[str, ...]] = [
    # the fused plan's row layout and the tensors' numpy views (every backend reads them), then the
    # CPU kernels (numba loops)
    ("batched_nerf.engines.fused.rows", "batched_nerf.engines.fused.arrays"),
    (
        "batched_nerf.engines.fused.cpu.trig",
        "batched_nerf.engines.fused.cpu.samples",
        "batched_nerf.engines.fused.cpu.pose",
        "batched_nerf.engines.fused.cpu.tiers",
        "batched_nerf.engines.fused.cpu.threads",
        "batched_nerf.engines.fused.cpu.inverse_rows",
    ),
    ("batched_nerf.engines.fused.cpu.blocks", "batched_nerf.engines.fused.cpu.turns"),
    ("batched_nerf.engines.fused.cpu.inverse_blocks",),
    ("batched_nerf.engines.fused.cpu",),
    # shared ground of the engines: plan base, frame tree, GPU policy, autograd helpers, buffers
    (
        "batched_nerf.engines.base",
        "batched_nerf.engines.gpu_policy",
        "batched_nerf.engines.function",
        "batched_nerf.engines.compiled",
        "batched_nerf.engines.fused.workspace",
    ),
    # the CUDA kernels, backends, seeds, layouts
    (
        "batched_nerf.engines.fused.cuda",
        "batched_nerf.engines.backends",
        "batched_nerf.engines.seeds",
        "batched_nerf.engines.layout",
        "batched_nerf.engines.inverse",
        "batched_nerf.engines.scan.path",
    ),
    ("batched_nerf.engines.levels", "batched_nerf.engines.scan.plan", "batched_nerf.engines.dispatch"),
    ("batched_nerf.engines.scan",),
    ("batched_nerf.engines.fused.pose", "batched_nerf.engines.fused.inverse"),
    ("batched_nerf.engines.fused.build",),
    ("batched_nerf.engines.fused",),  # torsions, the package __init__
    ("batched_nerf.engines.compose",),
    ("batched_nerf.engines",),  # the registry (``__init__``) only
]

#: Names that cover only themselves (a package's ``__init__``), not the modules under them.
_EXACT = {
    "batched_nerf",
    "batched_nerf.topology",
    "batched_nerf.core",
    "batched_nerf.learning",
    "batched_nerf.torsion_space",
    "batched_nerf.residues",
}
_ENGINE_EXACT = {"batched_nerf.engines"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str, layers: list[tuple[str, ...]] = LAYERS, exact: set[str] = _EXACT) -> int:
    best, layer = -1, -1
    for k, names in enumerate(layers):
        for name in names:
            covers = module == name or (name not in exact and module.startswith(name + "."))
            if covers and len(name) > best:
                best, layer = len(name), k
    if layer < 0:
        raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: place it")
    return layer


def _engine_layer(module: str) -> int:
    return _layer(module, ENGINE_LAYERS, _ENGINE_EXACT)


def _imports(path: Path, module: str) -> set[str]:
    """Package modules imported anywhere in ``path`` (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "batched_nerf")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "batched_nerf":
                continue
            for alias in node.names:  # `from . import engines` imports a module
                sub = f"{target}.{alias.name}"
                out.add(sub if _is_module(sub) else target)
    out.discard(module)
    return out


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        graph[name] = _imports(path, name)
    return graph


def test_every_module_has_a_layer() -> None:
    for module in _graph():
        _layer(module)


def test_imports_point_down() -> None:
    upward = [
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, targets in _graph().items()
        for target in sorted(targets)
        if _layer(target) > _layer(module)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_every_engine_module_has_an_engine_layer() -> None:
    for module in _graph():
        if module.startswith("batched_nerf.engines"):
            _engine_layer(module)


def test_imports_inside_the_engines_point_down() -> None:
    upward = [
        f"{module} (engine layer {_engine_layer(module)}) imports {target} "
        f"(engine layer {_engine_layer(target)})"
        for module, targets in _graph().items()
        if module.startswith("batched_nerf.engines")
        for target in sorted(targets)
        if target.startswith("batched_nerf.engines") and _engine_layer(target) > _engine_layer(module)
    ]
    assert not upward, "upward imports inside engines/:\n" + "\n".join(upward)


def test_a_module_outside_every_layer_fails(tmp_path: Path) -> None:
    """No catch-all: the package's own name covers its ``__init__`` only."""
    with pytest.raises(AssertionError, match="batched_nerf._new is in no layer"):
        _layer("batched_nerf._new")
    with pytest.raises(AssertionError, match="batched_nerf.engines.new is in no layer"):
        _engine_layer("batched_nerf.engines.new")
    assert _layer("batched_nerf") == len(LAYERS) - 1


def test_an_upward_import_inside_the_engines_is_seen() -> None:
    assert _engine_layer("batched_nerf.engines.fused.cpu.trig") < _engine_layer("batched_nerf.engines.levels")


def test_file_adapters_and_proteins_import_nothing_of_each_other() -> None:
    """One build-order routine (``topology.order``), the file helpers in ``core.files`` and the residue
    chemistry with the MD topology tables in ``residues``: the adapters (the mdtraj one builds
    topology tables) and the protein builders share what lies below them, nothing else."""
    graph = _graph()
    crossing = {
        (module, target)
        for module, targets in graph.items()
        for target in targets
        for a, b in (("formats", "protein"), ("protein", "formats"))
        if module.startswith(f"batched_nerf.{a}") and target.startswith(f"batched_nerf.{b}")
    }
    assert crossing == set()


def test_private_torch_apis_only_in_torch_compat() -> None:
    """Every private torch API (``torch._C``, ``torch._functorch``, ``torch._dynamo``, a private
    attribute of a torch module such as ``torch.autograd.forward_ad._current_level``) is used in
    ``runtime/torch_compat.py`` alone, which says which releases it was checked on."""
    private = re.compile(r"torch(\.[A-Za-z]\w*)*\._[A-Za-z]|forward_ad\._[A-Za-z]")
    found = sorted(
        f"{path.relative_to(PACKAGE.parent)}:{k}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "torch_compat.py"
        for k, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line) and not line.lstrip().startswith("#")
    )
    assert not found, "private torch APIs outside runtime/torch_compat.py:\n" + "\n".join(found)


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state:
                found = visit(nxt, [*path, node])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [])
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    source = "from .. import engines\nfrom .table import X\n\ndef f():\n    from ..engines.scan import y\n"
    fake = tmp_path / "m.py"
    fake.write_text(source)
    found = _imports(fake, "batched_nerf.core.convert")  # resolved as if it were that module
    assert found == {"batched_nerf.engines", "batched_nerf.core.table", "batched_nerf.engines.scan"}


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("batched_nerf.topology.order", set()),
        ("batched_nerf.topology.analysis", {"batched_nerf.topology.order"}),
        ("batched_nerf._geometry", set()),
        ("batched_nerf.runtime.torch_compat", set()),
    ],
)
def test_ground_imports_nothing_of_the_package(module: str, allowed: set[str]) -> None:
    assert _graph()[module] == allowed
