"""One evaluation, in order: validate, prepare, build the space, maximise per batch, audit.

1. :class:`EvaluationOptions` — every option of an evaluation, validated once when it is made (ρ by
   :func:`check_rho`): nothing is computed with an option that would be refused later;
2. :func:`prepare_inputs` — the batches (pairs, finite, padded text with its mask) and the parameters
   (finite), moved to the model's device and the evaluation dtype; with ``length_buckets`` K, each padded text
   batch then becomes a :class:`~geosharp_ref.forward.LengthBuckets` of K groups of similar length
   (:func:`bucket_batches`, checked at θ against the plain batch: the fast path beside the readable one);
3. :func:`build_space` — which symmetries are quotiented (:class:`~geosharp_ref.symmetry.Quotient`, the one
   place that decides), as factors (the attention pairs as one fast
   :class:`~geosharp_ref.sharpness.gl_factor.GLPairFactor`, every other binding as a generic
   :class:`~geosharp_ref.sharpness.factors.Factor`) of the one :class:`~geosharp_ref.sharpness.space.ProductSpace`;
4. :func:`evaluate` — Auto-PGD (:func:`geosharp_ref.apgd.apgd`) on each batch, or one gradient per batch for
   the first-order measures (:func:`gradient_dual_norm`), into a
   :class:`~geosharp_ref.sharpness.result.SharpnessResult` with the relative size of every perturbation.

Steps 2 and 3 together, with the model cast to the evaluation dtype, are :func:`evaluation_space`: the one
preamble of the Auto-PGD and first-order measures, the average-case measures
(:mod:`~geosharp_ref.sharpness.average_case`) and the curvature operator (:mod:`~geosharp_ref.sharpness.curvature`).
The entry points (:mod:`~geosharp_ref.sharpness.measures`), the command line and the studies all run this
pipeline; benchmarks and studies that need the space alone call :func:`build_space`.
"""
from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass, replace
from typing import NamedTuple, Optional

import torch

from ..apgd import apgd
from ..forward import check_finite_batch, check_length_buckets, default_loss, model_loss, to_device
from ..kernels import check_metric
from ..symmetry import NoAttentionPairsWarning, Quotient, symmetry_map
from ..symmetry.check import check_attention_pairs
from ..symmetry.quotient import bound_binding
from .exact_geodesic import check_geodesic, second_order_params
from .factors import Factor
from .gl_factor import gl_pair_factors
from .joint_lora import joint_lora_factors
from . import at_theta
from .result import SharpnessResult, relative_perturbation
from .space import GRADIENTS, ProductSpace

__all__ = ["EvaluationOptions", "check_rho", "prepare_inputs", "check_padding_mask", "build_space", "evaluate",
           "bucket_batches", "check_length_buckets", "gradient_dual_norm", "at_zero", "evaluation_quotient",
           "evaluation_space",
           "linearised_at", "EvaluationSpace", "binding_factors", "pair_factors", "MAX_RHO", "PAD_RUN",
           "NO_PAIRS_MESSAGE"]

#: the largest radius accepted, a guard against a mistyped radius. What a radius means depends on the model: adaptive
#: ρ bounds ‖δ ⊘ |θ|‖₂ over all n parameters at once, so on MiniLM-L6 (n ≈ 22.7 M) ρ = 5 moves the weights by only
#: ‖Δθ‖/‖θ‖ ≈ 1e-2 (the relative size each record stores); a relative size of 1e-2 can need ρ near 10. (It was
#: 10 until amendment 12 of docs/tweets/PROTOCOL.md, which found that too tight for that size.)
MAX_RHO = 100.0
#: trailing padding tokens in one row that mark a batch as padded text (random ids rarely end in a run)
PAD_RUN = 3
#: the warning of a geodesic measure on a model without attention pairs and without further symmetries
NO_PAIRS_MESSAGE = "no GL(h) attention pairs found: geodesic sharpness equals adaptive sharpness here"


