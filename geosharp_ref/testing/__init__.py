r"""Property tests of parameter symmetries: hypothesis strategies and assertion helpers for your own suite.

A symmetry ψ of a model must leave its function unchanged, f(ψ(a, θ)) = f(θ), for **every** group element
a, and geodesic sharpness, measured on the quotient by ψ, must then not change along the orbit either. This
module lets a test suite search for a counterexample with `hypothesis <https://hypothesis.readthedocs.io>`_
(and shrink it to a minimal one) instead of checking a few fixed elements::

    from hypothesis import given, settings, strategies as st
    from geosharp_ref.testing import assert_binding_exact, group_elements

    @settings(max_examples=20, deadline=None)
    @given(data=st.data())
    def test_my_binding_is_a_symmetry(data):
        element = data.draw(group_elements(binding, params))   # GroupElement(key, scale=…, seed=…)
        assert_binding_exact(model, binding, batch, element)     # log-probabilities unchanged, ≤ 1e-10

``examples/test_my_symmetry.py`` is a complete test a user copies for a spec file; ``geosharp verify
--examples N`` runs the same search from the command line (:func:`find_counterexample`).

**Strategies** (every draw is a few integers and floats, so hypothesis shrinks it; the tensors are built
from them and the drawn value prints as ``GroupElement('key', scale=1.0, seed=0)``):

* :func:`scales` — a ∈ [lo, hi] log-uniform (default [10⁻², 10²], the range the exactness check spans);
* :func:`seeds` — integer seeds of the elements' random draws;
* :func:`group_elements` — :class:`GroupElement` of any binding (built-in, declared, a
  :class:`~geosharp_ref.symmetry.PairGroup`, or a whole :class:`~geosharp_ref.symmetry.SymmetryMap`): the
  binding's own ``random_element(params, scale, seed)`` (well-conditioned: condition number ≤ 4 for GL(h),
  so the size of the element is the scale a), :func:`~geosharp_ref.sampling.draw_orbit_elements` for a map;
* :func:`orbit_points` — one :class:`OrbitPoint`: every given binding moved at once (one scale a, seeds
  seed, seed + 1, …), with the moved parameters;
* :func:`horizontal_tangents` — random horizontal tangents of a
  :class:`~geosharp_ref.sharpness.ProductSpace` (e.g. from :func:`~geosharp_ref.sharpness.build_space`);
* :func:`small_models` — tiny Hugging Face models (:func:`tiny_model`: BERT, GPT-2, ViT; an MLP), with
  :func:`tiny_batch` a batch that fits them and :func:`with_lora` a LoRA adapter on one.

**Assertions** (each says what it compares, the measured relative change and the tolerance; each works on a
float64 copy and returns the change it measured):

========================================  ==============================================================
:func:`assert_binding_exact`              log-probabilities of the model, unchanged by ψ(a, ·): relative
                                          max-abs change ≤ ``tol`` (default 1e-10, the check every binding
                                          passes, :data:`~geosharp_ref.symmetry.check.CHECK_TOL`)
:func:`assert_orbit_invariant`            the output as above (≤ ``output_tol``), then geodesic sharpness on
                                          the quotient by the bindings (``measure``, Auto-PGD with ``rho``,
                                          ``n_iter``, a fixed seed): relative change ≤ ``rtol`` (1e-8)
:func:`assert_changes`                    the contrast: a measure that is not invariant (default adaptive
                                          sharpness) changes by more than ``min_rtol`` (1e-3)
========================================  ==============================================================

The relative change of a number s is |s(ψ(a, θ)) − s(θ)| / |s(θ)|; of a tensor, its max-abs over max-abs.
"""
from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from ..forward import call_model, float64_inputs
from ..sampling import draw_orbit_elements
from ..sharpness import adaptive_sharpness, geodesic_sharpness
from ..symmetry import NoAttentionPairsWarning, Quotient, SymmetryMap, symmetry_map
from ..symmetry.check import CHECK_TOL, log_probabilities
from ..verification.orbits import model_with_params, relative_change
from .models import small_models, tiny_batch, tiny_model, with_lora

