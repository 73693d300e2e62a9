"""The first gradient of every Auto-PGD run and every first-order measure of a model, from the model evaluated in
the run's space at ξ = 0 (the readable path, as before) or from the batch's Euclidean gradient at θ kept for all of
the model's evaluations in its scope and mapped into the space (:func:`geosharp_ref.sharpness.pipeline.at_zero`):
the CPU seconds one run saves, and how far the values move.

No model of the population: the pretrained all-MiniLM-L6-v2 with a fresh 3-class head (seeded 0), on the
population's first sharpness batches (training tweets 0–511 in batches of 128, max_length 64, 8 length buckets),
one thread (``timing_setup.py``).

1. Per space (adaptive, geodesic-inv, geodesic-mix), on the first batch, in ABBA order ``REPS`` times: the CPU of
   the first gradient on the readable path and from the kept gradient (a forward and backward against the pairing
   alone), and the largest difference of the cotangents, relative to the largest entry (float32).
2. A whole 20-iteration geodesic-inv Auto-PGD evaluation of the first batch, in ABBA order twice: the readable path
   (``at_zero`` replaced by the model in the space) against the kept gradient, inside one scope: CPU seconds,
   the value, its relative difference.

    .venv/bin/python docs/tweets/timing_gradient_at_theta.py docs/tweets/timing_gradient_at_theta.json
"""
import json
import statistics
import sys
import time

import torch

from geosharp_ref.forward import model_loss
from geosharp_ref.sharpness import at_theta, pipeline
from geosharp_ref.sharpness.measures import MEASURES
from timing_setup import pretrained_and_first_batch

REPS = 4
RHO = 0.01
split, model, _, smap = pretrained_and_first_batch()
batches = [({k: v[i * 128:(i + 1) * 128] for k, v in split.pool.items()}, split.y_pool[i * 128:(i + 1) * 128])
           for i in range(4)]
readable_at_zero = pipeline.at_zero


def readable(model, space, batch, loss_fn=pipeline.default_loss, xi=None):
    """The model evaluated in the space at ξ = 0 (what every run computed before)."""
    xi = space.zeros() if xi is None else xi
    return space.value_and_grad(lambda p: model_loss(model, p, batch, loss_fn))(xi)


out = dict(rho=RHO, reps=REPS, first_gradient={}, auto_pgd={})
with at_theta.keeping(model):
    for measure in ("adaptive", "geodesic-inv", "geodesic-mix"):
        m = MEASURES[measure]
        setup = pipeline.evaluation_space(model, batches[:1], m.metric, smap=smap)
        space, params = setup.space, setup.params
        batch = pipeline.bucket_batches(model, params, setup.batches, 8)[0]
        readable_at_zero(model, space, batch)  # the kept gradient, computed once (untimed)
        runs = {"model in the space": [], "kept gradient": []}
        grads = {}
        for i in range(REPS):
            for way in list(runs)[::1 if i % 2 == 0 else -1]:
                c0 = time.process_time()
                value, grad = (readable if way == "model in the space" else readable_at_zero)(model, space, batch)
                runs[way].append(round(time.process_time() - c0, 3))
                grads[way] = (value, grad)
                print(measure, way, runs[way][-1], flush=True)
        (v_ref, g_ref), (v, g) = grads["model in the space"], grads["kept gradient"]
        top = max(float(t.abs().max()) for t in g_ref if t.numel())
        out["first_gradient"][measure] = dict(
            cpu_s={w: r for w, r in runs.items()}, median_cpu_s={w: statistics.median(r) for w, r in runs.items()},
            largest_cotangent_difference_relative=max(float((a - b).abs().max()) for a, b in zip(g, g_ref)
                                                      if a.numel()) / top,
            value_model_in_the_space=float(v_ref).hex(), value_kept=float(v).hex())
    m = MEASURES["geodesic-inv"]
    runs = {"model in the space": [], "kept gradient": []}
    values = {}
    for i in range(2):
        for way in list(runs)[::1 if i % 2 == 0 else -1]:
            pipeline.at_zero = readable if way == "model in the space" else readable_at_zero
            c0 = time.process_time()
            r = m.evaluate(model, batches[:1], RHO, n_iter=20, length_buckets=8, symmetry_map=smap)
            runs[way].append(round(time.process_time() - c0, 2))
            values.setdefault(way, []).append(r.per_batch[0])
            print("auto-pgd", way, runs[way][-1], r.per_batch[0], flush=True)
    pipeline.at_zero = readable_at_zero
    a, b = values["model in the space"][0], values["kept gradient"][0]
    out["auto_pgd"] = dict(cpu_s=runs, median_cpu_s={w: statistics.median(r) for w, r in runs.items()},
                           per_batch={w: [float(x).hex() for x in v] for w, v in values.items()},
                           relative_difference=abs(a - b) / abs(a),
                           repeatable=all(len(set(v)) == 1 for v in values.values()))
out["torch_threads"] = torch.get_num_threads()
with open(sys.argv[1], "w") as fh:
    json.dump(out, fh, indent=1)
    fh.write("\n")