def check_rho(rho) -> float:
    """ρ as a float if it is a positive finite number ≤ :data:`MAX_RHO`; ValueError otherwise."""
    if isinstance(rho, bool) or not (isinstance(rho, (int, float)) and rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be a positive finite number, got {rho!r}")
    if rho > MAX_RHO:
        raise ValueError(f"rho = {rho:g} is larger than {MAX_RHO:g}, the largest radius accepted: check it for a typo "
                         f"(radii in use run from about 1e-4 to 10; each record's relative size ‖Δθ‖/‖θ‖ tells what "
                         f"a radius does to a model)")
    return float(rho)


@dataclass(frozen=True)
class EvaluationOptions:
    """Every option of one evaluation, validated when made (the one place; see the module doc).

    ``metric``: None (adaptive) or the GL(h) pair metric (``"inv"``/``"mix"``); ``linearised``: ρ‖∇L‖_*
    instead of Auto-PGD; ``n_iter``: Auto-PGD iterations (≥ 1); ``eps``: the Gram relaxation (≥ 0, paper
    App. H.2); ``geodesic_correction``/``metric_norm``/``gradient``: the ablations (App. G) and the
    gradient in ξ (:data:`~geosharp_ref.sharpness.space.GRADIENTS`); ``random_start``/``seed``: Auto-PGD's
    start; ``dtype``: the evaluation dtype (None: the model's); ``exclude``: parameters not perturbed;
    ``adaptive_offset``: c = |θ| + offset on the adaptive rest; ``fast``: the fast GL factor (False: every
    factor generic); ``progress``: a tqdm bar over the batches; ``keep_trajectories``: f at every iterate;
    ``geodesic``/``steps``: γ_ξ(1) second-order or RK4-integrated
    (:mod:`~geosharp_ref.sharpness.exact_geodesic`; the result's config then holds the second-order value at
    the same maximiser, ``second_order_per_batch``, and ``geodesic_gap`` = exact − second-order per batch);
    ``length_buckets``: None, or K ≥ 1 groups of similar length per padded text batch (:func:`bucket_batches`;
    the same loss up to round-off at fewer token evaluations)."""

    metric: Optional[str] = None
    linearised: bool = False
    n_iter: int = 20
    eps: float = 0.0
    geodesic_correction: bool = True
    metric_norm: bool = True
    gradient: str = "exact"
    random_start: bool = False
    seed: int = 0
    dtype: Optional[torch.dtype] = None
    exclude: tuple = ()
    adaptive_offset: float = 0.0
    fast: bool = True
    progress: bool = False
    keep_trajectories: bool = False
    #: γ_ξ(1): "second-order" (θ + ξ + ½γ̈(0)) or "exact" (RK4, ``steps`` steps; None: the default)
    geodesic: str = "second-order"
    steps: Optional[int] = None
    #: padded text batches evaluated as K groups of similar length (None: as given)
    length_buckets: Optional[int] = None

    def __post_init__(self):
        check_length_buckets(self.length_buckets)
        if self.metric is not None:
            check_metric(self.metric)
        object.__setattr__(self, "steps", check_geodesic(self.geodesic, self.steps))
        if self.geodesic == "exact" and not self.geodesic_correction:
            raise ValueError("geodesic='exact' integrates the geodesic, geodesic_correction=False uses θ + ξ: "
                             "choose one of them")
        if isinstance(self.n_iter, bool) or not isinstance(self.n_iter, int) or self.n_iter < 1:
            raise ValueError(f"n_iter (Auto-PGD iterations) must be an integer of at least 1, got {self.n_iter!r}")
        for name in ("eps", "adaptive_offset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)
                                               and value >= 0):
                raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
        if self.gradient not in GRADIENTS:
            raise ValueError(f"unknown gradient {self.gradient!r}; choose one of {GRADIENTS} ('exact' differentiates "
                             "through the geodesic correction, 'perturbed' is the paper's Algorithm 1)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.exclude, str):
            raise ValueError(f"exclude must be a list of parameter names, got the string {self.exclude!r}")
        object.__setattr__(self, "exclude", tuple(self.exclude))

    @property
    def space_options(self) -> dict:
        """The options of :class:`~geosharp_ref.sharpness.space.ProductSpace` among these."""
        return dict(geodesic_correction=self.geodesic_correction, metric_norm=self.metric_norm,
                    gradient=self.gradient, adaptive_offset=self.adaptive_offset, exclude=self.exclude,
                    geodesic=self.geodesic, steps=self.steps)

    @property
    def measure_name(self) -> str:
        base = "adaptive" if self.metric is None else f"geodesic-{self.metric}"
        exact = "-exact" if self.geodesic == "exact" and self.metric is not None and not self.linearised else ""
        return base + ("-linearised" if self.linearised else "") + exact


def check_padding_mask(model, batches) -> None:
    """Refuse padded text without an ``attention_mask``: a batch with ``input_ids`` of which some row ends
    in ≥ :data:`PAD_RUN` copies of the model's padding token (``config.pad_token_id``) and no mask would let
    the padding tokens take part in attention and silently change the result."""
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    if pad is None:
        return
    for i, (inputs, _) in enumerate(batches):
        if not isinstance(inputs, dict) or "attention_mask" in inputs:
            continue
        ids = inputs.get("input_ids")
        if torch.is_tensor(ids) and ids.dim() >= 2 and ids.shape[-1] > PAD_RUN:
            if bool((ids[..., -PAD_RUN:] == pad).all(-1).any()):
                raise ValueError(f"batch {i}: input_ids are padded with the model's padding token {pad} but the "
                                 f"inputs have no attention_mask, so the padding would change the result; add the "
                                 f"tokenizer's attention_mask to the inputs (`geosharp data` writes it)")


def bucket_batches(model, params, batches, k, loss_fn=default_loss) -> list:
    """``batches`` (prepared) as :class:`~geosharp_ref.forward.LengthBuckets` of ``k`` groups each (``k`` None:
    unchanged). Checked at ``params`` on the first batch: the bucketed loss must equal the plain one to
    √ε of the dtype (relative), else the model's real positions see the padding (or ``loss_fn`` is no mean over
    the targets) and the buckets are refused. The buckets, and that the check passed, are kept for the next
    evaluation of the same model, parameters and batches (:mod:`~geosharp_ref.sharpness.at_theta`)."""
    if k is None:
        return batches
    bucketed = [at_theta.bucketed(model, params, b, k) for b in batches]
    if at_theta.is_checked(model, params, batches[0], k, loss_fn):
        return bucketed
    with torch.no_grad():
        plain = float(model_loss(model, params, batches[0], loss_fn))
        fast = float(model_loss(model, params, bucketed[0], loss_fn))
    dtype = next(iter(params.values())).dtype
    tol = torch.finfo(dtype).eps ** 0.5 if dtype.is_floating_point else 1e-6
    if not abs(fast - plain) <= tol * max(1.0, abs(plain)):
        raise ValueError(f"length buckets change the loss of the first batch ({plain:.8g} plain, {fast:.8g} in {k} "
                         f"buckets): the model's real positions depend on the padding, or the loss is not a mean "
                         f"over the targets; evaluate without length buckets")
    at_theta.mark_checked(model, params, batches[0], k, loss_fn)
    return bucketed


def prepare_inputs(model, batches, dtype=None):
    """``(params, batches, device, dtype)``: the model's parameters (detached, finite, in ``dtype``; None: the
    model's) and the batches checked (non-empty, ``(inputs, targets)`` pairs, finite, padded text with its
    mask) and moved to the model's device (floating inputs in ``dtype``)."""
    batches = list(batches)
    if not batches:
        raise ValueError("no batches given: pass at least one (inputs, targets) batch")
    for i, b in enumerate(batches):
        if not (isinstance(b, (tuple, list)) and len(b) == 2):
            raise ValueError(f"batch {i} must be a pair (inputs, targets), got {type(b).__name__}")
        check_finite_batch(b, i)
    check_padding_mask(model, batches)
    params = {n: p.detach() for n, p in model.named_parameters()}
    for n, p in params.items():
        if p.is_floating_point() and not torch.isfinite(p).all():
            raise ValueError(f"parameter {n!r} contains NaN or inf; sharpness is undefined")
    device = next(iter(params.values())).device
    dtype = dtype or next(iter(params.values())).dtype
    params = {n: p.to(dtype) for n, p in params.items()}
    batches = [(to_device(x, device, dtype), to_device(y, device, None)) for x, y in batches]
    return params, batches, device, dtype


def build_space(params, smap=None, metric=None, symmetries=None, *, model=None, batch=None, quotient=None,
                fast: bool = True, eps: float = 0.0, **options) -> ProductSpace:
    """The perturbation space of a model at ``params``: the one builder (see the module doc).

    The symmetries quotiented are ``quotient`` (a :class:`~geosharp_ref.symmetry.Quotient`) or, without one,
    the attention pairs of ``smap`` (a :class:`~geosharp_ref.symmetry.SymmetryMap`; None: none) under
    ``metric`` (None: pairs adaptive) and ``symmetries`` (bindings, factors or ``"all"``: resolved on ``model``
    and ``batch`` by :meth:`Quotient.resolve <geosharp_ref.symmetry.Quotient.resolve>` when both are given,
    else :meth:`Quotient.assemble <geosharp_ref.symmetry.Quotient.assemble>`). The pairs become one fast
    ``gl_<metric>`` factor, the other bindings generic factors (a :class:`Factor` given is kept as it is), the
    rest adaptive. ``fast=False``: every factor generic. ``options``: those of
    :class:`~geosharp_ref.sharpness.space.ProductSpace` (``geodesic_correction``, ``metric_norm``,
    ``gradient``, ``adaptive_offset``, ``exclude``). The space keeps the quotient as ``space.quotient``."""
    if quotient is None:
        if model is not None and batch is not None and symmetries is not None:
            quotient = Quotient.resolve(model, batch, metric=metric, symmetries=symmetries, smap=smap)
        else:
            quotient = Quotient.assemble(params, smap, metric, symmetries or ())
    # LoRA adapters quotiented jointly with the pairs that hold their rows: one joint factor per connected set
    joint = [s for s in quotient.bindings if getattr(bound_binding(s), "joint_pairs", None)]
    joint_factors, pairs = (joint_lora_factors(None, quotient.pairs, quotient.metric, eps,
                                               loras=[bound_binding(s) for s in joint]) if joint
                            else ([], quotient.pairs))
    rest = [s for s in quotient.bindings if not any(s is j for j in joint)]
    factors = pair_factors(pairs, quotient.metric, eps) + joint_factors + binding_factors(rest, eps)
    space = ProductSpace(params, factors, quotient.adaptive_masks, fast=fast, **options)
    space.quotient = quotient
    return space


def binding_factors(bindings, eps: float = 0.0) -> list:
    """The further bindings of a quotient as factors, in order: a :class:`Factor` given is kept; the bindings
    quotiented by a built-in ``gl_<metric>`` geometry (GL(1) unit pairs of ReLU and gated MLPs, LoRA's GL(r))
    share one fast :class:`~geosharp_ref.sharpness.gl_factor.GLPairFactor` per metric (placed where the first of
    them stands); every other binding is a generic :class:`Factor` of its own kernels. A binding whose kernels
    are None (:class:`~geosharp_ref.symmetry.norm_weights.NormWeightsBinding`: its quotient is a point) gets no
    factor: its parameters do not move."""
    out, fast = [], {}
    for s in bindings:
        if not isinstance(s, Factor) and s.kernels is None:  # a quotient that is a point (norm weights): no factor
            continue
        kernels = None if isinstance(s, Factor) else s.kernels
        metric = kernels[3:] if kernels in ("gl_inv", "gl_mix") and not getattr(s, "kernel_options", None) else None
        if metric is None:
            out.append(s if isinstance(s, Factor) else Factor(kernels, s, eps))
        elif metric in fast:
            fast[metric].append(s)
        else:
            fast[metric] = [s]
            out.append(metric)  # the place of this metric's fast factor
    return [gl_pair_factors(fast[f], f, eps)[0] if isinstance(f, str) else f for f in out]


def pair_factors(pairs, metric, eps: float = 0.0) -> list:
    """The attention pairs of a quotient as factors: the GL(h) pairs (``rotary`` None, kernels ``gl_<metric>``)
    as one fast :class:`~geosharp_ref.sharpness.gl_factor.GLPairFactor`, every other pair (a rotary Q/K pair
    under the RoPE subgroup, kernels ``rope_<pairing>_<metric>`` with its ``kernel_options``) as a generic
    :class:`Factor` of its own kernels (the fast factor solves the full-GL(h) Sylvester projection)."""
    gl = [g for g in pairs if getattr(g, "rotary", None) is None]
    other = [g for g in pairs if getattr(g, "rotary", None) is not None]
    return (gl_pair_factors(gl, metric, eps) if gl else []) + [Factor(g.kernels, g, eps) for g in other]


def gradient_dual_norm(model, space: ProductSpace, batch, loss_fn=default_loss) -> float:
    """‖∇L_B(θ)‖_* = √g(grad, grad): the metric norm of the horizontal Riemannian gradient of the batch
    loss at θ in ``space`` (the dual norm of ∇L on the horizontal space; for the adaptive space
    ‖|θ| ⊙ ∇L‖₂). ρ‖∇L‖_* is the maximum of the loss's linearisation over the ρ-ball."""
    xi = space.zeros()
    _, grad = at_zero(model, space, batch, loss_fn, xi)
    return float(space.norm(space.ascent_direction(xi, grad)))


def at_zero(model, space: ProductSpace, batch, loss_fn=default_loss, xi=None) -> tuple:
    """``(F(0), ∇F(0))`` in the form ``space.value_and_grad`` gives them at ``xi`` = ξ = 0 (default
    ``space.zeros()``), for F(ξ) = L_B(E(ξ)) the batch loss at the space's perturbed parameters: from the Euclidean
    gradient G = ∂L_B/∂θ at θ (:func:`~geosharp_ref.sharpness.at_theta.gradient_at_theta`, which a population's
    scope keeps for all of a model's evaluations), the space run on the pairing P(W) = Σ_n ⟨W_n, G_n⟩ instead of
    the model: ∂P/∂W_n = 1 · G_n is G_n, what ∂L_B/∂W_n is at E(0) = θ, so the space's own chain rule
    (inserts, folds, masks, factor states) gives the cotangents without a forward or backward of the model.
    F(0) = L_B(θ).

    The readable path is ``space.value_and_grad(loss)(0)``: the model at E(0). Where a factor rebuilds its weights
    from blocks, E(0) is θ up to rounding (and its layout can send a matrix product another way), so the two agree
    to rounding (float64: within 5e-16 on the test cases, where they are asserted to 1e-10 relative), bit for bit
    on the adaptive space; one model's evaluations all start from the same G, in a scope or not. G covers every
    floating-point parameter (an excluded one costs its share of the backward pass, nothing else)."""
    xi = space.zeros() if xi is None else xi
    names = [n for n, t in space.base.items() if t.is_floating_point()]  # whatever an insert may write
    value, grads = at_theta.gradient_at_theta(model, space.base, batch, names, loss_fn)
    _, grad = space.value_and_grad(lambda params: _pairing(params, grads))(xi)
    return value, grad


def _pairing(params: dict, grads: dict):
    """Σ_n ⟨params_n, grads_n⟩ over the parameters with a gradient (None: the loss does not depend on it)."""
    return sum((params[n] * g).sum() for n, g in grads.items() if g is not None)


def evaluation_quotient(model, batch, metric, smap, symmetries, *, warn: bool = True, stacklevel: int = 4):
    """The :class:`Quotient` of ``model`` under ``metric`` (inv/mix; None: none, the adaptive space): the
    attention pairs of ``smap`` (default: detected from the structure) and ``symmetries`` (None: the pairs alone).
    Detected pairs are measured on ``batch`` before they are quotiented
    (:func:`~geosharp_ref.symmetry.check.check_attention_pairs`). ``warn``: a :class:`NoAttentionPairsWarning`
    where the model has no pairs and no further symmetry is given (the sharpness measures warn; the curvature
    operator, whose quotient is then the adaptive space, passes False; ``stacklevel``: that of the warning, so
    that it names the line that called the entry point)."""
    if isinstance(metric, EvaluationOptions):
        raise TypeError("evaluation_quotient takes the metric (options.metric), not the options")
    if metric is None:
        return Quotient.assemble(dict(model.named_parameters()), None, None)
    quiet = bool(symmetries) or not warn  # no attention pairs is fine when other symmetries are quotiented
    if smap is None:
        with warnings.catch_warnings():  # the detector's own warning: said once, below, at the caller's line
            warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
            smap = symmetry_map(model)
    if not smap.groups and not quiet:
        refused = f"; {len(smap.refused)} candidate pairs refused" if smap.refused else ""
        warnings.warn(f"{NO_PAIRS_MESSAGE} ({type(model).__name__}{refused})", NoAttentionPairsWarning,
                      stacklevel=stacklevel)
    check_attention_pairs(model, smap, batch)  # detected from the structure: measured before they are quotiented
    if symmetries is None:
        return Quotient.assemble(dict(model.named_parameters()), smap, metric)
    return Quotient.resolve(model, batch, metric=metric, symmetries=symmetries, smap=smap)


class EvaluationSpace(NamedTuple):
    """What every evaluation starts from (:func:`evaluation_space`): the model (a copy in the evaluation dtype
    where that differs from its own), its detached parameters, the checked batches on its device, the space."""
    model: torch.nn.Module
    params: dict
    batches: list
    space: ProductSpace

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.params.values())).dtype


