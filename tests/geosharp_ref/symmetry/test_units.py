"""ReLU units (geosharp_ref/symmetry/units.py): a GL(1) pair per hidden unit (the gl kernels with h = 1, batched
over units); a symmetry for positively homogeneous activations only, and MLP layouts detected by structure."""
import pytest
import torch

from geosharp_ref.symmetry import ReLUUnitsBinding, check_binding
from geosharp_ref.symmetry.units import mlp_candidates, relu_units_candidates
from tests import cases


RELU = ReLUUnitsBinding("0.weight", "2.weight", in_bias="0.bias")


def test_relu_units_are_a_symmetry_and_tanh_units_are_not():
    params = cases.params_of(cases.mlp64(torch.nn.ReLU))
    els = [RELU.random_element(params, scale=10.0 ** s, seed=s + 3) for s in (-2, 0, 2)]
    assert check_binding(cases.mlp64(torch.nn.ReLU), RELU, cases.mlp_batch64(), lambda o: o, els) < 1e-12
    with pytest.raises(ValueError, match="not a symmetry"):
        check_binding(cases.mlp64(torch.nn.Tanh), RELU, cases.mlp_batch64(), lambda o: o, els)


def test_extract_insert_round_trip_and_the_action_by_hand():
    params = cases.params_of(cases.mlp64(torch.nn.ReLU))
    G, H = RELU.extract(params)
    assert G.shape == (6, 5 + 1, 1) and H.shape == (6, 3, 1)
    back = RELU.insert(params, (G, H))
    assert all(torch.equal(back[n], params[n]) for n in params)
    a = RELU.random_element(params, scale=10.0, seed=0)
    moved = RELU.act(params, a)
    assert torch.allclose(moved["0.weight"], a[:, None] * params["0.weight"], rtol=1e-15)
    assert torch.allclose(moved["0.bias"], a * params["0.bias"], rtol=1e-15)
    assert torch.allclose(moved["2.weight"], params["2.weight"] / a[None, :], rtol=1e-15)
    assert torch.equal(moved["2.bias"], params["2.bias"])


@pytest.mark.parametrize("activation, relu", [(torch.nn.ReLU, True), (torch.nn.LeakyReLU, True),
                                              (torch.nn.Tanh, False)])
def test_mlp_detection_names_the_layers_and_refuses_non_homogeneous_activations(activation, relu):
    model = cases.mlp64(activation)
    ((path, n1, _, n2, _, act),) = mlp_candidates(model)
    assert (path, n1, n2) == ("", "0", "2") and isinstance(act, activation)
    ((key, b, reason),) = relu_units_candidates(model, metric="inv")
    assert key == "0.weight:relu-units"
    if relu:
        assert reason == "" and b.param_names == ("0.weight", "0.bias", "2.weight") and b.kernels == "gl_inv"
    else:
        assert b is None and reason == ("activation Tanh is not ReLU (not positively homogeneous): no "
                                        "unit-scaling symmetry")


def test_a_model_without_an_mlp_is_refused_with_the_layouts_looked_for():
    (cand,) = relu_units_candidates(torch.nn.Sequential(torch.nn.Linear(3, 2)))
    assert cand.key == "MLP" and cand.binding is None and "no MLP of a recognised layout" in cand.reason
