"""Sharpness entry points (geosharp_ref.sharpness.measures) against independent computations: the exact
trust-region maximum of a quadratic (adaptive, linear regression), the first-order expansion
S(ρ)/ρ → ‖horizontal Riemannian gradient‖; side effects, excluded parameters, and the named measures."""
import numpy as np
import pytest
import torch
from torch import nn

from geosharp_ref.sharpness import (ABLATION_MEASURES, HEADLINE_MEASURES, MEASURES, Cotangents, ProductSpace,
                                    adaptive_sharpness, build_space, geodesic_sharpness, get_measure, gl_pair_factors,
                                    model_loss)
from geosharp_ref.sharpness.pipeline import EvaluationOptions, evaluation_quotient, evaluation_space
from geosharp_ref.symmetry import symmetry_map
from tests.cases import TinyAttention, trust_region_max


def mse(out, y):
    return ((out.squeeze(-1) - y) ** 2).mean()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adaptive_sharpness_of_linear_regression_equals_trust_region_maximum(seed):
    """L(w + |w|⊙δ) − L(w) = ½δᵀMδ + gᵀδ with M = 2 C XᵀX C / n, g = 2 C Xᵀr / n, C = diag|w|."""
    torch.manual_seed(seed)
    d, n = 6, 20
    model = nn.Linear(d, 1, bias=False).double()
    X = torch.randn(n, d, dtype=torch.float64)
    y = torch.randn(n, dtype=torch.float64)
    rho = 0.3
    res = adaptive_sharpness(model, [(X, y)], rho, n_iter=100, loss_fn=mse)
    w = model.weight.detach()[0].numpy()
    C = np.diag(np.abs(w))
    Xn = X.numpy()
    r = Xn @ w - y.numpy()
    M = 2 * C @ Xn.T @ Xn @ C / n
    g = 2 * C @ Xn.T @ r / n
    exact = trust_region_max(M, g, rho)
    assert res.mean <= exact * (1 + 1e-9)
    assert res.mean >= 0.99 * exact
    assert abs(res.perturbation_norms[0] - rho) < 1e-9


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_small_rho_geodesic_sharpness_is_rho_times_riemannian_gradient_norm(metric):
    torch.manual_seed(0)
    model = TinyAttention().double()
    for p in model.parameters():
        p.data.mul_(3.0)
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    space = ProductSpace(params, gl_pair_factors(smap.groups, metric), smap.adaptive_masks)
    xi = [x.requires_grad_(True) for x in space.zeros()]
    loss = model_loss(model, space.perturbed_params(xi), batch)
    grad = torch.autograd.grad(loss, xi)  # ∂F/∂ξ at ξ = 0, where ∂E/∂ξ = I: the cotangents themselves
    rg = space.ascent_direction(space.zeros(), Cotangents(list(grad), space.zeros()))
    gnorm = space.norm(rg)
    rho = 1e-5
    res = geodesic_sharpness(model, [batch], rho, metric=metric, n_iter=10)
    assert res.mean / rho == pytest.approx(gnorm, rel=2e-3)
    # the first-order adaptive value differs: the geometries are different
    ad = adaptive_sharpness(model, [batch], rho, n_iter=10)
    assert abs(ad.mean / rho - gnorm) / gnorm > 1e-2


def test_parameters_untouched_and_training_flag_restored():
    torch.manual_seed(1)
    model = TinyAttention().double().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = (torch.randn(2, 5, 8, dtype=torch.float64), torch.randint(0, 3, (2,)))
    geodesic_sharpness(model, [batch], 0.1, metric="inv", n_iter=3)
    adaptive_sharpness(model, [batch], 0.1, n_iter=3)
    assert model.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_exclude_rejects_unknown_names_and_removes_parameters():
    torch.manual_seed(2)
    model = TinyAttention().double()
    batch = (torch.randn(2, 5, 8, dtype=torch.float64), torch.randint(0, 3, (2,)))
    with pytest.raises(ValueError, match="unknown parameters"):
        adaptive_sharpness(model, [batch], 0.1, n_iter=2, exclude=["head.wieght"])
    with pytest.raises(ValueError, match="rho"):
        adaptive_sharpness(model, [batch], True, n_iter=2)
    names = [n for n, _ in model.named_parameters() if n != "head.weight"]
    only_head = adaptive_sharpness(model, [batch], 0.1, n_iter=5, exclude=names)
    full = adaptive_sharpness(model, [batch], 0.1, n_iter=5)
    assert only_head.config["adaptive_params"] == 1 and only_head.mean != full.mean


