"""The perturbation space (geosharp_ref.sharpness.space: ProductSpace) against independent computations:
the pairings of the ascent step, the cotangent gradient path against autograd through perturbed_params,
the perturbed-weight gradient (paper Algorithm 1), the written Space protocol."""
import weakref

import numpy as np
import pytest
import torch

from geosharp_ref.apgd import ModelSpace, apgd, value_and_grad
from geosharp_ref.sharpness import Cotangents, ProductSpace, Tangent, gl_pair_factors, model_loss
from geosharp_ref.sharpness.measures import MEASURES
from geosharp_ref.symmetry import symmetry_map
from tests.cases import TinyAttention


def _tiny_space(metric, seed=4, fast=True, **kw):
    torch.manual_seed(seed)
    model = TinyAttention().double()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    if metric is None:
        return model, batch, ProductSpace(params, **kw)
    return model, batch, ProductSpace(params, gl_pair_factors(smap.groups, metric), smap.adaptive_masks, fast=fast,
                                      **kw)


def _scale_to(space, xi, r):
    return [x * (r / space.norm(xi)) for x in xi]


def _randn(space, gen):
    return [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in space.zeros()]


def test_product_space_implements_the_space_protocol():
    _, _, space = _tiny_space("mix")
    for name in ("zeros", "random", "inner", "project", "ascent_step", "lincomb", "scale", "perturbed_params",
                 "value_and_grad", "norm"):
        assert callable(getattr(space, name)) and name in dir(ModelSpace)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("metric", [None, "inv", "mix"])
def test_ascent_step_pairings_equal_the_metric_inner_with_the_ascent_direction(metric, fast):
    """g(ξ, d) = ⟨ξ, ∇⟩_F and g(d, d) = ⟨d, ∇⟩_F for horizontal ξ and d = P 𝔾⁻¹ ∇ (Auto-PGD's cheap norms);
    a vertical ξ breaks the identity (so the test can fail). The Frobenius ablation returns its own
    inner products g_F(ξ, d), g_F(d, d), which are not ⟨ξ, ∇⟩_F."""
    _, _, space = _tiny_space(metric, fast=fast, geodesic_correction=False)  # ∂E/∂ξ = I: cotangent = ∇
    gen = torch.Generator().manual_seed(0)
    xi = space.project_horizontal(_randn(space, gen))
    egrad = _randn(space, gen)
    d, dd, xd = space.ascent_step(xi, Cotangents(egrad, xi))
    assert isinstance(d, Tangent)
    euclid = lambda a, b: float(sum((x * y).sum() for x, y in zip(a, b)))  # noqa: E731
    assert float(xd) == pytest.approx(float(space.inner(xi, d)), rel=1e-11)
    assert float(xd) == pytest.approx(euclid(xi, egrad), rel=1e-11)
    assert float(dd) == pytest.approx(float(space.inner(d, d)), rel=1e-11)
    raw = _randn(space, gen)
    if metric is not None:
        assert euclid(raw, egrad) != pytest.approx(float(space.inner(raw, d)), rel=1e-3)
        _, _, frob = _tiny_space(metric, fast=fast, geodesic_correction=False, metric_norm=False)
        d, dd, xd = frob.ascent_step(xi, Cotangents(egrad, xi))
        assert float(dd) == pytest.approx(float(frob.inner(d, d)), rel=1e-11)
        assert float(xd) == pytest.approx(float(frob.inner(xi, d)), rel=1e-11)
        assert float(xd) != pytest.approx(euclid(xi, egrad), rel=1e-3)
    with pytest.raises(TypeError, match="Cotangents"):
        space.ascent_step(xi, egrad)


@pytest.mark.parametrize("metric_norm", [True, False])
@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_apgd_with_the_pairings_follows_the_metric_norm_run(metric, metric_norm):
    """Auto-PGD with the pairings the space returns (element-wise for the metric, the Frobenius inner for
    the ablation) and with g(d, d), g(x, d) recomputed by the metric visit the same iterates to
    round-off, random start included."""
    model, batch, space = _tiny_space(metric, metric_norm=metric_norm)

    class MetricNormsOnly:
        def __getattr__(self, name):
            return getattr(space, name)

        def ascent_step(self, x, g, consume=False):
            d = space.ascent_step(x, g, consume)[0]
            return d, space.inner(d, d), space.inner(x, d)

    f_and_grad = space.value_and_grad(lambda p: model_loss(model, p, batch))
    runs = [apgd(f_and_grad, s, 0.3, n_iter=12, random_start=True, generator=torch.Generator().manual_seed(2))
            for s in (space, MetricNormsOnly())]
    assert runs[0].best_value > runs[0].start_value
    np.testing.assert_allclose(runs[0].values, runs[1].values, rtol=1e-10, atol=1e-13)
    assert space.norm(runs[0].best_xi) == pytest.approx(space.norm(runs[1].best_xi), rel=1e-9)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("gradient, correction", [("exact", True), ("perturbed", True), ("exact", False)])