__all__ = ["GroupElement", "OrbitPoint", "HorizontalTangent", "Counterexample", "Float64Copy", "scales", "seeds",
           "group_element", "group_elements", "orbit_points", "horizontal_tangents", "small_models", "tiny_model",
           "with_lora", "tiny_batch", "kept_pairs", "assert_binding_exact", "assert_orbit_invariant", "assert_changes",
           "find_counterexample", "MEASURES", "SCALE_RANGE", "OUTPUT_TOL", "SHARPNESS_RTOL", "CONTRAST_RTOL"]

#: the scales a the strategies draw from by default (the exactness check acts at both ends)
SCALE_RANGE = (1e-2, 1e2)
#: the largest relative change of the log-probabilities that counts as unchanged (float64)
OUTPUT_TOL = CHECK_TOL
#: the largest relative change of geodesic sharpness along an orbit that counts as unchanged (float64)
SHARPNESS_RTOL = 1e-8
#: the smallest relative change of adaptive sharpness :func:`assert_changes` requires by default
CONTRAST_RTOL = 1e-3
#: the measures the assertions compute: geodesic (quotient metric of the attention pairs inv/mix) or adaptive
MEASURES = ("geodesic-mix", "geodesic-inv", "adaptive")
_MAX_SEED = 2**32 - 1


# -- drawn values ---------------------------------------------------------------------------------------------

def _key(binding) -> str:
    if isinstance(binding, SymmetryMap):
        return f"attention GL(h) pairs ({len(binding.groups)})"
    return str(getattr(binding, "key", type(binding).__name__))


@dataclass(frozen=True, eq=False)
class GroupElement:
    """A group element of one binding, drawn at ``scale`` with ``seed`` (``value``: what ``binding.act``
    takes). Its repr is what a failing example prints: ``GroupElement('key', scale=1.0, seed=0)``, enough to
    rebuild it with :func:`group_element`."""

    key: str
    scale: float
    seed: int
    value: object

    def __repr__(self) -> str:
        return f"GroupElement({self.key!r}, scale={self.scale!r}, seed={self.seed})"

    def _repr_pretty_(self, printer, cycle):  # hypothesis prints failing examples with its pretty printer
        printer.text(repr(self))


@dataclass(frozen=True, eq=False)
class OrbitPoint:
    """Every binding of ``bindings`` moved at once: ``elements[j]`` acts with ``bindings[j]`` (scale ``scale``,
    seed ``seed + j``); ``params``: the moved parameters ψ(a, θ). Prints as ``OrbitPoint(scale=…, seed=…)``."""

    scale: float
    seed: int
    bindings: tuple
    elements: tuple
    params: dict

    def act(self, params) -> dict:
        """ψ(a, params): every binding's action in turn (a new dict)."""
        return _act_all(self.bindings, self.elements, params)

    def __repr__(self) -> str:
        return f"OrbitPoint(scale={self.scale!r}, seed={self.seed}, bindings={len(self.bindings)})"

    def _repr_pretty_(self, printer, cycle):
        printer.text(repr(self))


@dataclass(frozen=True, eq=False)
class HorizontalTangent:
    """A random horizontal tangent ``xi`` of ``space`` (seed ``seed``, radius ≤ ``rho``)."""

    seed: int
    rho: float
    xi: object

    def __repr__(self) -> str:
        return f"HorizontalTangent(seed={self.seed}, rho={self.rho!r})"

    def _repr_pretty_(self, printer, cycle):
        printer.text(repr(self))


def group_element(binding, params, scale: float = 1.0, seed: int = 0) -> GroupElement:
    """The element of ``binding`` at ``scale`` and ``seed``: ``binding.random_element(params, scale, seed)``;
    for a :class:`~geosharp_ref.symmetry.SymmetryMap` (all its attention pairs),
    :func:`~geosharp_ref.sampling.draw_orbit_elements` with a generator seeded ``seed``. Deterministic: the
    same arguments give the same element (this is how a reported counterexample is rebuilt)."""
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"the scale of a group element must be a positive finite number, got {scale!r}")
    if isinstance(binding, SymmetryMap):
        dtype = next(iter(params.values())).dtype if params else torch.float64
        value = draw_orbit_elements(binding, float(scale), torch.Generator().manual_seed(int(seed)), dtype)
    else:
        value = binding.random_element(params, scale=float(scale), seed=int(seed))
    return GroupElement(_key(binding), float(scale), int(seed), value)


