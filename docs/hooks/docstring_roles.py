"""mkdocs hook: Sphinx roles in docstrings rendered as plain code in the API reference.

The docstrings use Sphinx roles (``:class:`~geosharp_ref.sharpness.ProductSpace```); Markdown renders them as
the role's name followed by code. This drops the role name and, for ``~``, keeps the last dotted component, as
Sphinx would. Pure presentation: no reference is resolved or invented.
"""
from __future__ import annotations

import re

ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj|math):<code>(~?)([^<]*)</code>")


def _code(m: re.Match) -> str:
    text = m.group(2)
    if m.group(1):
        text = text.rsplit(".", 1)[-1]
    return f"<code>{text}</code>"


def on_page_content(html: str, page, config, files, **kwargs):  # noqa: ARG001 (mkdocs hook signature)
    return ROLE.sub(_code, html)
