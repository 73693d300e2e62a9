"""The whole population study (geosharp_ref.studies.population.study, `geosharp population study`): train,
evaluate, correlate end to end; a rerun redoes nothing."""
import json

import numpy as np

from geosharp_ref.cli import main
from geosharp_ref.studies import population as pop


def test_study_runs_end_to_end_and_resumes(tmp_path, capsys):
    out = tmp_path / "study"
    args = ["population", "study", "--out", str(out), "--models", "3", "--epochs-max", "1", "--train-size-max",
            "64", "--workers", "1", "--rho", "0.02", "--batches", "2", "--batch-size", "16", "--iters", "2",
            "--bootstrap", "50", "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    res = json.loads((out / "correlation.json").read_text())
    assert res["models"] == 3 and set(res["tau"]["0.02"]) == set(pop.MEASURES)
    for meas, t in res["tau"]["0.02"].items():  # the printed table is the stored one
        if np.isfinite(t["tau"]):
            assert f"{t['tau']:+.2f} [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]" in printed
    assert str(out / "correlation.png") in printed
    stamps = {p: p.stat().st_mtime_ns for p in (out / "models").rglob("model.safetensors")}
    results = (out / "results.jsonl").read_text()
    assert main(args) == 0  # a rerun trains and evaluates nothing again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert (out / "results.jsonl").read_text() == results
