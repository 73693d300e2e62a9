"""Hutchinson vs Hutch++ at the same number of Hessian-vector products, against the exact trace.

A one-attention classifier (``tests.cases.models.TinyAttention``: nn.MultiheadAttention, d = 8, 2 heads, mean
pooling, 3 classes; 315 parameters) is
trained in float64 with Adam (lr 1e-2) on 96 random sequences whose labels a linear rule of the mean token sets,
for 300 steps (train loss ≈ 2e-4, accuracy 1) and for 2,000 steps (≈ 5e-6). For its quotient Hessian (mix) and
its Euclidean Hessian the exact trace is the trace of the dense operator (its N columns); each estimator is run
with 200 seeds at 12, 24 and 48 HVPs. Reported: the root-mean-square error relative to |trace|, the mean error
in units of its standard error (unbiasedness), the share of ‖Ã‖_F² in the top 4 eigenvalues (what Hutch++'s
sketch can remove), and the share of estimates whose interval ±2 standard errors covers the exact trace.

    .venv/bin/python docs/curvature/trace_estimators.py docs/curvature/trace_estimators.json
"""
import json
import math
import sys
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from geosharp_ref.sharpness import build_space, model_loss
from geosharp_ref.sharpness.curvature import hutchinson_trace, hutchpp_trace
from geosharp_ref.sharpness.hessian import EuclideanHessian, QuotientHessian
from geosharp_ref.symmetry import symmetry_map

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the test suite's model table
from tests.cases.models import TinyAttention  # noqa: E402

DT = torch.float64
SEEDS = 200
MATVECS = (12, 24, 48)
ESTIMATORS = {"hutchinson": hutchinson_trace, "hutch++": hutchpp_trace}


def trained(steps):
    torch.manual_seed(0)
    model = TinyAttention(d=8, heads=2, classes=3).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(96, 5, 8, generator=gen, dtype=DT)
    y = (x.mean(1) @ torch.randn(8, 3, generator=gen, dtype=DT)).argmax(1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).to(DT).mean())
    return model, (x, y), float(loss.detach()), accuracy


def compare(op, bar):
    A = torch.stack([op.matvec_flat(e) for e in torch.eye(op.dim, dtype=DT)], 1)
    exact = float(A.trace())
    eigenvalues = torch.linalg.eigvalsh(0.5 * (A + A.T))
    squares = eigenvalues.pow(2)
    out = dict(dim=op.dim, exact_trace=exact, top4_share_of_frobenius=float(squares.sort().values[-4:].sum()
                                                                            / squares.sum()), rows=[])
    for m in MATVECS:
        for name, estimate in ESTIMATORS.items():
            runs = [estimate(op, m, generator=torch.Generator().manual_seed(s)) for s in range(SEEDS)]
            errors = torch.tensor([r.value - exact for r in runs], dtype=DT)
            out["rows"].append(dict(
                estimator=name, matvecs=m, relative_rmse=float(errors.pow(2).mean().sqrt()) / abs(exact),
                mean_error_in_standard_errors=float(errors.mean() / (errors.std() / math.sqrt(SEEDS))),
                coverage_2se=sum(abs(r.value - exact) <= 2 * r.stderr for r in runs) / SEEDS))
            bar.update()
    return out


def main(path):
    torch.set_num_threads(1)
    results = []
    with tqdm(total=2 * 2 * len(MATVECS) * len(ESTIMATORS), desc="trace estimators", unit="cell") as bar:
        for steps in (300, 2000):
            model, batch, loss, accuracy = trained(steps)
            params = {n: p.detach() for n, p in model.named_parameters()}
            loss_of = lambda p: model_loss(model, p, batch)  # noqa: E731
            for geometry, op in (("mix", QuotientHessian(build_space(params, symmetry_map(model), "mix"), loss_of)),
                                 ("euclidean", EuclideanHessian(params, loss_of))):
                results.append(dict(training_steps=steps, train_loss=loss, train_accuracy=accuracy,
                                    geometry=geometry, **compare(op, bar)))
    with open(path, "w") as f:
        json.dump(dict(seeds=SEEDS, matvecs=list(MATVECS), results=results), f, indent=1)
    for r in results:
        cells = {(row["estimator"], row["matvecs"]): row["relative_rmse"] for row in r["rows"]}
        print(r["training_steps"], r["geometry"], " ".join(
            f"m={m}: {cells['hutchinson', m]:.3f}/{cells['hutch++', m]:.3f}" for m in MATVECS))


if __name__ == "__main__":
    main(sys.argv[1])
