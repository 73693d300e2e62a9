"""Train populations of transformers (generic over the task; resumable, atomic model directories).

Data split (fixed by ``split_seed``): a fixed permutation of the task's examples; the last ``n_test``
are the test set, the others the *pool*. A model trains on ``pool[:train_size]`` (nested subsets), so the
*sharpness subset* ``pool[:batches · batch_size]`` (clean labels, fixed order, fixed batches) lies in
every model's training set whenever ``train_size ≥ batches · batch_size``.

Hyper-parameters per model come from the task's sampler (``task.sample_hparams``; by default
``random.Random(seed · 1000 + index)`` draws learning rate, weight decay, epochs, batch size, training-set
size, label noise (a fraction of training labels replaced by a different random class), augmentation
(the task's), linear warm-up fraction, and the init/order seed). Train error is measured on the labels
the model was trained on (noisy ones included), test error on the clean test set; gap = test error −
train error.

Resumability: each model directory is written to a temporary directory and moved in place with
``os.replace`` (a model directory either exists complete or not at all), so an interrupted ``train``
continues with the missing models.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import shutil
import time
import warnings
from pathlib import Path

import torch

from ...forward import length_buckets
from ...io.data import slice_inputs
from ...io.durable import exclusive_lock, fsync_dir, fsync_tree, write_json_atomic
from ...io.models import quiet_transformers
from .manifest import MANIFEST, MANIFEST_FORMAT
from .options import check_training
from .task import PopulationTask, Split
from .tasks import get_task

__all__ = ["sample_hparams", "train_one", "fit_one", "measure_one", "write_model_dir", "write_record",
           "train_model_dir", "train_population", "TRAIN_LOCK", "error_and_loss", "batched_logits",
           "logits_by_length", "lr_factor"]

#: held by ``population train`` and ``population pipeline`` (which trains the models not yet trained): one trainer
TRAIN_LOCK = ".train.lock"


def sample_hparams(index: int, seed: int = 0, epochs_max: int | None = None, train_size_max: int | None = None,
                   task: PopulationTask | str = "vision") -> dict:
    """Hyper-parameters of model ``index`` (deterministic in ``seed``, ``index``; the task's sampler)."""
    task = get_task(task) if isinstance(task, str) else task
    return task.sample_hparams(index, seed, epochs_max, train_size_max)


def batched_logits(model, inputs, n: int, bs: int = 256):
    """The logits of ``model`` on the ``n`` examples of ``inputs``, without gradients, in batches of ``bs``:
    yields ``(batch slice, logits (batch, classes))`` in order. Gradient mode is restored before each yield,
    so a caller that stops early does not leave it off."""
    for i in range(0, n, bs):
        with torch.no_grad():
            logits = model(**slice_inputs(inputs, slice(i, i + bs))).logits
        yield slice(i, i + bs), logits


def logits_by_length(model, inputs, n: int, bs: int = 256) -> torch.Tensor:
    """The logits (n, classes) of ``model`` on the ``n`` examples of ``inputs`` (padded text), in their order,
    without gradients: evaluated in ⌈n / bs⌉ groups of rows of similar length, each cut to its longest row
    (:func:`geosharp_ref.forward.length_buckets`), so padding costs almost nothing; equal to
    :func:`batched_logits` up to round-off, which it is for inputs without an ``attention_mask`` (images)."""
    if not (isinstance(inputs, dict) and "attention_mask" in inputs):
        return torch.cat([logits for _, logits in batched_logits(model, inputs, n, bs)])
    buckets = length_buckets((inputs, torch.zeros(n, dtype=torch.long)), max(1, math.ceil(n / bs)))
    out = None
    for rows, (x, _) in zip(buckets.rows, buckets.groups):
        with torch.no_grad():
            logits = model(**x).logits
        out = logits.new_empty((n, logits.shape[-1])) if out is None else out
        out[rows] = logits
    return out


def error_and_loss(model, inputs, y, bs=256):
    """``(error, mean cross-entropy)`` of ``model`` on ``inputs`` with labels ``y`` (argmax prediction)."""
    wrong, loss = 0, 0.0
    for s, logits in batched_logits(model, inputs, len(y), bs):
        wrong += int((logits.argmax(-1) != y[s]).sum())
        loss += float(torch.nn.functional.cross_entropy(logits, y[s], reduction="sum"))
    return wrong / len(y), loss / len(y)


def lr_factor(step: int, warm: int, total: int, schedule: str = "constant") -> float:
    """Learning-rate factor at optimiser step ``step`` (0-based): linear warm-up over ``warm`` steps,
    then 1 (``constant``) or a linear decay that reaches 0 after ``total`` steps (``linear``)."""
    if warm and step < warm:
        return (step + 1) / warm
    if schedule == "linear":
        return max(0.0, (total - step) / max(1, total - warm))
    return 1.0


def train_one(hparams: dict, split: Split, task: PopulationTask | str = "vision", arch: dict | None = None,
              measure: bool = True):
    """Train one model of ``task`` on ``split``; returns ``(model, metrics)`` (``metrics`` None where ``measure``
    is false: the weights alone, as :func:`geosharp_ref.studies.population.pack.rebuild_model` needs them).

    AdamW (``lr``, ``weight_decay``), linear warm-up over the first ``warmup`` fraction of the steps
    (then constant, or a linear decay to 0 where the task's ``lr_schedule`` is ``linear``),
    cross-entropy with ``label_smoothing`` (default 0), ``epochs`` passes over ``pool[:train_size]`` in shuffled mini-batches of ``batch_size``; a
    ``label_noise`` fraction of the training labels is replaced by a different random class, and
    ``augment`` applies the task's augmentation to each batch. Train error is measured on the labels
    the model was trained on (noisy ones included), test error on the clean test set,
    gap = test error − train error. The same as :func:`fit_one` then, with ``measure``, :func:`measure_one`."""
    model, fitted = fit_one(hparams, split, task, arch)
    return model, (measure_one(model, split, fitted) if measure else None)


def fit_one(hparams: dict, split: Split, task: PopulationTask | str = "vision", arch: dict | None = None):
    """The training of :func:`train_one` without its error passes: ``(model, fitted)``, ``fitted`` what
    :func:`measure_one` needs (the training inputs, the labels trained on, the clean labels, the counts)."""
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
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warm, total, task.lr_schedule))
    smoothing = float(h.get("label_smoothing", 0.0))
    model.train()
    for _ in range(h["epochs"]):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, bs):
            b = perm[i:i + bs]
            xb = slice_inputs(x_tr, b)
            if h["augment"]:
                xb = task.augment(xb, gen)
            loss = torch.nn.functional.cross_entropy(model(**xb).logits, y_tr[b], label_smoothing=smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    return model, dict(x_tr=x_tr, y_tr=y_tr, y_clean=y_clean, n=n, n_noisy=n_noisy, steps=total)


def measure_one(model, split: Split, fitted: dict) -> dict:
    """The metrics of a model :func:`fit_one` trained (``fitted`` its second value): train error and loss on the
    labels trained on, train error on the clean labels, test error and loss, gap = test error − train error."""
    x_tr, n = fitted["x_tr"], fitted["n"]
    train_err, train_loss = error_and_loss(model, x_tr, fitted["y_tr"])
    train_err_clean, _ = error_and_loss(model, x_tr, fitted["y_clean"])
    test_err, test_loss = error_and_loss(model, split.test, split.y_test)
    return dict(train_error=train_err, train_loss=train_loss, train_error_clean_labels=train_err_clean,
                test_error=test_err, test_loss=test_loss, gap=test_err - train_err,
                train_examples=n, noisy_labels=fitted["n_noisy"], steps=fitted["steps"])


def _train_task(task):
    """Worker entry point: train one model and write its directory atomically. Returns (name, record)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    root, name, hparams, data_spec, arch, task_name = task
    final = Path(root) / "models" / name
    if final.is_dir():
        return name, json.loads((final / "geosharp_model.json").read_text())
    return name, train_model_dir(root, name, hparams, data_spec, arch, task_name)


def train_model_dir(root, name: str, hparams: dict, data_spec: dict, arch: dict, task_name: str) -> dict:
    """Train model ``name`` of the population in ``root`` (:func:`train_one`, with the caller's threads) and move
    its directory in place atomically (``models/NAME``, written to ``models/.tmp-NAME-PID`` first: it exists
    whole or not at all); returns its record. The caller makes sure no other process trains the same model."""
    root = Path(root)
    final = root / "models" / name
    t0 = time.perf_counter()
    ptask = get_task(task_name)
    model, metrics = train_one(hparams, ptask.load_split(data_spec, root), ptask, arch)
    tmp = root / "models" / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    record = dict(name=name, task=task_name, hparams=hparams, metrics=metrics, split_seed=data_spec["split_seed"],
                  data=data_spec, arch=arch)
    record = write_model_dir(tmp, model, ptask, root, record, t0)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    return record


def write_model_dir(path, model, task: PopulationTask, root, record: dict, t0: float | None = None) -> dict:
    """Write a trained model's directory ``path`` (not yet in place): its weights and config
    (``save_pretrained``), the task's extras (a tokenizer) and its record ``geosharp_model.json`` (indented,
    key-sorted; with ``t0``, the ``time.perf_counter()`` its training began at, its ``seconds`` until now), every
    file fsync'd. Returns the record."""
    path = Path(path)
    with quiet_transformers():
        model.save_pretrained(path)
    task.save_extras(path, root)
    record = write_record(path, record, t0)
    fsync_tree(path)
    return record


def write_record(path, record: dict, t0: float | None = None) -> dict:
    """Write a model's record ``geosharp_model.json`` into the directory ``path`` (indented, key-sorted, fsync'd;
    with ``t0``, its ``seconds`` since then); returns the record."""
    if t0 is not None:
        record = dict(record, seconds=round(time.perf_counter() - t0, 3))
    with open(Path(path) / "geosharp_model.json", "w") as f:
        f.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return record


def _init_worker():
    torch.set_num_threads(1)


def train_population(out, n_models: int = 32, seed: int = 0, split_seed: int = 0, n_test: int | None = None,
                     epochs_max: int | None = None, workers: int = 2, train_size_max: int | None = None,
                     arch: dict | None = None, progress: bool = True, task: PopulationTask | str = "vision") -> dict:
    """Train (or finish training) a population of ``task`` models in ``out``; returns the manifest.

    Models whose directory exists are skipped; ``workers`` > 1 uses spawned 1-thread processes. ``task``
    is a built-in task's name or a task object (its name must be a built-in one: worker processes
    rebuild it by name, everything else they need is in the manifest's data spec and architecture)."""
    ptask = get_task(task) if isinstance(task, str) else task
    check_training(n_models, seed, split_seed, epochs_max, train_size_max, workers)
    out = Path(out)
    arch = dict(arch or ptask.arch)
    epochs_max = ptask.epochs_max if epochs_max is None else epochs_max
    data_spec = ptask.data_spec(split_seed, n_test)
    plan = dict(kind=ptask.kind, task=ptask.name, seed=seed, epochs_max=epochs_max,
                train_size_max=train_size_max, data=data_spec, arch=arch)
    models = [dict(name=f"model_{i:03d}", dir=f"models/model_{i:03d}",
                   hparams=sample_hparams(i, seed, epochs_max, train_size_max, ptask)) for i in range(n_models)]
    mpath = out / MANIFEST
    if mpath.exists():
        try:
            old = json.loads(mpath.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{mpath} is not a valid population manifest (corrupt JSON: {exc}); restore it, or "
                             f"delete {out} and train again") from None
        if not isinstance(old, dict) or old.get("plan") != plan:
            raise ValueError(f"{mpath} was written with different settings "
                             f"({old.get('plan') if isinstance(old, dict) else old!r}); "
                             f"use another --out or the same options")
    (out / "models").mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out / TRAIN_LOCK, busy=f"another `geosharp population train` or `pipeline` is training "
                                               f"the population in {out}; wait for it to finish"):
        return _train_missing(out, ptask, plan, models, workers, progress)


def _train_missing(out: Path, ptask: PopulationTask, plan: dict, models: list, workers: int, progress: bool) -> dict:
    """The body of :func:`train_population`, under its lock."""
    data_spec, arch = plan["data"], plan["arch"]
    mpath = out / MANIFEST
    for stale in (out / "models").glob(".tmp-*"):  # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    manifest = dict(format=MANIFEST_FORMAT, plan=plan, models=models, complete=False)
    write_json_atomic(mpath, manifest)
    ptask.prepare(out, data_spec)

    tasks = [(str(out), m["name"], m["hparams"], data_spec, arch, ptask.name) for m in models]
    todo = [t for t in tasks if not (out / "models" / t[1]).is_dir()]
    records = {}
    from tqdm.auto import tqdm

    bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"train {ptask.name} population",
               unit="model", disable=not progress)
    if workers > 1 and len(todo) > 1:
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
    write_json_atomic(mpath, manifest)
    return manifest


