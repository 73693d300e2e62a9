"""Errors torch, transformers and peft raise over many lines (docs/reference/errors.md): the refusal is still one
``geosharp: error:`` line, with the library's first line as the reason and our advice after it, never the
library's own multi-line help (``pip install …``, "You can safely remove it …", every mismatched weight)."""
import json
import shutil

import pytest
import torch

from geosharp_ref.io.data import library_reason
from tests import cases


def _refused(capsys, argv, root, needles, absent=()):
    out = root / "r.json"
    err = cases.assert_cli_refused(capsys, [*argv, "--json", out], root, out, needles)
    for text in absent:  # assert_cli_refused has checked the one line and its needles; here what must not be in it
        assert text not in err, err


def _evaluate(model_dir, data):
    return ["evaluate", model_dir, "--data", data, "--rho", "0.05", "--metric", "mix", "--batch-size", "2"]


class Foreign:
    """A class a data file must not hold (torch's weights-only loader refuses it, in a multi-line message)."""


def test_a_data_file_holding_a_foreign_object(saved, tmp_path, capsys):
    data = tmp_path / "foreign.pt"
    torch.save({"inputs": torch.zeros(2, 3), "targets": torch.zeros(2, dtype=torch.long), "x": Foreign()}, data)
    _refused(capsys, _evaluate(saved / "bert", data), tmp_path,
             ["could not read data file", "UnpicklingError: Weights only load failed", "expected a file of tensors"],
             absent=["\x1b[", "WeightsUnpickler error"])


def test_a_data_file_that_is_a_state_dict_names_four_keys(saved, tmp_path, capsys):
    data = tmp_path / "weights.pt"
    torch.save(cases.bert(initializer_range=cases.IR, attn_implementation=None).state_dict(), data)
    _refused(capsys, _evaluate(saved / "bert", data), tmp_path, ["must hold a dict with keys 'inputs' and 'targets'",
                                                                 "more keys"])


def test_an_unknown_model_type(saved, tmp_path, capsys):
    model_dir = tmp_path / "m"
    shutil.copytree(saved / "bert", model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["model_type"] = "not-a-model-type"
    (model_dir / "config.json").write_text(json.dumps(cfg))
    _refused(capsys, _evaluate(model_dir, saved / "bert.pt"), tmp_path,
             ["could not load a model from", "not-a-model-type", "check config.json (model_type, architectures)"],
             absent=["pip install"])


def test_a_peft_adapter_trained_on_another_base(saved, tmp_path, capsys):
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    small = cases.bert(initializer_range=cases.IR, attn_implementation=None)  # hidden size 16
    adapter = tmp_path / "adapter"
    peft.get_peft_model(small, peft.LoraConfig(r=2, target_modules=["query", "value"])).save_pretrained(adapter)
    wider = cases.bert(initializer_range=cases.IR, attn_implementation=None, hidden_size=32, intermediate_size=64)
    wider.save_pretrained(tmp_path / "wider")
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "wider")
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    _refused(capsys, _evaluate(adapter, saved / "bert.pt"), tmp_path,
             ["could not load the peft adapter", "was the adapter trained on another base model?",
              "base_model_name_or_path"], absent=["size mismatch", "lora_B"])


def test_library_reason_is_the_first_line_without_colour_codes():
    exc = RuntimeError("Error(s) in loading state_dict for X:\n\tsize mismatch for a.weight: copying …\n\tmore")
    assert library_reason(exc) == "RuntimeError: Error(s) in loading state_dict for X"
    assert library_reason(ValueError("\x1b[1mbold\x1b[0m advice " + "x" * 400)).endswith("…")
    assert "\x1b" not in library_reason(ValueError("\x1b[1mbold\x1b[0m"))
