"""Average-case sharpness, on the quotient and adaptive (issue 27 item 2).

On the quotient (``metric`` "inv"/"mix", the one perturbation space of
:func:`~geosharp_ref.sharpness.pipeline.build_space`):

    S_avg(θ) = E_ξ[L_B(γ_ξ(1))] − L_B(θ),   averaged over batches B,

with ξ drawn from a distribution on the horizontal space ℋ that only the metric g defines:

* ``distribution="sphere"`` (default): ξ uniform on the metric sphere {ξ ∈ ℋ : ‖ξ‖_g = ρ}. (The uniform
  distribution on the ball ‖ξ‖_g ≤ ρ puts its radius at ρ·U^{1/d}, d = dim ℋ ≈ the number of parameters, so
  on a model it is the sphere to within O(1/d); the sphere needs no d.)
* ``distribution="gaussian"``: ξ ~ N(0, ρ² I_g) on ℋ, i.e. ρ times a standard Gaussian in g-orthonormal
  coordinates of ℋ.

γ_ξ(1) is the second-order geodesic, or the RK4-integrated one with ``geodesic="exact"``
(:mod:`~geosharp_ref.sharpness.exact_geodesic`).

Sampling a g-isotropic Gaussian: ξ = P_ℋ B z with z ~ N(0, I) and B Bᵀ = 𝔾⁻¹ per factor (P_ℋ is
g-orthogonal, so P_ℋ of a g-isotropic Gaussian is one on ℋ); the sphere normalises it, ξ ρ/‖ξ‖_g. B is built
from the base point so that it is *equivariant*: under ψ(A, θ) the same z gives ψ_* ξ, so with common random
numbers (a fixed generator) the Monte Carlo estimate itself is invariant along orbits, not only its mean:

    inv  (row covariance GᵀG):       ξ_G = W G,             W ∈ R^{n×n} Gaussian     (→ W G A under G ↦ G A)
    mix  (row covariance (HᵀH)⁻¹):   ξ_G = W H (HᵀH)⁻¹,     W ∈ R^{n×m} Gaussian
    the same for ξ_H with G ↔ H; h = 1 (GL(1) units): ξ_G = z √(GᵀG) resp. z/√(HᵀH) (equivariant for a > 0);
    with a relaxation ε > 0, + √ε Z inside (covariance GᵀG + εI, resp. (HᵀH + εI)⁻¹);
    diag_inv: ξ_u = |u| z;  diag_mix: ξ_u = z/|v|;  scaling: ξ = √tr(WᵀW) z;  translation: ξ = z;
    the adaptive rest (metric Σ ξ²/c²): ξ = c ⊙ z.

(the RoPE subgroup factors use the GL pair metrics, so their samplers.) A declared symmetry with another
metric has no sampler here and is refused. Cost per sample: one forward pass, plus O(n²h) per head for inv.

Adaptive average-case sharpness (``metric=None``) follows Andriushchenko et al., "A modern look at the
relationship between sharpness and generalization", ICML 2023 (tml-epfl/sharpness-vs-generalization,
``eval_average_sharpness`` with ``adaptive=True, norm='l2'``):

    S_avg^ρ(w, c) = E_{δ ~ N(0, ρ² diag(c²))} L_B(w + δ) − L_B(w),   c = |w|,

which is ``distribution="gaussian"`` of the adaptive space (ξ = ρ c ⊙ z); ``"sphere"`` gives the adaptive
sphere ‖δ ⊘ c‖₂ = ρ for a like-for-like comparison with the quotient measure.

Monte Carlo: per batch the mean of ``n_samples`` differences L_B(γ_ξ(1)) − L_B(θ) and its standard error
s/√n (s the sample standard deviation); over batches the mean and √(Σ SE_b²)/B. Deterministic in ``seed``.
"""
from __future__ import annotations

import math
import time

import torch

from ..forward import default_loss, model_loss
from .exact_geodesic import ExactGeodesicAt
from .factors import GenericFactorAt
from .gl_factor import GLPairFactorAt
from .pipeline import EvaluationOptions, bucket_batches, check_rho, evaluation_space
from .result import SharpnessResult, relative_perturbation
from .space import Tangent

