"""The softmax translation of a classifier head (geosharp_ref/symmetry/heads.py): its action leaves the class
probabilities unchanged (checked in float64 and refused where the output is not a softmax), its detection
finds the head, and a ProductSpace with the GL(h) pair factors plus the translation factor gives geodesic
sharpness that is invariant under both symmetries at once, while adaptive sharpness is not."""
import pytest
import torch

from geosharp_ref.apgd import apgd
from geosharp_ref.sampling import draw_orbit_elements
from geosharp_ref.sharpness import Factor, ProductSpace, gl_pair_factors
from geosharp_ref.forward import model_loss
from geosharp_ref.sharpness.measures import adaptive_sharpness, geodesic_sharpness
from geosharp_ref.symmetry import HeadTranslationBinding, check_binding, symmetry_map
from geosharp_ref.symmetry.heads import head_candidate, head_translation_candidates
from geosharp_ref.verification.orbits import model_with_params
from tests import cases


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
    params = cases.params_of(model)
    els = [b.random_element(params, scale=s, seed=i) for i, s in enumerate((1e-2, 1.0, 1e2))]
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
    moved = b.act(moved, b.random_element(params, scale=scale, seed=4))
    m2 = model_with_params(model, moved)
    s0 = _geodesic(model, smap, b, batch)
    s1 = _geodesic(m2, smap, b, batch)
    assert s0 > 0
    assert abs(s1 - s0) <= 1e-8 * abs(s0)
    a0 = adaptive_sharpness(model, [batch], 0.05, n_iter=4).mean
    a1 = adaptive_sharpness(m2, [batch], 0.05, n_iter=4).mean
    assert abs(a1 - a0) > 1e-6 * abs(a0)


def test_entry_point_with_head_translation_is_invariant_and_reports_its_factor(bert):
    model, batch = bert
    smap = symmetry_map(model)
    b = HeadTranslationBinding("classifier.weight", "classifier.bias")
    params = cases.params_of(model)
    moved = smap.act(params, draw_orbit_elements(smap, 100.0, torch.Generator().manual_seed(3)))
    moved = model_with_params(model, b.act(moved, b.random_element(params, scale=100.0, seed=4)))
    r0 = geodesic_sharpness(model, [batch], 0.05, metric="mix", n_iter=4, symmetries=[b])
    r1 = geodesic_sharpness(moved, [batch], 0.05, metric="mix", n_iter=4, symmetries=[b])
    assert r0.mean > 0 and r1.mean == pytest.approx(r0.mean, rel=1e-8)
    assert r0.config["factors"][-1] == "classifier.weight:translation"
    assert r0.mean == pytest.approx(_geodesic(model, smap, b, batch, n_iter=4), rel=1e-10)  # = the space run by hand


def test_the_head_is_the_last_linear_with_one_output_per_logit(bert):
    """Detection against the model's own names: BERT's classifier is nn.Linear(hidden, num_labels), bias on."""
    model, batch = bert
    (name, module), width = head_candidate(model, batch)
    assert name == "classifier" and width == model.config.num_labels == module.out_features
    ((key, b, reason),) = head_translation_candidates(model, batch)
    assert key == "classifier.weight:translation" and reason == ""
    assert b.param_names == ("classifier.weight", "classifier.bias") and b.kernels == "translation"


def test_a_plain_mlp_head_is_found_and_one_logit_is_refused():
    """An MLP whose output width 3 matches its last Linear: found; a single logit: refused."""
    torch.manual_seed(0)
    mlp = cases.mlp(torch.nn.ReLU)
    batch = (torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1]))
    ((key, b, _),) = head_translation_candidates(mlp, batch)
    last = [n for n, m in mlp.named_modules() if isinstance(m, torch.nn.Linear)][-1]
    assert key == f"{last}.weight:translation" and b.param_names == (f"{last}.weight", f"{last}.bias")
    one = torch.nn.Sequential(torch.nn.Linear(4, 1))
    assert head_translation_candidates(one, batch) == [("0.weight:translation", None,
                                                        "one logit: no softmax over classes")]
