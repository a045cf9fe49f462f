"""The Python blocks of the getting-started and adapter pages run, page by page, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: page -> optional packages it needs (the page is skipped without them)
PAGES = {
    "docs/index.md": [],
    "docs/adapters/xyz.md": [],
    "docs/adapters/gaussian.md": [],
    "docs/adapters/bgflow.md": [],
    "docs/adapters/chemcoord.md": ["chemcoord", "pandas"],
    "docs/adapters/ase_rdkit.md": ["ase", "rdkit"],
    "docs/multi_molecule.md": ["rdkit", "chemcoord", "pandas"],
    "docs/protein.md": [],
}
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_code_runs(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in PAGES[page]:
        pytest.importorskip(module, reason=f"{module} is not installed (optional)")
    blocks = _BLOCK.findall((ROOT / page).read_text(encoding="utf-8"))
    assert blocks, f"{page} has no python blocks"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for k, code in enumerate(blocks):
        exec(compile(code, f"{page}[block {k}]", "exec"), namespace)
