"""`geosharp population pack`: a population without its weights, rebuilt from its recipes and checked by SHA-256
(the package's tiny vision population; the tweets task's rebuild is in test_tweets.py)."""
import concurrent.futures as cf
import hashlib
import io
import json
import shutil
import threading
import time

import pytest
import torch

from geosharp_ref.studies import population as pop
from geosharp_ref.studies.population import pack
from geosharp_ref.studies.population.calibration import calibrate_population
from geosharp_ref.studies.population.pipeline import run_pipeline
from geosharp_ref.studies.population.reliability import gap_reliability
from tests import cases


def _tree(root):
    """{relative path: SHA-256} of every file under ``root`` (computed here with hashlib, independently)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _damage_weights_sum(model_dir):
    """Change the first digit of the weights' recorded SHA-256 in ``model_dir``'s SHA256SUMS."""
    sums = model_dir / "SHA256SUMS"
    lines = sums.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.endswith("model.safetensors"))
    lines[i] = ("0" if lines[i][0] != "0" else "1") + lines[i][1:]
    sums.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def packed(trained, tmp_path_factory):
    """A pack of the trained population, with the population's files as they were before packing."""
    before = _tree(trained)
    to = tmp_path_factory.mktemp("pack") / "vit-pack"
    summary = pack.pack_population(trained, to)
    return to, before, summary


def test_pack_keeps_records_and_sums_not_weights(trained, packed):
    to, before, summary = packed
    assert _tree(trained) == before  # the population is only read
    man = json.loads((trained / "population.json").read_text())
    names = [m["name"] for m in man["models"]]
    assert summary["models"] == summary["hashed"] == len(names) == cases.POPULATION_MODELS
    assert json.loads((to / "population.json").read_text()) == man
    for name in names:
        src, dst = trained / "models" / name, to / "models" / name
        assert sorted(p.name for p in dst.iterdir()) == ["SHA256SUMS", "geosharp_model.json"]
        assert (dst / "geosharp_model.json").read_bytes() == (src / "geosharp_model.json").read_bytes()
        listed = dict(reversed(line.split("  ")) for line in (dst / "SHA256SUMS").read_text().splitlines())
        files = {p.name for p in src.iterdir() if p.is_file()} - {"geosharp_model.json"}
        assert "model.safetensors" in files and set(listed) == files
        assert listed == {n: before[f"models/{name}/{n}"] for n in files}
        assert pack.is_packed(dst) and not pack.is_packed(src)
    assert summary["files"] == len(_tree(to)) and summary["bytes"] == sum(p.stat().st_size for p in to.rglob("*")
                                                                          if p.is_file())


def test_packed_model_is_rebuilt_bit_identical_once(trained, packed, tmp_path):
    to, before, _ = packed
    out = tmp_path / "vit"
    shutil.copytree(to, out)  # `cp -r PACK DIR` on another machine
    entry = json.loads((out / "population.json").read_text())["models"][1]
    torch.set_num_threads(2)  # the loader's threads: the rebuild trains with one, as the training did
    model = pop.load_population_model(out, entry)
    assert torch.get_num_threads() == 2
    rebuilt = {k: v for k, v in _tree(out).items() if k.startswith(f"models/{entry['name']}/")}
    trained_files = {k: v for k, v in before.items() if k.startswith(f"models/{entry['name']}/")}
    assert {k: v for k, v in rebuilt.items() if not k.endswith("SHA256SUMS")} == trained_files
    original = pop.load_population_model(trained, entry)
    for (k, a), b in zip(model.state_dict().items(), original.state_dict().values()):
        assert torch.equal(a, b), k
    assert not pack.rebuild_model(out, entry)  # nothing packed any more
    assert not [p for p in (out / "models").iterdir() if p.name.startswith(".tmp")]
    # a rebuilt model is packed again from its (checked) sums, without hashing
    again = pack.pack_population(out, tmp_path / "again")
    assert again["hashed"] == 0 and _tree(tmp_path / "again") == _tree(to)


