"""Curvature measures (geosharp_ref.sharpness.curvature) against independent computations:

* invariance along GL(h) orbits (hypothesis, a ∈ [1e-2, 1e2], float64): the exact quotient trace and top
  eigenvalue (N matvecs / full Lanczos on a 95-parameter attention model) change by ≤ 1e-8 relative; the
  Euclidean trace and top eigenvalue change;
* Hutchinson: the estimate is within 4 standard errors of the exact trace, the probes are metric-orthonormal
  (g(S y, S y) = ‖y‖²) and horizontal, the standard error is the sample standard deviation over √m;
* Hutch++: exact (to round-off) on operators of rank ≤ k (hypothesis over N, rank, seed); unbiased on the
  attention model (mean of 100 estimates within 4 of their standard errors of the exact trace); on a spectrum
  with five outliers its error is several times Hutchinson's at the same 48 matvecs (dense float64 trace);
  samples, standard error and the matvec count follow the documented contract;
* the scalar toy model (geosharp_ref.studies.toy, paper App. D and Fig. 6): the quotient trace of a
  declared element-wise factor equals the toy's own Hessian restricted to the horizontal line (polarised
  Christoffel symbols and torch.func.hessian) and is constant along the orbit while the Euclidean trace
  sweeps over orders of magnitude; on the minimising orbit it is positive, on the same orbit for the loss
  −L (a maximum) negative;
* the named measures ``hessian-*`` and :func:`curvature` end to end.
"""
from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from geosharp_ref.sharpness import Factor, ProductSpace, build_space, get_measure, model_loss
from geosharp_ref.sharpness.curvature import curvature, exact_trace, hutchinson_trace, hutchpp_trace
from geosharp_ref.sharpness.hessian import EuclideanHessian, QuotientHessian
from geosharp_ref.studies import toy
from geosharp_ref.symmetry import NoAttentionPairsWarning, symmetry_map
from geosharp_ref.testing import group_element, orbit_points
from tests import cases

DT = torch.float64
INVARIANCE_RTOL = 1e-8   # exact quotient trace / top eigenvalue along orbits (observed ≤ 2.3e-15)
CONTRAST_RTOL = 1e-3     # the Euclidean ones must change by more


def _attention(seed=0):
    torch.manual_seed(seed)
    model = cases.TinyAttention(d=4).double().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    batch = (torch.randn(4, 5, 4, generator=gen, dtype=DT), torch.tensor([0, 1, 2, 1]))
    return model, batch


MODEL, BATCH = _attention()
PARAMS = {n: p.detach() for n, p in MODEL.named_parameters()}
SMAP = symmetry_map(MODEL)


def _exact(params, metric):
    """(trace, top eigenvalue) of the operator in flat coordinates, from its N columns (test only)."""
    loss = lambda p: model_loss(MODEL, p, BATCH)  # noqa: E731
    op = QuotientHessian(build_space(params, SMAP, metric), loss) if metric else EuclideanHessian(params, loss)
    A = torch.stack([op.matvec_flat(e) for e in torch.eye(op.dim, dtype=DT)], 1)
    return float(A.trace()), float(torch.linalg.eigvalsh(0.5 * (A + A.T))[-1])


BASE = {m: _exact(PARAMS, m) for m in ("inv", "mix", None)}


@settings(max_examples=3, deadline=None)
@given(point=orbit_points([SMAP], PARAMS), metric=st.sampled_from(["inv", "mix"]))
def test_quotient_trace_and_top_eigenvalue_are_invariant_along_orbits(point, metric):
    trace, top = _exact(point.params, metric)
    t0, e0 = BASE[metric]
    assert abs(trace - t0) <= INVARIANCE_RTOL * abs(t0), (point, trace, t0)
    assert abs(top - e0) <= INVARIANCE_RTOL * abs(e0), (point, top, e0)


