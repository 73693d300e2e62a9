"""What an evaluation computes at θ alone, kept across evaluations inside a scope
(:mod:`geosharp_ref.sharpness.at_theta`): the kept buckets, check and losses against a fresh computation (bit for
bit), no forward pass where kept, and nothing kept outside the scope or once the parameters, buffers, batch,
loss or mode differ."""
from __future__ import annotations

import contextlib
import gc
import weakref

import torch
import torch.nn.functional as F

from geosharp_ref.forward import length_buckets, model_loss
from geosharp_ref.sharpness import at_theta, get_measure
from geosharp_ref.sharpness.pipeline import bucket_batches, prepare_inputs
from tests.cases.counting import counted_bert, forwards_during
from tests.cases.inputs import padded_text


def _fresh_losses(model, params, batches):
    with torch.no_grad():
        return [float(model_loss(model, params, b)) for b in batches]


def _check_calls(batch, k=3):
    """Model calls of the buckets' check: the plain batch, then each of its k groups."""
    return 1 + len(length_buckets(batch, k).groups)


def test_kept_losses_and_buckets_equal_a_fresh_computation_without_a_forward_pass():
    model, params, batches, calls = counted_bert()
    with at_theta.keeping(model):
        bucketed = bucket_batches(model, params, batches, 3)
        assert at_theta.is_checked(model, params, batches[0], 3)
        first = at_theta.losses_at_theta(model, params, bucketed)
        again_params, again_batches, _, _ = prepare_inputs(model, batches)  # new dicts and detached aliases, as a
        again = bucket_batches(model, again_params, again_batches, 3)       # new evaluation makes them
        assert all(a is b for a, b in zip(again, bucketed))  # the same buckets
        kept, n = forwards_during(calls, lambda: at_theta.losses_at_theta(model, again_params, again))
        assert kept == first and n == 0  # kept: no forward
    assert first == _fresh_losses(model, params, [length_buckets(b, 3) for b in batches])  # bit for bit
    assert model not in at_theta._MEMOS  # dropped with the scope
    n = forwards_during(calls, lambda: bucket_batches(model, params, batches, 3))[1]
    assert n == _check_calls(batches[0])  # checked again outside


def test_nothing_is_kept_outside_a_scope():
    model, params, batches, calls = counted_bert()
    for _ in range(2):
        assert forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, batches))[1] == len(batches)
        assert not at_theta.is_checked(model, params, batches[0], 3)


def test_nothing_kept_is_used_once_the_parameters_buffers_or_batch_change():
    model, params, batches, calls = counted_bert()
    with at_theta.keeping(model):
        bucketed = bucket_batches(model, params, batches, 3)
        before = at_theta.losses_at_theta(model, params, bucketed)
        with torch.no_grad():
            model.classifier.weight.mul_(1.5)  # in place: the parameters' version moves
        assert not at_theta.is_checked(model, params, batches[0], 3)
        moved = at_theta.losses_at_theta(model, params, bucket_batches(model, params, batches, 3))
        assert moved != before and moved == _fresh_losses(model, params, [length_buckets(b, 3) for b in batches])
        kept = at_theta.losses_at_theta(model, params, batches[1:])
        model.bert.embeddings.token_type_ids.fill_(0)  # a buffer written in place (its values unchanged)
        assert forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, batches[1:]))[1] == 1
        copies = [({k: v.clone() for k, v in x.items()}, y.clone()) for x, y in batches]  # equal values, new tensors
        assert forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, copies))[1] == len(copies)
        ids = batches[1][0]["input_ids"]
        ids[0, 0] = 7 if int(ids[0, 0]) != 7 else 8  # the same tensor modified in place
        changed, n = forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, batches[1:]))
        assert n == 1 and changed != kept and changed == _fresh_losses(model, params, batches[1:])


