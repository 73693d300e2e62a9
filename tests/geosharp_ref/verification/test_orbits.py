"""Orbit invariance of a whole model (geosharp_ref.verification.orbits) on the tiny BERT of tests/cases:
output, geodesic sharpness and Riemannian gradient norms do not move along GL(h) orbits, adaptive sharpness
does; a non-symmetry is caught; the gradient norm equals an independent autograd computation."""
import math
import warnings

import pytest
import torch

from geosharp_ref.sharpness import model_loss
from geosharp_ref.symmetry import NoAttentionPairsWarning, SymmetryMap, symmetry_map
from geosharp_ref.verification.orbits import (INVARIANCE_TOL, INVARIANT_QUANTITIES, QUANTITIES,
                                              model_with_params, orbit_invariance, orbit_quantities,
                                              relative_change, riemannian_gradient_norm)
from tests import cases

DT = torch.float64


def test_relative_change():
    assert relative_change(2.0, 2.0) == 0.0 and relative_change(0.0, 0.0) == 0.0
    assert relative_change(2.0, 2.5) == pytest.approx(0.25) and relative_change(-4.0, -3.0) == pytest.approx(0.25)
    assert relative_change(0.0, 1e-9) == math.inf
    a = torch.tensor([[1.0, -4.0], [2.0, 0.0]])
    assert relative_change(a, a + torch.tensor([[0.0, 0.0], [0.0, 0.2]])) == pytest.approx(0.05)  # max-abs


def test_bert_is_invariant_along_its_orbits_and_adaptive_is_not():
    M = cases.sharpness_case("bert")
    batch = M.make_batch(torch.Generator().manual_seed(0))
    state = {k: v.clone() for k, v in M.model.state_dict().items()}
    report = orbit_invariance(M.model, M.smap, batch, 0.05, scales=(0.1, 10.0), iters=2, seed=0)
    assert set(report["base"]) == set(QUANTITIES) and [a for a, _ in report["rows"]] == [0.1, 10.0]
    assert report["base"]["geodesic-mix"] > 0 and report["base"]["grad-inv"] > 0
    assert report["failed"] == []
    assert all(report["worst"][c] <= INVARIANCE_TOL for c in INVARIANT_QUANTITIES), report["worst"]
    assert report["worst"]["adaptive"] > INVARIANCE_TOL  # adaptive sharpness moves along the orbit
    for _, rel in report["rows"]:
        assert all(rel[c] <= report["worst"][c] for c in QUANTITIES)
    assert all(torch.equal(v, state[k]) for k, v in M.model.state_dict().items())  # untouched


def test_a_non_symmetry_fails(monkeypatch):
    M = cases.sharpness_case("bert")
    batch = M.make_batch(torch.Generator().manual_seed(1))
    monkeypatch.setattr(SymmetryMap, "act", lambda self, params, As: {k: 1.01 * v for k, v in params.items()})
    report = orbit_invariance(M.model, M.smap, batch, 0.05, scales=(1.0,), iters=1, seed=0)
    assert "output" in report["failed"] and report["worst"]["output"] > 1e-3


def test_gradient_norm_without_pairs_is_the_adaptive_one_and_model_with_params_copies():
    """No GL(h) pair: ‖grad L‖ is the adaptive geometry's, ‖|θ| ⊙ ∇L‖₂ (∇L by autograd here)."""
    torch.manual_seed(0)
    model = cases.mlp().to(DT)
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(6, 4, generator=gen, dtype=DT), torch.randint(0, 3, (6,), generator=gen))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
        smap = symmetry_map(model)
        vals = orbit_quantities(model, smap, batch, 0.1, iters=2, seed=0)
    assert not smap.groups
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(model_loss(model, params, batch), list(params.values()))
    expect = math.sqrt(sum(float(((p.detach().abs() * g) ** 2).sum()) for p, g in zip(params.values(), grads)))
    for metric in ("inv", "mix"):
        assert float(riemannian_gradient_norm(model, smap, batch, metric)) == pytest.approx(expect, rel=1e-10)
        assert vals[f"geodesic-{metric}"] == vals["adaptive"]  # no pair: geodesic sharpness is adaptive
    moved = model_with_params(model.train(), {k: 2 * v.detach() for k, v in params.items()})
    assert not moved.training and model.training
    for k, p in moved.named_parameters():
        assert torch.equal(p, 2 * params[k].detach()) and not torch.equal(p, params[k].detach())
