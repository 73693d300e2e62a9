"""Layout of codegen/: every hand-written module stays ≤ 500 lines (issue 25), and the names moved out of
generate.py / runtime.py when they were split stay importable from where they were."""
from pathlib import Path

import pytest

import codegen.generate
import codegen.rewrites
import codegen.runtime
import codegen.runtime_subgroup

CODEGEN = Path(codegen.generate.__file__).resolve().parent
MAX_LINES = 500


def test_hand_written_modules_are_at_most_500_lines():
    long = {p.name: n for p in sorted(CODEGEN.glob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"split these modules (≤ {MAX_LINES} lines outside codegen/generated/)"


@pytest.mark.parametrize("name", codegen.runtime_subgroup.__all__)
def test_runtime_reexports_the_subgroup_helpers(name):
    """Generated kernels call them as ``_rt.<name>`` (``from codegen import runtime as _rt``)."""
    assert name in codegen.runtime.__all__
    assert getattr(codegen.runtime, name) is getattr(codegen.runtime_subgroup, name)


@pytest.mark.parametrize("name", ["introduce_grams", "factor_inverses", "share_products"])
def test_generate_reexports_the_rewrites(name):
    assert getattr(codegen.generate, name) is getattr(codegen.rewrites, name)
