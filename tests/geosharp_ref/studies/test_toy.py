"""Scalar toy model (paper App. D, Figures 1 and 6): invariance along orbits and closed forms.

Closed forms (derived by hand, independent of the generated kernels and of torch.func).

Loss. With β = g h and data (xᵢ, yᵢ), i = 1..n: L(g, h) = ℓ(β) = (1/n) Σ (β xᵢ − yᵢ)², so
ℓ'(β) = (2/n) Σ xᵢ(β xᵢ − yᵢ) and ℓ'' = (2/n) Σ xᵢ² (a constant).

Euclidean. ∂_g L = ℓ' h, ∂_h L = ℓ' g, so ‖∇L‖ = |ℓ'| √(g² + h²); ∂²_gg L = ℓ'' h², ∂²_hh L = ℓ'' g²,
∂²_gh L = ℓ'' β + ℓ', so tr ∇²L = ℓ''(g² + h²). Along an orbit (a g, h/a) g² + h² changes, hence
neither is constant.

Quotient. The submersion π(g, h) = β has dπ(ξ) = h ξ_g + g ξ_h. For both metrics the horizontal
vectors are ξ = (g b, h b) (ξ_g/g = ξ_h/h = b), mapped to δβ = 2 β b.
* metric (5) inv: ‖ξ‖² = b² + b² = 2b², so the quotient metric is ĝ(β) = 2b²/(2βb)² = 1/(2β²).
* metric (6) mix: ‖ξ‖² = h²g²b² + g²h²b² = 2β²b², so ĝ(β) = 2β²b²/(2βb)² = 1/2 (flat).
On the 1-D quotient, ‖grad ℓ‖² = ℓ'²/ĝ, so
    ‖grad L‖_inv = √2 |β ℓ'(β)|,      ‖grad L‖_mix = √2 |ℓ'(β)|.
The Riemannian Hessian of ℓ on the quotient is ℓ'' − Γ̂ ℓ' with Γ̂ = ½ ĝ⁻¹ ĝ' and its trace is
ĝ⁻¹(ℓ'' − Γ̂ ℓ'): inv: ĝ' = −1/β³, Γ̂ = −1/β, trace = 2β²ℓ'' + 2βℓ'; mix: Γ̂ = 0, trace = 2ℓ''.
By O'Neill's formula this equals Hess L(ê, ê) on the total space for the g-unit horizontal ê.

Vertical part (total space). v = (g, −h), ‖v‖² = 2 (inv) or 2β² (mix). inv: in coordinates
(log|g|, log|h|) metric (5) is Euclidean, orbits are straight lines (geodesics), Hess L(v̂, v̂) = 0.
mix: Γ¹₁₂ = 1/h, Γ¹₂₂ = −g/h², Γ²₁₂ = 1/g, Γ²₁₁ = −h/g² (others 0) give
Hess L = [[ℓ''h² + ℓ'h/g, ℓ''β − ℓ'], [ℓ''β − ℓ', ℓ''g² + ℓ'g/h]], so Hess L(v̂, v̂) = 4βℓ'/(2β²) = 2ℓ'/β
and tr 𝔾⁻¹Hess L = 2ℓ'' + 2ℓ'/β. All of these are functions of β: constant along orbits.
"""
import math

import pytest
import torch

from geosharp_ref.studies import toy
from geosharp_ref.verification.reference import christoffel_contraction

DATASETS = [toy.DEFAULT_DATA, toy.ToyData(x=(1.0,), y=(1.0,)), toy.ToyData(x=(0.5, -1.5), y=(2.0, 0.3))]
POINTS = [(0.7, -1.3), (1.2, 0.9), (-0.4, -2.1), (-1.7, 0.25)]
SCALES = [1e-2, 0.1, 0.37, 1.0, 2.5, 30.0, 1e2]

INVARIANT = ["loss", "riemannian_grad_norm_inv", "riemannian_grad_norm_mix", "quotient_hessian_inv",
             "quotient_hessian_mix", "riemannian_hessian_trace_inv", "riemannian_hessian_trace_mix",
             "vertical_hessian_mix"]
NOT_INVARIANT = ["euclidean_grad_norm", "euclidean_hessian_trace",
                 "euclidean_trace_of_riemannian_hessian_mix"]


def spread(v):
    """Relative spread (max − min)/max|v| of a 1-D tensor."""
    return float((v.max() - v.min()) / v.abs().max().clamp_min(1e-300))


def ell(beta, data):
    x, y = data.tensors()
    d1 = 2 * (x * (beta[..., None] * x - y)).mean(-1)
    d2 = 2 * (x * x).mean()
    return d1, d2


@pytest.mark.parametrize("data", DATASETS)
@pytest.mark.parametrize("g, h", POINTS)
def test_riemannian_quantities_constant_along_orbits(g, h, data):
    q = toy.orbit(g, h, SCALES, data)
    assert torch.allclose(q["g"] * q["h"], torch.full_like(q["g"], g * h), rtol=1e-14)
    for key in INVARIANT:
        assert spread(q[key]) <= 1e-10, (key, q[key])
    # inv: the vertical part vanishes (orbits are geodesics); invariant in absolute terms
    assert float(q["vertical_hessian_inv"].abs().max()) <= 1e-10 * float(q["quotient_hessian_inv"].abs().max())
    for key in NOT_INVARIANT:
        assert spread(q[key]) > 0.5, (key, q[key])


