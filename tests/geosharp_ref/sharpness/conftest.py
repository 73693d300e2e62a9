"""Fixtures shared by the sharpness tests."""
import warnings

import pytest
import torch

from geosharp_ref.testing import tiny_batch, tiny_model


@pytest.fixture(scope="module")
def bert():
    """``geosharp_ref.testing``'s tiny BERT in float64 and its batch (one per test module: tests may move it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tiny_model("bert").to(torch.float64)
    return model, tiny_batch(model)
