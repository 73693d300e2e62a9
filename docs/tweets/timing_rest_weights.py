"""Cost of recomputing per operation what does not change between Auto-PGD steps, in the tweets protocol: the
adaptive rest's weights c² and 1/c² (kept once computed: ``ProductSpace(cache_rest_weights=None)`` below
``geosharp_ref.sharpness.space.WEIGHT_CACHE_BYTES``; or computed again from θ in every norm, projection and
ascent step) together with the length buckets' parameters (put in place once per bucketed batch by
``geosharp_ref.forward.model_loss``; or once per group, ``group_by_group_loss``).

No model of the population: the pretrained all-MiniLM-L6-v2 with a fresh 3-class head (seeded 0), on the
population's first sharpness batch (the first 128 training tweets, max_length 64, 8 length buckets), one thread
(``timing_setup.py``), radius 0.036, runs of ``ITERS`` Auto-PGD iterations (each with its evaluation's setup: the
quotient, the buckets' check, the losses at θ). One process, the two ways in ABBA order ``REPS`` times per measure
(CPU seconds of each run, and the value and relative size as float hex, which must be equal bit for bit); the
one-call way is asserted to have run through ``_GroupsLoss``.

    .venv/bin/python docs/tweets/timing_rest_weights.py docs/tweets/timing_rest_weights.json
"""
import importlib
import json
import statistics
import sys
import time

from geosharp_ref import forward
from geosharp_ref.sharpness.measures import MEASURES
from timing_setup import pretrained_and_first_batch

ITERS, REPS = 6, 4
space_module = importlib.import_module("geosharp_ref.sharpness.space")
pipeline = importlib.import_module("geosharp_ref.sharpness.pipeline")
split, model, batch, smap = pretrained_and_first_batch()
one_call = pipeline.model_loss
kept_bytes = space_module.WEIGHT_CACHE_BYTES


calls = [0]
groups_forward = forward._GroupsLoss.forward


def counted_forward(self, batch):
    calls[0] += 1
    return groups_forward(self, batch)


forward._GroupsLoss.forward = counted_forward


def group_by_group(model, params, batch, loss_fn=forward.default_loss):
    if isinstance(batch, forward.LengthBuckets):
        return forward.group_by_group_loss(model, params, batch, loss_fn)
    return one_call(model, params, batch, loss_fn)


WAYS = {"computed again, one call per group": (0, group_by_group), "kept, one call per batch": (kept_bytes, one_call)}
res = {}
for name in ("adaptive", "geodesic-inv"):
    m = MEASURES[name]
    kw = {} if m.metric is None else {"symmetry_map": smap}
    m.evaluate(model, [batch], 0.036, n_iter=1, seed=0, length_buckets=8, **kw)  # warm-up (the pairs' check)
    runs = {way: [] for way in WAYS}
    for i in range(REPS):
        for way in list(WAYS)[::1 if i % 2 == 0 else -1]:  # ABBA: neither way always runs first
            cache_bytes, loss = WAYS[way]
            space_module.WEIGHT_CACHE_BYTES, pipeline.model_loss = cache_bytes, loss
            calls[0] = 0
            c0 = time.process_time()
            r = m.evaluate(model, [batch], 0.036, n_iter=ITERS, seed=0, length_buckets=8, **kw)
            runs[way].append(dict(cpu_s=round(time.process_time() - c0, 2), value=float(r.mean).hex(),
                                  relative_size=float(r.median_relative_size).hex()))
            assert (calls[0] > 0) == (loss is one_call), (way, calls[0])
            print(name, way, runs[way][-1], flush=True)
    for way, rs in runs.items():
        res[f"{name}, {way}"] = dict(iterations=ITERS, cpu_s=[r["cpu_s"] for r in rs],
                                     median_cpu_s=statistics.median(r["cpu_s"] for r in rs),
                                     values={r["value"] for r in rs}.pop() if len({r["value"] for r in rs}) == 1
                                     else sorted({r["value"] for r in rs}),
                                     relative_size=rs[0]["relative_size"])
    a, b = (res[f"{name}, {way}"] for way in WAYS)
    res[f"{name}, ratio of medians"] = round(b["median_cpu_s"] / a["median_cpu_s"], 3)
    res[f"{name}, equal bit for bit"] = a["values"] == b["values"] and a["relative_size"] == b["relative_size"]
space_module.WEIGHT_CACHE_BYTES, pipeline.model_loss = kept_bytes, one_call
with open(sys.argv[1], "w") as fh:
    json.dump(res, fh, indent=1)
    fh.write("\n")
