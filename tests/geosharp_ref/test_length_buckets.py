"""Length buckets (geosharp_ref.forward.length_buckets, the fast path of model_loss for padded text) against the
plain batch (the readable path): the same loss and gradient in float64, for class targets and per-position
targets; every measure with ``length_buckets`` gives the plain measure's values; a model whose real positions
see the padding, and a batch without a mask, are refused; inference by length equals batched inference."""
import copy as copy_module
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call

from geosharp_ref.forward import IGNORE_INDEX, LengthBuckets, group_by_group_loss, length_buckets, model_logits, \
    model_loss, padded_extent
from geosharp_ref.sharpness import EvaluationOptions, get_measure
from geosharp_ref.studies.population.training import batched_logits, logits_by_length
from tests.cases.inputs import padded_text as _padded
from tests.cases.models import bert, gpt2, llama


def _bert64(seed=0):
    torch.manual_seed(seed)
    return bert().double().eval()


def _loss_and_grad(model, batch):
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    loss = model_loss(model, params, batch)
    return float(loss.detach()), torch.autograd.grad(loss, list(params.values()), allow_unused=True)


def _assert_same(plain, fast, tol=1e-12):
    (l1, g1), (l2, g2) = plain, fast
    assert abs(l1 - l2) <= tol * max(1.0, abs(l1))
    for a, b in zip(g1, g2):
        if a is None or b is None:  # e.g. position embeddings beyond every row: no gradient either way
            assert a is None or b is None or float(a.abs().max()) == 0 or float(b.abs().max()) == 0
            continue
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 7), length=st.integers(2, 12), k=st.integers(1, 9), seed=st.integers(0, 2 ** 16))
def test_bucketed_loss_and_gradient_equal_the_plain_batch(n, length, k, seed):
    gen = torch.Generator().manual_seed(seed)
    model = _bert64()
    batch = (_padded(gen, n, length), torch.randint(0, 3, (n,), generator=gen))
    buckets = length_buckets(batch, k)
    # the groups partition the rows, each cut to its longest row, weights the share of the targets
    rows = torch.cat(buckets.rows)
    assert sorted(rows.tolist()) == list(range(n)) and len(buckets.groups) == min(k, n)
    extent = padded_extent(batch[0])
    for r, (x, y) in zip(buckets.rows, buckets.groups):
        assert x["input_ids"].shape == (r.numel(), int(extent[r].max()))
        assert torch.equal(x["input_ids"], batch[0]["input_ids"][r, :int(extent[r].max())])
        assert torch.equal(y, batch[1][r])
    assert abs(sum(buckets.weights) - 1) < 1e-12
    assert buckets.tokens <= n * length
    _assert_same(_loss_and_grad(model, batch), _loss_and_grad(model, buckets))


def test_per_position_targets_are_weighted_by_the_counted_ones():
    """A causal LM (per-position targets, −100 on the padding): each group's weight is its share of the
    scored positions, so the bucketed loss is the plain mean over all of them."""
    torch.manual_seed(0)
    model = llama().double().eval()
    gen = torch.Generator().manual_seed(3)
    x = _padded(gen, 6, 10, lo=2, vocab=model.config.vocab_size)
    x.pop("token_type_ids")
    targets = torch.where(x["attention_mask"].bool(), torch.randint(0, model.config.vocab_size, (6, 10),
                                                                    generator=gen), IGNORE_INDEX)
    batch = (x, targets)
    buckets = length_buckets(batch, 3)
    counted = [int((y != IGNORE_INDEX).sum()) for _, y in buckets.groups]
    assert buckets.weights == tuple(c / sum(counted) for c in counted)
    _assert_same(_loss_and_grad(model, batch), _loss_and_grad(model, buckets))


@pytest.mark.parametrize("measure, options", [
    ("adaptive", dict(n_iter=4)), ("geodesic-mix", dict(n_iter=4)), ("geodesic-inv-frobenius", dict(n_iter=3)),
    ("geodesic-inv-linearised", {}), ("average-geodesic-mix", dict(n_samples=3)),
    ("hessian-trace-inv", dict(probes=2))])
