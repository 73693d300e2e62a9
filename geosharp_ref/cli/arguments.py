"""Pieces of the ``geosharp`` argparse tree that several commands share: the measure and task names, the data
file's format, ``--device`` and ``--length-buckets``. Light, as the parser is (no torch, no transformers, no
SymPy)."""
from __future__ import annotations

__all__ = ["add_device_option", "length_buckets_option", "DATA_FORMAT", "POPULATION_TASKS", "MEASURE_NAMES",
           "HEADLINE", "ABLATIONS", "LINEARISED", "EXACT_AND_AVERAGE", "CURVATURE", "POPULATION_RHOS",
           "DIAGNET_RHOS"]

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


def add_device_option(p):
    """``--device cpu|cuda|cuda:N`` (default: CUDA when available, else the CPU); resolved and validated by
    :func:`geosharp_ref.cli.common.resolve_device` (one shared option for every command that computes)."""
    p.add_argument("--device", metavar="DEV", default=None,
                   help="where to compute: cpu, cuda or cuda:N (default: cuda when available, else cpu)")


def length_buckets_option(p, default="default none"):
    p.add_argument("--length-buckets", type=int, default=None, metavar="K",
                   help="padded text: evaluate each batch as K groups of similar length, each cut to its longest "
                        "row (the same loss up to round-off, fewer token evaluations; refused where the model's "
                        f"real positions see the padding; {default})")
