"""geosharp_ref.testing: the strategies draw well-conditioned elements of every kind of binding and shrink, the
assertions say what they compare, and the example test a user copies (examples/test_my_symmetry.py) passes on
examples/lora_spec.py and fails, with hypothesis's shrunk example, on a spec whose binding is not a symmetry."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings

from geosharp_ref.sharpness import build_space
from geosharp_ref.symmetry import symmetry_map
from geosharp_ref.testing import (Counterexample, Float64Copy, GroupElement, OrbitPoint, assert_binding_exact,
                                  assert_changes, assert_orbit_invariant, find_counterexample, group_element,
                                  group_elements, horizontal_tangents, orbit_points, scales, small_models,
                                  tiny_batch, tiny_model, with_lora)
from tests import cases
from tests.cases import ROOT

EXAMPLE = ROOT / "examples" / "test_my_symmetry.py"
LORA_SPEC = ROOT / "examples" / "lora_spec.py"


@pytest.fixture(scope="module")
def bert():
    """A tiny float64 BERT, its batch and its attention pairs."""
    model = tiny_model("bert").to(torch.float64)
    return model, tiny_batch(model), symmetry_map(model)


# -- strategies -------------------------------------------------------------------------------------------------

@given(a=scales())
def test_scales_stay_in_the_range(a):
    assert 1e-2 <= a <= 1e2


def test_scales_are_log_uniform_and_checked():
    drawn = []
    find_counterexample(lambda a: drawn.append(a), scales(), examples=200, seed=0)
    assert sum(a < 1 for a in drawn) > 40 and sum(a > 1 for a in drawn) > 40  # as many below 1 as above
    assert sum(a < 0.1 for a in drawn) > 10  # the lower decade is not starved, as uniform a would be
    for lo, hi in ((0, 1), (2, 1), (1, math.inf)):
        with pytest.raises(ValueError, match="scales need 0 < lo <= hi"):
            scales(lo, hi)


@pytest.mark.parametrize("name", [c.name for c in cases.BINDING_CASES])
def test_group_elements_of_every_kind_of_binding_are_exact(name):
    """Built-in and declared bindings: the drawn elements leave the case's model unchanged (the float64
    check's tolerance), and the same scale and seed give the same element."""
    case = next(c for c in cases.BINDING_CASES if c.name == name)
    for pkg in case.requires:
        pytest.importorskip(pkg)
    built = cases.build_binding_case(name)
    binding = built.bindings[0]
    ref = Float64Copy(built.model, built.batch)

    @settings(max_examples=5, deadline=None)
    @given(element=group_elements(binding, built.params))
    def exact(element):
        assert isinstance(element, GroupElement) and element.key == binding.key
        assert repr(element) == f"GroupElement({binding.key!r}, scale={element.scale!r}, seed={element.seed})"
        assert assert_binding_exact(ref, binding, built.batch, element) <= 1e-10
        again = group_element(binding, built.params, element.scale, element.seed).value
        assert _same(again, element.value)

    exact()


def _same(x, y):
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return torch.equal(torch.as_tensor(x), torch.as_tensor(y))


def test_orbit_points_move_every_binding_at_once(bert):
    model, _, smap = bert
    params = {n: p.detach() for n, p in model.named_parameters()}
    pairs = list(smap.groups)

    @settings(max_examples=5, deadline=None)
    @given(point=orbit_points(pairs, params))
    def moved(point):
        assert isinstance(point, OrbitPoint) and repr(point).startswith(f"OrbitPoint(scale={point.scale!r}")
        assert [e.seed for e in point.elements] == [point.seed + j for j in range(len(pairs))]
        by_hand = params
        for g, e in zip(pairs, point.elements):
            by_hand = g.act(by_hand, group_element(g, params, point.scale, e.seed).value)
        assert all(torch.equal(by_hand[n], point.params[n]) for n in params)
        assert any(not torch.equal(point.params[n], params[n]) for n in params)

    moved()
    with pytest.raises(ValueError, match="at least one binding"):
        orbit_points([], params)


def test_horizontal_tangents_are_horizontal(bert):
    model, _, smap = bert
    params = {n: p.detach() for n, p in model.named_parameters()}
    space = build_space(params, smap, "mix")

    @settings(max_examples=5, deadline=None)
    @given(t=horizontal_tangents(space, rho=0.1))
    def horizontal(t):
        again = space.project_horizontal(t.xi)
        assert float(space.norm(t.xi)) <= 0.1 * (1 + 1e-12)
        assert all(torch.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in zip(again, t.xi))

    horizontal()


