"""Does this checkout train the tweets population's first models bit for bit? (Issue 29: a fresh clone reproduces
the first models' records.)

Trains the first ``N`` models of ``tweets-recipes`` (the protocol's task, its seeds and recipes) into a temporary
directory with ``train_population`` (the first stage of ``geosharp population train`` and ``study``), one worker,
one thread, and compares each with the population's own model of the same name: the weight file's SHA-256, and
the training record (``geosharp_model.json``: hyper-parameters, metrics, split, data, architecture) without its
wall time. It prints and writes only whether they are equal, never a metric: the study stays blind.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python docs/tweets/reproduce_first_models.py \\
        /work/populations/tweets/recipes 1 docs/tweets/reproduce.json
"""
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from geosharp_ref.io.durable import write_json_atomic
from geosharp_ref.studies.population.training import train_population


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record(path: Path) -> dict:
    rec = json.loads((path / "geosharp_model.json").read_text())
    rec.pop("seconds", None)
    return rec


def blind_check_start(population: str) -> tuple:
    """``(population path, result skeleton with this checkout's commit)``, one thread set: the start of a blind
    check of a population (here, and in check_rebuild.py)."""
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    return Path(population), dict(commit=commit, population=str(population), models={})


def main(population: str, n: int, out: str) -> dict:
    population, res = blind_check_start(population)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.process_time()
        train_population(tmp, n_models=n, workers=1, task="tweets-recipes", progress=False)
        res["cpu_seconds"] = round(time.process_time() - t0, 1)
        for i in range(n):
            name = f"model_{i:03d}"
            ours, theirs = Path(tmp) / "models" / name, population / "models" / name
            res["models"][name] = dict(
                weights_identical=_sha256(ours / "model.safetensors") == _sha256(theirs / "model.safetensors"),
                record_identical_but_time=_record(ours) == _record(theirs))
    res["all_identical"] = all(all(v.values()) for v in res["models"].values())
    write_json_atomic(out, res)
    return res


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]), indent=2))
