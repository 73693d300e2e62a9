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


@settings(deadline=None, max_examples=3)
@given(metric=st.sampled_from(["inv", "mix"]), scale=st.floats(1e-2, 1e2), seed=st.integers(0, 1000))
def test_sharpness_on_the_lora_quotient_is_invariant(lora_bert, metric, scale, seed):
    """LoRA GL(r) quotiented alone (the attention pairs left out; with them, the adapters on query and value
    belong to the pairs), every adapter moved by its own random R = scale·R̃: geodesic sharpness unchanged,
    adaptive sharpness not."""
    model, batch = lora_bert
    found = lora_bindings(model, kernels=f"gl_{metric}")
    params = cases.params_of(model)
    moved = params
    for i, b in enumerate(found):
        moved = b.act(moved, b.random_element(moved, scale=scale, seed=seed + i))
    m2 = model_with_params(model, moved)

    def sharp(m):
        p = cases.params_of(m)
        space = ProductSpace(p, [Factor(b.kernels, b) for b in found])
        res = apgd(space.value_and_grad(lambda q: model_loss(m, q, batch)), space, 0.05, n_iter=4)
        return res.best_value - float(model_loss(m, p, batch))

    s0, s1 = sharp(model), sharp(m2)
    assert s0 > 0 and abs(s1 - s0) <= 1e-8 * abs(s0)
    a0, a1 = (adaptive_sharpness(m, [batch], 0.05, n_iter=4).mean for m in (model, m2))
    assert abs(a1 - a0) > 1e-4 * a0


# ---------------------------------------------------------------------------------------------
# Positive scaling into a normalisation: one `scaling` block of everything that writes into the norm;
# exact only where every reading norm has eps = 0 and nothing else reads the scaled parameters
# ---------------------------------------------------------------------------------------------

from geosharp_ref.kernels import load_kernels  # noqa: E402
from geosharp_ref.symmetry.bindings import (POWER_OF_TWO_ELEMENTS, NormScalingBinding,  # noqa: E402
                                             norm_scaling_bindings, norm_scaling_candidates)

EMB = ("bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
       "bert.embeddings.token_type_embeddings.weight")
LOGITS = lambda o: o.logits  # noqa: E731


def _ids_batch():
    return ({"input_ids": torch.randint(3, 50, (4, 7), generator=torch.Generator().manual_seed(1))},
            torch.tensor([0, 1, 2, 1]))


def _bert_eps0():
    torch.manual_seed(0)
    return cases.bert(initializer_range=cases.IR, layer_norm_eps=0.0).to(torch.float64).eval()


@pytest.fixture(scope="module")
def bert_eps0():
    return _bert_eps0(), _ids_batch()


def _a(value):
    return torch.tensor([value], dtype=torch.float64)


def _rel(x, y):
    return float((x - y).abs().max() / y.abs().max())


def test_norm_scaling_of_the_embedding_tables_is_found_and_exact_with_eps_zero(bert_eps0):
    model, batch = bert_eps0
    found, refused = norm_scaling_bindings(model, batch, LOGITS)
    assert refused == [] and len(found) == 1
    (b,) = found
    assert b.key == "bert.embeddings.LayerNorm:norm-scaling" and b.kernels == "scaling"
    assert b.param_names == EMB and b.norm_names == ("bert.embeddings.LayerNorm",)
    assert check_binding(model, b, batch, LOGITS, [_a(1e-2), _a(1e2)]) < 1e-12
    params = cases.params_of(model)
    base = cases.forward(model, params, batch[0], LOGITS)
    for a in (1e-2, 1e2):
        moved = b.act(params, _a(a))
        assert all(torch.equal(moved[n], a * params[n]) for n in EMB)
        assert all(moved[n] is params[n] for n in params if n not in EMB)
        assert _rel(cases.forward(model, moved, batch[0], LOGITS), base) < 1e-12


def test_norm_scaling_is_refused_with_the_measured_change_where_the_norm_has_eps(bert):
    model, batch = bert  # layer_norm_eps = 1e-12 (the default)
    found, refused = norm_scaling_bindings(model, batch, LOGITS)
    assert found == [] and len(refused) == 1
    key, why = refused[0]
    assert key == "bert.embeddings.LayerNorm:norm-scaling"
    assert "changed the output by" in why and "eps = 1e-12" in why and "breaks exact scale invariance" in why
    change = float(why.split("changed the output by ")[1].split()[0])
    assert 1e-10 < change < 1e-6  # ≈ eps/(2σ²)·|1 − 1/a²| at a = 1e-2, carried to the logits


