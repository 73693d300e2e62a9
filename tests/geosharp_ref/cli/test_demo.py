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


def test_demo_refuses_a_population_too_small_to_rank_before_deriving(capsys, tmp_path):
    from geosharp_ref.cli import main
    out = tmp_path / "pop"
    assert main(["demo", "--population-models", "2", "--population-out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("geosharp: error: --population-models 2")
    assert "at least 3" in lines[0]
    assert "derive" not in captured.out  # refused before the derivation started
    assert not out.exists()
