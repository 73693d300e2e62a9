"""Files the tests write and read: a legacy-format saved directory (:func:`save_bin`), a saved BERT backbone,
the settings and file helpers of a tiny vision population (``POPULATION_*``, :func:`copy_population`,
:func:`jsonl`, :func:`subprocess_env`, :func:`count_measure_runs`) and :func:`quiet_transformers`."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import torch

from .models import ROOT, hf_transformers, llama


# ---------------------------------------------------------------------------------------------
# Saved directories
# ---------------------------------------------------------------------------------------------

def save_bin(model, d: Path, state=None):
    """A Hugging Face directory with a legacy ``pytorch_model.bin`` (``state`` replaces the weights)."""
    d.mkdir(parents=True)
    model.config.save_pretrained(d)
    torch.save(model.state_dict() if state is None else state, d / "pytorch_model.bin")


# ---------------------------------------------------------------------------------------------
# A tiny vision population (geosharp_ref.studies.population: tiny ViTs on sklearn digits)
# ---------------------------------------------------------------------------------------------

POPULATION_MODELS = 4
#: training settings small enough for CI
POPULATION_TRAIN = dict(n_models=POPULATION_MODELS, epochs_max=2, train_size_max=160, workers=1, progress=False)
#: evaluation settings small enough for CI; a ρ sweep of two values
POPULATION_EVAL = dict(rhos=(0.01, 0.05), n_batches=2, batch_size=16, n_iter=3, progress=False)
#: the same evaluation settings as command-line arguments
POPULATION_EVAL_ARGS = ["--rho", "0.01", "0.05", "--batches", "2", "--batch-size", "16", "--iters", "3",
                        "--no-progress"]


def copy_population(src, parent, results=False):
    """A copy of the population directory ``src`` as ``parent/vit`` (without its evaluation results unless
    ``results``)."""
    dst = Path(parent) / "vit"
    shutil.copytree(src, dst, ignore=None if results else shutil.ignore_patterns("results*", "evaluation.json",
                                                                                  "correlation*"))
    return dst


def jsonl(path):
    """The records of a JSON-lines file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


class Killed(Exception):
    """Raised by :func:`count_measure_runs` in place of a kill."""


def count_measure_runs(monkeypatch, table: dict, names, die_at=None) -> list:
    """Wrap the named measures of ``table`` (a module's ``NAMED_MEASURES``) so that each ``evaluate`` is
    recorded in the returned list (the measure's name), and the ``die_at``-th call raises :class:`Killed`
    instead of running (a kill between two finished runs)."""
    calls = []

    class Counting:
        def __init__(self, measure):
            self.measure = measure

        def __getattr__(self, attr):
            return getattr(self.measure, attr)

        def evaluate(self, *args, **kwargs):
            calls.append(self.measure.name)
            if die_at is not None and len(calls) == die_at:
                raise Killed
            return self.measure.evaluate(*args, **kwargs)

    for name in names:
        monkeypatch.setitem(table, name, Counting(table[name]))
    return calls


