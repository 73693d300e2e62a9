"""`geosharp diagnet`: wired into the one parser, arguments reach run_experiment, too few models refused."""
import pytest

import geosharp_ref.cli.diagnet
from geosharp_ref.cli import main


def test_diagnet_subcommand_is_wired(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["diagnet", "--help"])
    assert exc.value.code == 0
    assert "geosharp diagnet" in capsys.readouterr().out


def test_diagnet_parses_arguments(monkeypatch, tmp_path, capsys):
    seen = {}
    monkeypatch.setattr(geosharp_ref.cli.diagnet, "run_experiment", lambda **kw: seen.update(kw) or {})
    assert main(["diagnet", "--models", "7", "--seed", "3", "--out", str(tmp_path), "--rho", "0.01", "0.2",
                 "--no-progress"]) == 0
    assert seen["n_models"] == 7 and seen["seed"] == 3 and seen["out_dir"] == str(tmp_path)
    assert seen["rhos"] == (0.01, 0.2) and seen["progress"] is False
    seen.clear()
    assert main(["diagnet", "--models", "1"]) == 2
    assert "geosharp: error: --models must be at least 3" in capsys.readouterr().err
    assert not seen  # nothing ran
