"""Re-analysis of a population from its committed files: signed contrast, attenuation, train error, power.

``geosharp population correlate`` reports |τ_geodesic| − |τ_adaptive|. That statistic is not smooth at τ = 0,
so its bootstrap is biased where either τ is near 0 (e.g. minilm-recipes at 2e-5: point −0.087, bootstrap
mean −0.024). The primary contrast of the paper's question is therefore the **signed** paired difference
τ(s_geo, g) − τ(s_ada, g) (:func:`signed_tau_difference`): both τ on the same bootstrap resample of the
models, percentile interval. The paper's direction (geodesic tracks the gap better) is a positive value.

A measured gap is the true gap plus test-set sampling noise, so τ against it is attenuated by the gap's
reliability R (the split-half Spearman–Brown reliability of :mod:`.reliability`, ``pearson_full_spearman_brown``
in ``reliability.json``). :func:`attenuated_tau` carries a τ measured against an error-free gap (e.g. the
paper's) to what it becomes against a gap of reliability R, through Greiner's relation r = sin(πτ/2) (normal
data) and Spearman's attenuation r_obs = r √R:

    τ_att = (2/π) · arcsin( √R · sin(π τ / 2) ).

:func:`partial_tau` is Kendall's partial τ of a measure and the gap given a covariate (train error):
τ_xy·z = (τ_xy − τ_xz τ_yz) / √((1 − τ_xz²)(1 − τ_yz²)).

:func:`kendall_power` and :func:`contrast_power` are power statements by Monte-Carlo simulation from a
normal model (Pearson r = sin(πτ/2) between every two variables): the power of the two-sided Kendall test
of one τ at level α (normal approximation of τ under H0, variance 2(2n+5)/(9n(n−1))), the smallest |τ|
with 80 % power, and the power of the signed contrast (its Monte-Carlo standard deviation standing for the
bootstrap's) to exclude 0 when the true τ are ``tau_geo`` and ``tau_ada``.

:func:`reanalyse` reads a committed population directory (``correlation.csv`` per model,
``correlation_tau.csv``, ``correlation.json`` and ``reliability.json``, plus ``models.jsonl`` for the number
of optimiser steps) and writes ``reanalysis.json`` and its plot ``reanalysis.png``
(:func:`geosharp_ref.plots.plot_signed_contrast`); nothing is retrained or re-evaluated::

    python -m geosharp_ref.studies.population.reanalysis docs/minilm/seeds docs/minilm/recipes
"""
from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau, norm

from ...io.durable import write_json_atomic
from ...plots import plot_signed_contrast, row_value
from ...stats import kendall_tau_b, kendall_with_ci

__all__ = ["signed_tau_difference", "attenuated_tau", "partial_tau", "partial_tau_with_ci", "partial_tau_difference",
           "kendall_null_sd", "kendall_power", "min_detectable_tau", "contrast_power", "bootstrap_contrast_power",
           "reanalyse", "tau_row",
           "read_csv_rows",
           "PAPER_MNLI_TAU", "REANALYSIS", "REANALYSIS_PLOT"]

REANALYSIS = "reanalysis.json"
#: the signed contrasts with their intervals, the partial-τ contrasts and the paper's attenuated differences
REANALYSIS_PLOT = "reanalysis.png"

#: the paper's Kendall τ on its BERT-MNLI fine-tunes (McCoy et al. seeds population): adaptive / geodesic-inv /
#: geodesic-mix, measured against its own (unreported-reliability) gap, treated here as error-free
PAPER_MNLI_TAU = {"adaptive": 0.06, "geodesic-inv": 0.28, "geodesic-mix": 0.38}


