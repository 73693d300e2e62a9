"""keep_freed_memory: after it, repeated large allocate/free cycles (what an Auto-PGD iteration does)
take no page faults; without it glibc returns the memory to the kernel and faults it in again."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from geosharp_ref.cpu_allocator import _glibc

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, resource, sys, torch
torch.set_num_threads(1)
if sys.argv[1] == "tuned":
    from geosharp_ref.cpu_allocator import keep_freed_memory
    assert keep_freed_memory() and keep_freed_memory()
def cycle():  # 40 temporaries of 8 MiB alive at once, then freed: an iteration's pattern
    xs = [torch.ones(2 * 1024 * 1024) for _ in range(40)]
    return float(sum(x[0] for x in xs))
cycle(); cycle()  # warm-up: the heap grows once
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0))
"""


def _faults(mode):
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(_glibc() is None, reason="glibc only")
def test_tuned_allocator_reuses_memory_instead_of_faulting_it_in():
    default, tuned = _faults("default"), _faults("tuned")
    pages = 5 * 40 * 8 * 1024 * 1024 // 4096  # what five cycles touch
    assert default > 0.5 * pages, default  # glibc's default: every cycle faults its memory in again
    assert tuned < 0.02 * pages, tuned     # tuned: the freed heap is reused
