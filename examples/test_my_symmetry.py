"""A property test of your own symmetry: copy this file into your test suite and point it at your spec file.

``geosharp verify`` checks a declared symmetry at a few scales; this test lets hypothesis *search* the group
for an element that breaks it, and shrink any failure to a minimal one. It uses only the public API:

* the spec file's geometry is derived as docs/guides/declare.md shows (``geosharp derive --spec FILE --out DIR``, here
  through :func:`geosharp_ref.cli.main`; pass the generated module instead with ``GEOSHARP_SPEC=DIR/name.py``)
  and bound to the model's parameters by its ``BINDINGS`` (:func:`geosharp_ref.declared_bindings`);
* :mod:`geosharp_ref.testing` draws the group elements (``group_elements``: a scale a log-uniform in
  [10⁻², 10²] and a seed, well-conditioned) and the orbit points (``orbit_points``: every binding and the
  attention pairs that stay quotiented, moved at once), and asserts what must not change.

Three properties, for every drawn element:

1. ``assert_binding_exact`` — each declared binding leaves the model's log-probabilities unchanged
   (relative max-abs change ≤ 1e-10, float64): it *is* a symmetry;
2. ``assert_orbit_invariant`` — moving along all orbits at once changes neither the output nor geodesic
   sharpness on the quotient (relative change ≤ 1e-8);
3. ``assert_changes`` — adaptive sharpness, which does not quotient the symmetry, does change (> 1e-3).

Run it as it is (examples/lora_spec.py on a tiny peft-LoRA BERT)::

    pytest examples/test_my_symmetry.py

or on your own spec, metric, model and data (environment variables, or edit the constants below)::

    GEOSHARP_SPEC=my_spec.py GEOSHARP_METRIC=my_metric GEOSHARP_MODEL=path/to/model_dir \\
        GEOSHARP_DATA=data.pt pytest test_my_symmetry.py

A binding that is not a symmetry fails property 1 with hypothesis's shrunk example, e.g.::

    AssertionError: lora_hybrid:layer=…layer.0 is not a symmetry: the log-probabilities changed by 0.23
        (relative max-abs, float64) under ψ at GroupElement('lora_hybrid:layer=…layer.0', scale=1.0, seed=0);
        tolerance 1e-10
    Falsifying example: test_each_declared_binding_is_a_symmetry(      ("Failing test case:" in hypothesis
        subject=Subject(wrong_spec.py: lora_hybrid, 2 bindings),        ≥ 6.150)
        data=data(...),
    )
    Draw 1 (binding index): 0
    Draw 2 (element): GroupElement('lora_hybrid:layer=…layer.0', scale=1.0, seed=0)

``GroupElement(key, scale, seed)`` rebuilds the element: ``geosharp_ref.testing.group_element(binding,
params, scale, seed)``. Add ``--hypothesis-seed=0`` to pytest for the same search every run.
"""
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from geosharp_ref import declared_bindings, load_kernels
from geosharp_ref.cli import main as geosharp
from geosharp_ref.testing import (assert_binding_exact, assert_changes, assert_orbit_invariant, group_elements,
                                  kept_pairs, orbit_points, tiny_batch, tiny_model)

#: your spec file (SPEC and BINDINGS) or the module `geosharp derive --spec` generated from it
SPEC = Path(os.environ.get("GEOSHARP_SPEC", Path(__file__).with_name("lora_spec.py")))
#: the metric of the spec to test
METRIC = os.environ.get("GEOSHARP_METRIC", "lora_hybrid")
#: a saved model directory (Hugging Face format, or a peft adapter); unset: a tiny peft-LoRA BERT
MODEL_DIR = os.environ.get("GEOSHARP_MODEL")
#: a data file (torch.save({"inputs": …, "targets": …})); unset: a random batch that fits the model
DATA = os.environ.get("GEOSHARP_DATA")
#: examples hypothesis draws per property (the sharpness properties run Auto-PGD twice per example)
EXAMPLES = int(os.environ.get("GEOSHARP_EXAMPLES", "10"))
#: radius and Auto-PGD iterations of the sharpness properties
RHO, ITERS = 0.05, 3