# ------------------------------------------------------------------------------------------------
# Named measures
# ------------------------------------------------------------------------------------------------

def test_measure_table():
    """The paper's three measures and the four ablations (App. G), each under its own name."""
    assert [m.name for m in HEADLINE_MEASURES] == ["adaptive", "geodesic-inv", "geodesic-mix"]
    assert sorted(m.name for m in ABLATION_MEASURES) == sorted(
        f"geodesic-{g}-{s}" for g in ("inv", "mix") for s in ("first-order", "frobenius"))
    for m in HEADLINE_MEASURES + ABLATION_MEASURES:
        assert MEASURES[m.name] is m and get_measure(m.name) is m
        assert m.metric == (None if m.name == "adaptive" else m.name.split("-")[1])
        assert m.geodesic_correction == (not m.name.endswith("first-order"))
        assert m.metric_norm == (not m.name.endswith("frobenius"))
    assert all(get_measure(name).name == name for name in MEASURES)
    with pytest.raises(ValueError, match="unknown measure 'geodesic'.*geodesic-mix"):
        get_measure("geodesic")

    # every measure names the headline measure it derives from, and says whether it is an ablation
    want = {"adaptive": ("adaptive", False), "adaptive-linearised": ("adaptive", False)}
    want.update({f"geodesic-{g}{s}": (f"geodesic-{g}", s in ("-first-order", "-frobenius"))
                 for g in ("inv", "mix") for s in ("", "-first-order", "-frobenius", "-linearised", "-exact")})
    want.update({"average-adaptive": ("adaptive", False), "average-adaptive-sphere": ("adaptive", False),
                 "average-geodesic-inv": ("geodesic-inv", False), "average-geodesic-mix": ("geodesic-mix", False)})
    want.update({f"hessian-{q}-{g}": ("adaptive" if g == "euclidean" else f"geodesic-{g}", False)
                 for q in ("trace", "top-eigenvalue") for g in ("inv", "mix", "euclidean")})
    assert {n: (m.base, m.ablated) for n, m in MEASURES.items()} == want


@pytest.mark.parametrize("name", ["adaptive", "geodesic-inv", "geodesic-mix-first-order", "geodesic-inv-frobenius"])
def test_measure_evaluate_equals_the_entry_point_with_its_flags(name):
    torch.manual_seed(5)
    model = TinyAttention().double()
    batch = (torch.randn(3, 5, 8, dtype=torch.float64), torch.randint(0, 3, (3,)))
    got = get_measure(name).evaluate(model, [batch], 0.2, n_iter=4)
    if name == "adaptive":
        ref = adaptive_sharpness(model, [batch], 0.2, n_iter=4)
    else:
        metric = name.split("-")[1]
        ref = geodesic_sharpness(model, [batch], 0.2, n_iter=4, metric=metric,
                                 geodesic_correction=not name.endswith("first-order"),
                                 metric_norm=not name.endswith("frobenius"))
    assert got.measure == ref.measure == ("adaptive" if name == "adaptive" else f"geodesic-{name.split('-')[1]}")
    assert got.mean == ref.mean and got.per_batch == ref.per_batch and got.mean > 0
    assert got.config == ref.config



def test_build_space_is_the_one_builder():
    """build_space: adaptive without a map or metric; the attention pairs as one fast GL factor (or, with
    fast=False, one generic factor per group); symmetries=[] records the pairs kept and none yielded; the
    options reach the space."""
    from geosharp_ref.sharpness import GLPairFactor, build_space
    from geosharp_ref.sharpness.factors import Factor
    torch.manual_seed(0)
    model = TinyAttention().double()
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    assert build_space(params, None).factors == [] and build_space(params, smap).factors == []
    fast = build_space(params, smap, "mix", metric_norm=False)
    assert [type(f) for f in fast.factors] == [GLPairFactor] and not fast.options.metric_norm
    assert fast.quotient.pairs == list(smap.groups) and fast.quotient.yielded == []
    generic = build_space(params, smap, "inv", [], fast=False, gradient="perturbed")
    assert [type(f) for f in generic.factors] == [Factor] * len(smap.groups)
    assert generic.factor_keys == [g.key for g in smap.groups] and generic.options.gradient == "perturbed"
    assert set(fast.adaptive_names) == set(generic.adaptive_names)


