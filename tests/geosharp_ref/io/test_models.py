"""Hugging Face directories (geosharp_ref.io.models): a BERT classifier (MNLI-like, 3 labels; tests/cases)
saved as safetensors and as a legacy pytorch_model.bin loads to identical logits; a checkpoint without
its classifier weights is refused; the loader follows config.architectures; bad directories are refused."""
from __future__ import annotations

import logging

import pytest
import torch

from geosharp_ref.io.models import check_model_dir, load_hf_classifier, load_model, loader_for
from geosharp_ref.symmetry import symmetry_map
from tests import cases
from tests.cases import bert_inputs as _batch, save_bin as _save_bin

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()


def test_hf_bert_safetensors_and_bin_load_identically(berts):
    m, root = berts
    assert (root / "st" / "model.safetensors").is_file() and not (root / "st" / "pytorch_model.bin").exists()
    assert (root / "bin" / "pytorch_model.bin").is_file() and not (root / "bin" / "model.safetensors").exists()
    batch = _batch()
    with torch.no_grad():
        ref = m(**batch).logits
        outs = []
        for sub in ("st", "bin"):
            a = load_hf_classifier(root / sub)
            b = load_model(root / sub)
            assert type(a).__name__ == "BertForSequenceClassification" and not a.training
            assert a.config.num_labels == 3
            la, lb = a(**batch).logits, b(**batch).logits
            assert la.shape == (3, 3) and torch.equal(la, lb)
            outs.append(la)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0], ref)
    smap = symmetry_map(load_hf_classifier(root / "bin"))
    assert len(smap.groups) == 4 and sum(g.num_heads for g in smap.groups) == 2 * 4 * 2


def test_hf_checkpoint_without_classifier_is_refused(berts, tmp_path):
    m, _ = berts
    _save_bin(m, tmp_path / "nohead", {k: v for k, v in m.state_dict().items() if not k.startswith("classifier")})
    with pytest.raises(ValueError, match=r"missing 2 weights \['classifier\.bias', 'classifier\.weight'\]"):
        load_hf_classifier(tmp_path / "nohead")
    (tmp_path / "noweights").mkdir()
    m.config.save_pretrained(tmp_path / "noweights")
    with pytest.raises(FileNotFoundError, match="no PyTorch weights"):
        load_hf_classifier(tmp_path / "noweights")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_hf_classifier(tmp_path)


@pytest.mark.parametrize("name, cls", [("gpt2", "GPT2LMHeadModel"), ("vit", "ViTForImageClassification"),
                                       ("bert", "BertForSequenceClassification")])
def test_load_model_follows_the_architecture_and_is_eager(name, cls, tmp_path):
    torch.manual_seed(0)
    m = getattr(cases, name)(attn_implementation=None).eval()
    m.save_pretrained(tmp_path / name)
    loaded = load_model(tmp_path / name)
    assert type(loaded).__name__ == cls and not loaded.training
    assert loaded.config._attn_implementation == "eager"
    assert loader_for(loaded.config).__name__ in (cls, "AutoModelForSequenceClassification",
                                                  "AutoModelForImageClassification")
    sd = m.state_dict()
    assert all(torch.equal(v, sd[k]) for k, v in loaded.state_dict().items())


def test_check_model_dir_and_unloadable_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*never downloaded"):
        check_model_dir(tmp_path / "bert-base-uncased")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_model(tmp_path)
    (tmp_path / "cfg").mkdir()
    cases.bert().config.save_pretrained(tmp_path / "cfg")  # config.json but no weights
    assert check_model_dir(tmp_path / "cfg") == tmp_path / "cfg"
    with pytest.raises(FileNotFoundError, match="has config.json but no PyTorch weights"):
        load_model(tmp_path / "cfg")
    (tmp_path / "cfg" / "model.safetensors").write_bytes(b"not a safetensors file")  # corrupt weights
    with pytest.raises(ValueError, match="could not load a model from"):
        load_model(tmp_path / "cfg")

