"""The bad-input table of docs/reference/errors.md, one test per row: each bad input gives exactly one line
``geosharp: error: …`` on stderr, exit code 2, and writes nothing (population rows:
tests/geosharp_ref/studies/population/test_bad_input.py)."""
import json

import pytest
import torch
from transformers.models.bert import modeling_bert

from geosharp_ref.cli import main
from tests import cases


def _run(capsys, argv, out=None):
    """Run the CLI; return its stderr's one error line (:func:`~tests.cases.cli_error_line`: the format, exit code
    2), asserting that ``out`` was not written."""
    line = cases.cli_error_line(capsys, argv)
    if out is not None:
        assert not out.exists()
    return line


def _evaluate(saved, data, *extra, model="bert"):
    return ["evaluate", saved / model, "--data", data, "--rho", "0.05", "--metric", "mix", "--batch-size", "2",
            "--iters", "1", *extra]


def _data(tmp_path, name, inputs, targets):
    path = tmp_path / name
    torch.save({"inputs": inputs, "targets": targets}, path)
    return path


def _ids(n=4, t=8, seed=0):
    return torch.randint(3, 50, (n, t), generator=torch.Generator().manual_seed(seed))


def test_labels_out_of_range(saved, tmp_path, capsys):
    data = _data(tmp_path, "d.pt", {"input_ids": _ids()}, torch.tensor([0, 1, 2, 7]))
    out = tmp_path / "r.json"
    line = _run(capsys, _evaluate(saved, data, "--json", out), out)
    assert "class indices in [0, 3)" in line and "[7]" in line


def test_labels_of_wrong_dtype(saved, tmp_path, capsys):
    data = _data(tmp_path, "d.pt", {"input_ids": _ids()}, torch.tensor([0.0, 1.0, 2.0, 1.0]))
    assert "integer class indices" in _run(capsys, _evaluate(saved, data))


def test_labels_of_wrong_shape(saved, tmp_path, capsys):
    data = _data(tmp_path, "d.pt", {"input_ids": _ids()}, torch.zeros(4, 2, dtype=torch.long))
    assert "do not match the model's logits" in _run(capsys, _evaluate(saved, data))


def test_padded_inputs_without_a_mask(saved, tmp_path, capsys):
    ids = _ids()
    ids[1, 4:] = 0  # BERT's [PAD] id: right-padded text, but no attention_mask
    data = _data(tmp_path, "d.pt", {"input_ids": ids}, torch.tensor([0, 1, 2, 1]))
    assert "no attention_mask" in _run(capsys, _evaluate(saved, data))
    # with the mask the same ids are accepted
    ok = _data(tmp_path, "ok.pt", {"input_ids": ids, "attention_mask": (ids != 0).long()}, torch.tensor([0, 1, 2, 1]))
    assert main([str(a) for a in _evaluate(saved, ok)]) == 0


def test_length_buckets_that_cannot_apply(saved, tmp_path, capsys):
    ids = _ids()
    plain = _data(tmp_path, "d.pt", {"input_ids": ids}, torch.tensor([0, 1, 2, 1]))
    out = tmp_path / "r.json"
    assert "length buckets need padded text" in _run(capsys, _evaluate(saved, plain, "--length-buckets", "2",
                                                                       "--json", out), out)
    assert "--length-buckets) must be an integer of at least 1 (groups of similar length per batch), got 0" in _run(
        capsys, _evaluate(saved, plain, "--length-buckets", "0", "--json", out), out)
    # padded text with its mask: evaluated in buckets, and the result records them
    ids[1, 5:] = 0
    ok = _data(tmp_path, "ok.pt", {"input_ids": ids, "attention_mask": (ids != 0).long()}, torch.tensor([0, 1, 2, 1]))
    assert main([str(a) for a in _evaluate(saved, ok, "--length-buckets", "2", "--json", out)]) == 0
    assert json.loads(out.read_text())["config"]["length_buckets"] == 2


def test_data_file_of_the_wrong_format(saved, tmp_path, capsys):
    path = tmp_path / "d.pt"
    torch.save([1, 2, 3], path)
    assert "must hold a dict with keys 'inputs' and 'targets'" in _run(capsys, _evaluate(saved, path))


