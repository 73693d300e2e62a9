"""`geosharp verify` on tiny saved BERT / ViT models (no network): output, geodesic sharpness and Riemannian
gradient norms invariant along GL(h) orbits, adaptive sharpness not; a non-symmetry fails."""
import json
import re

import pytest

from geosharp_ref.cli import main
from geosharp_ref.symmetry import SymmetryMap
from geosharp_ref.testing import tiny_model
from tests import cases


@pytest.mark.parametrize("model, data", [("bert", False), ("vit", True)])
def test_verify_passes(saved, capsys, model, data):
    argv = ["verify", str(saved / model)] + (["--data", str(saved / f"{model}.pt")] if data else [])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "SymmetryMap: 4 GL(h) groups" in out and "PASS" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["0.01"], ["1"], ["100"])]
    assert len(rows) == 3
    for row in rows:  # scale, output, geo-inv, geo-mix, grad-inv, grad-mix, adaptive [varies]
        assert all(float(v) <= 1e-10 for v in row[1:6]), row
    assert any("varies" in row for row in rows)  # adaptive sharpness is not invariant


def test_verify_fails_when_the_action_is_not_a_symmetry(saved, capsys, monkeypatch):
    monkeypatch.setattr(SymmetryMap, "act", lambda self, params, As: {k: 1.01 * v for k, v in params.items()})
    assert main(["verify", str(saved / "vit"), "--scales", "1", "--iters", "1"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_verify_errors_exit_2(saved, tmp_path, capsys):
    assert main(["verify", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    for bad in (["--rho", "0"], ["--scales", "1,x"], ["--scales", "1,-2"], ["--iters", "0"]):
        assert main(["verify", str(saved / "bert")] + bad) == 2
        assert "geosharp: error:" in capsys.readouterr().err



# -- --examples N: a hypothesis search over group elements ------------------------------------------------------

LORA_SPEC = cases.ROOT / "examples" / "lora_spec.py"
#: examples/lora_spec.py with B of each layer's MLP adapter paired with A of the same layer's query adapter: the
#: shapes fit (B: d_out × r, Aᵀ: d_in × r), but the action changes both adapters' products — no symmetry
WRONG_LORA_SPEC = (LORA_SPEC.read_text()
                   .replace('"B": "{adapter}.lora_B.default.weight"', '"B": "{layer}.intermediate.dense.lora_B.default.weight"')
                   .replace('"{adapter}.lora_A.default.weight"', '"{layer}.attention.self.query.lora_A.default.weight"'))


@pytest.fixture(scope="module")
def lora_adapter(tmp_path_factory):
    """A tiny peft-LoRA BERT (geosharp_ref.testing.tiny_model; adapters on query and intermediate.dense, lora_B
    random) saved as base/ + adapter/, and kernels/lora_hybrid.py derived from examples/lora_spec.py."""
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("lora_verify")
    base = tiny_model("bert")
    base.save_pretrained(root / "base")
    model = tiny_model("bert", lora=("query", "intermediate.dense"))
    model.save_pretrained(root / "adapter")
    cfg = json.loads((root / "adapter" / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(root / "base")
    (root / "adapter" / "adapter_config.json").write_text(json.dumps(cfg))
    assert main(["derive", "--spec", str(LORA_SPEC), "--out", str(root / "kernels")]) == 0
    return root


def test_verify_examples_searches_every_binding(saved, capsys):
    argv = ["verify", str(saved / "bert"), "--scales", "1", "--iters", "2", "--examples", "3", "--seed", "7"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "hypothesis search: 3 examples per search, scales a log-uniform in [0.01, 100], seed 7" in out
    assert out.count("    searched bert.encoder.layer.") == 4 and "searched orbit points" in out and "PASS" in out
    assert "the hypothesis search (3 examples per search, seed 7) found no counterexample" in out


def test_verify_examples_passes_with_the_lora_spec(lora_adapter, capsys):
    argv = ["verify", str(lora_adapter / "adapter"), "--spec", str(lora_adapter / "kernels" / "lora_hybrid.py"),
            "--iters", "2", "--scales", "1", "--examples", "2"]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.count("    searched lora_hybrid:adapter=") == 4 and "searched orbit points" in out and "PASS" in out


def test_verify_examples_fails_with_the_shrunk_counterexample(lora_adapter, tmp_path, capsys):
    """A spec whose binding is no symmetry: the search (before the fixed check) shrinks to a = 1, seed 0."""
    spec = tmp_path / "wrong_spec.py"
    spec.write_text(WRONG_LORA_SPEC)
    argv = ["verify", str(lora_adapter / "adapter"), "--spec", str(spec), "--metric", "lora_hybrid", "--iters", "1",
            "--examples", "5", "--seed", "3"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("geosharp: error: verify --examples 5 --seed 3: hypothesis found a counterexample and "
                          "shrank it to a minimal one: binding lora_hybrid:layer=") and err.count("\n") == 1, err
    assert re.search(r"scale a = 1\.0, seed 0: the log-probabilities changed by [0-9.e+-]+ \(relative max-abs, "
                     r"float64; tolerance 1e-10\)", err), err


@pytest.mark.parametrize("n", ["0", "-3"])
def test_verify_examples_must_be_positive(saved, capsys, n):
    assert main(["verify", str(saved / "bert"), "--examples", n]) == 2
    err = capsys.readouterr().err
    assert err == f"geosharp: error: --examples must be at least 1 (the number of group elements hypothesis draws " \
                  f"per search), got {n}\n"
