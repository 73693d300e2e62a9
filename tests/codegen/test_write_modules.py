"""Generated kernel files are ordinary files: mode 0644 less the umask (mkstemp alone would give 0600)."""
import os
import stat

from codegen.generate import write_modules


class _Module:
    name = "probe_kernel"
    source = "X = 1\n"


def test_generated_files_get_normal_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        (path,) = write_modules([_Module()], tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert path.read_text() == "X = 1\n"
    assert not list(tmp_path.glob(".*.tmp"))