__all__ = ["average_case_sharpness", "isotropic_sample", "sample_perturbation", "DISTRIBUTIONS", "DEFAULT_SAMPLES"]

#: the distributions of ξ (module doc)
DISTRIBUTIONS = ("sphere", "gaussian")
#: Monte Carlo samples per batch unless given
DEFAULT_SAMPLES = 32


def _randn(shape, like, gen):
    return torch.randn(shape, generator=gen, dtype=like.dtype).to(like.device)


def _gl_block(X, Y, metric, eps, gen):
    """ξ_X for the pair block X (its partner Y): covariance per row GᵀG (+εI) for inv, (YᵀY + εI)⁻¹ for mix."""
    n, h = X.shape[-2], X.shape[-1]
    if metric == "inv":
        if h == 1:
            out = _randn(X.shape, X, gen) * (X.mT @ X + eps).sqrt()
        else:
            out = _randn(X.shape[:-2] + (n, n), X, gen) @ X
            if eps:
                out = out + math.sqrt(eps) * _randn(X.shape, X, gen)
        return out
    S = Y.mT @ Y + eps * torch.eye(h, dtype=Y.dtype, device=Y.device)
    if h == 1:
        return _randn(X.shape, X, gen) / S.sqrt()
    inner = _randn(X.shape[:-2] + (n, Y.shape[-2]), X, gen) @ Y
    if eps:
        inner = inner + math.sqrt(eps) * _randn(X.shape, X, gen)
    return torch.linalg.solve(S, inner, left=False)


def _factor_sample(bound, gen) -> list:
    """B z for one factor at the base point (module doc)."""
    if isinstance(bound, ExactGeodesicAt):
        bound = bound.inner_factor
    if not bound.options.metric_norm:
        raise ValueError("average-case sharpness samples the metric ball: metric_norm=False has no metric to sample")
    if isinstance(bound, GLPairFactorAt):
        out = []
        for G, H in bound.pairs:
            out += [_gl_block(G, H, bound.factor.metric, bound.eps, gen), _gl_block(H, G, bound.factor.metric,
                                                                                   bound.eps, gen)]
        return out
    if isinstance(bound, GenericFactorAt):
        mod, point, eps = bound.factor.module, bound.point, bound.factor.eps
        kind = (mod.SYMMETRY, mod.METRIC)
        if kind[0] == "gl_pair" or kind[0].startswith("rope"):
            if kind[1] in ("inv", "mix"):
                G, H = point
                return [_gl_block(G, H, kind[1], eps, gen), _gl_block(H, G, kind[1], eps, gen)]
        elif kind == ("elementwise_rescaling", "inv"):
            return [p.abs() * _randn(p.shape, p, gen) for p in point]
        elif kind == ("elementwise_rescaling", "mix"):
            u, v = point
            return [_randn(u.shape, u, gen) / v.abs(), _randn(v.shape, v, gen) / u.abs()]
        elif kind == ("positive_scaling", "scale_invariant"):
            (W,) = point
            tr = (W * W).sum((-2, -1), keepdim=True) + eps * W.shape[-1]
            return [tr.sqrt() * _randn(W.shape, W, gen)]
        elif kind == ("translation", "euclidean"):
            return [_randn(p.shape, p, gen) for p in point]
        raise ValueError(f"average-case sharpness has no metric sampler for the {kind[0]!r} symmetry with metric "
                         f"{kind[1]!r} ({bound.factor.binding.key}); it samples the built-in geometries")
    raise ValueError(f"average-case sharpness cannot sample the factor {type(bound).__name__}")


def isotropic_sample(space, gen) -> Tangent:
    """P_ℋ B z: a standard Gaussian of the horizontal space in the metric of ``space`` (module doc)."""
    parts = [_factor_sample(b, gen) for b in space.bound]
    rest = [c * _randn(c.shape, c, gen) for c in space.scales]
    return space.project_horizontal(space._join(parts, rest))


def sample_perturbation(space, rho: float, distribution: str, gen) -> Tangent:
    """ξ on the metric sphere of radius ρ (``"sphere"``) or ρ times a g-standard Gaussian (``"gaussian"``)."""
    xi = isotropic_sample(space, gen)
    s = rho / space.norm(xi) if distribution == "sphere" else rho
    return Tangent([x * s for x in xi], None, space)


