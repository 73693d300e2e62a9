"""Rotary Q/K pairs in the evaluator: the generic Factor passes the binding's kernel options (the rotary dimension)
to the RoPE subgroup kernels, and build_space routes rotary pairs to generic factors, plain GL(h) pairs to the
fast GL factor."""
from __future__ import annotations

import torch

from geosharp_ref.kernels import load_kernels
from geosharp_ref.sharpness import Factor, GLPairFactor, build_space
from tests import cases

cases.quiet_transformers()


def _phi3_qk():
    model, _, _, smap = cases.symmetry_case("phi3")  # partial rotary: r = 2 of h = 4
    params = cases.params_of(model)
    return params, smap, smap.group("model.layers.0.self_attn:qk")


def test_factor_passes_the_rotary_dimension_cached_and_uncached():
    params, _, qk = _phi3_qk()
    for metric in ("inv", "mix"):
        g = qk.with_metric(metric)
        f = Factor(g.kernels, g)
        assert f.kernel_options == {"rotary_dim": 2}
        point = g.extract(params)
        cache = f.prepare(point)
        assert cache.rotary_dim == 2
        xi = tuple(torch.randn(X.shape, generator=torch.Generator().manual_seed(1), dtype=X.dtype) for X in point)
        cached, uncached = f.project(point, xi, cache), f.project(point, xi)
        for a, b in zip(cached, uncached):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
        # horizontal: g-orthogonal to v(E) for every E of the subalgebra of r = 2 (dimension 2 + 2² = 6) ...
        mod = load_kernels(g.kernels)
        basis = mod.subalgebra_basis(4, 2).matrices(point[0].dtype)
        assert basis.shape[0] == 6
        for E in basis:
            v = mod.vertical(*point, E.expand(point[0].shape[0], 4, 4))
            assert float(f.inner(point, cached, v).abs()) <= 1e-9 * float(f.inner(point, xi, xi).sqrt())
        # ... but not to those of the full-rotary subalgebra (r = 4: other coordinates paired), nor to all of gl(4)
        full = mod.subalgebra_basis(4, 4).matrices(point[0].dtype)
        assert max(float(f.inner(point, cached, mod.vertical(*point, E.expand(point[0].shape[0], 4, 4))).abs())
                   for E in torch.eye(16, dtype=point[0].dtype).reshape(16, 4, 4)) > 1e-6
        assert full.shape[0] == 4


def test_build_space_routes_rotary_pairs_to_generic_factors():
    params, smap, qk = _phi3_qk()
    space = build_space(params, smap, "mix")
    fast = [f for f in space.factors if isinstance(f, GLPairFactor)]
    generic = [f for f in space.factors if isinstance(f, Factor)]
    assert len(fast) == 1 and all(g.rotary is None for g in fast[0].groups) and len(fast[0].groups) == 2
    assert sorted(f.binding.key for f in generic) == sorted(g.key for g in smap.groups if g.rotary is not None)
    assert all(f.kernels == "rope_half_mix" for f in generic)
    space_inv = build_space(params, smap, "inv")
    assert all(f.kernels == "rope_half_inv" for f in space_inv.factors if isinstance(f, Factor))
