"""The committed population results are reproduced from their committed per-model CSVs: Kendall τ and its
bootstrap interval, and the paired |τ| differences (``geosharp_ref.stats``, the functions ``geosharp population
correlate`` uses), recomputed from the per-model CSV equal the committed τ and paired tables. Covers the
from-scratch populations (``docs/population_*_{models,tau}.csv``) and the MiniLM fine-tunes
(``docs/minilm/<population>/correlation[-<tag>]{.csv,_tau.csv,_paired.csv}``; an ablation is paired with its
full measure, read from the untagged per-model CSV at the same ρ)."""
import csv
from pathlib import Path

import numpy as np
import pytest

from geosharp_ref.stats import kendall_with_ci, paired_abs_tau_difference

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: name → (per-model CSV, τ CSV)
TABLES = {p.name[len("population_"):-len("_models.csv")]: (p, DOCS / p.name.replace("_models.csv", "_tau.csv"))
          for p in DOCS.glob("population_*_models.csv")}
TABLES.update({f"minilm-{p.parent.name}{p.stem[len('correlation'):]}": (p, p.with_name(p.stem + "_tau.csv"))
               for p in (DOCS / "minilm").glob("*/correlation*.csv")
               if not p.stem.endswith(("_tau", "_paired"))})
TABLES = {k: v for k, v in sorted(TABLES.items()) if v[1].is_file()}
PAIRED = sorted(k for k, (models, _) in TABLES.items()
                if models.with_name(models.stem + "_paired.csv").is_file())


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _column(models, measure, rho):
    return np.array([float(r[f"{measure}@rho={rho}"]) for r in models])


def test_committed_populations_found():
    assert {"vision", "text", "minilm-seeds"} <= set(TABLES)
    assert "minilm-seeds" in PAIRED


@pytest.mark.parametrize("population", list(TABLES))
def test_tau_recomputed_from_committed_models_csv(population):
    models_csv, tau_csv = TABLES[population]
    models, taus = _read(models_csv), _read(tau_csv)
    gap = np.array([float(r["gap"]) for r in models])
    assert taus
    for t in taus:
        got = kendall_with_ci(_column(models, t["measure"], t["rho"]), gap, n_boot=1000, seed=0)
        assert got["n"] == int(t["n"])
        assert got["tau"] == pytest.approx(float(t["tau"]), abs=1e-12)
        assert got["ci"][0] == pytest.approx(float(t["ci_low"]), abs=1e-12)
        assert got["ci"][1] == pytest.approx(float(t["ci_high"]), abs=1e-12)


@pytest.mark.parametrize("population", PAIRED)
def test_paired_differences_recomputed_from_committed_models_csv(population):
    models_csv, tau_csv = TABLES[population]
    models = _read(models_csv)
    rho = {(t["row"], t["measure"]): t["rho"] for t in _read(tau_csv)}
    gap = np.array([float(r["gap"]) for r in models])
    rows = _read(models_csv.with_name(models_csv.stem + "_paired.csv"))
    assert rows
    for p in rows:
        r = rho[p["row"], p["measure"]]
        x = _column(models, p["measure"], r)
        r_vs = rho.get((p["row"], p["vs"]), r)  # an ablation's full measure: at the ablation's ρ
        if f"{p['vs']}@rho={r_vs}" in models[0]:
            ref = _column(models, p["vs"], r_vs)
        else:  # an ablation: its full measure is in the untagged evaluation's per-model CSV
            full = _read(models_csv.with_name("correlation.csv"))
            assert [r["model"] for r in full] == [r["model"] for r in models]
            ref = _column(full, p["vs"], r_vs)
        got = paired_abs_tau_difference(x, ref, gap, n_boot=1000, seed=0)
        assert got["n"] == int(p["n"])
        assert got["difference"] == pytest.approx(float(p["abs_tau_difference"]), abs=1e-12)
        assert got["ci"] == pytest.approx([float(p["ci_low"]), float(p["ci_high"])], abs=1e-12)