def _act_all(bindings, elements, params) -> dict:
    out = dict(params)
    for b, e in zip(bindings, elements):
        out = b.act(out, e.value if isinstance(e, GroupElement) else e)
    return out


# -- strategies -----------------------------------------------------------------------------------------------

def scales(lo: float = SCALE_RANGE[0], hi: float = SCALE_RANGE[1]):
    """Scales a ∈ [lo, hi], log-uniform (drawn as log₁₀ a, so a shrinks towards 1 when 1 is in the range)."""
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and math.isfinite(lo)
            and math.isfinite(hi) and 0 < lo <= hi):
        raise ValueError(f"scales need 0 < lo <= hi, finite; got lo={lo!r}, hi={hi!r}")
    a, b = math.log10(lo), math.log10(hi)
    return st.floats(a, b).map(lambda e: float(min(max(10.0 ** e, lo), hi)))


def seeds():
    """Integer seeds in [0, 2³² − 1] (shrink towards 0)."""
    return st.integers(0, _MAX_SEED)


def group_elements(binding, params, *, scale=None):
    """:class:`GroupElement` of ``binding`` (any :class:`~geosharp_ref.symmetry.Binding`, or a
    :class:`~geosharp_ref.symmetry.SymmetryMap`) for parameters ``params`` (name → tensor; the element's
    dtype follows them): a drawn scale (``scale``: a strategy, default :func:`scales`) and seed, then
    :func:`group_element`. Well-conditioned: the binding's ``random_element`` is (condition number ≤ 4 for the
    GL(h) pairs and the declared matrix groups), so the size of the element is the scale."""
    params, scale = dict(params), scales() if scale is None else scale

    @st.composite
    def draw_element(draw):  # a composite prints the drawn value's repr in a failing example
        return group_element(binding, params, draw(scale), draw(seeds()))

    return draw_element()


def orbit_points(bindings, params, *, scale=None):
    """:class:`OrbitPoint`: ``params`` moved along every binding of ``bindings`` at once — one drawn scale a
    (``scale``: a strategy, default :func:`scales`) and seed s, binding j acting with its element of seed
    s + j. A :class:`~geosharp_ref.symmetry.SymmetryMap` in ``bindings`` moves all its attention pairs (give
    :func:`kept_pairs` when other bindings hold some of their parameters)."""
    bindings, params = tuple(bindings), dict(params)
    if not bindings:
        raise ValueError("orbit_points needs at least one binding to move along")

    scale = scales() if scale is None else scale

    @st.composite
    def draw_point(draw):
        a, s = draw(scale), draw(seeds())
        elements = tuple(group_element(b, params, a, (s + j) % (_MAX_SEED + 1)) for j, b in enumerate(bindings))
        return OrbitPoint(float(a), int(s), bindings, elements, _act_all(bindings, elements, params))

    return draw_point()


def horizontal_tangents(space, rho: float = 1.0):
    """:class:`HorizontalTangent`: a random tangent of ``space`` (a
    :class:`~geosharp_ref.sharpness.ProductSpace`, e.g. ``build_space(params, smap, "mix", bindings)``),
    projected horizontally (``space.random``: each factor's random direction, |θ|-scaled Gaussian elsewhere),
    of norm ≤ ``rho`` in the space's metric; drawn from a seed."""
    @st.composite
    def draw_tangent(draw):
        s = draw(seeds())
        return HorizontalTangent(s, float(rho), space.random(rho, torch.Generator().manual_seed(s)))

    return draw_tangent()


class Float64Copy:
    """A float64 copy of ``model`` (eval) and one batch's inputs: ``params`` (name → detached tensor),
    ``log_probs(params)`` (what the exactness checks compare) and ``change(params)``: the relative max-abs
    change of the log-probabilities from those at ``params``. Reuse one across many elements (no copy each)."""

    def __init__(self, model, batch):
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.params = {n: p.detach() for n, p in self.model.named_parameters()}
        self.batch = batch
        self.inputs = float64_inputs(batch[0])
        self.base = self.log_probs(self.params)

    def log_probs(self, params):
        with torch.no_grad():
            return log_probabilities(call_model(self.model, params, self.inputs))

    def change(self, params) -> float:
        return relative_change(self.base, self.log_probs(params))


