"""Auto-PGD: checkpoint schedule, and agreement with exact trust-region maxima (rung 6 flavour)."""
import gc
import importlib
import math
import weakref

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from geosharp_ref.apgd import EuclideanSpace, Space, apgd, apgd_checkpoints, lincomb, radial_clip
from tests.cases import trust_region_max

#: the module geosharp_ref.apgd (``from geosharp_ref import apgd`` can give the function the package exports)
APGD_MODULE = importlib.import_module("geosharp_ref.apgd")


def _tiny_llama_space(metric):
    """``(space, f_and_grad)`` on a tiny Llama in float64 with every symmetry found (RoPE Q/K pairs, V/O pairs,
    gated-MLP units) and the adaptive rest; one batch of 3 × 7 tokens."""
    from geosharp_ref.forward import model_loss
    from geosharp_ref.sharpness.pipeline import build_space
    from geosharp_ref.symmetry import find_symmetries, symmetry_map
    from tests.cases import models
    torch.manual_seed(0)
    model = models.llama(initializer_range=0.5).double().eval()
    ids = torch.randint(3, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    batch = ({"input_ids": ids}, torch.cat([ids[:, 1:], torch.full((3, 1), -100)], 1))
    params = {n: p.detach() for n, p in model.named_parameters()}
    space = build_space(params, symmetry_map(model), metric,
                        find_symmetries(model, batch, metric=metric, seed=0).bindings)
    return space, space.value_and_grad(lambda p: model_loss(model, p, batch))


def test_checkpoints_follow_croce_hein_schedule():
    p = [0.0, 0.22]
    while p[-1] < 1:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    for n in (10, 20, 100):
        expected = sorted({math.ceil(x * n - 1e-9) for x in p[1:] if x <= 1})
        assert apgd_checkpoints(n) == [w for w in expected if 0 < w <= n]
    assert apgd_checkpoints(20)[:3] == [5, 9, 12]


class EuclideanBall(EuclideanSpace):
    """Plain Euclidean space (the reference :class:`~geosharp_ref.apgd.EuclideanSpace`): the simplest space
    object APGD accepts."""


def _textbook_apgd(f_and_grad, space, rho, n_iter, momentum=0.75):
    """Auto-PGD written out with z = P(x + η d/‖d‖) and x_new = P(x + a(z − x) + (1 − a)(x − x_prev))."""
    x = space.project(space.zeros(), rho)
    f, g = f_and_grad(x)
    best, x_best, g_best, x_prev, eta = f, x, g, x, 2.0 * rho
    checkpoints, last, halved, f_last, inc = set(apgd_checkpoints(n_iter)), 0, False, f, 0
    values = [f]
    for k in range(n_iter):
        a = 1.0 if k == 0 else momentum
        d = g
        dn = float(space.inner(d, d)) ** 0.5
        z = space.project([xi + (eta / dn if dn > 0 else 0.0) * di for xi, di in zip(x, d)], rho)
        x_new = space.project([a * zi + (2 - 2 * a) * xi + (a - 1) * pi for zi, xi, pi in zip(z, x, x_prev)], rho)
        f_new, g_new = f_and_grad(x_new)
        values.append(f_new)
        inc += f_new > f
        x_prev, x, f, g = x, x_new, f_new, g_new
        if f_new > best:
            best, x_best, g_best = f_new, x_new, g_new
        if k + 1 in checkpoints and k + 1 < n_iter:
            halved = inc < 0.75 * (k + 1 - last) or ((not halved) and best <= f_last)
            if halved:
                eta /= 2.0
                x, f, g = x_best, best, g_best
            f_last, last, inc = best, k + 1, 0
    return values


@settings(max_examples=10)
@given(seed=st.integers(0, 10_000), dim=st.integers(2, 12), log_rho=st.floats(-2, 0.5))
def test_apgd_reaches_trust_region_maximum(seed, dim, log_rho):
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((dim, dim))
    M = B @ B.T / dim  # convex quadratic: the maximiser lies on the sphere
    g = rng.standard_normal(dim)
    rho = 10 ** log_rho
    Mt, gt = torch.tensor(M), torch.tensor(g)

    def f_and_grad(x):
        v = x[0]
        return float(0.5 * v @ Mt @ v + gt @ v), [Mt @ v + gt]

    res = apgd(f_and_grad, EuclideanBall(dim), rho, n_iter=100)
    best = trust_region_max(M, g, rho)
    assert res.best_value <= best * (1 + 1e-9) + 1e-12  # never above the true maximum
    assert res.best_value >= 0.99 * best
    assert float(res.best_xi[0].norm()) <= rho * (1 + 1e-12)


def test_apgd_halves_steps_and_keeps_best_iterate():
    dim = 6

    def f_and_grad(x):  # concave: optimum inside the ball, forces oscillation and halving
        v = x[0]
        target = torch.full((dim,), 0.1, dtype=torch.float64)
        return float(-((v - target) ** 2).sum()), [-2 * (v - target)]

    res = apgd(f_and_grad, EuclideanBall(dim), 1.0, n_iter=20)
    assert res.step_sizes[0] == 2.0 and min(res.step_sizes) < 2.0
    assert res.best_value == max(res.values)
    assert res.best_value > -1e-3


def test_apgd_is_deterministic_with_random_start():
    def f_and_grad(x):
        return float((x[0] ** 3).sum()), [3 * x[0] ** 2]

    runs = [apgd(f_and_grad, EuclideanBall(4), 0.5, n_iter=10, random_start=True,
                 generator=torch.Generator().manual_seed(3)).values for _ in range(2)]
    assert runs[0] == runs[1]


@settings(deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(1e-3, 1e3), st.floats(1e-2, 1e2))
def test_radial_clip_device_path_matches_host_path(seed, scale, rho):
    """The synchronisation-free path (accelerators) and the host path give the same clipped vector and
    norm inside, on and outside the ball, and leave the zero vector alone (ρ/0 = inf clamps to 1)."""
    g = torch.Generator().manual_seed(seed)
    xi = [scale * torch.randn(3, 4, generator=g, dtype=torch.float64), scale * torch.randn(5, generator=g, dtype=torch.float64)]
    for v in (xi, [torch.zeros_like(x) for x in xi]):
        sq = sum((x * x).sum() for x in v)
        a, na = radial_clip(v, sq, rho, on_device=False)
        b, nb = radial_clip(v, sq, rho, on_device=True)
        norm = math.sqrt(float(sum((x * x).sum() for x in b)))
        assert abs(norm - min(rho, math.sqrt(float(sq)))) <= 1e-12 * max(1.0, norm)
        assert abs(float(na) - float(nb)) <= 1e-12 * max(1.0, float(na))
        for x, y in zip(a, b):
            assert torch.allclose(x, y, rtol=1e-14, atol=0)


@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.booleans())
def test_lincomb_equals_the_sum_and_leaves_its_terms_alone(seed, k, tensor_coefs):
    """Σ cᵢ ξᵢ (numbers or 0-d tensors as coefficients) = the sum written out, in float64; the terms
    are not modified (the first product is a new tensor, the others accumulate into it)."""
    g = torch.Generator().manual_seed(seed)
    vecs = [[torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)]
            for _ in range(k)]
    coefs = torch.randn(k, generator=g, dtype=torch.float64)
    coefs = list(coefs) if tensor_coefs else [float(c) for c in coefs]
    before = [[x.clone() for x in v] for v in vecs]
    out = lincomb(list(zip(coefs, vecs)))
    for j in range(2):
        ref = sum(float(c) * v[j] for c, v in zip(coefs, vecs))
        torch.testing.assert_close(out[j], ref, rtol=1e-14, atol=1e-14)
    for v, b in zip(vecs, before):
        for x, y in zip(v, b):
            assert torch.equal(x, y)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), dim=st.integers(2, 8), log_rho=st.floats(-2, 0.5))
