"""Bindings beyond attention: the softmax translation of a classifier head. Its action leaves the class
probabilities unchanged (checked in float64 and refused where the output is not a softmax), and a
ProductSpace with the GL(h) pair factors plus the translation factor gives geodesic sharpness that is
invariant under both symmetries at once, while adaptive sharpness is not."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geosharp_ref.apgd import apgd
from geosharp_ref.sharpness.factors import Factor, ProductSpace, gl_pair_factors
from geosharp_ref.sharpness.loss import model_loss
from geosharp_ref.sharpness.measures import adaptive_sharpness, geodesic_sharpness
from geosharp_ref.symmetry import symmetry_map
from geosharp_ref.symmetry.bindings import (HeadTranslationBinding, ReLUUnitsBinding, check_binding,
                                             lora_bindings)
from geosharp_ref.verification.orbits import model_with_params
from geosharp_ref.verification.sampling import draw_orbit_elements
from tests import cases


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    model = cases.bert(initializer_range=cases.IR).to(torch.float64).eval()
    batch = ({"input_ids": torch.randint(3, 50, (4, 7), generator=torch.Generator().manual_seed(1))},
             torch.tensor([0, 1, 2, 1]))
    return model, batch


def _elements(binding, params, scales, seed=0):
    (w,) = binding.extract(params)
    g = torch.Generator().manual_seed(seed)
    return [s * torch.randn(w.shape[0], generator=g, dtype=w.dtype) for s in scales]


def test_extract_insert_round_trip(bert):
    model, _ = bert
    params = cases.params_of(model)
    b = HeadTranslationBinding("classifier.weight", "classifier.bias")
    (w,) = b.extract(params)
    C, d = params["classifier.weight"].shape
    assert w.shape == (d + 1, C, 1)
    back = b.insert(params, (w,))
    assert torch.equal(back["classifier.weight"], params["classifier.weight"])
    assert torch.equal(back["classifier.bias"], params["classifier.bias"])


def test_action_leaves_probabilities_and_is_refused_on_logits(bert):
    model, batch = bert
    b = HeadTranslationBinding("classifier.weight", "classifier.bias")
    els = _elements(b, cases.params_of(model), (1e-2, 1.0, 1e2))
    assert check_binding(model, b, batch, lambda o: torch.softmax(o.logits, -1), els) < 1e-12
    with pytest.raises(ValueError, match="not a symmetry of this model: acting on it changed the output by"):
        check_binding(model, b, batch, lambda o: o.logits, els)


def _geodesic(model, smap, binding, batch, rho=0.05, n_iter=4):
    params = cases.params_of(model)
    space = ProductSpace(params, gl_pair_factors(smap.groups, "mix") + [Factor("translation", binding)])
    res = apgd(space.value_and_grad(lambda p: model_loss(model, p, batch)), space, rho, n_iter=n_iter)
    return res.best_value - float(model_loss(model, params, batch))


@pytest.mark.parametrize("scale", [1e-2, 1e2])
def test_sharpness_with_both_symmetries_is_invariant(bert, scale):
    model, batch = bert
    smap = symmetry_map(model)
    b = HeadTranslationBinding("classifier.weight", "classifier.bias")
    params = cases.params_of(model)
    moved = smap.act(params, draw_orbit_elements(smap, scale, torch.Generator().manual_seed(3)))
    moved = b.act(moved, _elements(b, params, (scale,), seed=4)[0])
    m2 = model_with_params(model, moved)
    s0 = _geodesic(model, smap, b, batch)
    s1 = _geodesic(m2, smap, b, batch)
    assert s0 > 0
    assert abs(s1 - s0) <= 1e-8 * abs(s0)
    a0 = adaptive_sharpness(model, [batch], 0.05, n_iter=4).mean
    a1 = adaptive_sharpness(m2, [batch], 0.05, n_iter=4).mean
    assert abs(a1 - a0) > 1e-6 * abs(a0)


# ---------------------------------------------------------------------------------------------
# ReLU units: a GL(1) pair per hidden unit (the gl kernels with h = 1, batched over units)
# ---------------------------------------------------------------------------------------------

def _mlp(activation, seed=0):
    torch.manual_seed(seed)
    return cases.mlp(activation=activation, d_in=5, hidden=6, d_out=3).to(torch.float64).eval()


def _mlp_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 5, generator=g, dtype=torch.float64), torch.randint(3, (8,), generator=g)


def _positive(n, log10_scale, seed):
    g = torch.Generator().manual_seed(seed)
    return 10.0 ** log10_scale * torch.exp(0.5 * torch.randn(n, generator=g, dtype=torch.float64))


RELU = ReLUUnitsBinding("0.weight", "2.weight", in_bias="0.bias")


def test_relu_units_are_a_symmetry_and_tanh_units_are_not():
    els = [_positive(6, s, seed=s + 3) for s in (-2, 0, 2)]
    assert check_binding(_mlp(torch.nn.ReLU), RELU, _mlp_batch(), lambda o: o, els) < 1e-12
    with pytest.raises(ValueError, match="not a symmetry"):
        check_binding(_mlp(torch.nn.Tanh), RELU, _mlp_batch(), lambda o: o, els)


@given(log10_scale=st.floats(-2.0, 2.0), seed=st.integers(0, 2 ** 16))
@settings(max_examples=6)
def test_sharpness_on_the_relu_quotient_is_invariant(log10_scale, seed):
    model, batch = _mlp(torch.nn.ReLU), _mlp_batch(1)
    params = cases.params_of(model)
    moved = model_with_params(model, RELU.act(params, _positive(6, log10_scale, seed)))

    def sharp(m):
        p = cases.params_of(m)
        space = ProductSpace(p, [Factor(RELU.kernels, RELU)])
        res = apgd(space.value_and_grad(lambda q: model_loss(m, q, batch)), space, 0.1, n_iter=5)
        return res.best_value - float(model_loss(m, p, batch))

    s0, s1 = sharp(model), sharp(moved)
    assert s0 > 0 and abs(s1 - s0) <= 1e-8 * abs(s0)


# ---------------------------------------------------------------------------------------------
# The public entry point: geodesic_sharpness(..., symmetries=[...])
# ---------------------------------------------------------------------------------------------

def test_entry_point_generic_path_equals_fast_path_without_extra_symmetries(bert):
    model, batch = bert
    fast = geodesic_sharpness(model, [batch], 0.05, metric="inv", n_iter=4)
    generic = geodesic_sharpness(model, [batch], 0.05, metric="inv", n_iter=4, symmetries=[])
    assert generic.mean == pytest.approx(fast.mean, rel=1e-8)
    assert generic.relative_size == pytest.approx(fast.relative_size, rel=1e-6)
    assert fast.config["factors"] is None and len(generic.config["factors"]) == len(symmetry_map(model).groups)


def test_entry_point_with_head_translation_is_invariant_and_reports_its_factor(bert):
    model, batch = bert
    smap = symmetry_map(model)
    b = HeadTranslationBinding("classifier.weight", "classifier.bias")
    params = cases.params_of(model)
    moved = smap.act(params, draw_orbit_elements(smap, 100.0, torch.Generator().manual_seed(3)))
    moved = model_with_params(model, b.act(moved, _elements(b, params, (100.0,), seed=4)[0]))
    r0 = geodesic_sharpness(model, [batch], 0.05, metric="mix", n_iter=4, symmetries=[b])
    r1 = geodesic_sharpness(moved, [batch], 0.05, metric="mix", n_iter=4, symmetries=[b])
    assert r0.mean > 0 and r1.mean == pytest.approx(r0.mean, rel=1e-8)
    assert r0.config["factors"][-1] == "classifier.weight:translation"
    assert r0.mean == pytest.approx(_geodesic(model, smap, b, batch, n_iter=4), rel=1e-10)  # = the space run by hand


def test_entry_point_refuses_options_the_generic_path_lacks(bert):
    model, batch = bert
    with pytest.raises(ValueError, match="generic path .* does not offer"):
        geodesic_sharpness(model, [batch], 0.05, metric_norm=False, symmetries=[])


# ---------------------------------------------------------------------------------------------
# LoRA adapters (peft): a GL(r) pair per adapter
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lora_bert():
    """A tiny BERT with peft LoRA (r = 2) on query and value, B made non-zero (as after training)."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = peft.get_peft_model(cases.bert(initializer_range=cases.IR),
                                peft.LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.5)
    model = model.to(torch.float64).eval()
    batch = ({"input_ids": torch.randint(3, 50, (4, 7), generator=torch.Generator().manual_seed(1))},
             torch.tensor([0, 1, 2, 1]))
    return model, batch


