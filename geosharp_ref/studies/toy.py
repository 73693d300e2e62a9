"""Scalar toy model of the paper's Appendix D (Figures 1 and 6), evaluated with the generated kernels.

Model and data. Two scalar weights g, h; the network is f(x) = g·h·x and the loss is the mean square
error on a tiny data set (x_i, y_i):

    L(g, h) = (1/n) Σ_i (g h x_i − y_i)²  =: ℓ(β),   β = g h.

The loss is invariant under the GL(1) re-scaling ψ_a(g, h) = (a g, h/a), a ≠ 0; its orbits are the
hyperbolas g h = const. The total space is {g ≠ 0, h ≠ 0} (full column rank in 1-D).

Geometry (no SymPy here: everything comes from the generated kernels ``codegen.generated.diag_inv``
and ``diag_mix``, i.e. the element-wise re-scaling with u = g, v = h):

* metric (5) ``inv``: ⟨ξ, η⟩ = ξ_g η_g / g² + ξ_h η_h / h²;
* metric (6) ``mix``: ⟨ξ, η⟩ = h² ξ_g η_g + g² ξ_h η_h.

Computed quantities (all broadcast over arrays of points):

* loss, Euclidean gradient norm ‖∇L‖ (torch.func.grad), Euclidean Hessian trace tr ∇²L
  (torch.func.hessian);
* Riemannian gradient norm ‖grad L‖_g = √g(𝔾⁻¹∇L, 𝔾⁻¹∇L) from the kernels' ``riemannian_gradient``
  and ``inner``;
* Christoffel symbols Γᵏᵢⱼ by polarisation of the kernels' ``geodesic_acceleration`` (= −Γ(ξ, ξ)):
  Γ(eᵢ, eⱼ) = ½(Γ(eᵢ+eⱼ, eᵢ+eⱼ) − Γ(eᵢ, eᵢ) − Γ(eⱼ, eⱼ));
* the Riemannian Hessian (Hess L)ᵢⱼ = ∂ᵢ∂ⱼL − Γᵏᵢⱼ ∂ₖL (a symmetric 2×2 matrix) and

  - its metric trace on the total space, tr(𝔾⁻¹ Hess L)        (``riemannian_hessian_trace_*``),
  - its restriction to the horizontal line, Hess L(ê, ê) with ê the g-unit horizontal vector
    (``quotient_hessian_*``): the quotient is 1-D (coordinate β), and by O'Neill's formula for the
    Riemannian submersion (g, h) ↦ β this *is* the trace of the Riemannian Hessian of ℓ on the quotient,
  - its vertical part Hess L(v̂, v̂), v̂ the g-unit vertical vector (``vertical_hessian_*``);
    total trace = quotient + vertical (ê, v̂ is a g-orthonormal basis).

Which Hessian quantity is invariant along the orbits g h = const? Both metrics are invariant
(ψ_a is an isometry) and L∘ψ_a = L, so the Riemannian Hessian is carried to itself by dψ_a and *every*
metric trace of it is constant along orbits: the total-space trace, the quotient (horizontal) part and
the vertical part (checked numerically in tests/geosharp_ref/studies/test_toy.py to round-off, ≤ 1e-12
relative). What is *not* invariant: the Euclidean trace tr ∇²L = ℓ''(β)(g² + h²), the Euclidean
gradient norm |ℓ'(β)|·√(g² + h²), and the Euclidean trace of the Riemannian Hessian tr(Hess L) (trace
taken without 𝔾⁻¹). The quantity that belongs to the quotient — a function of β alone, the curvature
of ℓ on the quotient — is the horizontal restriction:

    inv:  quotient = 2β²ℓ'' + 2βℓ',   vertical = 0          (orbits are geodesics: in log-coordinates
                                                              (log|g|, log|h|) metric (5) is flat)
    mix:  quotient = 2ℓ'' (constant), vertical = 2ℓ'/β     (the orbits' mean curvature against grad L)

So under ``inv`` the total-space trace equals the quotient one; under ``mix`` it carries the extra
orbit-curvature term 2ℓ'(β)/β, which vanishes only where ℓ'(β) = 0 (on the minimising orbit) and
blows up near the axes. The total-space trace is therefore invariant too, but it is not the quotient's
Hessian trace in general; use ``quotient_hessian_*`` as the invariant flatness measure.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.func import grad, hessian, vmap

from ..kernels import load_kernels

__all__ = ["ToyData", "DEFAULT_DATA", "METRICS", "kernels", "loss", "euclidean_gradient",
           "euclidean_hessian", "metric_matrix", "christoffel", "riemannian_gradient_norm",
           "riemannian_hessian", "riemannian_hessian_trace", "quotient_hessian", "vertical_hessian",
           "quantities", "orbit", "grid", "figure", "QUANTITY_LABELS"]

METRICS = {"inv": "diag_inv", "mix": "diag_mix"}  # paper's metric (5) and metric (6)


@dataclass(frozen=True)
class ToyData:
    """A tiny 1-D regression data set (x_i, y_i)."""

    x: tuple = (1.0, 2.0, -1.0)
    y: tuple = (0.9, 2.2, -1.1)

    def tensors(self, dtype=torch.float64):
        return torch.tensor(self.x, dtype=dtype), torch.tensor(self.y, dtype=dtype)

    @property
    def beta_star(self) -> float:
        """Least-squares minimiser β* = Σ x y / Σ x² of ℓ(β)."""
        return sum(a * b for a, b in zip(self.x, self.y)) / sum(a * a for a in self.x)


DEFAULT_DATA = ToyData()


def kernels(metric: str):
    """The generated kernel module for ``metric`` ('inv' = metric (5), 'mix' = metric (6))."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {tuple(METRICS)}")
    return load_kernels(METRICS[metric])


