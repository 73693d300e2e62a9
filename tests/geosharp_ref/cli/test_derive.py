"""`geosharp derive`: the built-ins are up to date (--check), a spec file end to end (--spec), and specs
that are refused write nothing and say why."""
import pytest

from geosharp_ref.cli import main
from geosharp_ref.kernels import load_kernels
from geosharp_ref.verification.kernel_checks import acceleration_vs_koszul, invariance_errors, projection_errors
from tests.cases import ROOT


def test_derive_check_reports_up_to_date(capsys):
    assert main(["derive", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_derive_spec_readme_example_end_to_end(tmp_path, capsys):
    assert main(["derive", "--spec", str(ROOT / "examples" / "lora_spec.py"), "--out", str(tmp_path)]) == 0
    mod = load_kernels(tmp_path / "lora_hybrid.py")
    assert mod.BLOCKS == ("B", "At") and mod.PROJECTION_KIND == "explicit"
    assert acceleration_vs_koszul(mod, sizes={"d_out": 5, "d_in": 4, "r": 2}) < 1e-9
    assert max(projection_errors(mod, sizes={"d_out": 5, "d_in": 4, "r": 2})) < 1e-9
    ginv, ainv = invariance_errors(mod)
    assert ginv < 1e-9 and ainv < 1e-9


def test_failed_spec_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad_spec.py"
    bad.write_text(
        "from sympy import Trace\n"
        "from derivations import Metric, gl_pair, builtin_metric\n"
        "s = gl_pair()\n(xG, xH), (eG, eH) = s.tangent('xi'), s.tangent('eta')\n"
        "SPEC = {'good': builtin_metric(s, 'mix'), 'bad': Metric(s, Trace(xG.T*eG) + Trace(xH.T*eH), 'eucl')}\n"
    )
    out = tmp_path / "out"
    assert main(["derive", "--spec", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not invariant" in err
    assert not out.exists() or not list(out.glob("*.py"))


@pytest.mark.parametrize("content, message", [
    ("X = 1\n", "must define SPEC"),
    ("SPEC = {'m': 3}\n", "expected derivations.Metric"),
])
def test_malformed_spec_files_are_explained(tmp_path, capsys, content, message):
    f = tmp_path / "spec.py"
    f.write_text(content)
    assert main(["derive", "--spec", str(f), "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
