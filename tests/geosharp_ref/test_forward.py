"""Targets that do not fit the logits are refused with a message that says what is wrong (not an IndexError
deep inside cross-entropy); fitting targets give exactly torch's cross-entropy."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from geosharp_ref.forward import default_loss, model_logits


@given(batch=st.integers(1, 6), classes=st.integers(2, 7), seed=st.integers(0, 2 ** 16))
def test_default_loss_is_cross_entropy(batch, classes, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, classes, generator=g, dtype=torch.float64)
    y = torch.randint(classes, (batch,), generator=g)
    assert float(default_loss(logits, y)) == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-15)


@pytest.mark.parametrize("targets,message", [
    (torch.tensor([0, 3]), r"class indices in \[0, 3\).*found \[3\]"),
    (torch.tensor([-1, 0]), r"class indices in \[0, 3\).*found \[-1\]"),
    (torch.tensor([0.0, 1.0]), r"integer class indices.*torch.float32"),
    (torch.tensor([0, 1, 2]), r"shape \(3,\) do not match.*expected \(2,\)"),
    (torch.tensor([True, False]), r"integer class indices.*torch.bool"),
])
def test_bad_targets_are_refused(targets, message):
    with pytest.raises(ValueError, match=message):
        default_loss(torch.zeros(2, 3), targets)


def test_hidden_states_are_not_logits():
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    out = BaseModelOutputWithPooling(last_hidden_state=torch.zeros(1, 2, 4), pooler_output=torch.zeros(1, 4))
    with pytest.raises(ValueError, match="hidden states, not logits.*--num-labels K"):
        model_logits(out)


def test_ignored_positions_give_the_pretraining_loss():
    """−100 marks positions outside the loss (masked-LM's unmasked tokens): the mean over the others."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g, dtype=torch.float64)
    y = torch.randint(11, (2, 5), generator=g)
    y[0, :3] = -100
    kept = y != -100
    want = F.cross_entropy(logits[kept], y[kept])
    assert float(default_loss(logits, y)) == pytest.approx(float(want), rel=1e-15)
    with pytest.raises(ValueError, match=r"found \[-5\]"):
        default_loss(logits, torch.full((2, 5), -5))


def test_masked_lm_checkpoint_is_evaluated_with_its_own_loss(tmp_path):
    """A BertForMaskedLM directory: per-token logits, targets the tokens at masked positions (−100 elsewhere)."""
    import transformers

    from geosharp_ref.cli import main

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16)
    transformers.BertForMaskedLM(cfg).save_pretrained(tmp_path / "mlm")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 40, (4, 8), generator=g)
    targets = torch.full_like(ids, -100)
    targets[:, 2] = ids[:, 2]
    ids[:, 2] = 4  # the masked position shows a [MASK]-like token
    torch.save({"inputs": {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, "targets": targets},
               tmp_path / "mlm.pt")
    assert main(["evaluate", str(tmp_path / "mlm"), "--data", str(tmp_path / "mlm.pt"), "--rho", "0.05",
                 "--metric", "mix", "--batch-size", "2", "--iters", "2", "--json", str(tmp_path / "r.json")]) == 0
    import json

    d = json.loads((tmp_path / "r.json").read_text())
    assert d["model_class"] == "BertForMaskedLM" and d["mean"] >= 0
