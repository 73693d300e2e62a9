"""Does this machine rebuild the committed pack's models bit for bit? (Amendment 12: a model trained on one machine
did not rebuild on another.)

Copies the committed pack (``docs/tweets/recipes``: each packed model's recipe and the SHA-256 of every file its
training wrote) into a temporary directory, as a new machine would have it, and loads each named model there
through ``load_population_model``, which retrains it from its recipe with one thread and installs it only if every
file has its recorded SHA-256. Writes, per model, whether it was installed (and else which files differ) and the
CPU time, with this machine's CPU, torch's CPU capability and the environment variables that select the numerical
code paths (``ATEN_CPU_CAPABILITY``, ``MKL_CBWR``, ``MKL_ENABLE_INSTRUCTIONS``, ``ONEDNN_MAX_CPU_ISA``); never a
metric: the study stays blind.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 19 .venv/bin/python docs/tweets/check_rebuild_here.py \\
        docs/tweets/rebuild_here.json model_000 model_059

The pack is the one beside this script (``GEOSHARP_PACK`` names another). After amendment 12 the pack no longer holds
model_000 … model_058 (they are trained again); the pack these checks read is the one of commit 913486e:
``git worktree add --detach /tmp/pack-913486e 913486e`` and ``GEOSHARP_PACK=/tmp/pack-913486e/docs/tweets/recipes``.
"""
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from geosharp_ref.io.durable import write_json_atomic
from geosharp_ref.io.machine import cpu_name
from geosharp_ref.studies.population.evaluation import load_population_model
from reproduce_first_models import blind_check_start  # beside this script

PACK = Path(os.environ.get("GEOSHARP_PACK") or Path(__file__).resolve().parent / "recipes")
#: the environment variables that pick torch's, MKL's and oneDNN's code paths (recorded as set, or None)
PATH_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                  "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def machine() -> dict:
    """This machine's CPU model, core count and torch's CPU capability."""
    return dict(cpu=cpu_name(), cores=os.cpu_count(), torch_cpu_capability=torch.backends.cpu.get_cpu_capability(),
                torch=torch.__version__, environment={k: os.environ.get(k) for k in PATH_VARIABLES})


def main(out: str, names: list) -> dict:
    _, res = blind_check_start(str(PACK))
    res["machine"] = machine()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy"
        shutil.copytree(PACK, copy)
        entries = {e["name"]: e for e in json.loads((copy / "population.json").read_text())["models"]}
        for name in names:
            t0 = time.process_time()
            try:
                load_population_model(copy, entries[name], progress=False)
                rec = dict(rebuilt_bit_for_bit=True)
            except ValueError as e:  # the rebuild's refusal names the files whose SHA-256 differ
                rec = dict(rebuilt_bit_for_bit=False, refusal=str(e))
            rec["cpu_seconds"] = round(time.process_time() - t0, 1)
            res["models"][name] = rec
            print(name, rec, file=sys.stderr, flush=True)
    write_json_atomic(out, res)
    return res


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:]), indent=2))
