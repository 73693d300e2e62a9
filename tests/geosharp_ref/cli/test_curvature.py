"""`geosharp curvature` on the tiny saved BERT (no network): the printed and JSON numbers equal the library's
(geosharp_ref.sharpness.curvature.curvature on the same model, batches and seed); bad input exits 2 with one
line and writes nothing."""
import json

import pytest
import torch
import transformers

from geosharp_ref.cli import main
from geosharp_ref.sharpness.curvature import curvature
from tests.cases.files import assert_cli_refused


def test_curvature_matches_the_library(saved, tmp_path, capsys):
    out = tmp_path / "nested" / "curv.json"
    argv = ["curvature", str(saved / "bert"), "--data", str(saved / "bert.pt"), "--metric", "inv",
            "--batches", "2", "--batch-size", "3", "--probes", "3", "--top-k", "2", "--lanczos-steps", "5",
            "--seed", "4", "--float64", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert set(d["results"]) == {"inv", "euclidean"} and d["batches"] == 2 and d["probes"] == 3
    m = transformers.AutoModelForSequenceClassification.from_pretrained(saved / "bert", attn_implementation="eager",
                                                                        local_files_only=True)
    data = torch.load(saved / "bert.pt", weights_only=True)
    x, y = data["inputs"]["input_ids"], data["targets"]
    batches = [({"input_ids": x[i * 3:(i + 1) * 3]}, y[i * 3:(i + 1) * 3]) for i in range(2)]
    for geometry in ("inv", "euclidean"):
        ref = curvature(m, batches, geometry, k=2, probes=3, steps=5, seed=4, dtype=torch.float64)
        got = d["results"][geometry]
        assert got["trace"] == pytest.approx(ref.trace, rel=1e-10)
        assert got["trace_stderr"] == pytest.approx(ref.trace_stderr, rel=1e-8)
        assert got["eigenvalues"] == pytest.approx(ref.eigenvalues, rel=1e-10)
        assert f"{ref.trace:.6g}" in printed and f"{ref.eigenvalues[0]:.6g}" in printed
    assert d["results"]["inv"]["dim"] == d["results"]["euclidean"]["dim"]  # the same perturbed parameters
    assert d["results"]["inv"]["trace"] != pytest.approx(d["results"]["euclidean"]["trace"], rel=1e-3)


def test_length_buckets_equal_the_plain_batches_and_the_library(saved, tmp_path, capsys):
    """Padded text with its mask in 2 length buckets: the numbers equal the library's with the same buckets and the
    plain batch's (float64, 1e-9), and the JSON records the buckets."""
    data = torch.load(saved / "bert.pt", weights_only=True)
    ids = data["inputs"]["input_ids"][:4].clone()
    ids[0, 3:], ids[2, 5:] = 0, 0
    batch = ({"input_ids": ids, "attention_mask": (ids != 0).long()}, data["targets"][:4])
    torch.save({"inputs": batch[0], "targets": batch[1]}, tmp_path / "padded.pt")
    out = tmp_path / "curv.json"
    assert main(["curvature", str(saved / "bert"), "--data", str(tmp_path / "padded.pt"), "--batch-size", "4",
                 "--probes", "3", "--top-k", "1", "--lanczos-steps", "4", "--no-euclidean", "--length-buckets", "2",
                 "--float64", "--no-progress", "--json", str(out)]) == 0
    assert "2 length buckets" in capsys.readouterr().out
    d = json.loads(out.read_text())
    m = transformers.AutoModelForSequenceClassification.from_pretrained(saved / "bert", attn_implementation="eager",
                                                                        local_files_only=True)
    kw = dict(k=1, probes=3, steps=4, dtype=torch.float64)
    bucketed, plain = (curvature(m, [batch], "mix", length_buckets=k, **kw) for k in (2, None))
    assert d["length_buckets"] == 2
    for ref in (bucketed, plain):
        assert d["results"]["mix"]["trace"] == pytest.approx(ref.trace, rel=1e-9)
        assert d["results"]["mix"]["eigenvalues"] == pytest.approx(ref.eigenvalues, rel=1e-9)


def test_hutchpp_trace_matches_the_library(saved, tmp_path, capsys):
    out = tmp_path / "curv.json"
    argv = ["curvature", str(saved / "bert"), "--data", str(saved / "bert.pt"), "--batches", "1", "--batch-size",
            "3", "--probes", "7", "--trace-method", "hutch++", "--top-k", "0", "--no-euclidean", "--seed", "2",
            "--float64", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    d = json.loads(out.read_text())
    m = transformers.AutoModelForSequenceClassification.from_pretrained(saved / "bert", attn_implementation="eager",
                                                                        local_files_only=True)
    data = torch.load(saved / "bert.pt", weights_only=True)
    batch = ({"input_ids": data["inputs"]["input_ids"][:3]}, data["targets"][:3])
    ref = curvature(m, [batch], "mix", k=0, probes=7, seed=2, dtype=torch.float64, trace_method="hutch++")
    got = d["results"]["mix"]
    assert d["trace_method"] == "hutch++" and got["config"]["trace_method"] == "hutch++" and got["matvecs"] == 7
    assert got["trace"] == pytest.approx(ref.trace, rel=1e-10)
    assert got["trace_stderr"] == pytest.approx(ref.trace_stderr, rel=1e-8)
    assert "Hutch++, 7 HVPs" in printed and f"{ref.trace:.6g}" in printed


@pytest.mark.parametrize("extra, needles", [
    (["--probes", "-1"], ["--probes", "at least 0"]),
    (["--probes", "0", "--top-k", "0"], ["nothing to compute"]),
    (["--top-k", "3", "--lanczos-steps", "2"], ["--lanczos-steps", "--top-k"]),
    (["--trace-method", "hutch++", "--probes", "2"], ["hutch++", "at least 3", "--trace-method hutchinson"]),
    (["--length-buckets", "0"], ["--length-buckets", "at least 1"]),
    (["--length-buckets", "2"], ["length buckets need padded text"]),  # bert.pt has no attention_mask
    (["--batches", "5", "--batch-size", "4"], ["only 10 examples"]),
    (["--device", "tpu"], ["--device", "not a device"]),
])
def test_bad_input_exits_2_and_writes_nothing(saved, tmp_path, capsys, extra, needles):
    out = tmp_path / "new" / "curv.json"
    argv = ["curvature", str(saved / "bert"), "--data", str(saved / "bert.pt"), "--no-progress",
            "--json", str(out)] + extra
    assert_cli_refused(capsys, argv, tmp_path, out, needles)



def test_all_symmetries_equal_the_library_with_all(saved, tmp_path, capsys):
    out = tmp_path / "all.json"
    argv = ["curvature", str(saved / "bert"), "--data", str(saved / "bert.pt"), "--batches", "1", "--batch-size", "3",
            "--probes", "2", "--top-k", "1", "--lanczos-steps", "3", "--no-euclidean", "--all-symmetries",
            "--float64", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    got = json.loads(out.read_text())["results"]["mix"]
    m = transformers.AutoModelForSequenceClassification.from_pretrained(saved / "bert", attn_implementation="eager",
                                                                        local_files_only=True)
    data = torch.load(saved / "bert.pt", weights_only=True)
    batch = ({"input_ids": data["inputs"]["input_ids"][:3]}, data["targets"][:3])
    ref = curvature(m, [batch], "mix", k=1, probes=2, steps=3, symmetries=["all"], dtype=torch.float64)
    assert got["config"]["factors"] == ref.config["factors"]
    assert got["trace"] == pytest.approx(ref.trace, rel=1e-10)
    assert got["eigenvalues"] == pytest.approx(ref.eigenvalues, rel=1e-10)
    assert f"factors   : {len(ref.config['factors'])} quotiented symmetries" in printed
