"""The population rows of the bad-input table in docs/reference/errors.md (the others:
tests/geosharp_ref/cli/test_bad_input.py): an empty population, a corrupt manifest, two evaluations (or
calibrations) of one directory at once, a damaged record of a killed calibration, the status of no population,
a pack of no population or into a foreign directory, a pack whose checksums are damaged or do not rebuild,
a full disk while results are written, and a hyper-parameter the population does not record. Each gives one
line ``geosharp: error: …`` and exit code 2, and nothing already written is lost: a rerun completes the
evaluation with exactly the uninterrupted run's results."""
import errno
import json
import os

import pytest

from geosharp_ref.cli import main
from geosharp_ref.io import durable
from geosharp_ref.io.durable import exclusive_lock
from tests import cases


_error_line = cases.cli_error_line  # the one `geosharp: error:` line, exit code 2


def _evaluate_argv(out):
    return ["population", "evaluate", "--out", str(out), *cases.POPULATION_EVAL_ARGS]


def test_empty_population(tmp_path, capsys):
    assert "--models must be a positive integer" in _error_line(
        capsys, ["population", "train", "--out", str(tmp_path / "p"), "--models", "0"])
    assert not (tmp_path / "p").exists()
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "population.json").write_text(json.dumps({"plan": {}, "models": [], "complete": True}))
    assert "has no models" in _error_line(capsys, _evaluate_argv(tmp_path / "q"))


def test_corrupt_manifest(trained, tmp_path, capsys):
    out = cases.copy_population(trained, tmp_path)
    text = (out / "population.json").read_text()
    (out / "population.json").write_text(text[: len(text) // 2])  # torn by hand
    assert "not a valid population manifest (corrupt JSON" in _error_line(capsys, _evaluate_argv(out))
    assert not (out / "results.jsonl").exists()


@pytest.mark.parametrize("world", [1, 2])
def test_two_evaluations_at_once_are_refused(trained, tmp_path, capsys, monkeypatch, world):
    """Also under torchrun: its rank 0 holds the lock (a failing rank ends the others), so a sitting started beside
    ranks still running is refused instead of repeating their work and finalizing under them."""
    from geosharp_ref import distributed

    out = cases.copy_population(trained, tmp_path)
    monkeypatch.setattr(distributed, "rank_world", lambda: (0, world))
    with exclusive_lock(out / ".evaluate.lock"):  # another process's evaluation holds the directory
        line = _error_line(capsys, _evaluate_argv(out))
    assert "another `geosharp population evaluate` is running" in line
    assert not (out / "results.jsonl").exists()


class _DiskFillsUp:
    """``os`` for geosharp_ref.io.durable whose ``write`` runs out of space after ``lines`` complete writes,
    writing half of the next one first (a torn line, as a real full disk leaves it)."""

    def __init__(self, lines):
        self.lines = lines

    def write(self, fd, data):
        if self.lines == 0:
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.lines -= 1
        return os.write(fd, data)

    def __getattr__(self, name):
        return getattr(os, name)


@pytest.mark.parametrize("torn", ["record", "unit"])
def test_full_disk_loses_nothing_already_written(trained, reference, tmp_path, capsys, monkeypatch, torn):
    """The disk fills up in the third model, while writing its record or one of its finished measures
    (results.units/): everything written before is intact, and with space again the rerun repairs the torn line
    and ends as the uninterrupted run."""
    out = cases.copy_population(trained, tmp_path)
    units = len(cases.POPULATION_EVAL["rhos"]) * 3  # the three headline measures at each radius
    whole = 2 * (units + 1) + (units if torn == "record" else 3)  # complete writes before the torn one
    monkeypatch.setattr(durable, "os", _DiskFillsUp(lines=whole))
    line = _error_line(capsys, _evaluate_argv(out))
    assert "No space left on device" in line
    monkeypatch.undo()
    kept = (out / "results.jsonl").read_bytes()
    done = cases.jsonl(reference / "results.jsonl")
    first_two = b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in done[:2])
    if torn == "record":  # the two records written before the disk filled up are intact, the third a fragment
        assert kept.startswith(first_two) and first_two < kept and len(kept) < len(first_two) + len(json.dumps(done[2]))
    else:  # two whole records; three whole finished measures of the third model and a torn fourth
        assert kept == first_two
        lines = (out / "results.units" / "rank0.jsonl").read_bytes().split(b"\n")
        assert [json.loads(x)["model"] for x in lines[-4:-1]] == ["model_002"] * 3 and lines[-1]
    # space again: the rerun repairs the torn line, keeps what was written, and ends as the uninterrupted run
    assert main(_evaluate_argv(out)) == 0
    assert (out / "results.jsonl").read_bytes() == (reference / "results.jsonl").read_bytes()
    assert not (out / "results.units").exists()


def test_calibration_columns_need_a_calibration(trained, tmp_path, capsys):
    out = cases.copy_population(trained, tmp_path)
    line = _error_line(capsys, _evaluate_argv(out) + ["--sizes", "2e-4"])
    assert "--sizes picks columns of the calibrated grid; add --calibration" in line
    line = _error_line(capsys, _evaluate_argv(out) + ["--calibration", "--sizes", "2e-4"])
    assert "calibration.json does not exist" in line
    assert not (out / "results.jsonl").exists()


_CALIBRATE_ARGS = ["--sizes", "1e-4", "1e-3", "--models", "2", "--batch-size", "16", "--probe-rho", "0.01", "0.05",
                   "--iters", "3", "--measures", "adaptive", "--no-progress"]


def test_a_damaged_calibration_run_or_a_second_calibration_is_refused(trained, tmp_path, capsys):
    """A line of calibration.units.jsonl (a killed calibration's finished probe runs) that is not a run, and a
    second calibration of the same population at once, are refused before anything is written."""
    out = cases.copy_population(trained, tmp_path)
    argv = ["population", "calibrate", "--out", str(out), *_CALIBRATE_ARGS]
    units = out / "calibration.units.jsonl"
    units.write_text(json.dumps({"model": "model_000", "measure": "adaptive"}) + "\n")
    line = _error_line(capsys, argv)
    assert "calibration.units.jsonl: line 1 is not a finished probe run" in line and "delete that line" in line
    assert units.read_text().count("\n") == 1
    units.unlink()
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in trained.iterdir())  # no lock, no file
    with exclusive_lock(out / ".calibrate.lock"):  # another process's calibration holds the directory
        line = _error_line(capsys, argv)
    assert "another `geosharp population calibrate` is running" in line
    assert not (out / "calibration.json").exists() and not units.exists()


