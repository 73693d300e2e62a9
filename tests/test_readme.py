"""Every import path the README documents works: ``from geosharp_ref… import …`` lines in its code blocks
and every dotted ``geosharp_ref.…`` name it mentions resolve (a module, or an attribute of one).

The paragraph that lists the paths *changed* by the restructuring names old paths on purpose and is
skipped; its new paths are checked there separately."""
import importlib
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
CHANGED = re.search(r"\*\*Import paths changed by the restructuring\*\*.*?(?:\n\n|\Z)", README, re.S)
TEXT = README.replace(CHANGED.group(0), "") if CHANGED else README


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
NEW_PATHS = sorted(set(re.findall(r"→\s*`(geosharp_ref(?:\.[A-Za-z_]\w*)+)", CHANGED.group(0)))) if CHANGED else []


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
