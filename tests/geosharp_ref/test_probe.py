"""Checkpoints without a classification head: refused in one line, or given a seeded head fitted as a linear
probe with the backbone frozen. The probe is checked against scikit-learn's multinomial logistic regression
on the same features (an independent solver of the same convex problem)."""
import numpy as np
import pytest
import torch
import transformers

from geosharp_ref.cli import main
from geosharp_ref.io.models import has_logits_head, load_model, require_logits_head
from geosharp_ref.probe import classification_head, fit_linear_probe, head_features
from tests import cases
from tests.cases import save_bert_backbone


@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    root = tmp_path_factory.mktemp("headless")
    save_bert_backbone(root / "model")
    g = torch.Generator().manual_seed(0)
    data = {"inputs": {"input_ids": torch.randint(50, (40, 8), generator=g)},
            "targets": torch.randint(3, (40,), generator=g)}
    torch.save(data, root / "data.pt")
    return root


def test_backbone_is_recognised_and_refused(headless):
    model = load_model(headless / "model")
    assert type(model).__name__ == "BertModel" and not has_logits_head(model)
    with pytest.raises(ValueError, match="no classification head.*--num-labels K"):
        require_logits_head(model, headless / "model")


def test_probe_matches_logistic_regression_and_leaves_the_backbone(headless):
    from sklearn.linear_model import LogisticRegression

    data = torch.load(headless / "data.pt")
    model = load_model(headless / "model", num_labels=3, seed=0)
    base = transformers.BertModel.from_pretrained(str(headless / "model"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    l2 = 1e-2
    fit = fit_linear_probe(model, data["inputs"], data["targets"], 3, l2=l2)
    head = classification_head(model, 3)
    for n, p in model.named_parameters():  # only the head moved
        if not n.startswith("classifier."):
            assert torch.equal(p, before[n])
    for n, p in base.named_parameters():  # and the encoder is the checkpoint's
        assert torch.equal(dict(model.bert.named_parameters())[n], p)
    X = head_features(model, head, data["inputs"]).double().numpy()
    y = data["targets"].numpy()
    # (1/N) Σ CE + (λ/2)‖W‖²  ⇔  sklearn's C Σ CE + ½‖W‖² with C = 1/(λN); the intercept is not penalised
    ref = LogisticRegression(C=1.0 / (l2 * len(y)), tol=1e-12, max_iter=10_000).fit(X, y)
    with torch.no_grad():
        ours = torch.softmax(torch.as_tensor(X) @ head.weight.double().T + head.bias.double(), -1).numpy()
    assert np.abs(ours - ref.predict_proba(X)).max() < 1e-4
    assert fit["accuracy"] == pytest.approx(float((ours.argmax(1) == y).mean()))


def test_probe_refuses_labels_out_of_range(headless):
    data = torch.load(headless / "data.pt")
    model = load_model(headless / "model", num_labels=2)
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 2\)"):
        fit_linear_probe(model, data["inputs"], data["targets"], 2)


def test_cli_refuses_a_backbone_in_one_line(headless, capsys):
    err = cases.cli_error_line(capsys, ["evaluate", str(headless / "model"), "--data", str(headless / "data.pt"),
                                        "--rho", "0.05", "--metric", "mix"])
    assert err.startswith("geosharp: error: BertModel")


def test_cli_evaluates_a_backbone_with_a_probe(headless, tmp_path, capsys):
    import json

    out = tmp_path / "r.json"
    rc = main(["evaluate", str(headless / "model"), "--data", str(headless / "data.pt"), "--rho", "0.05",
               "--metric", "mix", "--batch-size", "8", "--batches", "2", "--iters", "2", "--num-labels", "3",
               "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["model_class"] == "BertForSequenceClassification" and d["probe"]["examples"] == 40
    assert "probe     : fresh 3-class head" in capsys.readouterr().out


def test_cli_num_labels_needs_data_for_verify(headless, capsys):
    assert "pass --data FILE" in cases.cli_error_line(capsys, ["verify", str(headless / "model"), "--num-labels", "3"])


def test_vit_backbone_gets_an_image_classification_head(tmp_path):
    """A ViTModel directory: --num-labels loads ViTForImageClassification and the probe fits its classifier
    (the [CLS] representation), reaching the accuracy of the same solve done here by hand."""
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=32, architectures=["ViTModel"])
    transformers.ViTModel(cfg).save_pretrained(tmp_path / "vit")
    assert not has_logits_head(load_model(tmp_path / "vit"))
    model = load_model(tmp_path / "vit", num_labels=3, seed=1)
    assert type(model).__name__ == "ViTForImageClassification"
    g = torch.Generator().manual_seed(2)
    x = {"pixel_values": torch.randn(30, 3, 8, 8, generator=g)}
    y = torch.randint(3, (30,), generator=g)
    fit = fit_linear_probe(model, x, y, 3)
    with torch.no_grad():
        acc = float((model(**x).logits.argmax(-1) == y).double().mean())
    assert fit["accuracy"] == pytest.approx(acc) and fit["examples"] == 30
