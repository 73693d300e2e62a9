"""``symmetries="all"`` on peft LoRA models (issue 26, item 3): every adapter on an attention projection is quotiented
jointly with the GL(h) pairs holding its rows (:class:`~geosharp_ref.sharpness.joint_lora.JointLoRAFactor`) instead
of being refused, the norms' weights jointly with their readers (adapters' ``lora_A`` included), nothing yields,
and whole-model geodesic sharpness is invariant when the model moves along every orbit at once.

Observed (float64, n_iter 3, ρ 0.05, elements of scale 1e-2 and 1e2 of every group at once, inv and mix): ≤ 1.4e-13
relative on GPT-2 (LoRA on the fused c_attn and c_proj), BERT (query, value), ViT (q, v, o) and Llama (v, o, up);
with adapters on rotary Q/K projections (the pair's part of the joint algebra the RoPE commutant) ≤ 2.8e-13 on
Llama (q, k, v, o), Phi-3 (fused qkv_proj, partial rotary) and GPT-NeoX (fused query_key_value, partial rotary).
"""
from __future__ import annotations

import pytest
import torch

from geosharp_ref.sharpness import geodesic_sharpness
from geosharp_ref.sharpness.joint_lora import JointLoRAFactor
from geosharp_ref.symmetry import LoRABinding, NormWeightsBinding, Quotient
from tests import cases
from tests.cases.orbits import assert_invariant_along_every_orbit, moved_along_every_orbit

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
    assert_invariant_along_every_orbit(M, batch, q, metric)


def test_the_space_uses_one_joint_factor_per_connected_set_of_adapters():
    """GPT-2's c_attn adapter reaches both pairs of its layer, its c_proj adapter the V/O pair: one joint factor per
    layer holding both pairs and both adapters."""
    from geosharp_ref.sharpness import build_space
    M, batch = _peft("gpt2")
    q = Quotient.resolve(M.model, batch, metric="mix", symmetries="all")
    space = build_space(cases.params_of(M.model), quotient=q)
    joint = [f for f in space.factors if isinstance(f, JointLoRAFactor)]
    assert len(joint) == 2 and all(len(f.pairs) == 2 and len(f.lora) == 2 for f in joint)