def average_case_sharpness(model, batches, rho, *, metric=None, n_samples: int = DEFAULT_SAMPLES,
                           distribution: str = "sphere", geodesic: str = "second-order", steps=None, seed: int = 0,
                           symmetry_map=None, symmetries=None, loss_fn=default_loss, eps: float = 0.0, dtype=None,
                           exclude=(), progress: bool = False, measure=None, length_buckets=None,
                           **_ignored) -> SharpnessResult:
    """Average-case sharpness E_ξ[L(γ_ξ(1))] − L(θ) (module doc): on the quotient by the attention pairs (and
    ``symmetries``) under ``metric``, or adaptive (``metric=None``; ``distribution="gaussian"`` is
    Andriushchenko et al. 2023's). ``n_samples`` Monte Carlo draws per batch (common random numbers: one
    generator seeded ``seed``). Options of the Auto-PGD measures (``n_iter``, …) are accepted and ignored.

    The result's ``per_batch`` are the Monte Carlo means; ``config["standard_error"]`` the standard error of
    ``mean``, ``config["per_batch_standard_error"]`` those of the batches; ``perturbation_norms`` the mean
    ‖ξ‖_g; ``relative_size`` the mean ‖Δθ‖/‖θ‖ of the samples."""
    rho = check_rho(rho)
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; choose one of {DISTRIBUTIONS}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 2:
        raise ValueError(f"n_samples must be an integer of at least 2 (for a standard error), got {n_samples!r}")
    options = EvaluationOptions(metric=metric, eps=eps, dtype=dtype, exclude=exclude, geodesic=geodesic, steps=steps,
                                seed=seed, length_buckets=length_buckets)
    t0 = time.perf_counter()
    model, params, batches, space = setup = evaluation_space(
        model, batches, options.metric, dtype=options.dtype, smap=symmetry_map, symmetries=symmetries, eps=eps,
        stacklevel=4, **options.space_options)
    dtype, quotient = setup.dtype, space.quotient
    gen = torch.Generator().manual_seed(seed)
    per, se, before, after, norms, sizes = [], [], [], [], [], []
    was_training = model.training
    model.eval()
    name = measure or ("average-adaptive" if metric is None else f"average-geodesic-{metric}")
    try:
        iterator = batches = bucket_batches(model, params, batches, length_buckets, loss_fn)
        if progress:
            from tqdm.auto import tqdm
            iterator = tqdm(batches, desc=f"{name} sharpness", unit="batch")
        with torch.no_grad():
            for batch in iterator:
                l0 = float(model_loss(model, params, batch, loss_fn))
                diffs, nrm, rel = [], 0.0, 0.0
                for _ in range(n_samples):
                    xi = sample_perturbation(space, rho, distribution, gen)
                    moved = space.perturbed_params(xi)
                    diffs.append(float(model_loss(model, moved, batch, loss_fn)) - l0)
                    nrm += space.norm(xi) / n_samples
                    rel += relative_perturbation(params, moved)["overall"] / n_samples
                m = sum(diffs) / n_samples
                var = sum((d - m) ** 2 for d in diffs) / (n_samples - 1)
                per.append(m)
                se.append(math.sqrt(var / n_samples))
                before.append(l0)
                after.append(l0 + m)
                norms.append(nrm)
                sizes.append(rel)
    finally:
        model.train(was_training)
    config = dict(metric=metric, n_samples=n_samples, distribution=distribution, geodesic=geodesic,
                  steps=options.steps if geodesic == "exact" else None, seed=seed, eps=eps, dtype=str(dtype),
                  pairs=len(quotient.pairs), standard_error=math.sqrt(sum(s * s for s in se)) / len(se),
                  per_batch_standard_error=se)
    if length_buckets is not None:
        config["length_buckets"] = length_buckets
    return SharpnessResult(measure=name, rho=rho, mean=sum(per) / len(per), per_batch=per, loss_before=before,
                           loss_after=after, perturbation_norms=norms, seconds=time.perf_counter() - t0,
                           config=config, relative_size=sizes)