def _points(g, h, dtype=torch.float64):
    g = torch.as_tensor(g, dtype=dtype)
    h = torch.as_tensor(h, dtype=dtype)
    g, h = torch.broadcast_tensors(g, h)
    if bool((g == 0).any()) or bool((h == 0).any()):
        raise ValueError("the toy model's total space excludes g = 0 and h = 0 (metrics are singular)")
    return g, h


def loss(g, h, data: ToyData = DEFAULT_DATA):
    """L(g, h) = mean_i (g h x_i − y_i)², broadcast over g, h."""
    g = torch.as_tensor(g, dtype=torch.float64)
    h = torch.as_tensor(h, dtype=torch.float64)
    x, y = data.tensors(g.dtype)
    return (((g * h)[..., None] * x - y) ** 2).mean(-1)


def _theta_loss(data):
    def f(theta):
        return loss(theta[0], theta[1], data)
    return f


def _map_points(fn, g, h):
    """vmap ``fn(theta)`` over the broadcast points; result shaped (*batch, *out)."""
    theta = torch.stack([g.reshape(-1), h.reshape(-1)], dim=-1)
    out = vmap(fn)(theta)
    return out.reshape(g.shape + out.shape[1:])


def euclidean_gradient(g, h, data: ToyData = DEFAULT_DATA):
    """∇L = (∂_g L, ∂_h L) by torch.func.grad; shape (..., 2)."""
    g, h = _points(g, h)
    return _map_points(grad(_theta_loss(data)), g, h)


def euclidean_hessian(g, h, data: ToyData = DEFAULT_DATA):
    """∇²L by torch.func.hessian; shape (..., 2, 2)."""
    g, h = _points(g, h)
    return _map_points(hessian(_theta_loss(data)), g, h)


def _basis(g):
    one, zero = torch.ones_like(g), torch.zeros_like(g)
    return (one, zero), (zero, one)


def metric_matrix(metric: str, g, h):
    """𝔾ᵢⱼ = ⟨eᵢ, eⱼ⟩ from the kernel's ``inner``; shape (..., 2, 2)."""
    mod = kernels(metric)
    g, h = _points(g, h)
    e = _basis(g)
    rows = [torch.stack([mod.inner(g, h, *e[i], *e[j]) for j in range(2)], -1) for i in range(2)]
    return torch.stack(rows, -2)


def christoffel(metric: str, g, h):
    """Γᵏᵢⱼ, shape (..., k, i, j), by polarising the kernel's γ̈(0) = −Γ(ξ, ξ)."""
    mod = kernels(metric)
    g, h = _points(g, h)
    e = _basis(g)

    def gamma(xi):  # Γ(ξ, ξ) as (..., 2)
        return -torch.stack(mod.geodesic_acceleration(g, h, *xi), -1)

    quad = [gamma(e[i]) for i in range(2)]
    out = torch.empty(g.shape + (2, 2, 2), dtype=g.dtype)
    for i in range(2):
        for j in range(2):
            s = (e[i][0] + e[j][0], e[i][1] + e[j][1])
            out[..., :, i, j] = 0.5 * (gamma(s) - quad[i] - quad[j])
    return out


def riemannian_gradient_norm(metric: str, g, h, data: ToyData = DEFAULT_DATA):
    """‖grad L‖_g with grad L = 𝔾⁻¹∇L from the kernel's ``riemannian_gradient`` and ``inner``."""
    mod = kernels(metric)
    g, h = _points(g, h)
    eg = euclidean_gradient(g, h, data)
    rg = mod.riemannian_gradient(g, h, eg[..., 0], eg[..., 1])
    return mod.inner(g, h, *rg, *rg).clamp_min(0).sqrt()


def _riemannian_hessian(metric, g, h, eg, eh):
    return eh - torch.einsum("...kij,...k->...ij", christoffel(metric, g, h), eg)


