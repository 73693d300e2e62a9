"""mkdocs hook: result tables and numbers rendered at build time from the committed CSV and JSON files.

The study pages never copy a number the code wrote. They hold markers, replaced here by values read from the
files under ``docs/`` (paths are relative to the repository root):

``<!-- tau-table PATH.csv -->``
    a ``correlation_tau.csv`` (``geosharp population correlate``): one row per measure, one column per ρ (or
    per target size ``row``), each cell Kendall τ [95 % bootstrap interval] against the gap.
``<!-- paired-table PATH.csv -->``
    a ``correlation_paired.csv``: |τ_measure| − |τ_vs| [95 %] on the same bootstrap resamples.
``<!-- contrast-table PATH.json -->``
    a ``reanalysis.json`` (``geosharp_ref.studies.population.reanalysis``): the signed contrast τ_geo − τ_ada
    with its interval, the same given the train error, the paper's attenuated difference and the power, by
    size; for the tweets protocol's ``analysis.json`` also the bootstrap and Holm-adjusted p and the verdict.
``<!-- attenuation-table PATH.json ... -->``
    one row per ``reanalysis.json``: the gap's reliability R and the paper's τ attenuated to it.
``<!-- value PATH.json key/key/... FORMAT -->``
    one number of a JSON file (keys separated by ``/``; an integer key indexes a list), formatted with FORMAT
    (a ``format()`` spec such as ``.2f``).
``<!-- agreement-table PATH.json -->``
    a ``correlation.json``'s ``measure_agreement``: τ between two measures of the same models [95 %] and the
    median ratio of their values, per target size or ρ.
``<!-- hyperparameter-table PATH.json -->``
    a ``correlation.json``'s ``hyperparameter_tau``: τ of each varying hyper-parameter against the gap and
    against each headline measure, per target size or ρ.
``<!-- calibration-table PATH.json -->``
    a ``calibration.json`` (``geosharp population calibrate``): per measure, the measured ‖Δθ‖/‖θ‖ at each probe
    radius (range over the models used), the log-log slope, and the radius chosen for each target size.
``<!-- tau PATH.json key/key/... -->``
    a ``{"tau": …, "ci": [lo, hi]}`` record of a JSON file as ``τ [lo, hi]``.
``<!-- range PATH.csv COLUMN FORMAT -->``
    the range and mean of a CSV column over its rows: ``min … max (mean m)``.

A marker naming a missing file or key is a warning, so ``mkdocs build --strict`` fails on it.
"""
from __future__ import annotations

import csv
import json
import logging
import re
from functools import lru_cache
from pathlib import Path

log = logging.getLogger("mkdocs.plugins.geosharp.results_tables")
ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!--\s*(tau-table|paired-table|contrast-table|attenuation-table|agreement-table|hyperparameter-table|calibration-table|value|tau|range)\s+([^>]*?)\s*-->")
HEADLINE = ("adaptive", "geodesic-inv", "geodesic-mix")


class MarkerError(ValueError):
    pass


@lru_cache(maxsize=None)
def _read_csv(path: str) -> tuple[dict, ...]:
    with open(ROOT / path, newline="", encoding="utf-8") as fh:
        return tuple(csv.DictReader(fh))


@lru_cache(maxsize=None)
def _read_json(path: str):
    return json.loads((ROOT / path).read_text(encoding="utf-8"))


def _signed(x: float, digits: int = 2) -> str:
    s = f"{x:+.{digits}f}".replace("-", "−")
    return "+0.00" if s in ("−0.00",) else s


def _interval(x, lo, hi) -> str:
    return f"{_signed(float(x))} [{_signed(float(lo))}, {_signed(float(hi))}]"


def _short_e(x: float) -> str:
    """2e-05 -> 2e-5, 0.000133 -> 1.3e-4 (two significant digits, no padded exponent)."""
    mant, _, exp = f"{x:.1e}".partition("e")
    return f"{mant.removesuffix('.0')}e{int(exp)}"


def _size_label(row: str) -> str:
    """``size=2e-05`` -> ``‖Δθ‖/‖θ‖ = 2e-5``; anything else unchanged."""
    m = re.fullmatch(r"size=(.+)", row)
    if not m:
        return row
    mant, _, exp = f"{float(m.group(1)):.0e}".partition("e")
    return f"‖Δθ‖/‖θ‖ = {mant}e{int(exp)}"


def _columns(rows):
    """The column key of each row (target size if recorded, else ρ) in first-seen order."""
    key = "row" if rows and rows[0].get("row") else "rho"
    cols = list(dict.fromkeys(r[key] for r in rows))
    label = _size_label if key == "row" else (lambda c: f"ρ = {float(c):g}")
    return key, cols, label


