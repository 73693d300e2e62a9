"""The perturbation space (geosharp_ref.sharpness.space) against independent computations: cached
base-point factors, the gradient pairing, the cotangent (block-combination) gradient path against
autograd, the perturbed-weight gradient, Gram products carried by iterates."""
import numpy as np
import pytest
import torch

from geosharp_ref.apgd import apgd, lincomb, radial_clip, value_and_grad
from geosharp_ref.sharpness import CotangentGradient, Iterate, PerturbationSpace, geodesic_sharpness, model_loss
from geosharp_ref.symmetry import symmetry_map
from tests.cases import TinyAttention, TwoLayers


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_cached_base_point_factors_give_the_same_sharpness(metric):
    """The Auto-PGD run reuses one base-point cache per bucket (Gram inverses, Sylvester factors);
    recomputing every factor in every kernel call (cache_factors=False) gives the same run."""
    torch.manual_seed(3)
    model = TinyAttention().double()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    old = PerturbationSpace.cache_factors
    out = {}
    try:
        for cached in (False, True):
            PerturbationSpace.cache_factors = cached
            out[cached] = geodesic_sharpness(model, [batch], 0.2, metric=metric, n_iter=8, random_start=True,
                                             seed=1, keep_trajectories=True)
    finally:
        PerturbationSpace.cache_factors = old
    a, b = out[False], out[True]
    assert a.mean > 0
    assert abs(a.mean - b.mean) <= 1e-12 * max(1.0, abs(a.mean))
    assert abs(a.perturbation_norms[0] - b.perturbation_norms[0]) <= 1e-12
    np.testing.assert_allclose(a.trajectories[0], b.trajectories[0], rtol=1e-12, atol=1e-14)


def _tiny_space(metric, metric_norm=True, seed=4):
    torch.manual_seed(seed)
    model = TinyAttention().double()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    return model, batch, PerturbationSpace(params, smap.groups, smap.adaptive_masks, metric=metric,
                                           metric_norm=metric_norm)


@pytest.mark.parametrize("metric", [None, "inv", "mix"])
def test_gradient_pairing_equals_metric_inner_with_the_ascent_direction(metric):
    """⟨ξ, ∇⟩_F = g(ξ, ascent_direction(∇)) for horizontal ξ (Auto-PGD's cheap norms rely on it);
    the Frobenius ablation has no such pairing."""
    _, _, space = _tiny_space(metric)
    gen = torch.Generator().manual_seed(0)
    xi = space.project_horizontal([torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in space.zeros()])
    egrad = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in space.zeros()]
    d = space.ascent_direction(xi, egrad)
    lhs = float(space.gradient_pairing(xi, egrad))
    assert lhs == pytest.approx(float(space.inner(xi, d)), rel=1e-11)
    assert float(space.gradient_pairing(d, egrad)) == pytest.approx(float(space.inner(d, d)), rel=1e-11)
    # a vertical ξ breaks the identity, so the test can fail: the pairing is not the metric
    raw = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in space.zeros()]
    if metric is not None:
        assert float(space.gradient_pairing(raw, egrad)) != pytest.approx(float(space.inner(raw, d)), rel=1e-3)
    assert _tiny_space("mix", metric_norm=False)[2].gradient_pairing is None


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_apgd_with_gradient_pairing_follows_the_metric_norm_run(metric):
    """Auto-PGD with the pairing-based step norms (default) and with metric norms everywhere (the
    space without ``gradient_pairing``) visit the same iterates to round-off, random start included."""
    model, batch, space = _tiny_space(metric)

    class MetricNormsOnly:
        def __getattr__(self, name):
            if name == "gradient_pairing":
                return None
            return getattr(space, name)

    f_and_grad = value_and_grad(lambda xi: model_loss(model, space.perturbed_params(xi), batch))
    runs = [apgd(f_and_grad, s, 0.3, n_iter=12, random_start=True, generator=torch.Generator().manual_seed(2))
            for s in (space, MetricNormsOnly())]
    assert runs[0].best_value > runs[0].start_value
    np.testing.assert_allclose(runs[0].values, runs[1].values, rtol=1e-10, atol=1e-13)
    assert space.norm(runs[0].best_xi) == pytest.approx(space.norm(runs[1].best_xi), rel=1e-9)


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("gradient, correction", [("exact", True), ("perturbed", True), ("exact", False)])
def test_cotangent_path_equals_the_autograd_gradient_path(metric, gradient, correction):
    """space.value_and_grad (cotangents ū = ∂L/∂E, the ascent step on block combinations) gives the
    value, the ascent direction d, ‖d‖² and ⟨ξ, ∇F⟩_F of the autograd path (∂F/∂ξ through
    perturbed_params, itself checked against autograd through E's formula, then 𝔾⁻¹ and the
    projection on tensors, the pairings element-wise), float64;
    Auto-PGD on the two visits the same iterates, random start included."""
    model, batch, base = _tiny_space(metric)
    smap = symmetry_map(model)
    space = PerturbationSpace(base.base, smap.groups, smap.adaptive_masks, metric=metric, gradient=gradient,
                              geodesic_correction=correction)
    assert space.uses_cotangents
    loss = lambda params: model_loss(model, params, batch)  # noqa: E731
    gen = torch.Generator().manual_seed(5)
    xi = space._scale_to(space.project_horizontal(
        [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in space.zeros()]), 0.4)
    f_c, g_c = space.value_and_grad(loss)(xi)
    f_a, g_a = value_and_grad(lambda x: loss(space.perturbed_params(x)))(xi)
    assert isinstance(g_c, CotangentGradient) and not isinstance(g_a, CotangentGradient)
    assert f_c == pytest.approx(f_a, rel=1e-13)
    if gradient == "exact" and correction:  # independent of the generated VJP: autograd through E's formula
        K, k = space.geometry.kernels, 2 * len(smap.groups)

        def formula(x):
            E = space._pair_map(lambda G, H, t, cache=None: K.second_order_geodesic(G, H, *t, cache=cache), x[:k])
            return loss(space._assemble(E, x[k:]))
        f_r, g_r = value_and_grad(formula)(xi)
        assert f_r == pytest.approx(f_c, rel=1e-13)
        for a, b in zip(g_r, g_a):
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13)
    d_c, dd_c, xd_c = space.ascent_step(xi, g_c)
    d_a = space.ascent_direction(xi, g_a)
    for a, b in zip(d_c, d_a):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert float(dd_c) == pytest.approx(float(space.inner(d_a, d_a)), rel=1e-10)
    assert float(xd_c) == pytest.approx(float(space.gradient_pairing(xi, g_a)), rel=1e-10)
    with pytest.raises(ValueError, match="different point"):
        space.ascent_step(space.zeros(), g_c)
    with pytest.raises(TypeError, match="ascent_step"):
        space.gradient_pairing(xi, g_c)

    runs = [apgd(f, space, 0.5, n_iter=8, random_start=True, generator=torch.Generator().manual_seed(3))
            for f in (space.value_and_grad(loss), value_and_grad(lambda x: loss(space.perturbed_params(x))))]
    assert runs[0].best_value > runs[0].start_value
    np.testing.assert_allclose(runs[0].values, runs[1].values, rtol=1e-10, atol=1e-13)


