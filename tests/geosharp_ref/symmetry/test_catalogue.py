"""find_symmetries (geosharp_ref/symmetry/catalogue.py) and geodesic_sharpness(symmetries="all"): every built-in
symmetry found, checked, bound or refused; sharpness with all of them quotiented is invariant when the model
moves along all of their orbits at once, and adaptive sharpness is not."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geosharp_ref.sharpness import adaptive_sharpness, geodesic_sharpness
from geosharp_ref.symmetry import find_symmetries
from geosharp_ref.verification.orbits import model_with_params
from geosharp_ref.verification.sampling import draw_orbit_elements
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


def test_lora_adapters_on_attention_projections_are_left_to_the_pairs():
    pytest.importorskip("peft")
    torch.manual_seed(0)
    model = cases.lora(cases.bert(initializer_range=cases.IR), targets=("query", "output.dense"))
    report = find_symmetries(model.to(torch.float64).eval(), _batch())
    lora = [(k, s, d) for k, kind, s, d in report.entries if kind == "LoRA GL(r)"]
    # query (B in the Q/K pair) and attention.output.dense (A in the V/O pair) yield to the pairs; the MLP
    # output adapters are bound
    assert sorted(s for _, s, _ in lora) == ["bound", "bound", "refused", "refused", "refused", "refused"]
    assert all("a parameter belongs to one symmetry" in d for _, s, d in lora if s == "refused")


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
    from geosharp_ref.sharpness.measures import generic_space
    params = {n: p.detach() for n, p in relu_bert.named_parameters()}
    report = find_symmetries(relu_bert, _batch())
    head = [b for b in report.bindings if b.key.endswith("translation")]
    space = generic_space(params, report.smap, None, head)
    assert set(space.adaptive_names) == set(params) - set(head[0].param_names) and space.pair_groups == []