def evaluation_space(model, batches, metric, *, dtype=None, smap=None, symmetries=None, warn: bool = True,
                     stacklevel: int = 5, **space_options) -> EvaluationSpace:
    """The one preamble of the sharpness, average-case and curvature evaluations: :func:`prepare_inputs` (in
    ``dtype``; None: the model's), the model cast to that dtype (a deep copy; the caller's model is untouched),
    :func:`evaluation_quotient` (``metric``, ``smap``, ``symmetries``, ``warn``; ``stacklevel`` of its warning, 5:
    the caller of an entry point that calls :func:`evaluate`) on the first batch, and
    :func:`build_space` on it with ``space_options`` (``fast``, ``eps`` and the
    :class:`~geosharp_ref.sharpness.space.ProductSpace` options)."""
    params, batches, _, dtype = prepare_inputs(model, batches, dtype)
    if dtype != next(model.parameters()).dtype:
        model = copy.deepcopy(model).to(dtype)
    quotient = evaluation_quotient(model, batches[0], metric, smap, symmetries, warn=warn, stacklevel=stacklevel)
    return EvaluationSpace(model, params, batches, build_space(params, quotient=quotient, **space_options))


def evaluate(model, batches, rho, options: EvaluationOptions = EvaluationOptions(), *, smap=None, symmetries=None,
             loss_fn=default_loss, measure: Optional[str] = None) -> SharpnessResult:
    """Sharpness of ``model`` on ``batches`` at radius ``rho`` under ``options`` (the whole pipeline, see the
    module doc): Auto-PGD per batch, or ρ‖∇L_B‖_* per batch when ``options.linearised``. ``smap``: the
    attention pairs (default: detected); ``symmetries``: further symmetries (None: the attention pairs alone).
    ``measure``: the name recorded (default :attr:`EvaluationOptions.measure_name`)."""
    rho = check_rho(rho)
    t0 = time.perf_counter()
    model, params, batches, space = setup = evaluation_space(
        model, batches, options.metric, dtype=options.dtype, smap=smap, symmetries=symmetries, fast=options.fast,
        eps=options.eps, **options.space_options)
    dtype, quotient = setup.dtype, space.quotient
    name = measure or options.measure_name
    was_training = model.training
    model.eval()
    try:
        batches = bucket_batches(model, params, batches, options.length_buckets, loss_fn)
        run = _linearised if options.linearised else _maximised
        out = run(model, space, params, batches, rho, options, loss_fn, name)
    finally:
        model.train(was_training)
    groups = quotient.pairs
    config = dict(metric=options.metric, eps=options.eps, dtype=str(dtype), pairs=len(groups),
                  heads=sum(g.num_heads for g in groups))
    if options.linearised:
        config["gradient_dual_norms"] = out.pop("norms")
    else:
        config = dict(metric=options.metric, n_iter=options.n_iter, eps=options.eps,
                      geodesic_correction=options.geodesic_correction, gradient=options.gradient,
                      metric_norm=options.metric_norm, random_start=options.random_start, seed=options.seed,
                      dtype=str(dtype), pairs=len(groups), heads=sum(g.num_heads for g in groups),
                      adaptive_params=len(space.adaptive_names),
                      factors=space.factor_keys if symmetries is not None else None,
                      yielded=[list(y) for y in quotient.yielded],
                      joint=[[norm, list(keys)] for norm, keys in quotient.joint], geodesic=options.geodesic)
        if options.geodesic == "exact":  # the second-order value at the same maximiser, and the gap
            second = out.pop("second_order")
            config.update(steps=options.steps, second_order_per_batch=second,
                          geodesic_gap=[e - s for e, s in zip(out["per_batch"], second)])
    if options.length_buckets is not None:
        config["length_buckets"] = options.length_buckets
    per = out["per_batch"]
    return SharpnessResult(measure=name, rho=rho, mean=sum(per) / len(per), seconds=time.perf_counter() - t0,
                           config=config, **out)


