"""Candidate Riemannian metrics on the parameter blocks of a symmetry, and their checks.

A :class:`Metric` is a SymPy expression g_θ(ξ, η) in the point θ (the symmetry's blocks) and two
tangent vectors ξ = ``symmetry.tangent("xi")``, η = ``symmetry.tangent("eta")``. It must be
bilinear and symmetric in (ξ, η), positive definite, and — for the quotient geometry to exist —
invariant under the group action with tangent vectors pushed forward:

    g_{ψ(A,θ)}(dψ_A ξ, dψ_A η) = g_θ(ξ, η)   for all A, θ, ξ, η.

:func:`check_invariance` returns a symbolic proof (the difference canonicalizes to zero, for every
size at once) or an exact rational counterexample.

Built-in metrics (docs/MATH.md):

* GL(h) pair, ``inv``: tr((GᵀG)⁻¹ ξ_Gᵀ η_G) + tr((HᵀH)⁻¹ ξ_Hᵀ η_H)
* GL(h) pair, ``mix``: tr(HᵀH ξ_Gᵀ η_G) + tr(GᵀG ξ_Hᵀ η_H)
* diagonal nets, metric (5) = ``inv`` at h = 1: ξ_u η_u / u² + ξ_v η_v / v²
* diagonal nets, metric (6) = ``mix`` at h = 1: v² ξ_u η_u + u² ξ_v η_v
* positive scaling, ``scale_invariant``: tr(ξᵀ η) / tr(WᵀW)
* translation, ``euclidean``: tr(ξᵀ η)
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import sympy as sp
from sympy import Inverse, MatAdd, MatMul, MatrixExpr, MatrixSymbol, Trace

from .errors import MetricError, NotInvariantError
from .matrix_calculus import canonicalize, is_zero
from .symmetry import Symmetry, concrete_sizes, evaluate, find_nonzero, random_point

__all__ = [
    "Metric",
    "InvarianceResult",
    "check_invariance",
    "check_metric",
    "builtin_metric",
    "BUILTIN_METRICS",
]


@dataclass(frozen=True)
class Metric:
    """A metric g_θ(ξ, η) for the blocks of ``symmetry``.

    ``expr`` uses the symmetry's blocks and the tangent symbols ``symmetry.tangent("xi")`` and
    ``symmetry.tangent("eta")``. For an element-wise symmetry the expression is per coordinate and
    the full metric is its sum over coordinates."""

    symmetry: Symmetry
    expr: sp.Expr
    name: str

    def __post_init__(self):
        """Refuse arguments of the wrong type at once, in one line (not deep inside the derivation)."""
        if not isinstance(self.symmetry, Symmetry):
            raise MetricError(f"Metric(symmetry, expr, name): symmetry must be a derivations Symmetry (e.g. "
                              f"gl_pair(...)), got {type(self.symmetry).__name__}")
        if not isinstance(self.name, str) or not self.name:
            raise MetricError(f"Metric(symmetry, expr, name): name must be a non-empty string, got {self.name!r}")
        if isinstance(self.expr, str):
            raise MetricError(f"Metric {self.name!r}: expr is the string {self.expr!r}; build it with SymPy from the "
                              f"symmetry's blocks and tangents, e.g. Trace(xi_B.T * eta_B) with (xi_B, …) = "
                              f"symmetry.tangent('xi')")
        if not isinstance(self.expr, sp.Basic):
            raise MetricError(f"Metric {self.name!r}: expr must be a SymPy expression, got "
                              f"{type(self.expr).__name__}")
        if isinstance(self.expr, MatrixExpr) and tuple(self.expr.shape) != (1, 1):
            raise MetricError(f"Metric {self.name!r}: expr is a matrix of shape {tuple(self.expr.shape)}, not a "
                              f"number; a metric is a scalar: take its trace, Trace(...)")

    def check_blocks(self, where: str = "") -> None:
        """Every block's tangent appears in the metric, in ξ and in η (else it is degenerate on that block: not
        positive definite); raises :class:`MetricError` naming the missing blocks."""
        missing = [b.name for b, x, e in zip(self.symmetry.blocks, self.xi, self.eta)
                   if not (self.expr.has(x) and self.expr.has(e))]
        if missing:
            raise MetricError(f"{where or 'Metric ' + repr(self.name)}: the metric measures no tangent of block(s) "
                              f"{missing} (their ξ and η do not both appear), so it is not positive definite; add a "
                              f"term for each block, e.g. Trace(xi_{missing[0]}.T * eta_{missing[0]})")

    @property
    def xi(self):
        return self.symmetry.tangent("xi")

    @property
    def eta(self):
        return self.symmetry.tangent("eta")

    def __call__(self, xi, eta, point=None):
        """g at ``point`` (default: the block symbols) on tangent vectors ``xi`` and ``eta``."""
        sub = dict(zip(self.xi, xi))
        sub.update(dict(zip(self.eta, eta)))
        if point is not None:
            sub.update(dict(zip(self.symmetry.blocks, point)))
        return canonicalize(self.expr.xreplace(sub))


# ------------------------------------------------------------------------------------------------
# Invariance
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InvarianceResult:
    """Outcome of :func:`check_invariance`.

    status: ``"proved"`` (symbolic difference is zero for all sizes), ``"counterexample"`` (an exact
    rational point where the difference is nonzero, in ``witness``), or ``"numerical"`` (symbolic
    simplification inconclusive, zero at every sampled exact point)."""

    status: str
    difference: sp.Basic
    witness: dict | None = None
    #: how invariance was established, in words (e.g. restriction from GL(h) to a subgroup)
    proof: str = ""

    @property
    def invariant(self) -> bool:
        return self.status != "counterexample"


def _is_group_factor(f, A) -> bool:
    return isinstance(f, MatrixExpr) and f.is_square and f.free_symbols <= {A} and f.has(A)


def _expand_group_inverses(expr, A):
    """Inverse(F M K) → K⁻¹ Inverse(M) F⁻¹ when F, K involve only the group element A."""
    if isinstance(expr, Inverse):
        arg = canonicalize(_expand_group_inverses(expr.arg, A))
        if isinstance(arg, MatMul):
            coeff, mats = arg.as_coeff_matrices()
            pre, post = [], []
            while len(mats) > 1 and _is_group_factor(mats[0], A):
                pre.append(mats.pop(0))
            while len(mats) > 1 and _is_group_factor(mats[-1], A):
                post.insert(0, mats.pop())
            inner = Inverse(MatMul(*mats).doit()) if mats else None
            parts = [Inverse(f) for f in reversed(post)]
            parts += [inner] if inner is not None else []
            parts += [Inverse(f) for f in reversed(pre)]
            return (MatMul(*parts) / coeff).doit()
        return Inverse(arg)
    if isinstance(expr, (MatrixSymbol,)) or getattr(expr, "is_Atom", False) or not expr.args:
        return expr
    return expr.func(*[_expand_group_inverses(a, A) for a in expr.args])


def _canonical_trace(tr: Trace):
    """Cyclic rotation of a trace's product with the fewest factors after cancellation."""
    arg = tr.arg
    if not isinstance(arg, MatMul):
        return tr
    coeff, mats = arg.as_coeff_matrices()
    best = None
    for k in range(len(mats)):
        rot = canonicalize(MatMul(*(mats[k:] + mats[:k])).doit())
        key = (len(rot.args) if isinstance(rot, MatMul) else 1, str(rot))
        if best is None or key < best[0]:
            best = (key, rot)
    rot = best[1]
    if isinstance(rot, MatAdd):
        return coeff * sp.Add(*[Trace(t) for t in rot.args])
    return coeff * Trace(rot)


