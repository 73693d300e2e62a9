"""A population without its weights, and its weights rebuilt on demand (``geosharp population pack``).

A fine-tuned MiniLM's weights are ≈ 90 MB, too much for a repository, while everything else a population
directory holds (manifest, training records, test predictions, calibration, evaluation results and their resume
units) is small. The weights need not be kept: training is deterministic (one thread, seeded by the recipe), so a
model's weights are its recipe. A **pack** of a population has the population directory's layout with every
trained model *packed*: its directory keeps ``geosharp_model.json`` and a ``SHA256SUMS`` file with the SHA-256 of
every other file the trained directory held, but none of those files.

A packed model is rebuilt the first time a command loads it (:func:`rebuild_model`, called by
:func:`geosharp_ref.studies.population.evaluation.load_population_model`): it is trained again from its recorded
recipe with one thread (without the train and test error passes, whose values its record already holds), and
every rebuilt file must have its recorded SHA-256, else the command stops and nothing is installed. Two processes
that need the same packed model rebuild it once (the second waits). So a population survives a change of machine
through a commit of its pack, and ``cp -r PACK DIR`` continues it there. :func:`rebuild_population` (``geosharp
population rebuild``) rebuilds every packed model at once, in several one-thread processes, before a stage that
loads the models one after another (the test predictions of the reliability) would rebuild them one at a time.

Layout of a pack (``geosharp population pack --out DIR --to PACK``)::

    population.json and every other file and folder at the top of DIR (results, resume units, calibration, ...)
    models/model_000/geosharp_model.json, models/model_000/SHA256SUMS, ...

Left out: every other file of a model directory, names starting with "." (locks, temporary files) and a text
task's tokenized-data cache (``tokenized.pt``, rebuilt from the corpus). Models of an imported population live
outside it and are not packed. Packing only reads ``DIR``: it may run beside the training or an evaluation (a
model directory appears whole; a result line being appended may be torn, and every reader repairs a torn last
line).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import itertools
import multiprocessing as mp
import os
import re
import shutil
import signal
import sys
import time
import warnings
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch

from ...distributed import die_with_parent
from ...io.durable import append_line, exclusive_lock, file_digest, fsync_dir, fsync_tree
from ...io.machine import cpu_name
from ...io.models import quiet_transformers
from .manifest import MANIFEST, read_json_object, read_manifest
from .tasks import get_task
from .text import TOKENIZED
from .training import fit_one, measure_one, train_model_dir, write_record

__all__ = ["SUMS", "RECORD", "WEIGHTS", "RETRAINED", "STAMP", "read_sums", "model_sums", "is_packed",
           "check_packed_models", "pack_population", "rebuild_model", "rebuild_population", "weights_digest",
           "ensure_weights", "run_in_workers", "restore_swapped", "one_thread"]

SUMS = "SHA256SUMS"
RECORD = "geosharp_model.json"
#: a model directory's weights (``save_pretrained``'s safetensors file)
WEIGHTS = "model.safetensors"
#: one line per model retrained by :func:`ensure_weights` (its old and new weights' digests, the CPU)
RETRAINED = "retrained.jsonl"
_LINE = re.compile(r"^([0-9a-f]{64})  ([^/\\]+)$")


def model_sums(model_dir) -> dict:
    """``{file name: SHA-256}`` of every file of a model directory but its record and ``SHA256SUMS``."""
    return {p.name: file_digest(p) for p in sorted(Path(model_dir).iterdir())
            if p.is_file() and p.name not in (RECORD, SUMS)}


def read_sums(model_dir) -> dict:
    """The ``{file name: SHA-256}`` of a model directory's ``SHA256SUMS`` (lines ``<64 hex>  <name>``, as
    ``sha256sum`` writes them); a damaged file is refused."""
    path = Path(model_dir) / SUMS
    sums = {}
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        match = _LINE.match(line)
        if not match or match.group(2) in (RECORD, SUMS):
            raise ValueError(f"{path}: line {i} is not '<SHA-256 in 64 hex digits>  <file name>'; restore the file "
                             f"from the pack it came from")
        sums[match.group(2)] = match.group(1)
    if not sums:
        raise ValueError(f"{path} lists no file; restore it from the pack it came from")
    return sums


def is_packed(model_dir) -> bool:
    """True when ``model_dir`` has a ``SHA256SUMS`` and lacks a file it lists (its weights are to be rebuilt)."""
    model_dir = Path(model_dir)
    return (model_dir / SUMS).is_file() and any(not (model_dir / n).is_file() for n in read_sums(model_dir))


def check_packed_models(out, manifest: dict) -> None:
    """Read the ``SHA256SUMS`` of every model directory of ``manifest`` that has one: a damaged one is refused
    before a command writes anything."""
    _model_entries(Path(out), manifest)


def _write_sums(path: Path, sums: dict) -> None:
    path.write_text("".join(f"{h}  {n}\n" for n, h in sorted(sums.items())))


def _model_entries(out: Path, manifest: dict) -> list:
    """The manifest's trained models (a directory of their own inside ``out``), each checked to have its record."""
    entries = []
    for m in manifest["models"]:
        if "loader" in m or not isinstance(m.get("dir"), str):
            continue  # an imported model lives outside the population
        d = out / m["dir"]
        if not d.is_dir():
            continue  # not trained yet
        if not (d / RECORD).is_file():
            raise ValueError(f"{d} has no {RECORD}; it is not a model directory that `geosharp population train` "
                             f"wrote: delete it (the next `train` trains it again)")
        if (d / SUMS).is_file():
            read_sums(d)
        entries.append((m["name"], d))
    return entries


