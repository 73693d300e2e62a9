"""The tweets population's pre-registered analysis (docs/tweets/PROTOCOL.md): the power statement computed
before any result, the pilot judge (training behaviour only) and the primary analysis of a finished population.

::

    python -m geosharp_ref.studies.population.tweets_analysis power docs/tweets/power.json
    python -m geosharp_ref.studies.population.tweets_analysis power-bootstrap docs/tweets/power_bootstrap.json
    python -m geosharp_ref.studies.population.tweets_analysis pilot /work/populations/tweets/pilot
    python -m geosharp_ref.studies.population.tweets_analysis analyse DIR
    python -m geosharp_ref.studies.population.tweets_analysis report DIR

``power`` simulates (normal model, Greiner's r = sin(πτ/2); :mod:`.reanalysis`): the smallest |τ| a two-sided
Kendall test at 5 % finds with 80 % power among ``n`` models, the paper's BERT-MNLI τ attenuated by a gap
reliability R and the power of each single τ test, and for the signed contrast τ_geo − τ_ada the power under
the paper's attenuated difference and the smallest detectable difference, for several values of the τ between
the two measures (it sets how precise the paired contrast is). ``power-bootstrap`` computes the contrast's power
again by running the primary test itself on each simulated population (:func:`bootstrap_power_statement`,
amendment 15 of the protocol).

``pilot`` reads only the train errors of a pilot population (``population.json``) and applies the pilot rule:
every corner must reach train error ≤ :data:`PILOT_MAX_TRAIN_ERROR`. It never prints or returns a test error.

``analyse`` runs :func:`~geosharp_ref.studies.population.reanalysis.reanalyse` on the population directory
(after ``geosharp population reliability`` and ``correlate``) and adds the protocol's checks, the verdict of each
primary contrast (:func:`judge_primary`), the sensitivity analysis without the models above train error 0.05
(:func:`sensitivity_analysis`, pilot rule 5), the ablations' contrasts (H3/H4, :func:`ablation_contrasts`) and
the exploratory curvature measures (:func:`curvature_analysis`); every cell of a τ or a contrast against the gap
(primary, partial, sensitivity, ablations, curvature, train error and hyper-parameters) carries
``gap_reliability_ok`` (the measured R ≥ 0.9, reported beside every result as the protocol asks). It writes
``analysis.json``, the primary contrast's plot ``analysis.png`` (:func:`geosharp_ref.plots.plot_signed_contrast`) and the Markdown report
``analysis.md`` (:mod:`~geosharp_ref.studies.population.tweets_report`; ``report`` writes it again).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from ...io.durable import write_json_atomic
from ...plots import plot_signed_contrast
from ...stats import kendall_with_ci
from .evaluation import read_results
from .reanalysis import (PAPER_MNLI_TAU, attenuated_tau, bootstrap_contrast_power, contrast_power, kendall_null_sd, kendall_power,
                         min_detectable_tau, partial_tau_difference, partial_tau_with_ci, read_csv_rows, reanalyse,
                         signed_tau_difference, tau_row)
from .exclusion import read_excluded
from .manifest import population_files, read_manifest
from .tweets import ABLATION_PROTOCOL, CURVATURE_PROTOCOL, EVALUATION_PROTOCOL, N_MODELS, PILOT_CORNERS
from .tweets_report import write_report

__all__ = ["power_statement", "bootstrap_power_statement", "judge_pilot", "analyse", "holm", "judge_primary", "sensitivity_analysis",
           "ablation_contrasts", "curvature_analysis", "models_left_out", "PILOT_MAX_TRAIN_ERROR", "MIN_RELIABILITY",
           "PRIMARY_FAMILY_SIZE"]

PILOT_MAX_TRAIN_ERROR = 0.05
MIN_RELIABILITY = 0.9
#: the fewest models a sensitivity analysis is computed on (fewer give no Kendall τ worth an interval)
MIN_SENSITIVITY_MODELS = 5
#: simulated populations per power in power.json (``sims`` of :func:`power_statement`, ``fast_sims`` of the bootstrap)
POWER_SIMS = 2000
#: the primary family's contrasts (Holm over these): geodesic-inv and geodesic-mix against adaptive at every size
PRIMARY_FAMILY_SIZE = 2 * len(EVALUATION_PROTOCOL["sizes"])


def _min_detectable_contrast(tau_ada: float, between: float, n: int, sims: int, seed: int, power: float = 0.8):
    for k in range(1, 100):
        tau_geo = tau_ada + 0.01 * k
        try:
            p = contrast_power(tau_geo, tau_ada, between, n, sims=sims, seed=seed)["power"]
        except ValueError:
            return None
        if p >= power:
            return round(tau_geo - tau_ada, 10)
    return None


def _contrast_cells(reliabilities, between, cell) -> dict:
    """``{"R=…": {"paper_attenuated": {measure: τ√R}, "contrast": {"tau_between=…": {metric: cell(τ_geo, τ_ada, b)}}}}``
    over geodesic-inv and geodesic-mix against adaptive; a metric whose τ cannot hold jointly with ``b`` (``cell``
    raises ValueError) is None."""
    out = {}
    for R in reliabilities:
        att = {m: attenuated_tau(t, R) for m, t in PAPER_MNLI_TAU.items()}
        cells = {}
        for b in between:
            c = {}
            for g in ("geodesic-inv", "geodesic-mix"):
                try:
                    c[g] = cell(att[g], att["adaptive"], b)
                except ValueError:
                    c[g] = None  # not jointly possible with this τ between the measures
            cells[f"tau_between={b:g}"] = c
        out[f"R={R:g}"] = dict(paper_attenuated=att, contrast=cells)
    return out


def power_statement(n: int = N_MODELS, reliabilities=(0.9, 0.95), between=(0.2, 0.45, 0.7), sims: int = POWER_SIMS,
                    seed: int = 0) -> dict:
    """The power statement of the protocol (see the module doc); deterministic in ``seed``."""
    out = dict(models=n, sims=sims, seed=seed, alpha=0.05, kendall_null_sd=kendall_null_sd(n),
               min_detectable_tau_80=min_detectable_tau(n, sims=sims, seed=seed), paper_mnli_tau=PAPER_MNLI_TAU,
               by_reliability=_contrast_cells(
                   reliabilities, between,
                   lambda tau_geo, tau_ada, b: contrast_power(tau_geo, tau_ada, b, n, sims=sims, seed=seed)))
    for cell in out["by_reliability"].values():
        att = cell["paper_attenuated"]
        cell["power_single_tau"] = {m: kendall_power(t, n, sims=sims, seed=seed) for m, t in att.items()}
        for b, c in zip(between, cell["contrast"].values()):
            c["min_detectable_difference_80"] = _min_detectable_contrast(att["adaptive"], b, n, sims, seed)
    return out


def bootstrap_power_statement(n: int = N_MODELS, reliabilities=(0.9, 0.95), between=(0.2, 0.45, 0.7),
                              sims: int = 1000, n_boot: int = 500, seed: int = 0, progress: bool = True,
                              fast_sims: int = POWER_SIMS) -> dict:
    """The contrast cells of :func:`power_statement` with the power of the primary test itself
    (:func:`~.reanalysis.bootstrap_contrast_power`: ``sims`` populations of ``n``, ``n_boot`` resamples each), beside
    ``fast_power``, :func:`~.reanalysis.contrast_power`'s value for the same (R, τ_between, metric) and seed from
    ``fast_sims`` populations (the default :data:`POWER_SIMS` is :func:`power_statement`'s, so ``fast_power`` is the
    power that ``power.json`` holds); deterministic in ``seed``."""
    def cell(tau_geo, tau_ada, b):
        c = bootstrap_contrast_power(tau_geo, tau_ada, b, n, sims=sims, n_boot=n_boot, seed=seed, progress=progress)
        c["fast_power"] = contrast_power(tau_geo, tau_ada, b, n, sims=fast_sims, seed=seed)["power"]
        return c

    return dict(models=n, sims=sims, n_boot=n_boot, seed=seed, alpha=0.05,
                by_reliability=_contrast_cells(reliabilities, between, cell))


def judge_pilot(out) -> dict:
    """The pilot rule on training behaviour only: ``{"models": {name: {"corner", "train_error", "pass"}},
    "pass": all corners ≤ 0.05, "complete"}`` from ``population.json`` (train errors only)."""
    out = Path(out)
    man = json.loads((out / "population.json").read_text())
    models = {}
    for i, m in enumerate(man["models"]):
        rec_path = out / m["dir"] / "geosharp_model.json"
        if not rec_path.is_file():
            continue
        train_error = json.loads(rec_path.read_text())["metrics"]["train_error"]
        models[m["name"]] = dict(corner=PILOT_CORNERS[i % len(PILOT_CORNERS)], hparams=m["hparams"],
                                 train_error=train_error, passed=train_error <= PILOT_MAX_TRAIN_ERROR)
    complete = len(models) == len(man["models"])
    return dict(models=models, complete=complete, passed=complete and all(v["passed"] for v in models.values()),
                rule=f"every corner reaches train error <= {PILOT_MAX_TRAIN_ERROR}")


def holm(ps) -> list:
    """Holm–Bonferroni adjusted p-values (same order as ``ps``)."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adj, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adj[i] = running
    return adj