def _canonical_traces(expr):
    if isinstance(expr, Trace):
        return _canonical_trace(expr)
    if getattr(expr, "is_Atom", False) or not getattr(expr, "args", ()):
        return expr
    if isinstance(expr, MatrixExpr):
        return expr
    return expr.func(*[_canonical_traces(a) for a in expr.args])


def simplify_under_group(expr, A):
    """Canonical form used to prove identities involving the group element A."""
    expr = canonicalize(_expand_group_inverses(expr, A))
    expr = canonicalize(_expand_group_inverses(expr, A))
    for _ in range(2):
        expr = sp.expand(_canonical_traces(expr))
    return sp.simplify(expr) if not isinstance(expr, MatrixExpr) else expr


def check_invariance(metric: Metric) -> InvarianceResult:
    """Prove g_{ψ(A,θ)}(dψ ξ, dψ η) = g_θ(ξ, η), or find an exact counterexample."""
    sym = metric.symmetry
    acted = sym.act()
    pushed_xi = sym.pushforward(metric.xi)
    pushed_eta = sym.pushforward(metric.eta)
    moved = metric(pushed_xi, pushed_eta, point=tuple(acted[b] for b in sym.blocks))
    diff = canonicalize(moved - canonicalize(metric.expr))
    diff = simplify_under_group(diff, sym.group_element)
    if is_zero(diff):
        return InvarianceResult("proved", diff)
    witness = find_nonzero(diff, sym, trials=3)
    if witness is not None:
        return InvarianceResult("counterexample", diff, witness)
    return InvarianceResult("numerical", diff)