def _maximised(model, space, params, batches, rho, options, loss_fn, name) -> dict:
    """Auto-PGD on every batch: the per-batch fields of a :class:`SharpnessResult`."""
    gen = torch.Generator().manual_seed(options.seed)
    out = dict(per_batch=[], loss_before=[], loss_after=[], perturbation_norms=[], trajectories=[],
               relative_size=[], relative_size_groups=[])
    pair_params = space.covered
    # L(θ) of every batch first (kept across evaluations: at_theta): bad targets are refused before any progress bar
    losses = at_theta.losses_at_theta(model, params, batches, loss_fn)
    iterator = zip(batches, losses)
    if options.progress:
        from tqdm.auto import tqdm
        iterator = tqdm(iterator, total=len(batches), desc=f"{name} sharpness", unit="batch")
    for batch, l0 in iterator:
        f_and_grad = space.value_and_grad(lambda p, batch=batch: model_loss(model, p, batch, loss_fn))
        # from ξ = 0 the first evaluation maps the gradient at θ into the space (at_zero; kept across a scope)
        first = None if options.random_start else lambda x, batch=batch: at_zero(model, space, batch, loss_fn, x)
        res = apgd(f_and_grad, space, rho, n_iter=options.n_iter, random_start=options.random_start, generator=gen,
                   first=first)
        best = max(res.best_value, l0)
        raised = res.best_value >= l0
        out["per_batch"].append(best - l0)
        out["loss_before"].append(l0)
        out["loss_after"].append(best)
        out["perturbation_norms"].append(space.norm(res.best_xi) if raised else 0.0)
        with torch.no_grad():
            rel = relative_perturbation(params, space.perturbed_params(res.best_xi) if raised else params,
                                        pair_params)
        out["relative_size"].append(rel["overall"])
        out["relative_size_groups"].append({k: v for k, v in rel.items() if k != "overall"})
        if options.geodesic == "exact":  # L(θ + ξ* + ½γ̈(0)) − L(θ) at the maximiser ξ* found
            with torch.no_grad():
                l2 = float(model_loss(model, second_order_params(space, res.best_xi), batch, loss_fn)) \
                    if raised else l0
            out.setdefault("second_order", []).append(l2 - l0)
        if options.keep_trajectories:
            out["trajectories"].append(res.values)
    return out


