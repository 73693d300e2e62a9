"""The Binding protocol (geosharp_ref/symmetry/binding.py) and the exactness check (check.py), on every kind of
binding of the case table (tests/cases/bindings.py: BINDING_CASES; the one place these checks live): each
satisfies the protocol, cuts blocks that insert back exactly, acts as a symmetry (its own random elements,
two per scale 1e-2 and 1e2, float64, relative tolerance 1e-10), and a change of the bound parameters that no
group element makes (scaling only the G block, or only one of the scaled parameters) changes the output."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from geosharp_ref.kernels import load_kernels
from geosharp_ref.symmetry import Binding, check_binding, check_symmetry
from geosharp_ref.symmetry.binding import claim
from geosharp_ref.forward import float64_inputs
from geosharp_ref.symmetry.check import CHECK_SCALES, CHECK_TOL
from tests.cases import BINDING_CASES, BINDING_KINDS, BINDING_NAMES, build_binding_case, output_at


def _built(name):
    case = next(c for c in BINDING_CASES if c.name == name)
    for package in case.requires:
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed")
    built = build_binding_case(name)
    assert built.bindings, f"{name}: no {case.kind} binding found"
    return built


def test_the_table_has_every_kind():
    assert {c.kind for c in BINDING_CASES} == set(BINDING_KINDS)
    assert len(set(BINDING_NAMES)) == len(BINDING_NAMES)


@pytest.mark.parametrize("name", BINDING_NAMES)
def test_every_binding_satisfies_the_protocol_and_its_geometry_fits(name):
    built = _built(name)
    for b in built.bindings:
        assert isinstance(b, Binding), type(b)
        assert set(b.param_names) <= set(built.params)
        blocks = b.extract(built.params)
        module = load_kernels(b.kernels)
        assert isinstance(blocks, tuple) and len(blocks) == len(module.BLOCKS)
        back = b.insert(built.params, blocks)
        assert set(back) == set(built.params)
        assert all(torch.equal(back[n], built.params[n]) for n in built.params)


@pytest.mark.parametrize("name", BINDING_NAMES)
def test_every_binding_is_exact_and_a_change_that_is_no_symmetry_is_seen(name):
    built = _built(name)
    out = built.case.output
    base = output_at(built.model, built.params, built.batch, out)
    for i, b in enumerate(built.bindings):
        elements = [b.random_element(built.params, scale=a, seed=10 * i + j) for a in CHECK_SCALES for j in range(2)]
        worst = check_binding(built.model, b, built.batch, out, elements, tol=CHECK_TOL)
        assert worst <= CHECK_TOL, (b.key, worst)
        broken = built.case.breaks(b, built.params)
        assert any(not torch.equal(broken[n], built.params[n]) for n in b.param_names), b.key
        change = float((output_at(built.model, broken, built.batch, out) - base).abs().max() / base.abs().max())
        assert change > 1e-4, (b.key, change)


def test_check_symmetry_refuses_with_the_measured_change():
    built = _built("bert-head-translation")
    (b,) = built.bindings
    assert check_symmetry(built.model, b, built.batch) <= CHECK_TOL
    with pytest.raises(ValueError, match=r"binding classifier\.weight:translation is not a symmetry of this model: "
                                         r"acting on it changed the output by .* \(relative, float64; tolerance 1e-10\)"):
        check_binding(built.model, b, built.batch, lambda o: o.logits,
                      [b.random_element(built.params, scale=a) for a in CHECK_SCALES])


def test_float64_inputs_cast_floating_tensors_only():
    x = {"pixel_values": torch.ones(2, dtype=torch.float32), "input_ids": torch.ones(2, dtype=torch.long)}
    y = float64_inputs(x)
    assert y["pixel_values"].dtype == torch.float64 and y["input_ids"].dtype == torch.long
    assert float64_inputs(torch.ones(1)).dtype == torch.float64


def test_claim_enforces_one_parameter_one_symmetry():
    class B:
        def __init__(self, key, names):
            self.key, self.param_names = key, names

    owner = {}
    claim(owner, B("a:one", ("w", "b")))
    assert owner == {"w": "a:one", "b": "a:one"}
    with pytest.raises(ValueError, match=r"^parameter 'b' is bound twice, by a:one and c:two; a parameter belongs to "
                                         r"one symmetry$"):
        claim(owner, B("c:two", ("v", "b")))
