"""Data files and batches (geosharp_ref.io.data): the file format and its errors, batches in order,
slicing of tensors and dicts, random batches that fit tiny models of tests/cases."""
import pytest
import torch

from geosharp_ref.io.data import load_data, random_batch, slice_examples, slice_inputs, split_batches
from geosharp_ref.sharpness import model_loss
from tests import cases


def test_load_data_round_trip_and_errors(tmp_path):
    x = {"input_ids": torch.arange(20).reshape(10, 2), "attention_mask": torch.ones(10, 2, dtype=torch.long),
         "use_cache": False}
    y = torch.arange(10) % 3
    torch.save({"inputs": x, "targets": y}, tmp_path / "d.pt")
    inputs, targets, n = load_data(tmp_path / "d.pt")
    assert n == 10 and torch.equal(targets, y) and inputs["use_cache"] is False
    assert all(torch.equal(inputs[k], x[k]) for k in ("input_ids", "attention_mask"))
    bad = {
        "missing": None,
        "list.pt": [torch.zeros(3)],
        "keys.pt": {"x": torch.zeros(3)},
        "scalar.pt": {"inputs": torch.zeros(3), "targets": torch.tensor(1)},
        "nodict.pt": {"inputs": {"flag": True}, "targets": torch.zeros(3)},
        "string.pt": {"inputs": "abc", "targets": torch.zeros(3)},
        "length.pt": {"inputs": {"pixel_values": torch.zeros(4, 2)}, "targets": torch.zeros(3)},
    }
    messages = {"missing": "does not exist", "list.pt": "'inputs' and 'targets'", "keys.pt": r"got \['x'\]",
                "scalar.pt": "examples on dim 0", "nodict.pt": "dict without tensors",
                "string.pt": "a tensor or a dict of tensors, got str",
                "length.pt": "'pixel_values' has shape \\(4, 2\\) but targets have 3 examples"}
    for name, obj in bad.items():
        if obj is not None:
            torch.save(obj, tmp_path / name)
        with pytest.raises(FileNotFoundError if obj is None else ValueError, match=messages[name]):
            load_data(tmp_path / name)
    (tmp_path / "garbage.pt").write_bytes(b"not a file torch wrote")
    with pytest.raises(ValueError, match="could not read data file"):
        load_data(tmp_path / "garbage.pt")


def test_split_batches_in_order_and_too_few_examples():
    x = {"pixel_values": torch.arange(7.0)[:, None].expand(7, 3), "flag": "kept"}
    y = torch.arange(7)
    batches = split_batches(x, y, 3, 2)
    assert len(batches) == 3
    for i, (xb, yb) in enumerate(batches):
        assert torch.equal(yb, torch.arange(2 * i, 2 * i + 2)) and xb["flag"] == "kept"
        assert torch.equal(xb["pixel_values"][:, 0], yb.double().float())
    t = torch.arange(12).reshape(6, 2)
    assert torch.equal(split_batches(t, y[:6], 1, 4)[0][0], t[:4])
    with pytest.raises(ValueError, match=r"only 7 examples; 2 batches × 4 = 8 needed"):
        split_batches(x, y, 2, 4, "data file 'd.pt'")
    assert torch.equal(slice_examples(t, 1, 3), t[1:3])
    idx = torch.tensor([4, 0])
    assert torch.equal(slice_inputs({"a": t}, idx)["a"], t[idx])


@pytest.mark.parametrize("name", ["bert", "vit", "gpt2"])
def test_random_batch_fits_the_model(name):
    torch.manual_seed(0)
    model = getattr(cases, name)().eval()
    inputs, targets = random_batch(model, batch_size=3, seq_len=6, seed=4)
    again = random_batch(model, batch_size=3, seq_len=6, seed=4)
    assert torch.equal(targets, again[1]) and all(torch.equal(v, again[0][k]) for k, v in inputs.items())
    key = "pixel_values" if name == "vit" else "input_ids"
    assert list(inputs) == [key] and inputs[key].shape[0] == 3
    if name == "vit":
        assert inputs[key].shape == (3, 3, 8, 8)
    else:
        assert inputs[key].shape == (3, 6) and int(inputs[key].max()) < model.config.vocab_size
    # per-token targets for a language model, one per example for a classifier
    assert targets.shape == ((3, 6) if name == "gpt2" else (3,))
    loss = model_loss(model, dict(model.named_parameters()), (inputs, targets))
    assert torch.isfinite(loss)
    model.main_input_name = "input_features"  # e.g. a speech model: no random batch, the user passes --data
    with pytest.raises(ValueError, match="main input is 'input_features'"):
        random_batch(model)
