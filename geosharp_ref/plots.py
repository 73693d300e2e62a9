"""Plots of the reference evaluator (matplotlib, object-oriented API on the Agg canvas: no pyplot
state, no global backend change, safe in scripts, tests and notebooks)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["plot_diagnet_scatter", "plot_population_scatter", "plot_tau_vs_rho", "plot_signed_contrast", "row_value"]

_DIAG_PANELS = (("adaptive", "adaptive"), ("geodesic_inv", "geodesic, metric (5) inv"),
                ("geodesic_mix", "geodesic, metric (6) mix"))


def plot_diagnet_scatter(columns: dict, gap, tau: dict, rhos, color=None, path=None,
                         color_label: str = "log10 α (init scale)", log_gap: bool = True) -> Figure:
    """Paper Figure 3: generalisation gap against adaptive / geodesic (5) / geodesic (6) sharpness.

    ``columns`` maps ``f"{measure}@rho={rho:g}"`` to per-model arrays; ``tau[f"{rho:g}"][measure]`` is a
    dict with ``tau`` and ``ci`` (as returned by :func:`geosharp_ref.stats.kendall_with_ci`).
    One row of three panels per ρ. Written to ``path`` (PNG) when given; the Figure is returned."""
    rhos = list(rhos)
    gap = np.asarray(gap, dtype=float)
    fig = Figure(figsize=(13, 3.6 * len(rhos)), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(rhos), 3, squeeze=False)
    sc = None
    for i, rho in enumerate(rhos):
        for j, (key, label) in enumerate(_DIAG_PANELS):
            ax = axes[i, j]
            x = np.asarray(columns[f"{key}@rho={rho:g}"], dtype=float)
            ok = np.isfinite(x) & np.isfinite(gap)
            kw = dict(s=22, edgecolor="k", linewidth=0.3)
            if color is not None:
                sc = ax.scatter(x[ok], gap[ok], c=np.asarray(color)[ok], cmap="viridis", **kw)
            else:
                ax.scatter(x[ok], gap[ok], **kw)
            if ok.any() and (x[ok] > 0).all() and x[ok].max() / x[ok].min() > 20:
                ax.set_xscale("log")
            else:
                ax.xaxis.set_major_locator(MaxNLocator(4))
                ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 3), useOffset=True)
            if log_gap and ok.any() and (gap[ok] > 0).all():
                ax.set_yscale("log")
            t = tau.get(f"{rho:g}", {}).get(key)
            title = f"{label}, ρ = {rho:g}"
            if t is not None:
                title += f"\nτ = {t['tau']:+.2f}  [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]"
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("sharpness")
            if j == 0:
                ax.set_ylabel("generalisation gap (test − train loss)")
            ax.grid(alpha=0.3)
    if sc is not None:
        fig.colorbar(sc, ax=axes, shrink=0.6, fraction=0.03, label=color_label)
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig


def plot_tau_vs_rho(path, cfg, table, n_models):
    """Kendall τ against ρ for each measure, with the bootstrap 95 % interval as a band. For a grid per
    measure matched in perturbation size (``cfg["rho_grid"]`` with ``cfg["sizes"]``) the x axis is the
    target relative size ‖Δθ‖/‖θ‖; for a grid without sizes, each measure's own ρ."""
    fig = Figure(figsize=(5.2, 3.6), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    rows = list(table)
    sizes = cfg.get("sizes") if "rho_grid" in cfg else None
    for m in cfg["measures"]:
        if "rho_grid" in cfg:
            x = list(sizes) if sizes else [float(r) for r in cfg["rho_grid"][m]]
            order = sorted(range(len(rows)), key=lambda i: x[i])
        else:
            x = [float(r) for r in rows]
            order = sorted(range(len(rows)), key=lambda i: x[i])
        xs = [x[i] for i in order]
        tau = [table[rows[i]][m]["tau"] for i in order]
        lo = [table[rows[i]][m]["ci"][0] for i in order]
        hi = [table[rows[i]][m]["ci"][1] for i in order]
        line, = ax.plot(xs, tau, marker="o", label=m)
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("target ‖Δθ‖/‖θ‖ (ρ matched per measure)" if sizes else "ρ")
    ax.set_ylabel("Kendall τ (sharpness, gap)")
    ax.set_title(f"τ as a function of ρ ({n_models} models, 95 % bootstrap CI)", fontsize=9)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def plot_population_scatter(path, names, recs, gap, cfg, table, color=None, color_label: str = ""):
    """Paper Figures 4/5: generalisation gap against each measure at each ρ, τ and its interval in the titles.

    ``color``: one value per model (e.g. a hyper-parameter); a few distinct values get one colour each and a
    legend (numbers in increasing order), more numbers get a colour map and a colour bar labelled
    ``color_label``. Written to ``path`` (PNG); the Figure is returned."""
    rows, meas = list(table), cfg["measures"]
    grid = cfg.get("rho_grid") or {m: list(cfg["rhos"]) for m in meas}
    fig = Figure(figsize=(4.2 * len(meas), 3.4 * len(rows)), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(rows), len(meas), squeeze=False)
    numeric = color is not None and all(isinstance(c, (int, float)) for c in color)
    # numbers (and booleans) by value, so learning rates read 1e-05, 3e-05, 0.0001; anything else by its text
    levels = sorted(set(color), key=None if numeric else str) if color is not None else []
    categorical = 0 < len(levels) and (len(levels) <= 6 or not numeric)
    sc = None
    for i, row in enumerate(rows):
        for j, m in enumerate(meas):
            ax = axes[i][j]
            r = grid[m][i]
            x = np.array([recs[n]["values"][m][r] for n in names])
            if categorical:
                for level in levels:
                    sel = np.array([c == level for c in color])
                    ax.scatter(x[sel], np.asarray(gap)[sel], s=14, alpha=0.8, label=f"{color_label}={level}")
                if i == 0 and j == 0:
                    ax.legend(fontsize=8)
            elif color is not None:
                sc = ax.scatter(x, gap, s=14, alpha=0.8, c=np.asarray(color, dtype=float), cmap="viridis")
            else:
                ax.scatter(x, gap, s=14, alpha=0.8)
            # τ only sees ranks: a log axis shows them when the values span decades
            log = min(x) > 0 and max(x) > 20 * min(x)
            if log:
                ax.set_xscale("log")
            t = table[row][m]
            ax.set_title(f"{m}, ρ={r}: τ={t['tau']:+.2f} [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]", fontsize=9)
            ax.set_xlabel("sharpness (log scale)" if log else "sharpness")
            ax.set_ylabel("generalization gap")
    if sc is not None:
        fig.colorbar(sc, ax=axes, shrink=0.6, fraction=0.03, label=color_label)
    fig.savefig(path, dpi=110)
    return fig


def row_value(row: str) -> float:
    """The number of a population result row: the target size of ``size=2e-05``, or the radius of a uniform
    sweep (``0.01``)."""
    return float(row.split("=", 1)[1] if "=" in row else row)


def _bar_lengths(point, lo, hi) -> list:
    """Error-bar lengths below and above ``point`` for the interval [lo, hi], each at least 0: a skewed bootstrap
    can leave the point outside its percentile interval, and matplotlib refuses a negative length (the bar then
    reaches from the point to the interval's far end; ``analysis.md`` names such a contrast)."""
    point = np.asarray(point, float)
    return [np.clip(point - np.asarray(lo, float), 0, None), np.clip(np.asarray(hi, float) - point, 0, None)]


def plot_signed_contrast(path, result: dict):
    """The primary contrast of a population (:func:`geosharp_ref.studies.population.reanalysis.reanalyse` or the
    tweets protocol's ``analyse``): Δ = τ(s_geo, gap) − τ(s_ada, gap) for each Auto-PGD geodesic measure at each
    target size, with its 95 % bootstrap interval (filled marker), the same contrast of partial τ given the train
    error (hollow marker), and the paper's MNLI difference attenuated by the population's measured gap reliability
    (×). A ``*`` marks a contrast whose Holm-adjusted p < 0.05 with Δ > 0 (``geodesic_better``, where the
    result holds it). Returns the figure (one axis; x = the rows, ascending: target sizes ``size=…``, or the radii
    of a uniform sweep)."""
    rows = sorted(result["signed_contrast"], key=row_value)
    keys = sorted({k for cells in result["signed_contrast"].values() for k in cells if "linearised" not in k})
    fig = Figure(figsize=(1.2 * len(rows) + 5.0, 3.8), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.6 / max(1, len(keys))
    handles = []
    for j, k in enumerate(keys):
        colour = f"C{j}"
        xs, d, lo, hi, xp, pd, plo, phi, xa, att = ([] for _ in range(10))
        for i, row in enumerate(rows):
            c = result["signed_contrast"][row].get(k)
            if c is None:
                continue
            x = i + (j - (len(keys) - 1) / 2) * width
            xs.append(x), d.append(c["difference"]), lo.append(c["ci"][0]), hi.append(c["ci"][1])
            g = c.get("given_train_error")
            if g is not None:
                xp.append(x + 0.3 * width), pd.append(g["difference"]), plo.append(g["ci"][0]), phi.append(g["ci"][1])
            if "paper_attenuated_difference" in c:
                xa.append(x), att.append(c["paper_attenuated_difference"])
            if c.get("geodesic_better"):
                ax.annotate("*", (x, c["ci"][1]), ha="center", va="bottom", color=colour, fontsize=12)
        d, pd = np.asarray(d, float), np.asarray(pd, float)
        handles.append(ax.errorbar(xs, d, yerr=_bar_lengths(d, lo, hi), fmt="o", color=colour, capsize=3,
                                   label=f"τ({k})"))
        if xp:
            handles.append(ax.errorbar(xp, pd, yerr=_bar_lengths(pd, plo, phi),
                                       fmt="o", mfc="white", color=colour, capsize=2, lw=0.8,
                                       label="  given train error (partial τ)"))
        if xa:
            handles += ax.plot(xa, att, "x", color=colour, ms=8, mew=2, label="  paper (MNLI), attenuated")
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_xticks(range(len(rows)), [r.split("=", 1)[1] if r.startswith("size=") else r for r in rows])
    ax.set_xlabel("target ‖Δθ‖/‖θ‖" if rows and rows[0].startswith("size=") else "ρ")
    ax.set_ylabel("τ_geodesic − τ_adaptive (vs gap)")
    rel = result.get("reliability", {}).get("pearson_full_spearman_brown")
    ax.set_title(f"signed contrast, {result.get('models', '?')} models"
                 + (f", gap reliability R = {rel:.2f}" if rel is not None else "") + "; 95 % bootstrap CI",
                 fontsize=9)
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig
