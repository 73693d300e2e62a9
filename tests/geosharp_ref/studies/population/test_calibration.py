"""Calibrating a population's radii (geosharp_ref.studies.population.calibration): the fit passes through the
measured medians, and a calibration killed between its probe runs resumes after its last finished run with the
uninterrupted calibration's radii, and a model's probe runs share what they compute at θ (the shared tiny ViT
population of conftest.py)."""
import contextlib
import json
import math

import numpy as np
import pytest

from geosharp_ref.sharpness import at_theta
from geosharp_ref.studies.population import calibration
from geosharp_ref.studies.population.calibration import CALIBRATION_UNITS, calibrate_population
from tests import cases

CAL = dict(sizes=(1e-4, 1e-3), measures=("adaptive", "geodesic-inv"), models=2, batch_size=16,
           probe_rhos=(0.01, 0.05), n_iter=3, progress=False)
#: probe runs of CAL: models × measures × probes
RUNS = 2 * 2 * 2


@pytest.fixture(scope="module")
def calibrated(trained, tmp_path_factory):
    """An uninterrupted calibration (in a copy of the population)."""
    out = cases.copy_population(trained, tmp_path_factory.mktemp("cal"))
    calibrate_population(out, **CAL)
    return out


def _without_timing(cal: dict) -> dict:
    return {k: v for k, v in cal.items() if k != "seconds"}


def test_the_fit_passes_through_the_measured_medians(calibrated):
    cal = json.loads((calibrated / "calibration.json").read_text())
    (r1, r2), sizes = cal["settings"]["probe_rhos"], cal["settings"]["sizes"]
    assert cal["models_used"] == ["model_000", "model_001"] and not (calibrated / CALIBRATION_UNITS).exists()
    for m in CAL["measures"]:
        s1, s2 = (float(np.median(cal["measured"][m][f"{r:g}"])) for r in (r1, r2))
        assert cal["fit"][m]["median_sizes"] == [s1, s2]
        slope = math.log(s2 / s1) / math.log(r2 / r1)
        for rho, size in zip(cal["grid"][m], sizes):  # log s = log s1 + slope · log(ρ/ρ1), solved for ρ
            assert rho == pytest.approx(r1 * (size / s1) ** (1 / slope), rel=1e-3)


def test_a_models_probe_runs_share_what_they_compute_at_theta(calibrated, trained, tmp_path, monkeypatch):
    """Each model's runs share one at_theta scope: the calibration equals the one whose every run computes its
    values at θ again (no scope), with fewer forward passes; no scope is left open."""
    forwards, models = [], []
    load = calibration.load_population_model

    def counted(*args, **kwargs):
        model = load(*args, **kwargs)
        model.register_forward_hook(lambda *_: forwards.append(1))
        models.append(model)
        return model
    monkeypatch.setattr(calibration, "load_population_model", counted)
    kept = calibrate_population(cases.copy_population(trained, tmp_path / "kept"), **CAL)
    n_kept = len(forwards)
    forwards.clear()
    monkeypatch.setattr(at_theta, "keeping", lambda model: contextlib.nullcontext())
    apart = calibrate_population(cases.copy_population(trained, tmp_path / "apart"), **CAL)
    reference = _without_timing(json.loads((calibrated / "calibration.json").read_text()))
    assert _without_timing(kept) == _without_timing(apart) == reference
    assert 0 < n_kept < len(forwards) and len(models) == 2 * CAL["models"]
    assert not any(m in at_theta._MEMOS for m in models)


def test_a_killed_calibration_resumes_after_its_last_finished_run(calibrated, trained, tmp_path, monkeypatch):
    """Killed inside its runs, the calibration keeps each finished probe run (calibration.units.jsonl) and writes
    no calibration.json; the rerun measures only the rest (a torn last line and runs of other settings are not
    reused), writes the uninterrupted run's calibration and removes the units."""
    out = cases.copy_population(trained, tmp_path)
    with monkeypatch.context() as mp:
        cases.count_measure_runs(mp, calibration.NAMED_MEASURES, CAL["measures"], die_at=6)
        with pytest.raises(cases.Killed):
            calibrate_population(out, **CAL)
    units = cases.jsonl(out / CALIBRATION_UNITS)
    assert len(units) == 5 and not (out / "calibration.json").exists()
    assert [u["model"] for u in units] == ["model_000"] * 4 + ["model_001"]

    other = dict(units[-1], settings="0" * 16, relative_size=1.0)  # another calibration's run of the same unit
    with open(out / CALIBRATION_UNITS, "a") as f:
        f.write(json.dumps(other) + "\n" + json.dumps(units[0])[:20])  # and a line torn by the kill
    calls = cases.count_measure_runs(monkeypatch, calibration.NAMED_MEASURES, CAL["measures"])
    cal = calibrate_population(out, **CAL)
    assert len(calls) == RUNS - 5
    reference = json.loads((calibrated / "calibration.json").read_text())
    assert _without_timing(cal) == _without_timing(reference)
    assert _without_timing(json.loads((out / "calibration.json").read_text())) == _without_timing(reference)
    assert not (out / CALIBRATION_UNITS).exists()
    calls.clear()
    assert _without_timing(calibrate_population(out, **CAL)) == _without_timing(reference) and not calls  # done


def test_a_size_the_fit_reaches_only_beyond_the_largest_radius_is_refused_before_writing(calibrated, trained, tmp_path,
                                                                                       monkeypatch):
    """A target size whose fitted radius exceeds MAX_RHO (amendment 12: an evaluation refuses such a ρ, and used to
    do so only at that unit of the first model) is refused by the calibration, naming the measure and the size;
    no calibration.json is written and the probe runs stay in calibration.units.jsonl."""
    reference = json.loads((calibrated / "calibration.json").read_text())
    largest = max(rho for m in CAL["measures"] for rho in reference["grid"][m])
    m, size = next((m, s) for m in CAL["measures"] for rho, s in zip(reference["grid"][m], CAL["sizes"])
                   if rho == largest)
    monkeypatch.setattr(calibration, "MAX_RHO", largest * 0.99)
    out = cases.copy_population(trained, tmp_path)
    with pytest.raises(ValueError, match=f"{m}: the fit reaches the relative size {size:g} only at ρ = {largest:g}"):
        calibrate_population(out, **CAL)
    assert not (out / "calibration.json").exists() and len(cases.jsonl(out / CALIBRATION_UNITS)) == RUNS
    monkeypatch.setattr(calibration, "MAX_RHO", largest)  # at the limit itself: accepted, the reference's radii
    assert _without_timing(calibrate_population(out, **CAL)) == _without_timing(reference)