def test_euclidean_trace_and_top_eigenvalue_change_along_orbits():
    moved = SMAP.act(dict(PARAMS), group_element(SMAP, PARAMS, 10.0, 0).value)
    trace, top = _exact(moved, None)
    t0, e0 = BASE[None]
    assert abs(trace - t0) > CONTRAST_RTOL * abs(t0)
    assert abs(top - e0) > CONTRAST_RTOL * abs(e0)
    for metric in ("inv", "mix"):  # the same point, the quotient unchanged (the contrast is not the model)
        assert _exact(moved, metric)[0] == pytest.approx(BASE[metric][0], rel=INVARIANCE_RTOL)


@pytest.mark.parametrize("distribution", ["rademacher", "gaussian"])
def test_hutchinson_is_unbiased_within_its_standard_error(distribution):
    op = QuotientHessian(build_space(PARAMS, SMAP, "mix"), lambda p: model_loss(MODEL, p, BATCH))
    est = hutchinson_trace(op, 40, distribution=distribution, generator=torch.Generator().manual_seed(2))
    s = torch.tensor(est.samples, dtype=DT)
    assert est.value == pytest.approx(float(s.mean()), rel=1e-12)
    assert est.stderr == pytest.approx(float(s.std() / math.sqrt(len(s))), rel=1e-12)
    assert abs(est.value - BASE["mix"][0]) <= 4 * est.stderr
    # the probes: z = P S y, metric-orthonormal (g(Sy, Sy) = ‖y‖²) and horizontal; yᵀÃy = g(z, Hess z)
    y = torch.randn(op.dim, generator=torch.Generator().manual_seed(3), dtype=DT)
    Sy = op.whiten(op.to_tangent(y))
    movable = torch.cat([torch.ones(x.numel(), dtype=torch.bool) for x in Sy[:len(Sy) - len(op.space.adaptive_names)]]
                        + [m.reshape(-1) for m in op.space._movable])  # c = 0 entries are not perturbed
    assert float(op.inner(Sy, Sy)) == pytest.approx(float(y[movable] @ y[movable]), rel=1e-12)
    z = op.probe(y)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(op.project(z), z))
    assert float(y @ op.matvec_flat(y)) == pytest.approx(float(op.inner(z, op.matvec(z))), rel=1e-10)


# -- Hutch++ ------------------------------------------------------------------------------------------------

class DenseOperator:
    """A symmetric matrix with the flat-coordinate interface the estimators use (dim, dtype, base, matvec_flat)."""

    def __init__(self, A):
        self.A, self.dim, self.dtype, self.base, self.calls = A, A.shape[0], A.dtype, {"w": A}, 0

    def matvec_flat(self, y):
        self.calls += 1
        return self.A @ y


def _spectrum(eigenvalues, seed):
    n = len(eigenvalues)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=DT))
    return DenseOperator(Q @ torch.diag(torch.tensor(eigenvalues, dtype=DT)) @ Q.T)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(8, 40), rank=st.integers(1, 4), seed=st.integers(0, 2 ** 16),
       distribution=st.sampled_from(["rademacher", "gaussian"]))
def test_hutchpp_is_exact_on_operators_of_rank_at_most_its_sketch(n, rank, seed, distribution):
    gen = torch.Generator().manual_seed(seed)
    values = (torch.rand(rank, generator=gen, dtype=DT) * 4 - 2).tolist()  # indefinite, |λ| ≤ 2
    op = _spectrum(values + [0.0] * (n - rank), seed)
    est = hutchpp_trace(op, 3 * rank + 2, distribution=distribution, generator=gen)  # k = rank: rank + 2 residuals
    assert op.calls == 3 * rank + 2 and len(est.samples) == rank + 2
    assert est.value == pytest.approx(float(op.A.trace()), abs=1e-10)
    assert est.stderr <= 1e-10