def test_every_measure_with_length_buckets_equals_the_plain_one(measure, options):
    gen = torch.Generator().manual_seed(1)
    model = _bert64()
    batches = [(_padded(gen, 6, 12, lo=2), torch.randint(0, 3, (6,), generator=gen)) for _ in range(2)]
    m = get_measure(measure)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = m.evaluate(model, batches, 0.05, **options)
        fast = m.evaluate(model, batches, 0.05, length_buckets=3, **options)
    for a, b in zip(plain.per_batch, fast.per_batch):
        assert abs(a - b) <= 1e-9 * max(abs(a), 1e-6), (measure, plain.per_batch, fast.per_batch)
    assert plain.loss_before == pytest.approx(fast.loss_before, rel=1e-12)
    if m.curvature is None:
        assert fast.config["length_buckets"] == 3 and "length_buckets" not in plain.config


class _MeanPooled(nn.Module):
    """A classifier that averages every position, padding included: its real outputs see the padding."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask):
        return self.head(self.embed(input_ids).mean(dim=1))


def test_a_model_that_sees_the_padding_is_refused():
    gen = torch.Generator().manual_seed(0)
    x = _padded(gen, 6, 10, lo=2)
    x.pop("token_type_ids")
    batch = (x, torch.randint(0, 3, (6,), generator=gen))
    with pytest.raises(ValueError, match="length buckets change the loss of the first batch"):
        get_measure("adaptive").evaluate(_MeanPooled().double(), [batch], 0.05, n_iter=1, length_buckets=2)
    # without the buckets it is evaluated (the plain batch is the reference)
    get_measure("adaptive").evaluate(_MeanPooled().double(), [batch], 0.05, n_iter=1)


def test_batches_without_a_mask_and_bad_counts_are_refused():
    ids = torch.randint(3, 50, (4, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="need padded text"):
        get_measure("adaptive").evaluate(_bert64(), [({"input_ids": ids}, torch.tensor([0, 1, 2, 1]))], 0.05,
                                         n_iter=1, length_buckets=2)
    for k in (0, -1, True, 2.5, "4", None):  # one check, one message: the options' and the buckets' own
        if k is not None:  # None: no buckets, a valid option
            with pytest.raises(ValueError, match=r"length_buckets \(--length-buckets\) must be an integer"):
                EvaluationOptions(length_buckets=k)
        with pytest.raises(ValueError, match=r"length_buckets \(--length-buckets\) must be an integer"):
            length_buckets(({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, torch.zeros(4)), k)


def test_model_loss_of_buckets_is_the_weighted_sum_of_its_groups():
    """The dispatch itself: Σ_k w_k L_k with the groups and weights as built (not a re-derivation)."""
    gen = torch.Generator().manual_seed(5)
    model = _bert64()
    batch = (_padded(gen, 5, 9), torch.randint(0, 3, (5,), generator=gen))
    b = length_buckets(batch, 2)
    params = {n: p.detach() for n, p in model.named_parameters()}
    direct = sum(w * float(model_loss(model, params, g)) for w, g in zip(b.weights, b.groups))
    assert isinstance(b, LengthBuckets) and float(model_loss(model, params, b)) == pytest.approx(direct, rel=1e-14)


def _causal_batch(model, gen, n=6, length=10):
    x = _padded(gen, n, length, lo=2, vocab=model.config.vocab_size)
    x.pop("token_type_ids")
    targets = torch.where(x["attention_mask"].bool(), torch.randint(0, model.config.vocab_size, (n, length),
                                                                    generator=gen), IGNORE_INDEX)
    return x, targets


@pytest.mark.parametrize("case", ["bert float32", "bert float64", "gpt2 tied", "llama float64"])
def test_one_call_over_the_groups_equals_one_call_per_group_bit_for_bit(case):
    """model_loss puts the parameters in place once per bucketed batch (:class:`_GroupsLoss`); the reference
    calls the model through functional_call once per group: the same value and every gradient, bit for bit.
    GPT-2 ties its output layer to the token embedding: a perturbation of the one named parameter reaches both
    uses in either path (the loss moves, and the two paths still agree). Llama's RMSNorm and softmax would run
    in float32 inside a float64 model but for :func:`keep_float64`, which the one call must apply as well."""
    gen = torch.Generator().manual_seed(11)
    torch.manual_seed(0)
    if case.startswith("bert"):
        model = bert().eval() if case == "bert float32" else bert().double().eval()
        batch = (_padded(gen, 7, 9), torch.randint(0, 3, (7,), generator=gen))
    elif case == "llama float64":
        model = llama().double().eval()
        batch = _causal_batch(model, gen)
    else:
        model = gpt2().double().eval()
        assert model.lm_head.weight is model.transformer.wte.weight  # tied (named once by named_parameters)
        batch = _causal_batch(model, gen)
    buckets = length_buckets(batch, 3)

    def loss_and_grads(loss_of, params):
        leaves = {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}
        loss = loss_of(model, leaves, buckets)
        return loss.detach(), torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)

    params = {n: p.detach() for n, p in model.named_parameters()}
    moved = dict(params)
    if case == "gpt2 tied":
        moved["transformer.wte.weight"] = params["transformer.wte.weight"] * 1.5
    for ps in (params, moved):
        (v1, g1), (v2, g2) = loss_and_grads(model_loss, ps), loss_and_grads(group_by_group_loss, ps)
        assert torch.equal(v1, v2)
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(g1, g2))
    if case == "gpt2 tied":  # the tied output layer moved too: as in a copy whose shared weight was scaled in place
        copy = copy_module.deepcopy(model)
        with torch.no_grad():
            copy.transformer.wte.weight.mul_(1.5)
        v_moved = model_loss(model, moved, buckets)
        assert float(v_moved) != float(model_loss(model, params, buckets))
        assert torch.equal(v_moved, model_loss(copy, {n: p.detach() for n, p in copy.named_parameters()}, buckets))


def test_a_loss_of_its_own_runs_once_per_group_as_before():
    """A ``loss_fn`` other than the default may cast the logits or read the model: it runs after each group's
    call, outside keep_float64 and with the model's own parameters in place, as it always did (the one-call path
    is the default loss's alone). Here a float32 loss of a float64 model and a penalty on the module's own head:
    the values are those of the group-by-group reference, computed by hand."""
    gen = torch.Generator().manual_seed(4)
    torch.manual_seed(0)
    model = bert().double().eval()
    buckets = length_buckets((_padded(gen, 7, 9), torch.randint(0, 3, (7,), generator=gen)), 3)
    params = {n: p.detach() * 1.01 for n, p in model.named_parameters()}  # not the module's own weights

    def in_float32(logits, targets):
        return nn.functional.cross_entropy(logits.float(), targets)

    def penalised(logits, targets):
        return nn.functional.cross_entropy(logits, targets) + model.classifier.weight.square().sum()

    for loss_fn in (in_float32, penalised):
        by_hand = sum(w * loss_fn(model_logits(functional_call(model, params, args=(), kwargs=x)), y)
                      for w, (x, y) in zip(buckets.weights, buckets.groups))
        assert torch.equal(model_loss(model, params, buckets, loss_fn), by_hand)
    assert model_loss(model, params, buckets, in_float32).dtype == torch.float32


@pytest.mark.parametrize("bs", [1, 3, 64])
def test_logits_by_length_equal_batched_logits_in_order(bs):
    gen = torch.Generator().manual_seed(2)
    model = _bert64()
    x = _padded(gen, 11, 12)
    plain = torch.cat([lg for _, lg in batched_logits(model, x, 11, 4)])
    fast = logits_by_length(model, x, 11, bs)
    assert fast.shape == plain.shape and torch.allclose(fast, plain, rtol=1e-10, atol=1e-12)


def test_logits_by_length_of_images_are_the_batched_logits():
    from tests.cases.models import vit

    torch.manual_seed(0)
    model = vit().double().eval()
    x = {"pixel_values": torch.randn(5, 3, model.config.image_size, model.config.image_size, dtype=torch.float64)}
    plain = torch.cat([lg for _, lg in batched_logits(model, x, 5, 2)])
    assert torch.equal(logits_by_length(model, x, 5, 2), plain)
