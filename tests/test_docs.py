"""The python code blocks of the docs run (in order, one namespace per file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["docs/conventions.md", "README.md"]
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced ```python block."""
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


def test_block_extraction() -> None:
    text = "x\n```python\na = 1\n```\n\n```\nnot python\n```\n```python\nb = a + 1\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n"), (10, "b = a + 1\n")]


@pytest.mark.parametrize("name", DOCS)
def test_doc_code_runs(name: str) -> None:
    path = ROOT / name
    if not path.exists():
        pytest.skip(f"{name} does not exist")
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    if not blocks:
        pytest.skip(f"{name} has no python code blocks")
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    for line, code in blocks:
        # pad with blank lines so tracebacks point at the line in the markdown file
        exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)
