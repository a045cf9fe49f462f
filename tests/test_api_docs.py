"""The API pages document every public name, by public paths, and no Sphinx markup is left.

The public surface is ``__all__`` of the package and of its public submodules: every
module of ``batched_nerf`` with no path component starting with ``_``, except
``INTERNAL`` (the engines and the runtime: internal machinery, described in docs/architecture.md and
reached through ``bn.backends()`` and ``method=``). Each public name must be rendered by
a ``::: path`` directive of docs/api/*.md: the name's own path, another public path of
the same object (a re-export), or a module directive rendering it as a member (no
``members:`` option, or one that lists the name). Directives name no private path, and
each object is rendered on one page only (mkdocs-autorefs warns, and ``mkdocs build
--strict`` fails, on an object rendered twice).

The docstrings are Google style rendered by mkdocstrings as Markdown: a Sphinx role
(``:func:`x```) or a reST ``::`` literal block shows as literal text there; links are
Markdown reference links ``[`x`][batched_nerf.x]`` resolved by mkdocs-autorefs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "batched_nerf"
API = ROOT / "docs" / "api"
#: public-looking modules that are internal machinery, not public API
#: the layer folders: internal, their names reach users through ``batched_nerf`` (``__init__`` says so)
INTERNAL = (
    "batched_nerf.topology",
    "batched_nerf.engines",
    "batched_nerf.runtime",
    "batched_nerf.core",
    "batched_nerf.learning",
    "batched_nerf.torsion_space",
    "batched_nerf.residues",
    "batched_nerf.__main__",
)
SPHINX_ROLE = re.compile(r":(?:py:)?(func|class|mod|meth|attr|data|exc|obj|ref|doc|term):`")
#: a reST literal-block marker: a paragraph ending in ``::``
LITERAL_BLOCK = re.compile(r"::[ \t]*$", re.M)
_DIRECTIVE = re.compile(r"^::: *(\S+)[ \t]*\n((?:[ \t]+\S.*\n?)*)", re.M)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _private(name: str) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in name.split("."))


def public_modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if _private(name) or any(name == i or name.startswith(i + ".") for i in INTERNAL):
            continue
        names.append(name)
    return names


def _all(module: str) -> list[str]:
    """``__all__`` of ``module``, read from its source (a literal list)."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    if not path.is_file():
        path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def public_names() -> list[tuple[str, str]]:
    return [(m, n) for m in public_modules() for n in _all(m)]


def directives(pages: list[Path] | None = None) -> list[tuple[str, str, list[str] | None]]:
    """``(page, path, members)`` of every ``::: path`` directive; ``members`` None: all."""
    out = []
    for page in pages if pages is not None else sorted(API.glob("*.md")):
        for m in _DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            members: list[str] | None = None
            opt = re.search(r"^\s+members:\s*(.+?)\s*$", m.group(2), re.M)
            if opt:
                value = opt.group(1)
                members = [] if value == "false" else re.findall(r"[\w.]+", value)
            out.append((page.relative_to(ROOT).as_posix(), m.group(1), members))
    return out


def _resolve(path: str) -> object:
    parts = path.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def test_public_modules_found() -> None:
    modules = set(public_modules())
    expected = {"batched_nerf", "batched_nerf.losses", "batched_nerf.testing", "batched_nerf.protein"}
    expected |= {"batched_nerf.formats", "batched_nerf.formats.gaussian", "batched_nerf.data"}
    assert expected <= modules
    assert not any(m.startswith("batched_nerf.engines") or "._" in m for m in modules)
    assert ("batched_nerf", "to_cartesian") in public_names()


def test_every_public_name_has_an_api_entry() -> None:
    pytest.importorskip("hypothesis", reason="batched_nerf.testing imports hypothesis (the test extra)")
    documented: set[int] = set()
    paths = set()
    for _, path, members in directives():
        paths.add(path)
        obj = _resolve(path)
        documented.add(id(obj))
        if isinstance(obj, types.ModuleType):
            names = _all(path) if members is None else members
            documented.update(id(getattr(obj, n)) for n in names if hasattr(obj, n))
    missing = [
        f"{m}.{n}"
        for m, n in public_names()
        if f"{m}.{n}" not in paths and id(getattr(importlib.import_module(m), n)) not in documented
    ]
    assert not missing, "public names without a `::: path` entry in docs/api/*.md:\n" + "\n".join(missing)


def test_api_entries_name_public_paths_once() -> None:
    found = directives()
    private = [f"{page}: ::: {path}" for page, path, _ in found if _private(path)]
    assert not private, "API entries naming private paths:\n" + "\n".join(private)
    every = directives(sorted((ROOT / "docs").rglob("*.md")))
    outside = [f"{page}: ::: {path}" for page, path, _ in every if not page.startswith("docs/api/")]
    assert not outside, "render objects on the API pages only, link elsewhere:\n" + "\n".join(outside)
    seen: dict[str, str] = {}
    twice = []
    for page, path, _ in every:
        if path in seen:
            twice.append(f"{path}: {seen[path]} and {page}")
        seen.setdefault(path, page)
    assert not twice, "objects rendered twice:\n" + "\n".join(twice)


def _docstrings() -> list[tuple[str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    line = getattr(node, "lineno", 1)
                    out.append((f"{path.relative_to(ROOT).as_posix()}:{line}", doc))
    return out


def test_no_sphinx_markup_left() -> None:
    found = []
    for where, doc in _docstrings():
        found += [f"{where}: {m.group(0)}" for m in SPHINX_ROLE.finditer(doc)]
        found += [f"{where}: reST literal block '::'" for _ in LITERAL_BLOCK.finditer(doc)]
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        found += [f"{page.relative_to(ROOT).as_posix()}: {m.group(0)}" for m in SPHINX_ROLE.finditer(text)]
    assert not found, "Sphinx markup renders as literal text in mkdocstrings:\n" + "\n".join(found)


def test_built_site_has_no_sphinx_markup() -> None:
    """The pages of a ``mkdocs build`` (``site/``), when one is here and newer than the sources."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -r docs/requirements.txt)")
    index = ROOT / "site" / "index.html"
    if not index.is_file():
        pytest.skip("no site/ here: run `mkdocs build --strict` first")
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "mkdocs.yml"]
    if max(p.stat().st_mtime for p in sources) > index.stat().st_mtime:
        pytest.skip("site/ is older than the sources: run `mkdocs build --strict` again")
    found = []
    for page in sorted((ROOT / "site").rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        found += [f"{page.relative_to(ROOT).as_posix()}: {m.group(0)}" for m in SPHINX_ROLE.finditer(text)]
    assert not found, "\n".join(found)
