"""`geosharp derive --spec` on a spec that declares a symmetry and no metric: it lists the invariant metrics (the
built-in ones among them, with proofs), derives the one named with --metric into a kernel module that passes the
kernel checks, and refuses a degenerate or unknown choice writing nothing."""
import pytest

from geosharp_ref.cli import main
from geosharp_ref.kernels import load_kernels
from geosharp_ref.verification.kernel_checks import acceleration_vs_koszul, invariance_errors, projection_errors
from tests.cases import ROOT

SPEC = str(ROOT / "examples" / "symmetry_only_spec.py")
SIZES = {"d_out": 5, "d_in": 4, "r": 2}


def test_lists_invariant_metrics_with_proofs_and_the_builtins_in_the_family(tmp_path, capsys):
    assert main(["derive", "--spec", SPEC, "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert out.count("invariance proved") == 4
    assert "inv = m1 + m3" in out and "mix = m0 + m2" in out
    assert "--metric" in out
    assert not (tmp_path / "o").exists()  # listing writes nothing


@pytest.mark.parametrize("choice", ["inv", pytest.param("2*m0+m2+1/2*m1+m3", marks=pytest.mark.slow)])
def test_named_invariant_metric_is_derived_into_checked_kernels(tmp_path, capsys, choice):
    assert main(["derive", "--spec", SPEC, "--metric", choice, "--out", str(tmp_path)]) == 0
    (path,) = [p for p in tmp_path.glob("lora_*.py")]
    mod = load_kernels(path)
    assert mod.BLOCKS == ("B", "At")
    assert acceleration_vs_koszul(mod, sizes=SIZES) < 1e-9
    assert max(projection_errors(mod, sizes=SIZES)) < 1e-9
    ginv, ainv = invariance_errors(mod)
    assert ginv < 1e-9 and ainv < 1e-9


@pytest.mark.parametrize("choice, message", [
    ("m1", "not positive definite"),
    ("m7", "no invariant metric 'm7'"),
    ("x+y", "cannot read"),
])
def test_bad_choice_is_explained_and_writes_nothing(tmp_path, capsys, choice, message):
    out = tmp_path / "o"
    assert main(["derive", "--spec", SPEC, "--metric", choice, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("geosharp: error:") and message in err
    assert not out.exists() or not list(out.glob("*.py"))


def test_metric_flag_with_a_spec_of_metrics_is_refused(tmp_path, capsys):
    assert main(["derive", "--spec", str(ROOT / "examples" / "lora_spec.py"), "--metric", "m0",
                 "--out", str(tmp_path / "o")]) == 2
    assert "declares SYMMETRY" in capsys.readouterr().err


@pytest.mark.slow
def test_joint_symmetry_spec_lists_metrics_proved_for_every_part(tmp_path, capsys):
    spec = tmp_path / "joint_spec.py"
    spec.write_text("from derivations.joint import lora_attention\n"
                    "SYMMETRY = {'lora_att': lora_attention()}\nSIZES = {'d': 4, 'h': 2, 'r': 2}\n")
    assert main(["derive", "--spec", str(spec)]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.strip().startswith("m") and ": Trace" in ln]
    assert rows and all("[proved, proved]" in ln for ln in rows)
    assert "PD: sufficient" in out
    # the metric built by hand in tests/derivations/test_joint.py is among them (its Bᵀ term)
    assert "Trace((G.T*G)**(-1)*eta_Bt.T*At.T*At*xi_Bt)" in out
    # one basis element is semidefinite (positive on one block at most): refused, nothing written
    assert main(["derive", "--spec", str(spec), "--metric", "m0", "--out", str(tmp_path / "o")]) == 2
    assert "not positive definite" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").glob("*.py"))
    spec.write_text("from derivations.joint import lora_attention\nSYMMETRY = lora_attention()\n")
    assert main(["derive", "--spec", str(spec)]) == 2
    assert "SIZES" in capsys.readouterr().err
