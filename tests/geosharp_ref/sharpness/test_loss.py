"""Targets that do not fit the logits are refused with a message that says what is wrong (not an IndexError
deep inside cross-entropy); fitting targets give exactly torch's cross-entropy."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from geosharp_ref.sharpness.loss import default_loss, model_logits


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
