# GENERATED FILE - DO NOT EDIT.
# Source: derivations (derivations.builtin: gl_pair / mix); symmetry 'gl_pair', metric 'mix'.
# Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py`.
"""Quotient-geometry kernels: GL(h) acting on (G, H) by (GA, HA^-T); preserves G H^T; metric 'mix'.

Blocks: G (n, h), H (m, h). Every function broadcasts over leading batch dimensions.
Metric          g = Trace(G.T*G*xi_H.T*eta_H) + Trace(H.T*H*xi_G.T*eta_G)
Invariance      proved
Horizontal      C(ξ) = -G.T*G*xi_H.T*H + G.T*xi_G*H.T*H = 0
Projection      explicit
"""
import torch

from codegen import runtime as _rt

SYMMETRY = 'gl_pair'
METRIC = 'mix'
BLOCKS = ('G', 'H')
BLOCK_SHAPES = (('n', 'h'), ('m', 'h'))
GROUP = ('h', 'h')
POSITIVE_BLOCKS = False
ELEMENTWISE = False
PROJECTION_KIND = 'explicit'


def inner(G, H, xi_G, xi_H, eta_G, eta_H, eps=0.0):
    """g_θ(ξ, η) = Trace(G.T*G*xi_H.T*eta_H) + Trace(H.T*H*xi_G.T*eta_G)."""
    GtG = _rt.gram(G, eps)
    HtH = _rt.gram(H, eps)
    return ((GtG @ xi_H.mT) * eta_H.mT).sum((-2, -1)) + ((HtH @ xi_G.mT) * eta_G.mT).sum((-2, -1))


def vertical(G, H, X):
    """Vertical vector v(X): G: G*X, H: -H*X.T."""
    return G @ X, -(H @ X.mT)


def horizontal_residual(G, H, xi_G, xi_H, eps=0.0):
    """C(ξ) = -G.T*G*xi_H.T*H + G.T*xi_G*H.T*H; ξ is horizontal iff C(ξ) = 0."""
    GtG = _rt.gram(G, eps)
    HtH = _rt.gram(H, eps)
    return (G.mT) @ (xi_G @ HtH) - (GtG @ ((xi_H.mT) @ H))


def horizontal_lambda(G, H, xi_G, xi_H, eps=0.0):
    """Λ such that ξ − v(Λ) is horizontal: Λ = (1/2)*(G.T*G)^-1*C*(H.T*H)^-1 with C = C(ξ)."""
    GtG = _rt.gram(G, eps)
    GtG_chol = torch.linalg.cholesky(GtG)
    HtH = _rt.gram(H, eps)
    HtH_chol = torch.linalg.cholesky(HtH)
    return -1/2 * (torch.cholesky_solve(((xi_H.mT) @ H).mT, HtH_chol).mT) + 1/2 * (torch.cholesky_solve((G.mT) @ xi_G, GtG_chol))


def horizontal_projection(G, H, xi_G, xi_H, eps=0.0):
    """Horizontal part ξ − v(Λ) of ξ."""
    Lam = horizontal_lambda(G, H, xi_G, xi_H, eps=eps)
    v_G, v_H = vertical(G, H, Lam)
    return xi_G - v_G, xi_H - v_H


def riemannian_gradient(G, H, egrad_G, egrad_H, eps=0.0):
    """Riemannian gradient 𝔾⁻¹(∇f): G: egrad_G*(H.T*H)^-1, H: egrad_H*(G.T*G)^-1."""
    GtG = _rt.gram(G, eps)
    GtG_chol = torch.linalg.cholesky(GtG)
    HtH = _rt.gram(H, eps)
    HtH_chol = torch.linalg.cholesky(HtH)
    return torch.cholesky_solve(egrad_G.mT, HtH_chol).mT, torch.cholesky_solve(egrad_H.mT, GtG_chol).mT


def geodesic_acceleration(G, H, xi_G, xi_H, eps=0.0):
    """γ̈(0) = −Γ(ξ, ξ): G: G*xi_H.T*xi_H*(H.T*H)^-1 - xi_G*H.T*xi_H*(H.T*H)^-1 - xi_G*xi_H.T*H*(H.T*H)^-1, H: H*xi_G.T*xi_G*(G.T*G)^-1 - xi_H*G.T*xi_G*(G.T*G)^-1 - xi_H*xi_G.T*G*(G.T*G)^-1."""
    GtG = _rt.gram(G, eps)
    GtG_chol = torch.linalg.cholesky(GtG)
    HtH = _rt.gram(H, eps)
    HtH_chol = torch.linalg.cholesky(HtH)
    return torch.cholesky_solve((G @ ((xi_H.mT) @ xi_H) - (xi_G @ ((H.mT) @ xi_H)) - (xi_G @ ((xi_H.mT) @ H))).mT, HtH_chol).mT, torch.cholesky_solve((H @ ((xi_G.mT) @ xi_G) - (xi_H @ ((G.mT) @ xi_G)) - (xi_H @ ((xi_G.mT) @ G))).mT, GtG_chol).mT


def act(G, H, A):
    """Group action ψ(A, θ): G: G*A, H: H*A.T^-1."""
    return G @ A, torch.linalg.solve(A.mT, H, left=False)