def test_one_combination_update_equals_the_textbook_two_projection_update(seed, dim, log_rho):
    """‖x + t d‖² = ‖x‖² + 2t g(x, d) + t² g(d, d): the single-combination step (z never formed) visits the
    iterates of the update written out with both projections, on a non-convex objective."""
    rng = np.random.default_rng(seed)
    B = torch.tensor(rng.standard_normal((dim, dim)))
    M, g0 = B + B.T, torch.tensor(rng.standard_normal(dim))
    rho = 10 ** log_rho

    def f_and_grad(x):
        v = x[0]
        return float(0.5 * v @ M @ v + g0 @ v + (v ** 3).sum()), [M @ v + g0 + 3 * v ** 2]

    res = apgd(f_and_grad, EuclideanBall(dim), rho, n_iter=15)
    ref = _textbook_apgd(f_and_grad, EuclideanBall(dim), rho, 15)
    np.testing.assert_allclose(res.values, ref, rtol=1e-9, atol=1e-12)


def test_the_written_protocol_lists_what_apgd_uses():
    """Auto-PGD calls exactly the methods of :class:`~geosharp_ref.apgd.Space`: a space with only those
    runs it (and a start vector may be given)."""
    names = {"zeros", "random", "inner", "project", "ascent_step", "lincomb", "scale"}
    assert names <= set(dir(Space))

    class Minimal:
        pass
    base = EuclideanBall(3)
    m = Minimal()
    for n in names:
        setattr(m, n, getattr(base, n))
    res = apgd(lambda x: (float(x[0].sum()), [torch.ones(3, dtype=torch.float64)]), m, 1.0, n_iter=5,
               start=[torch.tensor([0.1, 0.0, 0.0], dtype=torch.float64)])
    assert res.best_value == pytest.approx(3 ** 0.5, rel=1e-4)