def test_cotangent_path_equals_the_autograd_gradient_path(metric, gradient, correction, fast):
    """space.value_and_grad (cotangents ū = ∂L/∂E, mapped by the ascent step) gives the value, the ascent
    direction d, g(d, d) and g(ξ, d) of the autograd path (∂F/∂ξ through perturbed_params, itself checked
    against autograd through the generated E formula, then 𝔾⁻¹ and the projection with ∂E/∂ξ = I),
    float64; Auto-PGD on the two visits the same iterates, random start included."""
    model, batch, space = _tiny_space(metric, fast=fast, gradient=gradient, geodesic_correction=correction)
    _, _, ref = _tiny_space(metric, fast=fast, geodesic_correction=False)  # takes ∂F/∂ξ as its cotangent
    loss = lambda params: model_loss(model, params, batch)  # noqa: E731
    gen = torch.Generator().manual_seed(5)
    xi = _scale_to(space, space.project_horizontal(_randn(space, gen)), 0.4)
    f_c, g_c = space.value_and_grad(loss)(xi)
    f_a, g_a = value_and_grad(lambda x: loss(space.perturbed_params(x)))(xi)
    assert isinstance(g_c, Cotangents)
    assert f_c == pytest.approx(f_a, rel=1e-13)
    if gradient == "exact" and correction:  # independent of the generated VJP: autograd through E's formula
        _, _, generic = _tiny_space(metric, fast=False)
        f_r, g_r = value_and_grad(lambda x: loss(generic.perturbed_params(x)))(xi)
        assert f_r == pytest.approx(f_c, rel=1e-13)
        for a, b in zip(g_r, g_a):
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13)
    d_c, dd_c, xd_c = space.ascent_step(xi, g_c)
    d_a, dd_a, xd_a = ref.ascent_step(xi, Cotangents(g_a, xi))
    for a, b in zip(d_c, d_a):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert float(dd_c) == pytest.approx(float(space.inner(d_a, d_a)), rel=1e-10)
    assert float(xd_c) == pytest.approx(float(sum((x * g).sum() for x, g in zip(xi, g_a))), rel=1e-10)
    assert float(xd_a) == pytest.approx(float(xd_c), rel=1e-10)

    def autograd_path(x):
        f, g = value_and_grad(lambda v: loss(space.perturbed_params(v)))(x)
        return f, Cotangents(g, x)
    runs = [apgd(f, s, 0.5, n_iter=8, random_start=True, generator=torch.Generator().manual_seed(3))
            for f, s in ((space.value_and_grad(loss), space), (autograd_path, ref))]
    assert runs[0].best_value > runs[0].start_value
    np.testing.assert_allclose(runs[0].values, runs[1].values, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_perturbed_point_gradient_is_the_weight_gradient_at_the_perturbed_weights(metric, fast):
    """gradient="perturbed" (paper Algorithm 1): the gradient in ξ of the pair components is ∇L with
    respect to the perturbed blocks E = θ + ξ + ½γ̈(ξ) (computed here directly, E as a leaf), the
    value is the exact one, and it differs from the exact gradient (which carries the ξ-derivative
    of the correction) by O(‖ξ‖)."""
    model, batch, exact = _tiny_space(metric, fast=fast)
    _, _, pert = _tiny_space(metric, fast=fast, gradient="perturbed")
    params = exact.base
    smap = symmetry_map(model)
    k = 2 * len(smap.groups)
    gen = torch.Generator().manual_seed(1)
    xi = _scale_to(exact, exact.project_horizontal(_randn(exact, gen)), 0.5)
    f_p, g_p = value_and_grad(lambda x: model_loss(model, pert.perturbed_params(x), batch))(xi)
    f_e, g_e = value_and_grad(lambda x: model_loss(model, exact.perturbed_params(x), batch))(xi)
    assert f_p == pytest.approx(f_e, rel=1e-14)
    with torch.no_grad():
        E = [e.detach().requires_grad_(True) for b, part in zip(exact.bound, exact._split(xi)[0])
             for e in b.perturbed(part)]
    p = dict(params)
    for i, grp in enumerate(smap.groups):
        p = grp.insert(p, (E[2 * i], E[2 * i + 1]))
    for n, x in zip(exact.adaptive_names, xi[k:]):
        p[n] = p[n] + x
    ref = torch.autograd.grad(model_loss(model, p, batch), E)
    for a, b in zip(g_p[:k], ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    rel = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(g_p[:k], g_e[:k]))
    assert 1e-6 < rel < 1.0
    with pytest.raises(ValueError, match="unknown gradient"):
        ProductSpace(params, gl_pair_factors(smap.groups, metric), smap.adaptive_masks, gradient="paper")


def test_exclude_and_masks():
    """Unknown exclude names are refused; excluded and non-float parameters are not perturbed."""
    _, _, space = _tiny_space("mix")
    with pytest.raises(ValueError, match="exclude names unknown"):
        ProductSpace(space.base, exclude=["nope"])
    name = next(iter(space.base))
    sp = ProductSpace(space.base, exclude=[name])
    assert name not in sp.adaptive_names and len(sp.adaptive_names) == len(space.base) - 1


@pytest.mark.parametrize("measure", ["adaptive", "geodesic-inv"])
def test_a_weight_whose_square_underflows_is_as_immovable_as_a_zero_weight(measure):
    """A weight with 0 < θ² below float32's smallest normal number (|θ| = 1e-21) used to get the metric weight
    1/θ² = inf: every norm was infinite and Auto-PGD recorded 0 without an error. Its c² is now flushed to 0, so
    the measure equals the one of the same model with that weight exactly 0 (frozen either way; the loss differs
    by far less than float32 resolves)."""
    torch.manual_seed(0)
    model = TinyAttention()
    batch = (torch.randn(4, 5, 8), torch.randint(0, 3, (4,)))
    values = []
    for w in (1e-21, 0.0):
        with torch.no_grad():
            model.head.weight[0, 0] = w
        assert (model.head.weight[0, 0] ** 2 < torch.finfo(torch.float32).tiny) and (w == 0 or model.head.weight[0, 0])
        values.append(MEASURES[measure].evaluate(model, [batch], 0.05, n_iter=5).mean)
    assert values[1] > 0 and values[0] == pytest.approx(values[1], rel=1e-5, abs=0)


@pytest.mark.parametrize("fast", [True, False])
def test_consume_releases_the_spent_vector_and_changes_no_value(fast):
    """``ascent_step(ξ, ∇, consume=True)`` and ``lincomb(terms, consume=d)`` (Auto-PGD's ownership) free the
    gradient and the direction (their tensors are gone, not only unlisted: the fast GL factor's Gram states and
    the forward states go with them) and return bit for bit what the calls without ``consume`` return."""
    model, batch, space = _tiny_space("mix", fast=fast)
    f_and_grad = space.value_and_grad(lambda p: model_loss(model, p, batch))
    xi = space.project(space.random(0.3, torch.Generator().manual_seed(5)), 0.3)
    d_kept, dd_kept, xd_kept = space.ascent_step(xi, f_and_grad(xi)[1])
    grad = f_and_grad(xi)[1]
    alive = [weakref.ref(t) for t in grad]
    d, dd, xd = space.ascent_step(xi, grad, consume=True)
    assert all(t is None for t in grad) and all(r() is None for r in alive)
    assert float(dd) == float(dd_kept) and float(xd) == float(xd_kept)
    assert all(torch.equal(a, b) for a, b in zip(d, d_kept))  # (no loop variable left holding a tensor)
    combined = space.lincomb([(0.7, xi), (0.2, d_kept), (-0.1, xi)])
    alive = [weakref.ref(t) for t in d]
    out = space.lincomb([(0.7, xi), (0.2, d), (-0.1, xi)], consume=d)
    assert all(t is None for t in d) and all(r() is None for r in alive)
    assert all(t is not None for t in xi)  # the other terms are left alone
    assert all(torch.equal(a, b) for a, b in zip(out, combined))
    assert float(space.inner(out, out)) == float(space.inner(combined, combined))


@pytest.mark.parametrize("fast", [True, False])
def test_factors_sharing_a_tensor_get_their_own_cotangents(fast):
    """GPT-2's fused c_attn holds the Q/K and the V/O pair (one factor each with ``fast=False``), folded by ln_1, and
    c_attn's bias is adaptive: ∂L/∂W of the shared tensor is pulled back through each factor's insert. The cotangent
    path's value and ascent direction equal autograd through ``perturbed_params`` (E as a function of ξ), float64."""
    from geosharp_ref.sharpness.pipeline import build_space
    from geosharp_ref.symmetry import find_symmetries
    from tests.cases import models
    torch.manual_seed(0)
    model = models.gpt2(initializer_range=0.5).double().eval()
    ids = torch.randint(3, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    batch = ({"input_ids": ids}, torch.cat([ids[:, 1:], torch.full((3, 1), -100)], 1))
    params = {n: p.detach() for n, p in model.named_parameters()}
    space = build_space(params, symmetry_map(model), "mix", find_symmetries(model, batch, metric="mix", seed=0).bindings,
                        fast=fast)
    shared = [n for n in params if "c_attn.weight" in n]
    assert shared and all(sum(n in f.param_names for f in space.factors) == (1 if fast else 2) for n in shared)
    loss = lambda p: model_loss(model, p, batch)  # noqa: E731
    xi = _scale_to(space, space.project_horizontal(_randn(space, torch.Generator().manual_seed(5))), 0.3)
    f_c, g_c = space.value_and_grad(loss)(xi)
    f_a, g_a = value_and_grad(lambda x: loss(space.perturbed_params(x)))(xi)
    assert f_c == pytest.approx(f_a, rel=1e-13)
    ref = build_space(params, symmetry_map(model), "mix", find_symmetries(model, batch, metric="mix", seed=0).bindings,
                      fast=fast, geodesic_correction=False)  # takes ∂F/∂ξ as its cotangent
    d_c, d_a = space.ascent_step(xi, g_c)[0], ref.ascent_step(xi, Cotangents(g_a, xi))[0]
    for a, b in zip(d_c, d_a):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fast", [True, False])
def test_the_backward_pass_frees_each_layers_perturbed_weights_as_it_passes_them(fast):
    """The bound weights W enter the model as outputs of insert nodes (no list of leaves keeps them): when the
    backward pass reaches the token embedding (tied, so its gradient is complete only there, after every layer)
    every perturbed bound weight is already gone (weakrefs dead), and the value and cotangents still equal
    autograd through ``perturbed_params`` (a tiny Llama with RoPE Q/K, V/O and gated units quotiented)."""
    from geosharp_ref.sharpness.pipeline import build_space
    from geosharp_ref.symmetry import find_symmetries
    from tests.cases import models
    torch.manual_seed(0)
    model = models.llama(initializer_range=0.5, tie_word_embeddings=True).double().eval()
    ids = torch.randint(3, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    batch = ({"input_ids": ids}, torch.cat([ids[:, 1:], torch.full((3, 1), -100)], 1))
    params = {n: p.detach() for n, p in model.named_parameters()}
    bindings = find_symmetries(model, batch, metric="mix", seed=0).bindings
    space = build_space(params, symmetry_map(model), "mix", bindings, fast=fast)
    bound = {n for f in space.factors for n in f.param_names} - set(space.adaptive_names)
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"} <= {n.split(".")[-2] for n in bound}
    seen = {}

    def loss(p):
        refs = [weakref.ref(p[n]) for n in sorted(bound)]
        emb = p["model.embed_tokens.weight"]
        emb.register_hook(lambda g: seen.update(alive=sum(r() is not None for r in refs)))
        seen["bound"] = len(refs)
        return model_loss(model, p, batch)

    xi = _scale_to(space, space.project_horizontal(_randn(space, torch.Generator().manual_seed(5))), 0.3)
    f_c, g_c = space.value_and_grad(loss)(xi)
    assert seen["bound"] >= 12 and seen["alive"] == 0
    plain = lambda p: model_loss(model, p, batch)  # noqa: E731
    f_a, g_a = value_and_grad(lambda x: plain(space.perturbed_params(x)))(xi)
    assert f_c == pytest.approx(f_a, rel=1e-13)
    ref = build_space(params, symmetry_map(model), "mix", bindings, fast=fast, geodesic_correction=False)
    d_c, d_a = space.ascent_step(xi, g_c)[0], ref.ascent_step(xi, Cotangents(g_a, xi))[0]
    for a, b in zip(d_c, d_a):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