def judge_primary(signed_contrast: dict) -> list:
    """The protocol's rule on the primary family, in place: every contrast of ``signed_contrast`` (``{row:
    {"geodesic-… - adaptive": cell}}``) but the first-order ones gets its two-sided bootstrap p-value
    2 · min(P(Δ* ≤ 0), P(Δ* > 0)) (``p_bootstrap``), its Holm–Bonferroni adjustment over the family (``p_holm``),
    ``geodesic_better`` (p_holm < 0.05 and Δ > 0), ``excludes_paper_attenuated`` (the interval lies wholly below
    the paper's attenuated difference, where the cell has one) and the ``verdict``: "better", "no better" (the
    paper's attenuated difference excluded, Δ not significantly > 0), "better, by less than the paper's attenuated
    difference" (both), or "undecided". A contrast whose bootstrap is undefined (too few or tied models) has
    p-values NaN, counts as p = 1 in the others' adjustment, and is "undecided". ``difference_outside_ci`` marks a
    Δ outside its own percentile interval (a skewed bootstrap: its p-value then comes from the other tail; the
    report names it). Returns the family's cells."""
    family = [c for cells in signed_contrast.values() for k, c in cells.items() if "linearised" not in k]
    ps = [min(1.0, 2 * min(c["p_positive"], 1 - c["p_positive"])) if np.isfinite(c["p_positive"]) else float("nan")
          for c in family]
    adjusted = holm([p if np.isfinite(p) else 1.0 for p in ps])  # an undefined contrast counts as p = 1
    for c, p, adj in zip(family, ps, adjusted):
        adj = adj if np.isfinite(p) else float("nan")
        c["p_bootstrap"], c["p_holm"] = p, adj
        c["geodesic_better"] = better = bool(adj < 0.05 and c["difference"] > 0)
        att = c.get("paper_attenuated_difference")
        c["excludes_paper_attenuated"] = below = bool(att is not None and c["ci"][1] < att)
        c["difference_outside_ci"] = bool(np.isfinite(p) and not c["ci"][0] <= c["difference"] <= c["ci"][1])
        c["verdict"] = ("better, by less than the paper's attenuated difference" if better and below else
                        "better" if better else "no better" if below else "undecided")
    return family


