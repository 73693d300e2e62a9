"""Inputs checked against the model before anything is computed (docs/reference/errors.md): token ids outside the
vocabulary, ids that are not integers, sequences longer than the position embeddings, in every command that reads
a data file; and images given to a model without attention, which ``verify`` and ``symmetries`` now cast to the
dtype of their float64 copy."""
import pytest
import torch

from geosharp_ref.forward import call_model, float64_inputs, model_logits
from tests import cases

BAD_INPUTS = {  # the tiny BERT of conftest.saved: vocabulary 50, 32 positions
    "ids outside the vocabulary": (torch.randint(50, 99, (4, 8)), ["token id", "outside the model's vocabulary "
                                                                   "[0, 50)", "geosharp data"]),
    "ids that are not integers": (torch.rand(4, 8) * 40, ["input_ids have dtype torch.float32", ".long()"]),
    "sequences longer than the positions": (torch.randint(50, (4, 40)), ["sequences of 40 tokens",
                                                                          "take at most 32", "--max-length 32"]),
}


def _commands(saved, data, out):
    return {"evaluate": ["evaluate", saved / "bert", "--data", data, "--rho", "0.05", "--metric", "mix",
                         "--batch-size", "2", "--iters", "1", "--json", out],
            "verify": ["verify", saved / "bert", "--data", data],
            "symmetries": ["symmetries", saved / "bert", "--data", data, "--json", out]}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_inputs_the_model_cannot_take_are_refused_before_compute(saved, tmp_path, capsys, case):
    ids, needles = BAD_INPUTS[case]
    data = tmp_path / "d.pt"
    torch.save({"inputs": {"input_ids": ids}, "targets": torch.zeros(ids.shape[0], dtype=torch.long)}, data)
    out = tmp_path / "out" / "r.json"
    for name, argv in _commands(saved, data, out).items():
        cases.assert_cli_refused(capsys, argv, tmp_path, out, needles)


def test_the_same_ids_in_range_are_accepted(saved, tmp_path, capsys):
    """The control: ids inside the vocabulary and 8 ≤ 32 positions run (the refusals above are the inputs')."""
    data = tmp_path / "d.pt"
    torch.save({"inputs": {"input_ids": torch.randint(50, (4, 8))}, "targets": torch.zeros(4, dtype=torch.long)}, data)
    rc, printed, _ = cases.run_cli(capsys, ["symmetries", saved / "bert", "--data", data])
    assert rc == 0 and "symmetries of BertForSequenceClassification" in printed


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """A tiny ResNet image classifier (no attention) and 4 float32 images."""
    tf = cases.quiet_transformers()
    root = tmp_path_factory.mktemp("resnet")
    torch.manual_seed(0)
    model = tf.ResNetForImageClassification(tf.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 8],
                                                            depths=[1, 1], num_labels=3, image_size=16))
    model.config.architectures = ["ResNetForImageClassification"]
    model.save_pretrained(root / "resnet")
    pixels = torch.randn(4, 3, 16, 16)
    torch.save({"inputs": {"pixel_values": pixels}, "targets": torch.tensor([0, 1, 2, 1])}, root / "img.pt")
    return root, model.eval(), pixels


def test_images_reach_the_float64_copy_of_a_model_without_attention(resnet, capsys):
    root, model, pixels = resnet
    rc, printed, err = cases.run_cli(capsys, ["verify", root / "resnet", "--data", root / "img.pt"])
    assert rc == 0 and "PASS" in printed, err
    rc, printed, err = cases.run_cli(capsys, ["symmetries", root / "resnet", "--data", root / "img.pt"])
    assert rc == 0 and "symmetries of ResNetForImageClassification" in printed, err
    # what the commands now compute on: the float64 copy on the cast images, equal to the float32 model to its
    # precision (an independent forward pass in float32)
    import copy

    m64 = copy.deepcopy(model).double()
    with torch.no_grad():
        ref = model_logits(call_model(model, dict(model.named_parameters()), {"pixel_values": pixels}))
        got = model_logits(call_model(m64, dict(m64.named_parameters()), float64_inputs({"pixel_values": pixels})))
    assert got.dtype == torch.float64 and torch.allclose(got.float(), ref, atol=1e-5, rtol=1e-4)