def tau_table(path: str) -> str:
    rows = _read_csv(path)
    if not rows:
        raise MarkerError(f"{path} has no rows")
    key, cols, label = _columns(rows)
    measures = list(dict.fromkeys(r["measure"] for r in rows))
    cell = {(r["measure"], r[key]): r for r in rows}
    with_rho = key == "row"
    out = ["| measure | " + " | ".join(label(c) for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for m in measures:
        cells = []
        for c in cols:
            r = cell.get((m, c))
            if r is None:
                cells.append("–")
                continue
            text = _interval(r["tau"], r["ci_low"], r["ci_high"])
            if with_rho and not m.endswith(("-linearised", "-first-order", "-frobenius")):
                text += f" (ρ {float(r['rho']):.2g})"
            elif m.endswith(("-first-order", "-frobenius")) and r.get("median_relative_size"):
                text += f" (measured ‖Δθ‖/‖θ‖ {_short_e(float(r['median_relative_size']))})"
            cells.append(text)
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    n = {r["n"] for r in rows}
    out.append("")
    out.append(f"<small>Kendall τ against the gap [95 % bootstrap interval], {', '.join(sorted(n))} models; "
               f"rendered from `{path}`.</small>")
    return "\n".join(out)


def paired_table(path: str) -> str:
    rows = _read_csv(path)
    if not rows:
        raise MarkerError(f"{path} has no rows")
    cols = list(dict.fromkeys(r["row"] for r in rows))
    pairs = list(dict.fromkeys((r["measure"], r["vs"]) for r in rows))
    cell = {(r["measure"], r["vs"], r["row"]): r for r in rows}
    out = ["| pair | " + " | ".join(_size_label(c) for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for m, vs in pairs:
        cells = [_interval(r["abs_tau_difference"], r["ci_low"], r["ci_high"]) if (r := cell.get((m, vs, c)))
                 else "–" for c in cols]
        out.append(f"| \\|τ {m}\\| − \\|τ {vs}\\| | " + " | ".join(cells) + " |")
    out += ["", f"<small>Paired on the same bootstrap resamples; rendered from `{path}`.</small>"]
    return "\n".join(out)


def contrast_table(path: str) -> str:
    data = _read_json(path)
    cells = [(row, name, c) for row, contrasts in data["signed_contrast"].items() for name, c in contrasts.items()
             if "linearised" not in name]
    cells.sort(key=lambda t: (float(t[0].split("=", 1)[1] if "=" in t[0] else t[0]), t[1]))  # by size, then name
    holm = any("p_holm" in c for _, _, c in cells)  # the tweets protocol's analysis.json: the primary family
    out = ["| size | contrast | τ_geo − τ_ada [95 %] | given train error [95 %] | paper, attenuated | power |"
           + (" p (bootstrap) | p (Holm) | geodesic better |" if holm else ""),
           "|---|---|---|---|---|---|" + ("---|---|---|" if holm else "")]
    for row, name, c in cells:
        g = c["given_train_error"]
        power = c.get("power_for_paper_attenuated")
        line = (f"| {_size_label(row)} | {name} | {_interval(c['difference'], *c['ci'])} | "
                f"{_interval(g['difference'], *g['ci'])} | {_signed(c['paper_attenuated_difference'])} | "
                f"{'–' if power is None else f'{power:.2f}'} |")
        if holm:
            line += f" {c['p_bootstrap']:.3f} | {c['p_holm']:.3f} | {'yes' if c['geodesic_better'] else 'no'} |"
        out.append(line)
    out += ["", f"<small>{data['models']} models, {data['bootstrap']} bootstrap resamples; rendered from "
                f"`{path}`.</small>"]
    return "\n".join(out)


def attenuation_table(*paths: str) -> str:
    out = ["| population | models | R | adaptive | geodesic-inv | geodesic-mix | power of one τ test (inv / mix) |",
           "|---|---|---|---|---|---|---|"]
    paper = None
    rows = []
    for path in paths:
        d = _read_json(path)
        paper = d["paper_mnli_tau"]
        att, pw = d["paper_mnli_tau_attenuated"], d["power"]["paper_attenuated"]
        name = Path(path).parent.name
        rows.append(f"| attenuated to `{name}` ({d['reliability']['n_test']} test documents) | {d['models']} | "
                    f"{d['reliability']['pearson_full_spearman_brown']:.2f} | "
                    + " | ".join(f"{att[m]:.3f}" for m in HEADLINE)
                    + f" | {pw['geodesic-inv']:.2f} / {pw['geodesic-mix']:.2f} |")
    out.append("| paper, BERT-MNLI (as reported) | | — | " + " | ".join(f"{paper[m]:.2f}" for m in HEADLINE)
               + " | |")
    out += rows
    out += ["", "<small>Rendered from " + ", ".join(f"`{p}`" for p in paths) + ".</small>"]
    return "\n".join(out)


def value(path: str, keys: str, fmt: str = "") -> str:
    return format(_lookup(path, keys), fmt).replace("-", "−") if fmt else str(_lookup(path, keys))


def _row_label(row: str) -> str:
    m = re.fullmatch(r"rho=(.+)", row)
    return f"ρ = {float(m.group(1)):g}" if m else _size_label(row)


def agreement_table(path: str) -> str:
    agreement = _read_json(path)["measure_agreement"]
    rows = sorted(agreement, key=lambda r: float(r.split("=", 1)[1]))
    pairs = list(dict.fromkeys((m, rec["vs"]) for r in rows for m, rec in agreement[r].items()))
    out = ["| measure | vs | " + " | ".join(f"{_row_label(r)}: τ [95 %], median ratio" for r in rows) + " |",
           "|---|---" + "|---" * len(rows) + "|"]
    for m, vs in pairs:
        cells = []
        for r in rows:
            rec = agreement[r].get(m)
            cells.append("–" if rec is None or rec["vs"] != vs else
                         f"{_interval(rec['tau'], *rec['ci'])}, {rec['median_ratio']:.3g}")
        out.append(f"| {m} | {vs} | " + " | ".join(cells) + " |")
    out += ["", f"<small>Rendered from `{path}` (`measure_agreement`).</small>"]
    return "\n".join(out)


def hyperparameter_table(path: str) -> str:
    hp = _read_json(path)["hyperparameter_tau"]
    if not hp:
        raise MarkerError(f"{path} records no varying hyper-parameter")
    first = next(iter(hp.values()))
    rows = sorted((k for k in first if k != "gap"), key=lambda r: float(r.split("=", 1)[1]))
    cols = [(r, m) for r in rows for m in HEADLINE if m in first[r]]
    out = ["| hyper-parameter | gap | " + " | ".join(f"{m}, {_row_label(r)}" for r, m in cols) + " |",
           "|---|---" + "|---" * len(cols) + "|"]

    def fmt(rec):
        return f"{_signed(rec['tau'])} (p {rec['p']:.2g})"

    for name, rec in hp.items():
        out.append(f"| `{name}` | {fmt(rec['gap'])} | " + " | ".join(fmt(rec[r][m]) for r, m in cols) + " |")
    out += ["", f"<small>Kendall τ (p-value); rendered from `{path}` (`hyperparameter_tau`).</small>"]
    return "\n".join(out)


def calibration_table(path: str) -> str:
    cal = _read_json(path)
    settings = cal["settings"]
    probes, sizes = settings["probe_rhos"], settings["sizes"]
    out = ["| measure | " + " | ".join(f"‖Δθ‖/‖θ‖ at ρ = {r:g}" for r in probes) + " | log-log slope | "
           + " | ".join(f"ρ for {_short_e(t)}" for t in sizes) + " |", "|---" * (2 + len(probes) + len(sizes)) + "|"]
    for m in settings["measures"]:
        measured = [cal["measured"][m][str(r)] for r in probes]
        spans = [f"{min(v):.2e} … {max(v):.2e}" for v in measured]
        out.append(f"| {m} | " + " | ".join(spans) + f" | {cal['fit'][m]['slope']:.2f} | "
                   + " | ".join(f"{r:.2g}" for r in cal["grid"][m]) + " |")
    out += ["", f"<small>{', '.join(cal['models_used'])}, one batch of {settings['batch_size']}, "
                f"{settings['iters']} Auto-PGD iterations; rendered from `{path}`.</small>"]
    return "\n".join(out)


def _lookup(path: str, keys: str):
    obj = _read_json(path)
    for k in keys.split("/"):
        obj = obj[int(k)] if isinstance(obj, list) else obj[k]
    return obj


def tau_value(path: str, keys: str) -> str:
    rec = _lookup(path, keys)
    return _interval(rec["tau"], *rec["ci"])


def column_range(path: str, column: str, fmt: str = ".3g") -> str:
    values = [float(r[column]) for r in _read_csv(path)]
    if not values:
        raise MarkerError(f"{path} has no rows")
    f = lambda x: format(x, fmt).replace("-", "−")  # noqa: E731
    return f"{f(min(values))} … {f(max(values))} (mean {f(sum(values) / len(values))})"


def render(kind: str, args: str) -> str:
    parts = args.split()
    if kind == "tau-table":
        return tau_table(*parts)
    if kind == "paired-table":
        return paired_table(*parts)
    if kind == "contrast-table":
        return contrast_table(*parts)
    if kind == "attenuation-table":
        return attenuation_table(*parts)
    if kind == "agreement-table":
        return agreement_table(*parts)
    if kind == "hyperparameter-table":
        return hyperparameter_table(*parts)
    if kind == "calibration-table":
        return calibration_table(*parts)
    if kind == "tau":
        return tau_value(*parts)
    if kind == "range":
        return column_range(*parts)
    return value(*parts)


def on_page_markdown(markdown: str, page, config, files, **kwargs):  # noqa: ARG001 (mkdocs hook signature)
    def replace(m: re.Match) -> str:
        try:
            return render(m.group(1), m.group(2))
        except (OSError, KeyError, IndexError, ValueError, TypeError) as exc:
            log.warning("%s: marker '%s' cannot be rendered: %s: %s", page.file.src_path, m.group(0),
                        type(exc).__name__, exc)
            return m.group(0)

    return MARKER.sub(replace, markdown)