def test_hutchpp_is_unbiased_on_the_attention_model():
    op = QuotientHessian(build_space(PARAMS, SMAP, "mix"), lambda p: model_loss(MODEL, p, BATCH))
    values = torch.tensor([hutchpp_trace(op, 12, generator=torch.Generator().manual_seed(s)).value
                           for s in range(100)], dtype=DT)
    assert abs(float(values.mean()) - BASE["mix"][0]) <= 4 * float(values.std()) / 10
    est = hutchpp_trace(op, 13, generator=torch.Generator().manual_seed(7))
    s = torch.tensor(est.samples, dtype=DT)   # k = 4: 4 sketch + 4 top + 5 residual matvecs
    assert len(s) == 5 and est.value == pytest.approx(float(s.mean()), rel=1e-12)
    assert est.stderr == pytest.approx(float(s.std() / math.sqrt(len(s))), rel=1e-12)


def test_hutchpp_beats_hutchinson_when_a_few_eigenvalues_dominate():
    values = [40.0, 30.0, 20.0, 15.0, 10.0] + [0.05 * ((-1) ** i) * (1 + i % 7) for i in range(195)]
    op = _spectrum(values, 0)
    exact = float(op.A.trace())
    rmse = {}
    for f in (hutchinson_trace, hutchpp_trace):
        errors = torch.tensor([f(op, 48, generator=torch.Generator().manual_seed(s)).value - exact
                               for s in range(100)], dtype=DT)
        rmse[f.__name__] = float(errors.pow(2).mean().sqrt())
    assert rmse["hutchpp_trace"] * 4 < rmse["hutchinson_trace"], rmse


@pytest.mark.parametrize("matvecs", [0, 2, 2.5, True])
def test_hutchpp_refuses_fewer_than_three_matvecs(matvecs):
    with pytest.raises(ValueError, match="at least 3 matvecs"):
        hutchpp_trace(_spectrum([1.0, 2.0], 0), matvecs)


# -- the scalar toy model (paper App. D, Fig. 6) -------------------------------------------------------------

class Toy(nn.Module):
    """f(x) = g·h·x with scalar weights g, h (as 1-element tensors)."""

    def __init__(self, g, h):
        super().__init__()
        self.g = nn.Parameter(torch.tensor([g], dtype=DT))
        self.h = nn.Parameter(torch.tensor([h], dtype=DT))


class ToyBinding:
    """A declared binding of the element-wise re-scaling (g, h) ↦ (a g, h/a)."""

    key, param_names = "toy", ("g", "h")

    def extract(self, params):
        return params["g"], params["h"]

    def insert(self, params, blocks):
        return {**params, "g": blocks[0], "h": blocks[1]}


def _toy_loss(sign=1.0):
    x, y = toy.DEFAULT_DATA.tensors()
    return lambda p: sign * ((p["g"] * p["h"] * x - y) ** 2).mean()


def _toy_trace(metric, g, h, sign=1.0):
    params = {n: p.detach() for n, p in Toy(g, h).named_parameters()}
    space = ProductSpace(params, [Factor(toy.METRICS[metric], ToyBinding())])
    return exact_trace(QuotientHessian(space, _toy_loss(sign))), exact_trace(EuclideanHessian(params, _toy_loss(sign)))


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_toy_quotient_trace_equals_the_toy_hessian_on_the_horizontal_line(metric):
    for g, h in [(0.7, 1.3), (-1.1, 0.4), (2.0, -0.3)]:
        ours, _ = _toy_trace(metric, g, h)
        assert ours == pytest.approx(float(toy.quotient_hessian(metric, g, h)), rel=1e-12)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_toy_minimum_and_maximum_are_told_apart_by_the_quotient_trace_alone(metric):
    """Fig. 6: on the minimising orbit g h = β* the quotient trace is one positive number at every point
    (for −L, a maximum there, the negative of it), while the Euclidean trace sweeps over four orders of
    magnitude along the same orbit and is not a property of the minimum."""
    beta = toy.DEFAULT_DATA.beta_star
    quotient, euclid = [], []
    for a in (1e-2, 1.0, 1e2):
        g, h = math.sqrt(beta) * a, math.sqrt(beta) / a
        q, e = _toy_trace(metric, g, h)
        q_max, _ = _toy_trace(metric, g, h, sign=-1.0)
        quotient.append(q)
        euclid.append(e)
        assert q > 0 and q_max == pytest.approx(-q, rel=1e-12)
    assert max(quotient) - min(quotient) <= 1e-10 * abs(quotient[0])
    assert max(euclid) / min(euclid) > 1e3


