"""The package's imports point one way: down the layers, never in a circle.

Every import statement of every module counts, also those inside functions and
under ``if TYPE_CHECKING:``: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "batched_nerf"

#: Layers, bottom first. A module may import modules of its own layer or below.
LAYERS: list[tuple[str, ...]] = [
    # ground: numpy build orders, topology, geometry
    (
        "batched_nerf._version",
        "batched_nerf._geometry",
        "batched_nerf._build_order",
        "batched_nerf._topology",
    ),
    ("batched_nerf._perceive", "batched_nerf._autolink", "batched_nerf._autotable"),
    # engines: planners and builders behind a registry
    ("batched_nerf.engines", "batched_nerf.engines.frame_tree"),
    # the table (owns the plan cache) and the input checks
    ("batched_nerf._table",),
    ("batched_nerf._checks",),
    # public API
    ("batched_nerf._pose", "batched_nerf._box", "batched_nerf._entries"),
    ("batched_nerf._convert", "batched_nerf._logdet", "batched_nerf._flow_entries", "batched_nerf._pack"),
    ("batched_nerf._flow", "batched_nerf._zmatrix", "batched_nerf.losses", "batched_nerf._warmup"),
    # on top: files, shipped data, CLI, test helpers
    ("batched_nerf.formats", "batched_nerf.data", "batched_nerf.testing", "batched_nerf.protein"),
    ("batched_nerf.cli", "batched_nerf.__main__"),
    ("batched_nerf",),  # the package's __init__
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    best, layer = -1, -1
    for k, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, layer = len(name), k
    if layer < 0:
        raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: place it")
    return layer


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
    source = "from . import engines\nfrom ._table import X\n\ndef f():\n    from .engines.scan import y\n"
    fake = tmp_path / "m.py"
    fake.write_text(source)
    found = _imports(fake, "batched_nerf._convert")  # resolved as if it were that module
    assert found == {"batched_nerf.engines", "batched_nerf._table", "batched_nerf.engines.scan"}


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("batched_nerf._build_order", set()),
        ("batched_nerf._topology", {"batched_nerf._build_order"}),
        ("batched_nerf._geometry", set()),
    ],
)
def test_ground_imports_nothing_of_the_package(module: str, allowed: set[str]) -> None:
    assert _graph()[module] == allowed
