"""Shared test configuration.

Hypothesis profiles: ``ci`` (fixed example budget, derandomized: the same examples on every run, used
by ``make test``) and ``dev`` (more examples, random). Select with HYPOTHESIS_PROFILE.
"""
import os

import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=15,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# under pytest-xdist (make test: one process per core) each worker keeps to one intra-op thread: two spinning
# OpenMP threads per process on a core shared with another worker slow everything down
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, torch.get_num_threads())))


def pytest_addoption(parser):
    parser.addoption("--reversed-order", action="store_true", default=False,
                     help="run the collected tests in reverse order (no test may depend on another's files or state)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--reversed-order"):
        items.reverse()
