"""``geosharp diagnet``: the diagonal-network experiment (paper Figure 3 / Table 1, first row)."""
from __future__ import annotations

from ..studies.diagnet.experiment import run_experiment

__all__ = ["run"]


def run(args) -> int:
    """Train the population, compute sharpness at every ρ, write results.json, models.csv, diagnet.png."""
    if args.models < 3:
        raise ValueError(f"--models must be at least 3 (Kendall τ needs three models), got {args.models}")
    run_experiment(n_models=args.models, seed=args.seed, out_dir=args.out, rhos=tuple(args.rho),
                   n_iter=args.iters, progress=not args.no_progress, apgd_models=args.apgd_models)
    return 0
