"""The value and gradient at ξ = 0 from the Euclidean gradient at θ (:func:`geosharp_ref.sharpness.pipeline.at_zero`,
kept across a model's evaluations by :func:`geosharp_ref.sharpness.at_theta.gradient_at_theta`) against the
readable path, the space evaluating the model at E(0), on every sharpness and decoder case in every space; the
Euclidean gradient against ``torch.func.grad``; what a scope keeps; Auto-PGD's ``first``."""
from __future__ import annotations

import copy

import pytest
import torch

from geosharp_ref.apgd import EuclideanSpace, apgd
from geosharp_ref.forward import model_loss
from geosharp_ref.sharpness import at_theta, get_measure
from geosharp_ref.sharpness.pipeline import at_zero, build_space, prepare_inputs
from geosharp_ref.symmetry import Quotient
from tests import cases
from tests.cases.tables import sharpness_case
from tests.cases.counting import counted_bert, forwards_during

cases.quiet_transformers()

#: (case, table, metric, space options): every sharpness case in the adaptive space and both quotients, the
#: generic factors, the paper's gradient, the exact geodesic, and every decoder with every symmetry ("all")
SPACES = ([(name, "sharpness", metric, {}) for name in cases.SHARPNESS_NAMES for metric in (None, "inv", "mix")]
          + [("bert", "sharpness", "mix", dict(fast=False)), ("bert", "sharpness", "mix", dict(gradient="perturbed")),
             ("bert", "sharpness", "inv", dict(geodesic="exact"))]
          + [(name, "decoder", "mix", {}) for name in cases.DECODER_NAMES])


def _space_and_batch(name, table, metric, options):
    M = sharpness_case(name, table)
    params, batches, _, _ = prepare_inputs(M.model, [M.make_batch(torch.Generator().manual_seed(3))])
    symmetries = "all" if table == "decoder" else None
    quotient = Quotient.resolve(M.model, batches[0], metric=metric, symmetries=symmetries) if metric else None
    return M, build_space(params, quotient=quotient, **options), batches[0]


@pytest.mark.parametrize("name,table,metric,options", SPACES,
                         ids=[f"{n}-{m}-{'-'.join(map(str, o.values())) or 'fast'}" for n, _, m, o in SPACES])
def test_the_gradient_at_zero_from_the_one_at_theta_equals_the_space_evaluating_the_model(name, table, metric,
                                                                                            options):
    """F(0) and the cotangents, and the ascent step formed from them, equal those of the model evaluated in the
    space at E(0) to rounding (float64), bit for bit in the adaptive space (E(0) = θ + 0 there)."""
    M, space, batch = _space_and_batch(name, table, metric, options)
    xi = space.zeros()
    f_ref, g_ref = space.value_and_grad(lambda p: model_loss(M.model, p, batch, M.loss_fn))(xi)
    f, g = at_zero(M.model, space, batch, M.loss_fn, xi)
    assert f == pytest.approx(f_ref, rel=1e-14)
    assert len(g) == len(g_ref) and any(float(t.abs().max()) > 0 for t in g if t.numel())
    (d, dd, xd), (d_ref, dd_ref, xd_ref) = space.ascent_step(xi, g), space.ascent_step(xi, g_ref)
    for a, b in zip(list(g) + list(d), list(g_ref) + list(d_ref)):
        scale = float(b.abs().max()) if b.numel() else 0.0
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12 * scale)
    assert float(dd) == pytest.approx(float(dd_ref), rel=1e-12) and float(xd) == float(xd_ref) == 0.0
    if metric is None:
        assert f == f_ref and all(torch.equal(a, b) for a, b in zip(g, g_ref))


