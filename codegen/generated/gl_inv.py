# GENERATED FILE - DO NOT EDIT.
# Source: derivations (derivations.builtin: gl_pair / inv); symmetry 'gl_pair', metric 'inv'.
# Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py`.
"""Quotient-geometry kernels: GL(h) acting on (G, H) by (GA, HA^-T); preserves G H^T; metric 'inv'.

Blocks: G (n, h), H (m, h). Every function broadcasts over leading batch dimensions.
Metric          g = Trace((G.T*G)^-1*xi_G.T*eta_G) + Trace((H.T*H)^-1*xi_H.T*eta_H)
Invariance      proved
Horizontal      C(ξ) = -(H.T*H)^-1*xi_H.T*H + G.T*xi_G*(G.T*G)^-1 = 0
Projection      sylvester
"""
import torch

from codegen import runtime as _rt

SYMMETRY = 'gl_pair'
METRIC = 'inv'
BLOCKS = ('G', 'H')
BLOCK_SHAPES = (('n', 'h'), ('m', 'h'))
GROUP = ('h', 'h')
POSITIVE_BLOCKS = False
ELEMENTWISE = False
PROJECTION_KIND = 'sylvester'


def inner(G, H, xi_G, xi_H, eta_G, eta_H, eps=0.0):
    """g_θ(ξ, η) = Trace((G.T*G)^-1*xi_G.T*eta_G) + Trace((H.T*H)^-1*xi_H.T*eta_H)."""
    GtG = _rt.gram(G, eps)
    GtG_chol = torch.linalg.cholesky(GtG)
    HtH = _rt.gram(H, eps)
    HtH_chol = torch.linalg.cholesky(HtH)
    return ((torch.cholesky_solve(xi_G.mT, GtG_chol)) * eta_G.mT).sum((-2, -1)) + ((torch.cholesky_solve(xi_H.mT, HtH_chol)) * eta_H.mT).sum((-2, -1))


def vertical(G, H, X):
    """Vertical vector v(X): G: G*X, H: -H*X.T."""
    return G @ X, -(H @ X.mT)


def horizontal_residual(G, H, xi_G, xi_H, eps=0.0):
    """C(ξ) = -(H.T*H)^-1*xi_H.T*H + G.T*xi_G*(G.T*G)^-1; ξ is horizontal iff C(ξ) = 0."""
    GtG = _rt.gram(G, eps)
    GtG_chol = torch.linalg.cholesky(GtG)
    HtH = _rt.gram(H, eps)
    HtH_chol = torch.linalg.cholesky(HtH)
    return torch.cholesky_solve(((G.mT) @ xi_G).mT, GtG_chol).mT - (torch.cholesky_solve((xi_H.mT) @ H, HtH_chol))


def sylvester_system(G, H, xi_G, xi_H, eps=0.0):
    """(S₁, S₂, C') of P Λ + Λ P = C' with P = S₁ S₂ = H.T*H*G.T*G, C' = H.T*H*C*G.T*G."""
    GtG = _rt.gram(G, eps)
    HtH = _rt.gram(H, eps)
    return HtH, GtG, HtH @ ((G.mT) @ xi_G) - ((xi_H.mT) @ (H @ GtG))


def horizontal_lambda(G, H, xi_G, xi_H, eps=0.0):
    """Λ such that ξ − v(Λ) is horizontal: solves the Sylvester equation of sylvester_system (batched)."""
    S1, S2, Cp = sylvester_system(G, H, xi_G, xi_H, eps=eps)
    return _rt.solve_sylvester_spd_product(S1, S2, Cp)


def horizontal_projection(G, H, xi_G, xi_H, eps=0.0):
    """Horizontal part ξ − v(Λ) of ξ."""
    Lam = horizontal_lambda(G, H, xi_G, xi_H, eps=eps)
    v_G, v_H = vertical(G, H, Lam)
    return xi_G - v_G, xi_H - v_H


def riemannian_gradient(G, H, egrad_G, egrad_H, eps=0.0):
    """Riemannian gradient 𝔾⁻¹(∇f): G: egrad_G*G.T*G, H: egrad_H*H.T*H."""
    GtG = _rt.gram(G, eps)
    HtH = _rt.gram(H, eps)
    return egrad_G @ GtG, egrad_H @ HtH


def geodesic_acceleration(G, H, xi_G, xi_H, eps=0.0):
    """γ̈(0) = −Γ(ξ, ξ): G: -G*(G.T*G)^-1*xi_G.T*xi_G + xi_G*(G.T*G)^-1*G.T*xi_G + xi_G*(G.T*G)^-1*xi_G.T*G, H: -H*(H.T*H)^-1*xi_H.T*xi_H + xi_H*(H.T*H)^-1*H.T*xi_H + xi_H*(H.T*H)^-1*xi_H.T*H."""
    GtG = _rt.gram(G, eps)
    GtG_chol = torch.linalg.cholesky(GtG)
    HtH = _rt.gram(H, eps)
    HtH_chol = torch.linalg.cholesky(HtH)
    return xi_G @ torch.cholesky_solve((G.mT) @ xi_G, GtG_chol) + xi_G @ torch.cholesky_solve((xi_G.mT) @ G, GtG_chol) - (G @ torch.cholesky_solve((xi_G.mT) @ xi_G, GtG_chol)), xi_H @ torch.cholesky_solve((H.mT) @ xi_H, HtH_chol) + xi_H @ torch.cholesky_solve((xi_H.mT) @ H, HtH_chol) - (H @ torch.cholesky_solve((xi_H.mT) @ xi_H, HtH_chol))


def act(G, H, A):
    """Group action ψ(A, θ): G: G*A, H: H*A.T^-1."""
    return G @ A, torch.linalg.solve(A.mT, H, left=False)
