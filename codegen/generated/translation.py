# GENERATED FILE - DO NOT EDIT.
# Source: derivations (derivations.builtin: translation / euclidean); symmetry 'translation', metric 'euclidean'.
# Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py`.
"""Quotient-geometry kernels: w -> w + a 1; preserves w - mean(w); metric 'euclidean'.

Blocks: w (n, 1). Every function broadcasts over leading batch dimensions.
Metric          g = Trace(xi_w.T*eta_w)
Invariance      proved
Horizontal      C(ξ) = Trace(xi_w.T*1) = 0
Projection      explicit
"""
import torch

from codegen import runtime as _rt

SYMMETRY = 'translation'
METRIC = 'euclidean'
BLOCKS = ('w',)
BLOCK_SHAPES = (('n', '1'),)
GROUP = 'real'
POSITIVE_BLOCKS = False
ELEMENTWISE = False
PROJECTION_KIND = 'explicit'


def prepare(w, eps=0.0):
    """Per-base-point factors (Gram matrices + εI).

    Compute once per base point and pass as ``cache=`` to the other kernels: they then do no
    factorisation (results equal the uncached call to round-off)."""
    return _rt.BasePoint((w,), eps)


def inner(w, xi_w, eta_w, eps=0.0, cache=None):
    """g_θ(ξ, η) = Trace(xi_w.T*eta_w)."""
    return ((xi_w.mT) * eta_w.mT).sum((-2, -1))


def vertical(w, x):
    """Vertical vector v(X): w: x*1."""
    return ((x)[..., None, None] * (w.new_ones((w.shape[-2], 1))),)


def horizontal_residual(w, xi_w, eps=0.0, cache=None):
    """C(ξ) = Trace(xi_w.T*1); ξ is horizontal iff C(ξ) = 0."""
    return ((xi_w.mT) * (w.new_ones((w.shape[-2], 1))).mT).sum((-2, -1))


def horizontal_lambda(w, xi_w, eps=0.0, cache=None):
    """Λ such that ξ − v(Λ) is horizontal: Λ = C/n with C = C(ξ)."""
    return ((xi_w.mT) * (w.new_ones((w.shape[-2], 1))).mT).sum((-2, -1))/w.shape[-2]


def horizontal_projection(w, xi_w, eps=0.0, cache=None):
    """Horizontal part ξ − v(Λ) of ξ."""
    Lam = horizontal_lambda(w, xi_w, eps=eps, cache=cache)
    v_w, = vertical(w, Lam)
    return xi_w - v_w,


def riemannian_gradient(w, egrad_w, eps=0.0, cache=None):
    """Riemannian gradient 𝔾⁻¹(∇f): w: egrad_w."""
    return (egrad_w,)


def geodesic_acceleration(w, xi_w, eps=0.0, cache=None):
    """γ̈(0) = −Γ(ξ, ξ): w: 0."""
    return (w.new_zeros(w.shape[:-2] + (w.shape[-2], 1)),)


def second_order_geodesic(w, xi_w, eps=0.0, cache=None):
    """Second-order geodesic E(ξ) = θ + ξ + ½ γ̈(0) (≈ γ_ξ(1), paper Eq. 4): w: w + xi_w."""
    return second_order_geodesic_fwd(w, xi_w, eps=eps, cache=cache)[:-1]


def second_order_geodesic_fwd(w, xi_w, eps=0.0, cache=None):
    """Second-order geodesic E(ξ) and the products its VJP reuses: returns (E_w, saved) with saved = (), to pass to second_order_geodesic_vjp(..., saved=saved)."""
    return w + xi_w, ()


def second_order_geodesic_vjp(w, xi_w, cot_w, eps=0.0, cache=None, saved=None):
    """Vector-Jacobian product (∂E/∂ξ)ᵀ ū of second_order_geodesic for a cotangent ū = (cot_w); ``saved`` from second_order_geodesic_fwd skips the products it holds: xi_w: cot_w."""
    return cot_w,


def act(w, a):
    """Group action ψ(A, θ): w: a*1 + w."""
    return ((a)[..., None, None] * (w.new_ones((w.shape[-2], 1))) + w,)