def _paired_rows(n: int, n_boot: int, seed: int):
    """The bootstrap resamples of the models, as in :func:`geosharp_ref.stats.paired_abs_tau_difference`."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def _finite_models(*columns):
    """The columns (one value per model) as float arrays, without the models where any of them is not finite."""
    columns = [np.asarray(c, dtype=float) for c in columns]
    ok = np.logical_and.reduce([np.isfinite(c) for c in columns])
    return [c[ok] for c in columns]


def signed_tau_difference(x1, x2, y, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """τ(x1, y) − τ(x2, y) with a paired percentile bootstrap over the models (both τ on the same resample;
    the resamples of :func:`~geosharp_ref.stats.paired_abs_tau_difference` for the same ``seed``).

    Returns ``difference``, ``ci``, the bootstrap ``mean`` and ``sd``, ``p_positive`` (fraction of resamples
    above 0) and ``n``. Models with a non-finite value are dropped."""
    x1, x2, y = _finite_models(x1, x2, y)
    if len(y) < 3:
        nan = float("nan")
        return dict(difference=nan, ci=[nan, nan], mean=nan, sd=nan, p_positive=nan, n=int(len(y)))
    diff = kendalltau(x1, y).statistic - kendalltau(x2, y).statistic
    idx = _paired_rows(len(y), n_boot, seed)
    d = kendall_tau_b(x1[idx], y[idx]) - kendall_tau_b(x2[idx], y[idx])
    d = d[np.isfinite(d)]
    if not len(d):  # no resample defines both τ (e.g. a constant measure or gap): the contrast is undefined
        nan = float("nan")
        return dict(difference=float(diff), ci=[nan, nan], mean=nan, sd=nan, p_positive=nan, n=int(len(y)))
    a = (1 - level) / 2
    lo, hi = np.quantile(d, [a, 1 - a])
    return dict(difference=float(diff), ci=[float(lo), float(hi)], mean=float(d.mean()), sd=float(d.std(ddof=1)),
                p_positive=float((d > 0).mean()), n=int(len(y)))


def attenuated_tau(tau: float, reliability: float) -> float:
    """τ against an error-free gap carried to a gap of reliability ``reliability`` (see the module doc):
    (2/π) arcsin(√R sin(πτ/2)). R ≤ 0 gives 0; an undefined R (NaN) gives NaN, not the unattenuated τ."""
    if not math.isfinite(reliability):
        return float("nan")
    if reliability <= 0:
        return 0.0
    return 2 / math.pi * math.asin(math.sqrt(min(1.0, reliability)) * math.sin(math.pi * tau / 2))


def partial_tau(x, y, z) -> float:
    """Kendall's partial τ of ``x`` and ``y`` given ``z`` (τ-b throughout)."""
    txy, txz, tyz = (float(kendalltau(a, b).statistic) for a, b in ((x, y), (x, z), (y, z)))
    den = math.sqrt(max(0.0, (1 - txz ** 2) * (1 - tyz ** 2)))
    return (txy - txz * tyz) / den if den > 0 else float("nan")


