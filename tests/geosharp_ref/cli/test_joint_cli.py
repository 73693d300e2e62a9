"""The norm weights' joint quotient from the command line (issue 26): `symmetries` lists the joint groups,
`verify --all-symmetries` moves a pre-norm model along every orbit at once (the norms' rescalings included) and
passes, `evaluate --all-symmetries` records the joint groups and yields nothing."""
from __future__ import annotations

import json

import pytest
import torch

from geosharp_ref.cli import main
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


def test_curvature_refuses_the_joint_lora_factor_in_one_line(tmp_path, capsys):
    """The Riemannian Hessian needs generated-kernel factors; LoRA × attention is a generic joint factor: one error
    line, exit 2, before any Hessian-vector product."""
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
    torch.save({"inputs": {"input_ids": torch.randint(3, 50, (8, 7), generator=gen)},
                "targets": torch.randint(3, (8,), generator=gen)}, tmp_path / "data.pt")
    capsys.readouterr()
    assert main(["curvature", str(tmp_path / "adapter"), "--data", str(tmp_path / "data.pt"), "--all-symmetries",
                 "--probes", "2", "--top-k", "1", "--lanczos-steps", "3", "--no-euclidean"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("geosharp: error:")]
    assert len(err) == 1 and "JointLoRAFactor (LoRA × attention)" in err[0]