def _gl(r, n, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return [scale * (torch.eye(r, dtype=torch.float64) + 0.3 * torch.randn(r, r, generator=g, dtype=torch.float64))
            for _ in range(n)]


def test_lora_adapters_are_found_and_are_a_symmetry(lora_bert):
    model, batch = lora_bert
    found = lora_bindings(model)
    assert len(found) == 4 and all(b.param_names[0].endswith("lora_B.default.weight") for b in found)
    for b, R in zip(found, _gl(2, 4, 10.0, 0)):
        assert check_binding(model, b, batch, lambda o: o.logits, [R, 1e-2 * R]) < 1e-12


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_sharpness_on_the_lora_quotient_is_invariant(lora_bert, metric):
    """LoRA GL(r) quotiented (the attention pairs left out: their base weights are wrapped by the adapters)."""
    model, batch = lora_bert
    found = lora_bindings(model, kernels=f"gl_{metric}")
    params = cases.params_of(model)
    moved = params
    for b, R in zip(found, _gl(2, 4, 100.0, 1)):
        moved = b.act(moved, R)
    m2 = model_with_params(model, moved)

    def sharp(m):
        p = cases.params_of(m)
        space = ProductSpace(p, [Factor(b.kernels, b) for b in found])
        res = apgd(space.value_and_grad(lambda q: model_loss(m, q, batch)), space, 0.05, n_iter=4)
        return res.best_value - float(model_loss(m, p, batch))

    s0, s1 = sharp(model), sharp(m2)
    assert s0 > 0 and abs(s1 - s0) <= 1e-8 * abs(s0)