def _check_target(out: Path, to: Path, plan) -> None:
    src, dst = out.resolve(), to.resolve()
    if dst == src or src in dst.parents or dst in src.parents:
        raise ValueError(f"--to {str(to)!r} and the population {str(out)!r} contain one another; give a directory "
                         f"outside the population")
    if to.exists():
        old = to / MANIFEST
        try:
            same = to.is_dir() and read_json_object(old, "population manifest", keys=("plan",))["plan"] == plan
        except (OSError, ValueError):
            same = False
        if not same:
            raise ValueError(f"--to {str(to)!r} exists and is not a pack of this population (no {MANIFEST} with the "
                             f"same plan); give a new directory, or the pack this population was packed into before")


def pack_population(out, to) -> dict:
    """Write the pack of the population ``out`` into ``to`` (created, or an earlier pack of the same population
    replaced whole); returns ``{"models": packed models, "hashed": weights hashed now, "files": files written,
    "bytes": their size}``. Everything is checked before anything is written; ``out`` is only read."""
    out, to = Path(out), Path(to)
    manifest = read_json_object(out / MANIFEST, "population manifest", keys=("plan", "models"),
                                missing=f"{out} is not a population directory: give the --out of "
                                        f"`geosharp population train` or `import`")
    if not isinstance(manifest["models"], list) or not all(isinstance(m, dict) for m in manifest["models"]):
        raise ValueError(f"{out / MANIFEST} is not a valid population manifest (its 'models' is not a list of "
                         f"objects); restore it, or train the population again")
    _check_target(out, to, manifest["plan"])
    entries = _model_entries(out, manifest)
    tmp = to.parent / f".{to.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    hashed = 0
    try:
        tmp.mkdir(parents=True)
        for p in sorted(out.iterdir()):
            if p.name.startswith(".") or p.name in ("models", TOKENIZED):
                continue
            if p.is_dir():
                shutil.copytree(p, tmp / p.name, ignore=shutil.ignore_patterns(".*"))
            elif p.is_file():
                shutil.copy2(p, tmp / p.name)
        for name, d in entries:
            dst = tmp / "models" / name
            dst.mkdir(parents=True)
            shutil.copy2(d / RECORD, dst / RECORD)
            if (d / SUMS).is_file():  # packed, or rebuilt (and then checked against these sums)
                shutil.copy2(d / SUMS, dst / SUMS)
            else:
                _write_sums(dst / SUMS, model_sums(d))
                hashed += 1
        fsync_tree(tmp)
        files = [p for p in tmp.rglob("*") if p.is_file()]
        summary = dict(models=len(entries), hashed=hashed, files=len(files), bytes=sum(p.stat().st_size for p in files))
        old = to.parent / f".{to.name}.old-{os.getpid()}"
        if to.exists():
            os.replace(to, old)
        os.replace(tmp, to)
        fsync_dir(to.parent)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


