"""Quotient (geosharp_ref/symmetry/quotient.py): which symmetries apply, one parameter one symmetry, what yielded
and what was refused — checked against covered-parameter sets computed by hand from the models' parameter
names; find_symmetries and geodesic_sharpness(symmetries="all"): every built-in symmetry found, checked, bound
or refused; sharpness with all of them quotiented is invariant when the model moves along all of their orbits
at once, and adaptive sharpness is not."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geosharp_ref.kernels import load_kernels
from geosharp_ref.sharpness import adaptive_sharpness, geodesic_sharpness, get_measure
from geosharp_ref.symmetry import (HeadTranslationBinding, NormScalingBinding, Quotient, ReLUUnitsBinding,
                                   declared_bindings, find_symmetries, lora_bindings, symmetry_map)
from geosharp_ref.verification.orbits import model_with_params
from geosharp_ref.sampling import draw_orbit_elements
from tests import cases


def _batch(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return ({"input_ids": torch.randint(3, 50, (4, 7), generator=gen)}, torch.tensor([0, 1, 2, 1]))


@pytest.fixture(scope="module")
def relu_bert():
    """ReLU MLPs, LayerNorms with eps = 0, a 3-class head: every built-in symmetry applies."""
    torch.manual_seed(0)
    return cases.bert(initializer_range=cases.IR, hidden_act="relu", layer_norm_eps=0.0).to(torch.float64).eval()


def _kinds(report, status):
    return sorted(k for _, k, s, _ in report.entries if s == status)


def test_everything_applicable_is_bound(relu_bert):
    report = find_symmetries(relu_bert, _batch())
    assert len(report.smap.groups) == 4
    assert _kinds(report, "bound") == ["ReLU units", "ReLU units", "norm scaling", "softmax translation"]
    assert _kinds(report, "refused") == []
    keys = [b.key for b in report.bindings]
    assert "classifier.weight:translation" in keys and "bert.embeddings.LayerNorm:norm-scaling" in keys
    assert all(len(set(b.param_names) & {n for g in report.smap.groups for n in g.param_names}) == 0
               for b in report.bindings)


def test_what_does_not_apply_is_refused_with_a_reason():
    torch.manual_seed(0)
    gelu = cases.bert(initializer_range=cases.IR).to(torch.float64).eval()  # GELU, eps 1e-12
    report = find_symmetries(gelu, _batch())
    refused = dict(report.refused)
    assert _kinds(report, "bound") == ["softmax translation"]
    assert all("is not ReLU" in refused[k] for k in refused if k.endswith(":relu-units"))
    (scaling,) = [r for k, r in refused.items() if k.endswith(":norm-scaling")]
    assert "eps = 1e-12" in scaling and "changed the output by" in scaling


def test_lora_adapters_on_attention_projections_are_quotiented_jointly_with_the_pairs():
    pytest.importorskip("peft")
    torch.manual_seed(0)
    model = cases.lora(cases.bert(initializer_range=cases.IR), targets=("query", "output.dense"))
    report = find_symmetries(model.to(torch.float64).eval(), _batch())
    lora = [(k, s, d) for k, kind, s, d in report.entries if kind == "LoRA GL(r)"]
    # query (B in the Q/K pair) and attention.output.dense (A in the V/O pair) are bound jointly with the pairs
    # (LoRA GL(r) × GL(h), issue 26); the MLP output adapters on their own; nothing is refused
    assert sorted(s for _, s, _ in lora) == ["bound"] * 6
    joint = [(k, d) for k, _, d in lora if "jointly with" in d]
    assert len(joint) == 4 and all(k.endswith(("query:lora", "attention.output.dense:lora")) for k, _ in joint)
    assert {k for k, _ in report.joint} == {k for k, _ in joint}


@settings(deadline=None, max_examples=4)
@given(scale=st.floats(1e-2, 1e2), seed=st.integers(0, 1000))
def test_sharpness_with_every_symmetry_quotiented_is_invariant_along_all_orbits(relu_bert, scale, seed):
    batch = _batch()
    report = find_symmetries(relu_bert, batch)
    params = {n: p.detach() for n, p in relu_bert.named_parameters()}
    moved = report.smap.act(params, draw_orbit_elements(report.smap, scale, torch.Generator().manual_seed(seed)))
    for i, b in enumerate(report.bindings):
        moved = b.act(moved, b.random_element(moved, scale=scale, seed=seed + i))
    m2 = model_with_params(relu_bert, moved)
    kw = dict(n_iter=4, dtype=torch.float64)
    s0 = geodesic_sharpness(relu_bert, [batch], 0.05, symmetries="all", **kw)
    s1 = geodesic_sharpness(m2, [batch], 0.05, symmetries="all", **kw)
    assert s0.config["factors"] == s1.config["factors"] and len(s0.config["factors"]) == 4 + 4
    assert s0.mean > 0 and s1.mean == pytest.approx(s0.mean, rel=1e-8)
    a0, a1 = (adaptive_sharpness(m, [batch], 0.05, **kw).mean for m in (relu_bert, m2))
    assert abs(a1 - a0) > 1e-3 * a0


def test_all_symmetries_equal_the_same_bindings_given_by_hand(relu_bert):
    batch = _batch()
    report = find_symmetries(relu_bert, batch)
    kw = dict(n_iter=3, dtype=torch.float64)
    auto = geodesic_sharpness(relu_bert, [batch], 0.05, symmetries="all", **kw)
    hand = geodesic_sharpness(relu_bert, [batch], 0.05, symmetries=report.bindings, **kw)
    assert auto.per_batch == hand.per_batch
    with pytest.raises(ValueError, match="unknown symmetries entry 'everything'"):
        geodesic_sharpness(relu_bert, [batch], 0.05, symmetries="everything", **kw)


@pytest.mark.parametrize("activation, bound", [(torch.nn.ReLU, True), (torch.nn.LeakyReLU, True),
                                               (torch.nn.Tanh, False)])
def test_a_plain_mlp_with_float32_inputs(activation, bound):
    """A float32 nn.Sequential (its inputs float32 too): the float64 checks cast the inputs; positively
    homogeneous activations (ReLU, leaky ReLU) give unit scaling, tanh does not."""
    torch.manual_seed(0)
    model = cases.mlp(activation)
    batch = (torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1]))
    report = find_symmetries(model, batch)
    units = [s for _, k, s, _ in report.entries if k == "ReLU units"]
    assert units == (["bound"] if bound else ["refused"])
    s0 = geodesic_sharpness(model, [batch], 0.05, n_iter=3, symmetries="all", dtype=torch.float64)
    assert s0.config["factors"] == [b.key for b in report.bindings]


def test_without_a_pair_metric_every_unbound_parameter_is_adaptive(relu_bert):
    from geosharp_ref.sharpness import build_space
    params = {n: p.detach() for n, p in relu_bert.named_parameters()}
    report = find_symmetries(relu_bert, _batch())
    head = [b for b in report.bindings if b.key.endswith("translation")]
    space = build_space(params, report.smap, None, head)
    assert set(space.adaptive_names) == set(params) - set(head[0].param_names) and space.quotient.pairs == []


# ---------------------------------------------------------------------------------------------------------
# The public entry point: geodesic_sharpness(..., symmetries=[...])
# ---------------------------------------------------------------------------------------------------------

def test_entry_point_generic_path_equals_fast_path_without_extra_symmetries(bert):
    model, batch = bert
    fast = geodesic_sharpness(model, [batch], 0.05, metric="inv", n_iter=4)
    generic = geodesic_sharpness(model, [batch], 0.05, metric="inv", n_iter=4, symmetries=[])
    assert generic.mean == pytest.approx(fast.mean, rel=1e-8)
    assert generic.relative_size == pytest.approx(fast.relative_size, rel=1e-6)
    assert fast.config["factors"] is None and len(generic.config["factors"]) == len(symmetry_map(model).groups)


@pytest.mark.parametrize("ablation", [dict(metric_norm=False), dict(geodesic_correction=False),
                                      dict(gradient="perturbed")])
def test_entry_point_generic_path_offers_every_ablation(bert, ablation):
    """The ablations run on the generic path (symmetries=[]) and equal the fast path's, to round-off."""
    model, batch = bert
    fast = geodesic_sharpness(model, [batch], 0.05, metric="inv", n_iter=4, **ablation)
    generic = geodesic_sharpness(model, [batch], 0.05, metric="inv", n_iter=4, symmetries=[], **ablation)
    assert generic.mean == pytest.approx(fast.mean, rel=1e-8)


