"""How much of a population's gap ranking is the models, and how much the test set? Split-half reliability.

The gap of model i is g_i = e_test,i − e_train,i. The train error is exact (the model's own training set),
but e_test is measured on a finite test set of n documents, so g_i carries sampling noise of standard error
about √(e(1 − e)/n). When the models' true gaps differ by less than that (fine-tunes that differ only in
their seed), the ranking of the measured gaps is largely the ranking of which documents happen to be in
the test set, and no sharpness measure can reach a large Kendall τ against it.

Split-half reliability measures this directly from the models' test predictions:

1. every model predicts the test set once (``test_predictions.jsonl``, one resumable line per model; the
   error they give must equal the recorded ``test_error``, else the files do not belong together), in batches
   of documents of similar length cut to their longest (:func:`~.training.logits_by_length`);
2. for each of ``splits`` random halvings of the test documents into A and B (the same halving for every
   model), g^A_i and g^B_i are the gaps measured on each half, and τ_half = τ(g^A, g^B) over the models;
3. the report gives τ_half (median and 2.5–97.5 % range over the halvings), the Spearman–Brown projection
   to the whole test set of Greiner's r = sin(π τ / 2), r_full = 2 r / (1 + r) (a Pearson reliability, so an
   approximate statement), and the attenuation ceiling √r_full on the correlation any measure can have
   with the measured gap, in Kendall's units (2/π) arcsin √r_full; beside them the spread of the gaps (standard deviation over the models) and the
   median binomial standard error of one model's test error.

Results go to ``reliability.json``. Imported populations (a data file without a test set) have no test
predictions to split.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau

from ...io.durable import append_line, read_jsonl, write_json_atomic
from .evaluation import load_population_model
from .manifest import read_manifest
from .pack import STAMP, check_packed_models, weights_digest
from .options import check_count, check_seed
from .tasks import get_task
from .training import logits_by_length

__all__ = ["predict_test_set", "predict_model", "test_split", "split_half_gaps", "split_half_reliability",
           "gap_reliability", "prediction_record", "predictions_of_these_weights", "read_prediction_records",
           "PREDICTIONS", "RELIABILITY"]

PREDICTIONS = "test_predictions.jsonl"
RELIABILITY = "reliability.json"


def test_split(out: Path, manifest: dict):
    spec = manifest["plan"]["data"]
    if spec.get("dataset") == "file":
        raise ValueError(f"{out} is an imported population: its data file has no test set to split; the "
                         f"reliability needs a population trained by geosharp (population train)")
    return get_task(manifest["plan"]["task"]).load_split(spec, out)


def predict_test_set(out, batch_size: int = 256, threads: int | None = 1, progress: bool = True) -> dict:
    """``{model name: [predicted class per test example]}`` of every model (resumable: one fsync'd line per
    model in ``test_predictions.jsonl``, with the SHA-256 of the weights that predicted, ``weights_sha256``, as the
    population pipeline writes it; a line of other weights is predicted again: :func:`predictions_of_these_weights`).
    Each model's recomputed test error must match its recorded one (to one example: an argmax tie may flip with the
    batch size)."""
    out = Path(out)
    manifest = read_manifest(out)
    return _predictions(out, manifest, test_split(out, manifest), batch_size, threads, progress)


def _predictions(out: Path, manifest: dict, split, batch_size: int, threads, progress: bool) -> dict:
    check_packed_models(out, manifest)  # a packed model's damaged SHA256SUMS is refused before anything is written
    y = split.y_test
    path = out / PREDICTIONS
    done = predictions_of_these_weights(read_prediction_records(path, len(y)),
                                        {m["name"]: weights_digest(out, m) for m in manifest["models"]})
    todo = [m for m in manifest["models"] if m["name"] not in done]
    if todo and threads:
        torch.set_num_threads(threads)
    from tqdm.auto import tqdm

    for m in tqdm(todo, desc="test predictions", unit="model", disable=not progress or not todo):
        pred = predict_model(out, m, split, m["metrics"]["test_error"], batch_size, progress)
        append_line(path, prediction_record(m["name"], pred, weights_digest(out, m)))
        done[m["name"]] = pred
    return {m["name"]: done[m["name"]] for m in manifest["models"]}


def predict_model(out, entry: dict, split, test_error: float, batch_size: int = 256, progress: bool = True) -> list:
    """The predicted class of every test example by the model of manifest ``entry``
    (:func:`~.evaluation.load_population_model`; :func:`~.training.logits_by_length` in batches of ``batch_size``),
    checked against its recorded ``test_error`` (to one example: an argmax tie may flip with the batch size)."""
    model = load_population_model(out, entry, progress).eval()
    y = split.y_test
    pred = logits_by_length(model, split.test, len(y), batch_size).argmax(-1)
    error = float((pred != y).float().mean())
    if abs(error - test_error) * len(y) > 1.5:
        raise ValueError(f"{entry['name']}: its test predictions give test error {error:.4f}, the manifest records "
                         f"{test_error:.4f}; the model directory and the manifest of {out} do not belong together")
    return pred.tolist()


def prediction_record(name: str, predictions: list, digest: str) -> dict:
    """One line of ``test_predictions.jsonl``: model ``name``'s predicted class per test example and ``digest``, the
    SHA-256 of the weights that predicted them (``weights_sha256``; :func:`~.pack.weights_digest`)."""
    return {"model": name, "predictions": predictions, STAMP: digest}


def predictions_of_these_weights(records: list, digests: dict) -> dict:
    """``{model name: predictions}`` from the prediction lines ``records`` of the models in ``digests`` (name → the
    SHA-256 of its weights now): a line stamped with other weights (the model retrained since) is left out, so the
    model is predicted again; an unstamped line (written before the stamp) counts; the last line of a model wins."""
    return {r["model"]: r["predictions"] for r in records
            if r["model"] in digests and r.get(STAMP, digests[r["model"]]) == digests[r["model"]]}


def read_prediction_records(path: Path, n_test: int, repair: bool = True) -> list:
    """The complete lines of ``test_predictions.jsonl`` (a torn last line repaired on disk where ``repair``, else
    only skipped), each checked to be a model's predictions: ``{"model": name, "predictions": [class index per test
    example]}`` (and, where written since the pipeline, ``"weights_sha256"``: the weights' digest)."""
    records = read_jsonl(path, repair=repair)
    for i, r in enumerate(records, start=1):
        preds = r.get("predictions") if isinstance(r, dict) else None
        if not (isinstance(r, dict) and isinstance(r.get("model"), str) and isinstance(preds, list)
                and len(preds) == n_test and all(isinstance(p, int) for p in preds)):
            raise ValueError(f"{path}: record {i} is not a model's test predictions (a JSON object with 'model' and "
                             f"'predictions', {n_test} class indices); delete that line (the model is predicted "
                             f"again) or the file")
    return records


def split_half_gaps(wrong: np.ndarray, train_error: np.ndarray, half: np.ndarray) -> tuple:
    """``(g^A, g^B)``: the gaps of every model on the test examples in ``half`` (a boolean mask) and on the rest.

    ``wrong``: (models, n_test) booleans, ``train_error``: (models,)."""
    return wrong[:, half].mean(1) - train_error, wrong[:, ~half].mean(1) - train_error


def split_half_reliability(wrong: np.ndarray, train_error: np.ndarray, splits: int, seed: int) -> tuple:
    """``(τ_half, [2.5 %, 97.5 %] quantiles of τ, r_full)``: over ``splits`` random halvings of the test documents
    (seeded), Kendall τ between the two halves' gaps (:func:`split_half_gaps`); its median τ_half, as a Pearson
    r = sin(πτ_half/2), projected to the whole test set by Spearman–Brown, r_full = 2r/(1 + r)."""
    n = wrong.shape[1]
    rng = np.random.default_rng(seed)
    taus = []
    for _ in range(splits):
        half = np.zeros(n, dtype=bool)
        half[rng.permutation(n)[: n // 2]] = True
        ga, gb = split_half_gaps(wrong, train_error, half)
        t = kendalltau(ga, gb).statistic
        taus.append(float(t) if np.isfinite(t) else 0.0)
    tau_half = float(np.median(taus))
    r_half = math.sin(math.pi * tau_half / 2)
    r_full = 2 * r_half / (1 + r_half) if r_half > -1 else float("nan")
    return tau_half, [float(x) for x in np.quantile(taus, [0.025, 0.975])], r_full


def gap_reliability(out, splits: int = 200, seed: int = 0, progress: bool = True, stream=None,
                    threads: int | None = 1) -> dict:
    """Split-half reliability of the population's gaps (see the module doc); writes ``reliability.json``."""
    out = Path(out)
    stream = stream or sys.stdout
    check_count("--splits", splits)
    check_seed("--seed", seed)
    manifest = read_manifest(out)
    names = [m["name"] for m in manifest["models"]]
    if len(names) < 3:  # checked before any prediction is written
        raise ValueError(f"{out} has {len(names)} models; Kendall τ needs at least 3")
    split = test_split(out, manifest)
    preds = _predictions(out, manifest, split, 256, threads, progress)
    y = split.y_test.numpy()
    wrong = np.array([np.asarray(preds[n]) != y for n in names])
    train_error = np.array([m["metrics"]["train_error"] for m in manifest["models"]])
    test_error = wrong.mean(1)
    n = len(y)
    tau_half, tau_range95, r_full = split_half_reliability(wrong, train_error, splits, seed)
    gap = test_error - train_error
    result = dict(models=len(names), n_test=int(n), splits=splits, seed=seed,
                  tau_half=dict(median=tau_half, range95=tau_range95),
                  pearson_full_spearman_brown=r_full,
                  correlation_ceiling=math.sqrt(r_full) if r_full > 0 else 0.0,
                  tau_ceiling=2 / math.pi * math.asin(math.sqrt(r_full)) if r_full > 0 else 0.0,
                  gap_sd=float(gap.std(ddof=1)),
                  test_error_se_median=float(np.median(np.sqrt(test_error * (1 - test_error) / n))))
    write_json_atomic(out / RELIABILITY, result)
    print(f"split-half reliability of the gap over {len(names)} models ({n} test examples, {splits} halvings): "
          f"τ(g^A, g^B) = {tau_half:+.2f} [{result['tau_half']['range95'][0]:+.2f}, "
          f"{result['tau_half']['range95'][1]:+.2f}]; whole test set r ≈ {r_full:+.2f}, ceiling on |r(s, g)| ≈ "
          f"{result['correlation_ceiling']:.2f} (|τ| ≈ {result['tau_ceiling']:.2f}); gap SD {result['gap_sd']:.4f} vs test-error SE "
          f"{result['test_error_se_median']:.4f}", file=stream)
    print(f"written: {out / RELIABILITY}, {out / PREDICTIONS}", file=stream)
    return result
