"""Diagonal linear networks: training (geosharp_ref.studies.diagnet.data) and the experiment's output
files (geosharp_ref.studies.diagnet.experiment)."""
import csv
import json
import math

import numpy as np

from geosharp_ref.studies import diagnet as D


def test_training_reaches_target_and_small_init_is_sparser():
    data = D.make_data(d=40, n=20, n_test=500, seed=1)
    hp = [dict(alpha=1e-3, lr=0.1, batch_size=20), dict(alpha=1e-3, lr=0.05, batch_size=5),
          dict(alpha=1.0, lr=0.05, batch_size=20), dict(alpha=0.3, lr=0.1, batch_size=10)]
    tr = D.train_diagonal_nets(data, hp, target_loss=1e-5, progress=False)
    assert all(tr.converged)
    loss = D.mse(tr.U * tr.V, data.X, data.y)
    assert bool((loss <= 1e-5).all())
    assert np.allclose(loss.numpy(), tr.train_loss, rtol=1e-12)
    l1 = (tr.U * tr.V).abs().sum(1)
    assert float(l1[0]) < float(l1[2])
    test = D.mse(tr.U * tr.V, data.X_test, data.y_test)
    assert float(test[0]) < float(test[2])


def test_run_experiment_tiny_population(tmp_path):
    res = D.run_experiment(n_models=6, seed=0, out_dir=tmp_path, rhos=(0.01, 0.1), n_iter=10, progress=False,
                           d=30, n=15, n_test=300, apgd_models=2, ref_iter=60, n_boot=50, verbose=False)
    for name in ("results.json", "models.csv", "diagnet.png"):
        assert (tmp_path / name).stat().st_size > 0
    with open(tmp_path / "models.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 6
    cols = rows[0].keys()
    for c in ("alpha", "lr", "batch_size", "train_loss", "test_loss", "gap", "converged"):
        assert c in cols
    for rho in (0.01, 0.1):
        for m in ("adaptive", "geodesic_inv", "geodesic_inv_trs2", "geodesic_mix", "apgd_mix_exact"):
            assert f"{m}@rho={rho:g}" in cols
    assert all(float(r["train_loss"]) <= 1e-5 for r in rows)
    assert all(math.isclose(float(r["gap"]), float(r["test_loss"]) - float(r["train_loss"]), rel_tol=1e-9)
               for r in rows)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["tau"]) == {"0.01", "0.1"}
    for m in D.HEADLINE:
        t = saved["tau"]["0.1"][m]
        assert -1 <= t["tau"] <= 1 and len(t["ci"]) == 2
    assert saved["paper_tau"] == D.PAPER_TAU
    assert "geodesic (6) mix" in res["table"] and "-0.86" in res["table"]
