"""The ``geosharp`` command line.

    geosharp derive [--spec FILE.py] [--out DIR] [--check]
    geosharp demo
    geosharp evaluate MODEL_DIR --data FILE --rho R --metric adaptive|inv|mix [options]
    geosharp verify MODEL_DIR [--data FILE] [--rho 0.05] [--scales 0.01,1,100] [--seed 0]
    geosharp population train|evaluate|correlate --out DIR [options]

``derive`` imports the SymPy engine (derivations, codegen) lazily: the evaluator's run-time commands
(``evaluate``, ``verify``, implemented in :mod:`geosharp_ref.commands`) never import SymPy.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _derive(args) -> int:
    from codegen.builtins import generate_builtins
    from codegen.generate import GENERATED_DIR, write_modules
    from codegen.spec import generate_from_spec

    t0 = time.perf_counter()
    if args.spec:
        modules, timings = generate_from_spec(Path(args.spec), progress=_progress)
        out = Path(args.out) if args.out else Path.cwd() / "generated_kernels"
    else:
        modules, timings = generate_builtins(progress=_progress)
        out = Path(args.out) if args.out else GENERATED_DIR
    elapsed = time.perf_counter() - t0
    if args.check:
        stale = [m.name for m in modules if not (out / f"{m.name}.py").exists()
                 or (out / f"{m.name}.py").read_text() != m.source]
        if stale:
            print(f"stale generated modules in {out}: {', '.join(stale)}; run `geosharp derive`")
            return 1
        print(f"{len(modules)} generated modules in {out} are up to date ({elapsed:.1f} s)")
        return 0
    paths = write_modules(modules, out)
    print(f"derived and generated {len(paths)} modules in {elapsed:.1f} s -> {out}")
    return 0


def _progress(name, seconds):
    print(f"  {name:<24s} {seconds:6.2f} s", flush=True)


def _demo(args) -> int:
    from .verify_kernels import verification_table

    print("geosharp demo: derive the built-in quotient geometries, generate their kernels, verify them\n")
    rc = _derive(argparse.Namespace(spec=None, out=None, check=False))
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
    from .population import run_study

    print(f"\npopulation study: {args.population_models} tiny ViTs on sklearn digits, trained, evaluated "
          f"(adaptive / geodesic-inv / geodesic-mix sharpness) and correlated with their generalization gap "
          f"-> {args.population_out} (rerun to resume; full populations: `geosharp population study`)\n", flush=True)
    run_study(args.population_out, task="vision", n_models=args.population_models, epochs_max=40,
              rhos=(0.01, 0.05), n_batches=4, batch_size=32, n_iter=10, n_boot=500)
    return 0


DATA_FORMAT = """\
data file: written with torch.save({"inputs": X, "targets": y}, FILE), examples on the leading
dimension of every tensor. X is a tensor (passed positionally) or a dict of tensors (passed as
keyword arguments, e.g. {"input_ids": ..., "attention_mask": ...} or {"pixel_values": ...});
y holds integer class indices for the logits ((examples,) for a classifier). The loss is the mean
cross-entropy. MODEL_DIR is a local Hugging Face-format directory (save_pretrained); it is loaded
with eager attention, never downloaded."""


def _evaluate(args) -> int:
    from .commands import evaluate

    return evaluate(args)


def _verify(args) -> int:
    from .commands import verify

    return verify(args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="geosharp", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("derive", help="derive geometries and generate PyTorch kernel modules")
    p.add_argument("--spec", help="a Python file declaring SPEC = {module_name: Metric} (your own symmetry)")
    p.add_argument("--out", help="output directory (default: the package's codegen/generated for built-ins, "
                                 "./generated_kernels for --spec)")
    p.add_argument("--check", action="store_true", help="only check that the files on disk are up to date")
    p.set_defaults(func=_derive)
    p = sub.add_parser("demo", help="derive, generate and verify the built-in geometries, then run a small "
                                    "population study (tiny ViTs: train, evaluate, Kendall τ)")
    p.add_argument("--population-out", default="demo_population", metavar="DIR",
                   help="where the demo population is trained and evaluated (default ./demo_population; "
                        "a rerun resumes)")
    p.add_argument("--population-models", type=int, default=12, metavar="N",
                   help="models in the demo population (default 12; 0 skips the study)")
    p.set_defaults(func=_demo)

    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("evaluate", help="adaptive or geodesic sharpness of a saved model on a saved data set",
                       description="Worst-case adaptive or geodesic sharpness (Auto-PGD) of a local model, "
                                   "averaged over the first N·B examples of FILE split into N batches of B.",
                       epilog=DATA_FORMAT, formatter_class=raw)
    p.add_argument("model_dir", metavar="MODEL_DIR", help="local Hugging Face-format model directory")
    p.add_argument("--data", required=True, metavar="FILE", help="data file (format below)")
    p.add_argument("--rho", type=float, required=True, metavar="R", help="radius of the perturbation ball (> 0)")
    p.add_argument("--metric", required=True, choices=("adaptive", "inv", "mix"),
                   help="adaptive sharpness, or geodesic sharpness with the inv / mix quotient metric")
    p.add_argument("--batches", type=int, metavar="N", help="number of batches (default: all full batches)")
    p.add_argument("--batch-size", type=int, default=32, metavar="B", help="examples per batch (default 32)")
    p.add_argument("--iters", type=int, default=20, help="Auto-PGD iterations per batch (default 20)")
    p.add_argument("--eps", type=float, default=0.0,
                   help="Gram relaxation XᵀX + εI for rank-deficient heads (geodesic only; default 0)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--float64", action="store_true", help="evaluate in float64 (a copy of the model)")
    p.add_argument("--no-geodesic-correction", action="store_true",
                   help="ablation: θ + ξ instead of the second-order geodesic (geodesic only)")
    p.add_argument("--no-metric-norm", action="store_true",
                   help="ablation: Frobenius norm on the GL(h) pairs (geodesic only)")
    p.add_argument("--gradient", choices=("exact", "perturbed"), default="exact",
                   help="gradient in ξ: 'exact' differentiates through the ½γ̈ correction (default); "
                        "'perturbed' takes ∇L at the perturbed weights as in the paper's Algorithm 1 "
                        "(faster backward, geodesic only)")
    p.add_argument("--json", metavar="OUT", help="write the result (SharpnessResult.to_dict() plus model "
                                                 "and data paths) as JSON; parent directories are created")
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("verify", help="check that output and geodesic sharpness are invariant along "
                                      "GL(h) orbits of a saved model",
                       description="Orbit-invariance check: per scale a, draw A = a·Q·diag(u) per head "
                                   "(Q orthogonal, u ~ U[0.5, 2]), apply SymmetryMap.act to a float64 copy "
                                   "and compare logits, geodesic sharpness (inv, mix), Riemannian gradient "
                                   "norms and adaptive sharpness. Exit code 0 when everything but adaptive "
                                   "sharpness changes by at most 1e-6 (relative), 1 otherwise.",
                       epilog=DATA_FORMAT + "\nWithout --data a random batch that fits the model is used.",
                       formatter_class=raw)
    p.add_argument("model_dir", metavar="MODEL_DIR", help="local Hugging Face-format model directory")
    p.add_argument("--data", metavar="FILE", help="data file (format below); its first --batch-size examples")
    p.add_argument("--rho", type=float, default=0.05, help="radius (default 0.05)")
    p.add_argument("--scales", default="0.01,1,100", help="comma-separated scales a (default 0.01,1,100)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--iters", type=int, default=5, help="Auto-PGD iterations (default 5)")
    p.add_argument("--batch-size", type=int, default=4, metavar="B", help="examples in the batch (default 4)")
    p.set_defaults(func=_verify)
    sub.add_parser("diagnet", add_help=False,
                   help="diagonal-network experiment (paper Figure 3): `geosharp diagnet --help` for options")
    sub.add_parser("population", add_help=False,
                   help="populations of tiny ViTs: `geosharp population train|evaluate|correlate --out DIR` "
                        "(train offline, sharpness ρ sweep, Kendall τ vs generalization gap; torchrun-aware); "
                        "`geosharp population --help` for options")

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["derive"]:  # run-time commands: reuse freed heap memory across iterations
        from .cpu_allocator import keep_freed_memory

        keep_freed_memory()
    if argv[:1] == ["diagnet"]:  # its own parser (geosharp_ref.diagnet.main_diagnet)
        from .diagnet import main_diagnet

        return main_diagnet(argv[1:])
    if argv[:1] == ["population"]:  # its own parser (geosharp_ref.population.main_population)
        from .population import main_population

        return main_population(argv[1:])
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # clear one-line errors for declaration problems
        from_engine = type(exc).__module__.startswith(("derivations", "codegen"))
        if from_engine or isinstance(exc, (FileNotFoundError, ValueError)):
            print(f"geosharp: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
