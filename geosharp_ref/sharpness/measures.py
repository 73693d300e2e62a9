"""Entry points: adaptive and geodesic sharpness of a whole model, and the named measures.

    adaptive_sharpness(model, batches, rho)                 max_{‖δ‖₂ ≤ ρ} L(θ + |θ| ⊙ δ) − L(θ)
    geodesic_sharpness(model, batches, rho, metric="mix")   max_{ξ horizontal, ‖ξ‖_g ≤ ρ} L(γ_ξ(1)) − L(θ)
    linearised_sharpness(model, batches, rho, metric=…)     ρ ‖∇L(θ)‖_*  (the maximum of the linearisation)
    average_case_sharpness(model, batches, rho, metric=…)   E_ξ L(γ_ξ(1)) − L(θ)  (:mod:`.average_case`)

(``geodesic_sharpness(..., geodesic="exact")``: γ_ξ(1) integrated by RK4, :mod:`.exact_geodesic`)

each averaged over the batches, through the one evaluation pipeline (:mod:`~geosharp_ref.sharpness.pipeline`:
options validated once, the :class:`~geosharp_ref.sharpness.space.ProductSpace` of the model, Auto-PGD per
batch). :data:`MEASURES` names the measures of the paper and its ablations (App. G) for studies and the
command line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..forward import default_loss
from .average_case import average_case_sharpness
from .curvature import curvature_sharpness
from .pipeline import EvaluationOptions, evaluate
from .result import SharpnessResult

__all__ = ["adaptive_sharpness", "geodesic_sharpness", "linearised_sharpness", "Measure", "MEASURES",
           "HEADLINE_MEASURES", "ABLATION_MEASURES", "LINEARISED_MEASURES", "EXACT_GEODESIC_MEASURES", "AVERAGE_MEASURES",
           "CURVATURE_MEASURES", "get_measure"]


def adaptive_sharpness(model, batches, rho, *, n_iter=20, loss_fn=default_loss, exclude=(),
                       random_start=False, seed=0, dtype=None, offset=0.0, progress=False,
                       keep_trajectories=False, length_buckets=None) -> SharpnessResult:
    """Worst-case L2 adaptive sharpness: max_{‖δ‖₂ ≤ ρ} L(θ + |θ| ⊙ δ) − L(θ), mean over batches.
    ``length_buckets`` K: padded text batches evaluated in K groups of similar length (the same loss up to
    round-off, fewer token evaluations; :func:`~geosharp_ref.forward.length_buckets`)."""
    options = EvaluationOptions(n_iter=n_iter, exclude=exclude, random_start=random_start, seed=seed, dtype=dtype,
                                adaptive_offset=offset, progress=progress, keep_trajectories=keep_trajectories,
                                length_buckets=length_buckets)
    return evaluate(model, batches, rho, options, loss_fn=loss_fn)


def geodesic_sharpness(model, batches, rho, *, metric="mix", n_iter=20, loss_fn=default_loss,
                       eps=0.0, geodesic_correction=True, metric_norm=True, gradient="exact", symmetry_map=None,
                       exclude=(), random_start=False, seed=0, dtype=None, progress=False,
                       keep_trajectories=False, symmetries=None, fast=True, geodesic="second-order",
                       steps=None, length_buckets=None) -> SharpnessResult:
    """Geodesic sharpness on the quotient by the model's symmetries (paper Algorithm 1).

    ``symmetry_map`` (the attention GL(h) pairs) defaults to :func:`geosharp_ref.symmetry.symmetry_map` of the
    model; a model with no recognised attention and no further symmetries falls back to adaptive sharpness
    everywhere (with a :class:`~geosharp_ref.symmetry.NoAttentionPairsWarning`).

    ``symmetries``: further symmetries to quotient — bindings (:mod:`geosharp_ref.symmetry`), factors
    (:class:`~geosharp_ref.sharpness.factors.Factor`) and/or ``"all"`` (every built-in symmetry found and
    checked on the first batch), resolved by :class:`~geosharp_ref.symmetry.Quotient` (a parameter belongs to
    one symmetry; pairs sharing one with a given binding yield). None (default): the attention pairs only.
    The ablations (``geodesic_correction``, ``metric_norm``, ``gradient``) apply to every factor; ``fast=False``
    runs every factor generic (the reference path).

    ``geodesic="exact"``: γ_ξ(1) is the geodesic integrated by ``steps`` RK4 steps (default
    :data:`~geosharp_ref.sharpness.exact_geodesic.DEFAULT_STEPS`; :mod:`~geosharp_ref.sharpness.exact_geodesic`)
    instead of θ + ξ + ½γ̈(0); ``result.config["second_order_per_batch"]`` then holds the second-order value
    at the maximiser found and ``result.config["geodesic_gap"]`` the difference exact − second-order.
    ``length_buckets``: as in :func:`adaptive_sharpness`."""
    options = EvaluationOptions(metric=metric, n_iter=n_iter, eps=eps, geodesic_correction=geodesic_correction,
                                metric_norm=metric_norm, gradient=gradient, random_start=random_start, seed=seed,
                                dtype=dtype, exclude=exclude, fast=fast, progress=progress,
                                keep_trajectories=keep_trajectories, geodesic=geodesic, steps=steps,
                                length_buckets=length_buckets)
    return evaluate(model, batches, rho, options, smap=symmetry_map, symmetries=symmetries, loss_fn=loss_fn)


def linearised_sharpness(model, batches, rho, *, metric=None, symmetry_map=None, loss_fn=default_loss, eps=0.0,
                         dtype=None, exclude=(), length_buckets=None, **_ignored) -> SharpnessResult:
    """First-order sharpness ρ‖∇L_B(θ)‖_* averaged over batches: adaptive (``metric`` None) or in the
    quotient geometry ``metric`` of the model's GL(h) pairs. One gradient per batch, no Auto-PGD
    (options of the Auto-PGD measures such as ``n_iter`` are accepted and ignored)."""
    options = EvaluationOptions(metric=metric, linearised=True, eps=eps, dtype=dtype, exclude=exclude,
                                length_buckets=length_buckets)
    return evaluate(model, batches, rho, options, smap=symmetry_map, loss_fn=loss_fn)


# ------------------------------------------------------------------------------------------------
# Named measures
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measure:
    """A named sharpness measure: adaptive (``metric`` None) or geodesic under ``metric``, with the
    paper's ablations (App. G) ``geodesic_correction=False`` (γ_ξ(1) = θ + ξ: ``-first-order``) and
    ``metric_norm=False`` (Frobenius norm on the pair components: ``-frobenius``)."""

    name: str
    metric: Optional[str] = None
    geodesic_correction: bool = True
    metric_norm: bool = True
    #: ρ‖∇L‖_* (one gradient per batch) instead of the Auto-PGD maximisation
    linearised: bool = False
    #: γ_ξ(1): "second-order" or "exact" (RK4, :mod:`~geosharp_ref.sharpness.exact_geodesic`)
    geodesic: str = "second-order"
    #: average-case instead of worst-case: the distribution of ξ ("sphere" or "gaussian",
    #: :mod:`~geosharp_ref.sharpness.average_case`); None: Auto-PGD's maximum
    average: Optional[str] = None
    #: a curvature quantity instead of sharpness: "trace" or "top-eigenvalue" of the Hessian on the quotient
    #: (``metric``) or the Euclidean one (``metric`` None); ρ is recorded only (:mod:`.curvature`)
    curvature: Optional[str] = None

    @property
    def ablated(self) -> bool:
        """Whether this is one of the paper's ablations (a geodesic measure with an ingredient switched off)."""
        return self.metric is not None and not self.linearised and not (self.geodesic_correction and
                                                                        self.metric_norm)

    @property
    def base(self) -> str:
        """The name of the headline measure this one derives from (the same metric; itself if headline):
        ``geodesic-mix-frobenius`` and ``geodesic-mix-linearised`` → ``geodesic-mix``."""
        return next(h.name for h in HEADLINE_MEASURES if h.metric == self.metric)

    def evaluate(self, model, batches, rho, *, symmetry_map=None, **options) -> SharpnessResult:
        """The measure's :class:`SharpnessResult` (``options``: those of the entry points)."""
        if self.curvature is not None:
            return curvature_sharpness(model, batches, rho, quantity=self.curvature, measure=self.name,
                                       geometry=self.metric or "euclidean",
                                       symmetry_map=None if self.metric is None else symmetry_map, **options)
        if self.average is not None:
            return average_case_sharpness(model, batches, rho, metric=self.metric, distribution=self.average,
                                          geodesic=self.geodesic, measure=self.name,
                                          symmetry_map=None if self.metric is None else symmetry_map, **options)
        if self.linearised:
            return linearised_sharpness(model, batches, rho, metric=self.metric, symmetry_map=symmetry_map,
                                        **options)
        if self.metric is None:
            return adaptive_sharpness(model, batches, rho, **options)
        return geodesic_sharpness(model, batches, rho, metric=self.metric, symmetry_map=symmetry_map,
                                  geodesic_correction=self.geodesic_correction, metric_norm=self.metric_norm,
                                  **{"geodesic": self.geodesic, **options})


