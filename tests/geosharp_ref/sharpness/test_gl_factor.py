"""The fast GL(h) pair factor (geosharp_ref.sharpness.gl_factor) against the generic factors it overrides
(one generated gl_<metric> Factor per pair group, ``fast=False``): values, gradients, ascent directions and
whole Auto-PGD runs to round-off in float64, every ablation; base-point caches and Gram products reused
(the forward's, the iterates' carried ones), buckets of stacked groups."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geosharp_ref.apgd import apgd, lincomb, radial_clip
from geosharp_ref.sharpness import (Cotangents, GLPairFactor, ProductSpace, Tangent, geodesic_sharpness,
                                    gl_pair_factors, model_loss)
from geosharp_ref.symmetry import symmetry_map
from tests import cases
from tests.cases import TinyAttention, TwoLayers

NAMES = cases.SHARPNESS_NAMES
METRICS = ("inv", "mix")
ABLATIONS = ({}, {"metric_norm": False}, {"gradient": "perturbed"}, {"geodesic_correction": False})


def _spaces(name, metric, stack=None, **kw):
    M = cases.sharpness_case(name)
    params = cases.params_of(M.model)
    fast = ProductSpace(params, [GLPairFactor(tuple(M.smap.groups), metric, stack=stack)], M.smap.adaptive_masks,
                        **kw)
    generic = ProductSpace(params, gl_pair_factors(M.smap.groups, metric), M.smap.adaptive_masks, fast=False, **kw)
    return M, params, fast, generic


def _randn(space, gen):
    return [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in space.zeros()]


def _close(a, b, rtol=1e-10):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=rtol, atol=rtol * float(y.abs().max().clamp_min(1e-30)))


def test_fast_flag_and_generic_factors():
    M, params, fast, generic = _spaces(NAMES[0], "mix")
    assert len(fast.factors) == 1 and isinstance(fast.factors[0], GLPairFactor)
    assert len(generic.factors) == len(M.smap.groups) and fast.factor_keys == generic.factor_keys
    assert fast.covered == generic.covered and fast.adaptive_names == generic.adaptive_names
    off = ProductSpace(params, gl_pair_factors(M.smap.groups, "mix"), M.smap.adaptive_masks, fast=False)
    assert [type(f) for f in off.factors] == [type(f) for f in generic.factors]


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("name", NAMES)
@given(seed=st.integers(0, 2 ** 20))
@settings(max_examples=3, deadline=None)
def test_vectors_metric_projection_gradient_and_geodesic_agree(name, metric, seed):
    M, params, fast, generic = _spaces(name, metric)
    gen = torch.Generator().manual_seed(seed)
    xi, eta, cot = _randn(fast, gen), _randn(fast, gen), _randn(fast, gen)
    assert [x.shape for x in generic.zeros()] == [x.shape for x in fast.zeros()]
    assert float(generic.inner(xi, eta)) == pytest.approx(float(fast.inner(xi, eta)), rel=1e-12)
    _close(generic.project_horizontal(xi), fast.project_horizontal(xi))
    h = fast.project_horizontal(xi)
    for (d1, dd1, xd1), (d2, dd2, xd2) in [(fast.ascent_step(h, Cotangents(cot, h)),
                                            generic.ascent_step(h, Cotangents(cot, h)))]:
        _close(d2, d1)
        assert float(dd2) == pytest.approx(float(dd1), rel=1e-10)
        assert float(xd2) == pytest.approx(float(xd1), rel=1e-10, abs=1e-14)
    small = [0.1 * x / max(fast.norm(h), 1e-30) for x in h]
    pf, pg = fast.perturbed_params(small), generic.perturbed_params(small)
    assert set(pf) == set(pg)
    _close([pg[k] for k in sorted(pf)], [pf[k] for k in sorted(pf)])
    r1, r2 = (s.random(0.3, torch.Generator().manual_seed(seed)) for s in (fast, generic))
    _close(r2, r1)


@pytest.mark.parametrize("kw", ABLATIONS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "default")
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("name", NAMES[:3])
def test_values_gradients_and_whole_auto_pgd_runs_agree(name, metric, kw):
    M, params, fast, generic = _spaces(name, metric, **kw)
    batch = M.make_batch(torch.Generator().manual_seed(5))

    def loss(p):
        return model_loss(M.model, p, batch, M.loss_fn)

    xi = fast.project(_randn(fast, torch.Generator().manual_seed(7)), 0.05)
    (f1, g1), (f2, g2) = fast.value_and_grad(loss)(xi), generic.value_and_grad(loss)(xi)
    assert f2 == pytest.approx(f1, rel=1e-12)
    _close(list(g2), list(g1), rtol=1e-9)
    (d1, dd1, xd1), (d2, dd2, xd2) = fast.ascent_step(xi, g1), generic.ascent_step(xi, g2)
    _close(d2, d1, rtol=1e-9)
    assert float(dd2) == pytest.approx(float(dd1), rel=1e-9)
    assert float(xd2) == pytest.approx(float(xd1), rel=1e-9)
    rho = 0.05
    for start in (False, True):
        a = apgd(fast.value_and_grad(loss), fast, rho, n_iter=6, random_start=start,
                 generator=torch.Generator().manual_seed(1))
        b = apgd(generic.value_and_grad(loss), generic, rho, n_iter=6, random_start=start,
                 generator=torch.Generator().manual_seed(1))
        assert b.best_value == pytest.approx(a.best_value, rel=1e-8)
        assert b.values == pytest.approx(a.values, rel=1e-8)
        _close(b.best_xi, a.best_xi, rtol=1e-6)


@pytest.mark.parametrize("name", NAMES[:3])
def test_first_order_map_agrees_and_zero_moves_nothing(name):
    """geodesic_correction=False: θ + ξ in both spaces (the ablation); ξ = 0 leaves every parameter."""
    M, params, fast, generic = _spaces(name, "mix", geodesic_correction=False)
    xi = generic.project_horizontal(_randn(generic, torch.Generator().manual_seed(1)))
    pf, pg = fast.perturbed_params(xi), generic.perturbed_params(xi)
    _close([pg[k] for k in sorted(pf)], [pf[k] for k in sorted(pf)], rtol=1e-14)
    assert any(not torch.equal(pg[n], params[n]) for n in params)
    zero = generic.perturbed_params(generic.zeros())
    assert all(torch.equal(zero[n], params[n]) for n in params)


@pytest.mark.parametrize("metric", METRICS)
def test_fast_factor_gives_the_same_sharpness_as_the_generic_factors(metric):
    """A whole Auto-PGD run (random start) with the fast factor (one base-point cache per bucket, Gram
    tables) and with the generic factors (one cache per group, tensors) gives the same sharpness."""
    torch.manual_seed(3)
    model = TinyAttention().double()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    out = {}
    for fast in (False, True):
        space = ProductSpace(params, gl_pair_factors(smap.groups, metric), smap.adaptive_masks, fast=fast)
        out[fast] = apgd(space.value_and_grad(lambda p: model_loss(model, p, batch)), space, 0.2, n_iter=8,
                         random_start=True, generator=torch.Generator().manual_seed(1))
        out[fast].norm = space.norm(out[fast].best_xi)
    a, b = out[False], out[True]
    assert a.best_value > a.start_value
    assert abs(a.best_value - b.best_value) <= 1e-12 * max(1.0, abs(a.best_value))
    assert abs(a.norm - b.norm) <= 1e-12
    np.testing.assert_allclose(a.values, b.values, rtol=1e-12, atol=1e-14)


def _tiny(metric, gradient="exact"):
    torch.manual_seed(4)
    model = TinyAttention().double()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    space = ProductSpace(params, gl_pair_factors(smap.groups, metric), smap.adaptive_masks, gradient=gradient)
    return model, batch, space


def test_cotangent_ascent_reuses_the_forward_grams():
    """Gram products per pair (mix): the forward E(ξ) computes Gᵀξ_G, Hᵀξ_H, ξ_Gᵀξ_G, ξ_Hᵀξ_H; the
    exact ascent step adds only the VJP's four (Gᵀū_G, ū_Gᵀξ_G and the H side), the perturbed-weight
    gradient only the projection's two (Gᵀū_G, ū_HᵀH); a second step from the same gradient (an
    Auto-PGD restart) adds none."""
    for gradient, after in (("exact", 8), ("perturbed", 6)):
        model, batch, space = _tiny("mix", gradient)
        loss = lambda params: model_loss(model, params, batch)  # noqa: E731
        buckets = space.bound[0]._buckets
        xi = space.random(0.3, torch.Generator().manual_seed(1))
        _, g = space.value_and_grad(loss)(xi)
        assert [t.products for t in g.states[0]] == [4] * len(buckets)
        space.ascent_step(xi, g)
        assert [t.products for t in g.states[0]] == [after] * len(buckets)
        space.ascent_step(xi, g)
        assert [t.products for t in g.states[0]] == [after] * len(buckets)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("stack", [False, True])
def test_iterates_carry_their_gram_products(metric, stack):
    """Auto-PGD's next iterate Σ cᵢ ξᵢ (space.lincomb) carries, as the factor's state, Gᵀξ_G, Hᵀξ_H from
    its terms' tables and, once its norm is taken, ξ_Gᵀξ_G, ξ_Hᵀξ_H: all equal the products computed
    directly (float64). The norm equals the metric of the same vector as a plain list at one Gram
    product per side; the radial clip keeps the products (scaled); the forward pass from the iterate
    computes no Gram product and gives the value and cotangents of the plain list."""
    torch.manual_seed(6)
    model = TwoLayers().double()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    space = ProductSpace(params, [GLPairFactor(tuple(smap.groups), metric, stack=stack)], smap.adaptive_masks)
    fa = space.bound[0]
    assert len(fa._buckets) == (2 if stack else 4)
    fg = space.value_and_grad(lambda p: model_loss(model, p, batch))
    x = space.random(0.3, torch.Generator().manual_seed(1))
    _, g = fg(x)
    d, _, _ = space.ascent_step(x, g)
    assert isinstance(d, Tangent) and d.states[0] is not None
    p = space.random(0.3, torch.Generator().manual_seed(2))
    terms = [(0.7, x), (torch.tensor(0.2, dtype=torch.float64), d), (-0.25, p)]
    it, plain = space.lincomb(terms), lincomb(terms)
    assert isinstance(it, Tangent) and type(plain) is list
    for a, b in zip(it, plain):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)

    def check_grams(v, with_norm):
        for (idx, G, H, _), t in zip(fa._buckets, v.states[0]):
            XG, XH = fa._bucket_args(idx, list(v)[:fa.size])
            torch.testing.assert_close(t.blocks["xi_G"], XG, rtol=0, atol=0)
            for X, name, B in ((XG, "xi_G", G), (XH, "xi_H", H)):
                side = name[-1]
                torch.testing.assert_close(t.gram(side, name), B.mT @ X, rtol=1e-12, atol=1e-14)
                assert t.has_gram(name, name) == with_norm
                if with_norm:
                    torch.testing.assert_close(t.gram(name, name), X.mT @ X, rtol=1e-12, atol=1e-14)

    check_grams(it, with_norm=False)
    assert all(t.products == 0 for t in it.states[0])
    sq = space.inner(it, it)
    assert float(sq) == pytest.approx(float(space.inner(plain, plain)), rel=1e-12)
    assert all(t.products == 2 for t in it.states[0])
    check_grams(it, with_norm=True)

    for on_device in (False, True):  # the factor as a number (host) or as a 0-d tensor (accelerators)
        clipped, sq_c = radial_clip(it, sq, 0.5 * float(sq) ** 0.5, on_device=on_device, scale=space.scale)
        assert isinstance(clipped, Tangent)
        for a, b in zip(clipped, it):
            torch.testing.assert_close(a, 0.5 * b, rtol=1e-14, atol=1e-15)
        check_grams(clipped, with_norm=True)
        assert float(space.inner(clipped, clipped)) == pytest.approx(float(sq_c), rel=1e-12)

    f_i, g_i = fg(clipped)
    f_p, g_p = fg(list(clipped))
    assert [t.products for t in g_i.states[0]] == [0] * len(fa._buckets)
    assert [t.products for t in g_p.states[0]] == [4] * len(fa._buckets)
    assert f_i == pytest.approx(f_p, rel=1e-14)
    for a, b in zip(g_i, g_p):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("metric", METRICS)
def test_carried_grams_stay_exact_over_a_float32_run(metric):
    """Gᵀξ of an iterate is propagated from step to step (Σ cᵢ Gᵀξᵢ), never recomputed: after a
    40-iteration float32 Auto-PGD run the best iterate's carried Gᵀξ_G, Hᵀξ_H still equal the direct
    products (float64) to float32 round-off (no drift; the recursion's largest root is 1)."""
    torch.manual_seed(0)
    model = TwoLayers(d=32, heads=4).float()
    batch = (torch.randn(8, 6, 32), torch.randint(0, 3, (8,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    space = ProductSpace(params, gl_pair_factors(smap.groups, metric), smap.adaptive_masks)
    res = apgd(space.value_and_grad(lambda p: model_loss(model, p, batch)), space, 0.5, n_iter=40,
               random_start=True, generator=torch.Generator().manual_seed(1))
    assert isinstance(res.best_xi, Tangent) and res.best_value > res.start_value
    for (_, G, H, _), t in zip(space.bound[0]._buckets, res.best_xi.states[0]):
        for side, B in (("G", G), ("H", H)):
            direct = B.double().mT @ t.blocks["xi_" + side].double()
            carried = t.gram(side, "xi_" + side).double()
            assert float((carried - direct).norm() / direct.norm()) < 1e-5


def test_stacked_buckets_match_the_per_group_path():
    """Equal-shaped groups stacked into one bucket (the accelerator default) give the run of one bucket per
    group, through the entry point's space."""
    torch.manual_seed(0)
    model = TwoLayers().double()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    for metric in METRICS:
        out = []
        for stack in (False, True):
            space = ProductSpace(params, [GLPairFactor(tuple(smap.groups), metric, stack=stack)], smap.adaptive_masks)
            r = apgd(space.value_and_grad(lambda p: model_loss(model, p, batch)), space, 0.1, n_iter=6,
                     random_start=True, generator=torch.Generator().manual_seed(0))
            out.append((r.best_value, space.norm(r.best_xi)))
        (a0, a1), (b0, b1) = out
        assert abs(a0 - b0) <= 1e-12 * max(1.0, abs(a0)) and abs(a1 - b1) <= 1e-12
    r = geodesic_sharpness(model, [batch], 0.1, metric="mix", n_iter=6, random_start=True)
    assert r.mean > 0