def test_the_euclidean_gradient_at_theta_is_torch_funcs_and_none_where_the_loss_does_not_depend():
    model, params, batches, _ = counted_bert()
    model = copy.deepcopy(model).double()
    model.register_parameter("unused", torch.nn.Parameter(torch.ones(3, dtype=torch.float64)))
    params, batches, _, _ = prepare_inputs(model, batches)
    names = list(params)
    value, grads = at_theta.gradient_at_theta(model, params, batches[0], names)
    ref = torch.func.grad(lambda p: model_loss(model, {**params, **p}, batches[0]))({n: params[n] for n in names})
    assert value == pytest.approx(float(model_loss(model, params, batches[0])), rel=1e-15)
    assert grads["unused"] is None and set(grads) == set(names)
    for n in names:
        if n != "unused":
            torch.testing.assert_close(grads[n], ref[n], rtol=1e-12, atol=1e-15)
    space = build_space(params)  # the adaptive space: "unused" is in the rest, its cotangent 0 on both paths
    f_ref, g_ref = space.value_and_grad(lambda p: model_loss(model, p, batches[0]))(space.zeros())
    f, g = at_zero(model, space, batches[0])
    assert f == f_ref and all(torch.equal(a, b) for a, b in zip(g, g_ref))


def test_a_scope_keeps_the_gradient_within_its_bytes_and_the_evaluations_never_write_it(monkeypatch):
    model, params, batches, calls = counted_bert()
    names = list(params)
    grad = lambda: at_theta.gradient_at_theta(model, params, batches[0], names)  # noqa: E731
    outside = [forwards_during(calls, grad) for _ in "ab"]
    assert [n for _, n in outside] == [1, 1]  # nothing kept outside a scope
    one = sum(t.numel() * t.element_size() for t in params.values())
    monkeypatch.setattr(at_theta, "GRADIENT_BYTES", one)  # room for one batch's gradient
    with at_theta.keeping(model):
        first, n = forwards_during(calls, grad)
        again, n_again = forwards_during(calls, grad)
        assert n == 1 and n_again == 0 and again is first
        assert first[0] == outside[0][0][0] and all(torch.equal(first[1][k], outside[0][0][1][k]) for k in names)
        for _ in "ab":  # over the bytes: the second batch's gradient is computed each time
            assert forwards_during(calls, lambda: at_theta.gradient_at_theta(model, params, batches[1], names))[1] == 1
        assert forwards_during(calls, lambda: at_theta.gradient_at_theta(model, params, batches[0], names[:3]))[1] == 1
        own = lambda logits, y: torch.nn.functional.cross_entropy(logits, y)  # noqa: E731
        for _ in "ab":  # a loss of one's own: nothing kept
            own_grad = lambda: at_theta.gradient_at_theta(model, params, batches[0], names, own)  # noqa: E731
            assert forwards_during(calls, own_grad)[1] == 1
        kept = {k: v.clone() for k, v in first[1].items()}
        for measure in ("adaptive", "geodesic-mix", "geodesic-inv-linearised"):
            get_measure(measure).evaluate(model, batches[:1], 0.05, n_iter=3, seed=0)
        assert all(torch.equal(first[1][k], kept[k]) for k in names)  # the evaluations read it, never wrote it


def test_auto_pgd_with_its_first_evaluation_given_visits_the_same_iterates():
    gen = torch.Generator().manual_seed(0)
    c = torch.randn(16, generator=gen, dtype=torch.float64)
    space, evaluations, firsts = EuclideanSpace(16), [], []

    def f_and_grad(x):
        evaluations.append(1)
        return float(-((x[0] - c) ** 2).sum() + (x[0] ** 3).sum()), [-2 * (x[0] - c) + 3 * x[0] ** 2]

    def first(x):
        firsts.append(x)
        return f_and_grad(x)
    plain = apgd(f_and_grad, space, 0.8, n_iter=12)
    n_plain = len(evaluations)
    given = apgd(f_and_grad, space, 0.8, n_iter=12, first=first)
    assert given.values == plain.values and torch.equal(given.best_xi[0], plain.best_xi[0])
    assert len(firsts) == 1 and not firsts[0][0].any()  # once, at the start 0
    assert len(evaluations) - n_plain == n_plain  # first's one evaluation and n_iter of Auto-PGD's
