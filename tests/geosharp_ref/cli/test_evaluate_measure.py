"""`geosharp evaluate --measure NAME` on the tiny saved BERT (no network): for one measure of every family the
value equals ``get_measure(NAME).evaluate`` computed here on the same loaded model and batches; an option that
does not apply to the measure, or a bad one, is refused in one line, exit 2, before the model is loaded and
with nothing written."""
import json

import pytest
import torch
import transformers

from geosharp_ref.cli import main
from geosharp_ref.cli.evaluate import PROBE_RHOS
from geosharp_ref.io.models import load_model
from geosharp_ref.kernels import load_kernels
from geosharp_ref.sharpness import get_measure, rho_for_size
from geosharp_ref.symmetry import symmetry_map
from geosharp_ref.symmetry.declared import declared_bindings
from tests import cases
from tests.cases import ROOT

RHO, N, B, SEED = 0.05, 2, 3, 3


def _batches(path, n, b):
    x, y = (lambda d: (d["inputs"], d["targets"]))(torch.load(path, weights_only=True))
    return [({k: t[i * b:(i + 1) * b] for k, t in x.items()}, y[i * b:(i + 1) * b]) for i in range(n)]


def _library(saved, name, rho=RHO, batches=None, **options):
    """``get_measure(name).evaluate`` on the model and batches the CLI loads, computed independently of it."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        saved / "bert", attn_implementation="eager", local_files_only=True)
    batches = batches if batches is not None else _batches(saved / "bert.pt", N, B)
    measure = get_measure(name)
    smap = symmetry_map(model) if measure.metric is not None else None
    return measure.evaluate(model, batches, rho, symmetry_map=smap, seed=SEED, **options)


def _argv(saved, name, *extra, out=None, model="bert"):
    return (["evaluate", str(saved / model), "--data", str(saved / "bert.pt"), "--measure", name,
             "--batches", str(N), "--batch-size", str(B), "--seed", str(SEED), *extra]
            + (["--json", str(out)] if out is not None else []))


# one measure of every family: worst case adaptive and quotient (Auto-PGD), curvature (trace and top
# eigenvalue), exact geodesic (RK4), average case (quotient sphere and tml-epfl's Gaussian), first order
@pytest.mark.parametrize("name, extra, options", [
    ("adaptive", ["--iters", "3"], dict(n_iter=3)),
    ("geodesic-mix", ["--iters", "3", "--float64"], dict(n_iter=3, dtype=torch.float64)),
    ("hessian-trace-mix", ["--float64"], dict(dtype=torch.float64)),
    ("hessian-top-eigenvalue-euclidean", [], {}),
    ("geodesic-mix-exact", ["--iters", "2", "--steps", "2", "--float64"], dict(n_iter=2, steps=2,
                                                                            dtype=torch.float64)),
    ("average-geodesic-mix", ["--samples", "4"], dict(n_samples=4)),
    ("average-adaptive", ["--samples", "4", "--float64"], dict(n_samples=4, dtype=torch.float64)),
    ("geodesic-inv-linearised", ["--eps", "1e-6"], dict(eps=1e-6)),
    ("geodesic-inv", ["--all-symmetries", "--iters", "2"], dict(n_iter=2, symmetries=["all"])),
])
def test_measure_matches_the_library(saved, tmp_path, capsys, name, extra, options):
    out = tmp_path / "nested" / f"{name}.json"
    assert main(_argv(saved, name, "--rho", str(RHO), *extra, out=out)) == 0
    printed = capsys.readouterr().out
    d = json.loads(out.read_text())
    ref = _library(saved, name, **options)
    assert d["measure"] == ref.measure == name and d["rho"] == RHO
    assert d["mean"] == pytest.approx(ref.mean, rel=1e-10, abs=1e-12)
    assert d["per_batch"] == pytest.approx(ref.per_batch, rel=1e-10, abs=1e-12) and len(d["per_batch"]) == N
    assert printed.startswith(f"{name} of BertForSequenceClassification")
    assert f"mean      : {ref.mean:.6g}" in printed
    assert f"per batch : {', '.join(f'{v:.6g}' for v in ref.per_batch)}" in printed
    assert d["model_dir"] == str((saved / "bert").resolve()) and d["batches"] == N and d["batch_size"] == B
    if get_measure(name).average is not None:  # the Monte Carlo error is printed and written
        assert d["config"]["standard_error"] > 0 and f"± {d['config']['standard_error']:.2g}" in printed
    if "--all-symmetries" in extra:  # the built-in symmetries found beside the attention pairs are quotiented
        assert d["all_symmetries"] is True and len(d["config"]["factors"]) > d["config"]["pairs"] == 4
        assert f"factors   : {len(d['config']['factors'])} quotiented symmetries" in printed
    if "--float64" in extra:
        assert "float64" in printed


def test_target_relative_size_fits_the_radius_as_the_library(saved, tmp_path, capsys):
    out = tmp_path / "trs.json"
    assert main(_argv(saved, "adaptive", "--target-relative-size", "1e-3", "--iters", "2", out=out)) == 0
    d = json.loads(out.read_text())
    first = _batches(saved / "bert.pt", 1, B)
    sizes = [_library(saved, "adaptive", r, batches=first, n_iter=2).relative_size[0] for r in PROBE_RHOS]
    rho = rho_for_size(PROBE_RHOS, sizes, [1e-3])[0]
    assert d["rho"] == pytest.approx(rho, rel=1e-10)
    assert d["mean"] == pytest.approx(_library(saved, "adaptive", rho, n_iter=2).mean, rel=1e-10, abs=1e-12)
    assert f"ρ = {rho:.4g} for ‖Δθ‖/‖θ‖ = 0.001" in capsys.readouterr().out


@pytest.mark.parametrize("name, extra, says", [
    ("adaptive", ["--geodesic", "exact"], "--geodesic does not apply to --measure adaptive"),
    ("geodesic-mix", ["--geodesic", "exact"], "geodesic-inv|mix-exact"),
    ("geodesic-mix", ["--average-case"], "--average-case does not apply"),
    ("average-adaptive", ["--distribution", "sphere"], "--distribution does not apply"),
    ("geodesic-mix", ["--no-geodesic-correction"], "geodesic-inv|mix-first-order"),
    ("geodesic-inv", ["--no-metric-norm"], "geodesic-inv|mix-frobenius"),
    ("geodesic-inv", ["--attention-metric", "mix"], "--attention-metric does not apply"),
    ("hessian-trace-mix", ["--iters", "3"], "--iters does not apply to --measure hessian-trace-mix"),
    ("average-geodesic-inv", ["--iters", "3"], "--iters does not apply"),
    ("adaptive", ["--gradient", "perturbed"], "--gradient does not apply"),
    ("geodesic-mix", ["--steps", "3"], "--steps does not apply"),
    ("geodesic-mix", ["--samples", "4"], "--samples does not apply"),
    ("adaptive", ["--eps", "1e-6"], "--eps does not apply"),
    ("hessian-trace-euclidean", ["--all-symmetries"], "--all-symmetries does not apply"),
    ("geodesic-mix-linearised", ["--all-symmetries"], "--all-symmetries does not apply"),
    ("geodesic-mix-linearised", ["--spec", "nowhere.py"], "--spec does not apply"),
    ("average-geodesic-mix", ["--spec", "nowhere.py"], "--spec does not apply"),
    ("adaptive", ["--spec", "nowhere.py"], "--spec does not apply"),
    ("hessian-top-eigenvalue-mix", ["--target-relative-size", "1e-4"], "give --rho"),
    ("adaptive-linearised", ["--target-relative-size", "1e-4"], "give --rho"),
    ("geodesic-mix-exact", ["--steps", "0"], "steps"),
    ("average-adaptive", ["--samples", "1"], "--samples must be at least 2"),
    ("adaptive", ["--iters", "0"], "--iters must be at least 1"),
    ("adaptive", ["--rho", "200"], "larger than 100"),
])
def test_refusals_exit_2_before_loading(saved, tmp_path, capsys, name, extra, says):
    # the model directory does not exist: the refusal comes first, so no option is checked after loading
    out = tmp_path / "out" / "r.json"
    radius = [] if "--target-relative-size" in extra or "--rho" in extra else ["--rho", str(RHO)]
    rc = main(_argv(tmp_path, name, *radius, *extra, out=out, model="no-model"))
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("geosharp: error: ") and err.count("\n") == 1, err
    assert says in err and "does not exist" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, says", [
    (["--measure", "adaptive", "--metric", "mix"], "not allowed with argument"),
    ([], "one of the arguments --metric --measure is required"),
    (["--measure", "hessian-trace"], "invalid choice"),
])
def test_exactly_one_of_metric_and_measure(saved, capsys, extra, says):
    rc = main(["evaluate", str(saved / "bert"), "--data", str(saved / "bert.pt"), "--rho", "0.05", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("geosharp: error: ") and says in err, err


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    """adapter/ (peft LoRA r = 2 on query and intermediate.dense of a tiny BERT classifier, base/), data.pt (8
    examples) and lora_hybrid.py, generated from examples/lora_spec.py by `geosharp derive --spec`."""
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("lora")
    torch.manual_seed(0)
    base = cases.bert(initializer_range=cases.IR, attn_implementation=None)
    base.save_pretrained(root / "base")
    cases.lora(base, targets=("query", "intermediate.dense")).save_pretrained(root / "adapter")
    cfg = json.loads((root / "adapter" / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(root / "base")
    (root / "adapter" / "adapter_config.json").write_text(json.dumps(cfg))
    gen = torch.Generator().manual_seed(1)
    torch.save({"inputs": {"input_ids": torch.randint(3, 50, (8, 7), generator=gen)},
                "targets": torch.randint(3, (8,), generator=gen)}, root / "data.pt")
    assert main(["derive", "--spec", str(ROOT / "examples" / "lora_spec.py"), "--out", str(root)]) == 0
    return root


def test_a_spec_is_quotiented_by_a_curvature_measure(lora, tmp_path, capsys):
    """--spec with --measure hessian-trace-mix: the 4 declared LoRA GL(r) bindings beside the attention pairs,
    as the library quotients them (the spec file's only metric, lora_hybrid)."""
    out = tmp_path / "spec.json"
    argv = ["evaluate", str(lora / "adapter"), "--data", str(lora / "data.pt"), "--rho", "0.05", "--measure",
            "hessian-trace-mix", "--spec", str(lora / "lora_hybrid.py"), "--batches", "2", "--batch-size", "4",
            "--float64", "--json", str(out)]
    assert main(argv) == 0
    assert capsys.readouterr().out.count("bound   lora_hybrid:adapter=") == 4
    d = json.loads(out.read_text())
    model = load_model(lora / "adapter")
    K = load_kernels(lora / "lora_hybrid.py")
    x, y = (lambda f: (f["inputs"]["input_ids"], f["targets"]))(torch.load(lora / "data.pt", weights_only=True))
    batches = [({"input_ids": x[i * 4:(i + 1) * 4]}, y[i * 4:(i + 1) * 4]) for i in range(2)]
    ref = get_measure("hessian-trace-mix").evaluate(model, batches, 0.05, symmetry_map=symmetry_map(model), seed=0,
                                                    dtype=torch.float64,
                                                    symmetries=declared_bindings(model, K, K.BINDINGS))
    plain = get_measure("hessian-trace-mix").evaluate(model, batches, 0.05, symmetry_map=symmetry_map(model), seed=0,
                                                      dtype=torch.float64)
    assert d["spec"] == str((lora / "lora_hybrid.py").resolve())
    assert d["per_batch"] == pytest.approx(ref.per_batch, rel=1e-10, abs=1e-12)
    assert d["per_batch"] != pytest.approx(plain.per_batch, rel=1e-6)  # the declared bindings changed the value