# ------------------------------------------------------------------------------------------------
# Bilinearity, symmetry, positive definiteness (exact checks at random points)
# ------------------------------------------------------------------------------------------------

def component_gram(metric: Metric, sizes: dict, values: dict):
    """The metric's Gram matrix in coordinates at a concrete point (exact), plus the coordinate order.

    Tangent blocks are replaced by explicit matrices of coordinate symbols; the Gram matrix is
    ∂²g/∂ξ_i∂η_j (constant because g is bilinear)."""
    xi_coords, eta_coords, xi_repl, eta_repl = [], [], {}, {}
    for x, e in zip(metric.xi, metric.eta):
        if isinstance(x, MatrixSymbol):
            r, c = (int(sp.sympify(d).subs(sizes)) for d in x.shape)
            X = sp.Matrix(r, c, lambda i, j: sp.Symbol(f"{x.name}[{i},{j}]"))
            E = sp.Matrix(r, c, lambda i, j: sp.Symbol(f"{e.name}[{i},{j}]"))
            xi_repl[x], eta_repl[e] = X, E
            xi_coords += list(X)
            eta_coords += list(E)
        else:
            xs, es = sp.Symbol(f"{x.name}_c"), sp.Symbol(f"{e.name}_c")
            xi_repl[x], eta_repl[e] = xs, es
            xi_coords.append(xs)
            eta_coords.append(es)
    g = evaluate(metric.expr, {**values, **xi_repl, **eta_repl}, sizes)
    g = sp.expand(g)
    gram = sp.Matrix(len(xi_coords), len(eta_coords), lambda i, j: sp.diff(g, xi_coords[i], eta_coords[j]))
    return g, gram, xi_coords, eta_coords


def check_metric(metric: Metric, trials: int = 2, seed: int = 0) -> None:
    """Raise :class:`MetricError` unless the metric is bilinear, symmetric and positive definite at
    ``trials`` random exact points (a necessary check; a failure is a certain counterexample)."""
    sym = metric.symmetry
    rng = random.Random(seed)
    for t in range(trials):
        dims = ({"n": 3, "m": 2, "h": 2, "k": 2}, {"n": 2, "m": 3, "h": 1, "k": 3})[t % 2]
        sizes = concrete_sizes(metric.expr, dims)
        positive = set(sym.blocks) if sym.positive_blocks else set()
        values = random_point(sym.blocks, sizes, rng, positive=positive)
        g, gram, xc, ec = component_gram(metric, sizes, values)
        bilinear = sp.expand(g - sum(gram[i, j] * xc[i] * ec[j] for i in range(len(xc)) for j in range(len(ec))))
        if bilinear != 0 or any(sp.Matrix(gram).has(s) for s in xc + ec):
            raise MetricError(
                f"metric {metric.name!r} is not bilinear in (xi, eta): at sizes {sizes} the remainder "
                f"is {bilinear}; a metric must be linear in each tangent argument"
            )
        if gram != gram.T:
            raise MetricError(
                f"metric {metric.name!r} is not symmetric: g(xi, eta) != g(eta, xi) at sizes {sizes}, "
                f"point {({str(k): v for k, v in values.items()})}"
            )
        # Sylvester's criterion, exact in rational arithmetic
        if not all(gram[:k, :k].det() > 0 for k in range(1, gram.shape[0] + 1)):
            eig = float(min(np.linalg.eigvalsh(np.array(gram.evalf(), dtype=float))))
            raise MetricError(
                f"metric {metric.name!r} is not positive definite at sizes {sizes}, point "
                f"{({str(k): (v.tolist() if isinstance(v, sp.MatrixBase) else v) for k, v in values.items()})}"
                + f" (smallest eigenvalue {eig:.4g})"
                + "; a Riemannian metric needs g(xi, xi) > 0 for xi != 0"
            )


