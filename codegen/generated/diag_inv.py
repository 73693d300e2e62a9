# GENERATED FILE - DO NOT EDIT.
# Source: derivations (derivations.builtin: elementwise_rescaling / inv); symmetry 'elementwise_rescaling', metric 'inv'.
# Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py`.
"""Quotient-geometry kernels: element-wise (u, v) -> (a u, v/a); preserves u v; metric 'inv'.

Blocks: elementwise. Every function broadcasts over leading batch dimensions.
Metric          g = eta_u*xi_u/u**2 + eta_v*xi_v/v**2
Invariance      proved
Horizontal      C(ξ) = -xi_v/v + xi_u/u = 0
Projection      explicit
"""
import torch

from codegen import runtime as _rt

SYMMETRY = 'elementwise_rescaling'
METRIC = 'inv'
BLOCKS = ('u', 'v')
BLOCK_SHAPES = ((), ())
GROUP = 'positive'
POSITIVE_BLOCKS = True
ELEMENTWISE = True
PROJECTION_KIND = 'explicit'


def inner(u, v, xi_u, xi_v, eta_u, eta_v):
    """g_θ(ξ, η) = eta_u*xi_u/u**2 + eta_v*xi_v/v**2."""
    return eta_u*xi_u/torch.pow(u, 2) + eta_v*xi_v/torch.pow(v, 2)


def vertical(u, v, x):
    """Vertical vector v(X): u: u*x, v: -v*x."""
    return u*x, -v*x


def horizontal_residual(u, v, xi_u, xi_v):
    """C(ξ) = -xi_v/v + xi_u/u; ξ is horizontal iff C(ξ) = 0."""
    return -xi_v/v + xi_u/u


def horizontal_lambda(u, v, xi_u, xi_v):
    """Λ such that ξ − v(Λ) is horizontal: Λ = C/2 with C = C(ξ)."""
    return -1/2*xi_v/v + (1/2)*xi_u/u


def horizontal_projection(u, v, xi_u, xi_v):
    """Horizontal part ξ − v(Λ) of ξ."""
    Lam = horizontal_lambda(u, v, xi_u, xi_v)
    v_u, v_v = vertical(u, v, Lam)
    return xi_u - v_u, xi_v - v_v


def riemannian_gradient(u, v, egrad_u, egrad_v):
    """Riemannian gradient 𝔾⁻¹(∇f): u: egrad_u*u**2, v: egrad_v*v**2."""
    return egrad_u*torch.pow(u, 2), egrad_v*torch.pow(v, 2)


def geodesic_acceleration(u, v, xi_u, xi_v):
    """γ̈(0) = −Γ(ξ, ξ): u: xi_u**2/u, v: xi_v**2/v."""
    return torch.pow(xi_u, 2)/u, torch.pow(xi_v, 2)/v


def second_order_geodesic(u, v, xi_u, xi_v):
    """Second-order geodesic E(ξ) = θ + ξ + ½ γ̈(0) (≈ γ_ξ(1), paper Eq. 4): u: u + xi_u + xi_u**2/(2*u), v: v + xi_v + xi_v**2/(2*v)."""
    return u + xi_u + (1/2)*torch.pow(xi_u, 2)/u, v + xi_v + (1/2)*torch.pow(xi_v, 2)/v


def second_order_geodesic_fwd(u, v, xi_u, xi_v):
    """Second-order geodesic E(ξ) and the (empty) tuple of products its VJP reuses."""
    return (*second_order_geodesic(u, v, xi_u, xi_v), ())


def second_order_geodesic_vjp(u, v, xi_u, xi_v, cot_u, cot_v, saved=None):
    """Vector-Jacobian product (∂E/∂ξ)ᵀ ū of second_order_geodesic for a cotangent ū = (cot_u, cot_v); ``saved`` is unused (element-wise): xi_u: cot_u + cot_u*xi_u/u, xi_v: cot_v + cot_v*xi_v/v."""
    return cot_u + cot_u*xi_u/u, cot_v + cot_v*xi_v/v


def act(u, v, a):
    """Group action ψ(A, θ): u: a*u, v: v/a."""
    return a*u, v/a
