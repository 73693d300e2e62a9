"""Every import path the README and the documentation pages (``docs/**/*.md``) document works:
``from geosharp_ref… import …`` lines in their code blocks and every dotted ``geosharp_ref.…`` name they mention
resolve (a module, or an attribute of one).

``CHANGELOG.md`` lists the paths *changed* by restructurings, ``old → new``: its old paths are gone on purpose,
every new one (a backticked ``geosharp_ref.…`` name not followed by →) must resolve."""
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the README and every documentation page, by path relative to the repository (a test id names its page)
PAGES = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
         for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}
CHANGELOG = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def _resolve(dotted: str):
    """Import the longest module prefix of ``dotted`` and walk the rest as attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def _from_imports(text: str) -> set:
    return {(m.group(1), name.strip()) for m in re.finditer(r"^from (geosharp_ref[\w.]*) import ([^\n#]+)", text,
                                                            re.M)
            for name in m.group(2).split(",") if name.strip()}


def _dotted(text: str) -> set:
    return set(re.findall(r"\b(geosharp_ref(?:\.[A-Za-z_]\w*)+)", text)) - {"geosharp_ref.py"}


FROM_IMPORTS = sorted({(page, module, name) for page, text in PAGES.items() for module, name in _from_imports(text)})
DOTTED = sorted({(page, dotted) for page, text in PAGES.items() for dotted in _dotted(text)})
NEW_PATHS = sorted({m.group(1) for m in re.finditer(r"`(geosharp_ref(?:\.[A-Za-z_]\w*)+)`(\s*→)?", CHANGELOG)
                    if not m.group(2)})


def test_readme_documents_imports():
    assert _from_imports(PAGES["README.md"]) and _dotted(PAGES["README.md"]) and NEW_PATHS
    assert len(PAGES) > 10  # the documentation pages are read too


@pytest.mark.parametrize("page,module,name", FROM_IMPORTS)
def test_readme_from_import_works(page, module, name):
    name = name.split(" as ")[0].strip().strip("()")
    assert getattr(importlib.import_module(module), name) is not None, page


@pytest.mark.parametrize("page,dotted", DOTTED)
def test_readme_dotted_name_resolves(page, dotted):
    assert _resolve(dotted) is not None, page


@pytest.mark.parametrize("dotted", NEW_PATHS)
def test_readme_new_path_of_a_changed_import_resolves(dotted):
    assert _resolve(dotted) is not None