# ---------------------------------------------------------------------------------------------------------
# Quotient: one parameter, one symmetry, with its precedence (expected sets computed from parameter names)
# ---------------------------------------------------------------------------------------------------------

ONE = "a parameter belongs to one symmetry"


def _names(model):
    return [n for n, _ in model.named_parameters()]


def _layers(model):
    return sorted({n.split(".")[3] for n in _names(model) if n.startswith("bert.encoder.layer.")})


def test_all_binds_every_built_in_and_leaves_the_rest_adaptive(relu_bert):
    """relu_bert by hand: per layer the ReLU MLP (intermediate.dense weight and bias, output.dense weight),
    the classifier (weight, bias), the three embedding tables into embeddings.LayerNorm (eps = 0); the attention
    pairs are Q/K and V/O of every layer's attention.self."""
    names = _names(relu_bert)
    layers = [f"bert.encoder.layer.{i}" for i in _layers(relu_bert)]
    relu = [(f"{p}.intermediate.dense.weight:relu-units",
             {f"{p}.intermediate.dense.weight", f"{p}.intermediate.dense.bias", f"{p}.output.dense.weight"})
            for p in layers]
    head = ("classifier.weight:translation", {"classifier.weight", "classifier.bias"})
    tables = {n for n in names if n.startswith("bert.embeddings.") and n.endswith("_embeddings.weight")}
    norm = ("bert.embeddings.LayerNorm:norm-scaling", tables)
    expected = relu + [head, norm]  # the search order: LoRA (none), ReLU units, head translation, norm scaling
    q = Quotient.resolve(relu_bert, _batch(), metric="inv", symmetries="all")
    assert [(b.key, set(b.param_names)) for b in q.bindings] == expected
    assert q.bound == {n: k for k, ns in expected for n in ns}
    assert [g.key for g in q.pairs] == [f"{p}.attention.self:{k}" for p in layers for k in ("qk", "vo")]
    assert all(g.kernels == "gl_inv" for g in q.pairs) and q.all == q.pairs + q.bindings and q.yielded == []
    # the pairs cover Q, K, V (weights and biases) and the attention output weight whole; its bias stays adaptive
    in_pairs = {n for n in names if ".attention.self." in n or n.endswith(".attention.output.dense.weight")}
    assert q.adaptive_masks == {n: None for n in names if n not in q.bound and n not in in_pairs}
    assert [e[:3] for e in q.report().entries] == [(k, kind, "bound") for (k, _), kind in
                                                  zip(expected, ["ReLU units"] * len(relu) + ["softmax translation",
                                                                                             "norm scaling"])]
    assert str(q.report()) == str(find_symmetries(relu_bert, _batch(), metric="inv"))


