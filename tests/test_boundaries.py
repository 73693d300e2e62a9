"""Architecture rules between the three packages.

* derivations/  — SymPy only; the symbolic engine. Never depends on the runtime or the generator.
* codegen/      — generate.py/printer.py/builtins.py/spec.py turn derivations into Python modules;
                  runtime.py and generated/*.py are what runs, and need only torch.
* geosharp_ref/ — the evaluator. Only the command line (cli.py) may reach the symbolic side.

(a) is checked by importing in a fresh interpreter (``sys.executable``), (b) and (c) by scanning the
source with ``ast``.
"""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUNTIME_MODULES = ["geosharp_ref.symmetry_map", "geosharp_ref.verify_kernels", "geosharp_ref.reference",
                   "codegen.runtime"] + sorted(
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
REF_FILES = sorted(p for p in (ROOT / "geosharp_ref").rglob("*.py") if p.name != "cli.py")


def test_scanned_packages_are_not_empty():
    assert DERIVATION_FILES and REF_FILES


@pytest.mark.parametrize("path", DERIVATION_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_derivations_do_not_import_runtime_or_codegen(path):
    """(b) the symbolic engine stands alone: anywhere in derivations/, no geosharp_ref or codegen."""
    assert _violations(path, ("geosharp_ref", "codegen"), module_level_only=False) == []


@pytest.mark.parametrize("path", REF_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_geosharp_ref_does_not_import_symbolic_side_at_module_level(path):
    """(c) only cli.py may reach derivations and the generator at import time."""
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


def test_relative_imports_resolve():
    def resolve(source, rel):
        return _absolute(ast.parse(source).body[0], ROOT / rel)
    assert resolve("from .reference import x", "geosharp_ref/verify_kernels.py") == "geosharp_ref.reference"
    assert resolve("from . import runtime", "codegen/__init__.py") == "codegen"
    assert resolve("from ..codegen import spec", "geosharp_ref/sub/mod.py") == "geosharp_ref.codegen"
    assert resolve("from .metric import Metric", "derivations/quotient.py") == "derivations.metric"