def riemannian_hessian(metric: str, g, h, data: ToyData = DEFAULT_DATA):
    """(Hess L)ᵢⱼ = ∂ᵢ∂ⱼL − Γᵏᵢⱼ ∂ₖL, shape (..., 2, 2) (a (0,2)-tensor: apply 𝔾⁻¹ to trace it)."""
    g, h = _points(g, h)
    return _riemannian_hessian(metric, g, h, euclidean_gradient(g, h, data), euclidean_hessian(g, h, data))


def _trace(metric, g, h, H):
    return torch.linalg.solve(metric_matrix(metric, g, h), H).diagonal(dim1=-2, dim2=-1).sum(-1)


def riemannian_hessian_trace(metric: str, g, h, data: ToyData = DEFAULT_DATA):
    """tr(𝔾⁻¹ Hess L) on the 2-D total space (invariant along orbits; see the module doc)."""
    g, h = _points(g, h)
    return _trace(metric, g, h, riemannian_hessian(metric, g, h, data))


def _unit(mod, g, h, xi):
    n = mod.inner(g, h, *xi, *xi).sqrt()
    return torch.stack([xi[0] / n, xi[1] / n], -1)


def _restricted(metric, g, h, H, which):
    """H(ê, ê) for the g-unit horizontal (or vertical) vector ê at (g, h)."""
    mod = kernels(metric)
    if which == "horizontal":  # e_g is never vertical for h ≠ 0; its projection spans the horizontal line
        one, zero = _basis(g)[0]
        xi = mod.horizontal_projection(g, h, one, zero)
    else:
        xi = mod.vertical(g, h, torch.ones_like(g))
    e = _unit(mod, g, h, xi)
    return torch.einsum("...i,...ij,...j->...", e, H, e)


def quotient_hessian(metric: str, g, h, data: ToyData = DEFAULT_DATA):
    """Hess L(ê, ê), ê the g-unit horizontal vector: the Riemannian Hessian (trace) of ℓ on the 1-D
    quotient. A function of β = g h only."""
    g, h = _points(g, h)
    return _restricted(metric, g, h, riemannian_hessian(metric, g, h, data), "horizontal")


def vertical_hessian(metric: str, g, h, data: ToyData = DEFAULT_DATA):
    """Hess L(v̂, v̂), v̂ the g-unit vertical vector (= −dL(∇_v̂ v̂), the orbit-curvature term)."""
    g, h = _points(g, h)
    return _restricted(metric, g, h, riemannian_hessian(metric, g, h, data), "vertical")


QUANTITY_LABELS = {
    "loss": "loss L",
    "euclidean_grad_norm": "Euclidean ‖∇L‖",
    "riemannian_grad_norm_inv": "Riemannian ‖grad L‖, metric (5) inv",
    "riemannian_grad_norm_mix": "Riemannian ‖grad L‖, metric (6) mix",
    "euclidean_hessian_trace": "Euclidean tr ∇²L",
    "riemannian_hessian_trace_inv": "tr 𝔾⁻¹Hess L (total space), inv",
    "riemannian_hessian_trace_mix": "tr 𝔾⁻¹Hess L (total space), mix",
    "quotient_hessian_inv": "quotient Hess L(ê,ê), inv",
    "quotient_hessian_mix": "quotient Hess L(ê,ê), mix",
    "vertical_hessian_inv": "vertical Hess L(v̂,v̂), inv",
    "vertical_hessian_mix": "vertical Hess L(v̂,v̂), mix",
    "euclidean_trace_of_riemannian_hessian_mix": "tr Hess L without 𝔾⁻¹, mix",
}


def quantities(g, h, data: ToyData = DEFAULT_DATA) -> dict:
    """Every toy quantity at the (broadcast) points, as float64 tensors keyed as in QUANTITY_LABELS."""
    g, h = _points(g, h)
    eg = euclidean_gradient(g, h, data)
    eh = euclidean_hessian(g, h, data)
    out = {
        "loss": loss(g, h, data),
        "euclidean_grad_norm": eg.norm(dim=-1),
        "euclidean_hessian_trace": eh.diagonal(dim1=-2, dim2=-1).sum(-1),
    }
    for m in METRICS:
        mod = kernels(m)
        rg = mod.riemannian_gradient(g, h, eg[..., 0], eg[..., 1])
        out[f"riemannian_grad_norm_{m}"] = mod.inner(g, h, *rg, *rg).clamp_min(0).sqrt()
        H = _riemannian_hessian(m, g, h, eg, eh)
        out[f"riemannian_hessian_trace_{m}"] = _trace(m, g, h, H)
        out[f"quotient_hessian_{m}"] = _restricted(m, g, h, H, "horizontal")
        out[f"vertical_hessian_{m}"] = _restricted(m, g, h, H, "vertical")
        if m == "mix":
            out["euclidean_trace_of_riemannian_hessian_mix"] = H.diagonal(dim1=-2, dim2=-1).sum(-1)
    return {k: out[k] for k in QUANTITY_LABELS}