def rebuild_model(out, entry: dict, progress: bool = True) -> bool:
    """Rebuild the weights of a packed model (``entry``: its manifest entry) in place; returns False when there was
    nothing to rebuild. The model is trained again from its record's recipe with one thread, each rebuilt file is
    checked against ``SHA256SUMS`` (a mismatch is refused and nothing is installed), then moved in place. A
    second process waits for the first one's rebuild. With ``progress``, one line on stderr says what is rebuilt."""
    out = Path(out)
    model_dir = out / entry["dir"]
    with exclusive_lock(out / "models" / f".rebuild-{entry['name']}.lock", wait=True):
        if not is_packed(model_dir):
            return False  # rebuilt by another process meanwhile
        refit = _refit(out, entry, progress)
        try:
            if refit.got != refit.sums:
                differ = sorted(n for n in set(refit.got) | set(refit.sums) if refit.got.get(n) != refit.sums.get(n))
                raise ValueError(f"{entry['name']}: the rebuilt model differs from its recorded SHA-256 in {differ}: "
                                 f"this code or these library versions do not reproduce its training; rebuild it "
                                 f"with the commit and environment that trained the population, or restore its "
                                 f"original directory")
            _install(refit.tmp, model_dir, refit.sums)
        finally:
            shutil.rmtree(refit.tmp, ignore_errors=True)
    return True


class _Refit:
    """A packed model trained again from its recipe (:func:`_refit`): its files written to ``tmp`` (not its
    record), their SHA-256 ``got``, the recorded ``sums``, and what :func:`ensure_weights` needs to measure it."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _refit(out: Path, entry: dict, progress: bool) -> _Refit:
    """Train a packed model again from its record's recipe with one thread (:func:`~.training.fit_one`, no error
    pass) and write its files (not its record) to ``models/.tmp-rebuild-NAME-PID``; the caller holds its lock."""
    model_dir = out / entry["dir"]
    sums = read_sums(model_dir)
    plan, task = _prepared_task(out)
    record = read_json_object(model_dir / RECORD, "model's training record", keys=("hparams",),
                              fix="restore it from the pack it came from")
    if progress:
        print(f"rebuilding the packed {entry['name']} of {out} from its recipe (as long as its training took)",
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    split = task.load_split(plan["data"], out)
    with one_thread():  # as every population model was trained
        model, fitted = fit_one(record["hparams"], split, task, plan["arch"])
    tmp = out / "models" / f".tmp-rebuild-{entry['name']}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with quiet_transformers():
            model.save_pretrained(tmp)
        task.save_extras(tmp, out)
        got = model_sums(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _Refit(tmp=tmp, got=got, sums=sums, record=record, model=model, fitted=fitted, split=split, task=task,
                  t0=t0)


@contextlib.contextmanager
def one_thread():
    """Torch runs one thread inside the block (as every population model was trained and measured), the caller's
    thread count restored after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _install(tmp: Path, model_dir: Path, sums: dict) -> None:
    """Move the rebuilt files ``sums`` names from ``tmp`` into ``model_dir``, the weights last (a model directory
    holding them all is not packed any more)."""
    fsync_tree(tmp)
    for n in sorted(sums, key=lambda n: (tmp / n).stat().st_size):
        os.replace(tmp / n, model_dir / n)
    fsync_dir(model_dir)


#: the field of every line written of a model (pipeline records, test predictions): the SHA-256 of its weights
STAMP = "weights_sha256"


def weights_digest(out, entry: dict) -> str:
    """The SHA-256 of a trained model's weights (``model.safetensors``): from its ``SHA256SUMS`` where it has one
    (packed, rebuilt or retrained), else hashed now. Every record the per-model pipeline writes of the model
    carries it (``weights_sha256``), so a record of other weights is recognised (:mod:`.pipeline`)."""
    model_dir = Path(out) / entry["dir"]
    if (model_dir / SUMS).is_file():
        sums = read_sums(model_dir)
        if WEIGHTS in sums:
            return sums[WEIGHTS]
    return file_digest(model_dir / WEIGHTS)