def sensitivity_analysis(out, paper_attenuated: dict, n_boot: int = 1000, seed: int = 0) -> dict:
    """Pilot rule 5 of the protocol: a population model above train error :data:`PILOT_MAX_TRAIN_ERROR` is kept,
    and the primary analysis is repeated without it. ``{"max_train_error", "excluded": [model names], "models"}``
    and, where a model is excluded, each measure's τ against the gap with its interval (``tau``) and the primary
    family (geodesic − adaptive, first-order measures left out) judged by :func:`judge_primary` on the remaining
    models (``signed_contrast``; the paper's attenuated differences from ``paper_attenuated``). Reads
    ``correlation.csv``, ``correlation_tau.csv`` and ``correlation_paired.csv``."""
    out = Path(out)
    models = read_csv_rows(out / "correlation.csv")
    keep = np.array([float(r["train_error"]) <= PILOT_MAX_TRAIN_ERROR for r in models])
    res = dict(max_train_error=PILOT_MAX_TRAIN_ERROR, excluded=[r["model"] for r, k in zip(models, keep) if not k],
               models=int(keep.sum()))
    if not res["excluded"]:
        return res
    if res["models"] < MIN_SENSITIVITY_MODELS:
        res["note"] = f"{res['models']} models remain: too few to repeat the analysis"
        return res
    kept = [r for r, k in zip(models, keep) if k]
    gap = np.array([float(r["gap"]) for r in kept])
    rho = {(tau_row(t), t["measure"]): t["rho"] for t in read_csv_rows(out / "correlation_tau.csv")}
    col = {k: np.array([float(r[f"{k[1]}@rho={v}"]) for r in kept]) for k, v in rho.items()}
    res["tau"], res["signed_contrast"] = {}, {}
    for (row, m), x in col.items():
        res["tau"].setdefault(row, {})[m] = kendall_with_ci(x, gap, n_boot=n_boot, seed=seed)
    for p in read_csv_rows(out / "correlation_paired.csv"):
        row, m, vs = p["row"], p["measure"], p["vs"]
        if "linearised" in m or (row, m) not in col or (row, vs) not in col:
            continue
        c = signed_tau_difference(col[row, m], col[row, vs], gap, n_boot=n_boot, seed=seed)
        if m in paper_attenuated and vs in paper_attenuated:
            c["paper_attenuated_difference"] = paper_attenuated[m] - paper_attenuated[vs]
        res["signed_contrast"].setdefault(row, {})[f"{m} - {vs}"] = c
    judge_primary(res["signed_contrast"])
    return res


