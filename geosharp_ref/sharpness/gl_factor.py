"""The fast ``gl_inv`` / ``gl_mix`` factor: all GL(h) attention pair groups of one metric (paper Appendix C).

Mathematically the product of one generated ``gl_<metric>`` :class:`~geosharp_ref.sharpness.factors.Factor`
per pair group (``GLPairFactor.generic()`` returns exactly those, and the tests compare the two to
round-off); it overrides the factor hooks with a faster implementation of the same formulas:

* **buckets**: groups whose (G, H) share shapes, dtype and device are stacked along the head dimension, so
  each generated kernel runs once per bucket instead of once per group (pays off on GPUs, where the launch
  overhead dominates; on the CPU the concatenations cost about what the saved calls do, so ``stack=None``
  stacks on non-CPU devices only);
* **base-point caches**: Gram matrices, inverses and the inv metric's Sylvester eigendecomposition, once per
  bucket (the generated ``prepare``), and the exact Grams GᵀG, HᵀH seeded into every Gram table;
* **lazy blocks** (:mod:`geosharp_ref.lazy_blocks`): E(ξ) and the ascent direction
  P 𝔾⁻¹ (∂E/∂ξ)ᵀ ū run the generated ``second_order_geodesic``, ``second_order_geodesic_vjp``,
  ``riemannian_gradient`` and ``horizontal_projection`` on block combinations Σ Bᵢ Cᵢ over {θ, ξ, ū}, so
  only the results are formed and every Gram product is computed once;
* **Gram-carrying vectors**: the factor's state of a tangent vector (:class:`~geosharp_ref.sharpness.space.Tangent`)
  is one :class:`~geosharp_ref.lazy_blocks.GramTable` per bucket holding its blocks "xi_G", "xi_H" and their
  Gram products with the base point Gᵀξ_G, Hᵀξ_H (and ξ_Gᵀξ_G, ξ_Hᵀξ_H once its norm was taken).
  ``lincomb`` builds them from those of its terms (h×h work: Gᵀ(Σ cᵢ ξᵢ) = Σ cᵢ Gᵀξᵢ), ``inner(ξ, ξ)`` takes
  the metric norm from ξᵀξ alone, and ``forward`` reuses all of them.

Per pair and Auto-PGD iteration (mix, exact gradient): 4 n·h² products for E, 4 + 6 for d, 2 for g(d, d),
2 for the new iterate's norm (reused by the next forward pass): 18 instead of 26 through autograd.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..apgd import combine
from ..geometry import gl_pair
from ..kernels import gl_kernels
from ..lazy_blocks import GramTable
from ..symmetry import PairGroup
from .exact_geodesic import GeodesicPart
from .factors import Factor, check_rank, random_tangent_like
from .space import SpaceOptions

__all__ = ["GLPairFactor", "GLPairFactorAt", "gl_pair_factors"]


@dataclass(frozen=True)
class GLPairFactor:
    """All GL(h) pair groups (:class:`~geosharp_ref.symmetry.attention.groups.PairGroup`, each a binding
    with ``extract(params) -> (G, H)`` and ``insert(params, (G, H))``) under ``gl_<metric>``; ``stack``: True
    always stacks equal-shaped groups, False never, None on non-CPU devices only."""

    groups: tuple
    metric: str
    eps: float = 0.0
    stack: Optional[bool] = None

    @property
    def param_names(self) -> tuple:
        return tuple(dict.fromkeys(n for g in self.groups for n in g.param_names))

    @property
    def keys(self) -> list:
        return [g.key for g in self.groups]

    def generic(self) -> list:
        """One generated ``gl_<metric>`` factor per group (no fast hooks)."""
        return [Factor(gl_kernels(self.metric), g.with_metric(self.metric) if isinstance(g, PairGroup) else g,
                       self.eps) for g in self.groups]

    def at(self, params, options: SpaceOptions = SpaceOptions()) -> "GLPairFactorAt":
        return GLPairFactorAt(self, params, options)


class GLPairFactorAt:
    """:class:`GLPairFactor` at a base point. Its slice of a tangent vector is
    ``[ξ_G¹, ξ_H¹, …, ξ_G^K, ξ_H^K]`` (groups in order); its state one GramTable per bucket."""

    def __init__(self, factor: GLPairFactor, params, options: SpaceOptions):
        self.factor, self.options = factor, options
        self.groups = list(factor.groups)
        self.geometry = gl_pair(factor.metric, factor.eps)
        self.K, self.eps = self.geometry.kernels, factor.eps
        self.pairs = [tuple(g.extract(params)) for g in self.groups]
        self.size = 2 * len(self.pairs)
        for grp, (G, H) in zip(self.groups, self.pairs):
            check_rank(grp.key, ("G", "H"), (G, H), factor.eps)
        self._buckets = self._make_buckets(factor.stack)
        self._caches = [self.geometry.prepare(G, H) for _, G, H, _ in self._buckets]
        self._base_grams = [(G.mT @ G, H.mT @ H) for _, G, H, _ in self._buckets]

    # -- buckets -------------------------------------------------------------------------------------
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

    @staticmethod
    def _bucket_args(idx, t):
        """(ξ_G, ξ_H) of a bucket from the factor's slice ``t`` (concatenated along heads when stacked)."""
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
        """Apply ``fn(G, H, *per-tangent (ξ_G, ξ_H), cache=…)`` bucket-wise; a list over groups."""
        out = [None] * len(self.pairs)
        for b, (idx, G, H, sizes) in enumerate(self._buckets):
            args = [self._bucket_args(idx, t) for t in tangents]
            self._split_back(out, fn(G, H, *args, cache=self._caches[b]), idx, sizes)
        return out

    def _flat(self, bucket_blocks):
        pairs = [None] * len(self.pairs)
        for (idx, _, _, sizes), blocks in zip(self._buckets, bucket_blocks):
            self._split_back(pairs, blocks, idx, sizes)
        return [x for pair in pairs for x in pair]

    # -- Gram tables (the per-vector state) -----------------------------------------------------------
    def _table(self, b, XG, XH, GtX=None, HtX=None):
        """A Gram table for the bucket-b blocks (XG, XH) of a vector, with GᵀG, HᵀH known and GᵀX_G, HᵀX_H
        when given."""
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
        """g(ξ, ξ) over bucket b for the table's blocks "xi_G", "xi_H" (the generated metric on Spans: only
        the Grams ξ_Gᵀξ_G, ξ_Hᵀξ_H, one n·h² product per side)."""
        spans = [table.span(k) for k in ("G", "H", "xi_G", "xi_H", "xi_G", "xi_H")]
        return self.K.inner(*spans, eps=self.eps, cache=self._caches[b]).sum()

    def _known(self, xi, state, b):
        """(X_G, X_H, GᵀX_G, HᵀX_H) of a vector in bucket b: from its state, else computed."""
        if state is not None:
            t = state[b]
            return t.blocks["xi_G"], t.blocks["xi_H"], t.gram("G", "xi_G"), t.gram("H", "xi_H")
        idx, G, H, _ = self._buckets[b]
        XG, XH = self._bucket_args(idx, xi)
        return XG, XH, G.mT @ XG, H.mT @ XH

    # -- hooks ---------------------------------------------------------------------------------------
    def zeros(self):
        return [torch.zeros_like(X) for pair in self.pairs for X in pair]

    def random(self, generator):
        """(W_G G, W_H H) with W random square matrices: transforms like a tangent vector under
        (G A, H A⁻ᵀ), so the invariance of a random start is preserved."""
        out = []
        for G, H in self.pairs:
            out.extend(random_tangent_like(X, generator) for X in (G, H))
        return out

    def inner(self, xi, eta, state=None):
        total = 0.0
        if not self.options.metric_norm:
            for a, e in zip(xi, eta):
                total = total + (a * e).sum()
        elif state is not None:  # g(ξ, ξ) from the carried Grams
            for b, table in enumerate(state):
                total = total + self._norm_sq(table, b)
        else:
            for v in self._pair_map(self.geometry.inner, xi, eta):
                total = total + v.sum()
        return torch.as_tensor(total)

    def project(self, xi):
        return [x for pair in self._pair_map(self.geometry.project_horizontal, xi) for x in pair]

    def forward(self, xi, state):
        """E(ξ) bucket-wise on Spans (the Gram products land in the tables the ascent step reuses)."""
        new, tables = [], []
        for b, (idx, G, H, sizes) in enumerate(self._buckets):
            if state is not None:  # Gᵀξ_G, ξ_Gᵀξ_G, … known from the Auto-PGD step that formed ξ
                table = state[b].copy()
                xG, xH = table.blocks["xi_G"], table.blocks["xi_H"]
            else:
                xG, xH = self._bucket_args(idx, xi)
                table = self._table(b, xG, xH)
            if self.options.geodesic_correction:
                E = self.K.second_order_geodesic(*(table.span(k) for k in ("G", "H", "xi_G", "xi_H")),
                                                 eps=self.eps, cache=self._caches[b])
                E = tuple(e.materialize() for e in E)
            else:
                E = (G + xG, H + xH)
            tables.append(table)
            new.append(E)
        return self._flat(new), tables

    def ascent(self, xi, cot, tables):
        """d = P 𝔾⁻¹ (∂E/∂ξ)ᵀ ū per bucket on Spans over {θ, ξ, ū} (only d is formed); g(d, d) from dᵀd,
        ⟨ξ, ∇⟩_F from the tables (h×h work); d's state carries Gᵀd_G, Hᵀd_H."""
        o, K, eps = self.options, self.K, self.eps
        if tables is None:  # no forward state (a gradient built by hand): tables of ξ from scratch
            tables = [self._table(b, *self._bucket_args(idx, xi)) for b, (idx, *_) in enumerate(self._buckets)]
        blocks, d_tables = [], []
        dd = xd = 0.0
        for b, (idx, G, H, sizes) in enumerate(self._buckets):
            table, cache = tables[b], self._caches[b]
            sG, sH, sxG, sxH = (table.span(k) for k in ("G", "H", "xi_G", "xi_H"))
            if "cot_G" not in table.blocks:  # first ascent step from this gradient
                cG, cH = self._bucket_args(idx, cot)
                table.block("cot_G", cG), table.block("cot_H", cH)
            g_G, g_H = table.span("cot_G"), table.span("cot_H")
            if o.gradient == "exact" and o.geodesic_correction:
                g_G, g_H = K.second_order_geodesic_vjp(sG, sH, sxG, sxH, g_G, g_H, eps=eps, cache=cache)
            r_G, r_H = K.riemannian_gradient(sG, sH, g_G, g_H, eps=eps, cache=cache) if o.metric_norm \
                else (g_G, g_H)
            d_G, d_H = K.horizontal_projection(sG, sH, r_G, r_H, eps=eps, cache=cache)
            GtD, HtD = sG.mT @ d_G, sH.mT @ d_H  # for the iterate Auto-PGD forms from d (h×h work)
            d_G, d_H = d_G.materialize(), d_H.materialize()
            blocks.append((d_G, d_H))
            d_tables.append(self._table(b, d_G, d_H, GtD, HtD))
            if o.metric_norm:
                xd = xd + (g_G.frobenius_with_block("xi_G") + g_H.frobenius_with_block("xi_H")).sum()
                dd = dd + self._norm_sq(d_tables[-1], b)  # g(d, d) from dᵀd (∇ is not formed)
            else:
                xG, xH = table.blocks["xi_G"], table.blocks["xi_H"]
                xd = xd + (xG * d_G).sum() + (xH * d_H).sum()
                dd = dd + (d_G * d_G).sum() + (d_H * d_H).sum()
        return self._flat(blocks), d_tables, torch.as_tensor(dd), torch.as_tensor(xd)

    def perturbed(self, xi):
        o = self.options
        if o.geodesic_correction and o.gradient == "perturbed":
            with torch.no_grad():  # value θ + ξ + ½γ̈, derivative in ξ the identity (straight through)
                E = self._pair_map(self.geometry.exp2, xi)
            new = [(EG + (xi[2 * i] - xi[2 * i].detach()), EH + (xi[2 * i + 1] - xi[2 * i + 1].detach()))
                   for i, (EG, EH) in enumerate(E)]
        elif o.geodesic_correction:
            new = self._pair_map(self.geometry.exp2, xi)
        else:
            new = [(G + xi[2 * i], H + xi[2 * i + 1]) for i, (G, H) in enumerate(self.pairs)]
        return [x for pair in new for x in pair]

    def geodesic_parts(self) -> list:
        """Hook of the exact geodesic (:mod:`~geosharp_ref.sharpness.exact_geodesic`): one part per bucket
        (stacked groups), the generated ``geodesic_acceleration`` at the current point (no base-point cache)."""
        K, eps = self.K, self.eps

        def acceleration(p, v):
            return tuple(K.geodesic_acceleration(*p, *v, eps=eps))
        return [GeodesicPart([[2 * i for i in idx], [2 * i + 1 for i in idx]], (G, H), acceleration, sizes)
                for idx, G, H, sizes in self._buckets]

    def insert(self, params, blocks):
        for i, grp in enumerate(self.groups):
            params = grp.insert(params, (blocks[2 * i], blocks[2 * i + 1]))
        return params

    def insert_parts(self) -> list:
        """One insert part per group (blocks 2i, 2i + 1): the evaluator pulls each layer's ∂L/∂W back as soon
        as the backward pass has passed it (:meth:`ProductSpace.value_and_grad
        <geosharp_ref.sharpness.space.ProductSpace.value_and_grad>`)."""
        return [([2 * i, 2 * i + 1], lambda params, blocks, grp=grp: grp.insert(params, tuple(blocks)))
                for i, grp in enumerate(self.groups)]

    def lincomb(self, terms):
        """Σ cᵢ ξᵢ with its tables: Gᵀ(Σ cᵢ ξᵢ) = Σ cᵢ Gᵀξᵢ from the terms' (h×h work)."""
        blocks, tables = [], []
        for b in range(len(self._buckets)):
            known = [self._known(x, s, b) for _, x, s in terms]
            cs = [c for c, _, _ in terms]
            XG = combine([(c, kn[0]) for c, kn in zip(cs, known)])
            XH = combine([(c, kn[1]) for c, kn in zip(cs, known)])
            GtX = sum(c * kn[2] for c, kn in zip(cs, known))
            HtX = sum(c * kn[3] for c, kn in zip(cs, known))
            blocks.append((XG, XH))
            tables.append(self._table(b, XG, XH, GtX, HtX))
        return self._flat(blocks), tables

    def scale(self, xi, state, s):
        """s ξ; with a state, ξ's own Grams are kept too, scaled by s²."""
        if state is None:
            return [x * (s.to(x.dtype) if torch.is_tensor(s) else s) for x in xi], None
        out, tables = self.lincomb([(s, xi, state)])
        for t, new in zip(state, tables):
            for name in ("xi_G", "xi_H"):
                if t.has_gram(name, name):
                    new.seed(name, name, t.gram(name, name) * (s * s))
        return out, tables


def gl_pair_factors(groups, metric: str, eps: float = 0.0, fast: bool = True) -> list:
    """The GL(h) attention pair groups as factors with the built-in ``gl_inv`` / ``gl_mix`` kernels: one
    :class:`GLPairFactor` for all of them (``fast``: buckets, caches, Gram-carrying iterates), or one generic
    :class:`~geosharp_ref.sharpness.factors.Factor` per group (``fast=False``)."""
    groups = list(groups)
    if not groups:
        return []
    factor = GLPairFactor(tuple(groups), metric, eps)
    return [factor] if fast else factor.generic()
