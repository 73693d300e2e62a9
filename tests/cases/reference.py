"""Independent references: the exact trust-region maximum of a quadratic, the dense Hessian on a horizontal space,
and a relative error."""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import brentq
from torch.nn.attention import SDPBackend, sdpa_kernel

from geosharp_ref.sharpness import model_loss


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


# ---------------------------------------------------------------------------------------------
# An independent reference: the Riemannian Hessian from dense float64 matrices
# ---------------------------------------------------------------------------------------------

#: trace and eigenvalues of a Hessian operator vs :func:`dense_horizontal_hessian`, relative (observed trace ≤ 3e-16)
DENSE_TOL = 1e-9


def dense_horizontal_hessian(space, model, batch):
    """(eigenvalues of Hess L on the horizontal space, ascending; its dimension) from dense float64 matrices:
    B = ∇²_ξ L(E(ξ))|₀, 𝔾 = ∇²_ξ ½g(ξ, ξ), P from project_horizontal on the coordinate vectors."""
    shapes = [t.shape for t in space.zeros()]
    sizes = [int(np.prod(s)) for s in shapes]
    N = sum(sizes)

    def tangent(v):
        out, i = [], 0
        for s, k in zip(shapes, sizes):
            out.append(v[i:i + k].reshape(s))
            i += k
        return out

    zero = torch.zeros(N, dtype=torch.float64)
    with sdpa_kernel([SDPBackend.MATH]):  # the fused attention kernels have no double backward
        B = torch.autograd.functional.hessian(
            lambda v: model_loss(model, space.perturbed_params(tangent(v)), batch), zero)
    Gm = torch.autograd.functional.hessian(lambda v: 0.5 * space.inner(tangent(v), tangent(v)), zero)
    P = torch.stack([torch.cat([x.reshape(-1) for x in space.project_horizontal(tangent(e))])
                     for e in torch.eye(N, dtype=torch.float64)], 1)
    U, s, _ = torch.linalg.svd(P)
    V = U[:, s > 1e-8 * s[0]]  # a basis of the horizontal space
    K = V.T @ Gm @ V
    L = torch.linalg.cholesky(K)
    Li = torch.linalg.inv(L)
    A = Li @ (V.T @ B @ V) @ Li.T
    return torch.linalg.eigvalsh(0.5 * (A + A.T)), V.shape[1]
