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


def _llama_case():
    """A tiny float64 Llama (float32 initialisation: θ is float32-exact) with RoPE Q/K, V/O and gated units, and a
    causal-LM batch."""
    torch.manual_seed(0)
    model = cases.models.llama(initializer_range=0.5).double().eval()
    ids = torch.randint(3, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    return model, ({"input_ids": ids}, torch.cat([ids[:, 1:], torch.full((3, 1), -100)], 1))


@pytest.mark.parametrize("float32_exact", [True, False])
def test_parameters_moved_to_releases_the_theta_it_replaces(float32_exact, tmp_path, monkeypatch):
    """Within ``parameters_moved_to`` the model holds the moved tensors and θ's storage of every replaced parameter
    is released (θ waits in an anonymous temporary file; the dict holds storage-less meta tensors); on exit the model
    and the dict hold θ again, bit for bit, in the same tensor objects, the unreplaced tensors were never copied,
    and nothing is left in the temporary directory (with θ float32-exact or not)."""
    import gc
    import tempfile
    from torch.multiprocessing.reductions import StorageWeakRef
    from geosharp_ref.verification.orbits import parameters_moved_to
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model, _ = _llama_case()
    if not float32_exact:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-12 * torch.randn_like(p))
    theta = {n: p.detach() for n, p in model.named_parameters()}
    before = {n: t.clone() for n, t in theta.items()}
    names = list(theta)
    moved = {n: (3 * t if i % 2 else t) for i, (n, t) in enumerate(theta.items())}
    replaced = [n for i, n in enumerate(names) if i % 2]
    storage = {n: StorageWeakRef(theta[n].untyped_storage()) for n in names}
    objects = dict(theta)
    present = set(tmp_path.iterdir())  # (torch may keep its own cache directory there)
    with parameters_moved_to(model, theta, moved):
        gc.collect()
        for n, p in model.named_parameters():
            assert p.data_ptr() == moved[n].data_ptr()
        assert all(storage[n].expired() for n in replaced)
        assert not any(storage[n].expired() for n in names if n not in replaced)  # shared, not copied
        assert all(theta[n].is_meta and theta[n].shape == before[n].shape for n in replaced)
    for n, p in model.named_parameters():
        assert p.dtype == DT and torch.equal(p, before[n]) and p.data_ptr() == theta[n].data_ptr()
        assert theta[n] is objects[n]  # the same tensor objects, θ's values back in them
    assert set(tmp_path.iterdir()) == present


def test_parameters_moved_to_restores_theta_when_the_block_raises(tmp_path, monkeypatch):
    """An exception inside the block still gives the model and the dict θ back, bit for bit."""
    import tempfile
    from geosharp_ref.verification.orbits import parameters_moved_to
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model, _ = _llama_case()
    theta = {n: p.detach() for n, p in model.named_parameters()}
    before = {n: t.clone() for n, t in theta.items()}
    present = set(tmp_path.iterdir())
    with pytest.raises(RuntimeError, match="inside"):
        with parameters_moved_to(model, theta, {n: 2 * t for n, t in theta.items()}):
            raise RuntimeError("inside")
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) and torch.equal(theta[n], before[n])
    assert set(tmp_path.iterdir()) == present


def test_orbit_invariance_measures_moved_points_without_the_float64_theta_they_replace(monkeypatch):
    """On a tiny Llama with every symmetry, each moved point is measured while θ's float64 tensors of the moved
    parameters are released (the old swap kept them alive beside the moved ones); the table is unchanged by it
    (the same moved points and values as measuring a deep copy of the model at each point), and the model holds θ
    bit for bit after."""
    import gc
    from torch.multiprocessing.reductions import StorageWeakRef
    from geosharp_ref.symmetry import find_symmetries
    from geosharp_ref.verification import orbits
    model, batch = _llama_case()
    smap = symmetry_map(model)
    bindings = find_symmetries(model, batch, metric="mix", seed=0).bindings
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    storage = {n: StorageWeakRef(p.untyped_storage()) for n, p in model.named_parameters()}
    released, points, real = [], [], orbits.orbit_quantities

    def recording(m, *args, **kw):
        gc.collect()
        moved = [n for n, p in m.named_parameters() if not torch.equal(p, theta[n])]
        if moved:
            released.append(all(storage[n].expired() for n in moved))
            points.append({n: p.detach().clone() for n, p in m.named_parameters()})
        return real(m, *args, **kw)
    monkeypatch.setattr(orbits, "orbit_quantities", recording)
    report = orbits.orbit_invariance(model, smap, batch, 0.05, scales=(0.1, 10.0), iters=2, seed=0,
                                     symmetries=bindings)
    assert released == [True, True]
    assert report["failed"] == [] and report["worst"]["adaptive"] > INVARIANCE_TOL
    for n, p in model.named_parameters():
        assert torch.equal(p, theta[n])
    base = real(model, smap, batch, 0.05, 2, 0, bindings)
    for (a, rel), point in zip(report["rows"], points):  # the moved point measured on a deep copy
        vals = real(model_with_params(model, point), smap, batch, 0.05, 2, 0, bindings)
        for c in QUANTITIES:
            assert rel[c] == relative_change(base[c], vals[c])
