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


def prepare(G, H, eps=0.0):
    """Per-base-point factors (Gram matrices + εI and their inverses).

    Compute once per base point and pass as ``cache=`` to the other kernels: they then do no
    factorisation (results equal the uncached call to round-off)."""
    GtG = _rt.gram(G, eps)
    GtG_inv = _rt.spd_inverse(GtG)
    HtH = _rt.gram(H, eps)
    HtH_inv = _rt.spd_inverse(HtH)
    return _rt.BasePoint((G, H,), eps, GtG=GtG, GtG_inv=GtG_inv, HtH=HtH, HtH_inv=HtH_inv)


def inner(G, H, xi_G, xi_H, eta_G, eta_H, eps=0.0, cache=None):
    """g_θ(ξ, η) = Trace(G.T*G*xi_H.T*eta_H) + Trace(H.T*H*xi_G.T*eta_G)."""
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    return ((GtG @ xi_H.mT) * eta_H.mT).sum((-2, -1)) + ((HtH @ xi_G.mT) * eta_G.mT).sum((-2, -1))


def vertical(G, H, X):
    """Vertical vector v(X): G: G*X, H: -H*X.T."""
    return G @ X, H @ (-X.mT)


def horizontal_residual(G, H, xi_G, xi_H, eps=0.0, cache=None):
    """C(ξ) = -G.T*G*xi_H.T*H + G.T*xi_G*H.T*H; ξ is horizontal iff C(ξ) = 0."""
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    return (G.mT @ xi_G) @ HtH - GtG @ (xi_H.mT @ H)


def horizontal_lambda(G, H, xi_G, xi_H, eps=0.0, cache=None):
    """Λ such that ξ − v(Λ) is horizontal: Λ = (1/2)*(G.T*G)^-1*C*(H.T*H)^-1 with C = C(ξ)."""
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    GtG_inv = _rt.spd_inverse(GtG) if cache is None else cache.GtG_inv
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    HtH_inv = _rt.spd_inverse(HtH) if cache is None else cache.HtH_inv
    return 1/2 * (GtG_inv @ (G.mT @ xi_G)) - 1/2 * ((xi_H.mT @ H) @ HtH_inv)


def horizontal_projection(G, H, xi_G, xi_H, eps=0.0, cache=None):
    """Horizontal part ξ − v(Λ) of ξ."""
    Lam = horizontal_lambda(G, H, xi_G, xi_H, eps=eps, cache=cache)
    v_G, v_H = vertical(G, H, Lam)
    return xi_G - v_G, xi_H - v_H


def riemannian_gradient(G, H, egrad_G, egrad_H, eps=0.0, cache=None):
    """Riemannian gradient 𝔾⁻¹(∇f): G: egrad_G*(H.T*H)^-1, H: egrad_H*(G.T*G)^-1."""
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    GtG_inv = _rt.spd_inverse(GtG) if cache is None else cache.GtG_inv
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    HtH_inv = _rt.spd_inverse(HtH) if cache is None else cache.HtH_inv
    return egrad_G @ HtH_inv, egrad_H @ GtG_inv


def geodesic_acceleration(G, H, xi_G, xi_H, eps=0.0, cache=None):
    """γ̈(0) = −Γ(ξ, ξ): G: G*xi_H.T*xi_H*(H.T*H)^-1 - xi_G*H.T*xi_H*(H.T*H)^-1 - xi_G*xi_H.T*H*(H.T*H)^-1, H: H*xi_G.T*xi_G*(G.T*G)^-1 - xi_H*G.T*xi_G*(G.T*G)^-1 - xi_H*xi_G.T*G*(G.T*G)^-1."""
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    GtG_inv = _rt.spd_inverse(GtG) if cache is None else cache.GtG_inv
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    HtH_inv = _rt.spd_inverse(HtH) if cache is None else cache.HtH_inv
    t0 = G.mT @ xi_G
    t1 = H.mT @ xi_H
    return G @ ((xi_H.mT @ xi_H) @ HtH_inv) + xi_G @ ((-t1 - t1.mT) @ HtH_inv), H @ ((xi_G.mT @ xi_G) @ GtG_inv) + xi_H @ ((-t0 - t0.mT) @ GtG_inv)


