"""``geosharp demo``: derive, generate and verify the built-in geometries, then a small population study."""
from __future__ import annotations

import argparse

from ..studies.population.options import MIN_STUDY_MODELS, check_training
from ..studies.population.study import run_study
from ..verification.kernel_checks import verification_table
from . import derive

__all__ = ["run"]


def run(args) -> int:
    """Derive, generate, verify; then a small population study (resumes on a rerun)."""
    if args.population_models > 0:  # checked before deriving anything: a refused study must not cost the derivation
        try:
            check_training(args.population_models, min_models=MIN_STUDY_MODELS)
        except ValueError as exc:  # the same rule as `population study`, named by demo's option
            raise ValueError(str(exc).replace("--models", "--population-models", 1)) from None
    print("geosharp demo: derive the built-in quotient geometries, generate their kernels, verify them\n")
    rc = derive.run(argparse.Namespace(spec=None, out=None, check=False))
    if rc:
        return rc
    print()
    ok, table = verification_table()
    print(table)
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    if not ok:
        return 1
    if args.population_models <= 0:
        return 0
    print(f"\npopulation study: {args.population_models} tiny ViTs on sklearn digits, trained, evaluated "
          f"(adaptive / geodesic-inv / geodesic-mix sharpness) and correlated with their generalization gap "
          f"-> {args.population_out} (rerun to resume; full populations: `geosharp population study`)\n", flush=True)
    run_study(args.population_out, task="vision", n_models=args.population_models, epochs_max=40,
              rhos=(0.01, 0.05), n_batches=4, batch_size=32, n_iter=10, n_boot=500)
    return 0