@pytest.mark.parametrize("kind, pairs", [("bert", 4), ("gpt2", 4), ("vit", 4), ("mlp", 0)])
def test_tiny_models_and_their_batches(kind, pairs):
    model = tiny_model(kind, seed=1)
    inputs, targets = tiny_batch(model, batch_size=3)
    ref = Float64Copy(model, (inputs, targets))
    assert ref.base.shape == (3, 3) and targets.shape == (3,)
    assert len(symmetry_map(ref.model).groups) == pairs
    with pytest.raises(ValueError, match="unknown tiny model kind 'resnet'"):
        tiny_model("resnet")


def test_with_lora_gives_an_adapter_that_matters():
    """``tiny_model(kind, lora=…)`` is ``with_lora(tiny_model(kind), …)``; its lora_B come from ``seed`` alone
    (lora_A from torch's generator), and switching the adapter off changes the log-probabilities."""
    pytest.importorskip("peft")
    targets = ("query", "intermediate.dense")
    model = tiny_model("bert", seed=3, lora=targets, lora_rank=3)
    composed = with_lora(tiny_model("bert", seed=3), targets, rank=3, seed=3)
    params = dict(model.named_parameters())
    assert params.keys() == dict(composed.named_parameters()).keys()
    assert all(torch.equal(params[n], p) for n, p in composed.named_parameters())
    lora_b = {n: p for n, p in params.items() if "lora_B" in n}
    assert len(lora_b) == 4 and all(p.shape[1] == 3 for p in lora_b.values())
    other = dict(with_lora(tiny_model("bert", seed=3), targets, rank=3, seed=4).named_parameters())
    assert all(not torch.equal(other[n], p) for n, p in lora_b.items())
    assert all(torch.equal(other[n], p) for n, p in params.items() if "lora_A" in n)
    inputs, _ = tiny_batch(model)
    on = model(**inputs).logits.log_softmax(-1)
    with model.disable_adapter():
        off = model(**inputs).logits.log_softmax(-1)
    assert (on - off).abs().max() > 1e-2 * on.abs().max()


def test_small_models_draws_a_model():
    drawn = []
    find_counterexample(lambda m: drawn.append(type(m).__name__), small_models(("bert", "mlp")), examples=2, seed=0)
    assert set(drawn) <= {"BertForSequenceClassification", "Sequential"} and drawn


# -- assertions -------------------------------------------------------------------------------------------------

def test_assert_binding_exact_says_what_changed(bert):
    model, batch, smap = bert
    params = {n: p.detach() for n, p in model.named_parameters()}
    g = smap.groups[0]
    element = group_element(g, params, 100.0, 3)
    assert assert_binding_exact(model, g, batch, element) <= 1e-10
    broken = GroupElement(g.key, 1.0, 0, torch.eye(g.head_dim, dtype=torch.float64).repeat(g.num_heads, 1, 1))

    class Wrong:  # acts on the pair and scales the classifier: not a symmetry
        key = "wrong"

        def act(self, p, A):
            return {n: (1.5 * v if n == "classifier.weight" else v) for n, v in g.act(p, A).items()}

    with pytest.raises(AssertionError, match=r"wrong is not a symmetry: the log-probabilities changed by [0-9.e+-]+ "
                                             r"\(relative max-abs, float64\) under ψ at GroupElement\(.*scale=1.0, "
                                             r"seed=0\); tolerance 1e-10"):
        assert_binding_exact(model, Wrong(), batch, broken)


