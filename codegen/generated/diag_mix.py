# GENERATED FILE - DO NOT EDIT.
# Source: derivations (derivations.builtin: elementwise_rescaling / mix); symmetry 'elementwise_rescaling', metric 'mix'.
# Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py`.
"""Quotient-geometry kernels: element-wise (u, v) -> (a u, v/a); preserves u v; metric 'mix'.

Blocks: elementwise. Every function broadcasts over leading batch dimensions.
Metric          g = eta_u*v**2*xi_u + eta_v*u**2*xi_v
Invariance      proved
Horizontal      C(ξ) = -u**2*v*xi_v + u*v**2*xi_u = 0
Projection      explicit
"""
import torch

from codegen import runtime as _rt

SYMMETRY = 'elementwise_rescaling'
METRIC = 'mix'
BLOCKS = ('u', 'v')
BLOCK_SHAPES = ((), ())
GROUP = 'positive'
POSITIVE_BLOCKS = True
ELEMENTWISE = True
PROJECTION_KIND = 'explicit'


def inner(u, v, xi_u, xi_v, eta_u, eta_v):
    """g_θ(ξ, η) = eta_u*v**2*xi_u + eta_v*u**2*xi_v."""
    return eta_u*torch.pow(v, 2)*xi_u + eta_v*torch.pow(u, 2)*xi_v


def vertical(u, v, x):
    """Vertical vector v(X): u: u*x, v: -v*x."""
    return u*x, -v*x


def horizontal_residual(u, v, xi_u, xi_v):
    """C(ξ) = -u**2*v*xi_v + u*v**2*xi_u; ξ is horizontal iff C(ξ) = 0."""
    return -torch.pow(u, 2)*v*xi_v + u*torch.pow(v, 2)*xi_u


def horizontal_lambda(u, v, xi_u, xi_v):
    """Λ such that ξ − v(Λ) is horizontal: Λ = C/(2*u**2*v**2) with C = C(ξ)."""
    return -1/2*xi_v/v + (1/2)*xi_u/u


def horizontal_projection(u, v, xi_u, xi_v):
    """Horizontal part ξ − v(Λ) of ξ."""
    Lam = horizontal_lambda(u, v, xi_u, xi_v)
    v_u, v_v = vertical(u, v, Lam)
    return xi_u - v_u, xi_v - v_v


def riemannian_gradient(u, v, egrad_u, egrad_v):
    """Riemannian gradient 𝔾⁻¹(∇f): u: egrad_u/v**2, v: egrad_v/u**2."""
    return egrad_u/torch.pow(v, 2), egrad_v/torch.pow(u, 2)


def geodesic_acceleration(u, v, xi_u, xi_v):
    """γ̈(0) = −Γ(ξ, ξ): u: u*xi_v**2/v**2 - 2*xi_u*xi_v/v, v: -2*xi_u*xi_v/u + v*xi_u**2/u**2."""
    t0 = 2*xi_u*xi_v
    return -t0/v + u*torch.pow(xi_v, 2)/torch.pow(v, 2), -t0/u + v*torch.pow(xi_u, 2)/torch.pow(u, 2)


def act(u, v, a):
    """Group action ψ(A, θ): u: a*u, v: v/a."""
    return a*u, v/a
