"""Declared bindings (geosharp_ref/symmetry/declared.py): parameter-name patterns, transposes, bias rows
and head slicing, checked against independent cuts of the same parameters."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geosharp_ref.kernels import load_kernels
from geosharp_ref.symmetry import LoRABinding, lora_bindings, symmetry_map
from geosharp_ref.symmetry import check_symmetry
from geosharp_ref.symmetry.declared import check_declarations, declared_bindings
from geosharp_ref.testing import assert_binding_exact, group_elements
from tests import cases

GL_MIX = load_kernels("gl_mix")

#: the attention Q/K pairs of a tiny BERT, declared by hand (2 heads of 8: hidden 16)
QK = {"G": {"param": "bert.encoder.layer.{i}.attention.self.query.weight", "transpose": True,
            "bias": "bert.encoder.layer.{i}.attention.self.query.bias", "heads": 2},
      "H": {"param": "bert.encoder.layer.{i}.attention.self.key.weight", "transpose": True,
            "bias": "bert.encoder.layer.{i}.attention.self.key.bias", "heads": 2}}
#: every peft LoRA adapter as a GL(r) pair G = B, H = Aᵀ of the built-in gl_mix kernels
LORA = {"G": "{adapter}.lora_B.default.weight", "H": {"param": "{adapter}.lora_A.default.weight", "transpose": True}}


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    model = cases.bert(initializer_range=cases.IR).to(torch.float64).eval()
    batch = ({"input_ids": torch.randint(3, 50, (3, 6), generator=torch.Generator().manual_seed(1))},
             torch.tensor([0, 1, 2]))
    return model, batch


def test_declared_attention_pairs_cut_the_blocks_symmetry_map_cuts(bert):
    """Head slicing, transposes and bias rows: the same blocks as the detector's PairGroup, exactly."""
    model, _ = bert
    params = cases.params_of(model)
    found = declared_bindings(model, GL_MIX, [QK])
    groups = [g for g in symmetry_map(model).groups if g.kind == "qk"]
    assert len(found) == len(groups) == cases.bert(initializer_range=cases.IR).config.num_hidden_layers
    for b, g in zip(found, groups):
        for mine, theirs in zip(b.extract(params), g.extract(params)):
            assert mine.shape == theirs.shape and torch.equal(mine, theirs)
        assert b.key == "gl_mix:i=" + g.key.split("layer.")[1].split(".")[0]


def test_declared_lora_equals_the_built_in_lora_binding(lora_bert):
    model, batch = lora_bert
    params = cases.params_of(model)
    found = declared_bindings(model, GL_MIX, [LORA])
    built_in = lora_bindings(model)
    assert len(found) == len(built_in) == 4
    for b, ref in zip(found, built_in):
        assert set(b.param_names) == set(ref.param_names)
        for mine, theirs in zip(b.extract(params), ref.extract(params)):
            assert torch.equal(mine, theirs)
        assert check_symmetry(model, b, batch) < 1e-12


@settings(deadline=None)
@given(data=st.data())
def test_extract_insert_round_trip_and_act_matches_the_built_in_action(lora_bert, data):
    """Elements drawn by geosharp_ref.testing.group_elements (scale log-uniform in [1e-2, 1e2], a seed): the
    declared action equals the built-in LoRABinding's, and leaves the output unchanged (assert_binding_exact)."""
    model, batch = lora_bert
    params = cases.params_of(model)
    (b,) = declared_bindings(model, GL_MIX, [{"G": "{a}.query.lora_B.default.weight",
                                               "H": {"param": "{a}.query.lora_A.default.weight",
                                                     "transpose": True}}])[:1]
    back = b.insert(params, b.extract(params))
    assert all(torch.equal(back[n], params[n]) for n in params)
    element = data.draw(group_elements(b, params), label="element")
    R = element.value
    assert R.shape == (1, 2, 2)
    ref = LoRABinding(b.entries["H"]["param"], b.entries["G"]["param"]).act(params, R[0])
    moved = b.act(params, R)
    for n in b.param_names:
        assert torch.allclose(moved[n], ref[n], rtol=1e-12, atol=1e-14 * element.scale)
    assert_binding_exact(model, b, batch, element, tol=1e-10)


def test_a_declaration_that_is_no_symmetry_is_refused_with_the_measured_change(bert):
    """Q paired with V (not K): acting changes the scores, and the check says by how much."""
    model, batch = bert
    wrong = {"G": QK["G"], "H": {**QK["H"], "param": QK["H"]["param"].replace("key", "value"),
                                 "bias": QK["H"]["bias"].replace("key", "value")}}
    (b, *_) = declared_bindings(model, GL_MIX, [wrong])
    with pytest.raises(ValueError, match=r"not a symmetry of this model: acting on it changed the output by "
                                         r"[0-9.e+-]+ \(relative, float64"):
        check_symmetry(model, b, batch)


