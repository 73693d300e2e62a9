"""mkdocs hook: the package layout, generated at build time from the source tree.

``<!-- package-layout PACKAGE -->`` becomes a table of every module of PACKAGE (a directory at the repository
root) with the first sentence of its docstring, read with :mod:`ast` (nothing is imported). A module added or
removed shows up at the next build, so the layout cannot omit one.
"""
from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

log = logging.getLogger("mkdocs.plugins.geosharp.package_layout")
ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!--\s*package-layout\s+([\w/]+)\s*-->")
SKIP = {"__pycache__", "generated"}


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    first = re.sub(r":(?:mod|class|func|meth|attr|data|exc|obj):`~?([^`]+)`", r"`\1`", first)
    first = first.replace("``", "`")
    return first.replace("|", "\\|")


def layout_table(package: str) -> str:
    base = ROOT / package
    if not (base / "__init__.py").is_file():
        raise FileNotFoundError(f"{package} is not a package at the repository root")
    rows = ["| module | what it is (first paragraph of its docstring) |", "|---|---|"]
    for path in sorted(base.rglob("*.py"), key=lambda p: p.relative_to(base).parts):
        rel = path.relative_to(ROOT)
        if SKIP & set(rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] == "__main__":
            continue
        rows.append(f"| `{'.'.join(parts)}` | {_summary(path) or '–'} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files, **kwargs):  # noqa: ARG001 (mkdocs hook signature)
    def replace(m: re.Match) -> str:
        try:
            return layout_table(m.group(1))
        except (OSError, SyntaxError) as exc:
            log.warning("%s: %s", page.file.src_path, exc)
            return m.group(0)

    return MARKER.sub(replace, markdown)