def test_cotangent_ascent_reuses_the_forward_grams():
    """Gram products per pair (mix): the forward E(ξ) computes Gᵀξ_G, Hᵀξ_H, ξ_Gᵀξ_G, ξ_Hᵀξ_H; the
    exact ascent step adds only the VJP's four (Gᵀū_G, ū_Gᵀξ_G and the H side), the perturbed-weight
    gradient only the projection's two (Gᵀū_G, ū_HᵀH); a second step from the same gradient (an
    Auto-PGD restart) adds none."""
    model, batch, base = _tiny_space("mix")
    smap = symmetry_map(model)
    loss = lambda params: model_loss(model, params, batch)  # noqa: E731
    for gradient, after in (("exact", 8), ("perturbed", 6)):
        space = PerturbationSpace(base.base, smap.groups, smap.adaptive_masks, metric="mix", gradient=gradient)
        xi = space.random(0.3, torch.Generator().manual_seed(1))
        _, g = space.value_and_grad(loss)(xi)
        assert [t.products for t in g.tables] == [4] * len(space._buckets)
        space.ascent_step(xi, g)
        assert [t.products for t in g.tables] == [after] * len(space._buckets)
        space.ascent_step(xi, g)
        assert [t.products for t in g.tables] == [after] * len(space._buckets)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_perturbed_point_gradient_is_the_weight_gradient_at_the_perturbed_weights(metric):
    """gradient="perturbed" (paper Algorithm 1): the gradient in ξ of the pair components is ∇L with
    respect to the perturbed blocks E = θ + ξ + ½γ̈(ξ) (computed here directly, E as a leaf), the
    value is the exact one, and it differs from the exact gradient (which carries the ξ-derivative
    of the correction) by O(‖ξ‖)."""
    model, batch, exact = _tiny_space(metric)
    params = {k: v.detach() for k, v in model.named_parameters()}
    smap = symmetry_map(model)
    pert = PerturbationSpace(params, smap.groups, smap.adaptive_masks, metric=metric, gradient="perturbed")
    gen = torch.Generator().manual_seed(1)
    xi = exact._scale_to(exact.project_horizontal(
        [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in exact.zeros()]), 0.5)
    f_p, g_p = value_and_grad(lambda x: model_loss(model, pert.perturbed_params(x), batch))(xi)
    f_e, g_e = value_and_grad(lambda x: model_loss(model, exact.perturbed_params(x), batch))(xi)
    assert f_p == pytest.approx(f_e, rel=1e-14)
    E = [e.detach().requires_grad_(True) for pair in exact._pair_map(exact.geometry.exp2, xi[:2 * len(smap.groups)])
         for e in pair]
    p = dict(params)
    for i, grp in enumerate(smap.groups):
        p = grp.insert(p, E[2 * i], E[2 * i + 1])
    for n, x in zip(exact.adaptive_names, xi[2 * len(smap.groups):]):
        p[n] = p[n] + x
    ref = torch.autograd.grad(model_loss(model, p, batch), E)
    for a, b in zip(g_p[:len(E)], ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    rel = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(g_p[:len(E)], g_e[:len(E)]))
    assert 1e-6 < rel < 1.0
    with pytest.raises(ValueError, match="unknown gradient"):
        PerturbationSpace(params, smap.groups, smap.adaptive_masks, metric=metric, gradient="paper")


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("stack", [False, True])
def test_iterates_carry_their_gram_products(metric, stack):
    """Auto-PGD's next iterate Σ cᵢ ξᵢ (space.lincomb) carries Gᵀξ_G, Hᵀξ_H from its terms' tables and,
    once its norm is taken, ξ_Gᵀξ_G, ξ_Hᵀξ_H: all equal the products computed directly (float64). The
    norm equals the metric of the same vector as a plain list at one Gram product per side; the radial
    clip keeps the products (scaled); the forward pass from the iterate computes no Gram product and
    gives the value and cotangents of the plain list."""
    torch.manual_seed(6)
    model = TwoLayers().double()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    PerturbationSpace.stack_groups = stack
    try:
        space = PerturbationSpace(params, smap.groups, smap.adaptive_masks, metric=metric)
    finally:
        PerturbationSpace.stack_groups = None
    assert len(space._buckets) == (2 if stack else 4)
    fg = space.value_and_grad(lambda p: model_loss(model, p, batch))
    x = space.random(0.3, torch.Generator().manual_seed(1))
    _, g = fg(x)
    d, _, _ = space.ascent_step(x, g)
    assert isinstance(d, Iterate)
    p = space.random(0.3, torch.Generator().manual_seed(2))
    terms = [(0.7, x), (torch.tensor(0.2, dtype=torch.float64), d), (-0.25, p)]
    it, plain = space.lincomb(terms), lincomb(terms)
    assert isinstance(it, Iterate) and type(plain) is list
    for a, b in zip(it, plain):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)

    def check_grams(v, with_norm):
        for (idx, G, H, _), t in zip(space._buckets, v.tables):
            XG, XH = space._bucket_args(idx, space._split(list(v))[0])
            torch.testing.assert_close(t.blocks["xi_G"], XG, rtol=0, atol=0)
            for X, name, B in ((XG, "xi_G", G), (XH, "xi_H", H)):
                side = name[-1]
                torch.testing.assert_close(t.gram(side, name), B.mT @ X, rtol=1e-12, atol=1e-14)
                assert t.has_gram(name, name) == with_norm
                if with_norm:
                    torch.testing.assert_close(t.gram(name, name), X.mT @ X, rtol=1e-12, atol=1e-14)

    check_grams(it, with_norm=False)
    assert all(t.products == 0 for t in it.tables)
    sq = space.inner(it, it)
    assert float(sq) == pytest.approx(float(space.inner(plain, plain)), rel=1e-12)
    assert all(t.products == 2 for t in it.tables)
    check_grams(it, with_norm=True)

    for on_device in (False, True):  # the factor as a number (host) or as a 0-d tensor (accelerators)
        clipped, sq_c = radial_clip(it, sq, 0.5 * float(sq) ** 0.5, on_device=on_device)
        assert isinstance(clipped, Iterate)
        for a, b in zip(clipped, it):
            torch.testing.assert_close(a, 0.5 * b, rtol=1e-14, atol=1e-15)
        check_grams(clipped, with_norm=True)
        assert float(space.inner(clipped, clipped)) == pytest.approx(float(sq_c), rel=1e-12)

    f_i, g_i = fg(clipped)
    f_p, g_p = fg(list(clipped))
    assert [t.products for t in g_i.tables] == [0] * len(space._buckets)
    assert [t.products for t in g_p.tables] == [4] * len(space._buckets)
    assert f_i == pytest.approx(f_p, rel=1e-14)
    for a, b in zip(g_i, g_p):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_carried_grams_stay_exact_over_a_float32_run(metric):
    """Gᵀξ of an iterate is propagated from step to step (Σ cᵢ Gᵀξᵢ), never recomputed: after a
    40-iteration float32 Auto-PGD run the best iterate's carried Gᵀξ_G, Hᵀξ_H still equal the direct
    products (float64) to float32 round-off (no drift; the recursion's largest root is 1)."""
    torch.manual_seed(0)
    model = TwoLayers(d=32, heads=4).float()
    batch = (torch.randn(8, 6, 32), torch.randint(0, 3, (8,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    space = PerturbationSpace(params, smap.groups, smap.adaptive_masks, metric=metric)
    res = apgd(space.value_and_grad(lambda p: model_loss(model, p, batch)), space, 0.5, n_iter=40,
               random_start=True, generator=torch.Generator().manual_seed(1))
    assert isinstance(res.best_xi, Iterate) and res.best_value > res.start_value
    for (_, G, H, _), t in zip(space._buckets, res.best_xi.tables):
        for side, B in (("G", G), ("H", H)):
            direct = B.double().mT @ t.blocks["xi_" + side].double()
            carried = t.gram(side, "xi_" + side).double()
            assert float((carried - direct).norm() / direct.norm()) < 1e-5