def ablation_contrasts(out, n_boot: int = 1000, seed: int = 0) -> dict:
    """H3/H4 of the protocol: for every ablation (``geodesic-*-first-order``, ``geodesic-*-frobenius``) at every
    size of the tagged evaluation, paired with its full measure at the **same target size** (size-matched: the
    radii differ): the signed contrast τ(full, gap) − τ(ablation, gap), τ between the two measures, the median
    of |full − ablation| / full, the ablation's partial τ given the train error and the contrast of partial τ
    (the covariate of every measure), and the population's median ‖Δθ‖/‖θ‖ of the ablation and of its full measure
    (``relative_size``, ``relative_size_full``; None where not recorded), so the size matching can be read. Reads
    ``correlation.csv`` / ``correlation_tau.csv`` and their ``-ablations`` versions; ``{}`` where the ablations are
    not correlated yet."""
    out = Path(out)
    if not (out / "correlation-ablations_tau.csv").is_file():
        return {}
    main, main_tau = read_csv_rows(out / "correlation.csv"), read_csv_rows(out / "correlation_tau.csv")
    abl = read_csv_rows(out / "correlation-ablations.csv")
    abl_tau = read_csv_rows(out / "correlation-ablations_tau.csv")
    by_model = {r["model"]: r for r in abl}
    names = [r["model"] for r in main if r["model"] in by_model]
    gap, train = (np.array([float(r[k]) for r in main if r["model"] in by_model]) for k in ("gap", "train_error"))
    rho_main = {(tau_row(t), t["measure"]): t["rho"] for t in main_tau}
    size_main = {(tau_row(t), t["measure"]): t.get("median_relative_size") for t in main_tau}
    main_rows = {r["model"]: r for r in main}
    res = {}
    for t in abl_tau:
        row, m = tau_row(t), t["measure"]
        full = m.replace("-first-order", "").replace("-frobenius", "")
        if full == m or (row, full) not in rho_main:
            continue
        x_full = np.array([float(main_rows[n][f"{full}@rho={rho_main[row, full]}"]) for n in names])
        x_abl = np.array([float(by_model[n][f"{m}@rho={t['rho']}"]) for n in names])
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.abs(x_full - x_abl) / np.abs(x_full)
        res.setdefault(row, {})[m] = dict(
            vs=full, relative_size=_float_or_none(t.get("median_relative_size")),
            relative_size_full=_float_or_none(size_main.get((row, full))),
            contrast_full_minus_ablation=signed_tau_difference(x_full, x_abl, gap, n_boot=n_boot, seed=seed),
            tau_between=float(kendalltau(x_full, x_abl).statistic),
            median_relative_difference=float(np.nanmedian(rel)), rho=t["rho"], rho_full=rho_main[row, full],
            partial_tau_given_train_error=partial_tau_with_ci(x_abl, gap, train, n_boot=n_boot, seed=seed),
            contrast_given_train_error=partial_tau_difference(x_full, x_abl, gap, train, n_boot=n_boot, seed=seed))
    return res