def _apgd_keeping_every_vector(f_and_grad, space, rho, n_iter, generator, momentum=0.75, rho_osc=0.75):
    """Auto-PGD as it was written before the lean loop: :func:`~geosharp_ref.apgd.apgd_step` on (x, x_prev, g)
    held across the gradient evaluation (the same arithmetic, more vectors alive)."""
    from geosharp_ref.apgd import apgd_step
    x = space.project(space.random(rho, generator), rho)
    xx = space.inner(x, x)
    f, g = f_and_grad(x)
    values, x_best, f_best, g_best, xx_best, x_prev, eta = [f], x, f, g, xx, x, 2.0 * rho
    checkpoints, last, halved, f_last, inc = set(apgd_checkpoints(n_iter)), 0, False, f, 0
    for k in range(n_iter):
        x_new, xx_new = apgd_step(space, x, x_prev, g, xx, eta, rho, 1.0 if k == 0 else momentum)
        f_new, g_new = f_and_grad(x_new)
        values.append(f_new)
        inc += f_new > f
        x_prev, x, f, g, xx = x, x_new, f_new, g_new, xx_new
        if f_new > f_best:
            x_best, f_best, g_best, xx_best = x_new, f_new, g_new, xx_new
        if k + 1 in checkpoints and k + 1 < n_iter:
            halved = inc < rho_osc * (k + 1 - last) or (not halved and f_best <= f_last)
            if halved:
                eta /= 2.0
                x, f, g, xx = x_best, f_best, g_best, xx_best
            f_last, last, inc = f_best, k + 1, 0
    return values, x_best


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("keep", [False, True])
def test_lean_loop_visits_the_iterates_of_the_loop_keeping_every_vector(metric, keep):
    """Dropping spent vectors (the gradient once d is formed, d and x_prev once x_new is) changes no iterate: on a
    tiny Llama (RoPE Q/K pairs, V/O pairs, gated-MLP units, adaptive rest; float64, random start, restarts
    included) the values and the best point agree with the loop that holds every vector to 1e-12, whether a
    restart takes the best point's kept gradient or evaluates it again (``keep_best_gradient``)."""
    space, f_and_grad = _tiny_llama_space(metric)
    assert space.factors and space.adaptive_names  # factors and an adaptive rest
    points = []

    def counted(xi):
        points.append(xi)
        return f_and_grad(xi)
    res = apgd(counted, space, 0.5, n_iter=12, random_start=True, generator=torch.Generator().manual_seed(3),
               keep_best_gradient=keep)
    values, best = _apgd_keeping_every_vector(f_and_grad, space, 0.5, 12, torch.Generator().manual_seed(3))
    assert len(res.values) == len(values) == 13
    if keep:  # a restart takes the best point's kept gradient: one evaluation per iteration and the start
        assert len(points) == 13
    else:  # a restart from an older best point happened: its gradient was evaluated again there
        assert len(points) > 13 and any(p is q for i, p in enumerate(points) for q in points[:i])
    np.testing.assert_allclose(res.values, values, rtol=1e-12, atol=1e-15)
    assert len(res.best_xi) == len(best)
    for a, b in zip(res.best_xi, best):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


class _CountingBall(EuclideanBall):
    """The Euclidean ball recording every tensor its operations (and the objective's gradients) create, weakly."""

    def __init__(self, dim):
        super().__init__(dim)
        self.made = weakref.WeakSet()

    def keep(self, xi):
        self.made.update(xi)
        return xi

    def zeros(self):
        return self.keep(super().zeros())

    def random(self, rho, generator=None):
        return self.keep(super().random(rho, generator))

    def project(self, xi, rho):
        return radial_clip(xi, self.inner(xi, xi), rho, scale=self.scale)[0]

    def lincomb(self, terms, consume=None):
        return self.keep(super().lincomb(terms, consume))

    def scale(self, xi, s):
        return self.keep(super().scale(xi, s))