def second_order_geodesic(G, H, xi_G, xi_H, eps=0.0, cache=None):
    """Second-order geodesic E(ξ) = θ + ξ + ½ γ̈(0) (≈ γ_ξ(1), paper Eq. 4): G: G + (1/2)*G*xi_H.T*xi_H*(H.T*H)^-1 + xi_G - (1/2)*xi_G*H.T*xi_H*(H.T*H)^-1 - (1/2)*xi_G*xi_H.T*H*(H.T*H)^-1, H: H + (1/2)*H*xi_G.T*xi_G*(G.T*G)^-1 + xi_H - (1/2)*xi_H*G.T*xi_G*(G.T*G)^-1 - (1/2)*xi_H*xi_G.T*G*(G.T*G)^-1."""
    return second_order_geodesic_fwd(G, H, xi_G, xi_H, eps=eps, cache=cache)[:-1]


def second_order_geodesic_fwd(G, H, xi_G, xi_H, eps=0.0, cache=None):
    """Second-order geodesic E(ξ) and the products its VJP reuses: returns (E_G, E_H, saved) with saved = (t1, t3), to pass to second_order_geodesic_vjp(..., saved=saved)."""
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    GtG_inv = _rt.spd_inverse(GtG) if cache is None else cache.GtG_inv
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    HtH_inv = _rt.spd_inverse(HtH) if cache is None else cache.HtH_inv
    t1 = G.mT @ xi_G
    t3 = H.mT @ xi_H
    return xi_G @ (torch.eye(G.shape[-1], dtype=G.dtype, device=G.device) + (-1/2 * t3 - 1/2 * t3.mT) @ HtH_inv) + G @ (1/2 * ((xi_H.mT @ xi_H) @ HtH_inv) + torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)), xi_H @ (torch.eye(G.shape[-1], dtype=G.dtype, device=G.device) + (-1/2 * t1 - 1/2 * t1.mT) @ GtG_inv) + H @ (1/2 * ((xi_G.mT @ xi_G) @ GtG_inv) + torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)), (t1, t3)


def second_order_geodesic_vjp(G, H, xi_G, xi_H, cot_G, cot_H, eps=0.0, cache=None, saved=None):
    """Vector-Jacobian product (∂E/∂ξ)ᵀ ū of second_order_geodesic for a cotangent ū = (cot_G, cot_H); ``saved`` from second_order_geodesic_fwd skips the products it holds: xi_G: -(1/2)*G*(G.T*G)^-1*cot_H.T*xi_H - (1/2)*G*xi_H.T*cot_H*(G.T*G)^-1 + cot_G - (1/2)*cot_G*(H.T*H)^-1*H.T*xi_H - (1/2)*cot_G*(H.T*H)^-1*xi_H.T*H + (1/2)*xi_G*(G.T*G)^-1*cot_H.T*H + (1/2)*xi_G*H.T*cot_H*(G.T*G)^-1, xi_H: -(1/2)*H*(H.T*H)^-1*cot_G.T*xi_G - (1/2)*H*xi_G.T*cot_G*(H.T*H)^-1 + cot_H - (1/2)*cot_H*(G.T*G)^-1*G.T*xi_G - (1/2)*cot_H*(G.T*G)^-1*xi_G.T*G + (1/2)*xi_H*(H.T*H)^-1*cot_G.T*G + (1/2)*xi_H*G.T*cot_G*(H.T*H)^-1."""
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    GtG_inv = _rt.spd_inverse(GtG) if cache is None else cache.GtG_inv
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    HtH_inv = _rt.spd_inverse(HtH) if cache is None else cache.HtH_inv
    if saved is None:
        t1 = G.mT @ xi_G
        t3 = H.mT @ xi_H
    else:
        t1, t3 = saved
    t0 = G.mT @ cot_G
    t2 = H.mT @ cot_H
    t4 = cot_G.mT @ xi_G
    t5 = cot_H.mT @ xi_H
    return G @ (-1/2 * (GtG_inv @ t5) - 1/2 * (t5.mT @ GtG_inv)) + cot_G @ (torch.eye(G.shape[-1], dtype=G.dtype, device=G.device) + HtH_inv @ (-1/2 * t3 - 1/2 * t3.mT)) + xi_G @ (1/2 * (GtG_inv @ t2.mT) + 1/2 * (t2 @ GtG_inv)), H @ (-1/2 * (HtH_inv @ t4) - 1/2 * (t4.mT @ HtH_inv)) + cot_H @ (torch.eye(G.shape[-1], dtype=G.dtype, device=G.device) + GtG_inv @ (-1/2 * t1 - 1/2 * t1.mT)) + xi_H @ (1/2 * (HtH_inv @ t0.mT) + 1/2 * (t0 @ HtH_inv))


def act(G, H, A):
    """Group action ψ(A, θ): G: G*A, H: H*A.T^-1."""
    return G @ A, torch.linalg.solve(A.mT, H, left=False)
