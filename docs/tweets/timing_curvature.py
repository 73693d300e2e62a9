"""Cost of the quotient-curvature measures on the tweets protocol's sharpness batch (amendment 5).

No model of the population: the pretrained all-MiniLM-L6-v2 with a fresh 3-class head (seeded 0), on the
population's first sharpness batch (the first 128 training tweets, max_length 64), in 8 length buckets, one
thread. For each geometry (inv, mix, euclidean) the CPU seconds of ``curvature`` with 2 Hutchinson probes and
no eigenvalues, and with 3 Lanczos steps and no trace; the difference over the probe / step count gives the
cost of one Hessian-vector product and of one Lanczos step (each includes the operator's set-up once, which
the difference removes). One plain gradient of the same batch is timed beside them.

    .venv/bin/python docs/tweets/timing_curvature.py docs/tweets/timing_curvature.json
"""
import json
import sys
import time

import torch

from geosharp_ref.forward import model_loss
from geosharp_ref.sharpness.curvature import curvature
from geosharp_ref.sharpness.pipeline import bucket_batches
from geosharp_ref.studies.population.tweets import LENGTH_BUCKETS
from timing_setup import pretrained_and_first_batch

_, model, batch, smap = pretrained_and_first_batch()
res = dict(real_tokens=float(batch[0]["attention_mask"].float().mean()), length_buckets=LENGTH_BUCKETS, runs={})

params = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters()}
bucketed = bucket_batches(model, {n: p.detach() for n, p in params.items()}, [batch], LENGTH_BUCKETS)[0]
c0 = time.process_time()
torch.autograd.grad(model_loss(model, params, bucketed), list(params.values()))
res["gradient_cpu_s"] = round(time.process_time() - c0, 2)
print("gradient", res["gradient_cpu_s"], flush=True)


def timed(geometry, probes, k, steps=None):
    c0 = time.process_time()
    r = curvature(model, [batch], geometry, k=k, probes=probes, steps=steps, seed=0, length_buckets=LENGTH_BUCKETS,
                  smap=None if geometry == "euclidean" else smap)
    return time.process_time() - c0, r


for geometry in ("inv", "mix", "euclidean"):
    t1, _ = timed(geometry, 1, 0)
    t3, _ = timed(geometry, 3, 0)
    s1, _ = timed(geometry, 0, 1, steps=1)
    s3, _ = timed(geometry, 0, 1, steps=3)
    res["runs"][geometry] = dict(hvp_cpu_s=round((t3 - t1) / 2, 2), lanczos_step_cpu_s=round((s3 - s1) / 2, 2),
                                 setup_cpu_s=round(t1 - (t3 - t1) / 2, 2))
    print(geometry, res["runs"][geometry], flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(res, f, indent=1)
