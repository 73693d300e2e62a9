"""Cost of Auto-PGD's restarts in the tweets protocol: the best point's gradient kept (the default below
``geosharp_ref.apgd.KEEP_GRADIENT_BYTES``) against evaluated again on each restart (``KEEP_GRADIENT_BYTES`` = 0).

No model of the population: the pretrained all-MiniLM-L6-v2 with a fresh 3-class head (seeded 0), on the
population's first sharpness batch (the first 128 training tweets, max_length 64, 8 length buckets), one thread
(``timing_setup.py``). For adaptive and geodesic-inv at the radii of ``timing_buckets.py``: one full 20-iteration
Auto-PGD run each way, its CPU seconds, its gradient evaluations, and the value and relative size as float hex
(equal bit for bit where the iterates are).

    .venv/bin/python docs/tweets/timing_restarts.py docs/tweets/timing_restarts.json
"""
import importlib
import json
import sys
import time

from geosharp_ref.sharpness import space as space_module
from geosharp_ref.sharpness.measures import MEASURES
from timing_setup import pretrained_and_first_batch

apgd_module = importlib.import_module("geosharp_ref.apgd")  # the module, not the function the package exports
split, model, batch, smap = pretrained_and_first_batch()
calls = [0]
value_and_grad = space_module.ProductSpace.value_and_grad


def counted(self, loss):
    f_and_grad = value_and_grad(self, loss)

    def f(xi):
        calls[0] += 1
        return f_and_grad(xi)
    return f


space_module.ProductSpace.value_and_grad = counted
res = {}
for name, rho in (("adaptive", 0.09), ("geodesic-inv", 0.036)):
    m = MEASURES[name]
    for mode, keep_bytes in (("evaluated again", 0), ("kept", apgd_module.KEEP_GRADIENT_BYTES)):
        apgd_module.KEEP_GRADIENT_BYTES = keep_bytes
        calls[0] = 0
        c0 = time.process_time()
        r = m.evaluate(model, [batch], rho, n_iter=20, seed=0, length_buckets=8,
                       **({} if m.metric is None else {"symmetry_map": smap}))
        res[f"{name}, best point's gradient {mode}"] = dict(
            cpu_s=round(time.process_time() - c0, 1), gradient_evaluations=calls[0], value=float(r.mean).hex(),
            relative_size=float(r.median_relative_size).hex())
        print(name, mode, res[f"{name}, best point's gradient {mode}"], flush=True)
with open(sys.argv[1], "w") as fh:
    json.dump(res, fh, indent=1)
    fh.write("\n")
