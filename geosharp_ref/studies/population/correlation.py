"""Correlate a population's sharpness with its generalisation gap: Kendall τ with bootstrap intervals."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from ...io.durable import write_json_atomic, write_text_atomic
from ...plots import plot_population_scatter, plot_tau_vs_rho
from ...sharpness.measures import get_measure
from ...stats import kendall_with_ci, paired_abs_tau_difference
from .evaluation import evaluation_grid, read_evaluation_settings, read_results
from .exclusion import read_excluded
from .manifest import population_files, read_json_object, read_manifest
from .options import check_count, check_seed
from .reliability import RELIABILITY

__all__ = ["correlate_population", "hyperparameter_tau", "measure_agreement", "parse_where", "subset_models"]


def parse_where(items) -> dict:
    """``["label_noise=0", "augment=false"]`` → ``{"label_noise": 0, "augment": False}`` (values read as
    JSON where they parse, e.g. numbers and true/false, else kept as strings)."""
    where = {}
    for item in items or ():
        key, sep, raw = str(item).partition("=")
        if not sep or not key:
            raise ValueError(f"--where {item!r}: expected KEY=VALUE, e.g. label_noise=0")
        try:
            where[key] = json.loads(raw)
        except json.JSONDecodeError:
            where[key] = raw
    return where


def subset_models(names, hparams: dict, where: dict) -> list:
    """The ``names`` whose hyper-parameters (``hparams[name]``) match every ``key: value`` of ``where``."""
    known = sorted({k for n in names for k in hparams[n]})
    unknown = sorted(set(where) - set(known))
    if unknown:
        raise ValueError(f"--where names unknown hyper-parameters {unknown}; this population records "
                         f"{known or 'none (an imported population has no hyper-parameters)'}")
    return [n for n in names if all(hparams[n].get(k) == v for k, v in where.items())]


@contextlib.contextmanager
def _atomic_csv(path: Path):
    """A ``csv.writer`` whose rows replace ``path`` atomically when the block ends (nothing on an error)."""
    buffer = io.StringIO(newline="")
    yield csv.writer(buffer)
    write_text_atomic(path, buffer.getvalue())


def where_suffix(where: dict) -> str:
    return "".join(f"-{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(where.items()))


def _adaptive_counterpart(meas):
    """The adaptive measure a non-ablated geodesic :class:`Measure` is compared with: ``adaptive`` (or
    ``adaptive-linearised`` for a first-order measure); None for an adaptive measure."""
    if meas.metric is None:
        return None
    return "adaptive-linearised" if meas.linearised else "adaptive"


def _full_counterpart(measure: str):
    """The full geodesic measure an ablation (paper App. G) is compared with: ``geodesic-mix-frobenius`` →
    ``geodesic-mix``; None for any other measure."""
    meas = get_measure(measure)
    return meas.base if meas.ablated else None


def _full_columns(out: Path, names, measures, grid, rows) -> dict:
    """``{(row, ablation): values of its full measure}`` from the untagged evaluation, where that evaluation
    holds the full measure at the ablation's radius for every one of ``names`` (else the pair is left out)."""
    files = population_files("")
    if not (out / files["config"]).is_file():
        return {}
    main_cfg = read_evaluation_settings(out, "")
    main_recs = read_results(out, "")
    _, main_grid = evaluation_grid(main_cfg)
    cols = {}
    for m in measures:
        full = _full_counterpart(m)
        if full not in main_grid:
            continue
        for i, row in enumerate(rows):
            rho = grid[m][i]
            if rho in main_grid[full] and all(rho in main_recs.get(n, {}).get("values", {}).get(full, {})
                                               for n in names):
                cols[row, m] = (full, np.array([main_recs[n]["values"][full][rho] for n in names]))
    return cols


