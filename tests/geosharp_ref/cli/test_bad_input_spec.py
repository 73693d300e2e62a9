"""Spec files and generated kernel modules that used to escape as tracebacks (docs/reference/errors.md): a spec
that exits, raises KeyboardInterrupt or never returns while it is loaded; ``Metric`` objects of the wrong types
(a string, a matrix without a trace, a metric of one block only); a generated module that is truncated or lacks
its ``BLOCKS``. Each: exit 2, one ``geosharp: error:`` line, nothing written."""
import pytest

from tests import cases
from tests.cases import ROOT

HEADER = """from sympy import Inverse, Trace
from derivations import Metric, gl_pair
lora = gl_pair("B", "At", n="d_out", m="d_in", h="r")
B, At = lora.blocks
(xi_B, xi_At), (eta_B, eta_At) = lora.tangent("xi"), lora.tangent("eta")
"""

SPECS = {  # spec file body -> what the line says
    "calls sys.exit": ("import sys\nsys.exit(3)\n", ["called sys.exit (line 2)", "not exit or stop"]),
    "raises KeyboardInterrupt": ("raise KeyboardInterrupt\n", ["raised KeyboardInterrupt (line 1)"]),
    "never returns": ("while True:\n    pass\n", ["did not finish running within 0.5 s", "GEOSHARP_SPEC_TIMEOUT"]),
    "a metric given as a string": (HEADER + 'SPEC = {"m": Metric(lora, "tr(xi_B.T*eta_B)", "x")}\n',
                                   ["MetricError", "expr is the string", "build it with SymPy"]),
    "a matrix without a trace": (HEADER + 'SPEC = {"m": Metric(lora, Inverse(B.T*B)*xi_B.T*eta_B, "x")}\n',
                                 ["expr is a matrix of shape (r, r), not a number", "Trace(...)"]),
    "a metric of one block only": (HEADER + 'SPEC = {"m": Metric(lora, Trace(Inverse(B.T*B)*xi_B.T*eta_B), "x")}\n',
                                   ["SPEC['m']: the metric measures no tangent of block(s) ['At']",
                                    "not positive definite", "Trace(xi_At.T * eta_At)"]),
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_spec_files_refused_in_one_line(tmp_path, capsys, monkeypatch, case):
    monkeypatch.setenv("GEOSHARP_SPEC_TIMEOUT", "0.5")
    body, needles = SPECS[case]
    spec = tmp_path / "spec.py"
    spec.write_text(body)
    out = tmp_path / "generated"
    cases.assert_cli_refused(capsys, ["derive", "--spec", spec, "--out", out], tmp_path, out, needles)


def test_a_bad_timeout_setting_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GEOSHARP_SPEC_TIMEOUT", "-1")
    spec = tmp_path / "spec.py"
    spec.write_text(HEADER)
    out = tmp_path / "generated"
    cases.assert_cli_refused(capsys, ["derive", "--spec", spec, "--out", out], tmp_path, out,
                             ["GEOSHARP_SPEC_TIMEOUT='-1' must be a positive number"])


def _generated(tmp_path, edit):
    """A generated module (codegen/generated/gl_mix.py, header included) changed by ``edit``."""
    path = tmp_path / "gl_mine.py"
    path.write_text(edit((ROOT / "codegen" / "generated" / "gl_mix.py").read_text()))
    return path


@pytest.mark.parametrize("case,edit,needles", [
    ("truncated", lambda s: s[: len(s) // 2], ["gl_mine.py", "regenerate it with `geosharp derive --spec"]),
    ("without BLOCKS", lambda s: s.replace("BLOCKS = ('G', 'H')\n", ""), ["lacks ['BLOCKS']", "truncated or not a "
                                                                          "module `geosharp derive` wrote"]),
])
def test_generated_modules_refused_in_one_line(saved, tmp_path, capsys, case, edit, needles):
    module = _generated(tmp_path, edit)
    out = tmp_path / "r.json"
    argv = ["evaluate", saved / "bert", "--data", saved / "bert.pt", "--rho", "0.05", "--metric", "gl_mine",
            "--spec", module, "--json", out]
    cases.assert_cli_refused(capsys, argv, tmp_path, out, needles)


def test_the_untouched_generated_module_loads(tmp_path):
    """The control for the two cases above: the same file unedited is a complete kernel module."""
    from geosharp_ref.kernels import load_kernels

    module = load_kernels(_generated(tmp_path, lambda s: s))
    assert module.BLOCKS == ("G", "H") and callable(module.second_order_geodesic)
