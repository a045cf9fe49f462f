"""Every ```python block of every documentation page runs: README.md and docs/**/*.md.

How a page is run
    Its ```python blocks run in page order in one namespace (a later block may use
    what an earlier one defined), in a temporary working directory (blocks may
    write files). A block that raises fails the test with the page and line.
    Pages are found by globbing, so a new page or a new block on any page is run
    without editing this file.

Marking a block as a fragment
    A block that cannot run on its own (a snippet of a larger program, an
    illustration of an API of another package) is marked by an HTML comment on
    the line before its fence; it is invisible in the rendered page and on GitHub::

        <!-- fragment: why it does not run -->
        ```python
        ...
        ```

    The reason after ``fragment:`` is optional. Other fences (```text, ```bash,
    ```pycon) are never run.

Optional packages
    A block importing one of :data:`OPTIONAL` (at its top level, or through an
    adapter that raises ImportError) when it is absent skips the rest of its page
    with a reason naming the page, the line and the package. A block may instead
    guard the import itself (``try: import mdtraj`` / ``except ImportError``).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: optional packages a block may need; without them the rest of the page is skipped
OPTIONAL = (
    "openmm",
    "rdkit",
    "chemcoord",
    "pandas",
    "ase",
    "mdtraj",
    "MDAnalysis",
    "MDAnalysisTests",
    "PeptideBuilder",
    "Bio",
    "matplotlib",
    "numba",
    "triton",
    "tqdm",
    "torch_geometric",
)
PAGES = sorted(["README.md", *(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))])
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M
)
_FRAGMENT = re.compile(r"^\s*<!--\s*fragment\b.*-->\s*$")


class Block(NamedTuple):
    line: int  # line number of the first code line in the page (1-based)
    code: str
    fragment: bool


def python_blocks(text: str) -> list[Block]:
    """Every ```python fence of ``text``: its first code line, dedented code and fragment mark."""
    blocks = []
    lines = text.splitlines()
    for m in _FENCE.finditer(text):
        info = m.group("info").strip().split()
        if not info or info[0] != "python":
            continue
        fence_line = text.count("\n", 0, m.start()) + 1  # 1-based line of the opening fence
        before = next((s for s in reversed(lines[: fence_line - 1]) if s.strip()), "")
        indent = m.group("indent")
        code = "".join(
            s[len(indent) :] if s.startswith(indent) else s for s in m.group("body").splitlines(True)
        )
        blocks.append(Block(fence_line + 1, code, bool(_FRAGMENT.match(before))))
    return blocks


def _imports(code: str) -> set[str]:
    """Top-level modules of the block's unguarded imports (not those in ``try``, ``if`` or functions)."""
    names: set[str] = set()
    for node in ast.parse(code).body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def test_block_extraction() -> None:
    text = (
        "x\n```python\na = 1\n```\n\n```\nnot python\n```\n"
        "<!-- fragment: needs a trained model -->\n```python\nmodel(x)\n```\n"
        "* a list item:\n\n  ```python\n  b = a + 1\n  ```\n```pycon\n>>> 1\n```\n"
    )
    assert python_blocks(text) == [
        Block(3, "a = 1\n", False),
        Block(11, "model(x)\n", True),
        Block(16, "b = a + 1\n", False),
    ]


def test_pages_found() -> None:
    assert {"README.md", "docs/index.md", "docs/conventions.md", "docs/flow.md"} <= set(PAGES)


def _runnable(name: str) -> list[Block]:
    return [b for b in python_blocks((ROOT / name).read_text(encoding="utf-8")) if not b.fragment]


@pytest.mark.parametrize("name", [p for p in PAGES if _runnable(p)])
def test_doc_code_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ROOT / name
    blocks = _runnable(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")  # plots of a page are drawn off screen
    monkeypatch.syspath_prepend(str(ROOT))  # the page's `import batched_nerf` is this checkout's
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    for block in blocks:
        absent = sorted(m for m in _imports(block.code) & set(OPTIONAL) if _missing(m))
        if absent:
            pytest.skip(f"{name}:{block.line}: needs the optional package(s) {', '.join(absent)}")
        # pad with blank lines so that tracebacks point at the line in the markdown file
        code = compile("\n" * (block.line - 1) + block.code, str(path), "exec")
        try:
            exec(code, namespace)
        except ImportError as exc:
            missing = [m for m in OPTIONAL if _missing(m) and m.lower() in str(exc).lower()]
            if not missing:
                raise
            pytest.skip(f"{name}:{block.line}: needs the optional package(s) {', '.join(missing)}")


_COMMAND = re.compile(r"`python ((?:[\w.-]+/)*[\w.-]+\.py)\b")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_commands_and_links_name_files_that_exist() -> None:
    """``python path/to/script.py`` (from the repository root) and relative links point to real files."""
    missing = []
    for name in PAGES:
        text = (ROOT / name).read_text(encoding="utf-8")
        for m in _COMMAND.finditer(text):
            if not (ROOT / m.group(1)).is_file():
                missing.append(f"{name}: `python {m.group(1)}`")
        for m in _LINK.finditer(text):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            if not ((ROOT / name).parent / target).exists():
                missing.append(f"{name}: link {target}")
    assert not missing, "\n".join(missing)


def test_guarded_imports_are_not_requirements() -> None:
    code = "import os\nimport rdkit.Chem\nfrom ase import Atoms\n"
    code += "try:\n    import mdtraj\nexcept ImportError:\n    pass\n"
    assert _imports(code) == {"os", "rdkit", "ase"}
