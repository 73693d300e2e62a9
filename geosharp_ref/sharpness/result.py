"""What a sharpness evaluation returns, and the sizes that make measures comparable.

* :class:`SharpnessResult` — the mean over batches with everything needed to audit it (per-batch values,
  losses before and after, perturbation norms, relative sizes, the configuration);
* :func:`relative_perturbation` — ‖Δθ‖/‖θ‖ of a perturbed parameter dict, overall and per group;
* :func:`rho_for_size` — the radius at which a measure reaches a target relative size (matched perturbation
  size, from two probes).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

__all__ = ["SharpnessResult", "relative_perturbation", "rho_for_size"]


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
    #: per batch, the same ratio within each parameter group (``gl_pairs``: parameters covered by a
    #: quotiented symmetry; ``rest``: the others)
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