def test_norm_scaling_is_refused_where_a_tied_decoder_reads_the_word_table():
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = T.BertForMaskedLM(T.BertConfig(vocab_size=50, max_position_embeddings=32, layer_norm_eps=0.0,
                                           initializer_range=cases.IR, attn_implementation="eager",
                                           **cases.SMALL)).to(torch.float64).eval()
    batch = _ids_batch()
    (cand,) = norm_scaling_candidates(model)
    assert cand.binding is None and cand.key == "bert.embeddings.LayerNorm:norm-scaling"
    assert "tied to cls.predictions.decoder.weight" in cand.reason and "get_output_embeddings()" in cand.reason
    assert norm_scaling_bindings(model, batch, LOGITS) == ([], [(cand.key, cand.reason)])
    with pytest.raises(ValueError, match="not a symmetry"):  # measured: the tied decoder scales the logits
        check_binding(model, NormScalingBinding(EMB, ["bert.embeddings.LayerNorm"]), batch, LOGITS, [_a(1e2)])


def test_geodesic_sharpness_with_norm_scaling_is_invariant(bert_eps0):
    """Geodesic sharpness with the tables' scaling quotiented is invariant under a = 1e2, alone and with a
    GL(h) action of scale 1e2 on the attention pairs. Adaptive sharpness (offset 0) is itself invariant under
    an element-wise positive scaling (θ + |θ| ⊙ δ scales with a), so it changes only with an offset in its
    scales or under the GL action."""
    model, batch = bert_eps0
    (b,), _ = norm_scaling_bindings(model, batch, LOGITS)
    smap = symmetry_map(model)
    params = cases.params_of(model)
    scaled = model_with_params(model, b.act(params, _a(1e2)))
    both = model_with_params(model, b.act(smap.act(params, draw_orbit_elements(
        smap, 100.0, torch.Generator().manual_seed(3))), _a(1e2)))
    r0, r1, r2 = (geodesic_sharpness(m, [batch], 0.05, metric="mix", n_iter=4, symmetries=[b])
                  for m in (model, scaled, both))
    assert r0.mean > 0 and r0.config["factors"][-1] == "bert.embeddings.LayerNorm:norm-scaling"
    assert r1.mean == pytest.approx(r0.mean, rel=1e-8) and r2.mean == pytest.approx(r0.mean, rel=1e-8)
    a0, a1, a2 = (adaptive_sharpness(m, [batch], 0.05, n_iter=4).mean for m in (model, scaled, both))
    assert a1 == pytest.approx(a0, rel=1e-8)
    assert abs(a2 - a0) > 1e-3 * abs(a0)
    o0, o1 = (adaptive_sharpness(m, [batch], 0.05, n_iter=4, offset=0.1).mean for m in (model, scaled))
    assert abs(o1 - o0) > 1e-3 * abs(o0)


_EPS0_PARAMS = {}


def _eps0_params():
    if not _EPS0_PARAMS:
        _EPS0_PARAMS.update(cases.params_of(_bert_eps0()))
    return _EPS0_PARAMS


@given(log10_a=st.floats(-2.0, 2.0), seed=st.integers(0, 2 ** 16))
@settings(max_examples=10)
def test_norm_scaling_round_trip_and_the_scaling_geometry_is_invariant(log10_a, seed):
    params = _eps0_params()
    b = NormScalingBinding(EMB, ["bert.embeddings.LayerNorm"])
    a = _a(10.0 ** log10_a)
    (w,) = b.extract(params)
    assert w.shape == (1, sum(params[n].numel() for n in EMB), 1)
    back = b.insert(params, (w,))
    assert all(torch.equal(back[n], params[n]) for n in params)
    moved = b.act(params, a)
    (wa,) = b.extract(moved)
    assert torch.equal(wa, a * w)
    assert all(torch.equal(b.insert(params, b.extract(moved))[n], moved[n]) for n in params)
    k = load_kernels(b.kernels)
    g = torch.Generator().manual_seed(seed)
    xi, eta = (torch.randn(w.shape, generator=g, dtype=w.dtype) for _ in range(2))
    i0, i1 = k.inner(w, xi, eta), k.inner(wa, a * xi, a * eta)
    assert float((i1 - i0).abs()) <= 1e-12 * float(i0.abs())
    (p0,), (p1,) = k.horizontal_projection(w, xi), k.horizontal_projection(wa, a * xi)
    assert _rel(p1, a * p0) < 1e-12
    (pw,) = k.horizontal_projection(w, w)  # the vertical direction is W itself
    assert float(pw.norm()) <= 1e-12 * float(w.norm())
    assert abs(float(k.horizontal_residual(w, p0))) < 1e-12


# pattern (b): pre-LN residual streams (embeddings + every block's output projections → the block norms)