def _float_or_none(v):
    return float(v) if v not in (None, "") else None


def curvature_analysis(out, n_boot: int = 1000, seed: int = 0) -> dict:
    """Exploratory (amendment 5; outside the primary family and its Holm correction): for every curvature
    measure of the tagged evaluation ``curvature`` its τ with the gap (bootstrap interval), its partial τ given the
    train error, and its measurement error: for a trace the reliability 1 − mean(SE²) / var over the models (SE
    the Hutchinson standard error of the model's value, √(Σ_b SE_b²) / B), for a top eigenvalue the largest
    Lanczos residual bound relative to the value. For each quotient measure, the signed contrast
    τ(quotient, gap) − τ(Euclidean, gap) of the same quantity. Reads ``correlation-curvature.csv`` and
    ``results-curvature.jsonl``; ``{}`` where the curvature is not correlated yet."""
    out = Path(out)
    if not (out / "correlation-curvature.csv").is_file():
        return {}
    rows = read_csv_rows(out / "correlation-curvature.csv")
    records = read_results(out, CURVATURE_PROTOCOL["tag"])
    names = [r["model"] for r in rows]
    gap, train = (np.array([float(r[k]) for r in rows]) for k in ("gap", "train_error"))
    cols = {k.split("@rho=")[0]: (k, k.split("@rho=")[1]) for k in rows[0] if "@rho=" in k}
    values = {m: np.array([float(r[k]) for r in rows]) for m, (k, _) in cols.items()}
    res = {}
    for m, (_, rho) in cols.items():
        x, errors = values[m], [records[n]["errors"][m][rho] for n in names]
        cell = dict(tau=kendall_with_ci(x, gap, n_boot=n_boot, seed=seed),
                    partial_tau_given_train_error=partial_tau_with_ci(x, gap, train, n_boot=n_boot, seed=seed))
        if "trace" in m:
            se = np.array([np.sqrt(np.sum(np.square(e))) / len(e) for e in errors])
            cell["hutchinson_reliability"] = float(1 - np.mean(se ** 2) / np.var(x, ddof=1))
        else:
            cell["max_relative_residual_bound"] = float(max(max(e) / abs(v) for e, v in zip(errors, x)))
        euclidean = m.rsplit("-", 1)[0] + "-euclidean"
        if not m.endswith("-euclidean") and euclidean in values:
            cell["contrast_vs_euclidean"] = signed_tau_difference(x, values[euclidean], gap, n_boot=n_boot, seed=seed)
        res[m] = cell
    return res


