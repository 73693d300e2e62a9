"""The tweets population's analysis as a Markdown report (``analysis.md``), written from ``analysis.json``
(:func:`~geosharp_ref.studies.population.tweets_analysis.analyse`) and ``correlation_tau.csv`` alone: nothing is
computed here, every number is one of those files' values, rounded.

Sections, in the protocol's order: the population (models, train errors, the gap reliability R against the
required 0.9, the primary family's size, the models R was measured on where they differ, and the models each
evaluation left out), **H1** (the primary family: Δ = τ_geo − τ_ada with its interval, bootstrap and Holm p-values
(a p of 0 as "<" the resolution of the resamples), the paper's attenuated difference and this population's power
for it, the verdict; then what each verdict means and any Δ outside its own interval), **H2** (each measure's τ and
partial τ given train error, with intervals and the median relative size), the power statement, the sensitivity
analysis without the models above train error 0.05, **H3/H4** (the size-matched ablations, with the ablation's
and the full measure's median relative sizes), the exploratory curvature measures and the descriptive analyses
(how two measures agree, the hyper-parameters' τ). Where R < 0.9 the report says so at its top and in every table's
caption.

::

    python -m geosharp_ref.studies.population.tweets_analysis report DIR     # writes DIR/analysis.md
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from ...io.durable import write_text_atomic
from ...plots import row_value
from .reanalysis import tau_row

__all__ = ["render_report", "write_report", "REPORT"]

REPORT = "analysis.md"


def _num(x, fmt: str = "+.3f") -> str:
    """``x`` formatted, or "n/a" where it is missing or not finite."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return format(x, fmt)


def _ci(ci, fmt: str = "+.3f") -> str:
    return f"[{_num(ci[0], fmt)}, {_num(ci[1], fmt)}]" if ci else "n/a"


def _table(header, rows) -> list:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def _taus(out: Path) -> dict:
    """``{(row, measure): correlation_tau.csv line}``."""
    with open(out / "correlation_tau.csv", newline="") as f:
        return {(tau_row(t), t["measure"]): t for t in csv.DictReader(f)}


def _p(p, smallest: float) -> str:
    """A p-value to 3 decimals; a bootstrap p of exactly 0 (no resample on one side) as "< smallest", the
    resolution of ``n_boot`` resamples (2 / n_boot; times the family's size for a Holm-adjusted p)."""
    return f"< {smallest:.3f}" if p == 0 else _num(p, ".3f")


def _primary_rows(signed_contrast: dict, n_boot: int) -> list:
    rows = []
    family = sum("linearised" not in k for cells in signed_contrast.values() for k in cells)
    for row, cells in sorted(signed_contrast.items(), key=lambda kv: row_value(kv[0])):
        for k, c in cells.items():
            if "linearised" in k:
                continue
            rows.append([row, k.replace(" - ", " − "), _num(c["difference"]), _ci(c["ci"]),
                         _p(c.get("p_bootstrap"), 2 / n_boot), _p(c.get("p_holm"), 2 * family / n_boot),
                         _num(c.get("paper_attenuated_difference")), _num(c.get("power_for_paper_attenuated"), ".2f"),
                         c.get("verdict", "n/a")])
    return rows


PRIMARY_HEADER = ["size", "contrast", "Δ = τ_geo − τ_ada", "95 % interval", "p (bootstrap)", "p (Holm)",
                  "paper, attenuated", "power for it", "verdict"]

#: what each verdict of the primary family means (the protocol's rule, amendment 8)
VERDICTS = ('Verdicts: "better": Holm-adjusted p < 0.05 and Δ > 0. "no better": the interval lies wholly below the '
            "paper's attenuated difference and Holm finds no Δ > 0 (the interval may still lie above 0: geodesic no "
            'better *than the paper\'s effect*). "better, by less than the paper\'s attenuated difference": both. '
            '"undecided": neither.')


