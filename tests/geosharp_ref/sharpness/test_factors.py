"""The generic product space (geosharp_ref.sharpness.factors) against the GL(h) fast path (PerturbationSpace):
with one gl_inv / gl_mix factor per attention pair group, the metric, the horizontal projection, the
ascent direction, the second-order geodesic and whole Auto-PGD runs agree to round-off in float64, on
every sharpness case of the shared table."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geosharp_ref.apgd import apgd
from geosharp_ref.sharpness.factors import ProductSpace, gl_pair_factors
from geosharp_ref.sharpness.loss import model_loss
from geosharp_ref.sharpness.space import PerturbationSpace
from tests import cases

NAMES = cases.SHARPNESS_NAMES
METRICS = ("inv", "mix")


def _spaces(name, metric, **kw):
    M = cases.sharpness_case(name)
    params = cases.params_of(M.model)
    fast = PerturbationSpace(params, M.smap.groups, M.smap.adaptive_masks, metric=metric, **kw)
    generic = ProductSpace(params, gl_pair_factors(M.smap.groups, metric), M.smap.adaptive_masks, **kw)
    return M, params, fast, generic


def _random(space, gen):
    return [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in space.zeros()]


def _close(a, b, rtol=1e-10):
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=rtol, atol=rtol * float(y.abs().max().clamp_min(1e-30)))


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("name", NAMES)
@given(seed=st.integers(0, 2 ** 20))
@settings(max_examples=3)
def test_vectors_metric_projection_gradient_and_geodesic_agree(name, metric, seed):
    M, params, fast, generic = _spaces(name, metric)
    gen = torch.Generator().manual_seed(seed)
    xi, eta, egrad = _random(fast, gen), _random(fast, gen), _random(fast, gen)
    assert [x.shape for x in generic.zeros()] == [x.shape for x in fast.zeros()]
    assert float(generic.inner(xi, eta)) == pytest.approx(float(fast.inner(xi, eta)), rel=1e-12)
    _close(generic.project_horizontal(xi), fast.project_horizontal(xi))
    _close(generic.ascent_direction(xi, egrad), fast.ascent_direction(xi, egrad))
    h = fast.project_horizontal(xi)
    small = [0.1 * x / max(fast.norm(h), 1e-30) for x in h]
    pf, pg = fast.perturbed_params(small), generic.perturbed_params(small)
    assert set(pf) == set(pg)
    _close([pg[k] for k in sorted(pf)], [pf[k] for k in sorted(pf)])


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("name", NAMES[:3])
def test_whole_auto_pgd_runs_agree(name, metric):
    M, params, fast, generic = _spaces(name, metric)
    batch = M.make_batch(torch.Generator().manual_seed(5))

    def loss(p):
        return model_loss(M.model, p, batch, M.loss_fn)

    rho = 0.05
    a = apgd(fast.value_and_grad(loss), fast, rho, n_iter=6)
    b = apgd(generic.value_and_grad(loss), generic, rho, n_iter=6)
    assert b.best_value == pytest.approx(a.best_value, rel=1e-8)
    assert b.values == pytest.approx(a.values, rel=1e-8)
    _close(b.best_xi, a.best_xi, rtol=1e-6)


@pytest.mark.parametrize("name", NAMES[:3])
def test_first_order_map_agrees_and_zero_moves_nothing(name):
    """geodesic_correction=False: θ + ξ in both spaces (the ablation); ξ = 0 leaves every parameter."""
    M, params, fast, generic = _spaces(name, "mix", geodesic_correction=False)
    xi = generic.project_horizontal(_random(generic, torch.Generator().manual_seed(1)))
    pf, pg = fast.perturbed_params(xi), generic.perturbed_params(xi)
    _close([pg[k] for k in sorted(pf)], [pf[k] for k in sorted(pf)], rtol=1e-14)
    assert any(not torch.equal(pg[n], params[n]) for n in params)
    zero = generic.perturbed_params(generic.zeros())
    assert all(torch.equal(zero[n], params[n]) for n in params)