def test_the_rebuild_command_rebuilds_in_this_process_with_one_worker(packed, tmp_path, capsys):
    from geosharp_ref.cli import main

    to, before, _ = packed
    out = tmp_path / "vit"
    shutil.copytree(to, out)
    assert main(["population", "rebuild", "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == f"rebuilt {cases.POPULATION_MODELS} of the {cases.POPULATION_MODELS} " \
                                              f"packed models of {out}"
    assert {k: v for k, v in _tree(out).items() if k.startswith("models/model_") and not k.endswith("SUMS")} == \
        {k: v for k, v in before.items() if k.startswith("models/")}


#: the two ways a packed model is rebuilt: loaded by a stage, or with every other one (`population rebuild`)
_REBUILDERS = {
    "load": lambda out, entry: pop.load_population_model(out, entry),
    "rebuild-population": lambda out, entry: pack.rebuild_population(out, workers=2, progress=False),
}


@pytest.mark.parametrize("rebuilder", sorted(_REBUILDERS))
def test_rebuild_with_wrong_sums_is_refused_and_installs_nothing(packed, tmp_path, rebuilder):
    to, _, _ = packed
    out = tmp_path / "vit"
    shutil.copytree(to, out)
    entry = json.loads((out / "population.json").read_text())["models"][0]
    _damage_weights_sum(out / entry["dir"])
    with pytest.raises(ValueError, match=r"differs from its recorded SHA-256 in \['model.safetensors'\]"):
        _REBUILDERS[rebuilder](out, entry)
    assert sorted(p.name for p in (out / entry["dir"]).iterdir()) == ["SHA256SUMS", "geosharp_model.json"]
    assert not [p for p in (out / "models").iterdir() if p.name.startswith(".tmp")]


def test_a_failed_rebuild_starts_no_further_model(packed, tmp_path, monkeypatch):
    """One model per worker is submitted at a time: after model_000 fails, only the model running beside it
    (model_001) finishes, and no queued model starts (threads stand in for the processes; the rebuild is faked)."""
    to, _, _ = packed
    out = tmp_path / "vit"
    shutil.copytree(to, out)
    started = []

    def rebuild(out_, entry, progress):
        started.append(entry["name"])
        if entry["name"] == "model_000":
            raise ValueError("model_000: the rebuilt model differs from its recorded SHA-256")
        time.sleep(0.5)
        return True

    monkeypatch.setattr(pack, "rebuild_model", rebuild)
    monkeypatch.setattr(pack.cf, "ProcessPoolExecutor", lambda max_workers, **kw: cf.ThreadPoolExecutor(max_workers))
    with pytest.raises(ValueError, match="differs"):
        pack.rebuild_population(out, workers=2, progress=False)
    assert sorted(started) == ["model_000", "model_001"] and cases.POPULATION_MODELS > 2


def test_two_loaders_rebuild_a_packed_model_once(packed, tmp_path, monkeypatch):
    to, _, _ = packed
    out = tmp_path / "vit"
    shutil.copytree(to, out)
    entry = json.loads((out / "population.json").read_text())["models"][2]
    trainings, results = [], []
    real = pack.fit_one
    monkeypatch.setattr(pack, "fit_one", lambda *a, **k: trainings.append(1) or real(*a, **k))
    threads = [threading.Thread(target=lambda: results.append(pack.rebuild_model(out, entry))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, True] and len(trainings) == 1
    assert not pack.is_packed(out / entry["dir"])


def test_rebuild_population_rebuilds_every_packed_model_in_worker_processes(trained, packed, tmp_path,
                                                                          monkeypatch):
    """`population rebuild`: every packed model trained again in two spawned one-thread processes, each file equal
    to the trained population's (hashed here independently); a second call has nothing to do."""
    to, before, _ = packed
    out = tmp_path / "vit"
    shutil.copytree(to, out)
    pools, real = [], pack.cf.ProcessPoolExecutor
    monkeypatch.setattr(pack.cf, "ProcessPoolExecutor", lambda **kw: pools.append(kw) or real(**kw))
    done = pack.rebuild_population(out, workers=2, progress=False)
    assert [(kw["max_workers"], kw["mp_context"].get_start_method()) for kw in pools] == [(2, "spawn")]
    assert done == dict(packed=cases.POPULATION_MODELS, rebuilt=cases.POPULATION_MODELS)
    after = {k: v for k, v in _tree(out).items() if k.startswith("models/model_") and not k.endswith("SHA256SUMS")}
    assert after == {k: v for k, v in before.items() if k.startswith("models/")}
    assert pack.rebuild_population(out, workers=2, progress=False) == dict(packed=0, rebuilt=0)
    assert not [p for p in (out / "models").iterdir() if p.name.startswith(".tmp")]


def test_repack_replaces_an_earlier_pack_and_refuses_others(trained, packed, tmp_path):
    to, _, _ = packed
    earlier = tmp_path / "earlier"
    shutil.copytree(to, earlier)
    (earlier / "stale.json").write_text("{}")
    pack.pack_population(trained, earlier)
    assert _tree(earlier) == _tree(to)  # replaced whole: the stale file is gone
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for target, needle in ((foreign, "is not a pack of this population"), (trained / "sub", "contain one another"),
                           (trained, "contain one another"), (trained.parent, "contain one another")):
        with pytest.raises(ValueError, match=needle):
            pack.pack_population(trained, target)
    assert (foreign / "notes.txt").read_text() == "mine" and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert not (trained / "sub").exists()


#: every command that reads a population's models, as library calls (tiny settings)
_READERS = {
    "pack": lambda out, tmp: pack.pack_population(out, tmp / "p"),
    "evaluate": lambda out, tmp: pop.evaluate_population(out, **cases.POPULATION_EVAL),
    "calibrate": lambda out, tmp: calibrate_population(out, [1e-3], measures=["adaptive"], models=2, batch_size=8,
                                                       n_iter=2, progress=False),
    "reliability": lambda out, tmp: gap_reliability(out, splits=3, progress=False, stream=io.StringIO()),
    "rebuild": lambda out, tmp: pack.rebuild_population(out, workers=1, progress=False),
    "pipeline": lambda out, tmp: run_pipeline(out, None, [{k: v for k, v in cases.POPULATION_EVAL.items()
                                                           if k != "progress"}], None, workers=1, progress=False),
}


@pytest.mark.parametrize("command", sorted(_READERS))
def test_damaged_sums_are_refused_before_anything_is_written(packed, tmp_path, command):
    """A damaged SHA256SUMS of a later model (model_001) stops each command before it writes or rebuilds."""
    to, _, _ = packed
    out = tmp_path / "vit"
    shutil.copytree(to, out)
    (out / "models" / "model_001" / "SHA256SUMS").write_text("not a checksum line\n")
    before = _tree(out)
    with pytest.raises(ValueError, match="line 1 is not"):
        _READERS[command](out, tmp_path)
    assert _tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["vit"]
    assert not any(p.name.startswith(".") for p in out.iterdir())  # no lock file left either
