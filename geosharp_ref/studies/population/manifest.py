"""The on-disk layout of a population directory, and its manifest.

Layout of ``DIR``::

    population.json            manifest: data split, architecture, per model hparams (+ metrics when trained)
    models/model_000/          save_pretrained output + geosharp_model.json (hparams, metrics, split seed)
    evaluation.json            evaluation settings (a resumed evaluate must use the same ones)
    results.jsonl              one line per model, append-only, fsync'd; canonical order once complete
    results.parts/rank*.jsonl  per-rank files of a distributed (torchrun) evaluation, merged at the end
    correlation.json / .csv, correlation_tau.csv, correlation.png
    results-TAG.jsonl, evaluation-TAG.json, correlation-TAG.*   another evaluation (``--tag TAG``), e.g. ablations
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["MANIFEST", "MANIFEST_FORMAT", "population_files", "read_manifest"]

MANIFEST = "population.json"
MANIFEST_FORMAT = "geosharp-population/1"


def population_files(tag: str = "") -> dict:
    """File names of one evaluation of a population (``tag`` separates several evaluations)."""
    sfx = f"-{tag}" if tag else ""
    return dict(results=f"results{sfx}.jsonl", parts=f"results{sfx}.parts", config=f"evaluation{sfx}.json",
                correlation=f"correlation{sfx}")


def read_manifest(out) -> dict:
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; run `geosharp population train --out {out}` first")
    try:
        man = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a valid population manifest (corrupt JSON: {exc}); restore it, or delete "
                         f"{out} and train again") from None
    if not isinstance(man, dict) or not isinstance(man.get("models"), list) or "plan" not in man:
        raise ValueError(f"{path} is not a valid population manifest (expected 'plan' and a 'models' list); "
                         f"restore it, or delete {out} and train again")
    if not man["models"]:
        raise ValueError(f"the population in {out} has no models; train one with `geosharp population train "
                         f"--out {out} --models N` (N ≥ 3 for a correlation)")
    if not man.get("complete"):
        raise ValueError(f"population in {out} is not completely trained; rerun `geosharp population train "
                         f"--out {out}` (it resumes)")
    return man