def _pixels_batch():
    g = torch.Generator().manual_seed(2)
    return {"pixel_values": torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)}, torch.tensor([0, 1, 2, 1])


def test_pre_ln_stream_of_vit_is_exact_with_eps_zero_and_refused_with_eps():
    torch.manual_seed(0)
    model = cases.vit(initializer_range=cases.IR, layer_norm_eps=0.0).to(torch.float64).eval()
    batch = _pixels_batch()
    (b,), refused = norm_scaling_bindings(model, batch, LOGITS)
    assert refused == [] and b.key == "vit.layers.0.layernorm_before:norm-scaling"
    assert len(b.norm_names) == 5 and b.norm_names[-1] == "vit.layernorm"
    assert {"vit.embeddings.cls_token", "vit.embeddings.position_embeddings",
            "vit.embeddings.patch_embeddings.projection.weight", "vit.layers.1.mlp.fc2.bias"} <= set(b.param_names)
    assert check_binding(model, b, batch, LOGITS, [_a(1e-2), _a(1e2)]) < 1e-12
    torch.manual_seed(0)
    with_eps = cases.vit(initializer_range=cases.IR).to(torch.float64).eval()
    assert norm_scaling_bindings(with_eps, batch, LOGITS)[0] == []
    (key, why), = norm_scaling_bindings(with_eps, batch, LOGITS)[1]
    assert key == b.key and "eps = 1e-12 (5 of 5 reading norms)" in why and "changed the output by" in why


def test_sharpness_on_the_vit_stream_quotient_is_invariant():
    torch.manual_seed(0)
    model = cases.vit(initializer_range=cases.IR, layer_norm_eps=0.0).to(torch.float64).eval()
    batch = _pixels_batch()
    (b,), _ = norm_scaling_bindings(model, batch, LOGITS)
    moved = model_with_params(model, b.act(cases.params_of(model), _a(1e2)))

    def sharp(m):
        p = cases.params_of(m)
        space = ProductSpace(p, [Factor(b.kernels, b)])
        res = apgd(space.value_and_grad(lambda q: model_loss(m, q, batch)), space, 0.05, n_iter=4)
        return res.best_value - float(model_loss(m, p, batch))

    s0, s1 = sharp(model), sharp(moved)
    assert s0 > 0 and abs(s1 - s0) <= 1e-8 * abs(s0)


def test_pre_ln_stream_of_gpt2_is_refused_when_the_lm_head_is_tied_and_exact_untied():
    batch = _ids_batch()
    torch.manual_seed(0)
    tied = cases.gpt2(initializer_range=cases.IR, layer_norm_epsilon=0.0).to(torch.float64).eval()
    (key, why), = norm_scaling_bindings(tied, batch, LOGITS)[1]
    assert key == "transformer.h.0.ln_1:norm-scaling" and "transformer.wte.weight is tied to lm_head.weight" in why
    torch.manual_seed(0)
    untied = cases.gpt2(initializer_range=cases.IR, layer_norm_epsilon=0.0,
                        tie_word_embeddings=False).to(torch.float64).eval()
    (b,), refused = norm_scaling_bindings(untied, batch, LOGITS)
    assert refused == [] and len(b.param_names) == 2 + 2 * 4
    assert check_binding(untied, b, batch, LOGITS, [_a(1e-2), _a(1e2)]) < 1e-12


def test_llama_stream_refusal_names_float32_round_off_and_powers_of_two_accept_it():
    """Llama's RMSNorm computes in float32 even in a float64 model: a = 1e±2 moves the logits by round-off
    (~1e-7), a = 2^±7 (exact in floating point) leaves them unchanged to the bit."""
    batch = _ids_batch()
    torch.manual_seed(0)
    model = cases.llama(rms_norm_eps=0.0).to(torch.float64).eval()
    found, ((key, why),) = norm_scaling_bindings(model, batch, LOGITS)
    assert found == [] and key == "model.layers.0.input_layernorm:norm-scaling"
    assert "every reading norm has eps = 0" in why and "with a = 2^±7 (exact in floating point) the change is 0" in why
    (b,), refused = norm_scaling_bindings(model, batch, LOGITS, elements=POWER_OF_TWO_ELEMENTS)
    assert refused == [] and b.key == key


def test_norm_scaling_not_detected_without_a_pattern():
    assert norm_scaling_bindings(_mlp(torch.nn.ReLU), _mlp_batch(), lambda o: o) == \
        ([], [("norm-scaling", "not detected: no embedding tables feeding a LayerNorm (pattern a) and no pre-LN "
                               "residual stream (pattern b) found in the model's modules")])
