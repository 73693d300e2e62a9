"""`--spec FILE.py` for evaluate / verify / symmetries: a declared symmetry (examples/lora_spec.py: LoRA's GL(r)
with the hybrid metric, bound by its BINDINGS) reaches the whole-model evaluator on a saved peft-LoRA BERT,
beside the attention GL(h) pairs; the CLI equals the library; bad spec files write nothing."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geosharp_ref.cli import main
from geosharp_ref.io.models import load_model
from geosharp_ref.kernels import load_kernels
from geosharp_ref.sharpness import geodesic_sharpness
from geosharp_ref.symmetry import Quotient, symmetry_map
from geosharp_ref.symmetry.declared import declared_bindings
from geosharp_ref.testing import assert_changes, assert_orbit_invariant, kept_pairs, orbit_points
from tests import cases
from tests.cases import ROOT

SPEC = ROOT / "examples" / "lora_spec.py"


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    """base/ (a tiny BERT classifier), adapter/ (peft LoRA r = 2 on query and intermediate.dense, B random),
    data.pt (8 examples) and kernels/lora_hybrid.py (`geosharp derive --spec examples/lora_spec.py`)."""
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("lora")
    torch.manual_seed(0)
    base = cases.bert(initializer_range=cases.IR, attn_implementation=None)
    base.save_pretrained(root / "base")
    model = cases.lora(base, targets=("query", "intermediate.dense"))
    model.save_pretrained(root / "adapter")
    cfg = json.loads((root / "adapter" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] in (str(root / "base"), None, "")
    cfg["base_model_name_or_path"] = str(root / "base")
    (root / "adapter" / "adapter_config.json").write_text(json.dumps(cfg))
    gen = torch.Generator().manual_seed(1)
    torch.save({"inputs": {"input_ids": torch.randint(3, 50, (8, 7), generator=gen)},
                "targets": torch.randint(3, (8,), generator=gen)}, root / "data.pt")
    assert main(["derive", "--spec", str(SPEC), "--out", str(root / "kernels")]) == 0
    return root


def test_the_generated_module_carries_the_spec_bindings(lora_dir):
    K = load_kernels(lora_dir / "kernels" / "lora_hybrid.py")
    assert K.BINDINGS == [{"B": "{adapter}.lora_B.default.weight",
                           "At": {"param": "{adapter}.lora_A.default.weight", "transpose": True}}]


def test_evaluate_with_a_spec_equals_the_library(lora_dir, tmp_path, capsys):
    """LoRA GL(r) (4 adapters, hybrid metric) + attention V/O pairs (mix) quotiented; the Q/K pairs, which hold
    the query adapters' B, yield. The CLI from the spec file, the CLI from the generated module and the library
    agree."""
    data = lora_dir / "data.pt"
    common = ["evaluate", str(lora_dir / "adapter"), "--data", str(data), "--rho", "0.05", "--metric", "lora_hybrid",
              "--batches", "2", "--batch-size", "4", "--iters", "3", "--float64"]
    out1, out2 = tmp_path / "spec.json", tmp_path / "module.json"
    assert main(common + ["--spec", str(SPEC), "--json", str(out1)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("bound   lora_hybrid:adapter=") == 4 and "2 attention pairs yielded" in printed
    assert main(common + ["--spec", str(lora_dir / "kernels" / "lora_hybrid.py"), "--json", str(out2)]) == 0
    d1, d2 = json.loads(out1.read_text()), json.loads(out2.read_text())
    assert d1["per_batch"] == pytest.approx(d2["per_batch"], rel=1e-12, abs=1e-15)
    factors = d1["config"]["factors"]
    assert sum(k.startswith("lora_hybrid:") for k in factors) == 4 and d1["config"]["pairs"] == 2
    qk = [g.key for g in symmetry_map(load_model(lora_dir / "adapter")).groups if g.kind == "qk"]
    assert [k for k, _ in d1["config"]["yielded"]] == qk and len(qk) == 2  # the pairs holding the query adapters

    model = load_model(lora_dir / "adapter")
    K = load_kernels(lora_dir / "kernels" / "lora_hybrid.py")
    d = torch.load(data, weights_only=True)
    batches = [({"input_ids": d["inputs"]["input_ids"][i * 4:(i + 1) * 4]}, d["targets"][i * 4:(i + 1) * 4])
               for i in range(2)]
    ref = geodesic_sharpness(model, batches, 0.05, metric="mix", n_iter=3, dtype=torch.float64,
                             symmetries=declared_bindings(model, K, K.BINDINGS))
    assert d1["mean"] > 0 and d1["per_batch"] == pytest.approx(ref.per_batch, rel=1e-12, abs=1e-15)


def test_verify_with_a_spec_passes(lora_dir, capsys):
    argv = ["verify", str(lora_dir / "adapter"), "--spec", str(lora_dir / "kernels" / "lora_hybrid.py"),
            "--data", str(lora_dir / "data.pt"), "--iters", "3", "--scales", "0.01,100"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "PASS" in printed and "4 bindings" in printed and "adaptive sharpness varies" in printed


def test_symmetries_lists_the_declared_and_the_built_in_ones(lora_dir, capsys, tmp_path):
    out = tmp_path / "sym.json"
    assert main(["symmetries", str(lora_dir / "adapter"), "--spec", str(lora_dir / "kernels" / "lora_hybrid.py"),
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "LoRA GL(r): 4 bound, 0 refused" in printed  # the MLP adapters, and the query ones jointly with Q/K
    assert "softmax translation: 1 bound" in printed
    d = json.loads(out.read_text())
    assert len(d["declared"]) == 4 and len(d["groups"]) == 4


def test_the_evaluator_with_a_generated_module_does_not_import_the_engine(lora_dir):
    """With the generated module, nothing of the symbolic side loads (peft itself imports sympy, so the check
    is on derivations and the generator)."""
    code = (
        "import sys\n"
        "import geosharp_ref.cli\n"
        f"rc = geosharp_ref.cli.main(['evaluate', {str(lora_dir / 'adapter')!r}, '--data', "
        f"{str(lora_dir / 'data.pt')!r}, '--rho', '0.05', '--metric', 'lora_hybrid', '--spec', "
        f"{str(lora_dir / 'kernels' / 'lora_hybrid.py')!r}, '--batches', '1', '--batch-size', '2', '--iters', '1'])\n"
        "assert rc == 0\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'derivations' or m in "
        "('codegen.generate', 'codegen.spec', 'codegen.builtins', 'codegen.printer')]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr


BAD_SPECS = {
    "syntax": ("SPEC = {\n", r"spec file .* raised SyntaxError"),
    "no_bindings": (SPEC.read_text().split("# Which parameters")[0], r"declares no BINDINGS for 'lora_hybrid'"),
    "no_match": (SPEC.read_text().replace("{adapter}.lora_B", "{adapter}.lora_X"), r"matches no parameter"),
    "wrong_block": (SPEC.read_text().replace('"At": {"param"', '"A": {"param"'), r"unknown: \['A'\]"),
    "not_plain": (SPEC.read_text() + "\nBINDINGS['lora_hybrid'].append(object())\n", r"must be plain data"),
    # B of each layer's MLP adapter paired with A of the same layer's query adapter: shapes fit, the action
    # changes both adapters' products
    "no_symmetry": (SPEC.read_text().replace('"B": "{adapter}.lora_B.default.weight"',
                                              '"B": "{layer}.intermediate.dense.lora_B.default.weight"')
                    .replace('"{adapter}.lora_A.default.weight"', '"{layer}.attention.self.query.lora_A.default.weight"'),
                    r"not a symmetry of this model: acting on it changed the output by"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_files_exit_2_and_write_nothing(lora_dir, tmp_path, capsys, case):
    text, message = BAD_SPECS[case]
    spec = tmp_path / "spec.py"
    spec.write_text(text)
    out = tmp_path / "out" / "result.json"
    rc = main(["evaluate", str(lora_dir / "adapter"), "--data", str(lora_dir / "data.pt"), "--rho", "0.05",
               "--metric", "lora_hybrid", "--spec", str(spec), "--batch-size", "4", "--iters", "1",
               "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("geosharp: error:") and err.count("\n") == 1
    assert pytest.importorskip("re").search(message, err), err
    assert not out.exists() and not out.parent.exists()


@pytest.mark.parametrize("argv, message", [
    (["--metric", "hybrid"], r"unknown --metric 'hybrid': choose adaptive, inv or mix, or name a metric of a spec"),
    (["--metric", "nope", "--spec", str(SPEC)], r"declares no metric 'nope'; it declares: lora_hybrid"),
    (["--metric", "adaptive", "--all-symmetries"], r"--all-symmetries quotients symmetries for geodesic"),
])
def test_bad_metric_options(lora_dir, capsys, argv, message):
    rc = main(["evaluate", str(lora_dir / "adapter"), "--data", str(lora_dir / "data.pt"), "--rho", "0.05"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and pytest.importorskip("re").search(message, err), err


@settings(deadline=None, max_examples=4)
@given(data=st.data())
def test_sharpness_with_the_declared_lora_geometry_is_invariant(lora_dir, data):
    """The user spec on the tiny peft model: LoRA GL(r) (hybrid metric, 4 adapters) and the V/O pairs quotiented;
    moving along both orbits (geosharp_ref.testing.orbit_points: one scale a log-uniform in [1e-2, 1e2]) leaves
    the output and geodesic sharpness unchanged (assert_orbit_invariant), adaptive sharpness not (assert_changes)."""
    model = load_model(lora_dir / "adapter").to(torch.float64)
    K = load_kernels(lora_dir / "kernels" / "lora_hybrid.py")
    lora = declared_bindings(model, K, K.BINDINGS)
    smap = symmetry_map(model)
    q = Quotient.assemble(smap.param_shapes, smap, "mix", lora)
    assert len(q.pairs) == 2 and len(q.yielded) == 2
    moving = [kept_pairs(model, lora), *lora]  # the two pairs kept, then the four adapters
    assert [g.key for g in moving[0].groups] == [g.key for g in q.pairs]
    params = {n: p.detach() for n, p in model.named_parameters()}
    point = data.draw(orbit_points(moving, params), label="orbit point")
    d = torch.load(lora_dir / "data.pt", weights_only=True)
    batch = ({"input_ids": d["inputs"]["input_ids"][:4]}, d["targets"][:4])
    kw = dict(rho=0.05, n_iter=4)
    assert assert_orbit_invariant(model, batch, moving, point, measure="geodesic-mix", rtol=1e-8, **kw)["value"] > 0
    assert_changes(model, batch, moving, point, measure="adaptive", min_rtol=1e-3, **kw)


def test_an_adapter_whose_base_is_not_local_is_refused(lora_dir, tmp_path, capsys):
    """peft writes the hub name or path it was given; geosharp never downloads: a clear error, exit 2."""
    adapter = tmp_path / "adapter"
    shutil.copytree(lora_dir / "adapter", adapter)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "bert-base-uncased"
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    rc = main(["symmetries", str(adapter)])
    err = capsys.readouterr().err
    assert rc == 2 and "is a peft adapter whose base model 'bert-base-uncased' is not a local model directory" in err
    cfg["base_model_name_or_path"] = "../base"  # relative to the adapter directory
    shutil.copytree(lora_dir / "base", tmp_path / "base")
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    assert main(["symmetries", str(adapter)]) == 0
