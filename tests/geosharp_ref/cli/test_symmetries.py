"""`geosharp symmetries`: what was found, bound and refused in a saved model, as text and JSON, checked
against the symmetry map built directly."""
import json

import torch

from geosharp_ref.cli import main
from geosharp_ref.symmetry import symmetry_map
from tests import cases


def test_symmetries_lists_bound_pairs_and_gated_units(tmp_path, capsys):
    model = cases.llama()  # rotary embeddings: Q/K bound under the RoPE subgroup, V/O under GL(h)
    model.save_pretrained(tmp_path / "llama")
    out = tmp_path / "s.json"
    capsys.readouterr()
    assert main(["symmetries", str(tmp_path / "llama"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    smap = symmetry_map(model)
    doc = json.loads(out.read_text())
    assert [g["key"] for g in doc["groups"]] == [g.key for g in smap.groups]
    assert sorted(g["kind"] for g in doc["groups"]) == ["qk", "qk", "vo", "vo"]
    assert doc["refused"] == [] and smap.refused == []
    assert f"bound: {len(smap.groups)} GL(h) attention groups" in text
    assert "bound   lm_head.weight:translation" in text  # the softmax over the vocabulary, per token
    assert "gated-MLP units: 2 bound, 0 refused" in text  # SwiGLU: up rows × a, down columns ÷ a
    assert "ReLU units" not in text  # the MLPs are gated: no "no MLP of a recognised layout" line
    assert {e["kind"] for e in doc["further"]} == {"gated-MLP units", "softmax translation", "norm scaling",
                                                   "norm weights"}
    # the norms' weights are quotiented jointly with the symmetries of their readers, and listed as joint groups
    joint = {j["key"]: j["keys"] for j in doc["joint"]}
    assert len(joint) == 5 and "joint groups: 5 symmetries" in text
    assert any(k.endswith(":qk") for k in joint["model.layers.0.input_layernorm:norm-weights"])
    assert joint["model.norm:norm-weights"] == ["lm_head.weight:translation"]


def test_symmetries_of_a_relu_bert_binds_units_head_and_embedding_scaling(tmp_path, capsys):
    """ReLU MLPs, a classifier head and LayerNorms with eps = 0: every built-in symmetry is bound; the same
    model with the default eps refuses the embedding scaling with the measured change."""
    for eps, name in ((0.0, "exact"), (1e-12, "default")):
        cases.bert(initializer_range=cases.IR, hidden_act="relu", layer_norm_eps=eps).save_pretrained(tmp_path / name)
    out = tmp_path / "s.json"
    capsys.readouterr()
    assert main(["symmetries", str(tmp_path / "exact"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    status = {(e["kind"], e["status"]) for e in doc["further"]}
    assert status == {("ReLU units", "bound"), ("softmax translation", "bound"), ("norm scaling", "bound")}
    assert "ReLU units: 2 bound, 0 refused" in text and "further built-in symmetries" in text
    assert main(["symmetries", str(tmp_path / "default")]) == 0
    text = capsys.readouterr().out
    assert "norm scaling: 0 bound, 1 refused" in text and "eps" in text and "changed the output by" in text


def test_symmetries_of_a_missing_directory_is_one_error_line(tmp_path, capsys):
    assert "nope" in cases.cli_error_line(capsys, ["symmetries", str(tmp_path / "nope")])


def test_verify_and_evaluate_with_every_symmetry_quotiented(tmp_path, capsys):
    """`verify --all-symmetries` moves the model along every bound orbit (attention, ReLU units, head
    translation, embedding scaling) and passes; `evaluate --all-symmetries` reports the factors."""
    cases.bert(initializer_range=cases.IR, hidden_act="relu", layer_norm_eps=0.0).save_pretrained(tmp_path / "m")
    gen = torch.Generator().manual_seed(0)
    torch.save({"inputs": {"input_ids": torch.randint(3, 50, (4, 7), generator=gen)},
                "targets": torch.randint(3, (4,), generator=gen)}, tmp_path / "d.pt")
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "m"), "--data", str(tmp_path / "d.pt"), "--all-symmetries",
                 "--iters", "3", "--scales", "0.01,100"]) == 0
    text = capsys.readouterr().out
    assert "PASS" in text and "4 bindings" in text and "adaptive sharpness varies" in text
    out = tmp_path / "r.json"
    assert main(["evaluate", str(tmp_path / "m"), "--data", str(tmp_path / "d.pt"), "--metric", "inv", "--rho", "0.05",
                 "--all-symmetries", "--batch-size", "4", "--iters", "2", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert len(d["config"]["factors"]) == 8 and d["config"]["metric"] == "inv"
