"""`geosharp verify` on tiny saved BERT / ViT models (no network): output, geodesic sharpness and Riemannian
gradient norms invariant along GL(h) orbits, adaptive sharpness not; a non-symmetry fails."""
import pytest

from geosharp_ref.cli import main
from geosharp_ref.symmetry import SymmetryMap


@pytest.mark.parametrize("model, data", [("bert", False), ("vit", True)])
def test_verify_passes(saved, capsys, model, data):
    argv = ["verify", str(saved / model)] + (["--data", str(saved / f"{model}.pt")] if data else [])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "SymmetryMap: 4 GL(h) groups" in out and "PASS" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["0.01"], ["1"], ["100"])]
    assert len(rows) == 3
    for row in rows:  # scale, output, geo-inv, geo-mix, grad-inv, grad-mix, adaptive [varies]
        assert all(float(v) <= 1e-10 for v in row[1:6]), row
    assert any("varies" in row for row in rows)  # adaptive sharpness is not invariant


def test_verify_fails_when_the_action_is_not_a_symmetry(saved, capsys, monkeypatch):
    monkeypatch.setattr(SymmetryMap, "act", lambda self, params, As: {k: 1.01 * v for k, v in params.items()})
    assert main(["verify", str(saved / "vit"), "--scales", "1", "--iters", "1"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_verify_errors_exit_2(saved, tmp_path, capsys):
    assert main(["verify", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    for bad in (["--rho", "0"], ["--scales", "1,x"], ["--scales", "1,-2"], ["--iters", "0"]):
        assert main(["verify", str(saved / "bert")] + bad) == 2
        assert "geosharp: error:" in capsys.readouterr().err