HEADLINE_MEASURES = (Measure("adaptive"), Measure("geodesic-inv", "inv"), Measure("geodesic-mix", "mix"))
ABLATION_MEASURES = tuple(Measure(f"geodesic-{m}-{suffix}", m, **kw)
                          for suffix, kw in (("first-order", dict(geodesic_correction=False)),
                                             ("frobenius", dict(metric_norm=False)))
                          for m in ("inv", "mix"))
#: ρ times the dual norm of the gradient in each geometry (the maximum of the loss's linearisation)
LINEARISED_MEASURES = (Measure("adaptive-linearised", linearised=True),
                       Measure("geodesic-inv-linearised", "inv", linearised=True),
                       Measure("geodesic-mix-linearised", "mix", linearised=True))
#: geodesic sharpness on the RK4-integrated geodesic (issue 27; the headline measures use the second order)
EXACT_GEODESIC_MEASURES = tuple(Measure(f"geodesic-{m}-exact", m, geodesic="exact") for m in ("inv", "mix"))
#: average-case sharpness (issue 27): tml-epfl's adaptive one (Gaussian δ ~ N(0, ρ² diag|θ|²), Andriushchenko et
#: al. 2023), the adaptive sphere, and the quotient's (ξ uniform on the horizontal metric sphere)
AVERAGE_MEASURES = (Measure("average-adaptive", average="gaussian"),
                    Measure("average-adaptive-sphere", average="sphere"),
                    Measure("average-geodesic-inv", "inv", average="sphere"),
                    Measure("average-geodesic-mix", "mix", average="sphere"))
#: curvature (issue 27): Hutchinson trace and top eigenvalue (Lanczos) of the Hessian on the quotient (inv, mix)
#: and of the Euclidean Hessian, per batch (:mod:`.curvature`)
CURVATURE_MEASURES = tuple(Measure(f"hessian-{q}-{g}", None if g == "euclidean" else g, curvature=q)
                           for q in ("trace", "top-eigenvalue") for g in ("inv", "mix", "euclidean"))
#: every named measure, by name
MEASURES = {m.name: m for m in HEADLINE_MEASURES + ABLATION_MEASURES + LINEARISED_MEASURES
            + EXACT_GEODESIC_MEASURES + AVERAGE_MEASURES + CURVATURE_MEASURES}


def get_measure(name: str) -> Measure:
    """The :class:`Measure` called ``name`` (one of :data:`MEASURES`)."""
    try:
        return MEASURES[name]
    except KeyError:
        raise ValueError(f"unknown measure {name!r}; choose from {list(MEASURES)}") from None
