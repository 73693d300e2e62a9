# GENERATED FILE - DO NOT EDIT.
# Source: derivations (derivations.builtin: rope_interleaved / mix); symmetry 'rope_interleaved', metric 'mix'.
# Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py`.
"""Quotient-geometry kernels: RoPE subgroup of GL(h) (interleaved pairing) acting on (G, H) by (GA, HA^-T); preserves G R H^T for every rotation R; metric 'mix'.

Blocks: G (n, h), H (m, h). Every function broadcasts over leading batch dimensions.
Metric          g = Trace(G.T*G*xi_H.T*eta_H) + Trace(H.T*H*xi_G.T*eta_G)
Invariance      proved
Horizontal      C(ξ) = -G.T*G*xi_H.T*H + G.T*xi_G*H.T*H = 0
Projection      subalgebra
"""
import torch

from codegen import runtime as _rt

SYMMETRY = 'rope_interleaved'
METRIC = 'mix'
BLOCKS = ('G', 'H')
BLOCK_SHAPES = (('n', 'h'), ('m', 'h'))
GROUP = ('h', 'h')
POSITIVE_BLOCKS = False
ELEMENTWISE = False
PROJECTION_KIND = 'subalgebra'
SUBALGEBRA = 'rope'
PAIRING = 'interleaved'
ROTARY_DIM = None


def subalgebra_basis(h, rotary_dim=None):
    """Basis (E_k) of the subalgebra at head dimension h (``codegen.runtime.rope_basis``): per pair (i, j) of PAIRING over the first r coordinates I_p = e_i e_iᵀ + e_j e_jᵀ, J_p = e_i e_jᵀ − e_j e_iᵀ, then the elementary matrices of gl(h − r) on the free coordinates; dimension r + (h − r)².

    r = ``rotary_dim`` if given, else ROTARY_DIM if set, else h (full rotary)."""
    r = ROTARY_DIM if rotary_dim is None else rotary_dim
    return _rt.rope_basis(h, PAIRING, None if r is None or int(r) == h else int(r))


def _basis(G, rotary_dim, cache):
    """The basis for a call: from ``rotary_dim``, else from the cache's (they must agree), else the default."""
    if cache is not None:
        if rotary_dim is not None and subalgebra_basis(G.shape[-1], rotary_dim) is not cache.basis:
            raise ValueError(f'rotary_dim={rotary_dim} differs from that of the cache ({cache.rotary_dim}); '
                             'call prepare(..., rotary_dim=...) again')
        return cache.basis
    return subalgebra_basis(G.shape[-1], rotary_dim)


def random_group_element(ref, generator=None, scale=1.0, rotary_dim=None):
    """A random element A of the subgroup, shape ref.shape[:-2] + (h, h), times ``scale`` (for checks)."""
    r = ROTARY_DIM if rotary_dim is None else rotary_dim
    return _rt.random_rope_element(ref, PAIRING, r, generator=generator, scale=scale)


def prepare(G, H, eps=0.0, rotary_dim=None):
    """Per-base-point factors: Gram matrices + εI (and inverses), the subalgebra basis for ``rotary_dim`` and the inverse of the projection system M (dim 𝔨 × dim 𝔨).

    Compute once per base point and pass as ``cache=`` to the other kernels (they then take ``rotary_dim`` from it)."""
    GtG = _rt.gram(G, eps)
    GtG_inv = _rt.spd_inverse(GtG)
    HtH = _rt.gram(H, eps)
    HtH_inv = _rt.spd_inverse(HtH)
    basis = subalgebra_basis(G.shape[-1], rotary_dim)
    bp = _rt.BasePoint((G, H,), eps, GtG=GtG, GtG_inv=GtG_inv, HtH=HtH, HtH_inv=HtH_inv, basis=basis, rotary_dim=rotary_dim)
    parts = projection_factors(G, H, eps=eps, cache=bp)
    bp.subalgebra_M_inv = _rt.spd_inverse(_rt.subalgebra_system(parts[:1], parts[1:], basis))
    return bp


def inner(G, H, xi_G, xi_H, eta_G, eta_H, eps=0.0, cache=None):
    """g_θ(ξ, η) = Trace(G.T*G*xi_H.T*eta_H) + Trace(H.T*H*xi_G.T*eta_G)."""
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    return ((GtG @ xi_H.mT) * eta_H.mT).sum((-2, -1)) + ((HtH @ xi_G.mT) * eta_G.mT).sum((-2, -1))


def vertical(G, H, X):
    """Vertical vector v(X): G: G*X, H: -H*X.T."""
    return G @ X, H @ (-X.mT)


def horizontal_residual(G, H, xi_G, xi_H, eps=0.0, cache=None, rotary_dim=None):
    """P_𝔨 C(ξ): the Frobenius projection onto the subalgebra 𝔨 of C(ξ) = -G.T*G*xi_H.T*H + G.T*xi_G*H.T*H; ξ is horizontal (g-orthogonal to every v(X), X ∈ 𝔨) iff it is 0."""
    basis = _basis(G, rotary_dim, cache)
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    return _rt.subalgebra_project((G.mT @ xi_G) @ HtH - GtG @ (xi_H.mT @ H), basis)


def projection_factors(G, H, eps=0.0, cache=None):
    """Flat tuple (L_1, K_1) of C(v(Λ)) = Σ_i L_i Λ K_i (per-base-point h×h factors)."""
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    return 2 * GtG, HtH


def horizontal_lambda(G, H, xi_G, xi_H, eps=0.0, cache=None, rotary_dim=None):
    """Λ = Σ_l λ_l E_l in the subalgebra such that ξ − v(Λ) is horizontal: M λ = b with M_kl = ⟨E_k, (2*G.T*G) E_l (H.T*H)⟩ = g(v(E_l), v(E_k)) (symmetric positive definite) and b_k = ⟨E_k, C(ξ)⟩, C(ξ) = -G.T*G*xi_H.T*H + G.T*xi_G*H.T*H. A dim 𝔨 system per head (h for full-rotary RoPE), assembled from the h×h factors by ``_rt.subalgebra_system``; with a prepared cache one matrix-vector product."""
    basis = _basis(G, rotary_dim, cache)
    GtG = _rt.gram(G, eps) if cache is None else cache.GtG
    HtH = _rt.gram(H, eps) if cache is None else cache.HtH
    C = (G.mT @ xi_G) @ HtH - GtG @ (xi_H.mT @ H)
    if cache is not None:
        return _rt.solve_subalgebra(None, None, C, basis, M_inv=cache.subalgebra_M_inv)
    parts = projection_factors(G, H, eps=eps)
    return _rt.solve_subalgebra(parts[:1], parts[1:], C, basis)


def horizontal_projection(G, H, xi_G, xi_H, eps=0.0, cache=None, rotary_dim=None):
    """Horizontal part ξ − v(Λ) of ξ, Λ in the subalgebra (``rotary_dim``: see subalgebra_basis)."""
    Lam = horizontal_lambda(G, H, xi_G, xi_H, eps=eps, cache=cache, rotary_dim=rotary_dim)
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
