"""A tiny vision population (tests/cases: 4 ViTs, 2 epochs), trained once for the package, and an
uninterrupted single-process evaluation of a copy of it (the reference the resumed, killed and
distributed evaluations must reproduce)."""
import shutil

import pytest
import torch

from geosharp_ref.studies import population as pop
from tests import cases


@pytest.fixture(scope="package")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("pop") / "vit"
    torch.set_num_threads(1)
    pop.train_population(out, **cases.POPULATION_TRAIN)
    return out


@pytest.fixture(scope="package")
def reference(trained, tmp_path_factory):
    """An uninterrupted single-process evaluation (in a copy of the population)."""
    out = tmp_path_factory.mktemp("ref") / "vit"
    shutil.copytree(trained, out)
    torch.set_num_threads(1)
    pop.evaluate_population(out, **cases.POPULATION_EVAL)
    return out
