"""``geosharp_ref.io.machine.cpu_name``: the model name of /proc/cpuinfo, else platform's processor or machine."""
import io
import platform
from pathlib import Path

import pytest

from geosharp_ref.io import machine


def _fallback():
    return platform.processor() or platform.machine()


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="no /proc/cpuinfo on this system")
def test_cpu_name_is_the_first_model_name_of_proc_cpuinfo():
    names = [line.partition(":")[2].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")]
    assert machine.cpu_name() == (names[0] if names else _fallback())


def test_cpu_name_reads_the_first_model_name_line(monkeypatch):
    text = "processor\t: 0\nmodel name\t: Chip A  \nprocessor\t: 1\nmodel name\t: Chip B\n"
    monkeypatch.setattr(machine, "open", lambda *a, **k: io.StringIO(text), raising=False)
    assert machine.cpu_name() == "Chip A"


@pytest.mark.parametrize("opener", [
    lambda *a, **k: io.StringIO("processor\t: 0\nCPU implementer\t: 0x41\n"),  # no model name line (ARM)
    lambda *a, **k: (_ for _ in ()).throw(OSError("no /proc")),                  # not Linux
], ids=["no-model-name", "unreadable"])
def test_cpu_name_falls_back_to_platform(monkeypatch, opener):
    monkeypatch.setattr(machine, "open", opener, raising=False)
    assert machine.cpu_name() == _fallback() and machine.cpu_name()