def ensure_weights(out, entry: dict, progress: bool = True) -> str:
    """The weights of a model on this machine, and their SHA-256 (:func:`weights_digest`).

    A model not trained yet (no directory) is trained now with one thread (:func:`~.training.train_model_dir`, as
    ``population train`` trains it; the caller holds the population's ``.train.lock``). A model whose files are all
    here is left as it is. A packed one is trained again from its recipe, once
    (:func:`_refit`): where every file has its recorded SHA-256 (the machine that trained it) the files are
    installed, as :func:`rebuild_model` does; where the weights (``model.safetensors``) differ (another CPU:
    amendment 12 of docs/tweets/PROTOCOL.md) the model is *retrained*: its errors are measured on the new weights
    (:func:`~.training.measure_one` with one thread, as training does), and the model directory is replaced whole by
    one with the new files, a new record (written as training writes it) and a new ``SHA256SUMS``. The old record
    and sums are kept in ``superseded/NAME-<first 16 hex digits of the old weights' digest>/`` and one line of
    ``retrained.jsonl`` (name, both digests, the CPU, no metric) says so. Equal weights with another file differing
    (a tokenizer or config written by other library versions) are refused, as :func:`rebuild_model` refuses them.
    The caller syncs the manifest's entry (:func:`.pipeline.sync_manifest_entry`). Two processes that need the same
    model wait for one another (``models/.rebuild-NAME.lock``)."""
    out = Path(out)
    model_dir = out / entry["dir"]
    with exclusive_lock(out / "models" / f".rebuild-{entry['name']}.lock", wait=True):
        restore_swapped(out, entry)
        if not model_dir.is_dir():
            _train_absent(out, entry, progress)
        if not is_packed(model_dir):
            return weights_digest(out, entry)
        refit = _refit(out, entry, progress)
        try:
            if refit.got == refit.sums:
                _install(refit.tmp, model_dir, refit.sums)
            elif refit.got.get(WEIGHTS) != refit.sums.get(WEIGHTS):
                _retrain(out, entry, refit)
            else:
                differ = sorted(n for n in set(refit.got) | set(refit.sums) if refit.got.get(n) != refit.sums.get(n))
                raise ValueError(f"{entry['name']}: the rebuilt weights have their recorded SHA-256 but {differ} "
                                 f"differ: these library versions write them otherwise; run with the environment "
                                 f"that trained the population")
        finally:
            shutil.rmtree(refit.tmp, ignore_errors=True)
    return weights_digest(out, entry)


def _train_absent(out: Path, entry: dict, progress: bool) -> None:
    """Train a model of the manifest that has no directory yet, with one thread, as ``population train`` does."""
    plan, _ = _prepared_task(out)
    if progress:
        print(f"training {entry['name']} of {out} from its recipe", file=sys.stderr, flush=True)
    with one_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_model_dir(out, entry["name"], entry["hparams"], plan["data"], plan["arch"], plan["task"])


def _prepared_task(out: Path) -> tuple[dict, object]:
    """``(plan, task)`` of the population in ``out`` (its manifest's plan), the task's data prepared."""
    plan = read_json_object(out / MANIFEST, "population manifest", keys=("plan",))["plan"]
    task = get_task(plan["task"])
    task.prepare(out, plan["data"])
    return plan, task


def _swap_dir(out: Path, entry: dict) -> Path:
    return out / "models" / f".swap-{entry['name']}"


def restore_swapped(out, entry: dict) -> None:
    """A retrain killed between its two renames left the old (packed) directory aside (``models/.swap-NAME``): put
    it back (it is retrained again); one killed after them left it beside the new one: remove it."""
    out = Path(out)
    swap, model_dir = _swap_dir(out, entry), out / entry["dir"]
    if swap.is_dir():
        if model_dir.exists():
            shutil.rmtree(swap)
        else:
            os.replace(swap, model_dir)
            fsync_dir(model_dir.parent)