@pytest.mark.parametrize("decl, message", [
    ({"G": "x"}, r"must bind exactly the blocks \['G', 'H'\].*missing: \['H'\]"),
    ({"G": "x", "H": "y", "K": "z"}, r"unknown: \['K'\]"),
    ({"G": {"param": "x", "transpos": True}, "H": "y"}, r"unknown keys \['transpos'\]"),
    ({"G": {"transpose": True}, "H": "y"}, r"needs 'param'"),
    ({"G": {"param": "x", "heads": 0}, "H": "y"}, r"'heads'\] must be a positive integer"),
    ({"G": {"param": "x", "heads": 2}, "H": "y"}, r"same number of heads"),
    ({"G": "a.{i}.w", "H": "b.{j}.w"}, r"placeholders \['j'\] that the first block"),
    ([], r"non-empty list"),
    ({"G": 3, "H": "y"}, r"must be a parameter-name pattern or a dict"),
])
def test_bad_declarations_are_refused_before_any_model(decl, message):
    with pytest.raises(ValueError, match=message):
        check_declarations(GL_MIX, decl if isinstance(decl, list) else [decl])


@pytest.mark.parametrize("decl, message", [
    ({"G": "nothing.{i}.weight", "H": "y"}, r"matches no parameter of the model \(names look like"),
    ({**QK, "H": {**QK["H"], "param": "bert.encoder.layer.{i}.attention.self.kez.weight"}},
     r"'bert.encoder.layer.0.attention.self.kez.weight' \(from the match .*\) is not a parameter"),
    ({**QK, "H": {"param": "bert.encoder.layer.{i}.intermediate.dense.weight", "transpose": True, "heads": 2}},
     r"block 'H' has shape \(16, 16\) per group but the geometry needs \('m', 'h'\): h = 8 \(from the other"),
    ({**QK, "G": {**QK["G"], "param": "bert.encoder.layer.{i}.attention.self.query.bias", "bias": None}},
     r"has shape \(16,\); a block is cut from a matrix"),
    ({**QK, "H": {**QK["H"], "heads": 3}, "G": {**QK["G"], "heads": 3}}, r"do not split into 3 heads"),
])
def test_bad_bindings_on_a_model_say_what_is_wrong(bert, decl, message):
    model, _ = bert
    decl = {k: ({kk: vv for kk, vv in v.items() if vv is not None} if isinstance(v, dict) else v)
            for k, v in decl.items()}
    with pytest.raises(ValueError, match=message):
        declared_bindings(model, GL_MIX, [decl])


def test_a_parameter_bound_twice_is_refused(bert):
    model, _ = bert
    with pytest.raises(ValueError, match=r"is bound twice, by gl_mix\[0\]:i=0 and gl_mix\[1\]:i=0; a parameter belongs"):
        declared_bindings(model, GL_MIX, [QK, QK])


def test_an_inner_placeholder_matches_one_name_segment(bert):
    """`{i}` inside a pattern is one segment: the MLP's output.dense pattern does not also match the attention's
    attention.output.dense (which would capture i = '0.attention')."""
    model, _ = bert
    decl = {"G": {"param": "bert.encoder.layer.{i}.output.dense.weight"},
            "H": {"param": "bert.encoder.layer.{i}.intermediate.dense.weight", "transpose": True}}
    found = declared_bindings(model, GL_MIX, [decl])
    assert [b.key for b in found] == ["gl_mix:i=0", "gl_mix:i=1"]


def test_keys_name_the_entry_when_there_are_several(bert):
    model, _ = bert
    one = {"G": QK["G"], "H": QK["H"]}
    two = {"G": {**QK["G"], "param": QK["G"]["param"].replace("query", "value"),
                 "bias": QK["G"]["bias"].replace("query", "value")},
           "H": {"param": "bert.encoder.layer.{i}.attention.output.dense.weight", "heads": 2}}
    keys = [b.key for b in declared_bindings(model, GL_MIX, [one, two])]
    assert keys == ["gl_mix[0]:i=0", "gl_mix[0]:i=1", "gl_mix[1]:i=0", "gl_mix[1]:i=1"]


def test_stray_braces_are_refused():
    with pytest.raises(ValueError, match=r"has braces that are no placeholder"):
        check_declarations(GL_MIX, [{"G": "layer.{0}.w", "H": "x"}])


def test_geodesic_sharpness_checks_a_declared_binding_before_using_it(bert):
    """Q/K declared without `transpose` on square weights: the shapes fit, the action is no symmetry, and the
    evaluator refuses it with the measured change instead of quotienting it."""
    from geosharp_ref.sharpness import geodesic_sharpness
    model, batch = bert
    wrong = {b: {k: v for k, v in e.items() if k not in ("transpose", "bias")} for b, e in QK.items()}
    found = declared_bindings(model, GL_MIX, [wrong])
    with pytest.raises(ValueError, match=r"not a symmetry of this model: acting on it changed the output by"):
        geodesic_sharpness(model, [batch], 0.05, n_iter=1, symmetries=found)
    good = declared_bindings(model, GL_MIX, [QK])
    assert geodesic_sharpness(model, [batch], 0.05, n_iter=1, symmetries=good).mean > 0
    assert all(b.checked for b in good)