def partial_tau_with_ci(x, y, z, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """:func:`partial_tau` with a percentile bootstrap interval over the models (the same resamples as
    :func:`signed_tau_difference` for the same ``seed``). Models with a non-finite value are dropped."""
    x, y, z = _finite_models(x, y, z)
    idx = _paired_rows(len(y), n_boot, seed)
    xy, xz, yz = (kendall_tau_b(a[idx], b[idx]) for a, b in ((x, y), (x, z), (y, z)))
    with np.errstate(invalid="ignore", divide="ignore"):
        p = (xy - xz * yz) / np.sqrt((1 - xz ** 2) * (1 - yz ** 2))
    p = p[np.isfinite(p)]
    a = (1 - level) / 2
    lo, hi = np.quantile(p, [a, 1 - a]) if len(p) else (float("nan"), float("nan"))
    return dict(tau=partial_tau(x, y, z), ci=[float(lo), float(hi)], n=int(len(y)))


def partial_tau_difference(x1, x2, y, z, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """τ(x1, y | z) − τ(x2, y | z) (:func:`partial_tau`) with a paired percentile bootstrap over the models
    (the resamples of :func:`signed_tau_difference` for the same ``seed``): the signed contrast with the
    covariate ``z`` (train error) partialled out of both measures and the gap. Models with a non-finite value are
    dropped."""
    x1, x2, y, z = _finite_models(x1, x2, y, z)
    idx = _paired_rows(len(y), n_boot, seed)
    yz = kendall_tau_b(y[idx], z[idx])

    def boot(x):
        xy, xz = kendall_tau_b(x[idx], y[idx]), kendall_tau_b(x[idx], z[idx])
        with np.errstate(invalid="ignore", divide="ignore"):
            return (xy - xz * yz) / np.sqrt((1 - xz ** 2) * (1 - yz ** 2))

    d = boot(x1) - boot(x2)
    d = d[np.isfinite(d)]
    a = (1 - level) / 2
    lo, hi = np.quantile(d, [a, 1 - a]) if len(d) else (float("nan"), float("nan"))
    return dict(difference=partial_tau(x1, y, z) - partial_tau(x2, y, z), ci=[float(lo), float(hi)],
                n=int(len(y)))


def kendall_null_sd(n: int) -> float:
    """Standard deviation of Kendall's τ between independent samples of ``n`` (no ties)."""
    return math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1)))


def _normal_from_tau(taus: np.ndarray) -> np.ndarray:
    """The Pearson correlation matrix with r = sin(πτ/2) for every pair (Greiner's relation)."""
    return np.sin(np.pi * np.asarray(taus, dtype=float) / 2)


def _simulate(corr: np.ndarray, n: int, sims: int, seed: int) -> np.ndarray:
    """``sims`` samples of ``n`` rows from N(0, corr): (sims, n, k)."""
    chol = np.linalg.cholesky(corr)
    z = np.random.default_rng(seed).standard_normal((sims, n, corr.shape[0]))
    return z @ chol.T


def kendall_power(tau: float, n: int, alpha: float = 0.05, sims: int = 2000, seed: int = 0) -> float:
    """Power of the two-sided Kendall test (level ``alpha``, normal approximation under H0) to find τ ≠ 0
    with ``n`` models when the population τ is ``tau`` (Monte-Carlo, bivariate normal); NaN for an undefined τ
    (e.g. attenuated by an undefined reliability)."""
    if not math.isfinite(tau):
        return float("nan")
    corr = np.array([[1.0, _normal_from_tau(tau)], [_normal_from_tau(tau), 1.0]])
    xy = _simulate(corr, n, sims, seed)
    t = kendall_tau_b(xy[:, :, 0], xy[:, :, 1])
    return float((np.abs(t) > norm.ppf(1 - alpha / 2) * kendall_null_sd(n)).mean())


def min_detectable_tau(n: int, power: float = 0.8, alpha: float = 0.05, sims: int = 2000, seed: int = 0,
                       step: float = 0.01) -> float:
    """The smallest |τ| on a grid of ``step`` at which :func:`kendall_power` reaches ``power``."""
    for k in range(1, int(round(1 / step))):
        tau = k * step
        if kendall_power(tau, n, alpha, sims, seed) >= power:
            return round(tau, 10)
    return float("nan")


def contrast_power(tau_geo: float, tau_ada: float, tau_between: float, n: int, alpha: float = 0.05,
                   sims: int = 2000, seed: int = 0) -> dict:
    """Power of the signed contrast τ_geo − τ_ada to exclude 0 in the positive direction (two-sided level
    ``alpha``) with ``n`` models when the population values are ``tau_geo``, ``tau_ada`` against the gap and
    ``tau_between`` between the two measures (Monte-Carlo from a trivariate normal; the interval is the
    difference ± z · its Monte-Carlo standard deviation, standing for the bootstrap interval)."""
    s = _simulate(_contrast_corr(tau_geo, tau_ada, tau_between), n, sims, seed)
    d = kendall_tau_b(s[:, :, 0], s[:, :, 2]) - kendall_tau_b(s[:, :, 1], s[:, :, 2])
    sd = float(d.std(ddof=1))
    z = norm.ppf(1 - alpha / 2)
    return dict(difference=tau_geo - tau_ada, sd=sd, power=float((d - z * sd > 0).mean()), n=n, sims=sims)


