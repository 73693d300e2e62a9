"""Cost of the tweets protocol's sharpness and curvature on a GPU (the device machine a session may be lent).

No model of the population. The pretrained checkpoint (88 MB) and the population's weights (≈ 90 MB per model)
are larger than what travels to the device machine (64 MiB), so this times a **random-weight model of
all-MiniLM-L6-v2's shape** (6 layers, hidden 384, 12 heads, vocabulary 30,522, 3 labels: the same arithmetic)
on the population's first sharpness batch (the first 128 training tweets at max_length 64: its token ids, mask
and labels, saved here by ``--save-batch``), float32, 8 length buckets. On the device: one full run of each
measure kind the protocol computes per model — Auto-PGD with 20 iterations for adaptive, geodesic-inv,
geodesic-mix and an ablation, the first-order measure, the Hutchinson trace (16 probes) and the top eigenvalue
(20 Lanczos steps) — wall seconds (after one short warm-up run), and from them the protocol's per-model and
80-model cost.

    .venv/bin/python docs/tweets/timing_device.py --save-batch .device/tweets_batch.pt    # here (CPU)
    python3 docs/tweets/timing_device.py .device/tweets_batch.pt OUT.json                # on the device
"""
import json
import sys
import time
import warnings

import torch

from geosharp_ref.sharpness.measures import MEASURES
from geosharp_ref.symmetry import symmetry_map

#: runs per model in the protocol (docs/tweets/PROTOCOL.md): 4 radii × 4 batches per Auto-PGD measure
PER_MODEL = {"adaptive": 16, "geodesic-inv": 16, "geodesic-mix": 16,  # main: 3 measures × 4 radii × 4 batches
             "geodesic-inv-first-order": 32,  # ablations: 4 measures × 2 radii × 4 batches (one timed for all)
             "adaptive-linearised": 48,  # first order: 3 measures × 4 radii × 4 batches, one gradient each
             "hessian-trace-mix": 3, "hessian-top-eigenvalue-mix": 3}  # curvature: 3 geometries each, 1 batch


def save_batch(path):
    from timing_setup import pretrained_and_first_batch  # the packaged corpus and tokenizer (not on the device)
    _, _, (x, y), _ = pretrained_and_first_batch()
    torch.save({"input_ids": x["input_ids"].clone(), "attention_mask": x["attention_mask"].clone(),
                "labels": y.clone()}, path)


def minilm_shaped(device):
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                     num_labels=3)
    cfg._attn_implementation = "eager"
    return BertForSequenceClassification(cfg).eval().to(device)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(batch_file, out, device="cuda", n_iter=20, probes=16, steps=20):
    warnings.filterwarnings("ignore")
    device = torch.device(device)
    b = torch.load(batch_file, weights_only=True)
    batch = ({"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}, b["labels"])
    model = minilm_shaped(device)
    smap = symmetry_map(model)
    res = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", torch=torch.__version__,
               model="random-weight all-MiniLM-L6-v2 shape, 3 labels, float32", batch=list(batch[0]["input_ids"].shape),
               real_tokens=float(batch[0]["attention_mask"].float().mean()), length_buckets=8, runs={})
    MEASURES["geodesic-mix"].evaluate(model, [batch], 0.05, n_iter=2, length_buckets=8, symmetry_map=smap)  # warm-up
    for name in PER_MODEL:
        m = MEASURES[name]
        opts = dict(n_iter=n_iter) if m.curvature is None else dict(probes=probes, steps=steps)
        _sync(device)
        t0 = time.perf_counter()
        r = m.evaluate(model, [batch], 0.05, seed=0, length_buckets=8,
                       **opts, **({} if m.metric is None else {"symmetry_map": smap}))
        _sync(device)
        res["runs"][name] = dict(wall_s=round(time.perf_counter() - t0, 3), value=r.mean)
        print(name, res["runs"][name], flush=True)
    per_model = sum(res["runs"][k]["wall_s"] * n for k, n in PER_MODEL.items())
    res["per_model_s"] = round(per_model, 1)
    res["population_80_h"] = round(80 * per_model / 3600, 2)
    res["runs_per_model"] = PER_MODEL
    print(res, flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "--save-batch":
        save_batch(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