def analyse(out, n_boot: int = 1000, seed: int = 0) -> dict:
    """The analysis of a finished population directory (see the protocol and the module doc): :func:`reanalyse`,
    the primary family judged (:func:`judge_primary`), the sensitivity analysis, the ablations, the curvature
    measures, the protocol's checks (the number of models, the measured gap reliability and the models it was
    measured on, the primary family's size), the models each evaluation left out (:func:`models_left_out`) and the
    reasons of those excluded (``exclusion_reasons``, :mod:`.exclusion`), and the descriptive analyses of
    ``correlation.json`` (``descriptive``)."""
    res = reanalyse(out, n_boot=n_boot, seed=seed, write=False)
    judge_primary(res["signed_contrast"])  # the primary family: inv and mix against adaptive at every size
    res["sensitivity_without_train_error_above_0_05"] = sensitivity_analysis(
        out, res["paper_mnli_tau_attenuated"], n_boot=n_boot, seed=seed)
    res["ablations"] = ablation_contrasts(out, n_boot=n_boot, seed=seed)
    res["curvature_exploratory"] = curvature_analysis(out, n_boot=n_boot, seed=seed)
    ok = bool(res["reliability"]["pearson_full_spearman_brown"] >= MIN_RELIABILITY)
    family = [k for cells in res["signed_contrast"].values() for k in cells if "linearised" not in k]
    rel_models = json.loads((Path(out) / "reliability.json").read_text()).get("models")
    res["protocol_checks"] = dict(models_at_least=N_MODELS, models_ok=res["models"] >= N_MODELS,
                                  reliability_at_least=MIN_RELIABILITY, reliability_ok=ok,
                                  primary_family_size=len(family), primary_family_expected=PRIMARY_FAMILY_SIZE,
                                  primary_family_ok=len(family) == PRIMARY_FAMILY_SIZE,
                                  reliability_models=rel_models, reliability_covers_models=rel_models == res["models"])
    res["models_left_out"], res["exclusion_reasons"] = models_left_out(out), read_excluded(out)
    res["descriptive"] = _descriptive(out)
    sens = res["sensitivity_without_train_error_above_0_05"]
    for part in (res["signed_contrast"], res["partial_tau_given_train_error"], sens.get("signed_contrast", {}),
                 sens.get("tau", {}), res["ablations"]):
        for cells in part.values():
            for c in cells.values():
                c["gap_reliability_ok"] = ok
    for c in res["curvature_exploratory"].values():
        c["gap_reliability_ok"] = ok
    for key in ("tau_vs_gap", "lr_times_steps_tau_vs_gap"):  # the descriptive τ against the gap too
        if key in res["train_error"]:
            res["train_error"][key]["gap_reliability_ok"] = ok
    for cells in res["descriptive"]["hyperparameter_tau"].values():
        if "gap" in cells:
            cells["gap"]["gap_reliability_ok"] = ok
    write_json_atomic(Path(out) / "analysis.json", res)
    write_report(out)  # before the plot: the report holds every number, the plot draws some of them
    plot_signed_contrast(Path(out) / "analysis.png", res)
    return res


def models_left_out(out) -> dict:
    """The population's models (``population.json``) absent from each correlated evaluation (``correlation.csv``
    and its ``-ablations`` / ``-curvature`` versions, where written): ``{"main" | tag: [model names]}``. A model
    leaves an evaluation where the study excluded it (``excluded.json``, e.g. a value not finite: amendment 8) or
    it has no record; the report names it with the reason."""
    out = Path(out)
    names = [m["name"] for m in read_manifest(out)["models"]]
    left = {}
    for tag in ("", ABLATION_PROTOCOL["tag"], CURVATURE_PROTOCOL["tag"]):
        path = out / f"{population_files(tag)['correlation']}.csv"
        if path.is_file():
            present = {r["model"] for r in read_csv_rows(path)}
            left[tag or "main"] = [n for n in names if n not in present]
    return left


def _descriptive(out) -> dict:
    """The protocol's descriptive analyses as ``correlate`` wrote them in ``correlation.json``: the first-order
    against Auto-PGD (and geodesic against adaptive) agreement per size (``measure_agreement``: τ between the two
    measures with its interval and the median ratio) and each hyper-parameter's τ against the gap and each measure
    (``hyperparameter_tau``)."""
    corr = json.loads((Path(out) / "correlation.json").read_text())
    return {k: corr.get(k, {}) for k in ("measure_agreement", "hyperparameter_tau")}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("power", "power-bootstrap", "pilot", "analyse", "report"):
        print(__doc__, file=sys.stderr)
        return 2
    action, path = argv
    if action == "report":  # analysis.md again from analysis.json (analyse writes it too)
        print(write_report(path).read_text(), end="")
        return 0
    if action == "power":
        res = power_statement()
        write_json_atomic(Path(path), res)
    elif action == "power-bootstrap":
        res = bootstrap_power_statement()
        write_json_atomic(Path(path), res)
    elif action == "pilot":
        res = judge_pilot(path)
    else:
        res = analyse(path)
    print(json.dumps(res, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
