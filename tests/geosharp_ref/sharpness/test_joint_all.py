"""``symmetries="all"`` on peft LoRA models (issue 26, item 3): every adapter on an attention projection is quotiented
jointly with the GL(h) pairs holding its rows (:class:`~geosharp_ref.sharpness.joint_lora.JointLoRAFactor`) instead
of being refused, the norms' weights jointly with their readers (adapters' ``lora_A`` included), nothing yields,
and whole-model geodesic sharpness is invariant when the model moves along every orbit at once.

Observed (float64, n_iter 3, ρ 0.05, elements of scale 1e-2 and 1e2 of every group at once, inv and mix): ≤ 1.4e-13
relative on GPT-2 (LoRA on the fused c_attn and c_proj), BERT (query, value), ViT (q, v, o) and Llama (v, o, up).
"""
from __future__ import annotations

import pytest
import torch

from geosharp_ref.sharpness import adaptive_sharpness, geodesic_sharpness
from geosharp_ref.sharpness.joint_lora import JointLoRAFactor
from geosharp_ref.symmetry import LoRABinding, NormWeightsBinding, Quotient
from tests import cases
from tests.geosharp_ref.symmetry.test_norm_weights import _moved

cases.quiet_transformers()

#: case → (table, LoRA target modules, adapters joined with pairs, norms bound)
CASES = {"gpt2": ("sharpness", ("c_attn", "c_proj"), 4, 4), "bert": ("sharpness", ("query", "value"), 4, 0),
         "vit": ("sharpness", ("q_proj", "v_proj", "o_proj"), 6, 5),
         "llama": ("decoder", ("v_proj", "o_proj", "up_proj"), 4, 5)}


def _peft(name):
    table, targets, _, _ = CASES[name]
    case = cases.CASES[table][name]
    model = cases.lora(cases.make(case), targets=targets).to(torch.float64).eval()
    return cases.SharpnessModel(model, case.batch, case.loss_fn, case.output, None), case.batch(
        torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", sorted(CASES))
def test_adapters_on_attention_are_quotiented_jointly_with_their_pairs(name):
    M, batch = _peft(name)
    q = Quotient.resolve(M.model, batch, metric="mix", symmetries="all")
    _, _, n_joint, n_norms = CASES[name]
    joint = [b for b in q.bindings if getattr(b, "joint_pairs", None)]
    assert len(joint) == n_joint and all(isinstance(b, LoRABinding) for b in joint)
    assert sum(isinstance(b, NormWeightsBinding) for b in q.bindings) == n_norms
    assert q.yielded == [] and not any("belong to" in why for _, _, why in q.refused)
    listed = dict(q.joint)  # `geosharp symmetries` lists them as joint groups
    assert all(sorted(listed[b.key]) == sorted(b.joint_pairs) for b in joint)
    for b in joint:  # it binds the factor no pair holds; the other stays in its pairs
        (outside,) = b.param_names
        held = {n for g in q.pairs if g.key in b.joint_pairs for n in g.param_names}
        assert outside not in held and ({b.a_weight, b.b_weight} - {outside}) <= held
        assert outside not in q.adaptive_masks and b.scaling == pytest.approx(2.0)  # peft: alpha / r = 2r / r
    res = geodesic_sharpness(M.model, [batch], 0.05, metric="mix", n_iter=2, loss_fn=M.loss_fn, symmetries="all")
    assert res.config["yielded"] == []
    keys = set(res.config["factors"])
    assert all(b.key in keys for b in joint) and all(g.key in keys for g in q.pairs)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_geodesic_sharpness_is_invariant_along_every_orbit_at_once_with_lora(name, metric):
    M, batch = _peft(name)
    q = Quotient.resolve(M.model, batch, metric=metric, symmetries="all")
    kw = dict(metric=metric, n_iter=3, loss_fn=M.loss_fn, symmetries="all")
    s0 = geodesic_sharpness(M.model, [batch], 0.05, **kw).mean
    a0 = adaptive_sharpness(M.model, [batch], 0.05, n_iter=3, loss_fn=M.loss_fn).mean
    for log10_a in (-2.0, 2.0):
        m1 = _moved(M, q, log10_a, 3)
        s1 = geodesic_sharpness(m1, [batch], 0.05, **kw).mean
        assert abs(s1 - s0) <= 1e-8 * abs(s0), (name, metric, log10_a, s0, s1)
        a1 = adaptive_sharpness(m1, [batch], 0.05, n_iter=3, loss_fn=M.loss_fn).mean
        assert abs(a1 - a0) > 1e-4 * abs(a0)


def test_the_space_uses_one_joint_factor_per_connected_set_of_adapters():
    """GPT-2's c_attn adapter reaches both pairs of its layer, its c_proj adapter the V/O pair: one joint factor per
    layer holding both pairs and both adapters."""
    from geosharp_ref.sharpness import build_space
    M, batch = _peft("gpt2")
    q = Quotient.resolve(M.model, batch, metric="mix", symmetries="all")
    space = build_space(cases.params_of(M.model), quotient=q)
    joint = [f for f in space.factors if isinstance(f, JointLoRAFactor)]
    assert len(joint) == 2 and all(len(f.pairs) == 2 and len(f.lora) == 2 for f in joint)


def test_a_lora_adapter_on_a_rotary_qk_pair_is_refused_with_the_reason():
    table, case = "decoder", cases.CASES["decoder"]["llama"]
    model = cases.lora(cases.make(case), targets=("q_proj",)).to(torch.float64).eval()
    batch = case.batch(torch.Generator().manual_seed(0))
    q = Quotient.resolve(model, batch, metric="mix", symmetries="all")
    why = [w for k, _, w in q.refused if k.endswith("q_proj:lora")]
    assert len(why) == 2 and all("not with the RoPE subgroup" in w for w in why)


def test_with_an_adaptive_or_declared_pair_metric_the_joint_adapters_are_dropped_to_adaptive():
    M, batch = _peft("bert")
    q = Quotient.resolve(M.model, batch, metric="mix", symmetries="all")
    joint = [b for b in q.bindings if getattr(b, "joint_pairs", None)]
    q2 = Quotient.assemble(cases.params_of(M.model), q.smap, None, joint)
    assert q2.bindings == [] and all(b.param_names[0] in q2.adaptive_masks for b in joint)
    assert sum("only under their built-in inv or mix" in w for _, _, w in q2.refused) == len(joint)
