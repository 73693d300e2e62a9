"""load_kernels (geosharp_ref.kernels): built-in names, a module file written by `geosharp derive --spec`
(here a copy of codegen/generated/gl_mix.py), a module object passed through, and clear errors."""
import shutil
import sys

import pytest
import torch

import codegen.generated.gl_mix
from geosharp_ref.kernels import BUILTIN_MODULES, load_kernels
from geosharp_ref.sampling import sample_point, sample_tangent
from tests.cases import ROOT


@pytest.mark.parametrize("name", BUILTIN_MODULES)
def test_builtin_name(name):
    mod = load_kernels(name)
    assert mod.__name__ == f"codegen.generated.{name}" and load_kernels(name) is mod
    assert mod.BLOCKS and len(mod.BLOCK_SHAPES) == len(mod.BLOCKS) and callable(mod.inner)


def test_file_path_loads_a_separate_module_with_the_same_kernels(tmp_path):
    path = tmp_path / "my_kernels.py"
    shutil.copy(ROOT / "codegen" / "generated" / "gl_mix.py", path)
    mod = load_kernels(path)
    builtin = load_kernels("gl_mix")
    assert mod is not builtin and mod.__file__ == str(path.resolve())
    assert load_kernels(str(path)) is mod  # a str path, and loaded once
    assert mod.BLOCKS == builtin.BLOCKS and mod.BLOCK_SHAPES == builtin.BLOCK_SHAPES
    point = sample_point(builtin, batch=(2,), seed=3)
    xi = sample_tangent(builtin, point, seed=4)
    for fn in ("inner", "geodesic_acceleration", "horizontal_projection"):
        args = (*point, *xi, *xi) if fn == "inner" else (*point, *xi)
        a, b = getattr(mod, fn)(*args, eps=0.0), getattr(builtin, fn)(*args, eps=0.0)
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert torch.equal(x, y), fn


def test_module_object_is_passed_through():
    assert load_kernels(codegen.generated.gl_mix) is codegen.generated.gl_mix


def test_unknown_name_and_missing_file_are_explained(tmp_path):
    with pytest.raises(ValueError, match=r"unknown kernel module 'gl_foo'; choose one of \['gl_inv'.*derive --spec"):
        load_kernels("gl_foo")
    with pytest.raises(FileNotFoundError, match=r"kernel module '.*nope\.py' does not exist.*geosharp derive --spec"):
        load_kernels(tmp_path / "nope.py")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_kernels(str(tmp_path / "nope.py"))


def test_a_failing_module_file_is_not_cached(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('half written')\n")
    before = set(sys.modules)
    with pytest.raises(ValueError, match="does not run .RuntimeError: half written"):
        load_kernels(path)
    assert set(sys.modules) == before
    path.write_text((ROOT / "codegen" / "generated" / "gl_mix.py").read_text())  # now a complete module
    assert load_kernels(path).BLOCKS == ("G", "H")
