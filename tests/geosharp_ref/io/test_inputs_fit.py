"""``check_inputs_fit`` refuses exactly what the model itself cannot run: the longest sequence it accepts is the
longest the model's own forward pass takes (BERT, RoBERTa with its padding offset, GPT-2), the largest token id
the last row of its embedding; a plain module without a main input name is left alone."""
import pytest
import torch

from geosharp_ref.io.data import check_inputs_fit
from tests import cases


def _runs(model, ids) -> bool:
    """Whether the model's own forward pass takes ``ids`` (the independent reference)."""
    try:
        with torch.no_grad():
            model(input_ids=ids)
        return True
    except (IndexError, RuntimeError, ValueError):
        return False


@pytest.mark.parametrize("build", [cases.bert, cases.roberta, cases.gpt2], ids=["bert", "roberta", "gpt2"])
def test_the_length_limit_is_the_model_s_own(build):
    model = build().eval()
    limit = next(L for L in range(64, 0, -1) if _runs(model, torch.full((1, L), 5)))
    assert not _runs(model, torch.full((1, limit + 1), 5))
    check_inputs_fit(model, {"input_ids": torch.full((2, limit), 5)})
    with pytest.raises(ValueError, match=f"sequences of {limit + 1} tokens, but the model's position embeddings take "
                                         f"at most {limit}"):
        check_inputs_fit(model, {"input_ids": torch.full((2, limit + 1), 5)})


def test_the_vocabulary_limit_is_the_embedding_s_rows():
    model = cases.bert().eval()
    top = model.get_input_embeddings().num_embeddings - 1
    assert _runs(model, torch.tensor([[top]])) and not _runs(model, torch.tensor([[top + 1]]))
    check_inputs_fit(model, {"input_ids": torch.tensor([[0, top]])})
    for bad in (top + 1, -1):
        with pytest.raises(ValueError, match=f"token id {bad}, outside the model's vocabulary"):
            check_inputs_fit(model, {"input_ids": torch.tensor([[0, bad]])})
    with pytest.raises(ValueError, match="token_type_ids must be integers in"):
        check_inputs_fit(model, {"input_ids": torch.tensor([[0, 1]]), "token_type_ids": torch.tensor([[0, 5]])})


def test_a_plain_module_and_images_are_left_alone():
    check_inputs_fit(cases.mlp(), torch.randn(3, 4))  # no main input name: a tensor of features, not ids
    check_inputs_fit(cases.vit(), {"pixel_values": torch.randn(2, 3, 8, 8)})
    with pytest.raises(ValueError, match="pixel_values have dtype torch.uint8"):
        check_inputs_fit(cases.vit(), {"pixel_values": torch.zeros(2, 3, 8, 8, dtype=torch.uint8)})
