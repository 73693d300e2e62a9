"""Base-point caches of the generated kernels (``prepare(G, H, eps)`` → ``cache=``): cached calls equal
uncached calls to round-off in float64 (with and without the ε relaxation, batched), derivatives with
respect to ξ through a cached kernel are exact, the runtime's factored Sylvester solve and SPD inverse
are right (including forward-mode derivatives), and the printer's cost rules hold (no n×n
intermediates, shared Gᵀξ products)."""
import importlib
import re
import inspect

import pytest
import sympy as sp
import torch
from hypothesis import given, strategies as st
from torch.func import grad, jvp

from codegen import runtime as rt
from codegen.builtins import BUILTIN_GEOMETRIES
from codegen.generate import GENERATED_DIR
from codegen.printer import BatchedTorchPrinter
from geosharp_ref.sampling import sample_point, sample_tangent

MATRIX_MODULES = [n for n in BUILTIN_GEOMETRIES
                  if hasattr(importlib.import_module(f"codegen.generated.{n}"), "prepare")]
KERNELS = ("inner", "horizontal_residual", "horizontal_lambda", "horizontal_projection",
           "riemannian_gradient", "geodesic_acceleration", "second_order_geodesic", "second_order_geodesic_vjp")
TWO_TANGENTS = ("inner", "second_order_geodesic_vjp")  # (ξ, η) and (ξ, cotangent)


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def test_every_matrix_module_has_prepare_and_cache_arguments():
    assert {"gl_inv", "gl_mix"} <= set(MATRIX_MODULES)
    for name in MATRIX_MODULES:
        mod = importlib.import_module(f"codegen.generated.{name}")
        for k in KERNELS:
            assert "cache" in inspect.signature(getattr(mod, k)).parameters, (name, k)


@pytest.mark.parametrize("name", MATRIX_MODULES)
@given(seed=st.integers(0, 10_000), batch=st.lists(st.integers(1, 3), min_size=0, max_size=2),
       eps=st.sampled_from([0.0, 1e-3]))
def test_cached_kernels_equal_uncached(name, seed, batch, eps):
    mod = importlib.import_module(f"codegen.generated.{name}")
    point = sample_point(mod, batch=tuple(batch), seed=seed)
    xi = sample_tangent(mod, point, seed=seed + 1)
    eta = sample_tangent(mod, point, seed=seed + 2)
    cache = mod.prepare(*point, eps=eps)
    for k in KERNELS:
        fn = getattr(mod, k)
        args = (*point, *xi, *eta) if k in TWO_TANGENTS else (*point, *xi)
        a = _as_tuple(fn(*args, eps=eps))
        b = _as_tuple(fn(*args, eps=eps, cache=cache))
        for x, y in zip(a, b):
            scale = max(float(x.abs().max()), 1e-300)
            assert float((x - y).abs().max()) <= 1e-12 * max(scale, 1.0), (name, k)


def test_cached_projection_is_horizontal_and_idempotent():
    mod = importlib.import_module("codegen.generated.gl_inv")
    point = sample_point(mod, batch=(3, 4), sizes={"n": 9, "m": 7, "h": 4}, seed=11)
    xi = sample_tangent(mod, point, seed=12)
    cache = mod.prepare(*point)
    p = mod.horizontal_projection(*point, *xi, cache=cache)
    assert float(mod.horizontal_residual(*point, *p, cache=cache).abs().max()) < 1e-12
    pp = mod.horizontal_projection(*point, *p, cache=cache)
    for a, b in zip(p, pp):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["gl_inv", "gl_mix"])
def test_derivatives_in_xi_through_cached_kernels(name):
    """Auto-PGD differentiates exp2 in ξ with the cache held fixed: gradcheck in ξ."""
    mod = importlib.import_module(f"codegen.generated.{name}")
    point = sample_point(mod, batch=(2,), sizes={"n": 4, "m": 3, "h": 2}, seed=3)
    xi = sample_tangent(mod, point, seed=4)
    cache = mod.prepare(*point)

    def f(*x):
        acc = mod.geodesic_acceleration(*point, *x, cache=cache)
        proj = mod.horizontal_projection(*point, *x, cache=cache)
        return sum(a.sum() for a in acc) + sum((p ** 2).sum() for p in proj) + mod.inner(*point, *x, *x, cache=cache).sum()

    assert torch.autograd.gradcheck(f, tuple(t.clone().requires_grad_(True) for t in xi), eps=1e-6, atol=1e-6)


@given(seed=st.integers(0, 10_000), h=st.integers(1, 6))
def test_solve_sylvester_factored_equals_spd_product_solver(seed, h):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(3, h + 2, h, generator=g, dtype=torch.float64)
    B = torch.randn(3, h + 3, h, generator=g, dtype=torch.float64)
    S1, S2 = A.mT @ A + 0.1 * torch.eye(h, dtype=torch.float64), B.mT @ B + 0.1 * torch.eye(h, dtype=torch.float64)
    C = torch.randn(3, h, h, generator=g, dtype=torch.float64)
    L = rt.solve_sylvester_factored(rt.sylvester_spd_product_factors(S1, S2), C)
    ref = rt.solve_sylvester_spd_product(S1, S2, C)
    torch.testing.assert_close(L, ref, rtol=1e-10, atol=1e-12)
    P = S1 @ S2
    torch.testing.assert_close(P @ L + L @ P, C, rtol=1e-10, atol=1e-10)


