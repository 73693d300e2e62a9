"""Plots of the reference evaluator (matplotlib, object-oriented API on the Agg canvas: no pyplot
state, no global backend change, safe in scripts, tests and notebooks)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["plot_diagnet_scatter"]

_DIAG_PANELS = (("adaptive", "adaptive"), ("geodesic_inv", "geodesic, metric (5) inv"),
                ("geodesic_mix", "geodesic, metric (6) mix"))


def plot_diagnet_scatter(columns: dict, gap, tau: dict, rhos, color=None, path=None,
                         color_label: str = "log10 α (init scale)", log_gap: bool = True) -> Figure:
    """Paper Figure 3: generalisation gap against adaptive / geodesic (5) / geodesic (6) sharpness.

    ``columns`` maps ``f"{measure}@rho={rho:g}"`` to per-model arrays; ``tau[f"{rho:g}"][measure]`` is a
    dict with ``tau`` and ``ci`` (as returned by :func:`geosharp_ref.diagnet.kendall_with_ci`).
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