def test_status_needs_a_population(trained, tmp_path, capsys):
    """``population status`` on a directory without a manifest, or with a manifest whose models are not entries,
    is refused in one line; it writes nothing either way."""
    line = _error_line(capsys, ["population", "status", "--out", str(tmp_path / "none")])
    assert "population.json does not exist; no population here; train one with `geosharp population train" in line
    out = cases.copy_population(trained, tmp_path)
    man = json.loads((out / "population.json").read_text())
    (out / "population.json").write_text(json.dumps(dict(man, models=[1, 2])))
    line = _error_line(capsys, ["population", "status", "--out", str(out), "--json"])
    assert "'models' must be a list of model entries with a 'name'" in line
    assert not (tmp_path / "none").exists()


def test_pack_refusals_and_a_pack_that_does_not_rebuild(trained, tmp_path, capsys):
    """``population pack`` of no population, into a foreign directory or into the population itself is refused
    before anything is written; an evaluation of a pack whose SHA256SUMS is damaged is refused before it writes
    anything, and one whose rebuilt weights differ from their sums installs nothing and records no result."""
    line = _error_line(capsys, ["population", "pack", "--out", str(tmp_path / "none"), "--to", str(tmp_path / "p")])
    assert "population.json does not exist; " in line and "is not a population directory" in line
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    line = _error_line(capsys, ["population", "pack", "--out", str(trained), "--to", str(foreign)])
    assert "exists and is not a pack of this population" in line
    line = _error_line(capsys, ["population", "pack", "--out", str(trained), "--to", str(trained / "pack")])
    assert "contain one another" in line
    assert not (tmp_path / "p").exists() and not (trained / "pack").exists()
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    capsys.readouterr()
    assert main(["population", "pack", "--out", str(trained), "--to", str(tmp_path / "p")]) == 0
    assert "packed 4 models" in capsys.readouterr().out
    sums = tmp_path / "p" / "models" / "model_000" / "SHA256SUMS"
    good = sums.read_text()
    sums.write_text("damaged\n")
    assert "SHA256SUMS: line 1 is not" in _error_line(capsys, _evaluate_argv(tmp_path / "p"))
    assert not (tmp_path / "p" / "evaluation.json").exists()
    sums.write_text(good.replace(good[:64], ("0" if good[0] != "0" else "1") + good[1:64], 1))
    assert "differs from its recorded SHA-256" in _error_line(capsys, _evaluate_argv(tmp_path / "p"))
    assert not (tmp_path / "p" / "results.jsonl").exists()
    assert sorted(p.name for p in sums.parent.iterdir()) == ["SHA256SUMS", "geosharp_model.json"]


def test_correlate_names_only_recorded_hyperparameters(reference, tmp_path, capsys):
    out = cases.copy_population(reference, tmp_path, results=True)
    argv = ["population", "correlate", "--out", str(out), "--bootstrap", "20"]
    line = _error_line(capsys, argv + ["--where", "dropout=0.1"])
    assert "--where names unknown hyper-parameters ['dropout']; this population records [" in line
    line = _error_line(capsys, argv + ["--color-by", "dropout"])
    assert "--color-by 'dropout' is not a recorded hyper-parameter; this population records [" in line
    assert _error_line(capsys, argv + ["--color-by", "seed", "--no-plot"]).endswith(
        "--color-by draws a plot; drop --no-plot")
    assert not list(out.glob("correlation*"))