def _primary_table(signed_contrast: dict, n_boot: int) -> list:
    """The primary family's table, the verdicts' meaning and any Δ outside its own interval."""
    lines = _table(PRIMARY_HEADER, _primary_rows(signed_contrast, n_boot)) + ["", VERDICTS]
    skewed = [f"{row} {k.replace(' - ', ' − ')}" for row, cells in sorted(signed_contrast.items(),
                                                                          key=lambda kv: row_value(kv[0]))
              for k, c in cells.items() if c.get("difference_outside_ci")]
    if skewed:
        lines.append(f"Δ lies outside its own percentile interval (a skewed bootstrap; its p-value comes from the "
                     f"other tail): {', '.join(skewed)}.")
    return lines


def render_report(out) -> str:
    """The Markdown report of the analysed population directory ``out`` (see the module doc)."""
    out = Path(out)
    res = json.loads((out / "analysis.json").read_text())
    taus = _taus(out)
    checks, rel, te = res["protocol_checks"], res["reliability"], res["train_error"]
    R = rel["pearson_full_spearman_brown"]
    caveat = "" if checks["reliability_ok"] else (f" The gap reliability R = {R:.3f} is below the required "
                                                  f"{checks['reliability_at_least']:g}.")
    lines = ["# The tweets population: the pre-registered analysis", "",
             f"Written by `tweets_analysis report` from `analysis.json` and `correlation_tau.csv` "
             f"({res['bootstrap']} bootstrap resamples of the models, seed {res['seed']}).", "",
             "## Population", "",
             f"- **{res['models']} models** (the protocol asks for at least {checks['models_at_least']}"
             f"{'' if checks['models_ok'] else ': NOT MET'}).",
             f"- Train error min / median / max: {te['min']:.4f} / {te['median']:.4f} / {te['max']:.4f}; "
             f"{te['above_0_05']} above 0.05, {te['above_0_10']} above 0.10; τ(train error, gap) = "
             f"{_num(te['tau_vs_gap']['tau'])} {_ci(te['tau_vs_gap']['ci'])}.",
             f"- Gap reliability (split-half over {rel['n_test']:,} test documents, Spearman–Brown): "
             f"**R = {R:.3f}**, " + ("meets the required " if checks["reliability_ok"] else "BELOW the required ")
             + f"{checks['reliability_at_least']:g}." + caveat] + _checks(res) + ["",
             "## H1 (primary): does geodesic sharpness track the gap better than adaptive sharpness?", "",
             "Signed paired contrast of Kendall τ-b against the gap, percentile interval over models, two-sided "
             "bootstrap p, Holm–Bonferroni over the family; the paper's BERT-MNLI difference attenuated by R." + caveat,
             ""]
    lines += _primary_table(res["signed_contrast"], res["bootstrap"])
    lines += ["", "## H2: each measure's τ against the gap", "",
              "τ with its bootstrap interval; partial τ given train error (the pre-registered covariate)." + caveat, ""]
    partial = res.get("partial_tau_given_train_error", {})
    rows = []
    for (row, m), t in sorted(taus.items(), key=lambda kv: (row_value(kv[0][0]), kv[0][1])):
        p = partial.get(row, {}).get(m, {})
        size = t.get("median_relative_size")
        rows.append([row, m, _num(float(t["tau"])), _ci([float(t["ci_low"]), float(t["ci_high"])]),
                     _num(p.get("tau")), _ci(p.get("ci")), _num(float(size), ".2e") if size else "n/a"])
    lines += _table(["size", "measure", "τ", "95 % interval", "partial τ given train error", "95 % interval",
                     "median ‖Δθ‖/‖θ‖"], rows)
    pw = res["power"]
    lines += ["", "## Power", "",
              f"With {res['models']} models a two-sided Kendall test at 5 % has 80 % power for |τ| ≥ "
              f"{pw['min_detectable_tau_80']:.2f} (null sd {pw['kendall_null_sd']:.3f}). The paper's MNLI τ attenuated "
              f"by R = {R:.3f}, and the power of each single test for it: "
              + "; ".join(f"{m} {res['paper_mnli_tau'][m]:.2f} → {res['paper_mnli_tau_attenuated'][m]:.3f} "
                          f"(power {pw['paper_attenuated'][m]:.2f})" for m in res["paper_mnli_tau"]) + "."]
    lines += _sensitivity(res.get("sensitivity_without_train_error_above_0_05", {}), caveat, res["bootstrap"])
    lines += _ablations(res.get("ablations", {}), caveat)
    lines += _curvature(res.get("curvature_exploratory", {}), caveat)
    lines += _descriptive(res.get("descriptive", {}))
    fo = res.get("first_order_vs_full")
    if fo:
        lines += ["", "## First-order against Auto-PGD", "",
                  f"The largest change of τ against the gap between a measure and its first-order version: "
                  f"{fo['max_abs_tau_shift']:.3f} ({fo['measure']}, {fo['row']})."]
    return "\n".join(lines) + "\n"