def test_without_a_pair_metric_the_quotient_has_no_pairs(relu_bert):
    smap = symmetry_map(relu_bert)
    head = HeadTranslationBinding("classifier.weight", "classifier.bias")
    q = Quotient.resolve(relu_bert, None, metric=None, symmetries=[head], smap=smap)
    assert q.pairs == [] and q.bindings == [head] and q.smap is smap
    assert q.adaptive_masks == {n: None for n in _names(relu_bert) if n not in head.param_names}


def test_attention_pairs_yield_to_an_explicit_lora_binding(lora_bert):
    """LoRA on query and value: B of query sits in the Q/K pair, B of value in the V/O pair, so with the
    adapters quotiented explicitly every pair yields and its weights are adaptive (whole tensors)."""
    model, batch = lora_bert
    names = _names(model)
    adapters = lora_bindings(model)
    expected = {}
    for n in names:
        if ".lora_B." in n:
            proj = n.split(".lora_B.")[0]  # bert.encoder.layer.i.attention.self.query / .value
            path, kind = proj.rsplit(".", 1)
            expected[f"{path}:{'qk' if kind == 'query' else 'vo'}"] = f"{proj}:lora"
    q = Quotient.resolve(model, batch, metric="mix", symmetries=adapters)
    assert q.pairs == [] and q.bindings == adapters and q.all == adapters
    assert dict((k, why) for k, why in q.yielded) == {
        k: f"shares parameters with {lora} ({ONE}): its weights are adaptive instead" for k, lora in expected.items()}
    lora_names = {n for n in names if ".lora_A." in n or ".lora_B." in n}
    assert set(q.bound) == lora_names
    assert q.adaptive_masks == {n: None for n in names if n not in lora_names}
    # without the explicit adapters "all" keeps the pairs and binds the adapters jointly with them (issue 26):
    # each adapter binds its lora_A (the factor no pair holds), nothing is refused and nothing yields
    q_all = Quotient.resolve(model, batch, metric="mix", symmetries="all")
    assert sorted(g.key for g in q_all.pairs) == sorted(expected)
    assert not [k for k, kind, _ in q_all.refused if kind == "LoRA GL(r)"] and q_all.yielded == []
    joint = {b.key: b for b in q_all.bindings if getattr(b, "joint_pairs", None)}
    assert set(joint) == set(expected.values())
    assert all(b.param_names == (b.a_weight,) for b in joint.values())
    assert {lora: pair for pair, lora in expected.items()} == {k: b.joint_pairs[0] for k, b in joint.items()}