def _linearised(model, space, params, batches, rho, options, loss_fn, name) -> dict:
    """ρ‖∇L_B(θ)‖_* on every batch (one gradient each): the per-batch fields of a :class:`SharpnessResult`."""
    norms = [gradient_dual_norm(model, space, b, loss_fn) for b in batches]
    before = at_theta.losses_at_theta(model, params, batches, loss_fn)
    return dict(_linearised_fields(norms, before, rho), norms=norms)


def _linearised_fields(norms, before, rho) -> dict:
    per = [rho * g for g in norms]
    return dict(per_batch=per, loss_before=list(before), loss_after=[b + v for b, v in zip(before, per)],
                perturbation_norms=[float(rho)] * len(per))


def linearised_at(result: SharpnessResult, rho) -> SharpnessResult:
    """A first-order result (``evaluate`` with ``options.linearised``) at another radius ``rho``, without a
    gradient: ρ‖∇L_B(θ)‖_* is linear in ρ, so the dual norms of ``result`` (``config["gradient_dual_norms"]``) and
    its losses at θ give every field (equal to a new evaluation at ``rho``; ``seconds`` 0). The fast path of a
    population's first-order measures at several sizes (one gradient per batch, not one per size)."""
    norms = (result.config or {}).get("gradient_dual_norms")
    if norms is None:
        raise ValueError(f"{result.measure} is not a first-order result (no gradient dual norms in its config)")
    rho = check_rho(rho)
    out = _linearised_fields(norms, result.loss_before, rho)
    per = out["per_batch"]
    return replace(result, rho=rho, mean=sum(per) / len(per), seconds=0.0, config=dict(result.config), **out)