def test_euclidean_quantities_change_by_the_predicted_factor():
    """‖∇L‖ ∝ √(g² + h²) and tr ∇²L ∝ g² + h² along an orbit."""
    q = toy.orbit(0.8, 1.1, SCALES)
    r2 = q["g"] ** 2 + q["h"] ** 2
    for ratio in (q["euclidean_hessian_trace"] / r2, q["euclidean_grad_norm"] / r2.sqrt()):
        torch.testing.assert_close(ratio, ratio[:1].expand(len(SCALES)), rtol=1e-12, atol=0)
    assert float(q["euclidean_hessian_trace"].max() / q["euclidean_hessian_trace"].min()) > 1e3


@pytest.mark.parametrize("data", DATASETS)
def test_closed_forms(data):
    gen = torch.Generator().manual_seed(0)
    g = (torch.rand(50, generator=gen, dtype=torch.float64) * 4 - 2)
    h = (torch.rand(50, generator=gen, dtype=torch.float64) * 4 - 2)
    g = torch.where(g.abs() < 0.05, g + 0.1, g)
    h = torch.where(h.abs() < 0.05, h + 0.1, h)
    q = toy.quantities(g, h, data)
    beta = g * h
    d1, d2 = ell(beta, data)
    r2 = g * g + h * h
    x, y = data.tensors()
    expected = {
        "loss": ((beta[:, None] * x - y) ** 2).mean(-1),
        "euclidean_grad_norm": d1.abs() * r2.sqrt(),
        "euclidean_hessian_trace": d2 * r2,
        "riemannian_grad_norm_inv": math.sqrt(2) * (beta * d1).abs(),
        "riemannian_grad_norm_mix": math.sqrt(2) * d1.abs(),
        "quotient_hessian_inv": 2 * beta**2 * d2 + 2 * beta * d1,
        "quotient_hessian_mix": torch.full_like(beta, 2 * float(d2)),
        "vertical_hessian_mix": 2 * d1 / beta,
        "riemannian_hessian_trace_inv": 2 * beta**2 * d2 + 2 * beta * d1,
        "riemannian_hessian_trace_mix": 2 * d2 + 2 * d1 / beta,
        "euclidean_trace_of_riemannian_hessian_mix": d2 * r2 + d1 * (h / g + g / h),
    }
    for key, ref in expected.items():
        torch.testing.assert_close(q[key], ref, rtol=1e-11, atol=1e-11 * float(ref.abs().max()), msg=key)
    assert float(q["vertical_hessian_inv"].abs().max()) < 1e-10
    # total-space trace = horizontal part + vertical part (g-orthonormal basis ê, v̂)
    for m in toy.METRICS:
        torch.testing.assert_close(q[f"riemannian_hessian_trace_{m}"],
                                   q[f"quotient_hessian_{m}"] + q[f"vertical_hessian_{m}"], rtol=1e-11, atol=1e-11)


def test_euclidean_hessian_matches_hand_derivative():
    g, h = torch.tensor([0.6, -1.4], dtype=torch.float64), torch.tensor([1.3, 0.2], dtype=torch.float64)
    d1, d2 = ell(g * h, toy.DEFAULT_DATA)
    H = toy.euclidean_hessian(g, h)
    ref = torch.stack([torch.stack([d2 * h * h, d2 * g * h + d1], -1),
                       torch.stack([d2 * g * h + d1, d2 * g * g], -1)], -2)
    torch.testing.assert_close(H, ref, rtol=1e-13, atol=1e-13)


HAND_METRICS = {
    "inv": lambda p, xi, eta: xi[0] * eta[0] / p[0] ** 2 + xi[1] * eta[1] / p[1] ** 2,
    "mix": lambda p, xi, eta: p[1] ** 2 * xi[0] * eta[0] + p[0] ** 2 * xi[1] * eta[1],
}


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_polarised_christoffel_symbols_vs_koszul_reference(metric):
    """Γᵏᵢⱼξⁱξʲ from the polarised table vs −γ̈ computed by torch.func from a hand-written metric."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        p = tuple(torch.randn((), generator=gen, dtype=torch.float64) + 0.3 for _ in range(2))
        xi = torch.randn(2, generator=gen, dtype=torch.float64)
        table = toy.christoffel(metric, *p)
        assert torch.allclose(table, table.transpose(-1, -2), rtol=0, atol=1e-14)  # torsion-free
        got = torch.einsum("kij,i,j->k", table, xi, xi)
        ref = torch.stack(christoffel_contraction(HAND_METRICS[metric], p, (xi[0], xi[1])))
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
        G = toy.metric_matrix(metric, *p)
        e = torch.eye(2, dtype=torch.float64)
        Gref = torch.stack([torch.stack([HAND_METRICS[metric](p, e[i], e[j]) for j in range(2)]) for i in range(2)])
        torch.testing.assert_close(G, Gref, rtol=1e-14, atol=0)


def test_points_on_the_axes_are_refused():
    with pytest.raises(ValueError, match="excludes"):
        toy.quantities(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match="even"):
        toy.grid(n=21)
    with pytest.raises(ValueError, match="unknown metric"):
        toy.kernels("euclid")


def test_figure_is_written(tmp_path):
    path = tmp_path / "sub" / "toy.png"
    fig = toy.figure(path, n=40)
    assert path.is_file() and path.stat().st_size > 10_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(fig.axes) >= 8
