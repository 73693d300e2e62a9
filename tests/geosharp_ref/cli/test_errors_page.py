"""docs/reference/errors.md and the bad-input tests stay in step: every test the page names exists, and every
bad-input test is named on the page."""
import re

from tests.cases import ROOT

PAGE = ROOT / "docs" / "reference" / "errors.md"
TESTS = ROOT / "tests" / "geosharp_ref"
#: the files whose every test is a row (or part of a row) of the page
BAD_INPUT_FILES = sorted([*TESTS.glob("cli/test_bad_input*.py"), *TESTS.glob("studies/population/test_bad_input*.py")])


def _named() -> set:
    """``(file, test or "")`` for every ``path.py::test`` (or ``path.py``) the page names."""
    text = PAGE.read_text()
    return set(re.findall(r"`((?:cli|studies/population|symmetry|io)/[\w/]+\.py)(?:::(\w+))?`", text)) | {
        (prev, name) for prev, name in _ellipsis_rows(text)}


def _ellipsis_rows(text):
    """``…::test_x`` right after ``file.py::test_y`` in one cell names another test of the same file."""
    for cell in re.findall(r"`((?:cli|studies/population)/[\w/]+\.py)::\w+`((?:, `…::\w+`)+)", text):
        for name in re.findall(r"…::(\w+)", cell[1]):
            yield cell[0], name


def test_every_test_the_page_names_exists():
    for path, name in sorted(_named()):
        source = (TESTS / path).read_text()
        assert not name or re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} named in errors.md"


def test_every_bad_input_test_is_on_the_page():
    named = {(path, name) for path, name in _named()}
    for file in BAD_INPUT_FILES:
        rel = str(file.relative_to(TESTS))
        for name in re.findall(r"^def (test_\w+)\(", file.read_text(), re.M):
            controls = ("accepted", "loads", "library_reason")  # controls and helpers' unit tests, not rows
            assert (rel, name) in named or any(c in name for c in controls), f"{rel}::{name} missing from errors.md"
