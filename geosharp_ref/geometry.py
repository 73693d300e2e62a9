"""Geometries used by the evaluator, built on the generated kernels (no SymPy at run time).

:func:`gl_pair` wraps ``codegen.generated.gl_inv`` / ``gl_mix`` — the quotient geometry of a GL(h)
pair (G, H) ↦ (G A, H A⁻ᵀ) — as a small manifold-like object in the style of pymanopt/geoopt.
Tangent vectors are tuples ``(xi_G, xi_H)``; every call broadcasts over leading dimensions
(layers × heads): G (..., n, h), H (..., m, h).

============================  ======================================================
``inner(G, H, xi, eta)``      g_θ(ξ, η), shape (...)
``norm(G, H, xi)``            √g_θ(ξ, ξ)
``project_horizontal``        ξ − v(Λ) with v(Λ) = (GΛ, −HΛᵀ) the vertical part
``riemannian_gradient``       𝔾⁻¹(∇_G, ∇_H)  (inv: (∇_G GᵀG, ∇_H HᵀH); mix: (∇_G (HᵀH)⁻¹, ∇_H (GᵀG)⁻¹))
``geodesic_acceleration``     γ̈(0) = −Γ(ξ, ξ)
``exp2(G, H, xi)``            θ + ξ + ½ γ̈(0), the second-order geodesic (paper Eq. 4), with the
                              generated VJP as its autograd backward
``act(G, H, A)``              (G A, H A⁻ᵀ)
============================  ======================================================

Base-point cache: everything that depends on θ only (Gram matrices, their inverses, for ``inv`` the
eigendecomposition behind the Sylvester projection) is computed by ``prepare(G, H)`` once; every
method takes it as ``cache=`` and then runs as a few batched matmuls (Auto-PGD keeps one cache per
run). Results equal the uncached call to round-off; the cache must come from the same (G, H, ε).

Relaxation ε (paper App. H.2): every Gram matrix XᵀX is replaced by XᵀX + εI. ε = 0 (default) is
exact and keeps invariance to round-off; heads whose G or H is (numerically) rank deficient need
ε > 0 — small against the spectrum of XᵀX (e.g. 1e-6 · mean eigenvalue) so results do not move.

:class:`AdaptiveGeometry` is the element-wise geometry of adaptive sharpness (Kwon et al. 2021,
Andriushchenko et al. 2023): a perturbation ξ = c ⊙ δ with c = |w| (+ offset), norm ‖ξ ⊘ c‖₂,
Riemannian gradient c² ⊙ ∇, flat (no geodesic correction).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import METRICS, check_metric, gl_kernels, load_kernels

__all__ = ["GLPairGeometry", "gl_pair", "AdaptiveGeometry", "METRICS"]



@dataclass(frozen=True)
class GLPairGeometry:
    """Quotient geometry of GL(h) pairs under the ``inv`` or ``mix`` metric (see module doc)."""

    metric: str
    eps: float = 0.0

    @property
    def kernels(self):
        return load_kernels(gl_kernels(self.metric))

    def _check(self, G, H, *tangents):
        if G.shape[:-2] != H.shape[:-2] or G.shape[-1] != H.shape[-1]:
            raise ValueError(f"G {tuple(G.shape)} and H {tuple(H.shape)} must share batch dims and h")
        for t, ref, name in tangents:
            if t.shape != ref.shape:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}")

    def prepare(self, G, H):
        """Per-base-point factors for ``cache=`` (see module doc); compute once per (G, H)."""
        self._check(G, H)
        return self.kernels.prepare(G, H, eps=self.eps)

    def _cache(self, G, H, cache):
        return None if cache is None else cache.check(G, H, eps=self.eps)

    def inner(self, G, H, xi, eta, cache=None):
        self._check(G, H, (xi[0], G, "xi_G"), (xi[1], H, "xi_H"), (eta[0], G, "eta_G"), (eta[1], H, "eta_H"))
        return self.kernels.inner(G, H, *xi, *eta, eps=self.eps, cache=self._cache(G, H, cache))

    def norm(self, G, H, xi, cache=None):
        return self.inner(G, H, xi, xi, cache=cache).clamp_min(0).sqrt()

    def project_horizontal(self, G, H, xi, cache=None):
        self._check(G, H, (xi[0], G, "xi_G"), (xi[1], H, "xi_H"))
        return self.kernels.horizontal_projection(G, H, *xi, eps=self.eps, cache=self._cache(G, H, cache))

    def horizontal_residual(self, G, H, xi, cache=None):
        return self.kernels.horizontal_residual(G, H, *xi, eps=self.eps, cache=self._cache(G, H, cache))

    def riemannian_gradient(self, G, H, egrad, cache=None):
        self._check(G, H, (egrad[0], G, "egrad_G"), (egrad[1], H, "egrad_H"))
        return self.kernels.riemannian_gradient(G, H, *egrad, eps=self.eps, cache=self._cache(G, H, cache))

    def geodesic_acceleration(self, G, H, xi, cache=None):
        self._check(G, H, (xi[0], G, "xi_G"), (xi[1], H, "xi_H"))
        return self.kernels.geodesic_acceleration(G, H, *xi, eps=self.eps, cache=self._cache(G, H, cache))

    def exp2(self, G, H, xi, cache=None):
        """Second-order geodesic γ(1) ≈ E(ξ) = θ + ξ + ½ γ̈(0) (generated ``second_order_geodesic``).

        Differentiable in ξ through the generated vector-Jacobian product
        ``second_order_geodesic_vjp`` (derived symbolically; 10 n·h² products with the forward's
        Gᵀξ_G, Hᵀξ_H reused, against autograd's 12 plus the element-wise passes of θ + ξ + ½γ̈);
        when G or H itself requires a gradient,
        autograd differentiates the generated formula instead."""
        self._check(G, H, (xi[0], G, "xi_G"), (xi[1], H, "xi_H"))
        cache = self._cache(G, H, cache)
        if (not torch.is_grad_enabled() or G.requires_grad or H.requires_grad
                or not (xi[0].requires_grad or xi[1].requires_grad)):
            return self.kernels.second_order_geodesic(G, H, *xi, eps=self.eps, cache=cache)
        out = _SecondOrderGeodesic.apply(self.kernels, self.eps, cache, G, H, xi[0], xi[1])
        return out[0], out[1]

    def act(self, G, H, A):
        return self.kernels.act(G, H, A)


class _SecondOrderGeodesic(torch.autograd.Function):
    """E(ξ) with the generated VJP as its backward (ξ differentiable; G, H constants).

    Outputs (E_G, E_H, *saved): ``second_order_geodesic_fwd`` also returns the n·h² products its
    VJP reuses (Gᵀξ_G, Hᵀξ_H), kept for the backward (non-differentiable outputs). The backward is
    built from torch operations, so higher derivatives (``create_graph=True``, which recomputes the
    saved products) are autograd's derivatives of the VJP formula."""

    @staticmethod
    def forward(kernels, eps, cache, G, H, xi_G, xi_H):
        E_G, E_H, saved = kernels.second_order_geodesic_fwd(G, H, xi_G, xi_H, eps=eps, cache=cache)
        return (E_G, E_H, *saved)

    @staticmethod
    def setup_context(ctx, inputs, output):
        kernels, eps, cache, G, H, xi_G, xi_H = inputs
        ctx.kernels, ctx.eps, ctx.cache = kernels, eps, cache
        ctx.mark_non_differentiable(*output[2:])
        ctx.save_for_backward(G, H, xi_G, xi_H, *output[2:])

    @staticmethod
    def backward(ctx, cot_G, cot_H, *_):
        G, H, xi_G, xi_H, *saved = ctx.saved_tensors
        cot_G = torch.zeros_like(G) if cot_G is None else cot_G
        cot_H = torch.zeros_like(H) if cot_H is None else cot_H
        # under create_graph the saved products are recomputed, so their dependence on ξ is tracked
        saved = None if torch.is_grad_enabled() else tuple(saved)
        gG, gH = ctx.kernels.second_order_geodesic_vjp(G, H, xi_G, xi_H, cot_G, cot_H, eps=ctx.eps,
                                                       cache=ctx.cache, saved=saved)
        return None, None, None, None, None, gG, gH


def gl_pair(metric: str = "mix", eps: float = 0.0) -> GLPairGeometry:
    """The quotient geometry of GL(h) pairs; ``metric`` in {"inv", "mix"}, relaxation ``eps`` ≥ 0."""
    check_metric(metric)
    if not eps >= 0:
        raise ValueError(f"relaxation eps must be >= 0, got {eps}")
    return GLPairGeometry(metric, float(eps))


@dataclass(frozen=True)
class AdaptiveGeometry:
    """Element-wise adaptive geometry: ξ = c ⊙ δ, c = |w| + offset, ‖ξ‖ = ‖ξ ⊘ c‖₂.

    Coordinates with c = 0 cannot move (their ξ is 0 and contributes 0 to the norm)."""

    offset: float = 0.0

    def scale(self, w):
        return w.abs() + self.offset

    def inner(self, w, xi, eta):
        c = self.scale(w)
        safe = torch.where(c > 0, c, torch.ones_like(c))
        return torch.where(c > 0, xi * eta / safe**2, torch.zeros_like(c)).sum()

    def riemannian_gradient(self, w, egrad):
        return self.scale(w) ** 2 * egrad