@pytest.fixture
def gc_of_this_test():
    """``gc.collect()`` inside the test scans only what the test creates: the heap the suite built so far is frozen
    (``gc.freeze``) for its duration. The memory tests collect at every evaluation, and a full collection of a
    suite's heap takes most of a second."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def test_apgd_keeps_at_most_three_vectors_alive_while_evaluating(gc_of_this_test):
    """While f and its gradient are evaluated, Auto-PGD holds the new point, the current iterate (the next x_prev) and
    an older best point: at most three tangent vectors and no gradient (with ``keep_best_gradient=False``, the
    best point's gradient is evaluated again on a restart instead of kept; the loop that held x_prev, the spent
    gradient and the best point's gradient keeps six or more on this objective, whose steps overshoot so that the
    best point is often an older one). Every evaluation counts, the re-evaluations on restarts included."""
    dim = 64
    gen = torch.Generator().manual_seed(0)
    c = torch.randn(dim, generator=gen, dtype=torch.float64)
    c = 0.2 * c / c.norm()  # the maximiser, inside the ball: steps of 2ρ overshoot it
    space, alive = _CountingBall(dim), []

    def f_and_grad(x):
        gc.collect()
        alive.append(len(space.made))
        v = x[0]
        return float(-((v - c) ** 2).sum()), space.keep([-2 * (v - c)])

    def most_alive(run):
        gen.manual_seed(1)
        alive.clear()
        values = run(gen)
        assert len(values) == 21 and max(values) > values[0] and min(values[1:]) < max(values[:-1])  # not monotone
        return max(alive)

    assert most_alive(lambda g: _apgd_keeping_every_vector(f_and_grad, space, 0.7, 20, g)[0]) >= 6  # counts right
    kept = list(alive)
    assert most_alive(lambda g: apgd(f_and_grad, space, 0.7, n_iter=20, random_start=True, generator=g,
                                     keep_best_gradient=False).values) <= 3
    assert len(alive) > len(kept) == 21  # restarts from older best points re-evaluated their gradient


def test_keeping_the_best_points_gradient_saves_the_restarts_evaluations_for_one_vector(gc_of_this_test):
    """``keep_best_gradient=True`` (the default below :data:`KEEP_GRADIENT_BYTES`): the same iterates bit for bit as the
    run that evaluates the best point's gradient again on each restart, one gradient evaluation per iteration and
    the start (none on a restart), and at most one tangent vector more alive while evaluating (that gradient)."""
    dim = 64
    gen = torch.Generator().manual_seed(0)
    c = torch.randn(dim, generator=gen, dtype=torch.float64)
    c = 0.2 * c / c.norm()

    def run(keep):
        space, alive = _CountingBall(dim), []  # a fresh record per run (an earlier run's best point stays alive)

        def f_and_grad(x):
            gc.collect()
            alive.append(len(space.made))
            v = x[0]
            return float(-((v - c) ** 2).sum()), space.keep([-2 * (v - c)])
        res = apgd(f_and_grad, space, 0.7, n_iter=20, random_start=True, generator=torch.Generator().manual_seed(1),
                   keep_best_gradient=keep)
        return res, len(alive), max(alive)
    (lean, n_lean, most_lean), (kept, n_kept, most_kept) = run(False), run(True)
    assert run(None)[1] == n_kept  # the default keeps it for this small vector
    assert kept.values == lean.values and all(torch.equal(a, b) for a, b in zip(kept.best_xi, lean.best_xi))
    assert n_kept == 21 < n_lean  # restarts happened, and cost no evaluation with the kept gradient
    assert most_kept <= most_lean + 1


def test_apgd_forms_the_next_iterate_in_the_direction_s_place(gc_of_this_test):
    """Auto-PGD hands the spent gradient and direction to the space (``consume``): once the next iterate is formed,
    x, x_prev and the new point are alive (three tangent vectors, four while the best point is an older one), one
    fewer at every step than with a space that ignores ``consume`` (which holds the direction as well), and the
    iterates are the same."""
    dim = 32
    gen = torch.Generator().manual_seed(0)
    c = 0.2 * torch.randn(dim, generator=gen, dtype=torch.float64)

    class Recording(_CountingBall):
        def __init__(self, dim, honour):
            super().__init__(dim)
            self.honour, self.after_combining = honour, []

        def lincomb(self, terms, consume=None):
            out = super().lincomb(terms, consume if self.honour else None)
            del terms
            gc.collect()
            self.after_combining.append(len(self.made))
            return out

    def run(space):
        def f_and_grad(x):
            v = x[0]
            return float(-((v - c) ** 2).sum()), space.keep([-2 * (v - c)])
        return apgd(f_and_grad, space, 0.7, n_iter=20, random_start=True,
                    generator=torch.Generator().manual_seed(1), keep_best_gradient=False).values

    lean, keeping = Recording(dim, True), Recording(dim, False)
    assert run(lean) == run(keeping)
    assert len(lean.after_combining) == len(keeping.after_combining) == 20
    assert [k - n for n, k in zip(lean.after_combining, keeping.after_combining)] == [1] * 20
    assert max(lean.after_combining) == 4 and lean.after_combining.count(3) > 10


def test_an_older_best_point_is_parked_and_the_iterates_do_not_change(tmp_path, monkeypatch, gc_of_this_test):
    """With ``park_bytes=0`` a best point older than x waits in an anonymous temporary file once the momentum step
    has used it: while f and its gradient are evaluated at most two tangent vectors hold memory (the new point and
    the current iterate; three without parking on this objective, whose steps overshoot), nothing is left in the
    temporary directory, and the values and the best point equal the run that keeps it (bit for bit: the same
    tensor objects get their bytes back)."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    parks = []
    real_park = APGD_MODULE.park
    monkeypatch.setattr(APGD_MODULE, "park", lambda ts: parks.append(1) or real_park(ts))
    dim = 64
    gen = torch.Generator().manual_seed(0)
    c = torch.randn(dim, generator=gen, dtype=torch.float64)
    c = 0.2 * c / c.norm()
    holding = []

    def run(park_bytes):
        space = _CountingBall(dim)  # a fresh record per run (an earlier run's best point stays alive)

        def f_and_grad(x):
            gc.collect()
            holding.append(sum(t.numel() > 0 for t in space.made))
            v = x[0]
            return float(-((v - c) ** 2).sum()), space.keep([-2 * (v - c)])
        holding.clear()
        return apgd(f_and_grad, space, 0.7, n_iter=20, random_start=True, generator=torch.Generator().manual_seed(1),
                    park_bytes=park_bytes, keep_best_gradient=False)
    kept = run(None)
    assert max(holding) == 3 and not parks
    parked = run(0)
    assert max(holding) <= 2 and parks
    assert parked.values == kept.values and parked.best_value == kept.best_value
    assert all(torch.equal(a, b) for a, b in zip(parked.best_xi, kept.best_xi))
    assert list(tmp_path.iterdir()) == []
    parks.clear()
    run(8 * dim + 1)  # below the threshold nothing is parked
    assert not parks


