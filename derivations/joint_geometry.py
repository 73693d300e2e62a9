"""Quotient geometry of a joint symmetry (:class:`derivations.joint.JointSymmetry`) under a jointly invariant metric.

:func:`derive_joint_geometry` derives, shape-generically (SymPy):

1. the joint vertical space V = Σ_i V_i, v(X_1, …, X_p) = Σ_i v_i(X_i) (the sum of the parts' vertical maps);
2. per part the horizontal condition C_i(ξ) = 0, C_i the Riesz representer of X_i ↦ g(ξ, v_i(X_i));
3. the coupled projection ξ ↦ ξ − v(Λ), Λ = (Λ_1, …, Λ_p) in the joint Lie algebra, solving

       C_i(v(Λ)) = Σ_j C_i(v_j(Λ_j)) = C_i(ξ)      for every part i,

   a linear system whose operator 𝕄: Λ ↦ (C_i(v(Λ)))_i is symmetric positive semidefinite for the Frobenius
   product (⟨X, 𝕄Λ⟩ = g(v(Λ), v(X))). The couplings K_ij = C_i ∘ v_j are derived symbolically. When every
   K_ij (i ≠ j) vanishes the parts decouple and each is solved in closed form by
   :func:`derivations.quotient.solve_linear` (kind ``"decoupled"``); otherwise (kind ``"iterative"``) 𝕄 is the
   generated operator and Λ is found by conjugate gradients in the coordinates of an orthonormal basis of the
   joint algebra (a subgroup's basis, or the matrix units of gl(h)), stopping at ‖b − 𝕄λ‖ ≤ tol ‖b‖
   (default tol = 1e-12, at most 2·dim iterations). On a singular but consistent system (parts whose vertical
   spaces intersect) CG from λ = 0 still converges, and ξ − v(Λ) is the unique g-orthogonal projection;
4. the geodesic acceleration γ̈(0) = 𝔾⁻¹(R), R_B = ½ ∂_B g(ξ, ξ) − ∂_{η_B} D_ξ g(ξ, η) (Koszul, as in
   :mod:`derivations.quotient`), the second-order geodesic E(ξ) = θ + ξ + ½γ̈(0) and its VJP. The whole product
   group acts by isometries, so horizontal geodesics of the total space project to the quotient's. A *diagonal*
   block Γ lives in the diagonal matrices: its component of R is the Frobenius projection onto them, i.e.
   γ̈_Γ = diag(𝔾_Γ⁻¹ R_Γ) (exact when 𝔾_Γ maps diagonal matrices to diagonal ones, as Γ⁻ᵏ a Γ⁻ˡ does).

Every formula is evaluated numerically (float64, :class:`~derivations.exact_eval.DualEvaluator`) by
:meth:`JointGeometry.project` / :meth:`JointGeometry.acceleration`: a reference run-time for checks at small sizes
(the dense least-squares projection of the tests, Christoffel symbols by autograd).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import sympy as sp
from sympy import MatrixSymbol, ZeroMatrix

from .errors import NotInvariantError
from .exact_eval import DualEvaluator
from .matrix_calculus import canonicalize, directional_derivative, is_zero, linear_terms, trace_gradient, \
    trace_gradients
from .quotient import _apply, _metric_operator_inverse, derive_second_order_geodesic, solve_linear

__all__ = ["JointGeometry", "derive_joint_geometry"]


@dataclass(frozen=True)
class JointGeometry:
    joint: object
    metric: object
    invariance: tuple                # InvarianceResult per part
    xi: tuple
    lie: tuple                       # X_i per part
    vertical: tuple                  # per part: tuple over the union blocks
    conditions: tuple                # C_i(ξ) per part
    couplings: dict                  # (i, j) -> C_i(v_j(Λ_j)) (Λ_j = lie[j])
    projection_kind: str             # "decoupled" | "iterative"
    part_solves: tuple = ()
    geodesic_acceleration: tuple = ()
    second_order_geodesic: tuple = ()
    cotangent: tuple = ()
    second_order_geodesic_vjp: tuple = ()
    timings: dict = field(default_factory=dict)

    # -------------------------------------------------------------------------------------------
    # numerical reference run-time (float64, concrete sizes)
    def _env(self, values: dict, xi=None):
        env = {b: (np.asarray(values[b], dtype=float), None) for b in self.joint.blocks}
        if xi is not None:
            env.update({x: (np.asarray(v, dtype=float), None) for x, v in zip(self.xi, xi)})
        return env

    def basis(self, i: int, sizes: dict) -> list:
        """Orthonormal (Frobenius) basis of part i's Lie algebra at the concrete sizes."""
        part = self.joint.parts[i]
        h = int(sp.sympify(part.group_element.shape[0]).xreplace(sizes))
        if part.subalgebra is not None:
            out = [np.array(E.tolist(), dtype=float) for E in part.subalgebra.basis(h)]
            return [E / np.linalg.norm(E) for E in out]
        out = []
        for a in range(h):
            for b in range(h):
                E = np.zeros((h, h))
                E[a, b] = 1.0
                out.append(E)
        return out

    def vertical_vector(self, values, sizes, lams) -> list:
        """v(Λ) = Σ_i v_i(Λ_i) on the union blocks (Λ_i matrices)."""
        total = [np.zeros(np.shape(values[b])) for b in self.joint.blocks]
        for i, L in enumerate(lams):
            env = self._env(values)
            env[self.lie[i]] = (np.asarray(L, dtype=float), None)
            ev = DualEvaluator(sizes, env, exact=False)
            for k, e in enumerate(self.vertical[i]):
                if not is_zero(e):
                    total[k] = total[k] + ev.value(e)
        return self._diagonalise(total)

    def _diagonalise(self, parts):
        return [np.diag(np.diag(p)) if b in self.joint.diagonal_blocks else p for b, p in zip(self.joint.blocks, parts)]

    def _conditions(self, values, sizes, xi) -> list:
        ev = DualEvaluator(sizes, self._env(values, xi), exact=False)
        return [ev.value(c) for c in self.conditions]

    def project(self, values: dict, xi, sizes: dict, tol: float = 1e-12, maxiter: int | None = None):
        """(ξ − v(Λ), Λ, iterations, relative residual): the joint horizontal projection by CG on 𝕄λ = b."""
        bases = [self.basis(i, sizes) for i in range(len(self.joint.parts))]

        def coords(cs):
            return np.concatenate([[float(np.sum(E * c)) for E in B] for B, c in zip(bases, cs)])

        def mats(lam):
            out, k = [], 0
            for B in bases:
                out.append(sum(lam[k + q] * E for q, E in enumerate(B)))
                k += len(B)
            return out

        def op(lam):
            return coords(self._conditions(values, sizes, self.vertical_vector(values, sizes, mats(lam))))

        b = coords(self._conditions(values, sizes, xi))
        lam, r = np.zeros_like(b), b.copy()
        p, rs, nb, it = r.copy(), float(r @ r), float(np.linalg.norm(b)) or 1.0, 0
        maxiter = maxiter or 2 * len(b)
        while np.sqrt(rs) > tol * nb and it < maxiter:
            Ap = op(p)
            alpha = rs / float(p @ Ap)
            lam += alpha * p
            r -= alpha * Ap
            rs_new = float(r @ r)
            p = r + (rs_new / rs) * p
            rs, it = rs_new, it + 1
        v = self.vertical_vector(values, sizes, mats(lam))
        return [np.asarray(x, dtype=float) - vv for x, vv in zip(xi, v)], mats(lam), it, np.sqrt(rs) / nb

    def acceleration(self, values: dict, xi, sizes: dict) -> list:
        """γ̈(0) = −Γ(ξ, ξ) at the concrete point (diagonal blocks: the diagonal part)."""
        ev = DualEvaluator(sizes, self._env(values, xi), exact=False)
        return self._diagonalise([ev.value(a) if not is_zero(a) else np.zeros(np.shape(values[b]))
                                  for b, a in zip(self.joint.blocks, self.geodesic_acceleration)])


