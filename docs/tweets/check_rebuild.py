"""Does this checkout rebuild the tweets population's packed models bit for bit? (Amendment 6: the population is
committed as a pack, and a new machine rebuilds each model from its recipe when a stage loads it.)

Packs the population (``geosharp population pack``) into a temporary directory, copies the pack as a new machine
would, and loads the first ``N`` models there through ``load_population_model``, which rebuilds each packed model
with one thread and installs it only if every file has the SHA-256 its pack recorded. It then compares every
rebuilt file with the population's own file of the same name, and writes whether they are equal and the CPU
time of the rebuilds, never a metric: the study stays blind.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python docs/tweets/check_rebuild.py \\
        /work/populations/tweets/recipes 1 docs/tweets/rebuild.json
"""
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from geosharp_ref.io.durable import file_digest, write_json_atomic
from geosharp_ref.studies.population.evaluation import load_population_model
from geosharp_ref.studies.population.pack import pack_population
from reproduce_first_models import blind_check_start  # beside this script


def main(population: str, n: int, out: str) -> dict:
    population, res = blind_check_start(population)
    with tempfile.TemporaryDirectory() as tmp:
        pack_population(population, Path(tmp) / "pack")
        copy = Path(tmp) / "copy"
        shutil.copytree(Path(tmp) / "pack", copy)
        entries = json.loads((copy / "population.json").read_text())["models"][:n]
        t0 = time.process_time()
        for entry in entries:
            load_population_model(copy, entry, progress=False)
        res["cpu_seconds"] = round(time.process_time() - t0, 1)
        for entry in entries:
            ours, theirs = copy / entry["dir"], population / entry["dir"]
            files = sorted(p.name for p in theirs.iterdir() if p.is_file())
            res["models"][entry["name"]] = dict(
                files=len(files),
                every_file_identical=all((ours / f).is_file() and file_digest(ours / f) == file_digest(theirs / f)
                                         for f in files))
    res["all_identical"] = all(v["every_file_identical"] for v in res["models"].values())
    write_json_atomic(out, res)
    return res


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]), indent=2))
