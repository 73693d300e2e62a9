"""Bad input that used to do silent damage or leave files behind (docs/reference/errors.md): a table row with more
cells than the header, an output path equal to an input, parent directories a failed run created, a ``--json``
written in place, and Ctrl-C. Each refusal: exit 2, one ``geosharp: error:`` line, nothing written or left."""
import errno
import os
import signal
import subprocess
import sys

import pytest
import torch

from geosharp_ref.cli import EXIT_INTERRUPTED
from geosharp_ref.io import durable
from tests import cases


def _refused(capsys, argv, root, out, needles):
    cases.assert_cli_refused(capsys, argv, root, out, needles)


def _evaluate(saved, data, *extra):
    return ["evaluate", saved / "bert", "--data", data, "--rho", "0.05", "--metric", "mix", "--batch-size", "2",
            "--batches", "1", "--iters", "1", *extra]


def test_table_row_with_more_cells_than_the_header(tmp_path, capsys):
    (tmp_path / "model").mkdir()  # the table is read before the tokenizer: refused before any model file is read
    table = tmp_path / "t.tsv"
    table.write_text("text\tlabel\nfine row\t1\na tab\tinside\t0\n")
    out = tmp_path / "new" / "data.pt"
    _refused(capsys, ["data", tmp_path / "model", "--text", table, "--text-column", "text", "--label-column", "label",
                      "--out", out], tmp_path, out,
             ["line 3 has 3 cells but the header has 2 columns", "quote the cells that hold a tab"])
    assert not (tmp_path / "new").exists()


def test_output_path_equal_to_an_input_is_refused(saved, tmp_path, capsys):
    table = tmp_path / "t.csv"
    table.write_text("text,label\nhello,1\n")
    before = table.read_bytes()
    (tmp_path / "model").mkdir()
    _refused(capsys, ["data", tmp_path / "model", "--text", table, "--text-column", "text", "--label-column", "label",
                      "--out", table], tmp_path, tmp_path / "absent",
             ["--out", "is the input file of --text", "give another output file"])
    assert table.read_bytes() == before  # the user's CSV is untouched
    data = tmp_path / "d.pt"
    torch.save(torch.load(saved / "bert.pt"), data)
    kept = data.read_bytes()
    for command in (_evaluate(saved, data, "--json", data), ["symmetries", saved / "bert", "--data", data, "--json",
                                                              data]):
        _refused(capsys, command, tmp_path, tmp_path / "absent", ["--json", "is the input file of --data"])
        assert data.read_bytes() == kept


def test_a_failed_run_removes_the_directories_it_created(saved, tmp_path, capsys):
    bad = tmp_path / "oov.pt"  # token ids outside the model's vocabulary (50): refused after the model is loaded
    torch.save({"inputs": {"input_ids": torch.full((4, 8), 70)}, "targets": torch.zeros(4, dtype=torch.long)}, bad)
    out = tmp_path / "new" / "deeper" / "r.json"
    _refused(capsys, _evaluate(saved, bad, "--json", out), tmp_path, out, ["outside the model's vocabulary"])
    assert not (tmp_path / "new").exists()
    # a successful run keeps them, and its JSON holds what the run printed
    rc, printed, _ = cases.run_cli(capsys, _evaluate(saved, saved / "bert.pt", "--json", out))
    assert rc == 0 and out.is_file() and f"json      : {out}" in printed


def test_json_is_written_atomically(saved, tmp_path, capsys, monkeypatch):
    """A write that fails at the end (here: fsync on a full disk) leaves the previous --json file as it was and no
    temporary file beside it."""
    out = tmp_path / "r.json"
    out.write_text('{"previous": true}\n')

    class FullDisk:
        def fsync(self, fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(os, name)

    monkeypatch.setattr(durable, "os", FullDisk())
    rc, _, err = cases.run_cli(capsys, _evaluate(saved, saved / "bert.pt", "--json", out))
    lines = [line for line in err.strip().splitlines() if "sharpness:" not in line]  # not the progress bar
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("geosharp: error: ") and "No space left" in lines[0]
    assert out.read_text() == '{"previous": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_ctrl_c_inside_a_command_exits_130_with_one_line(tmp_path, capsys, monkeypatch):
    import geosharp_ref.cli.demo as demo

    def interrupted(args):
        (tmp_path / "made").mkdir()  # what the run had created before Ctrl-C is removed (it holds no file)
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "run", interrupted)
    monkeypatch.chdir(tmp_path)
    rc, printed, err = cases.run_cli(capsys, ["demo", "--population-out", tmp_path / "made"])
    lines = err.strip().splitlines()
    assert rc == EXIT_INTERRUPTED == 130 and printed == ""
    assert len(lines) == 1 and lines[0].startswith("geosharp: error: interrupted (Ctrl-C)")
    assert not (tmp_path / "made").exists()


def test_sigint_exits_130_with_one_line_and_no_traceback(tmp_path):
    """A real SIGINT, sent to a child process while its spec file runs: exit 130 and one line, not a spec error."""
    spec = tmp_path / "slow_spec.py"
    spec.write_text("import time\nprint('running', flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-m", "geosharp_ref.cli", "derive", "--spec", str(spec), "--out",
                              str(tmp_path / "gen")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=cases.subprocess_env(), cwd=tmp_path)
    try:
        assert child.stdout.readline().strip() == "running"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    lines = err.strip().splitlines()
    assert child.returncode == 130, err
    assert len(lines) == 1 and lines[0].startswith("geosharp: error: interrupted (Ctrl-C)"), err
    assert not (tmp_path / "gen").exists()


@pytest.mark.parametrize("value,needle", [("0", "positive finite"), ("2", "is above 1")])
def test_target_relative_size_out_of_range(saved, tmp_path, capsys, value, needle):
    argv = _evaluate(saved, saved / "bert.pt")
    i = argv.index("--rho")
    argv[i:i + 2] = ["--target-relative-size", value]
    _refused(capsys, argv, tmp_path, tmp_path / "absent", [needle])
