"""Elementwise Christoffel symbols at concrete small sizes: the slow, independent path.

At concrete sizes (e.g. n = 3, m = 2, h = 2) every block becomes an explicit matrix of coordinate
symbols θ_1, …, θ_N; the metric becomes its coordinate Gram matrix g_ij(θ) = ∂²g/∂ξ_i∂η_j, and

    Γ^k_ij = ½ g^{kl} (∂_i g_jl + ∂_j g_il − ∂_l g_ij),        γ̈^k(0) = −Γ^k_ij ξ^i ξ^j.

Derivatives are taken symbolically and evaluated at an exact rational point, so the comparison with
the matrix-level formula of :mod:`derivations.quotient` is exact (no tolerance). This path shares
nothing with the matrix-level derivation except the metric expression itself.
"""
from __future__ import annotations

import sympy as sp
from sympy import MatrixSymbol

from .metric import Metric
from .symmetry import evaluate

__all__ = ["coordinates", "christoffel_symbols", "geodesic_acceleration_elementwise"]


def coordinates(symmetry, sizes: dict):
    """Explicit coordinate matrices for each block: (replacements, flat list of coordinate symbols)."""
    repl, coords = {}, []
    for b in symmetry.blocks:
        if isinstance(b, MatrixSymbol):
            r, c = (int(sp.sympify(d).subs(sizes)) for d in b.shape)
            M = sp.Matrix(r, c, lambda i, j: sp.Symbol(f"{b.name}_{i}{j}", real=True))
            repl[b] = M
            coords += list(M)
        else:
            s = sp.Symbol(f"{b.name}_0", positive=True)
            repl[b] = s
            coords.append(s)
    return repl, coords


def christoffel_symbols(metric: Metric, sizes: dict, point: dict):
    """Γ^k_ij (a nested list N×N×N of exact numbers) at ``point`` (block → explicit value).

    Returns (Gamma, coords) with coordinates ordered block by block, row-major within a block."""
    sym = metric.symmetry
    repl, coords = coordinates(sym, sizes)
    xi_c = [sp.Symbol(f"dx{i}") for i in range(len(coords))]
    eta_c = [sp.Symbol(f"dy{i}") for i in range(len(coords))]
    tangent_x, tangent_e, k = {}, {}, 0
    for b, x, e in zip(sym.blocks, metric.xi, metric.eta):
        if isinstance(b, MatrixSymbol):
            r, c = repl[b].shape
            tangent_x[x] = sp.Matrix(r, c, xi_c[k:k + r * c])
            tangent_e[e] = sp.Matrix(r, c, eta_c[k:k + r * c])
            k += r * c
        else:
            tangent_x[x], tangent_e[e] = xi_c[k], eta_c[k]
            k += 1
    N = len(coords)
    at = {}
    for b, val in point.items():
        if isinstance(b, MatrixSymbol):
            at.update(dict(zip(list(repl[b]), list(val))))
        else:
            at[repl[b]] = val
    tangents = {**tangent_x, **tangent_e}

    def gram(expr):
        expr = sp.expand(expr)
        return sp.Matrix(N, N, lambda i, j: expr.coeff(xi_c[i]).coeff(eta_c[j]))

    def metric_at(values):
        blocks = {}
        for b in sym.blocks:
            M = repl[b]
            blocks[b] = M.subs(values) if isinstance(M, sp.MatrixBase) else M.subs(values)
        return evaluate(metric.expr, {**blocks, **tangents}, sizes, simplify=False)

    g0 = gram(metric_at(at))
    ginv = g0.inv()
    t = sp.Symbol("t")
    dg = []  # dg[l][i, j] = ∂_l g_ij, by differentiating along the l-th coordinate line
    for c in coords:
        moved = dict(at)
        moved[c] = at[c] + t
        g_t = metric_at(moved)
        dg.append(gram(sp.diff(g_t, t).subs(t, 0)))
    Gamma = [[[sp.S.Zero] * N for _ in range(N)] for _ in range(N)]
    for i in range(N):
        for j in range(i, N):
            w = sp.Matrix([dg[i][j, l] + dg[j][i, l] - dg[l][i, j] for l in range(N)])
            col = ginv * w / 2
            for kk in range(N):
                Gamma[kk][i][j] = Gamma[kk][j][i] = col[kk]
    return Gamma, coords


def geodesic_acceleration_elementwise(metric: Metric, sizes: dict, point: dict, velocity: dict):
    """−Γ^k_ij ξ^i ξ^j as a dict block → explicit value (same layout as the blocks)."""
    sym = metric.symmetry
    Gamma, coords = christoffel_symbols(metric, sizes, point)
    xi = []
    for b in sym.blocks:
        v = velocity[b]
        xi += list(v) if isinstance(v, sp.MatrixBase) else [v]
    N = len(coords)
    acc = [-sum(Gamma[k][i][j] * xi[i] * xi[j] for i in range(N) for j in range(N)) for k in range(N)]
    out, k = {}, 0
    for b in sym.blocks:
        v = velocity[b]
        if isinstance(v, sp.MatrixBase):
            r, c = v.shape
            out[b] = sp.Matrix(r, c, acc[k:k + r * c])
            k += r * c
        else:
            out[b] = acc[k]
            k += 1
    return out
