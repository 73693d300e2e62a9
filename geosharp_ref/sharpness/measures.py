"""Entry points: adaptive and geodesic sharpness of a whole model, and the named measures.

    adaptive_sharpness(model, batches, rho)                 max_{‖δ‖₂ ≤ ρ} L(θ + |θ| ⊙ δ) − L(θ)
    geodesic_sharpness(model, batches, rho, metric="mix")   max_{ξ horizontal, ‖ξ‖_g ≤ ρ} L(γ_ξ(1)) − L(θ)

both averaged over the batches, each batch maximised by Auto-PGD (:func:`geosharp_ref.apgd.apgd`) in
the :class:`~geosharp_ref.sharpness.space.PerturbationSpace` of the model. :data:`MEASURES` names the
measures of the paper and its ablations (App. G) for studies and the command line.
"""
from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from ..apgd import apgd
from ..symmetry import SymmetryMap, symmetry_map as build_symmetry_map
from ..symmetry.catalogue import check_symmetry, find_symmetries
from .loss import check_finite_batch, default_loss, model_loss, to_device
from .factors import Factor, ProductSpace, gl_pair_factors
from .space import PerturbationSpace

__all__ = ["SharpnessResult", "relative_perturbation", "adaptive_sharpness", "geodesic_sharpness", "Measure", "MEASURES",
           "HEADLINE_MEASURES", "ABLATION_MEASURES", "LINEARISED_MEASURES", "get_measure", "prepare_inputs",
           "gradient_dual_norm", "linearised_sharpness", "check_padding_mask", "MAX_RHO", "rho_for_size",
           "generic_space", "resolve_symmetries", "yield_to"]


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------

@dataclass
class SharpnessResult:
    """Sharpness averaged over batches, with everything needed to audit it."""

    measure: str
    rho: float
    mean: float
    per_batch: list
    loss_before: list
    loss_after: list
    perturbation_norms: list
    seconds: float
    config: dict = field(default_factory=dict)
    trajectories: list = field(default_factory=list, repr=False)
    #: per batch, ‖Δθ‖/‖θ‖ of the best perturbation found (Δθ = γ_ξ(1) − θ over every parameter; 0 where
    #: no perturbation raised the loss): the size that makes measures comparable at matched perturbation
    relative_size: list = field(default_factory=list)
    #: per batch, the same ratio within each parameter group (``gl_pairs``: parameters covered by a GL(h)
    #: pair group; ``rest``: the others)
    relative_size_groups: list = field(default_factory=list)

    @property
    def median_relative_size(self) -> float:
        """The median over batches of :attr:`relative_size`."""
        v = sorted(self.relative_size)
        if not v:
            return float("nan")
        k = len(v) // 2
        return v[k] if len(v) % 2 else 0.5 * (v[k - 1] + v[k])

    def to_dict(self, trajectories: bool = False):
        d = asdict(self)
        if not trajectories:
            d.pop("trajectories")
        return d


# ------------------------------------------------------------------------------------------------

#: the largest radius accepted: beyond it the perturbation is larger than the weights themselves
MAX_RHO = 10.0
#: trailing padding tokens in one row that mark a batch as padded text (random ids rarely end in a run)
PAD_RUN = 3


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


