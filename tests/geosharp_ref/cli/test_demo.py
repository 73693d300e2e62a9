"""`geosharp demo`: derive, generate and verify the built-in geometries (the population study is skipped)."""
import subprocess
import sys

from tests.cases import ROOT


def test_demo_runs_and_verifies(tmp_path):
    # the demo's population study is tested in tests/geosharp_ref/studies/population/test_study.py (run_study)
    proc = subprocess.run([sys.executable, "-m", "geosharp_ref.cli", "demo", "--population-models", "0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout and "gl_inv" in proc.stdout