def test_spd_inverse_value_and_all_derivative_modes():
    g = torch.Generator().manual_seed(0)
    G = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    d = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    X = torch.randn(2, 3, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(rt.spd_inverse(G.mT @ G), torch.linalg.inv(G.mT @ G))

    def f(inv):
        return lambda G: (inv(G.mT @ G) * X).sum()

    mine, ref = f(rt.spd_inverse), f(torch.linalg.inv)
    torch.testing.assert_close(jvp(mine, (G,), (d,))[1], jvp(ref, (G,), (d,))[1])  # forward mode
    torch.testing.assert_close(jvp(grad(mine), (G,), (d,))[1], jvp(grad(ref), (G,), (d,))[1])
    torch.testing.assert_close(grad(mine)(G), grad(ref)(G))


def test_base_point_check_rejects_another_point_or_eps():
    mod = importlib.import_module("codegen.generated.gl_mix")
    G, H = sample_point(mod, batch=(2,), seed=1)
    cache = mod.prepare(G, H, eps=1e-4)
    assert cache.check(G, H, eps=1e-4) is cache
    with pytest.raises(ValueError, match="eps"):
        cache.check(G, H, eps=0.0)
    with pytest.raises(ValueError, match="different base point"):
        cache.check(G.clone(), H, eps=1e-4)


# -- printer / generator cost rules ---------------------------------------------------------------

def test_chain_order_avoids_large_intermediates():
    n, h = sp.symbols("n h")
    G = sp.MatrixSymbol("G", n, h)
    xi = sp.MatrixSymbol("xi", n, h)
    p = BatchedTorchPrinter(dims={}, small_dims={h})
    assert p.doprint(sp.MatMul(G, xi.T, xi)) == "G @ (xi.mT @ xi)"
    assert p.doprint(sp.MatMul(xi.T, G, G.T, xi)) == "(xi.mT @ G) @ (G.mT @ xi)"


def test_scalars_and_signs_land_on_small_factors():
    """A scalar times an n×h product scales the h×h factor (no pass over the n×h result); a sum puts
    a positive term first and subtracts the negative ones (no n×h term negated on its own)."""
    n, h = sp.symbols("n h")
    G = sp.MatrixSymbol("G", n, h)
    xi = sp.MatrixSymbol("xi", n, h)
    X = sp.MatrixSymbol("X", h, h)
    p = BatchedTorchPrinter(dims={}, small_dims={h})
    assert p.doprint(sp.MatMul(-1, G, X.T)) == "G @ (-X.mT)"
    assert p.doprint(sp.MatMul(sp.Rational(1, 2), G, X)) == "G @ (1/2 * X)"
    assert p.doprint(sp.MatMul(sp.Rational(1, 2), X, X)) == "1/2 * (X @ X)"  # small result: as is
    assert p.doprint(sp.MatAdd(sp.MatMul(-1, G, X), sp.MatMul(xi, X))) == "xi @ X - G @ X"
    assert p.doprint(sp.MatAdd(sp.MatMul(-1, G, X), sp.MatMul(-1, xi, X))) == "G @ (-X) - xi @ X"
    for name in ("gl_inv", "gl_mix"):
        text = (GENERATED_DIR / f"{name}.py").read_text()
        assert not re.search(r"-\((G|H|xi_G|xi_H|cot_G|cot_H) @", text), name
        assert not re.search(r"return -", text), name


def test_generated_gl_kernels_share_products_and_use_no_per_call_solves():
    for name in ("gl_inv", "gl_mix"):
        text = (GENERATED_DIR / f"{name}.py").read_text()
        body = text[text.index("def geodesic_acceleration"):text.index("def act")]
        assert "t0 + t0.mT" in body or "-t0 - t0.mT" in body  # Gᵀξ computed once per block
        assert "cholesky_solve" not in text


def test_factoring_folds_a_bare_block_into_an_identity():
    """B + ξ + ½(B S₁ + ξ S₂) → B (I + ½S₁) + ξ (I + ½S₂) when the brackets are h×h; a bare block
    stays a sum when the bracket would be large (n×n)."""
    from codegen.generate import factor_inverses
    n, h = sp.symbols("n h")
    G, xi = sp.MatrixSymbol("G", n, h), sp.MatrixSymbol("xi", n, h)
    S1, S2 = sp.MatrixSymbol("S1", h, h), sp.MatrixSymbol("S2", h, h)
    folded = factor_inverses(G + xi + G * S1 / 2 + xi * S2 / 2, small={h})
    I = sp.Identity(h)
    assert folded == sp.MatAdd(sp.MatMul(G, I + S1 / 2), sp.MatMul(xi, I + S2 / 2))
    P = sp.MatrixSymbol("P", n, n)
    left = factor_inverses(G + P * G, small={h})  # (I + P) G would be an n×n bracket
    assert left == G + P * G