def test_parking_changes_no_iterate_on_a_decoder_with_every_symmetry(monkeypatch):
    """On a tiny Llama with every symmetry (the fast GL factor's vectors carry Gram tables that refer to the parked
    tensors), Auto-PGD with every older best point parked gives the values and the best point of the run that
    keeps it, bit for bit."""
    space, f_and_grad = _tiny_llama_space("mix")
    parks, real_park = [], APGD_MODULE.park
    monkeypatch.setattr(APGD_MODULE, "park", lambda ts: parks.append(len(ts)) or real_park(ts))
    runs = [apgd(f_and_grad, space, 0.5, n_iter=12, random_start=True, generator=torch.Generator().manual_seed(3),
                 park_bytes=b) for b in (None, 0)]
    assert parks and all(n == len(runs[0].best_xi) for n in parks)
    assert runs[0].values == runs[1].values and len(runs[0].values) == 13
    assert all(torch.equal(a, b) for a, b in zip(runs[0].best_xi, runs[1].best_xi))


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_a_kept_best_gradient_gives_the_iterates_of_evaluating_it_again_bit_for_bit(metric):
    """On a tiny Llama with every symmetry (the fast GL factor's gradients carry Gram products that a first ascent
    step adds to and a second reuses), restarts from the kept gradient and from a new evaluation at the best point
    give the same values and best point, bit for bit, with fewer evaluations."""
    space, f_and_grad = _tiny_llama_space(metric)
    calls = []

    def counted(xi):
        calls[-1] += 1
        return f_and_grad(xi)
    runs = []
    for keep in (False, True):
        calls.append(0)
        runs.append(apgd(counted, space, 2.0, n_iter=20, random_start=True,
                         generator=torch.Generator().manual_seed(3), keep_best_gradient=keep))
    assert calls[1] == 21 < calls[0]  # restarts happened
    assert runs[0].values == runs[1].values
    assert all(torch.equal(a, b) for a, b in zip(runs[0].best_xi, runs[1].best_xi))