def subprocess_env(**extra):
    """The environment of a child ``python -m geosharp_ref.cli ...``: this checkout first on the path, one
    thread, no progress bars, no inherited torchrun rank."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TQDM_DISABLE="1", **extra)
    env.pop("WORLD_SIZE", None)
    return env


def save_bert_backbone(path, vocab_size=50, max_position_embeddings=32, tokenizer_from=None, seed=0):
    """A tiny 2-layer ``BertModel`` (no task head, ``architectures: ["BertModel"]``) saved to ``path``, with
    the tokenizer of ``tokenizer_from`` saved beside it when given (a checkpoint in the format of the
    packaged all-MiniLM-L6-v2)."""
    tf = hf_transformers()
    torch.manual_seed(seed)
    cfg = tf.BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=max_position_embeddings,
                        architectures=["BertModel"])
    tf.BertModel(cfg).save_pretrained(path)
    if tokenizer_from is not None:
        tf.AutoTokenizer.from_pretrained(str(tokenizer_from), local_files_only=True).save_pretrained(path)
    return Path(path)


def save_llama_and_lm_data(d: Path):
    """A tiny Llama saved to ``d / "llama"`` (seed 0) and ``d / "d.pt"``: 4 rows of 5 token ids with next-token
    targets (-100 at the end) — what the command-line tests evaluate."""
    torch.manual_seed(0)
    llama().save_pretrained(d / "llama")
    ids = torch.randint(3, 50, (4, 5), generator=torch.Generator().manual_seed(0))
    torch.save({"inputs": {"input_ids": ids}, "targets": torch.cat([ids[:, 1:], torch.full((4, 1), -100)], 1)},
               d / "d.pt")


def quiet_transformers():
    """transformers with its logging at ERROR (no load reports in test output); skips without it."""
    import logging

    import pytest

    tf = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tf.logging.set_verbosity_error()
    return tf


def recipes_in_space(task, count: int, space: dict, train_size: int) -> list:
    """The first ``count`` recipes of the population ``task`` (``sample_hparams(i)``), each asserted to lie in the
    declared recipe ``space`` (lr within its range, epochs within theirs, every other choice one of its values) with
    ``train_size`` documents and no label noise, and drawn the same again (deterministic)."""
    draws = [task.sample_hparams(i) for i in range(count)]
    lo, hi = space["lr"]
    for h in draws:
        assert lo * (1 - 1e-3) <= h["lr"] <= hi * (1 + 1e-3)
        assert space["epochs"][0] <= h["epochs"] <= space["epochs"][1]
        for k in ("weight_decay", "batch_size", "warmup", "label_smoothing", "augment"):
            assert h[k] in space[k]
        assert h["train_size"] == train_size and h["label_noise"] == 0.0
    assert draws == [task.sample_hparams(i) for i in range(count)]
    return draws


def assert_refused_and_nothing_written(run, argv, root, out, needles=()) -> str:
    """Run the command line (``run(argv) -> (exit code, stdout, stderr)``) on a bad input and assert what every
    refusal owes: exit 2, nothing on stdout, exactly one ``geosharp: error:`` line on stderr containing every
    needle, ``out`` not written and no file created under ``root``. Returns that line."""
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    rc, printed, err = run(argv)
    lines = err.strip().splitlines()
    assert rc == 2 and printed == ""
    assert len(lines) == 1 and lines[0].startswith("geosharp: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not out.exists() and sorted(p.relative_to(root) for p in root.rglob("*")) == before
    return lines[0]


def run_cli(capsys, argv):
    """Run ``geosharp ARGV`` (each argument as ``str``) in this process: ``(exit code, stdout, stderr)``, what it
    printed alone (capsys is read before and after)."""
    from geosharp_ref.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_cli_refused(capsys, argv, root, out, needles=()) -> str:
    """``geosharp ARGV`` run in this process (:func:`run_cli`) on a bad input: refused as
    :func:`assert_refused_and_nothing_written` asserts; returns its error line."""
    return assert_refused_and_nothing_written(lambda a: run_cli(capsys, a), argv, root, out, needles)


def assert_data_refused(capsys, argv, needles, root):
    """``geosharp ARGV --out ROOT/out/data.pt`` (a ``data`` command line) on a bad input: refused as
    :func:`assert_cli_refused` asserts, with ``needles`` in its error line."""
    out = root / "out" / "data.pt"
    assert_cli_refused(capsys, argv + ["--out", str(out)], root, out, needles)


def cli_error_line(capsys, argv) -> str:
    """Run ``geosharp ARGV`` in this process and return its one ``geosharp: error:`` line, asserting exit code 2 and
    that stderr holds nothing else."""
    rc, _, err = run_cli(capsys, argv)
    err = err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("geosharp: error: "), (rc, err)
    return err[0]


def kill_after_lines(cmd, path, lines: int = 1, timeout: float = 240, group: bool = False) -> int:
    """Run ``cmd`` (a population command) and SIGKILL it (with ``group``, its whole process group: its workers too)
    once ``path`` holds ``lines`` complete lines; returns the number of lines then. Fails if it ends first."""
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=group)
    kill = (lambda: os.killpg(proc.pid, signal.SIGKILL)) if group else proc.kill
    path = Path(path)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if path.is_file() and path.read_bytes().count(b"\n") >= lines:
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"{cmd[3:5]} ended before it could be killed"
        kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            kill()
    assert proc.returncode == -signal.SIGKILL
    return path.read_bytes().count(b"\n")
