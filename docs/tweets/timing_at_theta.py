"""What an evaluation computes at θ alone (each batch's length buckets, their check against the plain batch, the
losses L_B(θ)), computed again in every evaluation of a model or kept from its previous one
inside ``at_theta.keeping(model)``, as a population's units are (:mod:`geosharp_ref.sharpness.at_theta`): the
CPU seconds one evaluation saves when they are kept.

No model of the population: the pretrained all-MiniLM-L6-v2 with a fresh 3-class head (seeded 0), on the
population's first four sharpness batches (training tweets 0–511 in batches of 128, max_length 64, 8 length
buckets), one thread (``timing_setup.py``). The unit timed is a first-order measure (adaptive-linearised: one
gradient per batch), the population's cheapest, in ABBA order ``REPS`` times: "computed again" outside a scope,
"kept" inside one, after an untimed evaluation of the same model on the same batches there. Values and losses as
float hex (equal bit for bit).

    .venv/bin/python docs/tweets/timing_at_theta.py docs/tweets/timing_at_theta.json
"""
import contextlib
import json
import statistics
import sys
import time

from geosharp_ref.sharpness import at_theta
from geosharp_ref.sharpness.measures import MEASURES
from timing_setup import pretrained_and_first_batch

REPS = 4
split, model, _, _ = pretrained_and_first_batch()
batches = [({k: v[i * 128:(i + 1) * 128] for k, v in split.pool.items()}, split.y_pool[i * 128:(i + 1) * 128])
           for i in range(4)]
m = MEASURES["adaptive-linearised"]
m.evaluate(model, batches, 1e-3, length_buckets=8)  # warm-up
runs = {"computed again": [], "kept": []}
scope = None
for i in range(REPS):
    for way in list(runs)[::1 if i % 2 == 0 else -1]:
        if way == "computed again" and scope is not None:
            scope.close()
            scope = None
        elif way == "kept" and scope is None:
            scope = contextlib.ExitStack()
            scope.enter_context(at_theta.keeping(model))
            m.evaluate(model, batches, 1e-3, length_buckets=8)  # what is kept, computed once (untimed)
        c0 = time.process_time()
        r = m.evaluate(model, batches, 1e-3, length_buckets=8)
        runs[way].append(dict(cpu_s=round(time.process_time() - c0, 2), per_batch=[float(v).hex() for v in r.per_batch],
                              loss_before=[float(v).hex() for v in r.loss_before]))
        print(way, runs[way][-1]["cpu_s"], flush=True)
res = {way: dict(cpu_s=[x["cpu_s"] for x in rs], median_cpu_s=statistics.median(x["cpu_s"] for x in rs))
       for way, rs in runs.items()}
res["saved_cpu_s_per_evaluation (difference of medians)"] = round(
    res["computed again"]["median_cpu_s"] - res["kept"]["median_cpu_s"], 2)
records = [(x["per_batch"], x["loss_before"]) for rs in runs.values() for x in rs]
res["equal bit for bit"] = all(rec == records[0] for rec in records)
res["per_batch"], res["loss_before"] = records[0]
with open(sys.argv[1], "w") as fh:
    json.dump(res, fh, indent=1)
    fh.write("\n")
