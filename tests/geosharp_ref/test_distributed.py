"""Sharding of work across torchrun ranks (geosharp_ref.distributed); the process group's timeout per backend; a
rank dies with its launcher."""
import os
import signal
import subprocess
import sys
import time

import pytest

from geosharp_ref import distributed as gdist
from geosharp_ref.distributed import shard
from tests.cases import ROOT


def test_shard_is_a_disjoint_cover():
    items = list(range(11))
    shards = [x for r in range(3) for x in shard(items, r, 3)]
    assert sorted(shards) == items and len(shards) == len(items)


@pytest.mark.parametrize("backend, timeout", [("gloo", gdist.COLLECTIVE_TIMEOUT_S), ("nccl", gdist.NCCL_TIMEOUT_S)])
def test_a_rank_waits_days_on_gloo_and_an_hour_on_nccl(monkeypatch, backend, timeout):
    """Under torchrun (WORLD_SIZE 2) the group is made with the backend's timeout: a gloo rank that finished its
    shard outwaits a CPU evaluation of a model (longer than the hour it used to be)."""
    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(gdist.dist, "init_process_group", lambda **kw: calls.append(kw))
    monkeypatch.setattr(gdist.dist, "destroy_process_group", lambda: calls.append("destroyed"))
    monkeypatch.setattr(gdist, "die_with_parent", lambda: calls.append("pdeathsig"))
    monkeypatch.setattr(gdist.torch.cuda, "set_device", lambda i: None)
    with gdist.maybe_init(backend):
        pass
    assert calls[0] == "pdeathsig" and calls[-1] == "destroyed"
    assert calls[1]["backend"] == backend and calls[1]["timeout"].total_seconds() == timeout
    assert gdist.COLLECTIVE_TIMEOUT_S >= 24 * 3600 > gdist.NCCL_TIMEOUT_S


PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "from geosharp_ref.distributed import die_with_parent; "
                          "import time; assert die_with_parent(); print('armed', flush=True); time.sleep(120)"],
                         start_new_session=True, stdout=subprocess.PIPE, text=True)  # as torchrun starts a rank
assert child.stdout.readline().strip() == "armed"
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux only")
def test_a_rank_in_a_session_of_its_own_dies_when_its_launcher_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # alive while its launcher is
        parent.send_signal(signal.SIGKILL)  # no handler runs: only the kernel can end the child
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the child outlived its killed launcher")
    finally:
        parent.kill()
