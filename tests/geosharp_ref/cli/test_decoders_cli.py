"""Decoders on the command line (issue 30): peft adapters on a tiny Llama in every command, rank-deficient
(fresh, B = 0) adapters refused before any compute, the measure named truthfully, refusals summarised per
layer, --num-labels on a decoder (last non-padding token), batches without a scored token refused."""
import json

import peft
import pytest
import torch

from geosharp_ref import geodesic_sharpness
from geosharp_ref.symmetry.adapters import lora_bindings
from geosharp_ref.symmetry.check import check_symmetries_together, rank_refusal
from geosharp_ref.symmetry.gated import gated_mlp_candidates
from geosharp_ref.sharpness.factors import check_rank
from tests import cases

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EVERY = ATTENTION + ["gate_proj", "up_proj", "down_proj"]


def _adapter(root, name, targets, trained):
    """A peft LoRA adapter (r = 2) on the tiny Llama saved in root/base; ``trained``: B drawn N(0, 0.1²)
    instead of peft's B = 0."""
    torch.manual_seed(0)
    model = cases.llama()
    model.load_state_dict(torch.load(root / "base.sd"))
    pm = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=targets))
    if trained:
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    pm.save_pretrained(root / name)
    cfg = json.loads((root / name / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(root / "base")
    (root / name / "adapter_config.json").write_text(json.dumps(cfg))
    return root / name


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    torch.manual_seed(0)
    base = cases.llama()
    base.save_pretrained(root / "base")
    torch.save(base.state_dict(), root / "base.sd")
    _adapter(root, "down", ["down_proj"], trained=False)
    _adapter(root, "qv_fresh", ["q_proj", "v_proj"], trained=False)
    _adapter(root, "every", EVERY, trained=True)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 50, (8, 6), generator=gen)
    mask = torch.ones_like(ids)
    targets = torch.cat([ids[:, 1:], torch.full((8, 1), -100)], 1)
    torch.save({"inputs": {"input_ids": ids, "attention_mask": mask}, "targets": targets}, root / "lm.pt")
    unscored = targets.clone()
    unscored[4:] = -100  # the second batch of 4 has no scored token
    torch.save({"inputs": {"input_ids": ids, "attention_mask": mask}, "targets": unscored}, root / "unscored.pt")
    cls_ids = ids.clone()
    cls_mask = mask.clone()
    pad = base.config.pad_token_id
    cls_ids[::2, 4:], cls_mask[::2, 4:] = pad, 0  # right padding: the last real token differs per example
    torch.save({"inputs": {"input_ids": cls_ids, "attention_mask": cls_mask}, "targets": torch.arange(8) % 3},
               root / "cls.pt")
    return root


def test_symmetries_of_an_adapter_on_a_residual_writer(saved, capsys):
    """peft names the wrapped writer …down_proj.base_layer.weight: no KeyError, the adapters found (a fresh
    one refused for its singular Gram matrix), and norm scaling considered with the wrapped names."""
    rc, out, err = cases.run_cli(capsys, ["symmetries", saved / "down", "--json", saved / "down.json"])
    assert rc == 0, err
    doc = json.loads((saved / "down.json").read_text())
    lora = {e["key"]: e for e in doc["further"] if e["key"].endswith(":lora")}
    assert set(lora) == {f"base_model.model.model.layers.{i}.mlp.down_proj:lora" for i in range(2)}
    # a fresh adapter (B = 0): refused before any compute, its reason given
    assert all(e["status"] == "refused" and "rank deficient" in e["detail"] for e in lora.values())
    assert any(e["kind"] == "norm scaling" for e in doc["further"])


def test_rank_refusal_agrees_with_the_factor_check(saved):
    """The refusal before any compute and the GL factor's own rank check (sharpness.factors.check_rank) agree:
    a fresh adapter (B = 0) is refused by both, a trained one by neither."""
    from geosharp_ref.io.models import load_model

    for name, singular in (("qv_fresh", True), ("every", False)):
        model = load_model(saved / name)
        params = {n: p.detach().double() for n, p in model.named_parameters()}
        for b in lora_bindings(model):
            why = rank_refusal(b, params)
            G, H = b.extract(params)
            if singular:
                assert why and "rank deficient" in why and "B = 0" in why
                with pytest.raises(ValueError, match="rank deficient"):
                    check_rank(b.key, ("G", "H"), (G, H))
            else:
                assert why is None
                check_rank(b.key, ("G", "H"), (G, H))


def test_fresh_adapter_with_spec_is_refused_and_falls_back(saved, capsys):
    """--spec on a fresh adapter: every declared binding refused with its reason (one line per reason over the
    layers), no LinAlgError, and the value equals plain geodesic-mix sharpness (nothing declared was used)."""
    common = ["--data", saved / "lm.pt", "--rho", "0.05", "--batch-size", "4", "--iters", "2", "--device", "cpu"]
    rc, out, err = cases.run_cli(capsys, ["evaluate", saved / "qv_fresh", "--metric", "lora_hybrid", "--spec",
                                          "examples/lora_spec.py", "--json", saved / "fresh_spec.json", *common])
    assert rc == 0, err
    refusals = [line for line in out.splitlines() if line.strip().startswith("refused")]
    assert len(refusals) == 2 and all("(2 layers)" in r and "rank deficient" in r for r in refusals)
    assert "lora_hybrid on 0 declared bindings" in out
    rc, plain, err = cases.run_cli(capsys, ["evaluate", saved / "qv_fresh", "--metric", "mix", "--json",
                                            saved / "fresh_plain.json", *common])
    assert rc == 0, err
    spec_doc = json.loads((saved / "fresh_spec.json").read_text())
    plain_doc = json.loads((saved / "fresh_plain.json").read_text())
    assert spec_doc["per_batch"] == pytest.approx(plain_doc["per_batch"], rel=1e-6)


def test_spec_names_what_was_quotiented(saved, capsys):
    """Adapters on every projection: the attention pairs yield to the declared LoRA bindings, and the measure
    line says so (0 pairs kept, 4 yielded, 14 declared), as the JSON's config does."""
    rc, out, err = cases.run_cli(capsys, ["evaluate", saved / "every", "--metric", "lora_hybrid", "--spec",
                                          "examples/lora_spec.py", "--data", saved / "lm.pt", "--rho", "0.05",
                                          "--batch-size", "4", "--batches", "1", "--iters", "1",
                                          "--json", saved / "every.json"])
    assert rc == 0, err
    cfg = json.loads((saved / "every.json").read_text())["config"]
    assert cfg["pairs"] == 0 and len(cfg["yielded"]) == 4 and len(cfg["factors"]) == 14
    line = next(x for x in out.splitlines() if x.strip().startswith("measure"))
    assert "mix on 0 attention pairs (4 yielded to bindings)" in line and "lora_hybrid on 14 declared" in line


def test_refusals_repeated_per_layer_are_one_line(capsys, tmp_path):
    """QK-norm (Qwen3) refuses every layer's Q/K pair for the same reason: one line with the count and range."""
    import transformers as T

    cfg = T.Qwen3Config(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=32,
                        attn_implementation="eager")
    torch.manual_seed(0)
    T.Qwen3ForCausalLM(cfg).save_pretrained(tmp_path / "qwen3")
    rc, out, err = cases.run_cli(capsys, ["symmetries", tmp_path / "qwen3"])
    assert rc == 0, err
    qk = [line for line in out.splitlines() if "self_attn" in line and "QK" in line.upper() and "norm" in line.lower()]
    assert len(qk) == 1 and "(3 layers)" in qk[0] and "{0–2}" in qk[0], out


def test_num_labels_on_a_decoder_pools_the_last_token(saved, capsys):
    """--num-labels 3 on a decoder: the probe's features are the last non-padding token's, so the fitted head on
    them gives the whole model's logits (transformers pools them there); evaluate runs."""
    from geosharp_ref.cli.common import load_model_with_head
    from geosharp_ref.forward import model_logits

    from geosharp_ref.probe import classification_head, head_features

    data = torch.load(saved / "cls.pt")
    model, probe = load_model_with_head(saved / "base", 3, (data["inputs"], data["targets"], 8), seed=0)
    assert type(model).__name__ == "LlamaForSequenceClassification" and probe["examples"] == 8
    head = classification_head(model, 3)
    features = head_features(model, head, data["inputs"])
    with torch.no_grad():
        logits = model_logits(model(**data["inputs"]))  # transformers' own pooling
        last = model.model(**data["inputs"]).last_hidden_state[:, -1]
        fitted = head(features)
    assert features.shape == (8, 16) and logits.shape == (8, 3)
    torch.testing.assert_close(fitted, logits, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(features[::2], last[::2])  # the padded examples are not read at the last position
    rc, out, err = cases.run_cli(capsys, ["evaluate", saved / "base", "--data", saved / "cls.pt", "--num-labels", "3",
                                          "--rho", "0.05", "--metric", "mix", "--batch-size", "4", "--iters", "1"])
    assert rc == 0, err
    assert "probe" in out and "mean" in out


def test_a_batch_without_scored_tokens_is_refused(saved, capsys):
    """All targets −100 in a batch: the mean cross-entropy would be NaN; refused in one line before the model
    is loaded (CLI) and by the library before any compute."""
    rc, out, err = cases.run_cli(capsys, ["evaluate", saved / "base", "--data", saved / "unscored.pt", "--rho", "0.05",
                                          "--metric", "mix", "--batch-size", "4"])
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "batch 1: every target is -100" in err
    data = torch.load(saved / "unscored.pt")
    model = cases.llama()
    with pytest.raises(ValueError, match="no position is scored"):
        geodesic_sharpness(model, [({k: v[4:] for k, v in data["inputs"].items()}, data["targets"][4:])], 0.05,
                           n_iter=1)


def test_bindings_checked_together_fail_when_one_is_not_a_symmetry():
    """The joint check of many bindings (one forward per scale) passes for the gated units of a float64 decoder,
    and fails as soon as a binding that is not a symmetry is among them."""
    model = cases.llama().double()
    batch = ({"input_ids": torch.randint(50, (2, 5), generator=torch.Generator().manual_seed(0))}, None)
    gated = [c.binding for c in gated_mlp_candidates(model, "mix") if c.binding is not None]
    assert len(gated) == 2
    assert check_symmetries_together(model, gated, batch) <= 1e-10

    class Scale:  # scales an embedding row: changes the output
        key, param_names = "not-a-symmetry", ("model.embed_tokens.weight",)

        def random_element(self, params, scale=1.0, seed=0):
            return scale

        def act(self, params, a):
            out = dict(params)
            out["model.embed_tokens.weight"] = params["model.embed_tokens.weight"] * a
            return out

    with pytest.raises(ValueError, match="not a symmetry"):
        check_symmetries_together(model, gated + [Scale()], batch)