def test_with_an_adaptive_or_declared_pair_metric_the_joint_adapters_are_dropped_to_adaptive():
    M, batch = _peft("bert")
    q = Quotient.resolve(M.model, batch, metric="mix", symmetries="all")
    joint = [b for b in q.bindings if getattr(b, "joint_pairs", None)]
    q2 = Quotient.assemble(cases.params_of(M.model), q.smap, None, joint)
    assert q2.bindings == [] and all(b.param_names[0] in q2.adaptive_masks for b in joint)
    assert sum("only under their built-in inv or mix" in w for _, _, w in q2.refused) == len(joint)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_adapters_on_rotary_qk_projections_are_quotiented_jointly_with_the_rope_subgroup(metric):
    """LoRA on q_proj and k_proj of a RoPE decoder: the Q/K pair's group is the RoPE subgroup, so the joint algebra is
    gl(r) × the commutant; the projection equals the dense least-squares g-orthogonal projection onto the span of
    the vertical vectors of a basis of that algebra (the factor's own vertical map and metric), and the whole model's
    geodesic sharpness is invariant along every orbit at once (RoPE subgroup elements, LoRA GL(r), norm weights)."""
    import itertools

    from codegen.runtime_subgroup import rope_basis
    case = cases.CASES["decoder"]["llama"]
    model = cases.lora(cases.make(case), targets=("q_proj", "k_proj")).to(torch.float64).eval()
    batch = case.batch(torch.Generator().manual_seed(0))
    q = Quotient.resolve(model, batch, metric=metric, symmetries="all")
    joint = [b for b in q.bindings if getattr(b, "joint_pairs", None)]
    assert len(joint) == 4 and not any("belong to" in w for _, _, w in q.refused)
    from geosharp_ref.sharpness import build_space
    params = cases.params_of(model)
    space = build_space(params, quotient=q)
    (f0, *_) = [f for f in space.factors if isinstance(f, JointLoRAFactor)]
    (pair,) = f0.pairs
    assert pair.rotary is not None and len(f0.lora) == 2
    fa = f0.at(params)
    # the vertical vectors of a basis of gl(r) × (commutant per head)
    Xs0, Lams0 = fa._zeros_algebra()
    basis = rope_basis(Lams0[0].shape[-1], *pair.rotary).dense(torch.float64).reshape(-1, *Lams0[0].shape[-2:])
    vecs = []
    for ai, X in enumerate(Xs0):
        for i, j in itertools.product(range(X.shape[0]), repeat=2):
            Xs = [x.clone() for x in Xs0]
            Xs[ai][i, j] = 1.0
            vecs.append(fa.vertical(Xs, Lams0))
    for head in range(Lams0[0].shape[0]):
        for E in basis:
            Lam = Lams0[0].clone()
            Lam[head] = E
            vecs.append(fa.vertical(Xs0, [Lam]))
    gen = torch.Generator().manual_seed(2)
    xi = [torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in fa.point]
    M = torch.tensor([[float(fa.metric_inner(fa.point, u, v)) for v in vecs] for u in vecs], dtype=torch.float64)
    b = torch.tensor([float(fa.metric_inner(fa.point, u, xi)) for u in vecs], dtype=torch.float64)
    c = torch.linalg.lstsq(M, b[:, None]).solution[:, 0]
    dense = [x - sum(ck * v[i] for ck, v in zip(c, vecs)) for i, x in enumerate(xi)]
    proj = fa.project(xi)
    assert max(float((p - d).abs().max()) for p, d in zip(proj, dense)) <= 1e-9 * max(float(x.abs().max()) for x in xi)
    again = fa.project(proj)
    assert max(float((p - a).abs().max()) for p, a in zip(proj, again)) <= 1e-10 * max(float(x.abs().max()) for x in xi)
    # whole-model invariance along every orbit at once
    M_ = cases.SharpnessModel(model, case.batch, case.loss_fn, case.output, None)
    kw = dict(metric=metric, n_iter=3, loss_fn=case.loss_fn, symmetries="all")
    s0 = geodesic_sharpness(model, [batch], 0.05, **kw).mean
    for log10_a in (-2.0, 2.0):
        s1 = geodesic_sharpness(moved_along_every_orbit(M_, q, log10_a, 3), [batch], 0.05, **kw).mean
        assert abs(s1 - s0) <= 1e-8 * abs(s0), (metric, log10_a, s0, s1)


@pytest.mark.parametrize("name,targets", [("phi3", ("qkv_proj", "o_proj")), ("gpt-neox", ("query_key_value", "dense"))])
def test_fused_qkv_adapters_on_partial_rotary_decoders_are_joint_and_invariant(name, targets):
    """Phi-3 (fused qkv_proj, partial rotary) and GPT-NeoX (per-head interleaved fused query_key_value, partial
    rotary): each fused adapter joins the rotary Q/K pair (its commutant: full GL on the free coordinates) and the
    V/O pair of its layer; nothing is refused for overlap and the model is invariant along every orbit at once."""
    case = cases.CASES["decoder"][name]
    model = cases.lora(cases.make(case), targets=targets).to(torch.float64).eval()
    batch = case.batch(torch.Generator().manual_seed(0))
    q = Quotient.resolve(model, batch, metric="mix", symmetries="all")
    assert len([b for b in q.bindings if getattr(b, "joint_pairs", None)]) == 4
    assert sum(getattr(g, "rotary", None) is not None for g in q.pairs) == 2
    assert not any("belong to" in w for _, _, w in q.refused) and q.yielded == []
    M_ = cases.SharpnessModel(model, case.batch, case.loss_fn, case.output, None)
    kw = dict(metric="mix", n_iter=3, loss_fn=case.loss_fn, symmetries="all")
    s0 = geodesic_sharpness(model, [batch], 0.05, **kw).mean
    s1 = geodesic_sharpness(moved_along_every_orbit(M_, q, 2.0, 3), [batch], 0.05, **kw).mean
    assert abs(s1 - s0) <= 1e-8 * abs(s0), (s0, s1)
