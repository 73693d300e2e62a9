"""Moving a model along every orbit of a quotient at once, and the invariance check the joint-quotient tests
share (geodesic sharpness unchanged, adaptive sharpness changed)."""
from __future__ import annotations

import torch

from geosharp_ref.sharpness import adaptive_sharpness, geodesic_sharpness
from geosharp_ref.verification.orbits import model_with_params

from .inputs import params_of


def moved_along_every_orbit(M, q, log10_a, seed, kinds=None):
    """The model acted on by a random element of every quotiented group (or those of the given classes) at once."""
    params = params_of(M.model)
    gen = torch.Generator().manual_seed(seed)
    for i, b in enumerate(q.pairs + q.bindings):
        if kinds is not None and not isinstance(b, kinds):
            continue
        jitter = float(torch.empty(()).uniform_(-0.2, 0.2, generator=gen))
        a = 10.0 ** max(-2.0, min(2.0, log10_a + jitter))
        params = b.act(params, b.random_element(params, scale=a, seed=seed + i))
    return model_with_params(M.model, params)


def assert_invariant_along_every_orbit(M, batch, q, metric, seed=3, n_iter=3, rho=0.05, tol=1e-8):
    """Geodesic sharpness (``symmetries="all"``) unchanged to ``tol`` (relative) when the model moves along every
    orbit of ``q`` at once with elements of scale 1e-2 and 1e2; adaptive sharpness changes."""
    kw = dict(metric=metric, n_iter=n_iter, loss_fn=M.loss_fn, symmetries="all")
    s0 = geodesic_sharpness(M.model, [batch], rho, **kw).mean
    a0 = adaptive_sharpness(M.model, [batch], rho, n_iter=n_iter, loss_fn=M.loss_fn).mean
    for log10_a in (-2.0, 2.0):
        m1 = moved_along_every_orbit(M, q, log10_a, seed)
        s1 = geodesic_sharpness(m1, [batch], rho, **kw).mean
        assert abs(s1 - s0) <= tol * abs(s0), (metric, log10_a, s0, s1)
        a1 = adaptive_sharpness(m1, [batch], rho, n_iter=n_iter, loss_fn=M.loss_fn).mean
        assert abs(a1 - a0) > 1e-4 * abs(a0)