def measure_agreement(x, x_ref, n_boot: int = 1000, seed: int = 0) -> dict:
    """How two measures of the same models agree: Kendall τ(x, x_ref) over the models (bootstrap CI) and
    the median ratio x / x_ref. E.g. a first-order measure against its Auto-PGD value: ratio ≈ 1 and τ ≈ 1
    where ρ is small enough that the loss is linear along the perturbation."""
    x, x_ref = np.asarray(x, dtype=float), np.asarray(x_ref, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = x / x_ref
    ratio = ratio[np.isfinite(ratio)]
    return dict(median_ratio=float(np.median(ratio)) if len(ratio) else float("nan"),
                **kendall_with_ci(x, x_ref, n_boot=n_boot, seed=seed))


def hyperparameter_tau(names, hparams: dict, gap, columns: dict) -> dict:
    """Kendall τ (and scipy's p) of each numeric or boolean hyper-parameter that varies over ``names`` against
    the gap and against each measure's values (``columns``: ``{row: {measure: values}}``), to see what drives
    the gap and what drives sharpness (a measure can track a hyper-parameter that leaves the gap alone).
    Returns ``{hyper-parameter: {"gap": {tau, p}, row: {measure: {tau, p}}}}``; seeds are left out."""
    def tau(x, y):
        res = kendalltau(x, y)
        return dict(tau=float(res.statistic), p=float(res.pvalue))

    out = {}
    for key in sorted({k for n in names for k in hparams[n]} - {"seed"}):
        raw = [hparams[n].get(key) for n in names]
        if not all(isinstance(v, (bool, int, float)) for v in raw) or len(set(raw)) < 2:
            continue
        x = np.array(raw, dtype=float)
        out[key] = dict(gap=tau(x, gap), **{row: {m: tau(x, v) for m, v in cols.items()}
                                            for row, cols in columns.items()})
    return out


def correlate_population(out, n_boot: int = 1000, seed: int = 0, plot: bool = True, stream=None,
                         tag: str = "", where: dict | None = None, color_by: str | None = None) -> dict:
    """Kendall τ (with bootstrap CI) of each measure at each ρ against the gap; JSON, CSV, PNG, table.

    Paired differences |τ(m)| − |τ(vs)| on the same bootstrap resamples: each geodesic measure against its
    adaptive counterpart, and in a tagged evaluation each ablation (``geodesic-*-first-order``,
    ``geodesic-*-frobenius``) against its full measure in the untagged evaluation at the same ρ. Where
    ``reliability.json`` (:mod:`.reliability`) covers the same models, its ceiling on τ is reported beside them.
    ``measure_agreement`` compares the measures' rankings of the models with no gap involved
    (:func:`measure_agreement`): first order against Auto-PGD, geodesic against adaptive, ablation against
    full. ``hyperparameter_tau`` gives τ of each varying hyper-parameter against the gap and against each
    measure (:func:`hyperparameter_tau`).

    ``where`` restricts the population to the models whose recorded hyper-parameters match, e.g.
    ``{"label_noise": 0}`` (outputs ``correlation-label_noise=0.*``), to see whether a correlation
    survives within a stratum or is carried by one hyper-parameter. ``color_by`` (a recorded hyper-parameter)
    adds the scatter plot with the models coloured by it (``correlation_by-KEY.png``). A model left out of the
    evaluations (:mod:`.exclusion`) is left out of every τ and listed under ``excluded``."""
    out = Path(out)
    stream = stream or sys.stdout
    check_count("--bootstrap", n_boot)
    check_seed("--seed", seed)
    manifest = read_manifest(out)
    files = population_files(tag)
    if not (out / files["config"]).is_file():
        raise FileNotFoundError(f"{out / files['config']} does not exist; run `geosharp population evaluate "
                                f"--out {out}{f' --tag {tag}' if tag else ''}` first")
    cfg = read_evaluation_settings(out, tag)
    recs = read_results(out, tag)
    where = dict(where or {})
    metrics = {m["name"]: m["metrics"] for m in manifest["models"]}
    hparams = {m["name"]: m.get("hparams") or {} for m in manifest["models"]}
    chosen = subset_models([m["name"] for m in manifest["models"]], hparams, where)
    stem = out / (files["correlation"] + where_suffix(where))
    left_out = read_excluded(out)  # models left out of every evaluation, each with its reason
    excluded = [n for n in chosen if n in left_out]
    names = [n for n in chosen if n in recs and n not in excluded]
    missing = len(chosen) - len(excluded) - len(names)
    if len(names) < 3:
        raise ValueError(f"only {len(names)} evaluated models in {out}"
                         f"{f' matching {where}' if where else ''}; Kendall τ needs at least 3"
                         f"{'' if where else '; run `geosharp population evaluate` first'}")
    hkeys = sorted({k for n in names for k in hparams[n]})
    if color_by is not None and not plot:
        raise ValueError("--color-by draws a plot; drop --no-plot")
    if color_by is not None and color_by not in hkeys:
        raise ValueError(f"--color-by {color_by!r} is not a recorded hyper-parameter; this population records "
                         f"{hkeys or 'none (an imported population has no hyper-parameters)'}")
    gap = np.array([metrics[n]["gap"] for n in names])
    rows, grid = evaluation_grid(cfg)
    measures = cfg["measures"]
    per_grid = "rho_grid" in cfg
    for n in names:  # every record holds a finite value per measure and radius of these settings
        values = recs[n]["values"]
        for m in measures:
            for rho in grid[m]:
                v = values.get(m, {}).get(rho) if isinstance(values.get(m), dict) else None
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                    raise ValueError(f"{out / files['results']}: the record of {n} has no finite value for {m} at "
                                     f"ρ {rho} (got {v!r}); it was not written by this evaluation: delete its line "
                                     f"and run `geosharp population evaluate --out {out}"
                                     f"{f' --tag {tag}' if tag else ''}` with the same options again")

    table, paired, sizes, agreement, columns = {}, {}, {}, {}, {}
    full = _full_columns(out, names, measures, grid, rows) if tag else {}
    for i, row in enumerate(rows):
        table[row] = {}
        cols = columns[row] = {m: np.array([recs[n]["values"][m][grid[m][i]] for n in names]) for m in measures}
        for m in measures:
            table[row][m] = kendall_with_ci(cols[m], gap, n_boot=n_boot, seed=seed)
            if per_grid:
                table[row][m]["rho"] = grid[m][i]
            rel = [recs[n].get("relative_size", {}).get(m, {}).get(grid[m][i]) for n in names]
            if all(r is not None for r in rel):
                sizes.setdefault(row, {})[m] = float(np.median(rel))
        # |τ| paired on the same resamples, and how two measures of the same models agree (no gap involved)
        for m in measures:
            meas = get_measure(m)
            if meas.ablated:  # against its full measure: the untagged evaluation at the same ρ
                if (row, m) in full:
                    base, values = full[row, m]
                    paired.setdefault(row, {})[m] = dict(vs=base, **paired_abs_tau_difference(
                        cols[m], values, gap, n_boot=n_boot, seed=seed))
                    agreement.setdefault(row, {})[m] = dict(vs=base, **measure_agreement(
                        cols[m], values, n_boot=n_boot, seed=seed))
                continue
            ada = _adaptive_counterpart(meas)
            if ada in cols:  # a geodesic measure against its adaptive counterpart
                paired.setdefault(row, {})[m] = dict(vs=ada, **paired_abs_tau_difference(
                    cols[m], cols[ada], gap, n_boot=n_boot, seed=seed))
            ref = meas.base if meas.linearised else ada  # first order against the Auto-PGD measure it linearises
            if ref in cols:
                agreement.setdefault(row, {})[m] = dict(vs=ref, **measure_agreement(
                    cols[m], cols[ref], n_boot=n_boot, seed=seed))
    result = dict(models=len(names), missing=missing, bootstrap=n_boot, tau=table, evaluation=cfg,
                  gap=dict(min=float(gap.min()), max=float(gap.max()), mean=float(gap.mean())), where=where)
    if excluded:
        result["excluded"] = excluded
    if paired:
        result["paired_abs_tau_difference"] = paired
    if sizes:
        result["median_relative_size"] = sizes
    if agreement:
        result["measure_agreement"] = agreement
    drivers = hyperparameter_tau(names, hparams, gap, columns)
    if drivers:
        result["hyperparameter_tau"] = drivers
    reliability = out / RELIABILITY  # `population reliability` ran on the same models: report its ceiling
    if not where and reliability.is_file():
        rel = read_json_object(reliability, "split-half reliability of the gaps",
                               ("models", "tau_half", "tau_ceiling", "correlation_ceiling"),
                               f"delete it and run `geosharp population reliability --out {out}` again")
        if rel.get("models") == len(chosen):
            result["gap_reliability"] = {k: rel[k] for k in ("tau_half", "tau_ceiling", "correlation_ceiling")}
    write_json_atomic(stem.with_suffix(".json"), result)
    with _atomic_csv(stem.with_suffix(".csv")) as w:
        w.writerow(["model", "train_error", "test_error", "gap"] +
                   [f"{m}@rho={grid[m][i]}" for i in range(len(rows)) for m in measures] + hkeys)
        for n in names:
            w.writerow([n, metrics[n]["train_error"], metrics[n]["test_error"], metrics[n]["gap"]] +
                       [recs[n]["values"][m][grid[m][i]] for i in range(len(rows)) for m in measures] +
                       [json.dumps(hparams[n][k]) if k in hparams[n] else "" for k in hkeys])
    with _atomic_csv(stem.with_name(stem.name + "_tau.csv")) as w:
        w.writerow(["rho", "measure", "tau", "ci_low", "ci_high", "p", "n"] +
                   (["row", "median_relative_size"] if per_grid else []))
        for i, r in enumerate(rows):
            for m in measures:
                t = table[r][m]
                w.writerow([grid[m][i], m, t["tau"], t["ci"][0], t["ci"][1], t["p"], t["n"]] +
                           ([r, sizes.get(r, {}).get(m, "")] if per_grid else []))
    if paired:
        with _atomic_csv(stem.with_name(stem.name + "_paired.csv")) as w:
            w.writerow(["row", "measure", "vs", "abs_tau_difference", "ci_low", "ci_high", "n"])
            for r, cells in paired.items():
                for m, d in cells.items():
                    w.writerow([r, m, d["vs"], d["difference"], d["ci"][0], d["ci"][1], d["n"]])
    if plot:
        plot_population_scatter(stem.with_suffix(".png"), names, recs, gap, cfg, table)
        result["plot"] = str(stem.with_suffix(".png"))
        if color_by is not None:
            by = stem.with_name(f"{stem.name}_by-{color_by}.png")
            plot_population_scatter(by, names, recs, gap, cfg, table, color=[hparams[n].get(color_by) for n in names],
                                    color_label=color_by)
            result["plot_by"] = str(by)
        if len(rows) > 1:
            plot_tau_vs_rho(stem.with_name(stem.name + "_rho.png"), cfg, table, len(names))
            result["plot_rho"] = str(stem.with_name(stem.name + "_rho.png"))
    print(f"Kendall τ (sharpness vs generalization gap) over {len(names)} models"
          f"{f' with {where}' if where else ''}"
          f"{f' ({missing} not evaluated)' if missing else ''}{f' ({len(excluded)} excluded)' if excluded else ''}"
          f", 95% bootstrap CI ({n_boot} resamples)",
          file=stream)
    label = "row" if per_grid else "rho"
    width = max(8, *(len(r) for r in rows))
    print(f"{label:>{width}s}  " + "  ".join(f"{m:>24s}" for m in measures), file=stream)
    for i, r in enumerate(rows):
        cells = []
        for m in measures:
            t = table[r][m]
            cells.append(f"{t['tau']:+.2f} [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]")
        print(f"{r:>{width}s}  " + "  ".join(f"{c:>24s}" for c in cells), file=stream)
        if per_grid:
            print(f"{'ρ':>{width}s}  " + "  ".join(f"{grid[m][i]:>24s}" for m in measures), file=stream)
        if r in sizes:
            print(f"{'‖Δθ‖/‖θ‖':>{width}s}  " + "  ".join(f"{sizes[r].get(m, float('nan')):>24.3g}" for m in measures),
                  file=stream)
    if "gap_reliability" in result:
        rel = result["gap_reliability"]
        print(f"split-half reliability of the gap: τ(g^A, g^B) = {rel['tau_half']['median']:+.2f}; no measure can "
              f"reach |τ| above about {rel['tau_ceiling']:.2f} (geosharp population reliability)", file=stream)
    if drivers:
        print("Kendall τ of each hyper-parameter against the gap | against each measure, at "
              + ", ".join(rows), file=stream)
        for key, d in drivers.items():
            print(f"  {key:>16s}: gap {d['gap']['tau']:+.2f} | " + "; ".join(
                " ".join(f"{d[r][m]['tau']:+.2f}" for m in measures) for r in rows), file=stream)
    for r, cells in agreement.items():
        for m, d in cells.items():
            print(f"{m} vs {d['vs']} at {r}: τ = {d['tau']:+.2f} [{d['ci'][0]:+.2f}, {d['ci'][1]:+.2f}], "
                  f"median ratio {d['median_ratio']:.3g}", file=stream)
    for r, cells in paired.items():
        for m, d in cells.items():
            print(f"|τ({m})| − |τ({d['vs']})| at {r}: {d['difference']:+.2f} [{d['ci'][0]:+.2f}, "
                  f"{d['ci'][1]:+.2f}]", file=stream)
    written = [stem.with_suffix(".json"), stem.with_suffix(".csv"), stem.with_name(stem.name + "_tau.csv")]
    written += [stem.with_name(stem.name + "_paired.csv")] if paired else []
    written += [Path(result[k]) for k in ("plot", "plot_by", "plot_rho") if k in result]
    print("written: " + ", ".join(map(str, written)), file=stream)
    return result
