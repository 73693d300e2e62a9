"""Quotient geometry of a symmetry with an invariant metric, derived at matrix level.

Given a :class:`~derivations.symmetry.Symmetry` and an invariant :class:`~derivations.metric.Metric`,
:func:`derive_geometry` derives, for every size at once:

1. the vertical space  v(X) = d/dt ψ(exp tX, θ)|₀  (derivative of the action at the identity);
2. the horizontal condition  C(ξ) = 0  where C(ξ) is the Riesz representer of X ↦ g(ξ, v(X));
3. the horizontal projection  ξ ↦ ξ − v(Λ)  with Λ solving the linear equation C(v(Λ)) = C(ξ),
   decomposed as Σ_i c_i L_i Λ K_i = C(ξ) and solved
   * explicitly when the terms share their left (or right) factor: Λ = L⁻¹ C (Σ c_i K_i)⁻¹,
   * as Sylvester data P Λ + Λ Q = C' for two terms (solved numerically, batched, at run time),
   * through the Kronecker form Σ (K_iᵀ ⊗ c_i L_i) vec Λ = vec C otherwise;
4. the Riemannian gradient  grad f = 𝔾⁻¹(∇f)  where g(a, η) = Σ_B tr(𝔾_B(a)ᵀ η_B) defines the
   metric operator 𝔾 (inverted in closed form per block);
5. the geodesic acceleration  γ̈(0) = −Γ(ξ, ξ) from the Koszul formula for constant fields,
       g(γ̈, η) = ½ D_η g(ξ, ξ) − D_ξ g(ξ, η)   for all η,
   i.e. γ̈ = 𝔾⁻¹(R) with R_B = ½ ∂_B g(ξ, ξ) − ∂_{η_B} D_ξ g(ξ, η);
6. the second-order geodesic  E(ξ) = θ + ξ + ½ γ̈(0)  (paper Eq. 4) and its vector-Jacobian
   product  ξ̄ = (∂E/∂ξ)ᵀ ū, the Riesz representer of δ ↦ Σ_B ⟨ū_B, D_ξ E_B[δ]⟩_F (reverse-mode
   derivative for a cotangent ū; what autograd needs to differentiate a loss through E).

For a symmetry acting by a subgroup K ⊂ GL(h) (``symmetry.subalgebra``, e.g. the RoPE commutant) step 1 is the
same map restricted to X ∈ 𝔨, step 2 becomes ⟨E_k, C(ξ)⟩ = 0 for a basis (E_k) of 𝔨, and step 3 the dim 𝔨 system
M λ = b, M_kl = ⟨E_k, C(v(E_l))⟩ = g(v(E_l), v(E_k)) (kind ``"subalgebra"``: the terms of C(v(Λ)) are derived
shape-generically, the small system is assembled numerically at run time). Steps 4–6 are unchanged: K acts by
isometries, so horizontal geodesics of the total space are the quotient's. Invariance is the GL(h) proof, restricted.

No metric is special-cased: the same steps run for ``inv``, ``mix`` and any user metric whose
operator 𝔾 is block-diagonal and one-sided per block (a clear error says otherwise).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp
from sympy import Identity, Inverse, MatAdd, MatMul, MatrixExpr, MatrixSymbol, ZeroMatrix

from .errors import UnsupportedStructureError
from .matrix_calculus import (
    LinearTerm,
    canonicalize,
    directional_derivative,
    is_zero,
    linear_terms,
    trace_gradient,
    trace_gradients,
)
from .metric import InvarianceResult, Metric, check_metric, require_invariant

__all__ = ["QuotientGeometry", "LinearSolve", "derive_geometry", "derive_second_order_geodesic"]


@dataclass(frozen=True)
class LinearSolve:
    """How to solve Σ_i c_i L_i Λ K_i = C for Λ.

    kind ``"explicit"``: ``solution`` is Λ as an expression of C's symbol ``rhs``.
    kind ``"sylvester"``: P Λ + Λ Q = C', with ``P``, ``Q`` and ``rhs_transform`` (C' in terms of
    ``rhs``); ``spd_factors`` = (S₁, S₂) when P = Q = S₁ S₂ with S₁, S₂ symmetric positive definite.
    kind ``"kronecker"``: ``terms`` [(c_i L_i, K_i)] for the generic solver.
    kind ``"subalgebra"``: Λ is restricted to a Lie subalgebra 𝔨 (``subalgebra``) with basis (E_k); ``terms``
    [(c_i L_i, K_i)] as for ``"kronecker"``; Λ = Σ_l λ_l E_l with M λ = b, M_kl = ⟨E_k, Σ_i c_i L_i E_l K_i⟩_F =
    g(v(E_l), v(E_k)), b_k = ⟨E_k, C⟩_F (a dim 𝔨 linear system, assembled and solved numerically)."""

    kind: str
    unknown: sp.Basic
    rhs: sp.Basic
    solution: sp.Basic | None = None
    P: sp.Basic | None = None
    Q: sp.Basic | None = None
    rhs_transform: sp.Basic | None = None
    spd_factors: tuple | None = None
    terms: tuple = ()
    subalgebra: object = None


@dataclass(frozen=True)
class QuotientGeometry:
    """Everything derived for one (symmetry, metric). Expressions use the symmetry's symbols.

    Tangent symbols: ``xi`` (velocity / vector to project), ``egrad`` (Euclidean gradient), ``X``
    (Lie algebra element). Per-block tuples follow ``symmetry.blocks``."""

    symmetry: object
    metric: Metric
    invariance: InvarianceResult
    xi: tuple
    egrad: tuple
    lie: sp.Basic
    vertical: tuple
    horizontal_condition: sp.Basic
    projection: LinearSolve
    lambda_symbol: sp.Basic
    projected: tuple
    riemannian_gradient: tuple
    geodesic_acceleration: tuple
    second_order_geodesic: tuple = ()
    cotangent: tuple = ()
    second_order_geodesic_vjp: tuple = ()
    timings: dict = field(default_factory=dict)

    def summary(self) -> str:
        s = self.symmetry
        lines = [
            f"symmetry  : {s.description}",
            f"metric    : {self.metric.name}: g = {self.metric.expr}",
            f"invariance: {self.invariance.status}",
            "vertical  : " + ", ".join(f"{b}: {v}" for b, v in zip(s.blocks, self.vertical)),
            f"horizontal: {self.horizontal_condition} = 0",
            f"projection: {self.projection.kind}"
            + (f", Λ = {self.projection.solution}" if self.projection.kind == "explicit" else "")
            + (f", P = {self.projection.P}, Q = {self.projection.Q}, C' = {self.projection.rhs_transform}"
               if self.projection.kind == "sylvester" else "")
            + (f" on {self.projection.subalgebra.description}: M λ = b, M_kl = <E_k, "
               + " + ".join(f"({l}) E_l ({k})" for l, k in self.projection.terms) + ">, b_k = <E_k, C>"
               if self.projection.kind == "subalgebra" else ""),
            "riem. grad: " + ", ".join(f"{b}: {v}" for b, v in zip(s.blocks, self.riemannian_gradient)),
            "γ̈(0)      : " + ", ".join(f"{b}: {v}" for b, v in zip(s.blocks, self.geodesic_acceleration)),
            "VJP of E  : " + ", ".join(f"{x}: {v}" for x, v in zip(self.xi, self.second_order_geodesic_vjp)),
        ]
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------

def _named_like(template, name):
    if isinstance(template, MatrixExpr):
        return MatrixSymbol(name, *template.shape)
    return sp.Symbol(name, real=True)


def _group_terms(terms: list[LinearTerm], side: str):
    groups: dict = {}
    for t in terms:
        key = t.left if side == "left" else t.right
        groups.setdefault(key, []).append(t)
    return groups


def _mat(x, dim):
    return Identity(dim) if x is None else x


def _is_gram(expr) -> bool:
    """Structurally XᵀX (symmetric positive definite for full column rank X)."""
    if isinstance(expr, MatMul):
        _, mats = expr.as_coeff_matrices()
        return len(mats) == 2 and canonicalize(mats[0].T) == mats[1]
    return False


def solve_linear(terms: list[LinearTerm], unknown, rhs) -> LinearSolve:
    """Solve Σ_i c_i L_i Λ K_i = rhs for Λ (see :class:`LinearSolve`)."""
    if not terms:
        raise UnsupportedStructureError(f"the equation for {unknown} has no terms: it is singular")
    if any(t.transposed for t in terms):
        raise UnsupportedStructureError(
            f"the linear equation for {unknown} involves its transpose; only Σ c L Λ K forms are "
            "solved. Reformulate the metric or solve this equation numerically"
        )
    if not isinstance(unknown, MatrixExpr):  # scalar unknown: Σ c_i · λ (· M_i) = rhs
        if all(t.left is None and t.right is None for t in terms):
            coeff = sp.Add(*[t.coeff for t in terms])
            return LinearSolve("explicit", unknown, rhs, solution=canonicalize(rhs / coeff))
        raise UnsupportedStructureError(f"scalar unknown {unknown} with matrix coefficients")
    dim_r, dim_c = unknown.shape
    by_left = _group_terms(terms, "left")
    if len(by_left) == 1:
        (L,) = by_left
        K = canonicalize(MatAdd(*[t.coeff * _mat(t.right, dim_c) for t in terms]).doit())
        sol = MatMul(*( [Inverse(L)] if L is not None else []), rhs, Inverse(K))
        return LinearSolve("explicit", unknown, rhs, solution=canonicalize(sol.doit()))
    by_right = _group_terms(terms, "right")
    if len(by_right) == 1:
        (K,) = by_right
        Lsum = canonicalize(MatAdd(*[t.coeff * _mat(t.left, dim_r) for t in terms]).doit())
        sol = MatMul(Inverse(Lsum), rhs, *([Inverse(K)] if K is not None else []))
        return LinearSolve("explicit", unknown, rhs, solution=canonicalize(sol.doit()))
    if len(terms) == 2:
        # Normalise c1 L1 Λ K1 + c2 L2 Λ K2 = C to P Λ + Λ Q = C' by multiplying with L2⁻¹ on the
        # left and K1⁻¹ on the right; of the two orderings keep the one with fewer inverses in P, Q.
        candidates = [_sylvester_form(a, b, unknown, rhs) for a, b in (terms, terms[::-1])]
        return min(candidates, key=lambda c: (_count_inverses(c.P) + _count_inverses(c.Q), str(c.P)))
    return LinearSolve(
        "kronecker", unknown, rhs,
        terms=tuple((canonicalize(t.coeff * _mat(t.left, dim_r)), _mat(t.right, dim_c)) for t in terms),
    )


def _count_inverses(expr) -> int:
    return len(expr.atoms(Inverse))


def _is_spd(expr) -> bool:
    """Structurally symmetric positive definite: XᵀX or its inverse (X of full column rank)."""
    return _is_gram(expr.arg) if isinstance(expr, Inverse) else _is_gram(expr)


def _spd_factorization(P):
    """(S₁, S₂) with P = S₁ S₂ and both structurally SPD, else None."""
    if not isinstance(P, MatMul):
        return None
    coeff, mats = P.as_coeff_matrices()
    if coeff != 1:
        return None
    for k in range(1, len(mats)):
        S1 = mats[0] if k == 1 else MatMul(*mats[:k])
        S2 = mats[k] if k == len(mats) - 1 else MatMul(*mats[k:])
        if _is_spd(S1) and _is_spd(S2):
            return (S1, S2)
    return None


def _sylvester_form(t1: LinearTerm, t2: LinearTerm, unknown, rhs) -> LinearSolve:
    """c1 L1 Λ K1 + c2 L2 Λ K2 = C  ⇒  (c1/c2) L2⁻¹L1 Λ + Λ K2 K1⁻¹ = L2⁻¹ C K1⁻¹ / c2."""
    dim_r, dim_c = unknown.shape
    L1, K1 = _mat(t1.left, dim_r), _mat(t1.right, dim_c)
    L2, K2 = _mat(t2.left, dim_r), _mat(t2.right, dim_c)
    P = canonicalize((t1.coeff / t2.coeff) * (Inverse(L2) * L1).doit())
    Q = canonicalize((K2 * Inverse(K1)).doit())
    C2 = canonicalize((Inverse(L2) * rhs * Inverse(K1) / t2.coeff).doit())
    spd = _spd_factorization(P) if P == Q else None
    return LinearSolve("sylvester", unknown, rhs, P=P, Q=Q, rhs_transform=C2, spd_factors=spd)


def _metric_operator_inverse(metric: Metric, blocks, eta) -> list:
    """Per block B, a function R ↦ a_B solving 𝔾_B(a) = R (closed form)."""
    a = tuple(_named_like(b, f"a_{getattr(b, 'name', b)}") for b in blocks)
    g_a_eta = metric(a, eta)
    ops = trace_gradients(g_a_eta, list(eta))
    inverses = []
    for b, ab, op in zip(blocks, a, ops):
        others = [x for x in a if x is not ab and op.has(x)]
        if others:
            raise UnsupportedStructureError(
                f"the metric couples the tangent components of {b} and {others}: its operator is not "
                "block-diagonal, so the engine cannot invert it in closed form"
            )
        terms = linear_terms(op, ab)
        rhs = _named_like(b, f"R_{getattr(b, 'name', b)}")
        sol = solve_linear(terms, ab, rhs)
        if sol.kind != "explicit":
            raise UnsupportedStructureError(
                f"the metric operator on block {b} is {op}: not one-sided (Σ L a K with different L "
                "and K), so it has no closed-form inverse; use a metric weighted on one side"
            )
        inverses.append((rhs, sol.solution))
    return inverses


def _apply(inverse, value):
    rhs, sol = inverse
    return _shaped(canonicalize(sol.xreplace({rhs: value})), rhs)


def _shaped(expr, like):
    """A structural scalar zero returned for a matrix block becomes a ZeroMatrix of its shape."""
    if isinstance(like, MatrixExpr) and not isinstance(expr, MatrixExpr) and expr == 0:
        return ZeroMatrix(*like.shape)
    return expr


def derive_second_order_geodesic(sym, xi, accel):
    """(E, ū, ξ̄): the second-order geodesic E_B = B + ξ_B + ½ γ̈_B, cotangent symbols ū_B
    (``cot_B``) and the vector-Jacobian product ξ̄_B = ∂/∂ξ_B Σ_C ⟨ū_C, E_C(ξ)⟩_F.

    ⟨ū, E⟩ is tr(ūᵀ E) for matrix blocks and ū E for scalar ones; its derivative along δ is linear
    in δ, and :func:`trace_gradients` reads off the representer per block."""
    blocks = sym.blocks
    exp2 = tuple(canonicalize(b + x + a / 2) for b, x, a in zip(blocks, xi, accel))
    cot = sym.tangent("cot")
    delta = sym.tangent("delta")
    pairing = sp.Add(*[sp.Trace(sp.Transpose(u) * e) if isinstance(u, MatrixExpr) else u * e
                       for u, e in zip(cot, exp2)])
    d = directional_derivative(pairing, dict(zip(xi, delta)))
    vjp = tuple(_shaped(g, x) for g, x in zip(trace_gradients(d, list(delta)), xi))
    return exp2, cot, vjp


def derive_geometry(metric: Metric, check: bool = True) -> QuotientGeometry:
    """Derive the quotient geometry of ``metric.symmetry`` under ``metric``.

    With ``check`` (default) the metric is first verified: bilinear, symmetric, positive definite at
    random exact points, and invariant (proof or counterexample); errors say what is wrong."""
    import time

    timings = {}
    t0 = time.perf_counter()
    sym = metric.symmetry
    blocks = sym.blocks
    if check:
        check_metric(metric)
    invariance = require_invariant(metric)
    if sym.subalgebra is not None:
        invariance = InvarianceResult(invariance.status, invariance.difference, invariance.witness, proof=(
            f"g is invariant under all of GL(h) ({invariance.status} symbolically: g(psi(A,theta))(dpsi xi, dpsi eta) - "
            f"g(xi, eta) = {invariance.difference}); K is a subgroup of GL(h) acting by the same psi, so g is "
            f"K-invariant by restriction. {getattr(sym, 'subgroup_proof', '')}"))
    timings["checks"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    xi, eta = metric.xi, metric.eta
    egrad = sym.tangent("egrad")
    X = sym.lie_algebra
    vert = sym.vertical(X)

    # (2) horizontal condition: g(ξ, v(X)) = tr(C(ξ)ᵀ X)
    C = trace_gradient(metric(xi, vert), X)
    # (3) projection: C(v(Λ)) = C(ξ)
    Lam = _named_like(X, "Lambda")
    vert_lam = sym.vertical(Lam)
    C_of_v = canonicalize(C.xreplace(dict(zip(xi, vert_lam))))
    terms = linear_terms(C_of_v, Lam)
    rhs = _named_like(X, "C")
    if sym.subalgebra is not None:
        # Λ ∈ 𝔨 only: the horizontal condition is ⟨E_k, C(ξ)⟩ = 0 for every basis element E_k (ξ ⊥_g v(𝔨)), and
        # ⟨E_k, C(ξ − v(Λ))⟩ = 0 is the dim-𝔨 system M λ = b with M_kl = ⟨E_k, C(v(E_l))⟩ = g(v(E_l), v(E_k)).
        if any(t.transposed for t in terms):
            raise UnsupportedStructureError(
                f"the projection operator C(v(Λ)) = {C_of_v} involves Λᵀ; the subalgebra solver takes Σ c L Λ K forms")
        dim_r, dim_c = Lam.shape
        proj = LinearSolve("subalgebra", Lam, rhs, subalgebra=sym.subalgebra, terms=tuple(
            (canonicalize(t.coeff * _mat(t.left, dim_r)), _mat(t.right, dim_c)) for t in terms))
    else:
        proj = solve_linear(terms, Lam, rhs)
    projected = tuple(canonicalize(x - v) for x, v in zip(xi, vert_lam))
    timings["projection"] = time.perf_counter() - t0

    # (4) Riemannian gradient
    t0 = time.perf_counter()
    inverses = _metric_operator_inverse(metric, blocks, eta)
    rgrad = tuple(_apply(inv, e) for inv, e in zip(inverses, egrad))
    timings["gradient"] = time.perf_counter() - t0

    # (5) geodesic acceleration via Koszul
    t0 = time.perf_counter()
    gxx = metric(xi, xi)
    d_eta_gxx = directional_derivative(gxx, dict(zip(blocks, eta)))
    d_xi_gxe = directional_derivative(metric(xi, eta), dict(zip(blocks, xi)))
    first = trace_gradients(d_eta_gxx, list(eta)) if not is_zero(d_eta_gxx) else [0 * e for e in eta]
    second = trace_gradients(d_xi_gxe, list(eta)) if not is_zero(d_xi_gxe) else [0 * e for e in eta]
    R = [canonicalize(f / 2 - s) for f, s in zip(first, second)]
    accel = tuple(_apply(inv, r) for inv, r in zip(inverses, R))
    timings["acceleration"] = time.perf_counter() - t0

    # (6) second-order geodesic and its vector-Jacobian product
    t0 = time.perf_counter()
    exp2, cot, vjp = derive_second_order_geodesic(sym, xi, accel)
    timings["vjp"] = time.perf_counter() - t0

    return QuotientGeometry(
        symmetry=sym,
        metric=metric,
        invariance=invariance,
        xi=xi,
        egrad=egrad,
        lie=X,
        vertical=vert,
        horizontal_condition=C,
        projection=proj,
        lambda_symbol=Lam,
        projected=projected,
        riemannian_gradient=rgrad,
        geodesic_acceleration=accel,
        second_order_geodesic=exp2,
        cotangent=cot,
        second_order_geodesic_vjp=vjp,
        timings=timings,
    )