def test_gl_bindings_share_one_fast_factor_equal_to_the_generic_ones():
    """binding_factors: the GL(1) unit pairs of a gated MLP (kernels gl_mix) become one fast GLPairFactor; the
    head translation stays a generic Factor; with fast=False every group is generic, and geodesic sharpness
    through both paths agrees to round-off (float64)."""
    from geosharp_ref.sharpness import GLPairFactor, geodesic_sharpness
    from geosharp_ref.sharpness.factors import Factor
    from geosharp_ref.sharpness.pipeline import binding_factors
    from geosharp_ref.symmetry import Quotient
    from tests import cases

    torch.manual_seed(0)
    model = cases.llama(initializer_range=cases.IR).to(torch.float64).eval()
    g = torch.Generator().manual_seed(1)
    batch = ({"input_ids": torch.randint(3, 50, (2, 6), generator=g)}, torch.randint(3, 50, (2, 6), generator=g))
    q = Quotient.resolve(model, batch, metric="mix", symmetries="all")
    gated = [b for b in q.bindings if b.kernels == "gl_mix"]
    assert len(gated) == 2, [b.key for b in q.bindings]  # one gated-units binding per layer
    factors = binding_factors(q.bindings)
    fast = [f for f in factors if isinstance(f, GLPairFactor)]
    assert len(fast) == 1 and fast[0].keys == [b.key for b in gated]
    assert all(isinstance(f, Factor) for f in factors if f is not fast[0])
    kw = dict(metric="mix", symmetries="all", n_iter=4, dtype=torch.float64)
    a = geodesic_sharpness(model, [batch], 0.05, **kw)
    b = geodesic_sharpness(model, [batch], 0.05, fast=False, **kw)
    assert a.mean > 0 and abs(a.mean - b.mean) <= 1e-10 * abs(b.mean)


def test_evaluation_quotient_refuses_the_options_where_the_metric_is_asked_for():
    """``evaluation_quotient`` takes the metric (it took the options before): an old-style call is a TypeError,
    not an options object read as a metric; the metric itself gives the attention pairs' quotient."""
    model = TinyAttention().double().eval()
    batch = (torch.randn(2, 3, 8, dtype=torch.float64), torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match="takes the metric"):
        evaluation_quotient(model, batch, EvaluationOptions(metric="mix"), None, None)
    assert len(evaluation_quotient(model, batch, "mix", None, None).pairs) == len(symmetry_map(model).groups) == 2


def test_evaluation_space_is_the_one_preamble():
    """``evaluation_space``: the batches checked and cast, a float64 copy of a float32 model (the model untouched),
    the quotient resolved on the first batch, and the space of ``build_space`` on that quotient with the options
    given."""
    torch.manual_seed(0)
    model = TinyAttention().eval()
    batch = (torch.randn(2, 3, 8), torch.zeros(2, dtype=torch.long))
    setup = evaluation_space(model, [batch], "inv", dtype=torch.float64, eps=1e-3, metric_norm=False)
    assert setup.model is not model and next(model.parameters()).dtype == torch.float32
    assert setup.dtype == torch.float64 and setup.batches[0][0].dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in setup.model.parameters())
    assert [g.key for g in setup.space.quotient.pairs] == [g.key for g in symmetry_map(model).groups]
    assert {g.kernels for g in setup.space.quotient.pairs} == {"gl_inv"} and not setup.space.options.metric_norm
    ref = build_space(setup.params, symmetry_map(model), "inv", eps=1e-3, metric_norm=False)
    xi, eta = ref.random(0.1, torch.Generator().manual_seed(2)), ref.random(0.1, torch.Generator().manual_seed(3))
    assert float(setup.space.inner(xi, eta)) == pytest.approx(float(ref.inner(xi, eta)), rel=1e-12)
    assert setup.space.factor_keys == ref.factor_keys and set(setup.space.adaptive_names) == set(ref.adaptive_names)
    same = evaluation_space(model, [batch], None)
    assert same.model is model and same.space.factors == [] and same.dtype == torch.float32


def test_the_no_pairs_warning_names_the_line_that_called_the_entry_point():
    """A geodesic measure on a model without attention pairs warns at the caller's line (this file), through
    :func:`evaluate` and through the average-case measures alike, not inside the library."""
    import warnings

    from geosharp_ref.sharpness import average_case_sharpness
    from geosharp_ref.symmetry import NoAttentionPairsWarning
    from tests import cases

    model = cases.mlp64(nn.Tanh)
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randn(6, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (6,), generator=gen))
    for call in (lambda: geodesic_sharpness(model, [batch], 0.1, metric="mix", n_iter=1),
                 lambda: average_case_sharpness(model, [batch], 0.1, metric="mix", n_samples=2)):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            call()
        hits = [w for w in got if issubclass(w.category, NoAttentionPairsWarning)]
        assert len(hits) == 1 and hits[0].filename == __file__, [(w.filename, w.lineno) for w in hits]