def test_named_measures_and_curvature_end_to_end():
    r = curvature(MODEL, [BATCH], "mix", k=2, probes=8)
    assert r.dim == QuotientHessian(build_space(PARAMS, SMAP, "mix"), lambda p: p).dim
    assert r.eigenvalues[0] == pytest.approx(BASE["mix"][1], rel=1e-6)
    assert abs(r.trace - BASE["mix"][0]) <= 5 * r.trace_stderr
    e = curvature(MODEL, [BATCH], "euclidean", k=1, probes=0)
    assert e.eigenvalues[0] == pytest.approx(BASE[None][1], rel=1e-6)
    for name, want in (("hessian-top-eigenvalue-inv", BASE["inv"][1]), ("hessian-top-eigenvalue-euclidean",
                                                                         BASE[None][1])):
        m = get_measure(name)
        res = m.evaluate(MODEL, [BATCH, BATCH], 0.1, symmetry_map=SMAP, n_iter=5, seed=0)
        assert res.measure == name and len(res.per_batch) == 2
        assert res.mean == pytest.approx(want, rel=1e-6)
    res = get_measure("hessian-trace-mix").evaluate(MODEL, [BATCH], 0.1)
    assert abs(res.mean - BASE["mix"][0]) <= 5 * res.config["errors"][0]
    h = curvature(MODEL, [BATCH], "mix", k=1, probes=12, trace_method="hutch++")
    assert h.config["trace_method"] == "hutch++" and h.matvecs == 12 + h.config["lanczos_steps"]
    assert abs(h.trace - BASE["mix"][0]) <= 5 * h.trace_stderr
    with pytest.raises(ValueError, match="at least 3 matvecs"):
        curvature(MODEL, [BATCH], "mix", k=1, probes=2, trace_method="hutch++")
    with pytest.raises(ValueError, match="unknown trace method"):
        curvature(MODEL, [BATCH], "mix", probes=4, trace_method="hutch")



@pytest.mark.parametrize("name", ["hessian-trace-euclidean", "hessian-top-eigenvalue-euclidean"])
def test_curvature_measures_prepare_the_batch_as_every_measure_does(name):
    """Float32 inputs for a float64 perceptron (which casts nothing itself): the batch is cast (and, on a GPU,
    moved) to the model before the loss at θ is taken, as the Auto-PGD measures do; that loss equals the one of
    the float64 batch, computed directly."""
    model = cases.mlp64(nn.Tanh)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 5, generator=gen), torch.randint(0, 3, (6,), generator=gen)
    got = get_measure(name).evaluate(model, [(x, y)], 0.1, probes=2, steps=3)
    with torch.no_grad():
        ref = float(nn.functional.cross_entropy(model(x.double()), y))
    assert got.loss_before == pytest.approx([ref], rel=1e-12)


def test_curvature_without_attention_pairs_is_silent_where_sharpness_warns():
    """One quotient resolver (:func:`~geosharp_ref.sharpness.pipeline.evaluation_quotient`) serves both: on a
    model with no attention pair the geodesic measure warns that its quotient is the adaptive space, the
    curvature operator (whose documented quotient is then the adaptive space) does not."""
    model = cases.mlp64(nn.Tanh)
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randn(6, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (6,), generator=gen))
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoAttentionPairsWarning)
        res = curvature(model, [batch], "mix", k=1, probes=2, steps=3)
    assert math.isfinite(res.trace) and res.config["factors"] == []
    with pytest.warns(NoAttentionPairsWarning):
        get_measure("geodesic-mix").evaluate(model, [batch], 0.1, n_iter=1)


