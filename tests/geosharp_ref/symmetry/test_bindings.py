"""Sharpness on the quotient by one symmetry family alone (ReLU units, LoRA adapters, a ViT's pre-LN stream
scaling; the attention pairs left adaptive): unchanged when the model moves along the symmetry's orbit, all
three through one evaluation (:func:`quotient_sharpness`: the space from ``build_space``, Auto-PGD from the
pipeline's zero start). The bindings' own tests are in test_units.py, test_adapters.py and test_norms.py."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geosharp_ref.apgd import apgd
from geosharp_ref.forward import model_loss
from geosharp_ref.sharpness import build_space
from geosharp_ref.sharpness.measures import adaptive_sharpness
from geosharp_ref.symmetry import ReLUUnitsBinding, lora_bindings, norm_scaling_bindings
from geosharp_ref.verification.orbits import model_with_params
from tests import cases


RELU = ReLUUnitsBinding("0.weight", "2.weight", in_bias="0.bias")


def quotient_sharpness(model, batch, bindings, rho, n_iter):
    """max L(E(ξ)) − L(θ) over the horizontal ρ-ball of the space quotienting ``bindings`` only (every other
    parameter adaptive)."""
    params = cases.params_of(model)
    space = build_space(params, symmetries=bindings)
    res = apgd(space.value_and_grad(lambda q: model_loss(model, q, batch)), space, rho, n_iter=n_iter)
    return res.best_value - float(model_loss(model, params, batch))


@given(log10_scale=st.floats(-2.0, 2.0), seed=st.integers(0, 2 ** 16))
@settings(max_examples=6)
def test_sharpness_on_the_relu_quotient_is_invariant(log10_scale, seed):
    model, batch = cases.mlp64(torch.nn.ReLU), cases.mlp_batch64(1)
    params = cases.params_of(model)
    a = RELU.random_element(params, scale=10.0 ** log10_scale, seed=seed)
    moved = model_with_params(model, RELU.act(params, a))

    s0, s1 = (quotient_sharpness(m, batch, [RELU], 0.1, 5) for m in (model, moved))
    assert s0 > 0 and abs(s1 - s0) <= 1e-8 * abs(s0)


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

    s0, s1 = (quotient_sharpness(m, batch, found, 0.05, 4) for m in (model, m2))
    assert s0 > 0 and abs(s1 - s0) <= 1e-8 * abs(s0)
    a0, a1 = (adaptive_sharpness(m, [batch], 0.05, n_iter=4).mean for m in (model, m2))
    assert abs(a1 - a0) > 1e-4 * a0


LOGITS = lambda o: o.logits  # noqa: E731


def _a(value):
    return torch.tensor([value], dtype=torch.float64)


def test_sharpness_on_the_vit_stream_quotient_is_invariant():
    torch.manual_seed(0)
    model = cases.vit(initializer_range=cases.IR, layer_norm_eps=0.0).to(torch.float64).eval()
    batch = cases.pixels_batch64()
    (b,), _ = norm_scaling_bindings(model, batch, LOGITS)
    moved = model_with_params(model, b.act(cases.params_of(model), _a(1e2)))

    s0, s1 = (quotient_sharpness(m, batch, [b], 0.05, 4) for m in (model, moved))
    assert s0 > 0 and abs(s1 - s0) <= 1e-8 * abs(s0)
