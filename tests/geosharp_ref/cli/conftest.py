"""Tiny saved BERT / ViT models (tests/cases) and data files for the `evaluate` and `verify` commands."""
import pytest
import torch

from tests import cases


@pytest.fixture(scope="package")
def saved(tmp_path_factory):
    """bert/, vit/ (save_pretrained, initializer range 0.5: attention far from uniform), bert.pt (10
    examples), vit.pt (6) and vit_nan.pt (a NaN in example 1)."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    bert = cases.bert(initializer_range=cases.IR, attn_implementation=None)
    bert.save_pretrained(root / "bert")
    torch.save({"inputs": {"input_ids": torch.randint(50, (10, 8), generator=gen)},
                "targets": torch.randint(3, (10,), generator=gen)}, root / "bert.pt")
    vit = cases.vit(initializer_range=cases.IR, attn_implementation=None)
    vit.save_pretrained(root / "vit")
    pixels = torch.randn(6, 3, 8, 8, generator=gen)
    torch.save({"inputs": {"pixel_values": pixels}, "targets": torch.randint(3, (6,), generator=gen)},
               root / "vit.pt")
    bad = pixels.clone()
    bad[1, 0, 0, 0] = float("nan")
    torch.save({"inputs": bad, "targets": torch.zeros(6, dtype=torch.long)}, root / "vit_nan.pt")
    return root