def test_curvature_measures_equal_the_curvature_of_each_batch_alone():
    """The named curvature measures build one space for all batches and one operator per batch: batch i's value
    and standard error equal :func:`curvature` on that batch alone with seed ``seed + i``; the training flag of
    the model is restored."""
    gen = torch.Generator().manual_seed(5)
    batches = [BATCH, (torch.randn(3, 5, 4, generator=gen, dtype=DT), torch.tensor([2, 0, 1]))]
    MODEL.train()
    try:
        res = get_measure("hessian-trace-mix").evaluate(MODEL, batches, 0.1, probes=3, seed=7, symmetry_map=SMAP)
        top = get_measure("hessian-top-eigenvalue-inv").evaluate(MODEL, batches, 0.1, steps=6, symmetry_map=SMAP)
        assert MODEL.training
    finally:
        MODEL.eval()
    for i, b in enumerate(batches):  # bit for bit: the same operator and probes
        alone = curvature(MODEL, [b], "mix", k=0, probes=3, seed=7 + i, smap=SMAP)
        assert res.per_batch[i] == alone.trace and res.config["errors"][i] == alone.trace_stderr
        eig = curvature(MODEL, [b], "inv", k=1, probes=0, steps=6, seed=i, smap=SMAP)
        assert top.per_batch[i] == eig.eigenvalues[0]
        with torch.no_grad():
            assert res.loss_before[i] == pytest.approx(float(model_loss(MODEL, PARAMS, b)), rel=1e-12)


def test_curvature_measures_in_another_dtype_report_the_loss_in_that_dtype():
    """A float32 model measured in float64: the model is untouched, the value equals that of its float64 copy
    and ``loss_before`` is that copy's loss (not NaN)."""
    model32 = copy.deepcopy(MODEL).float()
    before = {n: p.clone() for n, p in model32.named_parameters()}
    batch32 = (BATCH[0].float(), BATCH[1])
    res = get_measure("hessian-top-eigenvalue-euclidean").evaluate(model32, [batch32], 0.1, steps=8,
                                                                  dtype=torch.float64)
    model64 = copy.deepcopy(model32).double()
    ref = get_measure("hessian-top-eigenvalue-euclidean").evaluate(model64, [(BATCH[0].float().double(), BATCH[1])],
                                                                  0.1, steps=8)
    assert res.per_batch == pytest.approx(ref.per_batch, rel=1e-12)
    assert res.loss_before == pytest.approx(ref.loss_before, rel=1e-12) and math.isfinite(res.loss_before[0])
    assert all(torch.equal(p, before[n]) and p.dtype == torch.float32 for n, p in model32.named_parameters())


def test_curvature_measures_take_the_loss_at_theta_in_eval_mode():
    """A model in training mode with dropout: ``loss_before`` is the eval-mode loss (dropout off, as every
    measurement), not a dropout draw, and the model is handed back in training mode."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 3)).double().train()
    gen = torch.Generator().manual_seed(4)
    batch = (torch.randn(8, 5, generator=gen, dtype=DT), torch.randint(0, 3, (8,), generator=gen))
    res = get_measure("hessian-trace-euclidean").evaluate(model, [batch], 0.1, probes=2)
    assert model.training
    with torch.no_grad():
        model.eval()
        want = float(nn.functional.cross_entropy(model(batch[0]), batch[1]))
        model.train()
        drawn = float(nn.functional.cross_entropy(model(batch[0]), batch[1]))
    assert drawn != want  # dropout changes the training-mode loss
    assert res.loss_before == [want]