def test_truncated_data_file(saved, tmp_path, capsys):
    good = (saved / "bert.pt").read_bytes()
    path = tmp_path / "cut.pt"
    path.write_bytes(good[: len(good) // 2])
    assert "could not read data file" in _run(capsys, _evaluate(saved, path))


def test_model_directory_without_weights(saved, tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_bytes((saved / "bert" / "config.json").read_bytes())
    line = _run(capsys, _evaluate(tmp_path, saved / "bert.pt", model="m"))
    assert "no PyTorch weights" in line


def test_model_directory_with_mismatched_weights(saved, tmp_path, capsys):
    model = cases.bert(initializer_range=cases.IR, attn_implementation=None)
    state = model.state_dict()
    state["classifier.weight"] = torch.zeros(5, state["classifier.weight"].shape[1])
    cases.save_bin(model, tmp_path / "m", state)
    assert "do not match the shapes config.json describes" in _run(capsys, _evaluate(tmp_path, saved / "bert.pt",
                                                                                    model="m"))


def test_nan_weights(saved, tmp_path, capsys):
    model = cases.bert(initializer_range=cases.IR, attn_implementation=None)
    with torch.no_grad():
        model.classifier.weight[0, 0] = float("inf")
    model.save_pretrained(tmp_path / "m")
    assert "contains NaN or inf" in _run(capsys, _evaluate(tmp_path, saved / "bert.pt", model="m"))


@pytest.mark.parametrize("rho,message", [("0", "positive finite"), ("-1", "positive finite"),
                                         ("nan", "positive finite"), ("inf", "positive finite"),
                                         ("1e6", "larger than 100")])
def test_bad_rho(saved, capsys, rho, message):
    argv = _evaluate(saved, saved / "bert.pt")
    argv[argv.index("--rho") + 1] = rho
    assert message in _run(capsys, argv)


def test_batch_larger_than_the_data(saved, capsys):
    argv = _evaluate(saved, saved / "bert.pt")
    argv[argv.index("--batch-size") + 1] = "11"
    assert "has only 10 examples" in _run(capsys, argv + ["--batches", "1"])


def test_unknown_metric(saved, capsys):
    argv = _evaluate(saved, saved / "bert.pt")
    argv[argv.index("--metric") + 1] = "riemann"
    assert "unknown --metric 'riemann': choose adaptive, inv or mix, or name a metric of a spec file" in _run(capsys, argv)


def test_unknown_spec_file(tmp_path, capsys):
    out = tmp_path / "gen"
    assert "does not exist" in _run(capsys, ["derive", "--spec", tmp_path / "nope.py", "--out", out], out)


def test_spec_file_that_raises(tmp_path, capsys):
    spec = tmp_path / "spec.py"
    spec.write_text("from derivations import gl_pair\nSPEC = {'x': undefined_name}\n")
    out = tmp_path / "gen"
    line = _run(capsys, ["derive", "--spec", spec, "--out", out], out)
    assert "raised NameError (line 2)" in line and "undefined_name" in line


def test_backbone_without_a_head(tmp_path, capsys):
    cases.save_bert_backbone(tmp_path / "m")
    data = _data(tmp_path, "d.pt", {"input_ids": _ids()}, torch.tensor([0, 1, 2, 1]))
    line = _run(capsys, _evaluate(tmp_path, data, model="m"))
    assert "no classification head" in line and "--num-labels K" in line


def test_version_and_one_line_usage_errors(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("geosharp ")
    assert "the following arguments are required: --data" in _run(capsys, ["evaluate", "somewhere"])


def test_model_directory_with_missing_weights(saved, tmp_path, capsys):
    model = cases.bert(initializer_range=cases.IR, attn_implementation=None)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("classifier.")}
    cases.save_bin(model, tmp_path / "m", state)
    line = _run(capsys, _evaluate(tmp_path, saved / "bert.pt", model="m"))
    assert "does not cover BertForSequenceClassification; missing 2 weights" in line


def test_attention_pairs_that_are_no_symmetry(saved, tmp_path, capsys, monkeypatch):
    """A forward the detector cannot see (a tanh on every query projection's output, put on by the attention
    module itself): the pairs read off the structure are measured, refused with the change, nothing written."""
    forward = modeling_bert.BertSelfAttention.forward

    def tanh_queries(self, *args, **kwargs):
        if not getattr(self.query, "_tanh", False):
            self.query.register_forward_hook(lambda m, i, o: torch.tanh(o))
            self.query._tanh = True
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(modeling_bert.BertSelfAttention, "forward", tanh_queries)
    data = _data(tmp_path, "d.pt", {"input_ids": _ids()}, torch.tensor([0, 1, 2, 1]))
    out = tmp_path / "r.json"
    line = _run(capsys, _evaluate(saved, data, "--json", out), out)
    assert "are not a symmetry of its forward (acting on it changed the output by" in line
    assert "--metric adaptive" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.pt"]
