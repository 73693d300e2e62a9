"""Correlating a population (geosharp_ref.studies.population.correlation): Kendall τ per measure and ρ
against scipy, the output files, and strata of hyper-parameters (--where)."""
import io
import json

import numpy as np
import pytest
from scipy.stats import kendalltau

from geosharp_ref.cli import main
from geosharp_ref.studies import population as pop
from tests import cases

N_MODELS = cases.POPULATION_MODELS


def test_correlate_outputs(reference, tmp_path, capsys):
    out = cases.copy_population(reference, tmp_path, results=True)
    assert main(["population", "correlate", "--out", str(out), "--bootstrap", "200"]) == 0
    printed = capsys.readouterr().out
    assert "Kendall τ" in printed and "geodesic-mix" in printed
    res = json.loads((out / "correlation.json").read_text())
    man = json.loads((out / "population.json").read_text())
    recs = {r["model"]: r for r in cases.jsonl(out / "results.jsonl")}
    gap = [m["metrics"]["gap"] for m in man["models"]]
    for rho in ("0.01", "0.05"):
        for meas in pop.MEASURES:
            x = [recs[m["name"]]["values"][meas][rho] for m in man["models"]]
            t = res["tau"][rho][meas]
            expect = kendalltau(x, gap).statistic
            assert (np.isnan(t["tau"]) and np.isnan(expect)) or t["tau"] == pytest.approx(expect)
            assert len(t["ci"]) == 2 and t["n"] == N_MODELS
    for rho in ("0.01", "0.05"):  # each geodesic measure's ranking of the models against adaptive's
        ada = np.array([recs[m["name"]]["values"]["adaptive"][rho] for m in man["models"]])
        for meas in ("geodesic-inv", "geodesic-mix"):
            x = np.array([recs[m["name"]]["values"][meas][rho] for m in man["models"]])
            a = res["measure_agreement"][rho][meas]
            assert a["vs"] == "adaptive" and a["tau"] == pytest.approx(kendalltau(x, ada).statistic)
            assert a["median_ratio"] == pytest.approx(np.median(x / ada))
        assert "adaptive" not in res["measure_agreement"][rho]
    assert (out / "correlation.png").stat().st_size > 1000
    assert (out / "correlation_rho.png").stat().st_size > 1000  # τ(ρ), two ρ values
    assert (out / "correlation_tau.csv").read_text().count("\n") == 1 + 2 * 3
    assert (out / "correlation.csv").read_text().count("\n") == 1 + N_MODELS


def test_correlate_where_restricts_to_a_hyperparameter_stratum(reference, tmp_path, capsys):
    out = cases.copy_population(reference, tmp_path, results=True)
    man = json.loads((out / "population.json").read_text())
    for i, m in enumerate(man["models"]):  # a stratum of three models, one outside it
        m["hparams"]["label_noise"] = 0.1 if i == 2 else 0.0
    (out / "population.json").write_text(json.dumps(man))
    assert pop.parse_where(["label_noise=0", "augment=false", "name=x"]) == {
        "label_noise": 0, "augment": False, "name": "x"}
    whole = pop.correlate_population(out, n_boot=50, plot=False)
    assert main(["population", "correlate", "--out", str(out), "--bootstrap", "50", "--no-plot",
                 "--where", "label_noise=0"]) == 0
    assert "with {'label_noise': 0}" in capsys.readouterr().out
    res = json.loads((out / "correlation-label_noise=0.json").read_text())
    recs = {r["model"]: r for r in cases.jsonl(out / "results.jsonl")}
    kept = [m for i, m in enumerate(man["models"]) if i != 2]
    assert res["models"] == 3 and res["where"] == {"label_noise": 0}
    gap = [m["metrics"]["gap"] for m in kept]
    for rho in ("0.01", "0.05"):
        for meas in pop.MEASURES:
            expect = kendalltau([recs[m["name"]]["values"][meas][rho] for m in kept], gap).statistic
            t = res["tau"][rho][meas]["tau"]
            assert (np.isnan(t) and np.isnan(expect)) or t == pytest.approx(expect)
    rows = (out / "correlation-label_noise=0.csv").read_text().splitlines()
    assert len(rows) == 4 and "label_noise" in rows[0].split(",") and "model_002" not in "".join(rows)
    # the stratum's outputs sit beside the whole population's, which stay as they were
    assert json.loads((out / "correlation.json").read_text())["models"] == whole["models"] == N_MODELS
    with pytest.raises(ValueError, match="unknown hyper-parameters \\['dropout'\\]; .*label_noise"):
        pop.correlate_population(out, where={"dropout": 0.1}, plot=False)
    with pytest.raises(ValueError, match="only 1 evaluated models .* at least 3"):
        pop.correlate_population(out, where={"label_noise": 0.1}, plot=False)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        pop.parse_where(["label_noise"])
    assert main(["population", "correlate", "--out", str(out), "--where", "nope=1"]) == 2


def test_correlate_reports_what_each_hyperparameter_drives(reference, tmp_path):
    """τ of each varying numeric or boolean hyper-parameter against the gap and against every measure, against
    scipy; constant, non-numeric and seed hyper-parameters are left out."""
    out = cases.copy_population(reference, tmp_path, results=True)
    man = json.loads((out / "population.json").read_text())
    for i, m in enumerate(man["models"]):
        m["hparams"].update(augment=i % 2 == 0, lr=[3e-5, 1e-5, 8e-5, 2e-5][i % 4], optimizer="adamw",
                            constant=1.0, seed=i)
    (out / "population.json").write_text(json.dumps(man))
    res = pop.correlate_population(out, n_boot=50, plot=False, stream=io.StringIO())["hyperparameter_tau"]
    assert {"augment", "lr"} <= set(res) and not {"optimizer", "constant", "seed"} & set(res)
    recs = {r["model"]: r for r in cases.jsonl(out / "results.jsonl")}
    gap = [m["metrics"]["gap"] for m in man["models"]]
    for key in ("augment", "lr"):
        x = [float(m["hparams"][key]) for m in man["models"]]
        assert res[key]["gap"]["tau"] == pytest.approx(kendalltau(x, gap).statistic)
        assert res[key]["gap"]["p"] == pytest.approx(kendalltau(x, gap).pvalue)
        for rho in ("0.01", "0.05"):
            for meas in pop.MEASURES:
                y = [recs[m["name"]]["values"][meas][rho] for m in man["models"]]
                expect = kendalltau(x, y).statistic
                got = res[key][rho][meas]["tau"]
                assert (np.isnan(got) and np.isnan(expect)) or got == pytest.approx(expect)


def test_correlate_colours_the_scatter_by_a_hyperparameter(reference, tmp_path, capsys):
    out = cases.copy_population(reference, tmp_path, results=True)
    man = json.loads((out / "population.json").read_text())
    for i, m in enumerate(man["models"]):
        m["hparams"]["augment"] = i % 2 == 0
    (out / "population.json").write_text(json.dumps(man))
    assert main(["population", "correlate", "--out", str(out), "--bootstrap", "50", "--color-by", "augment"]) == 0
    assert "correlation_by-augment.png" in capsys.readouterr().out
    assert (out / "correlation_by-augment.png").stat().st_size > 1000
