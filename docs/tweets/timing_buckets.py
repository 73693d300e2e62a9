"""Cost of the tweets protocol with length buckets (amendment 4), against the plain padded batches.

No model of the population: the pretrained all-MiniLM-L6-v2 with a fresh 3-class head (seeded 0), on the
population's first sharpness batch (the first 128 training tweets, max_length 64). One thread. For each headline
measure one full Auto-PGD run (20 iterations, the radii of timing.py) plain and with ``length_buckets=8``: CPU
seconds and the values; then test-set inference on 4,096 test tweets by ``batched_logits`` (the plain batches of
256) and by ``logits_by_length``: CPU seconds and the agreement of the predicted classes (no error is computed).

    .venv/bin/python docs/tweets/timing_buckets.py docs/tweets/timing_buckets.json
"""
import json
import sys
import time

import torch

from geosharp_ref.sharpness.measures import MEASURES
from geosharp_ref.studies.population.training import batched_logits, logits_by_length
from geosharp_ref.studies.population.tweets import LENGTH_BUCKETS
from timing_setup import pretrained_and_first_batch

split, model, batch, smap = pretrained_and_first_batch()
res = dict(real_tokens=float(batch[0]["attention_mask"].float().mean()), runs={})
for name, rho in (("adaptive", 0.09), ("geodesic-inv", 0.036), ("geodesic-mix", 0.053)):
    m = MEASURES[name]
    for k in (None, LENGTH_BUCKETS):
        c0 = time.process_time()
        r = m.evaluate(model, [batch], rho, n_iter=20, seed=0, length_buckets=k,
                       **({} if m.metric is None else {"symmetry_map": smap}))
        res["runs"][f"{name}, {'plain' if k is None else f'{k} buckets'}"] = dict(
            cpu_s=round(time.process_time() - c0, 1), value=r.mean, relative_size=r.median_relative_size)
        print(name, k, res["runs"][f"{name}, {'plain' if k is None else f'{k} buckets'}"], flush=True)
n = 4096
x = {k: v[:n] for k, v in split.test.items()}
c0 = time.process_time()
plain = torch.cat([lg for _, lg in batched_logits(model, x, n, 256)])
c1 = time.process_time()
fast = logits_by_length(model, x, n, 256)
c2 = time.process_time()
res["inference"] = dict(documents=n, plain_cpu_s=round(c1 - c0, 1), by_length_cpu_s=round(c2 - c1, 1),
                        same_class=int((plain.argmax(-1) == fast.argmax(-1)).sum()),
                        max_abs_logit_diff=float((plain - fast).abs().max()))
print(res["inference"], flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(res, f, indent=1)
