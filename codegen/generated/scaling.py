# GENERATED FILE - DO NOT EDIT.
# Source: derivations (derivations.builtin: positive_scaling / scale_invariant); symmetry 'positive_scaling', metric 'scale_invariant'.
# Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py`.
"""Quotient-geometry kernels: W -> a W, a > 0; preserves W/||W||; metric 'scale_invariant'.

Blocks: W (n, k). Every function broadcasts over leading batch dimensions.
Metric          g = Trace(xi_W.T*eta_W)/Trace(W.T*W)
Invariance      proved
Horizontal      C(ξ) = Trace(xi_W.T*W)/Trace(W.T*W) = 0
Projection      explicit
"""
import torch

from codegen import runtime as _rt

SYMMETRY = 'positive_scaling'
METRIC = 'scale_invariant'
BLOCKS = ('W',)
BLOCK_SHAPES = (('n', 'k'),)
GROUP = 'positive'
POSITIVE_BLOCKS = False
ELEMENTWISE = False
PROJECTION_KIND = 'explicit'


def prepare(W, eps=0.0):
    """Per-base-point factors (Gram matrices + εI).

    Compute once per base point and pass as ``cache=`` to the other kernels: they then do no
    factorisation (results equal the uncached call to round-off)."""
    WtW = _rt.gram(W, eps)
    return _rt.BasePoint((W,), eps, WtW=WtW)


def inner(W, xi_W, eta_W, eps=0.0, cache=None):
    """g_θ(ξ, η) = Trace(xi_W.T*eta_W)/Trace(W.T*W)."""
    WtW = _rt.gram(W, eps) if cache is None else cache.WtW
    return ((xi_W.mT) * eta_W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1)


def vertical(W, x):
    """Vertical vector v(X): W: x*W."""
    return ((x)[..., None, None] * W,)


def horizontal_residual(W, xi_W, eps=0.0, cache=None):
    """C(ξ) = Trace(xi_W.T*W)/Trace(W.T*W); ξ is horizontal iff C(ξ) = 0."""
    WtW = _rt.gram(W, eps) if cache is None else cache.WtW
    return ((xi_W.mT) * W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1)


def horizontal_lambda(W, xi_W, eps=0.0, cache=None):
    """Λ such that ξ − v(Λ) is horizontal: Λ = C with C = C(ξ)."""
    WtW = _rt.gram(W, eps) if cache is None else cache.WtW
    return ((xi_W.mT) * W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1)


def horizontal_projection(W, xi_W, eps=0.0, cache=None):
    """Horizontal part ξ − v(Λ) of ξ."""
    Lam = horizontal_lambda(W, xi_W, eps=eps, cache=cache)
    v_W, = vertical(W, Lam)
    return xi_W - v_W,


def riemannian_gradient(W, egrad_W, eps=0.0, cache=None):
    """Riemannian gradient 𝔾⁻¹(∇f): W: Trace(W.T*W)*egrad_W."""
    WtW = _rt.gram(W, eps) if cache is None else cache.WtW
    return ((torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1))[..., None, None] * egrad_W,)


def geodesic_acceleration(W, xi_W, eps=0.0, cache=None):
    """γ̈(0) = −Γ(ξ, ξ): W: (-Trace(xi_W.T*xi_W)/Trace(W.T*W))*W + ((Trace(W.T*xi_W)/Trace(W.T*W) + Trace(xi_W.T*W)/Trace(W.T*W))*xi_W)."""
    WtW = _rt.gram(W, eps) if cache is None else cache.WtW
    return ((-((xi_W.mT) * xi_W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1))[..., None, None] * W + (((W.mT) * xi_W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1) + ((xi_W.mT) * W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1))[..., None, None] * xi_W,)


def second_order_geodesic(W, xi_W, eps=0.0, cache=None):
    """Second-order geodesic E(ξ) = θ + ξ + ½ γ̈(0) (≈ γ_ξ(1), paper Eq. 4): W: (1 - Trace(xi_W.T*xi_W)/(2*Trace(W.T*W)))*W + (1 + Trace(W.T*xi_W)/(2*Trace(W.T*W)) + Trace(xi_W.T*W)/(2*Trace(W.T*W)))*xi_W."""
    return second_order_geodesic_fwd(W, xi_W, eps=eps, cache=cache)[:-1]


def second_order_geodesic_fwd(W, xi_W, eps=0.0, cache=None):
    """Second-order geodesic E(ξ) and the products its VJP reuses: returns (E_W, saved) with saved = (), to pass to second_order_geodesic_vjp(..., saved=saved)."""
    WtW = _rt.gram(W, eps) if cache is None else cache.WtW
    return (-1/2*((xi_W.mT) * xi_W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1) + 1)[..., None, None] * W + ((1/2)*((W.mT) * xi_W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1) + (1/2)*((xi_W.mT) * W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1) + 1)[..., None, None] * xi_W, ()


def second_order_geodesic_vjp(W, xi_W, cot_W, eps=0.0, cache=None, saved=None):
    """Vector-Jacobian product (∂E/∂ξ)ᵀ ū of second_order_geodesic for a cotangent ū = (cot_W); ``saved`` from second_order_geodesic_fwd skips the products it holds: xi_W: (-Trace(cot_W.T*W)/Trace(W.T*W))*xi_W + (Trace(cot_W.T*xi_W)/Trace(W.T*W))*W + (1 + Trace(W.T*xi_W)/(2*Trace(W.T*W)) + Trace(xi_W.T*W)/(2*Trace(W.T*W)))*cot_W."""
    WtW = _rt.gram(W, eps) if cache is None else cache.WtW
    return (-((cot_W.mT) * W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1))[..., None, None] * xi_W + (((cot_W.mT) * xi_W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1))[..., None, None] * W + ((1/2)*((W.mT) * xi_W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1) + (1/2)*((xi_W.mT) * W.mT).sum((-2, -1))/torch.diagonal(WtW, dim1=-2, dim2=-1).sum(-1) + 1)[..., None, None] * cot_W,


def act(W, a):
    """Group action ψ(A, θ): W: a*W."""
    return ((a)[..., None, None] * W,)