def _retrain(out: Path, entry: dict, refit: _Refit) -> None:
    """Install a refit whose files differ from the recorded ones as a retrained model (see
    :func:`ensure_weights`)."""
    model_dir, tmp = out / entry["dir"], refit.tmp
    with one_thread():
        metrics = measure_one(refit.model, refit.split, refit.fitted)
    old = read_json_object(model_dir / RECORD, "model's training record", keys=("hparams",))
    record = {k: v for k, v in old.items() if k != "seconds"}
    record["metrics"] = metrics
    write_record(tmp, record, refit.t0)
    _write_sums(tmp / SUMS, refit.got)
    fsync_tree(tmp)
    archive = out / "superseded" / f"{entry['name']}-{refit.sums.get(WEIGHTS, 'none')[:16]}"
    archive.mkdir(parents=True, exist_ok=True)
    for n in (RECORD, SUMS):
        shutil.copy2(model_dir / n, archive / n)
    fsync_tree(archive)
    # the line first: a retrain killed after it and before the swap is done again, and writes the same line again
    # (readers count the distinct pairs of model and new digest)
    append_line(out / RETRAINED, dict(model=entry["name"], old_weights_sha256=refit.sums.get(WEIGHTS),
                                      weights_sha256=refit.got.get(WEIGHTS), cpu=cpu_name(),
                                      torch_cpu_capability=torch.backends.cpu.get_cpu_capability()))
    swap = _swap_dir(out, entry)
    os.replace(model_dir, swap)
    os.replace(tmp, model_dir)  # killed between the two: restore_swapped puts the old directory back
    fsync_dir(model_dir.parent)
    shutil.rmtree(swap, ignore_errors=True)


def rebuild_population(out, workers: int = 2, progress: bool = True) -> dict:
    """Rebuild every packed model of the population in ``out`` now (:func:`rebuild_model` each: trained again from
    its recipe with one thread and checked by SHA-256), in ``workers`` spawned processes, one model each at a time
    (1: in this process). Every ``SHA256SUMS`` is read first (a damaged one is refused before anything is rebuilt).
    A model that does not rebuild to its sums stops the rebuild: nothing of it is installed, the models being
    rebuilt beside it finish, and no further one starts. Resumable: a rebuilt model is not packed any more. Returns
    ``{"packed": models packed before, "rebuilt": models rebuilt here}`` (fewer where another process rebuilt one
    meanwhile)."""
    out = Path(out)
    manifest = read_manifest(out)
    packed = {name for name, d in _model_entries(out, manifest) if is_packed(d)}  # every SHA256SUMS read first
    todo = [m for m in manifest["models"] if m["name"] in packed]
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc="rebuild packed models", unit="model", disable=not progress or not todo)
    rebuilt = 0
    try:
        if workers > 1 and len(todo) > 1:
            rebuilt = _rebuild_in_workers(out, todo, workers, bar)
        else:
            for m in todo:
                rebuilt += rebuild_model(out, m, False)
                bar.update(1)
    finally:
        bar.close()
    return dict(packed=len(todo), rebuilt=rebuilt)


def _rebuild_in_workers(out: Path, todo: list, workers: int, bar) -> int:
    """:func:`rebuild_model` of each entry of ``todo`` in ``workers`` spawned processes."""
    done = run_in_workers(rebuild_model, [(out, m, False) for m in todo], workers, lambda _: bar.update(1),
                          f"a process rebuilding models of {out} died (killed, or out of memory?); the models it "
                          f"finished are kept: run `geosharp population rebuild --out {out}` again")
    return sum(done)


def run_in_workers(fn, jobs: list, workers: int, on_done, died: str, initializer=None) -> list:
    """``[fn(*job) for job in jobs]`` (in completion order) in ``workers`` spawned processes (each started by
    ``initializer``, by default one that ignores Ctrl-C and dies with its parent), at most one job each submitted at
    a time, so an error stops the rest instead of waiting behind queued ones: the jobs running beside it finish, no
    further one starts, and the error is raised here. ``on_done(result)`` after each job; a worker that dies
    (killed, out of memory) is reported as ``OSError(died)``."""
    results, queue = [], iter(jobs)
    try:
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                    initializer=initializer or _rebuild_worker) as ex:
            running = {ex.submit(fn, *job) for job in itertools.islice(queue, workers)}
            while running:
                done, running = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    results.append(fut.result())  # an error leaves the with block: the running ones finish
                    on_done(results[-1])
                    running |= {ex.submit(fn, *job) for job in itertools.islice(queue, 1)}
    except BrokenProcessPool:
        raise OSError(died) from None
    return results


def _rebuild_worker() -> None:
    """A rebuild process ignores Ctrl-C (its parent stops the pool) and dies with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
