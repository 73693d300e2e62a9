"""Whole-model invariance on the decoder families of the case table (tests/cases/tables.py: DECODER_CASES —
Llama, Mistral, Qwen2, Gemma, Phi-3, GPT-NeoX, GPT-J; float64, eager attention kept float64 by geosharp_ref.precision).

With ``symmetries="all"`` every decoder quotients its rotary Q/K pairs (RoPE subgroup), its V/O pairs (GL(h)),
its gated-MLP units (GL(1) per unit; GPT-NeoX's and GPT-J's MLPs are not gated) and, where exact, the head's softmax
translation. Acting on the model with
a random element of *every* quotiented group at once (scale a ∈ [1e-2, 1e2]) leaves geodesic sharpness
unchanged (≤ 1e-8 relative, float64) and changes adaptive sharpness.

Observed on these models (float64, n_iter 3, ρ 0.05, elements at a = 1e-2 and 1e2 of every group at once):
relative change of geodesic sharpness ≤ 5.5e-13 (inv and mix); of adaptive sharpness 1e-3 … 2e2. Per kind
alone, geodesic ≤ 4.3e-13; adaptive sharpness does not see the gated-unit rescaling (a diagonal action, which
the element-wise ball absorbs: change ≤ 6e-14), while RoPE Q/K (rotation-scalings) moves it by 1e-4 … 7e-3.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from geosharp_ref.sharpness import adaptive_sharpness, geodesic_sharpness
from geosharp_ref.symmetry import GatedUnitsBinding, Quotient
from geosharp_ref.verification.orbits import model_with_params
from tests import cases

cases.quiet_transformers()

TOL = 1e-8
RHO = 0.05
N_ITER = 3
EXAMPLES = max(2, settings.default.max_examples // 20)  # ci: 2, dev: 3


def _quotient(M, batch, metric="mix"):
    return Quotient.resolve(M.model, batch, metric=metric, symmetries="all")


def _moved(M, q, log10_a, seed):
    """The model acted on by a random element of every quotiented group (pairs and further bindings), each at
    scale 10**(log10_a ± 0.2) clipped to [1e-2, 1e2]."""
    params = cases.params_of(M.model)
    gen = torch.Generator().manual_seed(seed)
    for i, b in enumerate(q.pairs + q.bindings):
        jitter = float(torch.empty(()).uniform_(-0.2, 0.2, generator=gen))
        a = 10.0 ** max(-2.0, min(2.0, log10_a + jitter))
        params = b.act(params, b.random_element(params, scale=a, seed=seed + i))
    return model_with_params(M.model, params)


#: per family: (pairing, rotary dim) of its Q/K pairs, number of gated MLPs
EXPECTED = {"llama": (("half", 4), 2), "mistral": (("half", 4), 2), "qwen2": (("half", 4), 2),
            "gemma": (("half", 4), 2), "phi3": (("half", 2), 2), "gpt-neox": (("half", 4), 0),
            "gptj": (("interleaved", 4), 0)}


def test_every_decoder_case_has_its_expectation():
    assert sorted(EXPECTED) == sorted(cases.DECODER_NAMES)


@pytest.mark.parametrize("name", cases.DECODER_NAMES)
def test_every_decoder_quotients_rope_qk_vo_and_gated_units(name):
    M = cases.sharpness_case(name, "decoder")
    batch = M.make_batch(torch.Generator().manual_seed(0))
    q = _quotient(M, batch)
    rotary, n_gated = EXPECTED[name]
    kinds = sorted((g.kind, g.kernels, g.rotary) for g in q.pairs)
    assert kinds == [("qk", f"rope_{rotary[0]}_mix", rotary)] * 2 + [("vo", "gl_mix", None)] * 2, kinds
    gated = [b for b in q.bindings if isinstance(b, GatedUnitsBinding)]
    assert len(gated) == n_gated
    if name == "phi3":  # the up half of the fused gate_up_proj; its gate half stays adaptive
        mask = q.adaptive_masks["model.layers.0.mlp.gate_up_proj.weight"]
        assert mask[:24].all() and not mask[24:].any()
    assert not any(k.endswith(":qk") for k, _, _ in q.refused)


@pytest.mark.parametrize("name", cases.DECODER_NAMES)
@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2 ** 16), log10_a=st.floats(-2.0, 2.0), metric=st.sampled_from(["inv", "mix"]))
def test_geodesic_sharpness_is_invariant_under_every_quotiented_group(name, seed, log10_a, metric):
    M = cases.sharpness_case(name, "decoder")
    batch = M.make_batch(torch.Generator().manual_seed(seed))
    m1 = _moved(M, _quotient(M, batch), log10_a, seed)
    kw = dict(metric=metric, n_iter=N_ITER, loss_fn=M.loss_fn, symmetries="all")
    s0 = geodesic_sharpness(M.model, [batch], RHO, **kw).mean
    s1 = geodesic_sharpness(m1, [batch], RHO, **kw).mean
    assert s0 > 0 and abs(s1 - s0) <= TOL * abs(s0), (name, metric, s0, s1)
    a0 = adaptive_sharpness(M.model, [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn).mean
    a1 = adaptive_sharpness(m1, [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn).mean
    assert abs(a1 - a0) > 1e-4 * abs(a0), (name, a0, a1)
