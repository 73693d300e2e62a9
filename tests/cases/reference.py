"""Independent references: the exact trust-region maximum of a quadratic, and a relative error."""
from __future__ import annotations

import numpy as np
from scipy.optimize import brentq


# ---------------------------------------------------------------------------------------------
# An independent reference: the exact trust-region maximum of a quadratic
# ---------------------------------------------------------------------------------------------

def trust_region_max(M, g, rho):
    """max_{‖δ‖ ≤ ρ} ½ δᵀMδ + gᵀδ for symmetric M (secular equation; generic g)."""
    w, V = np.linalg.eigh(M)
    c = V.T @ g
    if w[-1] <= 0 and np.linalg.norm(np.linalg.lstsq(-M, g, rcond=None)[0]) <= rho and np.all(w < 0):
        d = np.linalg.solve(-M, g)
        return 0.5 * d @ M @ d + g @ d
    lo = max(w[-1], 0.0) + 1e-14
    phi = lambda lam: np.linalg.norm(c / (lam - w)) - rho  # noqa: E731
    hi = lo + 1.0
    while phi(hi) > 0:
        hi *= 2
    lam = brentq(phi, lo + 1e-15 if phi(lo + 1e-15) > 0 else lo, hi, xtol=1e-15)
    d = V @ (c / (lam - w))
    return 0.5 * d @ M @ d + g @ d


def rel_error(a, b) -> float:
    """‖a − b‖ / ‖b‖ for tensors."""
    return float((a - b).norm() / b.norm())
