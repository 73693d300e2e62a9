"""--device (one shared option: parser.add_device_option, common.resolve_device) and the library following the
model's device. Run on the CPU: CUDA is simulated where the resolution logic needs it, and the meta device
shows that tensors are made where the model lives, not on the CPU."""
import argparse

import pytest
import torch

from geosharp_ref.cli import main
from geosharp_ref.cli.common import resolve_device
from geosharp_ref.cli.parser import build_parser
from geosharp_ref.forward import batch_to_device, call_model, model_device
from geosharp_ref.io.data import random_batch
from geosharp_ref.sharpness import ProductSpace
from tests import cases


def _ns(device):
    return argparse.Namespace(device=device)


@pytest.mark.parametrize("cuda", [False, True])
def test_default_is_cuda_when_available(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device(_ns(None)) == torch.device("cuda" if cuda else "cpu")
    assert resolve_device(_ns("cpu")) == torch.device("cpu")


def test_cuda_indices_are_checked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device(_ns("cuda:1")) == torch.device("cuda", 1)
    assert resolve_device(_ns("CUDA")) == torch.device("cuda")
    with pytest.raises(ValueError, match="has 2 CUDA devices"):
        resolve_device(_ns("cuda:2"))


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:-1", "mps", ""])
def test_bad_spellings_are_refused(bad):
    with pytest.raises(ValueError, match="is not a device"):
        resolve_device(_ns(bad))


def test_cuda_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device(_ns("cuda"))


def test_every_computing_command_has_the_option():
    parser = build_parser()
    for argv in (["evaluate", "M", "--data", "D", "--rho", "1", "--metric", "mix"], ["verify", "M"], ["symmetries", "M"],
                 ["population", "evaluate", "--out", "O"]):
        assert parser.parse_args(argv + ["--device", "cpu"]).device == "cpu"


def test_refusal_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """`--device cuda` on a machine without CUDA (simulated): exit 2, one line, before the model is read."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "r.json"
    for argv in (["evaluate", tmp_path / "missing", "--data", tmp_path / "d.pt", "--rho", "0.1", "--metric", "mix",
                  "--device", "cuda", "--json", out],
                 ["verify", tmp_path / "missing", "--device", "cuda:0"],
                 ["symmetries", tmp_path / "missing", "--device", "gpu"]):
        rc = main([str(a) for a in argv])
        printed, err = capsys.readouterr()
        assert rc == 2 and printed == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("geosharp: error: --device"), err
    assert list(tmp_path.iterdir()) == []


def test_evaluate_on_cpu_says_so(tmp_path, capsys):
    cases.save_llama_and_lm_data(tmp_path)
    rc = main(["evaluate", str(tmp_path / "llama"), "--data", str(tmp_path / "d.pt"), "--rho", "0.05", "--metric",
               "mix", "--batch-size", "4", "--iters", "1", "--device", "cpu"])
    printed, err = capsys.readouterr()
    assert rc == 0, err
    assert "device    : cpu" in printed


def test_tensors_follow_the_model_device():
    """On the meta device (no data, so any tensor silently made on the CPU would show): the random batch,
    moved batches and a functional forward all live on the model's device."""
    model = cases.llama().eval().to("meta")
    assert model_device(model) == torch.device("meta")
    inputs, targets = random_batch(model, 2, seed=0)
    assert inputs["input_ids"].device.type == "meta" and targets.device.type == "meta"
    moved = batch_to_device(({"input_ids": torch.zeros(2, 3, dtype=torch.long)}, torch.zeros(2, 3, dtype=torch.long)),
                            model_device(model))
    assert moved[0]["input_ids"].device.type == "meta" and moved[1].device.type == "meta"
    out = call_model(model, dict(model.named_parameters()), moved[0])
    assert out.logits.device.type == "meta"


def test_adaptive_masks_follow_their_parameters():
    """A symmetry that binds part of a fused parameter (Phi-3's qkv_proj, gate_up_proj) leaves a mask of the rest,
    built from shapes on the CPU; the space moves it to the parameter's device (the meta device here: a mask left
    on the CPU would not combine with it), so the masked adaptive step lives there too."""
    params = {"w": torch.empty(4, 3, device="meta"), "b": torch.empty(3, device="meta")}
    mask = torch.tensor([[True, False, True]] * 4)
    space = ProductSpace(params, (), {"w": mask, "b": None})
    assert [None if m is None else m.device.type for m in space.masks] == ["meta", None]
    moved = space._perturb_rest(params, [torch.empty(4, 3, device="meta"), torch.empty(3, device="meta")])
    assert moved["w"].device.type == "meta" and moved["b"].device.type == "meta"
