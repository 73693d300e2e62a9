"""Evaluator tests run tiny models: intra-op threads gain nothing there, and on a shared 2-core machine
two spinning OpenMP threads per process made them up to 6-27x slower. One thread per test module,
restored afterwards.

Saved artefacts several test packages read (io, studies.population): a model-soups CLIP checkpoint and a
Hugging Face BERT classifier in both weight formats (the models come from tests/cases/models.py)."""
import pytest
import torch

from tests import cases


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def soup(tmp_path_factory):
    """A model-soups checkpoint of tests.cases' CLIP_SOUP_SMALL (seed 1): (path, state dict)."""
    path = tmp_path_factory.mktemp("soup") / "model_0.pt"
    return path, cases.save_clip_soup(path, seed=1)


@pytest.fixture(scope="session")
def berts(tmp_path_factory):
    """The BERT classifier of tests/cases/models.py saved as safetensors (st/) and as a legacy .bin (bin/): (model, root)."""
    root = tmp_path_factory.mktemp("bert")
    m = cases.bert_classifier()
    m.save_pretrained(root / "st")
    cases.save_bin(m, root / "bin")
    return m, root
