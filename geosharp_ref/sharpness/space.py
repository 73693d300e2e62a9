"""The perturbation space of a whole model (paper Appendix C): GL(h) pairs in their quotient geometry, the rest adaptive.

    S(θ) = max_{ξ horizontal, ‖ξ‖ ≤ ρ}  L_B(γ_ξ(1)) − L_B(θ),   averaged over batches B.

* **adaptive** (Kwon et al. 2021; Andriushchenko et al. 2023): γ_ξ(1) = θ + ξ, ξ = |θ| ⊙ δ, the norm is
  ‖δ‖₂ = ‖ξ ⊘ |θ|‖₂; every parameter is perturbed unless excluded.
* **geodesic** (paper Algorithm 1): every GL(h) attention pair (per head, from
  :func:`geosharp_ref.symmetry.symmetry_map`) uses its quotient geometry (``inv`` or ``mix``),
  γ_ξ(1) ≈ θ + ξ + ½ γ̈(0) with γ̈(0) = −Γ(ξ, ξ) from the generated kernels, ξ horizontal; all other
  parameters use the adaptive recipe; ‖ξ‖² = Σ_pairs g(ξ, ξ) + Σ_rest ‖ξ ⊘ |θ|‖².

The maximisation is Auto-PGD (:mod:`geosharp_ref.apgd`) on ξ. The ascent direction is the horizontal
Riemannian gradient 𝔾_θ⁻¹ ∇_ξ F of F(ξ) = L(γ_ξ(1)), with ∇_ξ F from autograd through the geodesic
map (to first order this is Algorithm 1's gradient at the perturbed weights, converted at θ).

Gradient: ``gradient="exact"`` (default) differentiates F(ξ) = L(θ + ξ + ½γ̈(ξ)) in ξ (the generated
VJP of the correction); ``gradient="perturbed"`` uses ∇L at the perturbed weights as the gradient in ξ,
as the paper's Algorithm 1 does (drops the ξ-derivative of ½γ̈: the same ascent direction to first
order in ξ, and no backward pass through the correction: 10 fewer n·h² products per pair).

Cost (Auto-PGD's default path, :meth:`PerturbationSpace.value_and_grad`): the pair blocks E(ξ) enter
the model as leaves, so the backward pass stops at the cotangent ū = ∂L/∂E; the ascent direction
P 𝔾⁻¹ (∂E/∂ξ)ᵀ ū is then evaluated on block combinations Σ Bᵢ Cᵢ (:mod:`geosharp_ref.lazy_blocks`),
reusing the forward's Gram products. Auto-PGD's iterates are :class:`Iterate` objects that carry
their Gram products Gᵀξ, ξᵀξ from the step that formed them (:meth:`PerturbationSpace.lincomb`) to
their norm and the next forward pass. Per pair and iteration (mix, exact gradient): 4 n·h² products
for E, 4 + 6 for d, 2 for g(d, d) (dᵀd), 2 for the new iterate's norm (ξᵀξ, reused by the next
forward pass): 18 instead of 26 through autograd.

Ablations (paper App. G): ``geodesic_correction=False`` uses γ_ξ(1) = θ + ξ; ``metric_norm=False``
measures and steps the pair components in the Frobenius norm (still projected horizontally).

The model's parameters are never modified (``torch.func.functional_call`` on new tensors).
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch

from ..apgd import combine, lincomb, radial_clip, value_and_grad
from ..geometry import AdaptiveGeometry, gl_pair
from ..lazy_blocks import GramTable

__all__ = ["PerturbationSpace", "CotangentGradient", "Iterate", "GRADIENTS"]

#: how the gradient in ξ is taken (see the module doc)
GRADIENTS = ("exact", "perturbed")


# ------------------------------------------------------------------------------------------------
# The perturbation space
# ------------------------------------------------------------------------------------------------

def _euclidean_pairing(xi, egrad):
    """Σ ⟨ξ, ∇⟩_F over a list of tensors (a 0-dim tensor)."""
    if isinstance(egrad, CotangentGradient):
        raise TypeError("a CotangentGradient holds cotangents at the perturbed weights, not ∂F/∂ξ; use "
                        "PerturbationSpace.ascent_step(xi, grad), which returns ⟨ξ, ∂F/∂ξ⟩_F")
    total = 0.0
    for x, g in zip(xi, egrad):
        total = total + torch.dot(x.reshape(-1), g.reshape(-1).to(x.dtype))
    return torch.as_tensor(total)


class CotangentGradient(list):
    """The gradient :meth:`PerturbationSpace.value_and_grad` returns: one tensor per component of ξ.

    Pair components hold the cotangent ū = ∂L/∂E at the perturbed blocks E(ξ) = θ + ξ + ½γ̈(ξ), not
    ∂F/∂ξ = (∂E/∂ξ)ᵀ ū: the space applies (∂E/∂ξ)ᵀ (``gradient="exact"``) together with 𝔾⁻¹ and the
    horizontal projection in :meth:`PerturbationSpace.ascent_step`, on combinations of blocks
    (:mod:`geosharp_ref.lazy_blocks`), which is cheaper than forming ∂F/∂ξ. Adaptive components hold
    ∂F/∂ξ. ``point`` is the ξ it was evaluated at; ``tables`` the forward pass's Gram tables, one per
    pair bucket (Gᵀξ_G, ξ_Gᵀξ_G, … reused by the ascent step)."""

    def __init__(self, items, point, tables):
        super().__init__(items)
        self.point = list(point)
        self.tables = tables


class Iterate(list):
    """A tangent vector (one tensor per component of ξ, as everywhere) that carries, per pair bucket,
    a :class:`~geosharp_ref.lazy_blocks.GramTable` whose blocks "xi_G", "xi_H" are its own pair
    blocks and which already knows their Gram products with the base point, Gᵀξ_G and Hᵀξ_H (and
    ξ_Gᵀξ_G, ξ_Hᵀξ_H once its norm was taken). :meth:`PerturbationSpace.lincomb` builds it from
    those of its terms (h×h work), :meth:`PerturbationSpace.inner` takes its norm from ξᵀξ alone and
    the forward pass of :meth:`PerturbationSpace.value_and_grad` reuses all of them: per pair and
    Auto-PGD iteration two n·h² products (Gᵀξ_G, Hᵀξ_H) and the norm's two element-wise passes are
    saved, and the norm's ξ_Gᵀξ_G, ξ_Hᵀξ_H serve the forward pass as well. Any other operation on
    it gives a plain list (the products are then computed again where needed)."""

    def __init__(self, items, space, tables):
        super().__init__(items)
        self.space, self.tables = space, tables

    def scaled(self, s):
        """s·ξ with its Gram products scaled by s and s² (used by the radial clip)."""
        return self.space._scaled_iterate(self, s)


class PerturbationSpace:
    """Tangent space at θ: GL(h) pair components (per group, all heads stacked) + adaptive rest.

    A tangent vector is a list ``[ξ_G¹, ξ_H¹, …, ξ_G^K, ξ_H^K, ξ_a¹, …]`` following ``self.groups``
    then ``self.adaptive_names``."""

    def __init__(self, params: dict, groups=(), adaptive_masks=None, metric: Optional[str] = None,
                 eps: float = 0.0, geodesic_correction: bool = True, metric_norm: bool = True,
                 gradient: str = "exact",
                 adaptive_offset: float = 0.0, exclude: Iterable[str] = ()):
        self.base = params
        self.groups = list(groups)
        self.geometry = gl_pair(metric, eps) if (metric and self.groups) else None
        self.geodesic_correction = geodesic_correction
        if gradient not in GRADIENTS:
            raise ValueError(f"unknown gradient {gradient!r}; choose one of {GRADIENTS} ('exact' differentiates "
                             "through the geodesic correction, 'perturbed' is the paper's Algorithm 1)")
        self.gradient = gradient
        self.metric_norm = metric_norm
        self.adaptive = AdaptiveGeometry(adaptive_offset)
        self.pairs = [g.extract(params) for g in self.groups]
        exclude = set(exclude)
        unknown = sorted(exclude - set(params))
        if unknown:
            raise ValueError(f"exclude names unknown parameters {unknown}; names come from model.named_parameters()")
        masks = adaptive_masks if adaptive_masks is not None else {n: None for n in params}
        self.adaptive_names = [n for n in masks if n not in exclude and params[n].is_floating_point()]
        self.masks = [masks[n] for n in self.adaptive_names]
        # Per-space caches (they depend on the base point only): c² (the adaptive Riemannian gradient
        # is c² ⊙ ∇, one pass; c itself is only needed for a random start), the movable mask c > 0
        # and the adaptive metric's weight w = 1/c² on movable coordinates, 0 elsewhere, so
        # inner/projection do not rebuild them per call; the adaptive part of g(ξ, η) is then one
        # product and one dot per tensor, Σ ⟨ξ ⊙ w, η⟩.
        self._scale2 = []
        for n, m in zip(self.adaptive_names, self.masks):
            c = self.adaptive.scale(params[n])
            c = c if m is None else c * m.to(c.dtype)
            self._scale2.append(c * c)
        self._pos = [c2 > 0 for c2 in self._scale2]
        self._inv_scale2 = [torch.where(p, c2, torch.inf).reciprocal() for p, c2 in zip(self._pos, self._scale2)]
        # Groups whose (G, H) share shapes/dtype/device are stacked along the head dimension so each
        # generated kernel runs once per bucket instead of once per layer (pays off on GPUs, where
        # the per-call launch overhead dominates; on CPU the concatenation copies cost about what the
        # saved calls do, so ``stack_groups=None`` enables it on non-CPU devices only).
        self._buckets = self._make_buckets(self.stack_groups)
        self._check_pairs()
        # Base-point factors (Gram matrices, inverses, the inv metric's Sylvester eigendecomposition),
        # one cache per bucket, built once and reused by every kernel call of the Auto-PGD run.
        self._caches = [self.geometry.prepare(G, H) for _, G, H, _ in self._buckets] \
            if self.geometry is not None and self.cache_factors else []
        # the exact Gram matrices GᵀG, HᵀH (no relaxation) per bucket, seeded into the Gram tables of
        # the cotangent path (value_and_grad / ascent_step) so no iteration recomputes them
        self._base_grams = [(G.mT @ G, H.mT @ H) for _, G, H, _ in self._buckets] if self._caches else []

    @property
    def scales(self):
        """The adaptive scales c = |θ| (+ offset, masked), one tensor per adaptive parameter."""
        return [c2.sqrt() for c2 in self._scale2]

    #: True: always stack equal-shaped groups; False: never; None: only on non-CPU devices.
    stack_groups: Optional[bool] = None
    #: Reuse per-base-point factors (Gram inverses, Sylvester eigendecomposition) across all kernel
    #: calls of the run (default); False recomputes them in every call (the reference path).
    cache_factors: bool = True

    def _make_buckets(self, stack):
        if not self.pairs:
            return []
        if stack is None:
            stack = self.pairs[0][0].device.type != "cpu"
        if not stack:
            return [([i], G, H, [G.shape[0]]) for i, (G, H) in enumerate(self.pairs)]
        keys = {}
        for i, (G, H) in enumerate(self.pairs):
            keys.setdefault((tuple(G.shape[1:]), tuple(H.shape[1:]), G.dtype, G.device), []).append(i)
        buckets = []
        for idx in keys.values():
            Gs = [self.pairs[i][0] for i in idx]
            Hs = [self.pairs[i][1] for i in idx]
            G = Gs[0] if len(idx) == 1 else torch.cat(Gs)
            H = Hs[0] if len(idx) == 1 else torch.cat(Hs)
            buckets.append((idx, G, H, [g.shape[0] for g in Gs]))
        return buckets

    def _bucket_args(self, idx, t):
        """(ξ_G, ξ_H) of a bucket from a tangent list ``t`` (concatenated along heads when stacked)."""
        if len(idx) == 1:
            return t[2 * idx[0]], t[2 * idx[0] + 1]
        return torch.cat([t[2 * i] for i in idx]), torch.cat([t[2 * i + 1] for i in idx])

    @staticmethod
    def _split_back(out, res, idx, sizes):
        """Store a bucket's result ``res`` (a tensor or a tuple of tensors/tuples) per group in ``out``."""
        if len(idx) == 1:
            out[idx[0]] = res
            return
        parts = [r.split(sizes) if torch.is_tensor(r) else [x.split(sizes) for x in r] for r in res] \
            if isinstance(res, tuple) else res.split(sizes)
        for j, i in enumerate(idx):
            out[i] = tuple(p[j] for p in parts) if isinstance(res, tuple) else parts[j]

    def _pair_map(self, fn, *tangents):
        """Apply ``fn(G, H, *per-tangent (ξ_G, ξ_H))`` bucket-wise; returns a list over groups of
        fn's outputs (split back per group)."""
        out = [None] * len(self.pairs)
        for b, (idx, G, H, sizes) in enumerate(self._buckets):
            args = [self._bucket_args(idx, t) for t in tangents]
            res = fn(G, H, *args, cache=self._caches[b]) if self._caches else fn(G, H, *args)
            self._split_back(out, res, idx, sizes)
        return out

    def _check_pairs(self):
        for grp, (G, H) in zip(self.groups, self.pairs):
            for name, X in (("G", G), ("H", H)):
                S = X.mT @ X
                ev = torch.linalg.eigvalsh(S)
                eps = self.geometry.eps if self.geometry else 0.0
                bad = (ev[..., 0] + eps) <= 1e-12 * ev[..., -1].clamp_min(1e-300)
                if bool(bad.any()):
                    heads = bad.nonzero().flatten().tolist()
                    raise ValueError(
                        f"{grp.key}: {name} is rank deficient for heads {heads} "
                        f"(smallest eigenvalue of {name}ᵀ{name} {float(ev[..., 0].min()):.3g}); "
                        "pass a relaxation eps > 0 (paper App. H.2), e.g. eps=1e-6"
                    )

    # -- vectors ---------------------------------------------------------------------------------
    def zeros(self):
        out = []
        for G, H in self.pairs:
            out += [torch.zeros_like(G), torch.zeros_like(H)]
        return out + [torch.zeros_like(self.base[n]) for n in self.adaptive_names]

    def random(self, rho, generator=None):
        """Random start drawn equivariantly: (W_G G, W_H H) with W random square matrices transforms
        like a tangent vector under (G A, H A⁻ᵀ), so invariance of the result is preserved."""
        out = []
        dev = self.base[next(iter(self.base))].device
        for G, H in self.pairs:
            for X in (G, H):
                W = torch.randn(X.shape[:-2] + (X.shape[-2], X.shape[-2]), generator=generator,
                                dtype=X.dtype).to(dev) / math.sqrt(X.shape[-2])
                out.append(W @ X)
        for c in self.scales:
            out.append(c * torch.randn(c.shape, generator=generator, dtype=c.dtype).to(dev))
        u = float(torch.rand((), generator=generator))
        return self._scale_to(self.project_horizontal(out), rho * u)

    def _split(self, xi):
        k = 2 * len(self.groups)
        return xi[:k], xi[k:]

    def inner(self, xi, eta):
        px, ax = self._split(xi)
        pe, ae = self._split(eta)
        total = 0.0
        if xi is eta and self._carries_grams(xi):  # g(ξ, ξ) from the Grams ξᵀξ (one n·h² product each)
            for b, table in enumerate(xi.tables):
                total = total + self._norm_sq(table, b)
        elif self.geometry is not None and self.metric_norm:
            for v in self._pair_map(self.geometry.inner, px, pe):
                total = total + v.sum()
        else:
            for i in range(len(self.pairs)):
                a, b = (px[2 * i], px[2 * i + 1]), (pe[2 * i], pe[2 * i + 1])
                total = total + (a[0] * b[0]).sum() + (a[1] * b[1]).sum()
        for w, x, e in zip(self._inv_scale2, ax, ae):
            total = total + torch.dot((x * w).reshape(-1), e.reshape(-1))
        return total

    def norm(self, xi):
        return float(self.inner(xi, xi)) ** 0.5

    def project_horizontal(self, xi):
        px, ax = self._split(xi)
        if self.geometry is not None:
            out = [x for pair in self._pair_map(self.geometry.project_horizontal, px) for x in pair]
        else:
            out = list(px)
        return out + [x * p for p, x in zip(self._pos, ax)]

    def _scale_to(self, xi, radius):
        n = self.norm(xi)
        return xi if n == 0 else [x * (radius / n) for x in xi]

    def project(self, xi, rho):
        """Horizontal projection, then radially into the ball ‖ξ‖ ≤ ρ (see :meth:`clip`)."""
        return self.clip(self.project_horizontal(xi), rho)

    def clip(self, xi, rho):
        """Radially into the ball only: ξ · min(1, ρ/‖ξ‖), for ξ already horizontal (e.g. a linear
        combination of projected vectors, as in the Auto-PGD updates); no horizontal projection
        (:func:`geosharp_ref.apgd.radial_clip`: no host synchronisation on accelerators)."""
        return radial_clip(xi, self.inner(xi, xi), rho)[0]

    @property
    def gradient_pairing(self):
        """``(ξ, ∇) ↦ Σ ⟨ξ, ∇⟩_F``, which equals g(ξ, ascent_direction(∇)) for every ξ in the space
        (ξ horizontal and zero on immovable coordinates): the ascent direction is P 𝔾⁻¹∇ with P the
        g-orthogonal horizontal projection, so g(ξ, P𝔾⁻¹∇) = g(ξ, 𝔾⁻¹∇) = ⟨ξ, ∇⟩_F. Auto-PGD uses it
        for the norms of its steps. None for the Frobenius-norm ablation (``metric_norm=False``),
        whose ascent direction is not a Riemannian gradient of that norm."""
        if self.geometry is not None and not self.metric_norm:
            return None
        return _euclidean_pairing

    def ascent_direction(self, xi, egrad):
        """Horizontal Riemannian gradient P 𝔾_θ⁻¹ ∇ at the base point θ (∇ = ∂F/∂ξ, or a
        :class:`CotangentGradient`, whose pair parts are first mapped by (∂E/∂ξ)ᵀ)."""
        if isinstance(egrad, CotangentGradient):
            return self.ascent_step(xi, egrad)[0]
        pg, ag = self._split(egrad)
        if self.geometry is not None and self.metric_norm:
            out = [x for pair in self._pair_map(self.geometry.riemannian_gradient, pg) for x in pair]
        else:
            out = list(pg)
        out = self.project_horizontal(out)  # the pair components only
        return out + [c2 * g for c2, g in zip(self._scale2, ag)]  # c² = 0 on immovable coordinates

    def ascent_step(self, xi, egrad):
        """(d, ‖d‖², ⟨ξ, ∇⟩_F) with d = :meth:`ascent_direction` — what one Auto-PGD step needs
        (:func:`geosharp_ref.apgd.apgd_step`); ‖d‖² = g(d, d) = ⟨d, ∇⟩_F and ⟨ξ, ∇⟩_F = g(ξ, d) (see
        :attr:`gradient_pairing`).

        For a :class:`CotangentGradient` the pair parts are computed per bucket on block combinations
        (:mod:`geosharp_ref.lazy_blocks`): ∇ = (∂E/∂ξ)ᵀ ū, 𝔾⁻¹∇ and its horizontal projection run the
        generated ``second_order_geodesic_vjp``, ``riemannian_gradient`` and ``horizontal_projection``
        on Spans over {θ, ξ, ū}, so only d itself is formed (per pair: the VJP's 4 Gram products, 6 for
        d, 2 for g(d, d) (the Grams dᵀd) in place of 10 + 2 + 4 and element-wise passes); ⟨ξ, ∇⟩_F
        comes from the Gram tables (h×h work). There d is returned as an :class:`Iterate` carrying
        Gᵀd_G, Hᵀd_H (h×h work on the Spans), from which :meth:`lincomb` builds the next iterate's
        products."""
        if not isinstance(egrad, CotangentGradient):
            d = self.ascent_direction(xi, egrad)
            return d, _euclidean_pairing(d, egrad), _euclidean_pairing(xi, egrad)
        px, ax = self._split(xi)
        pg, ag = self._split(egrad)
        if any(a is not b for a, b in zip(px, self._split(egrad.point)[0])):
            raise ValueError("the CotangentGradient was evaluated at a different point than the ξ given; "
                             "pass the point it came from (Auto-PGD keeps them together)")
        K, eps = self.geometry.kernels, self.geometry.eps
        blocks, d_tables = [], []
        dd = xd = 0.0
        for b, (idx, G, H, sizes) in enumerate(self._buckets):
            table, cache = egrad.tables[b], self._caches[b]
            sG, sH, sxG, sxH = (table.span(k) for k in ("G", "H", "xi_G", "xi_H"))
            if "cot_G" not in table.blocks:  # first ascent step from this gradient
                cG, cH = self._bucket_args(idx, pg)
                table.block("cot_G", cG), table.block("cot_H", cH)
            scG, scH = table.span("cot_G"), table.span("cot_H")
            vjp = self.gradient == "exact" and self.geodesic_correction
            if vjp:
                g_G, g_H = K.second_order_geodesic_vjp(sG, sH, sxG, sxH, scG, scH, eps=eps, cache=cache)
            else:  # ∂E/∂ξ = I (no correction) or the paper's gradient at the perturbed weights
                g_G, g_H = scG, scH
            r_G, r_H = K.riemannian_gradient(sG, sH, g_G, g_H, eps=eps, cache=cache)
            d_G, d_H = K.horizontal_projection(sG, sH, r_G, r_H, eps=eps, cache=cache)
            GtD, HtD = sG.mT @ d_G, sH.mT @ d_H  # for the iterate Auto-PGD forms from d (h×h work)
            d_G, d_H = d_G.materialize(), d_H.materialize()
            xd = xd + (g_G.frobenius_with_block("xi_G") + g_H.frobenius_with_block("xi_H")).sum()
            blocks.append((d_G, d_H))
            d_tables.append(self._iterate_table(b, d_G, d_H, GtD, HtD))
            dd = dd + self._norm_sq(d_tables[-1], b)  # ‖d‖² = g(d, d) from dᵀd (∇ is not formed)
        d_a = [c2 * g for c2, g in zip(self._scale2, ag)]  # c² = 0 on immovable coordinates
        dd = dd + _euclidean_pairing(d_a, ag)
        xd = xd + _euclidean_pairing(ax, ag)
        return self._from_buckets(blocks, d_tables, d_a), torch.as_tensor(dd), torch.as_tensor(xd)

    # -- iterates that carry their Gram products ------------------------------------------------
    def _carries_grams(self, xi):
        return isinstance(xi, Iterate) and xi.space is self  # only the cotangent path makes them

    def _iterate_table(self, b, XG, XH, GtX=None, HtX=None):
        """A Gram table for the bucket-b pair blocks (XG, XH) of a tangent vector, with GᵀG, HᵀH known
        and GᵀX_G, HᵀX_H when given."""
        _, G, H, _ = self._buckets[b]
        table = GramTable()
        for name, X in (("G", G), ("H", H), ("xi_G", XG), ("xi_H", XH)):
            table.block(name, X)
        for name, gram in zip(("G", "H"), self._base_grams[b]):
            table.seed(name, name, gram)
        if GtX is not None:
            table.seed("G", "xi_G", GtX)
            table.seed("H", "xi_H", HtX)
        return table

    def _norm_sq(self, table, b):
        """g(ξ, ξ) summed over bucket b's heads for the table's blocks "xi_G", "xi_H": the generated
        metric on Spans, which needs only the Grams ξ_Gᵀξ_G, ξ_Hᵀξ_H (one n·h² product per side)."""
        spans = [table.span(k) for k in ("G", "H", "xi_G", "xi_H", "xi_G", "xi_H")]
        return self.geometry.kernels.inner(*spans, eps=self.geometry.eps, cache=self._caches[b]).sum()

    def _known_blocks(self, v, b):
        """(X_G, X_H, GᵀX_G, HᵀX_H) of vector ``v`` in bucket b: from its table when it carries one,
        else computed (two n·h² products)."""
        if self._carries_grams(v):
            t = v.tables[b]
            return t.blocks["xi_G"], t.blocks["xi_H"], t.gram("G", "xi_G"), t.gram("H", "xi_H")
        idx, G, H, _ = self._buckets[b]
        XG, XH = self._bucket_args(idx, self._split(v)[0])
        return XG, XH, G.mT @ XG, H.mT @ XH

    def _from_buckets(self, bucket_blocks, tables, adaptive):
        pairs = [None] * len(self.pairs)
        for (idx, _, _, sizes), blocks in zip(self._buckets, bucket_blocks):
            self._split_back(pairs, blocks, idx, sizes)
        return Iterate([x for pair in pairs for x in pair] + list(adaptive), self, tables)

    def lincomb(self, terms):
        """Σᵢ cᵢ ξᵢ (``terms`` = [(cᵢ, ξᵢ)], cᵢ numbers or 0-d tensors), as Auto-PGD forms its next
        iterate. On the cotangent path (:attr:`uses_cotangents`) the result is an :class:`Iterate`:
        Gᵀ(Σ cᵢ ξᵢ) = Σ cᵢ Gᵀξᵢ comes from the terms' tables (h×h work), so neither the norm nor the
        next forward pass computes it."""
        if not self.uses_cotangents:
            return lincomb(terms)
        k = 2 * len(self.pairs)
        adaptive = [combine([(c, v[j]) for c, v in terms]) for j in range(k, len(terms[0][1]))]
        blocks, tables = [], []
        for b in range(len(self._buckets)):
            known = [self._known_blocks(v, b) for _, v in terms]
            XG = combine([(c, kn[0]) for (c, _), kn in zip(terms, known)])
            XH = combine([(c, kn[1]) for (c, _), kn in zip(terms, known)])
            GtX = sum(c * kn[2] for (c, _), kn in zip(terms, known))
            HtX = sum(c * kn[3] for (c, _), kn in zip(terms, known))
            blocks.append((XG, XH))
            tables.append(self._iterate_table(b, XG, XH, GtX, HtX))
        return self._from_buckets(blocks, tables, adaptive)

    def _scaled_iterate(self, xi, s):
        """s·ξ (:meth:`lincomb` of one term) keeping ξ's own Grams as well, scaled by s²."""
        out = self.lincomb([(s, xi)])
        for t, new in zip(xi.tables, out.tables):
            for name in ("xi_G", "xi_H"):
                if t.has_gram(name, name):
                    new.seed(name, name, t.gram(name, name) * (s * s))
        return out

    # -- the perturbed model ---------------------------------------------------------------------
    @property
    def uses_cotangents(self):
        """True when :meth:`value_and_grad` returns a :class:`CotangentGradient` (GL(h) pairs measured
        in their metric with cached base-point factors: the Auto-PGD default)."""
        return self.geometry is not None and self.metric_norm and bool(self._caches)

    def _assemble(self, new_pairs, ax):
        """θ with the pair blocks replaced by ``new_pairs`` [(G', H'), …] and ξ added to the adaptive
        parameters (masked)."""
        params = dict(self.base)
        for grp, (Gn, Hn) in zip(self.groups, new_pairs):
            params = grp.insert(params, Gn, Hn)
        for n, m, x in zip(self.adaptive_names, self.masks, ax):
            params[n] = params[n] + (x if m is None else x * m.to(x.dtype))
        return params

    def perturbed_params(self, xi):
        """The model's parameters at γ_ξ(1) (a new dict; differentiable in ξ)."""
        px, ax = self._split(xi)
        if self.geometry is not None and self.geodesic_correction and self.gradient == "perturbed":
            with torch.no_grad():  # value θ + ξ + ½γ̈, derivative in ξ the identity (straight through)
                E = self._pair_map(self.geometry.exp2, px)
            new = [(EG + (px[2 * i] - px[2 * i].detach()), EH + (px[2 * i + 1] - px[2 * i + 1].detach()))
                   for i, (EG, EH) in enumerate(E)]
        elif self.geometry is not None and self.geodesic_correction:
            new = self._pair_map(self.geometry.exp2, px)
        else:
            new = [(G + px[2 * i], H + px[2 * i + 1]) for i, (G, H) in enumerate(self.pairs)]
        return self._assemble(new, ax)

    def value_and_grad(self, loss_of_params):
        """``f_and_grad(ξ) -> (F(ξ), gradient)`` for Auto-PGD, F(ξ) = ``loss_of_params(params at γ_ξ(1))``.

        With :attr:`uses_cotangents` the gradient is a :class:`CotangentGradient`: the pair blocks
        E(ξ) are computed without autograd (generated ``second_order_geodesic`` on Spans, so the Gram
        products Gᵀξ_G, ξ_Gᵀξ_G, … land in a table the ascent step reuses) and enter the model as
        leaves, so the backward pass stops at ū = ∂L/∂E. Otherwise it is ∂F/∂ξ from autograd through
        :meth:`perturbed_params` (:func:`geosharp_ref.apgd.value_and_grad`)."""
        if not self.uses_cotangents:
            return value_and_grad(lambda xi: loss_of_params(self.perturbed_params(xi)))
        K, eps = self.geometry.kernels, self.geometry.eps

        def f_and_grad(xi):
            px, ax = self._split(xi)
            new, tables = [None] * len(self.pairs), []
            px = [x.detach() for x in px]
            carried = self._carries_grams(xi)
            with torch.no_grad():
                for b, (idx, G, H, sizes) in enumerate(self._buckets):
                    if carried:  # Gᵀξ_G, ξ_Gᵀξ_G, … known from the Auto-PGD step that formed ξ
                        table = xi.tables[b].copy()
                        xG, xH = table.blocks["xi_G"], table.blocks["xi_H"]
                    else:
                        xG, xH = self._bucket_args(idx, px)
                        table = self._iterate_table(b, xG, xH)
                    if self.geodesic_correction:
                        E = K.second_order_geodesic(*(table.span(k) for k in ("G", "H", "xi_G", "xi_H")),
                                                    eps=eps, cache=self._caches[b])
                        E = tuple(e.materialize() for e in E)
                    else:
                        E = (G + xG, H + xH)
                    tables.append(table)
                    self._split_back(new, E, idx, sizes)
            k = 2 * len(self.pairs)
            value, grads = value_and_grad(  # autograd stops at the blocks E (leaves) and ξ_adaptive
                lambda v: loss_of_params(self._assemble(list(zip(v[0:k:2], v[1:k:2])), v[k:])))(
                [e for pair in new for e in pair] + list(ax))
            return value, CotangentGradient(grads, xi, tables)
        return f_and_grad
