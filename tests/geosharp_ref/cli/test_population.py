"""`geosharp population`: help, one-line errors (exit 2), a small training run."""
import json

import pytest

from geosharp_ref.cli import main


def test_cli_help_and_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["population", "--help"])
    text = capsys.readouterr().out
    for word in ("train", "evaluate", "correlate", "torchrun"):
        assert word in text
    assert main(["population", "evaluate", "--out", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert "population train" in err
    assert err.startswith("geosharp: error: ") and err.count("\n") == 1  # one line, the CLI's one prefix


def test_cli_train_small(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["population", "train", "--out", str(out), "--models", "2", "--epochs-max", "1",
                 "--train-size-max", "64", "--workers", "1", "--no-progress"]) == 0
    assert "2 models" in capsys.readouterr().out
    assert len(json.loads((out / "population.json").read_text())["models"]) == 2

