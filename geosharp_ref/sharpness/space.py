"""The perturbation space of a model: a product of generated geometries (factors) and the adaptive rest.

    S(θ) = max_{ξ horizontal, ‖ξ‖ ≤ ρ}  L_B(E(ξ)) − L_B(θ),   averaged over batches B.

With factors k = 1…K (:mod:`~geosharp_ref.sharpness.factors`: a generated geometry bound to parameter blocks
θ_k, e.g. the GL(h) attention pairs, :mod:`~geosharp_ref.sharpness.gl_factor`) and the parameters no factor
covers ("the rest", adaptive geometry with scales c = |θ| (+ offset), Kwon et al. 2021):

    g(ξ, η)  = Σ_k g_k(ξ_k, η_k) + Σ_rest ⟨ξ ⊘ c, η ⊘ c⟩
    P ξ      = (P_1 ξ_1, …, P_K ξ_K, ξ_rest ⊙ [c > 0])                 (horizontal projection)
    E(ξ)     = (E_1(ξ_1), …, E_K(ξ_K), θ_rest + ξ_rest),  E_k = θ_k + ξ_k + ½ γ̈_k(0)
    d        = (P_1 𝔾_1⁻¹ (∂E_1/∂ξ_1)ᵀ ū_1, …, c² ⊙ ∂F/∂ξ_rest)     (Auto-PGD's ascent direction)

Adaptive sharpness is the space without factors. A tangent vector is a :class:`Tangent`: a flat list (the
blocks of factor 1, …, of factor K, then one tensor per adaptive parameter) with one state per factor (None,
or data the factor carries with the vector, e.g. its Gram products with the base point).

Gradient (:meth:`ProductSpace.value_and_grad`): every E_k(ξ_k) is computed without autograd and put into the
weights it binds by one autograd node per insert part whose backward is the insert's adjoint, so the backward
pass stops at the cotangents ū_k = ∂L/∂E_k (and gives ∂F/∂ξ on the rest), freeing each layer's perturbed weights
and their gradient as it passes them;
:meth:`ProductSpace.ascent_step` maps them to d (factor hook ``ascent``). ``gradient="exact"`` applies
(∂E_k/∂ξ_k)ᵀ (the generated VJP); ``gradient="perturbed"`` uses ū_k itself, the gradient at the perturbed
weights, as the paper's Algorithm 1 does (the same direction to first order in ξ).

Auto-PGD's step norms: for horizontal ξ (zero where c = 0) and d = P 𝔾⁻¹ ∇ with P g-orthogonal,
g(ξ, d) = g(ξ, 𝔾⁻¹ ∇) = ⟨ξ, ∇⟩_F and g(d, d) = ⟨d, ∇⟩_F, so each factor returns these element-wise
pairings with d; the Frobenius ablation computes them with its own inner product.

Ablations (paper App. G), on every factor: ``geodesic_correction=False`` uses E(ξ) = θ + ξ;
``metric_norm=False`` measures and steps the factor blocks in the Frobenius norm (identity Riemannian
gradient, still projected horizontally). ``fast=False`` replaces every factor by its generic version
(``factor.generic()``: no buckets, caches or carried Gram products; the reference the fast hooks are tested
against). The model's parameters are never modified (new tensors, ``torch.func.functional_call``).
``geodesic="exact"`` (``steps`` RK4 steps) replaces E_k(ξ) by the integrated geodesic γ_ξ(1) of each factor
(:mod:`~geosharp_ref.sharpness.exact_geodesic`, factor hook ``geodesic_parts``).

The rest's operations run on groups of consecutive parameters, one flat tensor per group
(:mod:`~geosharp_ref.sharpness.rest_groups`; hook ``rest_group_bytes``): on accelerators groups of up to
:data:`~geosharp_ref.sharpness.rest_groups.GROUP_BYTES`, a few kernel launches per operation instead of one per
parameter; on the CPU, and with ``fast=False``, one parameter per group (the reference path).

The rest's weights c² and 1/c² are the same tensors at every step (θ does not move), so where both together hold
fewer bytes than :data:`WEIGHT_CACHE_BYTES` (MiniLM's: 182 MB) and ``fast``, each group's are computed once, on
first use, and kept for the space's life (hook ``cache_rest_weights``); else every operation computes them again
from θ (no parameter-sized copy kept: the reference path, and the rule for models whose weights would crowd an
accelerator's memory). The same operations on the same θ, so the values are equal bit for bit either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch.autograd.function import once_differentiable

from ..apgd import combine, radial_clip
from ..geometry import AdaptiveGeometry
from .exact_geodesic import check_geodesic, exact_bound
from .rest_groups import GROUP_BYTES, byte_groups, flat, unflat

__all__ = ["ProductSpace", "Tangent", "Cotangents", "SpaceOptions", "GRADIENTS", "frobenius", "WEIGHT_CACHE_BYTES"]

#: the adaptive rest's weights c² and 1/c² are kept, once computed, where together they hold fewer bytes than this
#: (``ProductSpace(cache_rest_weights=None)``; MiniLM's hold 182 MB); with the length buckets' single
#: ``functional_call`` 2.5–3.3 % less CPU per Auto-PGD run on the tweets (docs/tweets/timing_rest_weights.json)
WEIGHT_CACHE_BYTES = 256 << 20

#: how the gradient in ξ is taken (see the module doc)
GRADIENTS = ("exact", "perturbed")


@dataclass(frozen=True)
class SpaceOptions:
    """The options every factor honours (see the module doc)."""

    geodesic_correction: bool = True
    metric_norm: bool = True
    gradient: str = "exact"


def frobenius(xi, eta):
    """Σ ⟨ξ, η⟩_F over two lists of tensors (a 0-dim tensor)."""
    total = 0.0
    for x, e in zip(xi, eta):
        total = total + torch.dot(x.reshape(-1), e.reshape(-1).to(x.dtype))
    return torch.as_tensor(total)


class Tangent(list):
    """A tangent vector: one tensor per component (factor blocks, then the adaptive parameters) and
    ``states``, one per factor (None or what the factor carries with the vector), valid in ``space`` (the
    space that made it) only. Any list operation on it gives a plain list (a factor then recomputes what
    its state would have saved)."""

    def __init__(self, items, states=None, space=None):
        super().__init__(items)
        self.states, self.space = states, space


class Cotangents(list):
    """What :meth:`ProductSpace.value_and_grad` returns as the gradient at ``point``: per factor the
    cotangents ū_k = ∂L/∂E_k at the perturbed blocks (not ∂F/∂ξ), per adaptive parameter ∂F/∂ξ;
    ``states``: the factors' forward states (e.g. Gram products the ascent step reuses; None: recomputed).
    Built by hand (``Cotangents(∇, ξ)``) with ``geodesic_correction=False`` it is ∂F/∂ξ itself."""

    def __init__(self, items, point, states=None, space=None):
        super().__init__(items)
        self.point = point
        self.states, self.space = states, space


class ProductSpace:
    """Tangent space at θ of the product of ``factors`` and the adaptive geometry on the rest (see the
    module doc); implements :class:`geosharp_ref.apgd.ModelSpace`.

    ``adaptive_masks``: name → bool mask of the elements left to the adaptive geometry (None: the whole
    tensor); parameters absent from it are covered by factors only. Default: every parameter no factor
    names is adaptive. ``exclude``: parameters not perturbed at all. ``fast=False``: every factor in its
    generic version (see the module doc). ``rest_group_bytes``: the largest group of adaptive parameters the
    rest's operations flatten into one tensor (:mod:`~geosharp_ref.sharpness.rest_groups`; 0: one parameter per
    group; None: :data:`~geosharp_ref.sharpness.rest_groups.GROUP_BYTES` where the parameters are on an
    accelerator and ``fast``, else 0). ``cache_rest_weights``: keep each rest group's c² and 1/c² once computed
    (True), or compute them again in every operation (False); None: keep them where ``fast`` and they hold fewer
    bytes together than :data:`WEIGHT_CACHE_BYTES`."""

    def __init__(self, params: dict, factors=(), adaptive_masks=None, *, geodesic_correction: bool = True,
                 metric_norm: bool = True, gradient: str = "exact", adaptive_offset: float = 0.0,
                 exclude: Iterable[str] = (), fast: bool = True, geodesic: str = "second-order", steps=None,
                 rest_group_bytes: int | None = None, cache_rest_weights: bool | None = None):
        if gradient not in GRADIENTS:
            raise ValueError(f"unknown gradient {gradient!r}; choose one of {GRADIENTS} ('exact' differentiates "
                             "through the geodesic correction, 'perturbed' is the paper's Algorithm 1)")
        exclude = set(exclude)
        unknown = sorted(exclude - set(params))
        if unknown:
            raise ValueError(f"exclude names unknown parameters {unknown}; names come from model.named_parameters()")
        self.base = params
        self.options = SpaceOptions(geodesic_correction, metric_norm, gradient)
        self.geodesic_correction, self.metric_norm, self.gradient = geodesic_correction, metric_norm, gradient
        self.fast = fast
        self.factors = list(factors) if fast else [g for f in factors for g in f.generic()]
        # geodesic="exact": E_k(ξ) is the RK4-integrated geodesic (factor hook ``geodesic_parts``,
        # :mod:`~geosharp_ref.sharpness.exact_geodesic`); the adaptive rest stays the straight line θ + ξ
        self.geodesic, self.steps = geodesic, check_geodesic(geodesic, steps)
        self.bound = exact_bound(self.factors, params, self.options, self.steps) if geodesic == "exact" else \
            [f.at(params, self.options) for f in self.factors]
        self.sizes = [b.size for b in self.bound]
        self.adaptive = AdaptiveGeometry(adaptive_offset)
        covered = {n for f in self.factors for n in f.param_names}
        if adaptive_masks is None:
            adaptive_masks = {n: None for n in params if n not in covered}
        self.adaptive_names = [n for n in adaptive_masks if n not in exclude and params[n].is_floating_point()]
        # the masks are built from shapes, on the CPU: each goes where its parameter lives
        self.masks = [None if adaptive_masks[n] is None else adaptive_masks[n].to(params[n].device)
                      for n in self.adaptive_names]
        rest = [params[n] for n in self.adaptive_names]
        if rest_group_bytes is None:
            rest_group_bytes = GROUP_BYTES if fast and rest and rest[0].device.type != "cpu" else 0
        #: the groups of adaptive parameters each rest operation flattens (index ranges into adaptive_names)
        self.rest_groups = byte_groups(rest, rest_group_bytes)
        self._rest_shapes = [[rest[j].shape for j in r] for r in self.rest_groups]
        # a group's flat mask (1 where no mask applies), built once where a group of several parameters has one
        # (a bool per element of such a group, kept beside self.masks; groups form on accelerators only)
        self._rest_masks = [None if len(r) == 1 or all(self.masks[j] is None for j in r) else
                            flat([torch.ones_like(rest[j], dtype=torch.bool) if self.masks[j] is None
                                  else self.masks[j].expand(rest[j].shape) for j in r])
                            for r in self.rest_groups]
        if cache_rest_weights is None:
            cache_rest_weights = fast and 2 * sum(t.numel() * t.element_size() for t in rest) < WEIGHT_CACHE_BYTES
        #: per rest group its c² and 1/c² once computed (flat), where kept (``cache_rest_weights``); else None
        self._weights = [[None, None] for _ in self.rest_groups] if cache_rest_weights else None

    # -- the adaptive weights, computed from θ when used (kept per group only where cache_rest_weights) --
    def _each_scale2(self):
        """c² per adaptive parameter, one at a time (the adaptive Riemannian gradient is c² ⊙ ∇); the
        same operations on the same θ every call, so every use sees the same values bit for bit."""
        for n, m in zip(self.adaptive_names, self.masks):
            yield self._scale2_of(self.base[n], m)

    def _scale2_of(self, theta, mask):
        """c² = ((|θ| + offset) ⊙ mask)² (mask None: none), a square below the dtype's smallest normal number
        flushed to 0 (float32: |c| ≲ 1e-19): that coordinate is immovable, as c = 0 is, since its 1/c² would be inf
        and every norm infinite (Auto-PGD then recorded 0; amendment 12 of docs/tweets/PROTOCOL.md)."""
        c = self.adaptive.scale(theta)
        c = c if mask is None else c * mask.to(c.dtype)
        c2 = c * c
        return torch.where(c2 >= torch.finfo(c2.dtype).tiny, c2, 0.0)

    @staticmethod
    def _inverse(c2):
        """The adaptive metric's weight 1/c² (0 on immovable coordinates, c = 0)."""
        return torch.where(c2 > 0, c2, torch.inf).reciprocal()

    def _group_scale2(self, k):
        """c² of rest group k as one flat tensor: the same operations as :meth:`_each_scale2`, element by
        element (kept once computed where the space caches its weights; never modified in place)."""
        return self._kept_weight(k, 0, lambda: self._compute_group_scale2(k))

    def _group_inverse(self, k):
        """1/c² of rest group k as one flat tensor (:meth:`_inverse` of :meth:`_group_scale2`; kept likewise)."""
        return self._kept_weight(k, 1, lambda: self._inverse(self._group_scale2(k)))

    def _kept_weight(self, k, slot, compute):
        """Rest group k's weight ``slot`` (0: c², 1: 1/c²): ``compute()`` once where kept, else every call."""
        if self._weights is None:
            return compute()
        kept = self._weights[k]
        if kept[slot] is None:
            kept[slot] = compute()
        return kept[slot]

    def _compute_group_scale2(self, k):
        r = self.rest_groups[k]
        if len(r) == 1:  # one parameter: its mask as given (possibly broadcast), no flat copy of it kept
            return self._scale2_of(self.base[self.adaptive_names[r[0]]], self.masks[r[0]]).reshape(-1)
        return self._scale2_of(flat([self.base[self.adaptive_names[j]] for j in r]), self._rest_masks[k])

    def _rest_group(self, k, vec):
        """Rest group k of ``vec`` (its adaptive tensors) as one flat tensor."""
        return flat([vec[j] for j in self.rest_groups[k]])

    @property
    def _scale2(self):
        """c² per adaptive parameter (a list)."""
        return list(self._each_scale2())

    @property
    def _movable(self):
        """The movable coordinates c > 0 per adaptive parameter (a list)."""
        return [c2 > 0 for c2 in self._each_scale2()]

    @property
    def _inv_scale2(self):
        """1/c² per adaptive parameter, 0 where c = 0 (a list)."""
        return [self._inverse(c2) for c2 in self._each_scale2()]

    @property
    def scales(self):
        """The adaptive scales c = |θ| (+ offset, masked), one tensor per adaptive parameter."""
        return [c2.sqrt() for c2 in self._each_scale2()]

    @property
    def factor_keys(self) -> list:
        """The keys of the bound groups, factor by factor."""
        return [k for f in self.factors for k in f.keys]

    @property
    def covered(self) -> set:
        """The parameters some factor covers."""
        return {n for f in self.factors for n in f.param_names}

    # -- vectors ------------------------------------------------------------------------------------
    def _split(self, xi):
        """([blocks of factor k] for k, [state of factor k] for k, adaptive tensors)."""
        parts, i = [], 0
        for k in self.sizes:
            parts.append(list(xi[i:i + k]))
            i += k
        own = isinstance(xi, (Tangent, Cotangents)) and xi.space is self and xi.states is not None
        return parts, xi.states if own else [None] * len(self.sizes), list(xi[i:])

    def _join(self, parts, rest, states=None):
        return Tangent([x for p in parts for x in p] + list(rest), states, self)

    def zeros(self):
        return self._join([b.zeros() for b in self.bound], [torch.zeros_like(self.base[n]) for n in self.adaptive_names])

    def random(self, rho, generator=None):
        """A random direction (per factor its ``random`` hook, scaled by |θ| on the rest), projected
        horizontally, at radius ρ·u (u uniform on [0, 1])."""
        parts = [b.random(generator) for b in self.bound]
        rest = [c * torch.randn(c.shape, generator=generator, dtype=c.dtype).to(c.device) for c in self.scales]
        u = float(torch.rand((), generator=generator))
        xi = self.project_horizontal(self._join(parts, rest))
        n = self.norm(xi)
        return xi if n == 0 else Tangent([x * (rho * u / n) for x in xi], None, self)

    # -- the metric and the projection ---------------------------------------------------------------
    def inner(self, xi, eta):
        px, sx, ax = self._split(xi)
        pe, _, ae = self._split(eta)
        same = xi is eta
        total = 0.0
        for b, x, e, s in zip(self.bound, px, pe, sx):
            total = total + b.inner(x, e, s if same else None)
        for k in range(len(self.rest_groups)):
            x = self._rest_group(k, ax)
            e = x if same else self._rest_group(k, ae)  # a norm flattens its group once
            total = total + torch.dot(x * self._group_inverse(k), e)
        return torch.as_tensor(total)

    def norm(self, xi):
        return float(self.inner(xi, xi)) ** 0.5

    def project_horizontal(self, xi):
        px, _, ax = self._split(xi)
        rest = [t for k, shapes in enumerate(self._rest_shapes)
                for t in unflat(self._rest_group(k, ax) * (self._group_scale2(k) > 0), shapes)]
        return self._join([b.project(x) for b, x in zip(self.bound, px)], rest)

    def project(self, xi, rho):
        """Horizontal projection, then radially into the ball ‖ξ‖ ≤ ρ."""
        xi = self.project_horizontal(xi)
        return radial_clip(xi, self.inner(xi, xi), rho, scale=self.scale)[0]

    def lincomb(self, terms, consume=None):
        """Σᵢ cᵢ ξᵢ (``terms`` = [(cᵢ, ξᵢ)], cᵢ numbers or 0-d tensors); each factor combines its blocks and
        states (hook ``lincomb``). ``consume``: one of the terms' vectors, released as the sum is formed (each of
        its entries, and its factor states, set to None once the result's entries that read it exist), so the
        sum needs no storage beyond one factor's blocks or one rest group at a time on top of its terms (one
        parameter on the CPU)."""
        split = [(c, self._split(v)) for c, v in terms]
        gone = next((p for (_, p), (_, v) in zip(split, terms) if v is consume), None) if consume is not None else None
        parts, states, i = [], [], 0
        for k, b in enumerate(self.bound):
            blocks, state = b.lincomb([(c, p[k], s[k]) for c, (p, s, _) in split])
            parts.append(blocks)
            states.append(state)
            if gone is not None:
                self._release(consume, gone, k, i)
            i += self.sizes[k]
        rest = []
        for k, shapes in enumerate(self._rest_shapes):
            rest += unflat(combine([(c, self._rest_group(k, a)) for c, (_, _, a) in split]), shapes)
            if gone is not None:
                for j in self.rest_groups[k]:
                    gone[2][j] = consume[i + j] = None
        return self._join(parts, rest, states)

    def _release(self, vec, split, k, start):
        """Drop factor k's blocks and state of ``vec`` (a tangent or cotangent list being consumed) and of its
        ``split`` (what :meth:`_split` returned for it)."""
        split[0][k] = None
        if getattr(vec, "states", None) is not None:
            vec.states[k] = None
        vec[start:start + self.sizes[k]] = [None] * self.sizes[k]

    def scale(self, xi, s):
        """s ξ (s a number or a 0-d tensor), the factors' states rescaled with it."""
        px, sx, ax = self._split(xi)
        parts, states = [], []
        for b, x, st in zip(self.bound, px, sx):
            blocks, state = b.scale(x, st, s)
            parts.append(blocks)
            states.append(state)
        rest = []
        for k, shapes in enumerate(self._rest_shapes):
            x = self._rest_group(k, ax)
            rest += unflat(x * (s.to(x.dtype) if torch.is_tensor(s) else s), shapes)
        return self._join(parts, rest, states)

    # -- the ascent step -----------------------------------------------------------------------------
    def ascent_step(self, xi, grad, consume=False):
        """(d, g(d, d), g(ξ, d)) for the :class:`Cotangents` ``grad`` that :meth:`value_and_grad` returned
        at ξ: per factor its ``ascent`` hook, c² ⊙ ∂F/∂ξ on the rest (c² = 0 on immovable coordinates).
        ``consume=True``: ``grad`` is released as d is formed (its entries and states set to None once used), so
        d takes the gradient's place instead of a parameter copy beside it."""
        if not isinstance(grad, Cotangents):
            raise TypeError("ascent_step takes the gradient ProductSpace.value_and_grad returns (Cotangents)")
        px, _, ax = self._split(xi)
        split = self._split(grad)
        pg, fstates, ag = split
        parts, states = [], []
        dd = xd = 0.0
        i = 0
        for k, b in enumerate(self.bound):
            d, st, dd_k, xd_k = b.ascent(px[k], pg[k], fstates[k])
            parts.append(d)
            states.append(st)
            dd, xd = dd + dd_k, xd + xd_k
            if consume:
                self._release(grad, split, k, i)
            i += self.sizes[k]
        d_a = []
        for k, shapes in enumerate(self._rest_shapes):
            g = self._rest_group(k, ag)
            d = self._group_scale2(k) * g
            dd, xd = dd + frobenius([d], [g]), xd + frobenius([self._rest_group(k, ax)], [g])
            d_a += unflat(d, shapes)
            if consume:
                for j in self.rest_groups[k]:
                    ag[j] = grad[i + j] = None
            g = d = None
        return self._join(parts, d_a, states), torch.as_tensor(dd), torch.as_tensor(xd)

    def ascent_direction(self, xi, grad):
        """The ascent direction alone (:meth:`ascent_step`)."""
        return self.ascent_step(xi, grad)[0]

    # -- the perturbed model ---------------------------------------------------------------------------
    def _assemble(self, blocks, ax):
        params = dict(self.base)
        for b, E in zip(self.bound, blocks):
            params = b.insert(params, E)
        return self._perturb_rest(params, ax)

    def perturbed_params(self, xi):
        """The parameters at E(ξ) (a new dict; differentiable in ξ)."""
        px, _, ax = self._split(xi)
        return self._assemble([b.perturbed(x) for b, x in zip(self.bound, px)], ax)

    def value_and_grad(self, loss_of_params):
        """``f_and_grad(ξ) -> (F(ξ), Cotangents)`` with F(ξ) = loss_of_params(E(ξ)).

        The factor blocks E_k(ξ) are computed without autograd (hook ``forward``) and put into the parameters
        they bind (hook ``insert``, one *insert part* at a time: hook ``insert_parts``, e.g. one per attention
        pair or gated layer). Each part's new weights W enter the model as the outputs of one autograd node
        (:class:`_InsertNode`) whose inputs are placeholders of the part's blocks: its backward applies the
        adjoint of the insert to ∂L/∂W, ū = (∂ insert/∂E)ᵀ ∂L/∂W (an insert rebuilds the bound slices from the
        blocks, possibly scaled by a fold: affine, so its adjoint is the vjp at any point, here ξ), as soon as
        the backward pass has reached the layer, so each W and ∂L/∂W are freed layer by layer; neither the
        blocks E_k nor a parameter-sized set of leaves is kept beside the perturbed weights."""
        def f_and_grad(xi):
            px, sx, ax = self._split(xi)
            params, states, slots = dict(self.base), [], []
            for b, x, s in zip(self.bound, px, sx):
                with torch.no_grad():
                    E, st = b.forward([t.detach() for t in x], s)
                states.append(st)
                slot = [t.detach().requires_grad_(True) for t in x]
                slots.append(slot)
                for blocks, insert in _insert_parts(b):
                    params = _InsertNode.insert(params, self.base, insert, [E[i] for i in blocks],
                                                [slot[i] for i in blocks])
                E = None
            rest = [x.detach().requires_grad_(True) for x in ax]
            value = loss_of_params(self._perturb_rest(params, rest))
            params = None
            inputs = [t for slot in slots for t in slot] + rest
            grads = torch.autograd.grad(value, inputs, allow_unused=True)
            cot = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]
            return float(value.detach()), Cotangents(cot, xi, states, self)
        return f_and_grad

    def _perturb_rest(self, params, rest):
        """``params`` with ξ_rest added to the adaptive parameters (masked where a factor binds the rest)."""
        params = dict(params)
        for n, m, x in zip(self.adaptive_names, self.masks, rest):
            params[n] = params[n] + (x if m is None else x * m.to(x.dtype))
        return params


