"""Spans (lazy block combinations): generated kernels evaluated on Spans equal the same kernels on
tensors, with the Gram products counted, and the reductions equal their element-wise definitions."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from geosharp_ref.kernels import load_kernels
from geosharp_ref.lazy_blocks import GramTable

shapes = st.tuples(st.lists(st.integers(1, 3), max_size=2), st.integers(3, 9), st.integers(3, 9),
                   st.integers(1, 3))


def _inputs(lead, n, m, h, seed):
    g = torch.Generator().manual_seed(seed)
    G, H = (torch.randn(*lead, r, h, generator=g, dtype=torch.float64) for r in (n + h, m + h))
    return G, H, *(torch.randn(X.shape, generator=g, dtype=torch.float64) for X in (G, H, G, H))


def _table(G, H, xG, xH, cG, cH):
    t = GramTable()
    names = ("G", "H", "xi_G", "xi_H", "cot_G", "cot_H")
    return t, [t.block(k, v) for k, v in zip(names, (G, H, xG, xH, cG, cH))]


@pytest.mark.parametrize("metric", ["inv", "mix"])
@given(shape=shapes, seed=st.integers(0, 2**16), eps=st.sampled_from([0.0, 1e-3]))
def test_generated_kernels_on_spans_equal_them_on_tensors(metric, shape, seed, eps):
    """Forward E(ξ), its VJP, 𝔾⁻¹ and the horizontal projection chained on Spans = on tensors (float64),
    with the Gram products the module doc promises: 4 for E (Gᵀξ_G, ξ_Gᵀξ_G and the H side), 4 more for
    the VJP (Gᵀū_G, ū_Gᵀξ_G, …), none for 𝔾⁻¹ and the projection once GᵀG, HᵀH are seeded."""
    K = load_kernels(f"gl_{metric}")
    lead, n, m, h = shape
    G, H, xG, xH, cG, cH = _inputs(lead, n, m, h, seed)
    cache = K.prepare(G, H, eps=eps)
    t, (sG, sH, sxG, sxH, scG, scH) = _table(G, H, xG, xH, cG, cH)
    t.seed("G", "G", G.mT @ G)
    t.seed("H", "H", H.mT @ H)

    E = K.second_order_geodesic(sG, sH, sxG, sxH, eps=eps, cache=cache)
    for a, b in zip(E, K.second_order_geodesic(G, H, xG, xH, eps=eps, cache=cache)):
        torch.testing.assert_close(a.materialize(), b, rtol=1e-10, atol=1e-10)
    assert t.products == 4

    eg = K.second_order_geodesic_vjp(sG, sH, sxG, sxH, scG, scH, eps=eps, cache=cache)
    eg_ref = K.second_order_geodesic_vjp(G, H, xG, xH, cG, cH, eps=eps, cache=cache)
    for a, b in zip(eg, eg_ref):
        torch.testing.assert_close(a.materialize(), b, rtol=1e-10, atol=1e-10)
    assert t.products == 8

    d = K.horizontal_projection(sG, sH, *K.riemannian_gradient(sG, sH, *eg, eps=eps, cache=cache),
                                eps=eps, cache=cache)
    d_ref = K.horizontal_projection(G, H, *K.riemannian_gradient(G, H, *eg_ref, eps=eps, cache=cache),
                                    eps=eps, cache=cache)
    for a, b in zip(d, d_ref):
        torch.testing.assert_close(a.materialize(), b, rtol=1e-9, atol=1e-9)
    assert t.products == 8

    # ⟨ξ, ∇⟩_F from the table (h×h work only) = the element-wise pairing
    xd = eg[0].frobenius_with_block("xi_G") + eg[1].frobenius_with_block("xi_H")
    ref = (xG * eg_ref[0]).sum((-2, -1)) + (xH * eg_ref[1]).sum((-2, -1))
    torch.testing.assert_close(xd, ref, rtol=1e-10, atol=1e-10)
    assert t.products == 8


@given(shape=shapes, seed=st.integers(0, 2**16))
def test_span_algebra_and_materialize(shape, seed):
    """(ξ A + G B − ū) C, ½·X and −X against the tensors; plain blocks (identity coefficients) and
    broadcast coefficients; ⟨B, X⟩_F with and without the Gram in the table."""
    lead, n, m, h = shape
    G, _, xG, _, cG, _ = _inputs(lead, n, m, h, seed)
    g = torch.Generator().manual_seed(seed + 1)
    A, B, C = (torch.randn(h, h, generator=g, dtype=torch.float64) for _ in range(3))
    t = GramTable()
    sG, sx, sc = t.block("G", G), t.block("x", xG), t.block("c", cG)
    X = (sx @ A + sG @ B - sc) @ C
    ref = (xG @ A + G @ B - cG) @ C
    torch.testing.assert_close(X.materialize(), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((0.5 * X).materialize(), 0.5 * ref)
    torch.testing.assert_close((-(sx + sx)).materialize(), -2 * xG)
    torch.testing.assert_close((X.mT @ sx), ref.mT @ xG, rtol=1e-12, atol=1e-12)
    assert t.products == 3  # Gᵀx, xᵀx, cᵀx
    torch.testing.assert_close(sc.frobenius_with_block("G"), (cG * G).sum((-2, -1)))
    assert t.products == 3  # element-wise: cᵀG was not in the table
    torch.testing.assert_close(X.frobenius_with_block("x"), (ref * xG).sum((-2, -1)), rtol=1e-12, atol=1e-12)


def test_span_misuse_is_refused():
    t, u = GramTable(), GramTable()
    a = t.block("a", torch.randn(4, 2))
    with pytest.raises(TypeError, match="right only"):
        a @ a
    with pytest.raises(TypeError, match="multiplies a Span"):
        a.mT @ torch.randn(4, 2)
    with pytest.raises(ValueError, match="different Gram tables"):
        a + u.block("a", torch.randn(4, 2))
    with pytest.raises(ValueError, match="already registered"):
        t.block("a", torch.randn(4, 2))
    with pytest.raises(TypeError, match="element-wise only"):
        (torch.eye(2) @ a.mT) * torch.randn(2, 4)
    with pytest.raises(TypeError, match="both matrix axes"):
        ((torch.eye(2) @ a.mT) * a.mT).sum(-1)


@pytest.mark.parametrize("metric", ["inv", "mix"])
@given(shape=shapes, seed=st.integers(0, 2**16), eps=st.sampled_from([0.0, 1e-3]))
def test_generated_metric_on_spans_equals_it_on_tensors(metric, shape, seed, eps):
    """The generated ``inner`` ((M Xᵀ) ⊙ Yᵀ summed) on Spans = on tensors (float64), for a block and
    for a combination X = ξ A + G B; g(ξ, ξ) of a block costs one Gram product per side (ξᵀξ)."""
    K = load_kernels(f"gl_{metric}")
    lead, n, m, h = shape
    G, H, xG, xH, _, _ = _inputs(lead, n, m, h, seed)
    cache = K.prepare(G, H, eps=eps)
    t, (sG, sH, sxG, sxH, _, _) = _table(G, H, xG, xH, xG, xH)
    val = K.inner(sG, sH, sxG, sxH, sxG, sxH, eps=eps, cache=cache)
    torch.testing.assert_close(val, K.inner(G, H, xG, xH, xG, xH, eps=eps, cache=cache), rtol=1e-12, atol=1e-12)
    assert t.products == 2
    A, B = (torch.randn(h, h, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64)
            for _ in range(2))
    XG, XH = sxG @ A + sG @ B, sxH @ B - sH @ A
    val = K.inner(sG, sH, XG, XH, sxG, sxH, eps=eps, cache=cache)
    ref = K.inner(G, H, xG @ A + G @ B, xH @ B - H @ A, xG, xH, eps=eps, cache=cache)
    torch.testing.assert_close(val, ref, rtol=1e-10, atol=1e-10)


def test_gram_table_copy_is_independent():
    """A copy shares the known products but computes its own; the original's counter is untouched."""
    t = GramTable()
    a, b = t.block("a", torch.randn(5, 2)), t.block("b", torch.randn(5, 2))
    t.gram("a", "b")
    c = t.copy()
    assert c.has_gram("b", "a") and not c.has_gram("a", "a")
    c.gram("a", "a")
    assert c.products == 1 and t.products == 1 and not t.has_gram("a", "a")