def prepare_inputs(model, batches, rho, dtype):
    if isinstance(rho, bool) or not (isinstance(rho, (int, float)) and rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be a positive finite number, got {rho!r}")
    if rho > MAX_RHO:
        raise ValueError(f"rho = {rho:g} is larger than {MAX_RHO:g}: the perturbation would be larger than the "
                         f"weights themselves (adaptive ρ is relative to |θ|); typical radii are 1e-3 to 1")
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


def rho_for_size(probe_rhos, probe_sizes, targets) -> list:
    """Radii at which a measure's relative weight change reaches each target size, from two probes:
    log s is a line in log ρ through (ρ₁, s₁) and (ρ₂, s₂) (s ∝ ρ^slope; slope 1 to first order)."""
    (r1, r2), (s1, s2) = [float(r) for r in probe_rhos], [float(x) for x in probe_sizes]
    if not (0 < r1 < r2 and s1 > 0 and s2 > 0):
        raise ValueError(f"cannot fit ρ ↦ ‖Δθ‖/‖θ‖ from probes ρ {probe_rhos} with sizes {probe_sizes}: the probes "
                         f"must be increasing and must move the weights (a batch at a loss maximum does not)")
    slope = math.log(s2 / s1) / math.log(r2 / r1)
    if not slope > 0:
        raise ValueError(f"the relative weight change did not grow with ρ between the probes {probe_rhos} "
                         f"(sizes {probe_sizes}); choose other probe radii")
    return [r1 * (float(t) / s1) ** (1.0 / slope) for t in targets]


def relative_perturbation(params: dict, perturbed: dict, pair_params=()) -> dict:
    """``{"overall": ‖Δθ‖/‖θ‖, "gl_pairs": …, "rest": …}`` with Δθ = perturbed − params, the norms taken
    over all floating-point parameters, those named in ``pair_params``, and the others (a group without
    parameters, or of zero norm, is left out)."""
    sums = {"overall": [0.0, 0.0], "gl_pairs": [0.0, 0.0], "rest": [0.0, 0.0]}
    pair_params = set(pair_params)
    with torch.no_grad():
        for n, p in params.items():
            if not p.is_floating_point():
                continue
            d2 = float((perturbed[n] - p).double().square().sum())
            p2 = float(p.double().square().sum())
            for key in ("overall", "gl_pairs" if n in pair_params else "rest"):
                sums[key][0] += d2
                sums[key][1] += p2
    return {k: math.sqrt(d2 / p2) for k, (d2, p2) in sums.items() if p2 > 0}


def _as_factor(symmetry, eps):
    """A :class:`Factor` as given, or one built from a binding that names its ``kernels``."""
    if isinstance(symmetry, Factor):
        return symmetry
    if not hasattr(symmetry, "kernels"):
        raise ValueError(f"{symmetry!r} is neither a Factor nor a binding with a `kernels` attribute (e.g. "
                         f"geosharp_ref.symmetry.ReLUUnitsBinding)")
    return Factor(symmetry.kernels, symmetry, eps)


def _model_space(model, batches, rho, dtype, smap, symmetries=None, **space_options):
    """Checked inputs, the model in the evaluation dtype and its perturbation space (the pairs of ``smap``,
    the rest adaptive; ``smap`` None: adaptive everywhere). With ``symmetries`` (a list of factors or
    bindings, possibly empty) the space is the generic :class:`ProductSpace`: the pairs of ``smap`` as
    ``gl_<metric>`` factors, then the given ones, the rest adaptive."""
    params, batches, _, dtype = prepare_inputs(model, batches, rho, dtype)
    if dtype != next(model.parameters()).dtype:
        model = copy.deepcopy(model).to(dtype)
    groups, masks = ((), None) if smap is None else (smap.groups, smap.adaptive_masks)
    if symmetries is None:
        return model, params, batches, dtype, groups, PerturbationSpace(params, groups, masks, **space_options)
    unsupported = {k: v for k, v in space_options.items()
                   if (k, v) in (("metric_norm", False), ("gradient", "perturbed"))}
    if unsupported:
        raise ValueError(f"the generic path (symmetries=…) does not offer {unsupported} yet; drop the option or "
                         f"the symmetries")
    symmetries = resolve_symmetries(model, symmetries, batches[0], space_options.get("metric") or "mix", smap)
    space = generic_space(params, smap, space_options.get("metric"), symmetries, eps=space_options.get("eps", 0.0),
                          geodesic_correction=space_options.get("geodesic_correction", True),
                          adaptive_offset=space_options.get("adaptive_offset", 0.0),
                          exclude=space_options.get("exclude", ()))
    return model, params, batches, dtype, space.pair_groups, space


def resolve_symmetries(model, symmetries, batch, metric: str = "mix", smap=None) -> list:
    """The list of factors/bindings ``symmetries`` stands for: ``"all"`` (or an ``"all"`` entry in a list) is
    every built-in symmetry :func:`~geosharp_ref.symmetry.catalogue.find_symmetries` binds on ``batch``,
    less those sharing a parameter with the explicitly given ones. Declared bindings not yet checked
    (:class:`~geosharp_ref.symmetry.declared.DeclaredBinding`) are checked here on ``batch``
    (:func:`~geosharp_ref.symmetry.catalogue.check_symmetry`: ValueError with the measured change)."""
    if isinstance(symmetries, str):
        symmetries = [symmetries]
    explicit = [s for s in symmetries if not isinstance(s, str)]
    words = [s for s in symmetries if isinstance(s, str)]
    if any(w != "all" for w in words):
        raise ValueError(f"unknown symmetries entry {next(w for w in words if w != 'all')!r}: give factors, bindings "
                         f"or 'all'")
    for s in explicit:  # a declaration is used only once it is measured to be a symmetry of this model
        if getattr(s, "checked", True) is False:
            check_symmetry(model, s, batch)
    if not words:
        return explicit
    taken = {n for s in explicit for n in _as_factor(s, 0.0).binding.param_names}
    found = find_symmetries(model, batch, metric=metric, smap=smap).bindings
    return explicit + [b for b in found if not taken.intersection(b.param_names)]


def generic_space(params, smap, metric, symmetries, eps: float = 0.0, **options) -> ProductSpace:
    """The generic :class:`ProductSpace` at ``params``: the attention pairs of ``smap`` (None: none) as
    ``gl_<metric>`` factors (``metric`` None: left adaptive), then ``symmetries`` (factors or bindings), the
    rest adaptive. Pairs that share a parameter with a given symmetry yield to it (:func:`yield_to`); the
    space records ``pair_groups`` (the pairs kept) and ``yielded``. With ``metric`` None every parameter no
    symmetry binds is adaptive."""
    extra = [_as_factor(sym, eps) for sym in symmetries]
    covered = {}
    for f in extra:
        for n in f.binding.param_names:
            if n in covered:
                raise ValueError(f"parameter {n!r} is bound twice, by {covered[n]} and {f.binding.key}; a parameter "
                                 f"belongs to one symmetry")
            covered[n] = f.binding.key
    groups, masks, yielded = ((), None, []) if smap is None or not metric else yield_to(smap, covered)
    factors = (gl_pair_factors(groups, metric, eps) if metric else []) + extra
    masks = {n: m for n, m in (masks or {n: None for n in params}).items() if n not in covered}
    space = ProductSpace(params, factors, masks, **options)
    space.pair_groups, space.yielded = list(groups), yielded
    return space


def yield_to(smap, covered: dict):
    """The attention pairs of ``smap`` that share no parameter with the given symmetries (``covered``:
    parameter name → key of the symmetry that binds it), the adaptive masks without the others, and
    ``(pair key, reason)`` for each pair that yields. A parameter belongs to one symmetry: an attention pair
    acting on a LoRA-adapted projection moves the adapter's B, so quotienting the adapter's GL(r) instead
    leaves that pair's weights to the adaptive geometry."""
    kept, yielded = [], []
    for g in smap.groups:
        taken = sorted({covered[n] for n in g.param_names if n in covered})
        if taken:
            yielded.append((g.key, f"shares parameters with {', '.join(taken)} (a parameter belongs to one "
                                   f"symmetry): its weights are adaptive instead"))
        else:
            kept.append(g)
    if not yielded:
        return list(smap.groups), smap.adaptive_masks, []
    return kept, SymmetryMap(kept, smap.param_shapes, smap.refused).adaptive_masks, yielded


def _evaluate(model, measure, batches, rho, *, metric=None, smap=None, n_iter=20, loss_fn=default_loss,
              eps=0.0, geodesic_correction=True, metric_norm=True, gradient="exact", random_start=False, seed=0,
              dtype=None, exclude=(), adaptive_offset=0.0, progress=False, keep_trajectories=False, symmetries=None):
    t0 = time.perf_counter()
    model, params, batches, dtype, groups, space = _model_space(
        model, batches, rho, dtype, smap, symmetries, metric=metric, eps=eps, geodesic_correction=geodesic_correction,
        metric_norm=metric_norm, gradient=gradient, adaptive_offset=adaptive_offset, exclude=exclude)
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    per, before, after, norms, trajs, sizes, size_groups = [], [], [], [], [], [], []
    pair_params = {n for g in groups for n in g.param_names} | (
        {n for f in space.factors for n in f.binding.param_names} if isinstance(space, ProductSpace) else set())
    try:
        with torch.no_grad():  # L(θ) of every batch first: bad targets are refused before any progress bar
            losses = [float(model_loss(model, params, batch, loss_fn)) for batch in batches]
        iterator = zip(batches, losses)
        if progress:
            from tqdm.auto import tqdm
            iterator = tqdm(iterator, total=len(batches), desc=f"{measure} sharpness", unit="batch")
        for batch, l0 in iterator:
            f_and_grad = space.value_and_grad(lambda params, batch=batch: model_loss(model, params, batch, loss_fn))
            res = apgd(f_and_grad, space, rho, n_iter=n_iter, random_start=random_start, generator=gen)
            best = max(res.best_value, l0)
            per.append(best - l0)
            before.append(l0)
            after.append(best)
            raised = res.best_value >= l0
            norms.append(space.norm(res.best_xi) if raised else 0.0)
            with torch.no_grad():
                rel = (relative_perturbation(params, space.perturbed_params(res.best_xi), pair_params) if raised
                       else relative_perturbation(params, params, pair_params))
            sizes.append(rel["overall"])
            size_groups.append({k: v for k, v in rel.items() if k != "overall"})
            if keep_trajectories:
                trajs.append(res.values)
    finally:
        model.train(was_training)
    config = dict(metric=metric, n_iter=n_iter, eps=eps, geodesic_correction=geodesic_correction, gradient=gradient,
                  metric_norm=metric_norm, random_start=random_start, seed=seed, dtype=str(dtype),
                  pairs=len(groups), heads=sum(g.num_heads for g in groups),
                  adaptive_params=len(space.adaptive_names),
                  factors=[f.binding.key for f in space.factors] if isinstance(space, ProductSpace) else None,
                  yielded=[list(y) for y in getattr(space, "yielded", [])])
    return SharpnessResult(measure=measure, rho=float(rho), mean=sum(per) / len(per), per_batch=per,
                           loss_before=before, loss_after=after, perturbation_norms=norms,
                           seconds=time.perf_counter() - t0, config=config, trajectories=trajs,
                           relative_size=sizes, relative_size_groups=size_groups)


def gradient_dual_norm(model, space: PerturbationSpace, batch, loss_fn=default_loss) -> float:
    """‖∇L_B(θ)‖_* = √g(grad, grad): the metric norm of the horizontal Riemannian gradient of the batch
    loss at θ in ``space`` (the dual norm of ∇L on the horizontal space; for the adaptive space
    ‖|θ| ⊙ ∇L‖₂). ρ‖∇L‖_* is the maximum of the loss's linearisation over the ρ-ball."""
    xi = [z.requires_grad_(True) for z in space.zeros()]
    loss = model_loss(model, space.perturbed_params(xi), batch, loss_fn)
    grads = torch.autograd.grad(loss, xi, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(xi, grads)]
    return float(space.norm(space.ascent_direction([x.detach() for x in xi], grads)))


def linearised_sharpness(model, batches, rho, *, metric=None, symmetry_map=None, loss_fn=default_loss, eps=0.0,
                         dtype=None, exclude=(), **_ignored) -> SharpnessResult:
    """First-order sharpness ρ‖∇L_B(θ)‖_* averaged over batches: adaptive (``metric`` None) or in the
    quotient geometry ``metric`` of the model's GL(h) pairs. One gradient per batch, no Auto-PGD
    (options of the Auto-PGD measures such as ``n_iter`` are accepted and ignored)."""
    t0 = time.perf_counter()
    smap = None
    if metric is not None:
        smap = symmetry_map if symmetry_map is not None else build_symmetry_map(model)
    model, params, batches, dtype, groups, space = _model_space(model, batches, rho, dtype, smap, metric=metric,
                                                                eps=eps, exclude=exclude)
    was_training = model.training
    model.eval()
    try:
        norms = [gradient_dual_norm(model, space, b, loss_fn) for b in batches]
        with torch.no_grad():
            before = [float(model_loss(model, params, b, loss_fn)) for b in batches]
    finally:
        model.train(was_training)
    per = [rho * g for g in norms]
    name = "adaptive-linearised" if metric is None else f"geodesic-{metric}-linearised"
    config = dict(metric=metric, eps=eps, dtype=str(dtype), pairs=len(groups),
                  heads=sum(g.num_heads for g in groups), gradient_dual_norms=norms)
    return SharpnessResult(measure=name, rho=float(rho), mean=sum(per) / len(per), per_batch=per,
                           loss_before=before, loss_after=[b + v for b, v in zip(before, per)],
                           perturbation_norms=[float(rho)] * len(per), seconds=time.perf_counter() - t0,
                           config=config)


def adaptive_sharpness(model, batches, rho, *, n_iter=20, loss_fn=default_loss, exclude=(),
                       random_start=False, seed=0, dtype=None, offset=0.0, progress=False,
                       keep_trajectories=False) -> SharpnessResult:
    """Worst-case L2 adaptive sharpness: max_{‖δ‖₂ ≤ ρ} L(θ + |θ| ⊙ δ) − L(θ), mean over batches."""
    return _evaluate(model, "adaptive", batches, rho, n_iter=n_iter, loss_fn=loss_fn, exclude=exclude,
                     random_start=random_start, seed=seed, dtype=dtype, adaptive_offset=offset,
                     progress=progress, keep_trajectories=keep_trajectories)


def geodesic_sharpness(model, batches, rho, *, metric="mix", n_iter=20, loss_fn=default_loss,
                       eps=0.0, geodesic_correction=True, metric_norm=True, gradient="exact", symmetry_map=None,
                       exclude=(), random_start=False, seed=0, dtype=None, progress=False,
                       keep_trajectories=False, symmetries=None) -> SharpnessResult:
    """Geodesic sharpness on the quotient by the attention GL(h) symmetries (paper Algorithm 1).

    ``symmetry_map`` defaults to :func:`geosharp_ref.symmetry.symmetry_map` of the model; a model
    with no recognised attention falls back to adaptive sharpness everywhere (with a warning).

    ``symmetries``: further symmetries to quotient, a list of :class:`~geosharp_ref.sharpness.factors.Factor`
    or bindings (:mod:`geosharp_ref.symmetry.bindings`); the evaluation then runs the generic
    :class:`~geosharp_ref.sharpness.factors.ProductSpace` (attention pairs as ``gl_<metric>`` factors, the
    given factors, the rest adaptive). None (default): the attention pairs on the GL fast path."""
    if metric not in ("inv", "mix"):
        raise ValueError(f"unknown metric {metric!r}; choose 'inv' or 'mix'")
    with warnings.catch_warnings():
        if symmetries:  # no attention pairs is fine when other symmetries are quotiented
            warnings.filterwarnings("ignore", message="symmetry_map: no GL")
        smap = symmetry_map if symmetry_map is not None else build_symmetry_map(model)
    if not smap.groups and not symmetries:
        warnings.warn("no GL(h) attention pairs found: geodesic sharpness equals adaptive sharpness here",
                      stacklevel=2)
    return _evaluate(model, f"geodesic-{metric}", batches, rho, metric=metric, smap=smap, n_iter=n_iter,
                     loss_fn=loss_fn, eps=eps, geodesic_correction=geodesic_correction, gradient=gradient,
                     metric_norm=metric_norm, random_start=random_start, seed=seed, dtype=dtype,
                     exclude=exclude, progress=progress, keep_trajectories=keep_trajectories,
                     symmetries=symmetries)


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
        if self.linearised:
            return linearised_sharpness(model, batches, rho, metric=self.metric, symmetry_map=symmetry_map,
                                        **options)
        if self.metric is None:
            return adaptive_sharpness(model, batches, rho, **options)
        return geodesic_sharpness(model, batches, rho, metric=self.metric, symmetry_map=symmetry_map,
                                  geodesic_correction=self.geodesic_correction, metric_norm=self.metric_norm,
                                  **options)


HEADLINE_MEASURES = (Measure("adaptive"), Measure("geodesic-inv", "inv"), Measure("geodesic-mix", "mix"))
ABLATION_MEASURES = tuple(Measure(f"geodesic-{m}-{suffix}", m, **kw)
                          for suffix, kw in (("first-order", dict(geodesic_correction=False)),
                                             ("frobenius", dict(metric_norm=False)))
                          for m in ("inv", "mix"))
#: ρ times the dual norm of the gradient in each geometry (the maximum of the loss's linearisation)
LINEARISED_MEASURES = (Measure("adaptive-linearised", linearised=True),
                       Measure("geodesic-inv-linearised", "inv", linearised=True),
                       Measure("geodesic-mix-linearised", "mix", linearised=True))
#: every named measure, by name
MEASURES = {m.name: m for m in HEADLINE_MEASURES + ABLATION_MEASURES + LINEARISED_MEASURES}


def get_measure(name: str) -> Measure:
    """The :class:`Measure` called ``name`` (one of :data:`MEASURES`)."""
    try:
        return MEASURES[name]
    except KeyError:
        raise ValueError(f"unknown measure {name!r}; choose from {list(MEASURES)}") from None
