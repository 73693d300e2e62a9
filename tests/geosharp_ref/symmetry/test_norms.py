"""Positive scaling into a normalisation (geosharp_ref/symmetry/norms.py): one `scaling` block of everything
that writes into the norm; exact only where every reading norm has eps = 0 and nothing else reads the scaled
parameters."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geosharp_ref.kernels import load_kernels
from geosharp_ref.sampling import draw_orbit_elements
from geosharp_ref.sharpness.measures import adaptive_sharpness, geodesic_sharpness
from geosharp_ref.symmetry import check_binding, symmetry_map
from geosharp_ref.symmetry.norms import (POWER_OF_TWO_ELEMENTS, NormScalingBinding, norm_scaling_bindings,
                                         norm_scaling_candidates)
from geosharp_ref.verification.orbits import model_with_params
from tests import cases


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    model = cases.bert(initializer_range=cases.IR).to(torch.float64).eval()
    return model, cases.text_batch64()


EMB = ("bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
       "bert.embeddings.token_type_embeddings.weight")


LOGITS = lambda o: o.logits  # noqa: E731


def _bert_eps0():
    torch.manual_seed(0)
    return cases.bert(initializer_range=cases.IR, layer_norm_eps=0.0).to(torch.float64).eval()


@pytest.fixture(scope="module")
def bert_eps0():
    return _bert_eps0(), cases.text_batch64()


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
    batch = cases.text_batch64()
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


def test_pre_ln_stream_of_vit_is_exact_with_eps_zero_and_refused_with_eps():
    torch.manual_seed(0)
    model = cases.vit(initializer_range=cases.IR, layer_norm_eps=0.0).to(torch.float64).eval()
    batch = cases.pixels_batch64()
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


def test_pre_ln_stream_of_gpt2_is_refused_when_the_lm_head_is_tied_and_exact_untied():
    batch = cases.text_batch64()
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


def test_llama_stream_scaling_is_exact_once_float64_is_float64():
    """Llama's RMSNorm computes in float32 even in a float64 model; the checks run the forward inside
    geosharp_ref.precision.keep_float64, so with eps = 0 the stream scaling is exact at a = 1e±2 (and at the
    powers of two, exact in floating point, as well)."""
    batch = cases.text_batch64()
    torch.manual_seed(0)
    model = cases.llama(rms_norm_eps=0.0).to(torch.float64).eval()
    (b,), refused = norm_scaling_bindings(model, batch, LOGITS)
    assert refused == [] and b.key == "model.layers.0.input_layernorm:norm-scaling"
    assert b.measured_change < 1e-12
    (b2,), refused = norm_scaling_bindings(model, batch, LOGITS, elements=POWER_OF_TWO_ELEMENTS)
    assert refused == [] and b2.key == b.key


def test_norm_scaling_not_detected_without_a_pattern():
    assert norm_scaling_bindings(cases.mlp64(torch.nn.ReLU), cases.mlp_batch64(), lambda o: o) == \
        ([], [("norm-scaling", "not detected: no embedding tables feeding a LayerNorm (pattern a) and no pre-LN "
                               "residual stream (pattern b) found in the model's modules")])