# ------------------------------------------------------------------------------------------------
# Built-in metrics
# ------------------------------------------------------------------------------------------------

def _gl_metric(sym, kind):
    G, H = sym.blocks
    (xG, xH), (eG, eH) = sym.tangent("xi"), sym.tangent("eta")
    if kind == "inv":
        expr = Trace(Inverse(G.T * G) * xG.T * eG) + Trace(Inverse(H.T * H) * xH.T * eH)
    else:
        expr = Trace(H.T * H * xG.T * eG) + Trace(G.T * G * xH.T * eH)
    return Metric(sym, expr, kind)


def _diag_metric(sym, kind):
    u, v = sym.blocks
    (xu, xv), (eu, ev) = sym.tangent("xi"), sym.tangent("eta")
    if kind == "inv":
        expr = xu * eu / u**2 + xv * ev / v**2
    else:
        expr = v**2 * xu * eu + u**2 * xv * ev
    return Metric(sym, expr, kind)


def _scaling_metric(sym, kind):
    (W,), (x,), (e,) = sym.blocks, sym.tangent("xi"), sym.tangent("eta")
    return Metric(sym, Trace(x.T * e) / Trace(W.T * W), kind)


def _euclidean(sym, kind):
    (x,), (e,) = sym.tangent("xi"), sym.tangent("eta")
    return Metric(sym, Trace(x.T * e), kind)


BUILTIN_METRICS = {
    ("gl_pair", "inv"): _gl_metric,
    ("gl_pair", "mix"): _gl_metric,
    ("elementwise_rescaling", "inv"): _diag_metric,
    ("elementwise_rescaling", "mix"): _diag_metric,
    ("positive_scaling", "scale_invariant"): _scaling_metric,
    ("translation", "euclidean"): _euclidean,
}


def builtin_metric(sym: Symmetry, kind: str) -> Metric:
    """A built-in metric for a built-in symmetry, e.g. ``builtin_metric(gl_pair(), "inv")``."""
    key = (sym.name, kind)
    if key not in BUILTIN_METRICS and getattr(sym, "subalgebra", None) is not None:
        key = ("gl_pair", kind)  # a subgroup of GL(h) acting like gl_pair: every GL(h)-invariant metric applies
    try:
        return BUILTIN_METRICS[key](sym, kind)
    except KeyError:
        known = sorted(k for s, k in BUILTIN_METRICS if s == key[0])
        raise MetricError(
            f"no built-in metric {kind!r} for symmetry {sym.name!r}; known: {known}. "
            "Declare your own with derivations.Metric(symmetry, expr, name)"
        ) from None


def require_invariant(metric: Metric) -> InvarianceResult:
    """:func:`check_invariance`, raising :class:`NotInvariantError` on a counterexample."""
    res = check_invariance(metric)
    if not res.invariant:
        raise NotInvariantError(
            f"metric {metric.name!r} is not invariant under {metric.symmetry.description}: "
            f"g(psi(A,theta))(dpsi xi, dpsi eta) - g(theta)(xi, eta) = {res.difference}, nonzero at "
            f"{res.witness}. The quotient geometry needs an invariant metric: build it from "
            "invariant quantities (e.g. (G^T G)^-1 weighting xi_G^T eta_G)"
        )
    return res
