"""Every import path the README documents works: ``from geosharp_ref… import …`` lines in its code blocks
and every dotted ``geosharp_ref.…`` name it mentions resolve (a module, or an attribute of one).

``CHANGELOG.md`` lists the paths *changed* by restructurings, ``old → new``: its old paths are gone on purpose,
every new one (a backticked ``geosharp_ref.…`` name not followed by →) must resolve."""
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "README.md").read_text(encoding="utf-8")
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


FROM_IMPORTS = sorted({(m.group(1), name.strip()) for m in re.finditer(
    r"^from (geosharp_ref[\w.]*) import ([^\n#]+)", TEXT, re.M) for name in m.group(2).split(",")
    if name.strip()})
DOTTED = sorted(set(re.findall(r"\b(geosharp_ref(?:\.[A-Za-z_]\w*)+)", TEXT)) - {"geosharp_ref.py"})
NEW_PATHS = sorted({m.group(1) for m in re.finditer(r"`(geosharp_ref(?:\.[A-Za-z_]\w*)+)`(\s*→)?", CHANGELOG)
                    if not m.group(2)})


def test_readme_documents_imports():
    assert FROM_IMPORTS and DOTTED and NEW_PATHS


@pytest.mark.parametrize("module,name", FROM_IMPORTS)
def test_readme_from_import_works(module, name):
    name = name.split(" as ")[0].strip().strip("()")
    assert getattr(importlib.import_module(module), name) is not None


@pytest.mark.parametrize("dotted", DOTTED)
def test_readme_dotted_name_resolves(dotted):
    assert _resolve(dotted) is not None


@pytest.mark.parametrize("dotted", NEW_PATHS)
def test_readme_new_path_of_a_changed_import_resolves(dotted):
    assert _resolve(dotted) is not None
