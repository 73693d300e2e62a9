"""The committed population results are reproduced from their committed per-model CSVs: Kendall τ and its
bootstrap interval (``geosharp_ref.stats``, the function ``geosharp population correlate`` uses) recomputed
from ``docs/population_*_models.csv`` equal the committed ``docs/population_*_tau.csv``."""
import csv
from pathlib import Path

import numpy as np
import pytest

from geosharp_ref.stats import kendall_with_ci

DOCS = Path(__file__).resolve().parents[1] / "docs"
POPULATIONS = sorted(p.name[len("population_"):-len("_models.csv")] for p in DOCS.glob("population_*_models.csv")
                     if (DOCS / p.name.replace("_models.csv", "_tau.csv")).is_file())


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_committed_populations_found():
    assert {"vision", "text"} <= set(POPULATIONS)


@pytest.mark.parametrize("population", POPULATIONS)
def test_tau_recomputed_from_committed_models_csv(population):
    models = _read(DOCS / f"population_{population}_models.csv")
    taus = _read(DOCS / f"population_{population}_tau.csv")
    gap = np.array([float(r["gap"]) for r in models])
    assert taus
    for t in taus:
        x = np.array([float(r[f"{t['measure']}@rho={t['rho']}"]) for r in models])
        got = kendall_with_ci(x, gap, n_boot=1000, seed=0)
        assert got["n"] == int(t["n"])
        assert got["tau"] == pytest.approx(float(t["tau"]), abs=1e-12)
        assert got["ci"][0] == pytest.approx(float(t["ci_low"]), abs=1e-12)
        assert got["ci"][1] == pytest.approx(float(t["ci_high"]), abs=1e-12)
