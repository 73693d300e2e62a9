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
    batch = ({"input_ids": torch.randint(3, 50, (4, 7), generator=torch.Generator().manual_seed(1))},
             torch.tensor([0, 1, 2, 1]))
    return model, batch


@pytest.fixture(scope="package")
def bert():
    """A tiny BERT (float64, eval, initializer range cases.IR) and a batch of 4 sequences of 7 tokens."""
    torch.manual_seed(0)
    return cases.bert(initializer_range=cases.IR).to(torch.float64).eval(), cases.text_batch64()
