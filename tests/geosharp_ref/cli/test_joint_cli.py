"""The norm weights' joint quotient from the command line (issue 26): `symmetries` lists the joint groups,
`verify --all-symmetries` moves a pre-norm model along every orbit at once (the norms' rescalings included) and
passes, `evaluate --all-symmetries` records the joint groups and yields nothing."""
from __future__ import annotations

import json

import pytest
import torch

from geosharp_ref.cli import main
from geosharp_ref.sharpness.curvature import curvature
from tests import cases

cases.quiet_transformers()


def _saved(tmp_path, name):
    factory = {"llama": cases.llama, "gpt2": cases.gpt2}[name]
    torch.manual_seed(0)
    factory(initializer_range=cases.IR).save_pretrained(tmp_path / name)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(3, 50, (4, 7), generator=gen)
    targets = torch.cat([x[:, 1:], torch.full((4, 1), -100)], 1)  # the next token; -100 on the last position
    torch.save({"inputs": {"input_ids": x}, "targets": targets}, tmp_path / "lm.pt")
    return str(tmp_path / name), str(tmp_path / "lm.pt")


@pytest.mark.parametrize("name,norms", [("llama", 5), ("gpt2", 4)])
def test_symmetries_lists_the_norms_joint_groups(tmp_path, capsys, name, norms):
    model_dir, data = _saved(tmp_path, name)
    out = tmp_path / "s.json"
    capsys.readouterr()
    assert main(["symmetries", model_dir, "--data", data, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert f"norm weights: {norms} bound" in text and f"joint groups: {norms} symmetries" in text
    assert len(doc["joint"]) == norms and not any("belong to" in e["detail"] for e in doc["further"])
    attn = [j for j in doc["joint"] if j["key"].endswith(("input_layernorm:norm-weights", "ln_1:norm-weights"))]
    assert attn and all(sorted(k.rsplit(":", 1)[1] for k in j["keys"]) == ["qk", "vo"] for j in attn)


@pytest.mark.parametrize("name,norms", [("llama", 5), ("gpt2", 4)])
def test_verify_moves_along_every_orbit_at_once_and_evaluate_records_the_joint_groups(tmp_path, capsys, name, norms):
    model_dir, data = _saved(tmp_path, name)
    capsys.readouterr()
    assert main(["verify", model_dir, "--data", data, "--all-symmetries", "--iters", "3", "--scales", "0.01,100"]) == 0
    text = capsys.readouterr().out
    assert "PASS" in text and "norm-weights" in text and "adaptive sharpness varies" in text
    out = tmp_path / "r.json"
    assert main(["evaluate", model_dir, "--data", data, "--metric", "mix", "--rho", "0.05", "--all-symmetries",
                 "--batch-size", "4", "--iters", "2", "--json", str(out)]) == 0
    line = capsys.readouterr().out
    cfg = json.loads(out.read_text())["config"]
    assert cfg["yielded"] == [] and len(cfg["joint"]) == norms
    assert f"{norms} joint groups (norm weights" in line


def test_curvature_quotients_lora_jointly_with_attention_and_equals_the_library(tmp_path, capsys):
    """`curvature --all-symmetries` on a peft adapter: the adapter is quotiented jointly with its Q/K pairs (the
    joint LoRA factor's Hessian block), and the printed and JSON numbers equal the library's on the same model."""
    pytest.importorskip("peft")
    torch.manual_seed(0)
    base = cases.bert(initializer_range=cases.IR, attn_implementation=None)
    base.save_pretrained(tmp_path / "base")
    model = cases.lora(base, targets=("query",))
    model.save_pretrained(tmp_path / "adapter")
    cfg_path = tmp_path / "adapter" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "base")
    cfg_path.write_text(json.dumps(cfg))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(3, 50, (8, 7), generator=gen), torch.randint(3, (8,), generator=gen)
    torch.save({"inputs": {"input_ids": x}, "targets": y}, tmp_path / "data.pt")
    out = tmp_path / "curv.json"
    capsys.readouterr()
    assert main(["curvature", str(tmp_path / "adapter"), "--data", str(tmp_path / "data.pt"), "--all-symmetries",
                 "--batch-size", "4", "--probes", "3", "--top-k", "1", "--lanczos-steps", "4", "--no-euclidean",
                 "--float64", "--no-progress", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    got = json.loads(out.read_text())["results"]["mix"]
    ref = curvature(model.eval(), [({"input_ids": x[:4]}, y[:4])], "mix", k=1, probes=3, steps=4, symmetries=["all"],
                    dtype=torch.float64)
    assert any(k.endswith(":lora") for k in got["config"]["factors"]) and got["config"]["factors"] == \
        ref.config["factors"]
    assert got["trace"] == pytest.approx(ref.trace, rel=1e-8)
    assert got["eigenvalues"] == pytest.approx(ref.eigenvalues, rel=1e-8)
    assert f"{ref.eigenvalues[0]:.6g}" in printed