def _sensitivity(sens: dict, caveat: str, n_boot: int = 1000) -> list:
    lines = ["", "## Sensitivity: without the models above train error 0.05 (pilot rule 5)", ""]
    if not sens:
        return lines + ["Not computed."]
    if not sens["excluded"]:
        return lines + ["Every model has train error ≤ 0.05: the primary analysis above is the sensitivity analysis."]
    lines.append(f"Left out ({len(sens['excluded'])}): {', '.join(sens['excluded'])}; {sens['models']} models remain."
                 + caveat)
    if "signed_contrast" not in sens:
        return lines + ["", sens.get("note", "")]
    rows = [[row, m, _num(t["tau"]), _ci(t["ci"])] for row, cells in sorted(sens["tau"].items(),
                                                                           key=lambda kv: row_value(kv[0]))
            for m, t in sorted(cells.items())]
    return (lines + [""] + _primary_table(sens["signed_contrast"], n_boot)
            + ["", "Each τ without them:", ""] + _table(["size", "measure", "τ", "95 % interval"], rows))


def _opening(title: str, part: dict, caption: str, caveat: str) -> list:
    """A section's heading and caption (with the reliability caveat), or "Not evaluated." where ``part`` is empty."""
    return ["", f"## {title}", ""] + ([caption + caveat, ""] if part else ["Not evaluated."])


def _ablations(abl: dict, caveat: str) -> list:
    lines = _opening("H3 / H4: the ablations, size-matched", abl,
                     "τ(full, gap) − τ(ablation, gap) at the same target size, the same contrast given train error, τ "
                     "between the two measures and the median |full − ablation| / full. H3 (`*-first-order`) is "
                     "tested at the sizes below only (amendment 8).", caveat)
    if not abl:
        return lines
    rows = []
    for row, cells in sorted(abl.items(), key=lambda kv: row_value(kv[0])):
        for m, c in cells.items():
            k, g = c["contrast_full_minus_ablation"], c.get("contrast_given_train_error", {})
            rows.append([row, m, c["vs"], _num(k["difference"]), _ci(k["ci"]), _num(g.get("difference")),
                         _ci(g.get("ci")), _num(c["tau_between"], ".3f"), _num(c["median_relative_difference"], ".2e"),
                         f"{_num(c.get('relative_size'), '.2e')} / {_num(c.get('relative_size_full'), '.2e')}"])
    return lines + _table(["size", "ablation", "full", "τ(full) − τ(ablation)", "95 % interval",
                           "given train error", "95 % interval", "τ between", "median rel. difference",
                           "median ‖Δθ‖/‖θ‖ (ablation / full)"], rows)


