"""Fixtures shared by the symmetry tests (models from tests/cases/models.py)."""
import pytest
import torch

from tests import cases


@pytest.fixture(scope="package")
def lora_bert():
    """A tiny BERT (float64, eval) with peft LoRA (r = 2) on query and value, B made non-zero (as after
    training), and a batch of 4 sequences of 7 tokens."""
    pytest.importorskip("peft")
    torch.manual_seed(0)
    model = cases.lora(cases.bert(initializer_range=cases.IR)).to(torch.float64).eval()
    return model, cases.text_batch64()


@pytest.fixture(scope="package")
def bert():
    """A tiny BERT (float64, eval, initializer range cases.IR) and a batch of 4 sequences of 7 tokens."""
    torch.manual_seed(0)
    return cases.bert(initializer_range=cases.IR).to(torch.float64).eval(), cases.text_batch64()