def test_nothing_is_kept_for_a_loss_of_ones_own_in_training_mode_or_for_inference_tensors():
    model, params, batches, calls = counted_bert()

    def own_loss(logits, targets):
        return F.cross_entropy(logits, targets)
    with at_theta.keeping(model):
        for _ in range(2):
            assert forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, batches, own_loss))[1] == 2
        with torch.inference_mode():  # no version counter: nothing kept, and no error
            frozen = [({k: v.clone() for k, v in x.items()}, y.clone()) for x, y in batches]
        for _ in range(2):
            n = forwards_during(calls, lambda: bucket_batches(model, params, frozen, 3))[1]
            assert n == _check_calls(frozen[0]) and not at_theta.is_checked(model, params, frozen[0], 3)
        model.train()
        for _ in range(2):
            assert forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, batches))[1] == 2


def test_a_second_evaluation_in_the_scope_gives_the_record_of_one_outside_it_with_fewer_forwards():
    model, _, batches, calls = counted_bert()
    m = get_measure("adaptive")

    def run():
        r = m.evaluate(model, batches, 0.05, n_iter=3, seed=0, length_buckets=3)
        return r.per_batch, r.loss_before, r.loss_after
    outside, n_outside = forwards_during(calls, run)
    with at_theta.keeping(model):
        first, n_first = forwards_during(calls, run)
        second, n_second = forwards_during(calls, run)
    assert outside == first == second
    groups = sum(len(length_buckets(b, 3).groups) for b in batches)  # one forward of every batch's buckets
    at_theta_calls = _check_calls(batches[0]) + 2 * groups  # the check, the losses and the gradients at θ
    assert n_outside == n_first and n_second == n_first - at_theta_calls


def test_the_memo_keeps_neither_the_model_nor_a_batch_alive():
    model, params, batches, calls = counted_bert()
    with at_theta.keeping(model):
        bucketed = bucket_batches(model, params, batches, 3)
        at_theta.losses_at_theta(model, params, bucketed + batches)
        refs = [weakref.ref(t) for x, y in batches for t in [*x.values(), y]]
        memo = at_theta._MEMOS[model]
        assert len(memo.entries) == 2 + 1 + 2 + 2  # buckets, check, losses of the buckets and of the plain batches
        del batches, bucketed
        gc.collect()
        assert all(r() is None for r in refs)
        gen = torch.Generator().manual_seed(9)
        other = [(padded_text(gen, 4, 9), torch.randint(0, 3, (4,), generator=gen))]
        assert forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, other))[1] == 1
        assert len(memo.entries) == 1  # the dead batches' entries dropped as this one was added
    assert model not in at_theta._MEMOS
    ref = weakref.ref(model)
    del model, memo, params
    gc.collect()
    assert ref() is None  # nothing the scope kept still refers to the model


def test_a_batch_with_an_input_that_is_neither_a_tensor_nor_plain_keeps_nothing():
    """A nested input (a dict inside the inputs) is not part of the key, so nothing may be kept for it: a kept loss
    would survive a change of the nested value."""
    model, params, batches, calls = counted_bert()
    x, y = batches[0]
    nested = ({**x, "extra": {"scale": torch.tensor(1.5)}}, y)
    plain = ({**x, "return_dict": True}, y)  # a plain value is part of the key
    with at_theta.keeping(model):
        for _ in range(2):
            assert forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, [nested]))[1] == 1
        assert forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, [plain]))[1] == 1
        assert forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, [plain]))[1] == 0
        other = ({**x, "return_dict": 1}, y)  # equal as a number, another type: another key
        assert forwards_during(calls, lambda: at_theta.losses_at_theta(model, params, [other]))[1] == 1


def test_evaluate_model_keeps_within_one_model_and_gives_the_record_of_units_evaluated_apart(monkeypatch):
    """The population's evaluate_model opens the scope: its record equals the one with no scope (each unit
    computing everything again) with fewer forward passes."""
    from geosharp_ref.studies.population import evaluation
    model, _, batches, calls = counted_bert()
    measures = ["adaptive", "adaptive-linearised", "geodesic-inv"]

    def run():
        return evaluation.evaluate_model(model, batches, [0.05, 0.1], measures=measures, n_iter=2, seed=0,
                                         length_buckets=3)
    kept, n_kept = forwards_during(calls, run)
    monkeypatch.setattr(at_theta, "keeping", lambda model: contextlib.nullcontext())
    apart, n_apart = forwards_during(calls, run)
    assert kept == apart and n_kept < n_apart
    assert model not in at_theta._MEMOS