def test_assert_orbit_invariant_and_the_adaptive_contrast(bert):
    model, batch, smap = bert
    params = {n: p.detach() for n, p in model.named_parameters()}
    point = _point(smap, params, 30.0, 5)
    out = assert_orbit_invariant(model, batch, [smap], point, measure="geodesic-inv", n_iter=2, rtol=1e-8)
    assert out["output"] <= 1e-10 and out["geodesic-inv"] <= 1e-8 and out["value"] > 0
    assert assert_changes(model, batch, [smap], point, n_iter=2) > 1e-3
    with pytest.raises(AssertionError, match=r"adaptive sharpness \(rho 0.05, 2 Auto-PGD iterations, float64\) "
                                             r"changed by [0-9.e+-]+ \(relative: .*\) along the orbit at "
                                             r"GroupElement\('attention GL\(h\) pairs \(4\)', scale=30.0, seed=5\); "
                                             r"tolerance 1e-08"):
        assert_orbit_invariant(model, batch, [smap], point, measure="adaptive", n_iter=2)
    with pytest.raises(AssertionError, match=r"geodesic-mix sharpness .* changed by only [0-9.e+-]+ .*; expected more "
                                             r"than 0.001"):
        assert_changes(model, batch, [smap], point, measure="geodesic-mix", n_iter=2)
    with pytest.raises(ValueError, match="unknown measure 'sharp'"):
        assert_orbit_invariant(model, batch, [smap], point, measure="sharp")
    with pytest.raises(ValueError, match="2 group elements for 1 bindings"):
        assert_orbit_invariant(model, batch, [smap], [point.elements[0]] * 2)


def _point(smap, params, scale, seed):
    return OrbitPoint(scale, seed, (smap,), (group_element(smap, params, scale, seed),), {})


# -- the search -------------------------------------------------------------------------------------------------

def test_find_counterexample_shrinks_and_is_derandomized(bert):
    model, batch, smap = bert
    params = {n: p.detach() for n, p in model.named_parameters()}
    g = smap.groups[0]
    assert find_counterexample(lambda e: None, group_elements(g, params), examples=5, seed=0) is None

    def small_only(e):
        assert e.scale < 3, f"scale {e.scale} too large"

    found = find_counterexample(small_only, group_elements(g, params), examples=50, seed=4)
    # shrunk: seed 0, and the simplest failing log10 a (hypothesis prefers integers: a = 10)
    assert isinstance(found, Counterexample) and found.example.seed == 0 and 3 <= found.example.scale <= 10
    assert found.message == f"scale {found.example.scale} too large"
    again = find_counterexample(small_only, group_elements(g, params), examples=50, seed=4)
    assert again.example.scale == found.example.scale
    with pytest.raises(ValueError, match="positive integer"):
        find_counterexample(small_only, scales(), examples=0)


# -- the example test a user copies -------------------------------------------------------------------------------

#: examples/lora_spec.py with B of each layer's MLP adapter paired with A of the same layer's query adapter: shapes
#: fit, but the action changes both adapters' products
WRONG_SPEC = (LORA_SPEC.read_text()
              .replace('"B": "{adapter}.lora_B.default.weight"', '"B": "{layer}.intermediate.dense.lora_B.default.weight"')
              .replace('"{adapter}.lora_A.default.weight"', '"{layer}.attention.self.query.lora_A.default.weight"'))


def _run_example(tmp_path, spec):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GEOSHARP_SPEC": str(spec), "GEOSHARP_EXAMPLES": "3"}
    env.pop("HYPOTHESIS_PROFILE", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0",
                           "-W", "ignore::FutureWarning", str(EXAMPLE)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_example_passes_on_the_lora_spec(tmp_path):
    pytest.importorskip("peft")
    rc, out = _run_example(tmp_path, LORA_SPEC)
    assert rc == 0 and "3 passed" in out, out


def test_the_example_fails_with_a_shrunk_counterexample_on_a_spec_that_is_no_symmetry(tmp_path):
    pytest.importorskip("peft")
    spec = tmp_path / "wrong_spec.py"
    spec.write_text(WRONG_SPEC)
    rc, out = _run_example(tmp_path, spec)
    assert rc == 1 and "2 failed, 1 passed" in out, out  # adaptive sharpness still changes
    # hypothesis's report of the shrunk example ("Falsifying example" before 6.150, "Failing test case" since)
    assert re.search(r"(Falsifying example|Failing test case): test_each_declared_binding_is_a_symmetry\(", out), out
    assert re.search(r"Draw 2 \(element\): GroupElement\('lora_hybrid:layer=base_model\.model\.bert\.encoder\.layer\.0',"
                     r" scale=1\.0, seed=0\)", out), out
    assert re.search(r"is not a symmetry: the log-probabilities changed by [0-9.e+-]+ \(relative max-abs, float64\)"
                     r" under ψ at .*; tolerance 1e-10", out), out
    assert re.search(r"Draw 1 \(orbit point\): OrbitPoint\(scale=1\.0, seed=0, bindings=3\)", out), out
