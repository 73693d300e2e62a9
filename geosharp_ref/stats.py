"""Rank statistics of a population: Kendall τ with bootstrap intervals (models resampled)."""
from __future__ import annotations

import numpy as np
from scipy.stats import kendalltau

__all__ = ["kendall_tau_b", "kendall_with_ci", "paired_abs_tau_difference"]


def kendall_tau_b(x, y):
    """Kendall τ-b of rows: x, y (B, M) → (B,) (ties handled as scipy.stats.kendalltau)."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    y = np.atleast_2d(np.asarray(y, dtype=float))
    M = x.shape[1]
    iu = np.triu_indices(M, 1)
    sx = np.sign(x[:, :, None] - x[:, None, :])[:, iu[0], iu[1]]
    sy = np.sign(y[:, :, None] - y[:, None, :])[:, iu[0], iu[1]]
    s = (sx * sy).sum(1)
    nx = (sx != 0).sum(1)
    ny = (sy != 0).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return s / np.sqrt(nx.astype(float) * ny)


def kendall_with_ci(x, y, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """scipy's τ and p-value, plus a percentile bootstrap interval (models resampled)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3:
        return dict(tau=float("nan"), p=float("nan"), ci=[float("nan"), float("nan")], n=int(len(x)))
    res = kendalltau(x, y)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    taus = kendall_tau_b(x[idx], y[idx])
    taus = taus[np.isfinite(taus)]
    a = (1 - level) / 2
    lo, hi = (np.quantile(taus, [a, 1 - a]) if len(taus) else (float("nan"), float("nan")))
    return dict(tau=float(res.statistic), p=float(res.pvalue), ci=[float(lo), float(hi)], n=int(len(x)))


def paired_abs_tau_difference(x1, x2, y, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """|τ(x1, y)| − |τ(x2, y)| with a paired percentile bootstrap interval: each resample of the models
    recomputes both τ on the same models, so the interval accounts for their correlation (e.g. geodesic
    vs adaptive sharpness of one population against its gap). Models with a non-finite value are dropped."""
    x1, x2, y = (np.asarray(v, dtype=float) for v in (x1, x2, y))
    ok = np.isfinite(x1) & np.isfinite(x2) & np.isfinite(y)
    x1, x2, y = x1[ok], x2[ok], y[ok]
    if len(y) < 3:
        return dict(difference=float("nan"), ci=[float("nan"), float("nan")], n=int(len(y)))
    diff = abs(kendalltau(x1, y).statistic) - abs(kendalltau(x2, y).statistic)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(y), size=(n_boot, len(y)))
    d = np.abs(kendall_tau_b(x1[idx], y[idx])) - np.abs(kendall_tau_b(x2[idx], y[idx]))
    d = d[np.isfinite(d)]
    a = (1 - level) / 2
    lo, hi = (np.quantile(d, [a, 1 - a]) if len(d) else (float("nan"), float("nan")))
    return dict(difference=float(diff), ci=[float(lo), float(hi)], n=int(len(y)))