def derive_joint_geometry(metric, joint=None) -> JointGeometry:
    """Derive the quotient geometry of the joint symmetry under ``metric`` (module docstring). Raises
    :class:`NotInvariantError` when the metric is refuted for some part."""
    import time

    from .joint import prove_joint_invariance

    joint = joint or metric.symmetry
    timings = {}
    t0 = time.perf_counter()
    proofs = tuple(prove_joint_invariance(metric, joint))
    bad = [(joint.parts[i].name, r) for i, r in enumerate(proofs) if r.status == "counterexample"]
    if bad:
        raise NotInvariantError(
            f"metric {metric.name!r} is not invariant under part {bad[0][0]!r} of {joint.name!r}: the difference "
            f"{bad[0][1].difference} is nonzero at {bad[0][1].witness}; find invariant metrics with "
            "derivations.joint.joint_invariant_metrics")
    timings["invariance"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    lies = tuple(joint.lie(i) for i in range(len(joint.parts)))
    verts = tuple(joint.vertical(i) for i in range(len(joint.parts)))
    conds = tuple(trace_gradient(metric(xi, v), X) for v, X in zip(verts, lies))
    couplings = {}
    for i, C in enumerate(conds):
        for j, v in enumerate(verts):
            couplings[i, j] = canonicalize(C.xreplace(dict(zip(xi, v))))
    decoupled = all(is_zero(c) for (i, j), c in couplings.items() if i != j) and all(
        p.subalgebra is None for p in joint.parts)
    solves = ()
    if decoupled:
        solves = tuple(solve_linear(linear_terms(couplings[i, i], lies[i]), lies[i], MatrixSymbol(f"C{i}", *lies[i].shape))
                       for i in range(len(joint.parts)))
    timings["projection"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    blocks = joint.blocks
    inverses = _metric_operator_inverse(metric, blocks, eta)
    gxx = metric(xi, xi)
    d_eta = directional_derivative(gxx, dict(zip(blocks, eta)))
    d_xi = directional_derivative(metric(xi, eta), dict(zip(blocks, xi)))
    first = trace_gradients(d_eta, list(eta)) if not is_zero(d_eta) else [ZeroMatrix(*e.shape) for e in eta]
    second = trace_gradients(d_xi, list(eta)) if not is_zero(d_xi) else [ZeroMatrix(*e.shape) for e in eta]
    R = [canonicalize(f / 2 - s) for f, s in zip(first, second)]
    accel = tuple(_apply(inv, r) for inv, r in zip(inverses, R))
    exp2, cot, vjp = derive_second_order_geodesic(joint, xi, accel)
    timings["geodesic"] = time.perf_counter() - t0
    return JointGeometry(joint, metric, proofs, xi, lies, verts, conds, couplings,
                         "decoupled" if decoupled else "iterative", solves, accel, exp2, cot, vjp, timings)
