"""Folded metrics of the norm weight × Q/K joint symmetry, and their quotient geometry derived through the fold.

**The fold.** For :func:`derivations.joint.norm_qk` (Γ = diag(γ) d×d with every γ_i ≠ 0, G, H ∈ R^{d×h}; GL(h) acts by
(G A, H A⁻ᵀ), the diagonal group by (Γ D, D⁻¹ G, D⁻¹ H)) the map

    φ(Γ, G, H) = (Γ, Ĝ, Ĥ) = (Γ, Γ G, Γ H),        dφ(ξ) = (Ξ, Γ ξ_G + Ξ G, Γ ξ_H + Ξ H)   (Ξ = ξ_Γ = diag(ξ_γ))

is a diffeomorphism (inverse (Γ, Γ⁻¹Ĝ, Γ⁻¹Ĥ)). In folded coordinates the diagonal group acts on Γ alone (Ĝ = ΓG is
D-invariant because diagonal matrices commute) and GL(h) on (Ĝ, Ĥ) alone, by the pair action. The *folded* metric
``folded_<k>`` (k = ``inv`` or ``mix``, the GL pair's built-in metric g_k) is the pullback by φ of the product metric

    h = Σ_i dγ_i²/γ_i²  ⊕  g_k(Ĝ, Ĥ):
    g(ξ, η) = tr(Γ⁻² Ξ Ηᵀ) + g_k|_(ΓG, ΓH)((Γξ_G + ΞG, Γξ_H + ΞH), (Γη_G + ΗG, Γη_H + ΗH)).

It has cross terms ξ_γ · ξ_G, so its metric operator is not block-diagonal and
:func:`derivations.joint_geometry.derive_joint_geometry` cannot invert it (``UnsupportedStructureError``).
:func:`derive_folded_geometry` derives the geometry through φ instead, shape-generically:

1. **Invariance** under both parts, symbolically, every size (:func:`derivations.joint.prove_joint_invariance`),
   and the *pullback identity* g − φ*h = 0 (so a hand-written metric is recognised as a fold).
2. **Vertical spaces fold** (symbolic lemmas): dφ v_norm(X) = (Γ X, 0, 0) (ΓX covers every diagonal tangent,
   X = Γ⁻¹Ξ) and dφ v_pair(X) = the pair's vertical vector (ĜX, −ĤXᵀ) at (Ĝ, Ĥ). Hence horizontal vectors have
   ξ_γ = 0 and a pair-horizontal fold, and the g-orthogonal projection is

       P(ξ) = dφ⁻¹ (0, P_k(ξ̂)) = (0, Γ⁻¹ P_k(ξ̂)_G, Γ⁻¹ P_k(ξ̂)_H),    ξ̂ = (Γξ_G + ΞG, Γξ_H + ΞH),

   P_k the pair's projection (:func:`derivations.quotient.derive_geometry`) at (Ĝ, Ĥ): ``inv`` a Sylvester
   solve P Λ + Λ Q = C', ``mix`` explicit; no coupled system, no iteration.
3. **Geodesic**: geodesics of g are φ⁻¹ of product geodesics, γ(t) = γ exp(t ξ_γ/γ) (Γ̈ = Ξ² Γ⁻¹, from the Koszul
   formula of 1/γ²) and (Ĝ(t), Ĥ(t)) the pair geodesic (acceleration Ĝ̈ from the pair's derivation). G(t) =
   Γ(t)⁻¹ Ĝ(t) differentiated twice (matrix calculus) gives

       G̈ = Γ⁻¹ Ĝ̈ − 2 Γ⁻² Ξ Ĝ̇ + Ξ² Γ⁻³ Ĝ = Γ⁻¹ Ĝ̈ − 2 Γ⁻¹ Ξ ξ_G − Γ⁻² Ξ² G,    the same for H,

   and the second-order geodesic E(ξ) = θ + ξ + ½γ̈(0) with its VJP (:func:`derive_second_order_geodesic`).

**Only some blocks read the norm** (:func:`norm_pair` with ``folded=("G",)``): norm × V/O (G = W_Vᵀ reads the norm,
H = W_O ∈ R^{m×h} does not) and, at h = 1, norm × one GL(1) unit of a gated/ReLU MLP (G = the unit's up row,
H = its down column). The fold is then (Γ, ΓG, H), the norm group scales G only, and everything above holds with
Ĥ = H, ξ̂_H = ξ_H, P(ξ)_H = P_k(ξ̂)_H and Ḧ = the pair's Ĥ̈. Summed over units (one D for all of them, each unit its
own GL(1)) the metric Σ dγ²/γ² + Σ_units g_k(Γ u_j, w_j) is invariant term by term.

:meth:`FoldedGeometry.project` and :meth:`FoldedGeometry.acceleration` evaluate the derived formulas in float64
(a reference run-time for checks); :meth:`FoldedGeometry.joint_geometry` packages the fold-derived acceleration with
the generic conditions/vertical maps as a :class:`~derivations.joint_geometry.JointGeometry`, which
:func:`codegen.joint.generate_joint_module` turns into batched kernels (CG projection).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import sympy as sp
from sympy import Inverse, MatrixSymbol, Trace, ZeroMatrix

from .errors import MetricError, NotInvariantError
from .exact_eval import DualEvaluator
from .joint import JointMetric, JointSymmetry, _symmetric, diagonal_scaling, norm_qk, prove_joint_invariance
from .invariant_proofs import tidy
from .matrix_calculus import canonicalize, directional_derivative, is_zero, trace_gradient
from .metric import builtin_metric
from .quotient import derive_geometry, derive_second_order_geodesic
from .symmetry import gl_pair

__all__ = ["FOLDED_KINDS", "norm_pair", "is_norm_pair", "fold", "fold_tangent", "folded_metric", "FoldedGeometry",
           "derive_folded_geometry", "folded_invariance_summary"]

#: folded metric name -> the GL pair's built-in metric it pulls back
FOLDED_KINDS = {"folded_inv": "inv", "folded_mix": "mix"}


def norm_pair(d: int = 3, folded: tuple = ("G", "H")) -> JointSymmetry:
    """Γ = diag(γ) × a GL(h) pair (G ∈ R^{d×h}, H) with the norm scaling on the ``folded`` blocks (its readers).

    ``("G", "H")`` is :func:`norm_qk` (both Q and K read the norm). ``("G",)``: only G reads it, H ∈ R^{m×h} does
    not: norm × V/O (G = W_Vᵀ, H = W_O), and at h = 1 norm × one GL(1) unit (G = the up row, H = the down
    column; the norm scales every unit's up row by the same D, each unit its own pair)."""
    if tuple(folded) == ("G", "H"):
        return norm_qk(d)
    if tuple(folded) != ("G",):
        raise MetricError(f"norm_pair(folded={folded!r}): fold ('G', 'H') or ('G',)")
    pair = gl_pair("G", "H", n="d", m="m", h="h")
    G, _ = pair.blocks
    Gam = MatrixSymbol("Gam", G.shape[0], G.shape[0])
    return JointSymmetry("norm_pair_G", (pair, diagonal_scaling(d, (G,), Gam, "norm_scaling")), diagonal_blocks=(Gam,),
                         description="norm weight diag(gamma) x pair read through G: (Gam D, D^-1 G A, H A^-T)")


def _structure(joint: JointSymmetry) -> tuple:
    """(pair blocks, the readers among them, Γ) of a norm × pair joint symmetry, else :class:`MetricError`."""
    ok = (len(joint.parts) == 2 and len(joint.parts[0].blocks) == 2 and len(joint.diagonal_blocks) == 1
          and joint.parts[1].blocks[0] == joint.diagonal_blocks[0] and joint.blocks[:2] == joint.parts[0].blocks
          and set(joint.parts[1].blocks[1:]) <= set(joint.parts[0].blocks) and len(joint.parts[1].blocks) > 1)
    if not ok:
        raise MetricError(f"folded metrics are defined for a norm weight x GL pair joint symmetry (norm_qk, "
                          f"norm_pair: blocks G, H, diagonal Gam); got {joint.name!r} with blocks {list(joint.blocks)}")
    return joint.parts[0].blocks, tuple(joint.parts[1].blocks[1:]), joint.diagonal_blocks[0]


def is_norm_pair(joint: JointSymmetry) -> bool:
    """Whether ``joint`` has the structure the folded metrics are defined on (a norm weight × GL pair:
    :func:`norm_qk`, :func:`norm_pair`, or a declaration of the same blocks and parts)."""
    try:
        _structure(joint)
    except MetricError:
        return False
    return True


def fold(joint: JointSymmetry) -> tuple:
    """φ(θ) on the blocks (G, H, Γ): Γ B for the readers B, the other blocks unchanged ((Γ G, Γ H, Γ) for norm_qk)."""
    _, readers, Gam = _structure(joint)
    return tuple(Gam * b if b in readers else b for b in joint.blocks)


def fold_tangent(joint: JointSymmetry, tangent: tuple) -> tuple:
    """dφ_θ(ξ) (Γ ξ_B + Ξ B on the readers B, ξ_B elsewhere), the directional derivative of :func:`fold`."""
    dirs = dict(zip(joint.blocks, tangent))
    return tuple(canonicalize(directional_derivative(e, dirs)) for e in fold(joint))


def _scale_term(joint, xi, eta):
    Gam = joint.blocks[2]
    return Trace(Inverse(Gam) * Inverse(Gam) * xi[2] * eta[2].T)


def _pullback(joint, kind, xi, eta):
    """tr(Γ⁻² Ξ Ηᵀ) + g_k at φ(θ) on dφ ξ, dφ η (unsimplified)."""
    pm = builtin_metric(joint.parts[0], kind)
    fx, fe, pt = fold_tangent(joint, xi), fold_tangent(joint, eta), fold(joint)
    return pm(fx[:2], fe[:2], point=pt[:2]) + _scale_term(joint, xi, eta)


def folded_metric(kind: str, d: int = 3, joint: JointSymmetry | None = None) -> JointMetric:
    """The folded metric ``kind`` (``folded_inv`` | ``folded_mix``) of ``joint`` (default :func:`norm_qk`; or a
    :func:`norm_pair` with one reader): tr(Γ⁻² Ξ Η) + g_k at :func:`fold` on :func:`fold_tangent` (module docstring)."""
    if kind not in FOLDED_KINDS:
        raise MetricError(f"no folded metric {kind!r}; folded metrics: {', '.join(FOLDED_KINDS)}")
    joint = joint or norm_qk(d)
    _structure(joint)
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    expr = _diag_symmetric(_pullback(joint, FOLDED_KINDS[kind], xi, eta), joint)
    return JointMetric(joint, expr, kind)


@dataclass(frozen=True)
class FoldedGeometry:
    """The quotient geometry of a folded metric (module docstring). Tuples over blocks follow ``joint.blocks``
    = (G, H, Γ)."""

    joint: JointSymmetry
    metric: JointMetric
    kind: str                        # the pair metric pulled back: "inv" | "mix"
    invariance: tuple                # InvarianceResult per part
    lemmas: dict                     # name -> "proved" (pullback identity, vertical spaces fold)
    pair: object                     # QuotientGeometry of the GL pair under g_k (its own symbols)
    xi: tuple
    folded_xi: tuple                 # dφ ξ = (ξ̂_G, ξ̂_H, Ξ)
    condition: sp.Basic              # the pair's horizontal condition C(ξ̂) at (Ĝ, Ĥ)
    solve: object                    # the pair's LinearSolve for Λ, with (Ĝ, Ĥ) substituted
    projected: tuple                 # P(ξ) per block, in Λ (= solve.unknown)
    geodesic_acceleration: tuple
    second_order_geodesic: tuple = ()
    cotangent: tuple = ()
    second_order_geodesic_vjp: tuple = ()
    timings: dict = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------------
    # float64 reference run-time (concrete sizes {dimension symbol: int}; values {block: array}, Γ diagonal)
    def _ev(self, values, xi, extra=None):
        env = {b: (np.asarray(values[b], dtype=float), None) for b in self.joint.blocks}
        env.update({x: (np.asarray(v, dtype=float), None) for x, v in zip(self.xi, xi)})
        env.update(extra or {})
        return env

    def lam(self, values, xi, sizes) -> np.ndarray:
        """Λ (h×h) of the pair's projection at the fold: C(ξ̂) → Λ (explicit, or P Λ + Λ Q = C')."""
        env = self._ev(values, xi)
        ev = DualEvaluator(sizes, env, exact=False)
        C = np.asarray(ev.value(self.condition), dtype=float)
        with_rhs = DualEvaluator(sizes, {**env, self.solve.rhs: (C, None)}, exact=False)
        if self.solve.kind == "explicit":
            return np.asarray(with_rhs.value(self.solve.solution), dtype=float)
        if self.solve.kind != "sylvester":
            raise NotImplementedError(f"pair projection kind {self.solve.kind!r}")
        P, Q = (np.asarray(ev.value(m), dtype=float) for m in (self.solve.P, self.solve.Q))
        Cp = np.asarray(with_rhs.value(self.solve.rhs_transform), dtype=float)
        h = Cp.shape[0]
        K = np.kron(np.eye(h), P) + np.kron(Q.T, np.eye(h))     # vec(PΛ + ΛQ), column-major vec
        return np.linalg.solve(K, Cp.flatten(order="F")).reshape((h, h), order="F")

    def project(self, values: dict, xi, sizes: dict) -> list:
        """P(ξ) = (Γ⁻¹ P_k(ξ̂)_G, Γ⁻¹ P_k(ξ̂)_H, 0) in float64."""
        L = self.lam(values, xi, sizes)
        ev = DualEvaluator(sizes, self._ev(values, xi, {self.solve.unknown: (L, None)}), exact=False)
        return [np.zeros(np.shape(values[b])) if is_zero(e) else np.asarray(ev.value(e), dtype=float)
                for b, e in zip(self.joint.blocks, self.projected)]

    def acceleration(self, values: dict, xi, sizes: dict) -> list:
        """γ̈(0) (module docstring, step 3) in float64; Γ's component is diagonal."""
        ev = DualEvaluator(sizes, self._ev(values, xi), exact=False)
        out = [np.asarray(ev.value(a), dtype=float) for a in self.geodesic_acceleration]
        return [np.diag(np.diag(o)) if b in self.joint.diagonal_blocks else o for b, o in zip(self.joint.blocks, out)]

    def joint_geometry(self):
        """A :class:`~derivations.joint_geometry.JointGeometry` with this geodesic and the generic per-part
        conditions C_i(ξ) (Riesz representers of X_i ↦ g(ξ, v_i(X_i))) and vertical maps, so that
        :func:`codegen.joint.generate_joint_module` can emit kernels (projection by CG on the coupled system)."""
        from .joint_geometry import JointGeometry

        joint, xi = self.joint, self.xi
        lies = tuple(joint.lie(i) for i in range(len(joint.parts)))
        verts = tuple(joint.vertical(i) for i in range(len(joint.parts)))
        conds = tuple(trace_gradient(self.metric(xi, v), X) for v, X in zip(verts, lies))
        couplings = {(i, j): canonicalize(C.xreplace(dict(zip(xi, v)))) for i, C in enumerate(conds)
                     for j, v in enumerate(verts)}
        return JointGeometry(joint, self.metric, self.invariance, xi, lies, verts, conds, couplings, "iterative", (),
                             self.geodesic_acceleration, self.second_order_geodesic, self.cotangent,
                             self.second_order_geodesic_vjp, dict(self.timings))


def _scalar_scale_acceleration(joint):
    """Γ̈ of the product geodesic: the Koszul formula of the 1-D metric m(γ) = 1/γ², γ̈ = −m′ξ²/(2m) = ξ²/γ, lifted to
    diagonal matrices (γ ↦ Γ, ξ ↦ Ξ: they commute)."""
    g, x = sp.symbols("gamma xi", nonzero=True)
    m = 1 / g**2
    acc = sp.simplify(-sp.diff(m, g) * x**2 / (2 * m))
    powers = acc.as_powers_dict()
    if set(powers) - {g, x}:
        raise AssertionError(f"unexpected scale acceleration {acc}")
    Gam, Xi = joint.blocks[2], joint.tangent("xi")[2]
    return sp.MatMul(Xi ** int(powers.get(x, 0)), Gam ** int(powers.get(g, 0))).doit()


def derive_folded_geometry(metric: JointMetric | str, d: int = 3) -> FoldedGeometry:
    """Derive the quotient geometry of a folded metric (a name of :data:`FOLDED_KINDS` or a :class:`JointMetric` of
    :func:`norm_qk` equal to a fold: its pullback identity is proved first). Raises :class:`NotInvariantError` if
    a part refutes the metric, :class:`MetricError` if it is not a fold of ``inv`` or ``mix``."""
    timings = {}
    t0 = time.perf_counter()
    if isinstance(metric, str):
        metric = folded_metric(metric, d)
    joint = metric.symmetry
    (G, H), readers, Gam = _structure(joint)
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    proofs = tuple(prove_joint_invariance(metric, joint))
    bad = [(joint.parts[i].name, r) for i, r in enumerate(proofs) if r.status == "counterexample"]
    if bad:
        raise NotInvariantError(f"metric {metric.name!r} is not invariant under part {bad[0][0]!r}: difference "
                                f"{bad[0][1].difference} at {bad[0][1].witness}")
    timings["invariance"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    kind = FOLDED_KINDS.get(metric.name)
    candidates = [kind] if kind else list(FOLDED_KINDS.values())
    lemmas = {}
    for k in candidates:  # (true by construction for folded_metric's metrics; a real check for hand-written ones)
        if _proved_zero(metric.expr - _pullback(joint, k, xi, eta), joint):
            kind = k
            lemmas["pullback"] = f"proved: g = phi*(sum dgamma^2/gamma^2 + {k}(Ghat, Hhat)), symbolic"
            break
    else:
        raise MetricError(f"metric {metric.name!r} is not the pullback of sum dgamma^2/gamma^2 + inv or mix by the "
                          f"fold {fold(joint)}; derive it with derivations.joint_geometry.derive_joint_geometry")
    X0, X1 = joint.lie(0), joint.lie(1)
    fv_norm = fold_tangent(joint, joint.vertical(1))
    if not (is_zero(fv_norm[0]) and is_zero(fv_norm[1]) and is_zero(canonicalize(fv_norm[2] - Gam * X1))):
        raise AssertionError(f"the norm part's vertical space does not fold to (Gam X, 0, 0): {fv_norm}")
    lemmas["norm_vertical"] = "proved: dphi v_norm(X) = (0 on G, H; Gam X on Gam), symbolic"
    pair = derive_geometry(builtin_metric(joint.parts[0], kind))
    pt = fold(joint)
    sub_pt = {G: pt[0], H: pt[1]}
    fv_pair = fold_tangent(joint, joint.vertical(0))
    pair_v = tuple(e.xreplace({pair.lie: X0}).xreplace(sub_pt) for e in pair.vertical)
    if not (all(is_zero(canonicalize(a - b)) for a, b in zip(fv_pair[:2], pair_v)) and is_zero(fv_pair[2])):
        raise AssertionError(f"the pair's vertical space does not fold to the pair's at {pt[:2]}: {fv_pair}")
    lemmas["pair_vertical"] = (f"proved: dphi v_pair(X) = (Ghat X, -Hhat X^T, 0), the pair's vertical vector at "
                               f"(Ghat, Hhat) = ({pt[0]}, {pt[1]}), symbolic")
    fxi = fold_tangent(joint, xi)
    S = {G: pt[0], H: pt[1], xi[0]: fxi[0], xi[1]: fxi[1]}
    sol = pair.projection
    fields = {f: _diag_symmetric(getattr(sol, f).xreplace(S), joint) for f in ("solution", "P", "Q", "rhs_transform")
              if isinstance(getattr(sol, f), sp.Basic)}
    spd = tuple(_diag_symmetric(m.xreplace(S), joint) for m in sol.spd_factors) if sol.spd_factors else None
    solve = replace(sol, **fields, spd_factors=spd)
    proj_hat = [e.xreplace(S) for e in pair.projected]
    projected = tuple(_diag_symmetric(Inverse(Gam) * p if b in readers else p, joint)
                      for b, p in zip((G, H), proj_hat)) + (ZeroMatrix(*Gam.shape),)
    timings["projection"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    acc = _lifted_acceleration(joint, pair, S, fxi, readers)
    exp2, cot, vjp = derive_second_order_geodesic(joint, xi, acc)
    timings["geodesic"] = time.perf_counter() - t0
    condition = _diag_symmetric(pair.horizontal_condition.xreplace(S), joint)
    return FoldedGeometry(joint, metric, kind, proofs, lemmas, pair, xi, fxi, condition,
                          solve, projected, acc, exp2, cot, vjp, timings)


def _lifted_acceleration(joint, pair, S, fxi, readers):
    """(G̈, Ḧ, Γ̈) of φ⁻¹(product geodesic): for a reader B, the second derivative of B(t) = Γ(t)⁻¹ B̂(t) at t = 0,
    D²f[V, V] + Df[Ä], V = (Ξ, B̂̇), Ä = (Γ̈, B̂̈), at B̂ = ΓB, B̂̇ = ξ̂_B; for a block that is not a reader, B̂̈."""
    G, H, Gam = joint.blocks
    xi = joint.tangent("xi")
    acc_gam = _scalar_scale_acceleration(joint)
    out = []
    for k, B in enumerate((G, H)):
        acc_hat = pair.geodesic_acceleration[k].xreplace(S)
        if B not in readers:
            out.append(_diag_symmetric(acc_hat, joint))
            continue
        Bh, VB, AB = (MatrixSymbol(n, *B.shape) for n in ("Bhat", "V_B", "A_B"))
        VG, AG = MatrixSymbol("V_Gam", *Gam.shape), MatrixSymbol("A_Gam", *Gam.shape)
        f = Inverse(Gam) * Bh
        first = directional_derivative(f, {Gam: VG, Bh: VB})
        second = directional_derivative(first, {Gam: VG, Bh: VB}) + directional_derivative(f, {Gam: AG, Bh: AB})
        val = second.xreplace({Bh: Gam * B, VB: fxi[k], VG: xi[2], AG: acc_gam, AB: acc_hat})
        out.append(_diag_symmetric(val, joint))
    return (out[0], out[1], acc_gam)


def _diagonal_symbols(joint) -> tuple:
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    return tuple(joint.diagonal_blocks) + tuple(t for b, x, e in zip(joint.blocks, xi, eta)
                                                if b in joint.diagonal_blocks for t in (x, e))


def _diag_symmetric(expr, joint):
    """Canonical form with Xᵀ = X for the diagonal blocks and their tangents."""
    return canonicalize(_symmetric(canonicalize(expr), _diagonal_symbols(joint)))


def _proved_zero(expr, joint) -> bool:
    """expr canonicalizes to 0 once diagonal blocks and their tangents are symmetric (Xᵀ = X)."""
    return is_zero(tidy(_diag_symmetric(expr, joint)))


def folded_invariance_summary(geo: FoldedGeometry) -> str:
    """One line per part and lemma (for reports)."""
    lines = [f"part {i} ({geo.joint.parts[i].name}): {r.status}" for i, r in enumerate(geo.invariance)]
    return "\n".join(lines + [f"{k}: {v}" for k, v in geo.lemmas.items()])