def bootstrap_contrast_power(tau_geo: float, tau_ada: float, tau_between: float, n: int, alpha: float = 0.05,
                             sims: int = 1000, n_boot: int = 500, seed: int = 0, progress: bool = False) -> dict:
    """The power of :func:`contrast_power`'s question as the analysis answers it: each of ``sims`` simulated
    populations (the same trivariate normal, columns geo, ada, gap) is judged by the primary test itself, the paired
    bootstrap of :func:`signed_tau_difference` (``n_boot`` resamples, seed ``seed + 1 + i`` for population i) with
    p = 2 · min(P(Δ* ≤ 0), P(Δ* > 0)), a claim where p < ``alpha`` and Δ > 0. The readable path beside
    :func:`contrast_power`'s fast one, which stands the Monte-Carlo sd of Δ across populations in for the bootstrap's
    (≈ 4–5 % narrower at n = 80, so its power is a little higher; amendment 15 of docs/tweets/PROTOCOL.md).

    Returns ``power``, its binomial standard error ``power_se``, the mean bootstrap sd ``bootstrap_sd``, ``n``,
    ``sims`` and ``n_boot``."""
    from tqdm.auto import tqdm

    s = _simulate(_contrast_corr(tau_geo, tau_ada, tau_between), n, sims, seed)
    hits, sds = 0, []
    for i in tqdm(range(sims), desc="contrast power", unit="population", disable=not progress):
        c = signed_tau_difference(s[i, :, 0], s[i, :, 1], s[i, :, 2], n_boot=n_boot, seed=seed + 1 + i)
        hits += bool(2 * min(c["p_positive"], 1 - c["p_positive"]) < alpha and c["difference"] > 0)
        sds.append(c["sd"])
    power = hits / sims
    return dict(difference=tau_geo - tau_ada, power=power, power_se=math.sqrt(power * (1 - power) / sims),
                bootstrap_sd=float(np.mean(sds)), n=n, sims=sims, n_boot=n_boot)


def _contrast_corr(tau_geo: float, tau_ada: float, tau_between: float) -> np.ndarray:
    """The 3 × 3 Pearson correlation of (geo, ada, gap) with r = sin(πτ/2); refused where not positive definite."""
    r = _normal_from_tau
    corr = np.array([[1.0, r(tau_between), r(tau_geo)], [r(tau_between), 1.0, r(tau_ada)],
                     [r(tau_geo), r(tau_ada), 1.0]])
    if np.linalg.eigvalsh(corr).min() <= 0:
        raise ValueError(f"τ_geo={tau_geo}, τ_ada={tau_ada}, τ_between={tau_between} are not jointly possible")
    return corr


# ------------------------------------------------------------------------------------------------
# Committed population directories
# ------------------------------------------------------------------------------------------------