def _copy(model, batch) -> Float64Copy:
    return model if isinstance(model, Float64Copy) else Float64Copy(model, batch)


def _elements(bindings, elements) -> tuple:
    if isinstance(elements, OrbitPoint):
        elements = elements.elements
    elif isinstance(elements, GroupElement) or torch.is_tensor(elements):
        elements = (elements,)
    elements = tuple(elements)
    if len(elements) != len(bindings):
        raise ValueError(f"{len(elements)} group elements for {len(bindings)} bindings: give one per binding (or an "
                         f"OrbitPoint of orbit_points(bindings, …))")
    return elements


def kept_pairs(model, bindings=(), metric: str = "mix") -> SymmetryMap:
    """The attention pairs of ``model`` that the quotient by ``bindings`` keeps (pairs sharing a parameter with
    a binding yield to it and are left adaptive): the :class:`~geosharp_ref.symmetry.SymmetryMap` to move
    along with the bindings (moving a yielded pair changes geodesic sharpness: its weights are adaptive)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
        smap = symmetry_map(model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    q = Quotient.assemble(params, smap, metric, [b for b in bindings if not isinstance(b, SymmetryMap)])
    return SymmetryMap(q.pairs, smap.param_shapes, smap.refused)


def _sharpness(model, batch, measure, symmetries, rho, n_iter, seed) -> float:
    kw = dict(n_iter=n_iter, seed=seed, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
        if measure == "adaptive":
            return float(adaptive_sharpness(model, [batch], rho, **kw).mean)
        return float(geodesic_sharpness(model, [batch], rho, metric=measure.split("-", 1)[1],
                                        symmetries=list(symmetries) or None, **kw).mean)


def _check_measure(measure):
    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}: choose one of {', '.join(MEASURES)}")


def _orbit(model, batch, bindings, elements):
    bindings = tuple(bindings)
    if not bindings:
        raise ValueError("give at least one binding to move along")
    elements = _elements(bindings, elements)
    ref = _copy(model, batch)
    return ref, bindings, elements, _act_all(bindings, elements, ref.params)


def _where(elements) -> str:
    return ", ".join(repr(e) for e in elements)


# -- assertions -----------------------------------------------------------------------------------------------

def assert_binding_exact(model, binding, batch, element, tol: float = OUTPUT_TOL) -> float:
    """The model's output is unchanged by ψ(element, ·) of ``binding``: on a float64 copy of ``model`` (or a
    :class:`Float64Copy`), the relative max-abs change of the log-probabilities on ``batch`` (``(inputs,
    targets)``) must be ≤ ``tol`` (default 1e-10, the check every binding passes). ``element``: a
    :class:`GroupElement` or what ``binding.act`` takes. Returns the change; AssertionError saying it."""
    ref, _, (e,), moved = _orbit(model, batch, (binding,), element)
    change = ref.change(moved)
    if not change <= tol:
        raise AssertionError(f"{_key(binding)} is not a symmetry: the log-probabilities changed by {change:.3g} "
                             f"(relative max-abs, float64) under ψ at {e!r}; tolerance {tol:g}")
    return change


def assert_orbit_invariant(model, batch, bindings, elements, *, measure: str = "geodesic-mix", rho: float = 0.05,
                           n_iter: int = 5, rtol: float = SHARPNESS_RTOL, output_tol: float = OUTPUT_TOL,
                           seed: int = 0) -> dict:
    """Moving along the orbits of ``bindings`` changes neither the output nor geodesic sharpness on the quotient.

    ``elements``: one per binding (:class:`GroupElement` or raw), or an :class:`OrbitPoint`; a
    :class:`~geosharp_ref.symmetry.SymmetryMap` among ``bindings`` moves its attention pairs (and is not passed
    as a symmetry: the attention pairs are quotiented anyway). On a float64 copy of ``model``:

    1. the log-probabilities on ``batch``: relative max-abs change ≤ ``output_tol`` (default 1e-10);
    2. ``measure`` (``geodesic-mix``/``geodesic-inv``: geodesic sharpness with the attention pairs' metric and
       the other bindings quotiented, Auto-PGD of ``n_iter`` iterations at radius ``rho``, start seed ``seed``,
       float64) at θ and at ψ(a, θ): relative change ≤ ``rtol`` (default 1e-8).

    Returns ``{"output": change, measure: change, "value": the measure at θ}``; AssertionError naming the
    quantity, its relative change, the tolerance and the elements."""
    _check_measure(measure)
    ref, bindings, elements, moved = _orbit(model, batch, bindings, elements)
    out = ref.change(moved)
    if not out <= output_tol:
        raise AssertionError(f"output: the log-probabilities changed by {out:.3g} (relative max-abs, float64) along "
                             f"the orbit at {_where(elements)}; tolerance {output_tol:g} (a binding is not a symmetry)")
    symmetries = [b for b in bindings if not isinstance(b, SymmetryMap)]
    s0 = _sharpness(ref.model, ref.batch, measure, symmetries, rho, n_iter, seed)
    s1 = _sharpness(model_with_params(ref.model, moved), ref.batch, measure, symmetries, rho, n_iter, seed)
    rel = relative_change(s0, s1)
    if not rel <= rtol:
        raise AssertionError(f"{measure} sharpness (rho {rho:g}, {n_iter} Auto-PGD iterations, float64) changed by "
                             f"{rel:.3g} (relative: {s0:.10g} -> {s1:.10g}) along the orbit at {_where(elements)}; "
                             f"tolerance {rtol:g}")
    return {"output": out, measure: rel, "value": s0}


def assert_changes(model, batch, bindings, elements, *, measure: str = "adaptive", rho: float = 0.05,
                   n_iter: int = 5, min_rtol: float = CONTRAST_RTOL, seed: int = 0) -> float:
    """The contrast: a measure that is not invariant (default ``adaptive`` sharpness) changes along the orbit
    by a relative amount > ``min_rtol`` (default 1e-3), measured as in :func:`assert_orbit_invariant`.
    Returns the change; AssertionError saying it."""
    _check_measure(measure)
    ref, bindings, elements, moved = _orbit(model, batch, bindings, elements)
    symmetries = [b for b in bindings if not isinstance(b, SymmetryMap)]
    s0 = _sharpness(ref.model, ref.batch, measure, symmetries, rho, n_iter, seed)
    s1 = _sharpness(model_with_params(ref.model, moved), ref.batch, measure, symmetries, rho, n_iter, seed)
    rel = relative_change(s0, s1)
    if not rel > min_rtol:
        raise AssertionError(f"{measure} sharpness (rho {rho:g}, {n_iter} Auto-PGD iterations, float64) changed by "
                             f"only {rel:.3g} (relative: {s0:.10g} -> {s1:.10g}) along the orbit at "
                             f"{_where(elements)}; expected more than {min_rtol:g}")
    return rel


# -- a search outside pytest ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Counterexample:
    """The minimal failing example hypothesis shrank to (``example``) and the message it failed with."""

    example: object
    message: str


def find_counterexample(prop, strategy, *, examples: int, seed: int = 0, progress=None):
    """Search ``strategy`` for an example on which ``prop(example)`` raises (AssertionError or any Exception):
    ``examples`` drawn examples, derandomized by ``seed`` (the same search every run), no example database;
    a failure is shrunk to a minimal one. Returns None when every example passed, else a
    :class:`Counterexample`. ``progress(i, seconds)`` is called after each example run."""
    if not (isinstance(examples, int) and not isinstance(examples, bool) and examples >= 1):
        raise ValueError(f"the number of examples must be a positive integer, got {examples!r}")
    failures, calls, t0 = [], [0], time.perf_counter()

    @settings(max_examples=examples, database=None, deadline=None, derandomize=False, verbosity=Verbosity.quiet,
              phases=(Phase.generate, Phase.shrink), report_multiple_bugs=False, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @hypothesis_seed(seed)
    @given(strategy)
    def search(example):
        calls[0] += 1
        try:
            prop(example)
        except Exception as exc:  # the last failure recorded is the shrunk one hypothesis replays last
            failures.append(Counterexample(example, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
            raise
        finally:
            if progress is not None:
                progress(calls[0], time.perf_counter() - t0)

    try:
        search()
    except Exception:
        if not failures:
            raise
        return failures[-1]
    return None
