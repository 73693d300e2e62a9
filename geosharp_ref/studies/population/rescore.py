"""Re-score a trained population on every pool document no model trained on (issue 29, item 2).

The MiniLM/BBC populations train every model on ``pool[:384]`` and measure sharpness on ``pool[:256]``, so the
rest of the pool (1,143 documents) was never seen by any model. Added to the 600-document test set, it makes a
1,743-document test set: inference only, no model changes. This module

1. checks that the population directory's models are the committed ones: every model's recorded train and
   test errors must equal those of a reference manifest (``--reference``, e.g. the committed
   ``docs/minilm/recipes/population.json``) and its losses agree to :data:`LOSS_RTOL` (retrained in float32 with
   another thread count they differ in the last digits: ≤ 2.3e-7 on the seeds population); the agreement is
   recorded as ``reference_agreement``;
2. predicts the extended test set (the test set followed by ``pool[n_train:]``, ``n_train`` the largest
   training set of any model) once per model, resumably (``test_predictions_extended.jsonl``), and checks that
   the predictions on the original test set give the recorded test error; each line carries the SHA-256 of the
   weights that predicted (``weights_sha256``), and a model whose weights changed since is predicted again;
3. writes ``rescore.json``: per model the extended test error and gap, the split-half reliability of the new
   gaps (as :mod:`.reliability`: 200 halvings, Spearman–Brown, ceiling), and — where a ``results.jsonl`` of the
   same models is given (``--results``, e.g. the committed ``docs/minilm/recipes``) — Kendall τ of every measure
   against the new gap with bootstrap intervals and the signed contrasts τ_geo − τ_ada
   (:func:`~.reanalysis.signed_tau_difference`), each against its adaptive counterpart, and the same contrast
   of partial τ given the train error (``partial_contrast``, :func:`~.reanalysis.partial_tau_difference`: the
   recipes population's gap mostly measures under-fitting).

Commands (the model directories of the committed MiniLM populations are gone; retrain them first, bit-identical
to the committed records, about 2 core-minutes per model)::

    geosharp population train --task minilm-recipes --models 40 --out /work/populations/minilm-recipes --workers 1
    python -m geosharp_ref.studies.population.rescore /work/populations/minilm-recipes \\
        --reference docs/minilm/recipes/population.json --results docs/minilm/recipes
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau

from ...io.durable import append_line, read_jsonl, write_json_atomic
from ...stats import kendall_with_ci
from .evaluation import evaluation_grid, load_population_model, read_results
from .manifest import read_manifest
from .pack import weights_digest
from .reanalysis import partial_tau_difference, signed_tau_difference
from .reliability import prediction_record, predictions_of_these_weights, split_half_reliability
from .task import Split
from .tasks import get_task
from .training import batched_logits

__all__ = ["extended_test_set", "rescore_population", "EXTENDED_PREDICTIONS", "RESCORE"]

EXTENDED_PREDICTIONS = "test_predictions_extended.jsonl"
RESCORE = "rescore.json"


def _slice(inputs: dict, s: slice) -> dict:
    return {k: v[s] for k, v in inputs.items()}


def extended_test_set(split: Split, n_train: int) -> tuple:
    """``(inputs, labels, n_original)``: the test set followed by the pool documents from ``n_train`` on."""
    if not 0 < n_train <= len(split.y_pool):
        raise ValueError(f"n_train={n_train} must lie in (0, {len(split.y_pool)}]")
    inputs = {k: torch.cat([split.test[k], split.pool[k][n_train:]]) for k in split.test}
    return inputs, torch.cat([split.y_test, split.y_pool[n_train:]]), len(split.y_test)


#: the largest relative difference of a retrained model's train/test loss from the reference manifest's: float32
#: training repeated with another thread count sums in another order (measured on the MiniLM seeds population:
#: ≤ 2.3e-7, every train and test error identical)
LOSS_RTOL = 1e-5


def _check_reference(manifest: dict, reference: dict) -> dict:
    """The models in ``manifest`` must be the reference's: the same plan and hyper-parameters, train and test
    errors equal (counts of wrong documents), train and test losses within :data:`LOSS_RTOL` (relative). Returns
    the agreement (recorded in ``rescore.json``)."""
    ref = {m["name"]: m.get("metrics") for m in reference["models"]}
    if manifest["plan"] != reference["plan"]:
        raise ValueError("the population directory was planned differently from the reference manifest")
    worst = {"train_loss": 0.0, "test_loss": 0.0}
    for m in manifest["models"]:
        want = ref.get(m["name"])
        if want is None or m["hparams"] != next(r["hparams"] for r in reference["models"] if r["name"] == m["name"]):
            raise ValueError(f"{m['name']}: not in the reference manifest with the same hyper-parameters")
        for k in ("train_error", "test_error"):
            if m["metrics"][k] != want[k]:
                raise ValueError(f"{m['name']}: {k} {m['metrics'][k]!r} differs from the reference {want[k]!r}; "
                                 f"the model directory is not the committed model (retrain it with the same task)")
        for k in worst:
            rel = abs(m["metrics"][k] - want[k]) / max(abs(want[k]), 1e-300)
            if not rel <= LOSS_RTOL:
                raise ValueError(f"{m['name']}: {k} {m['metrics'][k]!r} differs from the reference {want[k]!r} by "
                                 f"{rel:.2g} (relative, more than {LOSS_RTOL:g}); the model directory is not the "
                                 f"committed model (retrain it with the same task)")
            worst[k] = max(worst[k], rel)
    return dict(models=len(manifest["models"]), errors_equal=True, loss_rtol=LOSS_RTOL,
                max_relative_loss_difference=worst)


def rescore_population(out, reference=None, results=None, splits: int = 200, seed: int = 0, n_boot: int = 1000,
                       batch_size: int = 256, threads: int | None = 1, progress: bool = True) -> dict:
    """Re-score the population in ``out`` on its extended test set (see the module doc); writes ``rescore.json``."""
    out = Path(out)
    manifest = read_manifest(out)
    agreement = None
    if reference is not None:
        agreement = _check_reference(manifest, json.loads(Path(reference).read_text()))
    if threads:
        torch.set_num_threads(threads)
    split = get_task(manifest["plan"]["task"]).load_split(manifest["plan"]["data"], out)
    n_train = max(m["metrics"]["train_examples"] for m in manifest["models"])
    inputs, y, n_orig = extended_test_set(split, n_train)
    path = out / EXTENDED_PREDICTIONS
    digests = {m["name"]: weights_digest(out, m) for m in manifest["models"]}
    done = predictions_of_these_weights(read_jsonl(path, repair=True), digests)
    from tqdm.auto import tqdm

    for m in tqdm([m for m in manifest["models"] if m["name"] not in done], desc="extended test predictions",
                  unit="model", disable=not progress):
        model = load_population_model(out, m, progress).eval()
        pred = torch.cat([lg.argmax(-1) for _, lg in batched_logits(model, inputs, len(y), batch_size)])
        err = float((pred[:n_orig] != y[:n_orig]).float().mean())
        if abs(err - m["metrics"]["test_error"]) * n_orig > 1.5:
            raise ValueError(f"{m['name']}: predictions give test error {err:.4f} on the original test set, the "
                             f"manifest records {m['metrics']['test_error']:.4f}")
        append_line(path, prediction_record(m["name"], pred.tolist(), digests[m["name"]]))
        done[m["name"]] = pred.tolist()
    names = [m["name"] for m in manifest["models"]]
    yn = y.numpy()
    wrong = np.array([np.asarray(done[n]) != yn for n in names])
    train_error = np.array([m["metrics"]["train_error"] for m in manifest["models"]])
    test_error = wrong.mean(1)
    gap = test_error - train_error
    n = len(yn)
    tau_half, tau_range95, r_full = split_half_reliability(wrong, train_error, splits, seed)
    result = dict(models=len(names), reference_agreement=agreement, n_test_original=n_orig, n_test_extended=int(n), n_train=n_train,
                  per_model={nm: dict(test_error=float(te), gap=float(g), test_error_original=float(
                      wrong[i, :n_orig].mean())) for i, (nm, te, g) in enumerate(zip(names, test_error, gap))},
                  reliability=dict(splits=splits, seed=seed, tau_half=dict(
                      median=tau_half, range95=tau_range95),
                      pearson_full_spearman_brown=r_full,
                      tau_ceiling=2 / math.pi * math.asin(math.sqrt(r_full)) if r_full > 0 else 0.0),
                  gap_sd=float(gap.std(ddof=1)),
                  tau_gap_original_vs_extended=float(kendalltau(gap, [m["metrics"]["gap"] for m in manifest["models"]]).statistic))
    if results is not None:
        rdir = Path(results)
        cfg = json.loads((rdir / "evaluation.json").read_text())
        recs = read_results(rdir)
        rows, grid = evaluation_grid(cfg)
        table, contrast, partial = {}, {}, {}
        for i, row in enumerate(rows):
            cols = {m: np.array([recs[nm]["values"][m][grid[m][i]] for nm in names]) for m in cfg["measures"]}
            table[row] = {m: kendall_with_ci(v, gap, n_boot=n_boot, seed=seed) for m, v in cols.items()}
            contrast[row], partial[row] = {}, {}
            for m in cols:
                if m.startswith("geodesic-") and not any(a in m for a in ("first-order", "frobenius")):
                    ada = "adaptive-linearised" if m.endswith("-linearised") else "adaptive"
                    if ada in cols:
                        contrast[row][f"{m} - {ada}"] = signed_tau_difference(cols[m], cols[ada], gap,
                                                                              n_boot=n_boot, seed=seed)
                        partial[row][f"{m} - {ada}"] = partial_tau_difference(cols[m], cols[ada], gap, train_error,
                                                                              n_boot=n_boot, seed=seed)
        result.update(tau=table, signed_contrast=contrast, partial_contrast=partial)
    write_json_atomic(out / RESCORE, result)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m geosharp_ref.studies.population.rescore", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="population directory with its model directories")
    p.add_argument("--reference", help="manifest the models must match (e.g. docs/minilm/recipes/population.json)")
    p.add_argument("--results", help="directory with evaluation.json and results.jsonl of the same models")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    res = rescore_population(a.out, a.reference, a.results, progress=not a.no_progress)
    rel = res["reliability"]
    print(f"{res['models']} models, extended test set {res['n_test_extended']} (was {res['n_test_original']}): "
          f"split-half τ {rel['tau_half']['median']:+.2f}, reliability {rel['pearson_full_spearman_brown']:.2f}; "
          f"written {Path(a.out) / RESCORE}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