def test_all_skips_built_ins_that_share_a_parameter_with_an_explicit_symmetry(relu_bert):
    """An explicit binding over layer 0's MLP output weight: the built-in ReLU units of layer 0 (which bind
    that weight) are dropped and reported; the other built-ins are kept after it."""
    w = "bert.encoder.layer.0.output.dense.weight"
    mine = NormScalingBinding([w], ["bert.encoder.layer.0.output.LayerNorm"])
    q = Quotient.resolve(relu_bert, _batch(), metric="mix", symmetries=[mine, "all"])
    keys = [b.key for b in q.bindings]
    dropped = "bert.encoder.layer.0.intermediate.dense.weight:relu-units"
    assert keys[0] == mine.key and dropped not in keys
    assert keys[1:] == [k for k in (b.key for b in find_symmetries(relu_bert, _batch()).bindings) if k != dropped]
    assert (dropped, "ReLU units", f"its parameters belong to {mine.key} ({ONE})") in q.refused
    assert q.bound[w] == mine.key
    assert "bert.encoder.layer.0.intermediate.dense.weight" in q.adaptive_masks


def test_two_explicit_bindings_sharing_a_parameter_are_refused(lora_bert):
    model, batch = lora_bert
    (lora, *_) = lora_bindings(model)
    declared = [d for d in declared_bindings(model, load_kernels("gl_mix"),
                                             [cases.DECLARED_LORA]) if lora.b_weight in d.param_names]
    for d in declared:
        d.checked = True  # the same adapter declared by hand: measured exact elsewhere (test_declared.py)
    message = (f"parameter {lora.b_weight!r} is bound twice, by {lora.key} and {declared[0].key}; {ONE}")
    with pytest.raises(ValueError) as err:
        Quotient.resolve(model, batch, metric="mix", symmetries=[lora] + declared)
    assert str(err.value) == message
    with pytest.raises(ValueError) as err:
        Quotient.assemble(dict(model.named_parameters()), None, None, [lora] + declared)
    assert str(err.value) == message


def test_resolve_refuses_what_it_cannot_use(relu_bert):
    with pytest.raises(ValueError, match="unknown symmetries entry 'everything': give factors, bindings or 'all'"):
        Quotient.resolve(relu_bert, _batch(), symmetries=["all", "everything"])
    with pytest.raises(ValueError, match="is neither a Factor nor a binding with a `kernels` attribute"):
        Quotient.resolve(relu_bert, _batch(), symmetries=[object()])
    with pytest.raises(ValueError, match="a batch is needed"):
        Quotient.resolve(relu_bert, None, symmetries="all")


def test_a_factor_stands_for_its_binding():
    from geosharp_ref.sharpness.factors import Factor
    torch.manual_seed(0)
    model = cases.mlp(torch.nn.ReLU)
    b = ReLUUnitsBinding("0.weight", "2.weight", in_bias="0.bias")
    q = Quotient.resolve(model, None, metric=None, symmetries=[Factor(b.kernels, b)])
    assert q.bound == {n: b.key for n in b.param_names} and q.adaptive_masks == {"2.bias": None}


def test_attention_pairs_that_are_no_symmetry_are_refused_before_they_are_quotiented():
    """The pairs are read off the model's structure; a forward that breaks them (here a tanh on one query
    projection's output, which the detector cannot see) is measured and refused by every quotient measure, with
    the change it made, while adaptive sharpness, which quotients nothing, is still evaluated."""
    torch.manual_seed(0)
    model = cases.bert(initializer_range=cases.IR).double().eval()
    batch = _batch()
    geodesic_sharpness(model, [batch], 0.05, metric="mix", n_iter=1)  # exact pairs: measured and accepted
    model.bert.encoder.layer[0].attention.self.query.register_forward_hook(lambda m, i, o: torch.tanh(o))
    for name, options in (("geodesic-mix", dict(n_iter=1)), ("geodesic-inv-linearised", {}),
                          ("average-geodesic-mix", dict(n_samples=2)), ("hessian-trace-inv", dict(probes=1))):
        with pytest.raises(ValueError, match=r"not a symmetry of its forward \(acting on it changed the output by "):
            get_measure(name).evaluate(model, [batch], 0.05, **options)
    assert adaptive_sharpness(model, [batch], 0.05, n_iter=1).mean >= 0