def orbit(g: float, h: float, scales, data: ToyData = DEFAULT_DATA) -> dict:
    """Quantities along the orbit ψ_a(g, h) = (a g, h/a) for a in ``scales`` (via the kernel's ``act``)."""
    a = torch.as_tensor(scales, dtype=torch.float64)
    g0 = torch.full_like(a, float(g))
    h0 = torch.full_like(a, float(h))
    ga, ha = kernels("inv").act(g0, h0, a)
    return {"a": a, "g": ga, "h": ha, **quantities(ga, ha, data)}


def grid(lim: float = 2.5, n: int = 200, data: ToyData = DEFAULT_DATA):
    """(G, H, quantities) on an n×n grid of [−lim, lim]² (n even: the axes g = 0, h = 0 are avoided)."""
    if n % 2:
        raise ValueError("use an even n so that the grid avoids the singular axes g = 0 and h = 0")
    t = torch.linspace(-lim, lim, n, dtype=torch.float64)
    G, H = torch.meshgrid(t, t, indexing="xy")
    return G, H, quantities(G, H, data)


PANELS = (
    ("loss", "(a)"), ("euclidean_grad_norm", "(b)"), ("riemannian_grad_norm_inv", "(c)"),
    ("riemannian_grad_norm_mix", "(d)"), ("euclidean_hessian_trace", "(e)"),
    ("quotient_hessian_inv", "(f)"), ("quotient_hessian_mix", "(g)"),
    ("riemannian_hessian_trace_mix", "(h)"),
)
_TITLE_NOTES = {
    "quotient_hessian_inv": "\n(= total-space tr 𝔾⁻¹Hess L: orbits are geodesics)",
    "quotient_hessian_mix": "\n(= 2ℓ'': the quotient metric is flat)",
    "riemannian_hessian_trace_mix": "\n(= quotient + orbit-curvature term 2ℓ'/β)",
}


def _levels(Z, k=14):
    z = Z[np.isfinite(Z)]
    lv = np.unique(np.quantile(z, np.linspace(0.03, 0.97, k)))
    return lv if lv.size >= 2 and lv[-1] - lv[0] > 1e-9 * max(1.0, abs(lv[-1])) else None


def figure(path, lim: float = 2.5, n: int = 200, data: ToyData = DEFAULT_DATA, dpi: int = 110):
    """Level sets of the toy quantities (paper Figures 1 and 6), orbits g h = const dashed, the
    minimising orbit g h = β* in red. Writes ``path`` (Agg canvas, no pyplot state) and returns the
    matplotlib Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    G, H, q = grid(lim, n, data)
    Gn, Hn, B = G.numpy(), H.numpy(), (G * H).numpy()
    fig = Figure(figsize=(17, 8.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 4)
    bstar = data.beta_star
    orbit_levels = sorted({-2.0, -1.0, -0.3, 0.3, 2.0, 4.0} - {round(bstar, 6)})
    for ax, (key, tag) in zip(axes.ravel(), PANELS):
        Z = q[key].numpy()
        lv = _levels(Z)
        if lv is None:  # a constant field (e.g. the mix quotient Hessian 2ℓ'')
            im = ax.imshow(np.full_like(Z, Z.mean()), extent=(-lim, lim, -lim, lim), origin="lower",
                           cmap="viridis", aspect="auto")
            ax.text(0, 0.6 * lim, f"constant = {Z.mean():.4g}", ha="center", fontsize=10,
                    bbox=dict(fc="white", alpha=0.8))
        else:
            im = ax.contourf(Gn, Hn, Z, levels=lv, cmap="viridis", extend="both")
            ax.contour(Gn, Hn, Z, levels=lv, colors="k", linewidths=0.3, alpha=0.5)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
        ax.contour(Gn, Hn, B, levels=orbit_levels, colors="w", linestyles="--", linewidths=0.9)
        ax.contour(Gn, Hn, B, levels=[bstar], colors="r", linestyles="--", linewidths=1.3)
        ax.set_title(f"{tag} {QUANTITY_LABELS[key]}{_TITLE_NOTES.get(key, '')}", fontsize=9.5)
        ax.set_xlabel("g")
        ax.set_ylabel("h")
        ax.set_aspect("equal")
    fig.suptitle("Scalar toy model f = g·h·x, square loss; dashed: orbits g h = const "
                 f"(red: minimising orbit g h = β* = {bstar:.4g}). Riemannian quantities are "
                 "constant along orbits; Euclidean ones are not.", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return fig
