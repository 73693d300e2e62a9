"""Evaluator tests run tiny models: intra-op threads gain nothing there, and on a shared 2-core machine
two spinning OpenMP threads per process made them up to 6-27x slower. One thread per test module,
restored afterwards."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