def _curvature(curv: dict, caveat: str) -> list:
    lines = _opening("Exploratory: curvature (amendment 5; outside the primary family)", curv,
                     "τ against the gap, partial τ given train error, the measurement's own error (a trace: "
                     "reliability 1 − mean SE² / variance over models; an eigenvalue: the largest Lanczos residual "
                     "bound relative to the value), and the contrast with the Euclidean quantity.", caveat)
    if not curv:
        return lines
    rows = []
    for m, c in sorted(curv.items()):
        err = (f"reliability {_num(c['hutchinson_reliability'], '.3f')}" if "hutchinson_reliability" in c else
               f"residual ≤ {_num(c.get('max_relative_residual_bound'), '.1e')}")
        v = c.get("contrast_vs_euclidean")
        rows.append([m, _num(c["tau"]["tau"]), _ci(c["tau"]["ci"]), _num(c["partial_tau_given_train_error"]["tau"]),
                     err, f"{_num(v['difference'])} {_ci(v['ci'])}" if v else "–"])
    return lines + _table(["measure", "τ", "95 % interval", "partial τ given train error", "measurement error",
                           "τ − τ(Euclidean)"], rows)


def _checks(res: dict) -> list:
    """The Population section's lines on the primary family's size, the models R was measured on and the models
    an evaluation left out (where ``analyse`` recorded them)."""
    checks, lines = res["protocol_checks"], []
    if "primary_family_size" in checks:
        lines.append(f"- Primary family (Holm): {checks['primary_family_size']} contrasts"
                     + ("." if checks["primary_family_ok"] else
                        f": NOT MET (the protocol fixes {checks['primary_family_expected']})."))
    if checks.get("reliability_models") is not None and not checks.get("reliability_covers_models"):
        lines.append(f"- R was measured on {checks['reliability_models']} models, the analysis has {res['models']}.")
    reasons = res.get("exclusion_reasons", {})  # excluded.json: the models the study left out, each with its reason
    for tag, names in res.get("models_left_out", {}).items():
        if names:
            lines.append(f"- Left out of the {tag} evaluation: "
                         + ", ".join(f"{n} ({reasons[n]})" if n in reasons else f"{n} (no record)" for n in names)
                         + ".")
    if "models_left_out" in res and not any(res["models_left_out"].values()):
        lines.append("- No model was left out of any evaluation.")
    return lines


def _descriptive(desc: dict) -> list:
    """The descriptive analyses: how two measures of the same models agree, and the hyper-parameters' τ."""
    agree, hyper = desc.get("measure_agreement", {}), desc.get("hyperparameter_tau", {})
    if not agree and not hyper:
        return []
    lines = ["", "## Descriptive", ""]
    if agree:
        rows = [[row, m, c["vs"], _num(c["tau"], ".3f"), _ci(c["ci"]), _num(c["median_ratio"], ".3f")]
                for row, cells in sorted(agree.items(), key=lambda kv: row_value(kv[0])) for m, c in cells.items()]
        lines += ["How two measures of the same models agree (no gap involved): τ between them and the median ratio.",
                  ""] + _table(["size", "measure", "against", "τ", "95 % interval", "median ratio"], rows)
    if hyper:
        measures = sorted({m for h in hyper.values() for k, v in h.items() if k != "gap" for m in v})
        rows = []
        for name, h in sorted(hyper.items()):
            for row in sorted((k for k in h if k != "gap"), key=row_value):
                rows.append([name, _num(h["gap"]["tau"]), row] + [_num(h[row].get(m, {}).get("tau")) for m in measures])
        lines += ["", "Each hyper-parameter's τ against the gap and against each measure (scipy's τ-b).", ""]
        lines += _table(["hyper-parameter", "τ with the gap", "size"] + measures, rows)
    return lines


def write_report(out) -> Path:
    """Write :func:`render_report` to ``out/analysis.md`` (atomically) and return its path."""
    path = Path(out) / REPORT
    write_text_atomic(path, render_report(out))
    return path
