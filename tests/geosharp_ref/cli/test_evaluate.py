"""`geosharp evaluate` on tiny saved BERT / ViT models (no network): the result equals the library's, bad
input exits 2 with a message, and the evaluator never imports the symbolic engine."""
import json
import os
import subprocess
import sys

import pytest
import torch
import transformers

from geosharp_ref.cli import main
from geosharp_ref.sharpness import adaptive_sharpness, geodesic_sharpness
from tests import cases
from tests.cases import ROOT


def _batches(path, n, b):
    d = torch.load(path, weights_only=True)
    x, y = d["inputs"], d["targets"]
    sl = (lambda v, i: {k: t[i * b:(i + 1) * b] for k, t in v.items()}) if isinstance(x, dict) \
        else (lambda v, i: v[i * b:(i + 1) * b])
    return [(sl(x, i), y[i * b:(i + 1) * b]) for i in range(n)]


@pytest.mark.parametrize("model, loader, metric, extra", [
    ("bert", transformers.AutoModelForSequenceClassification, "adaptive", []),
    ("bert", transformers.AutoModelForSequenceClassification, "inv", ["--float64"]),
    ("bert", transformers.AutoModelForSequenceClassification, "mix", []),
    ("vit", transformers.AutoModelForImageClassification, "mix", ["--no-geodesic-correction"]),
])
def test_evaluate_matches_library(saved, tmp_path, capsys, model, loader, metric, extra):
    out = tmp_path / "nested" / "dir" / "result.json"
    n, b, iters = 2, 3, 4
    argv = ["evaluate", str(saved / model), "--data", str(saved / f"{model}.pt"), "--rho", "0.05",
            "--metric", metric, "--batches", str(n), "--batch-size", str(b), "--iters", str(iters),
            "--seed", "3", "--json", str(out)] + extra
    assert main(argv) == 0
    printed = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["mean"] >= 0 and len(d["per_batch"]) == n and all(v >= 0 for v in d["per_batch"])
    assert d["model_dir"] == str((saved / model).resolve()) and d["data"] == str((saved / f"{model}.pt").resolve())
    assert d["rho"] == 0.05 and d["config"]["n_iter"] == iters
    assert f"{d['mean']:.6g}" in printed and "per batch" in printed

    m = loader.from_pretrained(saved / model, attn_implementation="eager", local_files_only=True)
    batches = _batches(saved / f"{model}.pt", n, b)
    kw = dict(n_iter=iters, seed=3, dtype=torch.float64 if "--float64" in extra else None)
    if metric == "adaptive":
        ref = adaptive_sharpness(m, batches, 0.05, **kw)
        assert d["measure"] == "adaptive"
    else:
        ref = geodesic_sharpness(m, batches, 0.05, metric=metric,
                                 geodesic_correction="--no-geodesic-correction" not in extra, **kw)
        assert d["measure"] == f"geodesic-{metric}" and d["config"]["pairs"] == 4 and d["config"]["heads"] == 8
    assert d["mean"] == pytest.approx(ref.mean, rel=1e-12, abs=1e-12)
    assert d["per_batch"] == pytest.approx(ref.per_batch, rel=1e-12, abs=1e-12)
    assert d["loss_before"] == pytest.approx(ref.loss_before, rel=1e-12, abs=1e-12)


def test_errors_exit_2_with_a_message(saved, tmp_path, capsys):
    data, bert = str(saved / "bert.pt"), str(saved / "bert")
    err = cases.cli_error_line(capsys, ["evaluate", str(tmp_path / "nope"), "--data", data, "--rho", "0.1",
                                        "--metric", "mix"])
    assert "does not exist" in err and "nope" in err
    err = cases.cli_error_line(capsys, ["verify", str(tmp_path / "nope")])
    assert "does not exist" in err
    err = cases.cli_error_line(capsys, ["evaluate", bert, "--data", data, "--rho", "0.1", "--metric", "mix",
                                        "--batches", "3", "--batch-size", "4"])
    assert "only 10 examples" in err and "12 needed" in err
    for rho in ("0", "-1"):
        err = cases.cli_error_line(capsys, ["evaluate", bert, "--data", data, f"--rho={rho}", "--metric", "inv"])
        assert "rho" in err
    err = cases.cli_error_line(capsys, ["evaluate", bert, "--data", str(tmp_path / "missing.pt"), "--rho", "1",
                                        "--metric", "inv"])
    assert "missing.pt" in err
    torch.save({"x": torch.zeros(3)}, tmp_path / "wrong.pt")
    err = cases.cli_error_line(capsys, ["evaluate", bert, "--data", str(tmp_path / "wrong.pt"), "--rho", "1",
                                        "--metric", "inv"])
    assert "'inputs' and 'targets'" in err


def test_library_value_errors_exit_2(saved, tmp_path, capsys):
    # NaN in the data: raised by the sharpness library, reported by the CLI
    err = cases.cli_error_line(capsys, ["evaluate", str(saved / "vit"), "--data", str(saved / "vit_nan.pt"),
                                        "--rho", "0.1", "--metric", "adaptive", "--batches", "2", "--batch-size", "3"])
    assert "NaN" in err and "batch 0" in err
    # a rank-deficient head (query weights and bias of head 0 zeroed): refused unless eps > 0
    m = transformers.BertForSequenceClassification.from_pretrained(saved / "bert")
    q = m.bert.encoder.layer[0].attention.self.query
    with torch.no_grad():
        q.weight[:8] = 0
        q.bias[:8] = 0
    m.save_pretrained(tmp_path / "deficient")
    argv = ["evaluate", str(tmp_path / "deficient"), "--data", str(saved / "bert.pt"), "--rho", "0.1",
            "--metric", "mix", "--batches", "1", "--batch-size", "2", "--iters", "1"]
    err = cases.cli_error_line(capsys, argv)
    assert "rank deficient" in err and "eps" in err
    assert main(argv + ["--eps", "1e-6"]) == 0


def test_evaluator_does_not_import_the_engine(saved, tmp_path):
    code = (
        "import sys\n"
        "import geosharp_ref.cli, geosharp_ref.cli.evaluate, geosharp_ref.cli.verify\n"
        "assert 'sympy' not in sys.modules, 'the evaluate / verify commands imported sympy'\n"
        f"rc = geosharp_ref.cli.main(['evaluate', {str(saved / 'bert')!r}, '--data', {str(saved / 'bert.pt')!r},"
        " '--rho', '0.05', '--metric', 'mix', '--batches', '1', '--batch-size', '2', '--iters', '1'])\n"
        "assert rc == 0\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'derivations' or m in "
        "('codegen.generate', 'codegen.spec', 'codegen.builtins', 'codegen.printer')]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
