"""The one argparse tree of the ``geosharp`` command line.

Building it imports nothing heavy (no torch, no transformers, no SymPy), so ``geosharp --help`` and every
subcommand's help start fast; each command's implementation lives in its own module of this package and
is imported only when that command runs (:data:`COMMANDS`).
"""
from __future__ import annotations

import argparse

from .arguments import (DATA_FORMAT, DIAGNET_RHOS, MEASURE_NAMES, POPULATION_TASKS, add_device_option,
                        length_buckets_option)
from .population_parser import add_population_parser

__all__ = ["build_parser", "add_device_option", "COMMANDS", "DATA_FORMAT", "POPULATION_TASKS", "MEASURE_NAMES"]

#: command (or ``population`` action) -> the module of this package that runs it (``run(args)``)
COMMANDS = {"derive": "derive", "demo": "demo", "evaluate": "evaluate", "verify": "verify", "diagnet": "diagnet",
            "population": "population", "data": "data", "symmetries": "symmetries", "curvature": "curvature"}

DESCRIPTION = ("geosharp: derive quotient geometries of parameter symmetries, generate verified PyTorch "
               "kernels, and evaluate geodesic vs adaptive sharpness of real models.")


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
    length_buckets_option(p)
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
    length_buckets_option(p)
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
                add_population_parser, _add_curvature):
        add(sub)
    return parser
