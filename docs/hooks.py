"""mkdocs hooks (see ``hooks:`` in mkdocs.yml); not a documentation page.

The docstrings of this project use Google style with an ``Example:`` section
holding doctests. griffe only recognises the plural ``Examples:``, and renders
an ``Example:`` section as an admonition of plain Markdown, where ``>>>`` lines
become nested block quotes. Teach its Google parser the singular too, so those
sections render as Python code blocks.
"""

from __future__ import annotations

try:  # private griffe tables; harmless if they move
    from griffe._internal.docstrings import google as _google
    from griffe._internal.enumerations import DocstringSectionKind as _Kind

    _google._section_kind.setdefault("example", _Kind.examples)
except (ImportError, AttributeError):  # pragma: no cover
    pass