def read_csv_rows(path: Path) -> list:
    """The rows of a CSV file with a header, as dicts (the correlation files)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _steps(out: Path) -> dict:
    path = out / "models.jsonl"
    if not path.is_file():  # a live population directory: the manifest holds the same metrics
        man = out / "population.json"
        if not man.is_file():
            return {}
        return {m["name"]: m["metrics"]["steps"] for m in json.loads(man.read_text())["models"] if "metrics" in m}
    return {r["name"]: r["metrics"]["steps"] for r in map(json.loads, filter(str.strip, path.read_text().splitlines()))}


def tau_row(t: dict) -> str:
    """The row of a ``correlation*_tau.csv`` line: its target-size label (``size=2e-05``) where the evaluation had
    a calibrated grid, else (a uniform sweep) its radius, as ``correlation_paired.csv`` names it."""
    return t.get("row") or t["rho"]


def reanalyse(out, n_boot: int = 1000, seed: int = 0, sims: int = 2000, paper: dict | None = None,
              write: bool = True) -> dict:
    """The re-analysis of one committed population directory (see the module doc); writes ``reanalysis.json``.

    Per row (target size) and geodesic measure: the signed contrast against its adaptive counterpart (the
    pairs of ``correlation_paired.csv``), the partial τ of every measure given the train error, and the
    paper's MNLI τ attenuated by the measured reliability with the power of this population's contrast to
    detect the attenuated difference. Also: the train errors and what drives the gap, and the largest change of
    τ against the gap between a measure and its first-order version (``first_order_vs_full``)."""
    out = Path(out)
    paper = dict(PAPER_MNLI_TAU if paper is None else paper)
    models = read_csv_rows(out / "correlation.csv")
    taus = read_csv_rows(out / "correlation_tau.csv")
    pairs = read_csv_rows(out / "correlation_paired.csv")
    corr = json.loads((out / "correlation.json").read_text())
    rel = json.loads((out / "reliability.json").read_text())
    names = [r["model"] for r in models]
    n = len(names)
    gap = np.array([float(r["gap"]) for r in models])
    train = np.array([float(r["train_error"]) for r in models])
    rho = {(tau_row(t), t["measure"]): t["rho"] for t in taus}
    col = {k: np.array([float(r[f"{k[1]}@rho={v}"]) for r in models]) for k, v in rho.items()}
    R = float(rel["pearson_full_spearman_brown"])

    steps = _steps(out)
    train_error = dict(min=float(train.min()), median=float(np.median(train)), max=float(train.max()),
                       above_0_05=int((train > 0.05).sum()), above_0_10=int((train > 0.10).sum()),
                       tau_vs_gap=kendall_with_ci(train, gap, n_boot=n_boot, seed=seed))
    if steps and all(nm in steps for nm in names) and "lr" in models[0] and models[0]["lr"]:
        lr_steps = np.array([float(r["lr"]) * steps[r["model"]] for r in models])
        if len(set(lr_steps)) > 1:
            train_error["lr_times_steps_tau_vs_gap"] = kendall_with_ci(lr_steps, gap, n_boot=n_boot, seed=seed)
            train_error["lr_times_steps_tau_vs_train_error"] = kendall_with_ci(lr_steps, train, n_boot=n_boot,
                                                                               seed=seed)

    paper_att = {m: attenuated_tau(t, R) for m, t in paper.items()}
    rows = sorted({r for r, _ in rho}, key=row_value)
    contrast, partial = {}, {}
    for row in rows:
        partial[row] = {m: partial_tau_with_ci(col[row, m], gap, train, n_boot=n_boot, seed=seed)
                        for (r, m) in col if r == row}
        contrast[row] = {}
        for p in pairs:
            if p["row"] != row:
                continue
            m, vs = p["measure"], p["vs"]
            c = signed_tau_difference(col[row, m], col[row, vs], gap, n_boot=n_boot, seed=seed)
            base = m.replace("-linearised", "")
            if base in paper and vs.replace("-linearised", "") in paper:
                att = paper_att[base] - paper_att[vs.replace("-linearised", "")]
                between = corr["measure_agreement"][row][m]["tau"] if corr.get("measure_agreement", {}).get(
                    row, {}).get(m, {}).get("vs") == vs else None
                c["paper_attenuated_difference"] = att
                c["paper_attenuated_inside_ci"] = bool(c["ci"][0] <= att <= c["ci"][1])
                if between is not None:
                    c["tau_between_measures"] = float(between)
                    try:  # the three τ (each measure's attenuated τ, the τ between them) may not be jointly possible
                        c["power_for_paper_attenuated"] = contrast_power(
                            paper_att[base], paper_att[vs.replace("-linearised", "")], between, n, sims=sims,
                            seed=seed)["power"]
                    except (ValueError, np.linalg.LinAlgError):
                        c["power_for_paper_attenuated"] = None  # no such population: no power to state
            idx = _paired_rows(n, n_boot, seed)  # the |τ| contrast of `correlate` on the same resamples
            c["abs_difference"] = float(abs(kendalltau(col[row, m], gap).statistic)
                                        - abs(kendalltau(col[row, vs], gap).statistic))
            c["abs_difference_bootstrap_mean"] = float(np.nanmean(
                np.abs(kendall_tau_b(col[row, m][idx], gap[idx])) - np.abs(kendall_tau_b(col[row, vs][idx], gap[idx]))))
            c["given_train_error"] = partial_tau_difference(col[row, m], col[row, vs], gap, train, n_boot=n_boot,
                                                            seed=seed)
            contrast[row][f"{m} - {vs}"] = c
    tau = {(tau_row(t), t["measure"]): float(t["tau"]) for t in taus}
    shifts = [(abs(tau[r, m] - tau[r, f"{m}-linearised"]), r, m) for (r, m) in tau
              if not m.endswith("-linearised") and (r, f"{m}-linearised") in tau]
    first_order = None
    if shifts:
        top = max(shifts)
        first_order = dict(max_abs_tau_shift=top[0], row=top[1], measure=top[2])
    result = dict(models=n, bootstrap=n_boot, seed=seed,
                  reliability=dict(pearson_full_spearman_brown=R, tau_half=rel["tau_half"]["median"],
                                   n_test=rel["n_test"]),
                  attenuation="tau_att = (2/pi) * asin(sqrt(R) * sin(pi * tau / 2)), R = pearson_full_spearman_brown",
                  paper_mnli_tau=paper, paper_mnli_tau_attenuated=paper_att,
                  power=dict(min_detectable_tau_80=min_detectable_tau(n, sims=sims, seed=seed),
                             kendall_null_sd=kendall_null_sd(n),
                             paper_attenuated={m: kendall_power(t, n, sims=sims, seed=seed)
                                               for m, t in paper_att.items()}),
                  train_error=train_error, signed_contrast=contrast, partial_tau_given_train_error=partial,
                  first_order_vs_full=first_order)
    if write:
        write_json_atomic(out / REANALYSIS, result)
        plot_signed_contrast(out / REANALYSIS_PLOT, result)
    return result


def _print(out: Path, res: dict, stream) -> None:
    te = res["train_error"]
    print(f"{out}: {res['models']} models; reliability R = {res['reliability']['pearson_full_spearman_brown']:.3f}; "
          f"train error {te['min']:.3f} / {te['median']:.3f} / {te['max']:.3f} (min / median / max), "
          f"{te['above_0_10']} above 0.10; τ(train error, gap) = {te['tau_vs_gap']['tau']:+.2f}", file=stream)
    print("  paper MNLI τ attenuated: " + ", ".join(f"{m} {t:.2f} → {res['paper_mnli_tau_attenuated'][m]:.3f}"
                                                  for m, t in res["paper_mnli_tau"].items()), file=stream)
    print(f"  80 % power needs |τ| ≥ {res['power']['min_detectable_tau_80']:.2f}", file=stream)
    for row, cells in res["signed_contrast"].items():
        for k, c in cells.items():
            power = c.get("power_for_paper_attenuated")  # None where no population has the three τ
            extra = (f"; paper attenuated {c['paper_attenuated_difference']:+.3f}"
                     f"{', power ' + format(power, '.2f') if power is not None else ''}"
                     if "paper_attenuated_difference" in c else "")
            print(f"  {row} τ({k}) = {c['difference']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]{extra}",
                  file=stream)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for d in argv:
        res = reanalyse(d)
        _print(Path(d), res, sys.stdout)
        print(f"written: {Path(d) / REANALYSIS}, {Path(d) / REANALYSIS_PLOT}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