#: hypothesis settings: no deadline (Auto-PGD takes seconds), no "explain" phase (it reruns a failure many times
#: to comment on which parts matter; the shrunk example is what you read)
SETTINGS = dict(max_examples=EXAMPLES, deadline=None,
                phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """The spec's geometry: `geosharp derive --spec SPEC --out DIR`, then load_kernels (as docs/guides/declare.md shows)."""
    if SPEC.read_text(encoding="utf-8").startswith("# GENERATED FILE"):  # already generated
        return load_kernels(SPEC)
    out = tmp_path_factory.mktemp("kernels")
    assert geosharp(["derive", "--spec", str(SPEC), "--out", str(out)]) == 0
    return load_kernels(out / f"{METRIC}.py")


@pytest.fixture(scope="module")
def model():
    """The model in float64 (the symmetry checks compare to round-off)."""
    if MODEL_DIR:
        from geosharp_ref import load_model

        m = load_model(MODEL_DIR)
    else:
        m = tiny_model("bert", lora=("query", "intermediate.dense"))
    return m.to(torch.float64).eval()


@pytest.fixture(scope="module")
def batch(model):
    """``(inputs, targets)``: the first 4 examples of DATA, or a random batch that fits the model."""
    if DATA:
        from geosharp_ref import load_data, split_batches

        inputs, targets, n = load_data(DATA)
        (b,) = split_batches(inputs, targets, 1, min(4, n), DATA)
        return b
    return tiny_batch(model, batch_size=4)


@pytest.fixture(scope="module")
def bindings(model, kernels):
    """One binding per match of the spec's BINDINGS (shapes checked; not yet checked to be a symmetry)."""
    found = declared_bindings(model, kernels, kernels.BINDINGS)
    assert found, f"{SPEC}: BINDINGS match no parameter of the model"
    return found


class Subject:
    """What the properties test: the model (float64), its batch and parameters, the spec's bindings. (One
    object with a short repr, so that a failing example prints the drawn elements, not the weights.)"""

    def __init__(self, model, batch, bindings):
        self.model, self.batch, self.bindings = model, batch, bindings
        self.params = {n: p.detach() for n, p in model.named_parameters()}

    def __repr__(self) -> str:
        return f"Subject({SPEC.name}: {METRIC}, {len(self.bindings)} bindings)"


@pytest.fixture(scope="module")
def subject(model, batch, bindings):
    return Subject(model, batch, bindings)


@settings(**SETTINGS)
@given(data=st.data())
def test_each_declared_binding_is_a_symmetry(subject, data):
    binding = subject.bindings[data.draw(st.integers(0, len(subject.bindings) - 1), label="binding index")]
    element = data.draw(group_elements(binding, subject.params), label="element")
    assert_binding_exact(subject.model, binding, subject.batch, element, tol=1e-10)


@settings(**SETTINGS)
@given(data=st.data())
def test_geodesic_sharpness_is_invariant_along_the_orbits(subject, data):
    # the attention pairs the quotient keeps (those sharing no parameter with a binding), and the bindings
    moving = [kept_pairs(subject.model, subject.bindings), *subject.bindings]
    point = data.draw(orbit_points(moving, subject.params), label="orbit point")
    assert_orbit_invariant(subject.model, subject.batch, moving, point, measure="geodesic-mix", rho=RHO,
                           n_iter=ITERS, rtol=1e-8)


@settings(**{**SETTINGS, "max_examples": max(1, EXAMPLES // 5)})
@given(data=st.data())
def test_adaptive_sharpness_is_not_invariant(subject, data):
    point = data.draw(orbit_points(subject.bindings, subject.params), label="orbit point")
    assert_changes(subject.model, subject.batch, subject.bindings, point, measure="adaptive", rho=RHO,
                   n_iter=ITERS, min_rtol=1e-3)