def _insert_parts(bound) -> list:
    """``[(block indices, insert(params, blocks))]``: a factor's insert in parts that touch disjoint blocks
    (factor hook ``insert_parts``; default one part, every block, the factor's ``insert``)."""
    hook = getattr(bound, "insert_parts", None)
    return hook() if hook is not None else [(list(range(bound.size)), bound.insert)]


class _InsertNode(torch.autograd.Function):
    """The weights an insert rebuilds, W = insert(params, E), as one autograd node of the blocks' placeholders
    (and of the incoming weights, where an earlier insert already changed them: shared tensors such as GPT-2's
    fused c_attn). Forward returns the W computed without autograd; backward is the insert's adjoint, taken by
    autograd of ``insert`` at the placeholders' values (the map is affine: the vjp is the same at every
    point), so ∂L/∂E and ∂L/∂W_in are formed as soon as ∂L/∂W is complete and ∂L/∂W is freed."""

    @staticmethod
    def insert(params, base, insert, E, slots) -> dict:
        """``params`` with the weights ``insert`` rebuilds from the blocks ``E`` (computed here without
        autograd) attached to the graph through ``slots`` (placeholders of E requiring grad)."""
        with torch.no_grad():
            new = insert(params, E)
        names = [n for n in new if new[n] is not params[n]]
        if not names:
            return new
        info = dict(base=base, insert=insert, names=names, n_slots=len(slots), new=[new[n] for n in names])
        out = _InsertNode.apply(info, *slots, *[params[n] for n in names])
        new.update(zip(names, out))
        return new

    @staticmethod
    def forward(ctx, info, *inputs):
        ctx.info = info
        ctx.save_for_backward(*inputs[:info["n_slots"]])
        out, info["new"] = info["new"], None
        return tuple(out)

    @staticmethod
    @once_differentiable  # E(ξ) is computed without autograd: the gradient is first order only
    def backward(ctx, *grad_w):
        info, slots = ctx.info, ctx.saved_tensors
        names, n = info["names"], info["n_slots"]
        need_in = ctx.needs_input_grad[1 + n:]
        with torch.enable_grad():
            E = [x.detach().requires_grad_(True) for x in slots]
            src = dict(info["base"])
            incoming = []
            for name, need in zip(names, need_in):
                if need:
                    src[name] = src[name].detach().requires_grad_(True)
                    incoming.append(src[name])
            inserted = info["insert"](src, E)
            grads = list(torch.autograd.grad([inserted[m] for m in names], E + incoming, grad_w, allow_unused=True))
        slot_grads = [torch.zeros_like(x) if g is None else g for x, g in zip(slots, grads[:n])]
        it = iter(grads[n:])
        return (None, *slot_grads, *[next(it) if need else None for need in need_in])
