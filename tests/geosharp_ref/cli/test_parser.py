"""The one argparse tree: every command has its module, the choices it spells out stay in step with the
library (population tasks, measure names), and building it (help) imports no torch."""
import importlib
import subprocess
import sys

import pytest

from geosharp_ref.cli import main
from geosharp_ref.cli.parser import COMMANDS, MEASURE_NAMES, POPULATION_TASKS, build_parser
from geosharp_ref.sharpness import ABLATION_MEASURES, HEADLINE_MEASURES, MEASURES
from geosharp_ref.studies.population import TASKS
from tests.cases import ROOT


def test_choices_in_step_with_the_library():
    assert POPULATION_TASKS == TASKS
    assert set(MEASURE_NAMES) <= set(MEASURES)  # every name the CLI offers is a measure
    assert [m.name for m in HEADLINE_MEASURES + ABLATION_MEASURES] == list(MEASURE_NAMES[:7])


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_a_module_with_run_and_help(command, capsys):
    assert callable(importlib.import_module(f"geosharp_ref.cli.{COMMANDS[command]}").run)
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert f"geosharp {command}" in capsys.readouterr().out


def test_argument_errors_exit_2_and_help_imports_no_torch():
    parser = build_parser()
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["nope"])
    assert exc.value.code == 2
    code = ("import sys\nimport geosharp_ref.cli\n"
            "try:\n    geosharp_ref.cli.main(['evaluate', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "heavy = [m for m in ('torch', 'transformers', 'sympy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
