"""Joint symmetries: several group actions on overlapping blocks, quotiented as one product group.

A :class:`JointSymmetry` is a tuple of :class:`~derivations.symmetry.Symmetry` *parts* whose block sets overlap;
the product group K_1 × … × K_p acts on the union of their blocks, part i by its own action on its blocks and by
the identity on the others. It is a group action iff the parts' actions commute,
ψ_i(A_i, ψ_j(A_j, θ)) = ψ_j(A_j, ψ_i(A_i, θ)), which :meth:`JointSymmetry.validate` proves symbolically.

**Motivating case** (:func:`norm_qk`): a pre-norm transformer's norm weight γ ∈ R^d read by a Q/K pair. With
Γ = diag(γ), G = W_Qᵀ, H = W_Kᵀ ∈ R^{d×h}, scores use Γ G Hᵀ Γ. Part 1: GL(h), (G A, H A⁻ᵀ). Part 2: the
diagonal group, Γ ↦ Γ D, G ↦ D⁻¹ G, H ↦ D⁻¹ H (D = diag(d), declared as the subgroup of GL(d) with the
diagonal Lie algebra; written Γ D so that the declared invariants Γ G and Γ H hold for every D). Γ is a
*diagonal block*: its values and tangents are diagonal matrices; the diagonal group's elements commute with Γ
and are symmetric, which the invariance proofs use. :func:`lora_attention` is LoRA's GL(r) on (Aᵀ, Bᵀ) jointly
with attention's GL(h) on (W_Qᵀ, W_Kᵀ, Bᵀ).

**Invariant metrics** (:func:`joint_invariant_metrics`): the same exact method as
:func:`derivations.invariant.invariant_metrics` (Lie derivative along random generators of *every* part = 0,
solved exactly), over the *two-sided* ansatz

    tr(W ξ_iᵀ V η_j)      (blocks i, j of equal shape, symmetrised)

with W a word of at most ``degree`` letters among the column-side Grams of the blocks X with as many columns
as ξ_i (XᵀX, (XᵀX)⁻¹ and the row-weighted XᵀUX, (XᵀUX)⁻¹, U a row-side Gram of X), and V = I or one row-side
letter (the Grams of the blocks whose column count is ξ_i's row count, and their inverses). For norm × Q/K this
contains Σ_i ξ_γi η_γi / γ_i² + tr((GᵀΓ²G)⁻¹ ξ_Gᵀ Γ² η_G) + tr((HᵀΓ²H)⁻¹ ξ_Hᵀ Γ² η_H): the GL pair's ``inv``
on the D-invariant blocks P = ΓG, Q = ΓH (PᵀP = GᵀΓ²G transforms as a GL(h) Gram). Each basis element's
invariance under every part is proved symbolically (:func:`prove_joint_invariance`).

The geometry (vertical space, coupled projection, geodesic) is in :mod:`derivations.joint_geometry`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import sympy as sp
from sympy import Identity, Inverse, MatrixSymbol, Trace

from .errors import DeclarationError
from .exact_eval import DualEvaluator, fraction_matrix, random_int_matrix
from .invariant import solve_invariant_span
from .invariant_proofs import move_group_factors_left, pd_text, tidy
from .matrix_calculus import canonicalize, directional_derivative, is_zero
from .metric import InvarianceResult, Metric, _expand_group_inverses, simplify_under_group
from .subgroup import Subalgebra
from .symmetry import Symmetry, gl_pair

__all__ = ["JointSymmetry", "norm_qk", "lora_attention", "diagonal_scaling", "prove_joint_invariance",
           "joint_invariant_metrics", "JointFamily", "JointMetric",
           "JointInvariantMetric", "joint_definiteness"]


@dataclass(frozen=True, eq=False)
class JointSymmetry:
    """The product of ``parts`` acting on the union of their blocks (module docstring)."""

    name: str
    parts: tuple
    diagonal_blocks: tuple = ()
    description: str = ""
    positive_blocks: bool = False
    elementwise: bool = False
    subalgebra: object = None

    def __post_init__(self):
        self.validate()

    @property
    def blocks(self) -> tuple:
        out = []
        for p in self.parts:
            out += [b for b in p.blocks if b not in out]
        return tuple(out)

    def tangent(self, prefix: str) -> tuple:
        return tuple(MatrixSymbol(f"{prefix}_{b.name}", *b.shape) for b in self.blocks)

    def element(self, i: int):
        """Part i's group element, renamed A{i} so that the parts' elements are distinct symbols."""
        A = self.parts[i].group_element
        return MatrixSymbol(f"A{i}", *A.shape)

    def lie(self, i: int):
        A = self.parts[i].group_element
        return MatrixSymbol(f"X{i}", *A.shape)

    def act(self, i: int, point=None) -> dict:
        """ψ_i(A_i, θ) on the union (identity on the blocks part i does not act on); ``point`` replaces θ."""
        p = self.parts[i]
        sub = {p.group_element: self.element(i)}
        out = {b: b for b in self.blocks}
        out.update({b: e.xreplace(sub) for b, e in zip(p.blocks, p.action)})
        if point is not None:
            out = {b: e.xreplace(point) for b, e in out.items()}
        return out

    def vertical(self, i: int, X=None) -> tuple:
        """v_i(X) on the union blocks (zero on the blocks part i does not act on)."""
        p = self.parts[i]
        v = dict(zip(p.blocks, p.vertical(self.lie(i) if X is None else X)))
        return tuple(v.get(b, sp.ZeroMatrix(*b.shape)) for b in self.blocks)

    def pushforward(self, i: int, tangent: tuple) -> tuple:
        acted = self.act(i)
        dirs = dict(zip(self.blocks, tangent))
        return tuple(directional_derivative(acted[b], dirs) for b in self.blocks)

    def commuting(self, i: int) -> tuple:
        """Symbols commuting with part i's group elements: the diagonal blocks and their tangents when the part's
        Lie algebra is diagonal (then its elements are diagonal, hence symmetric)."""
        if not _diagonal_part(self.parts[i]):
            return ()
        tangents = [t for pre in ("xi", "eta") for b, t in zip(self.blocks, self.tangent(pre))
                    if b in self.diagonal_blocks]
        return tuple(self.diagonal_blocks) + tuple(tangents)

    def validate(self):
        if len(self.parts) < 2:
            raise DeclarationError(f"joint symmetry {self.name!r}: give at least two parts")
        for b in self.diagonal_blocks:
            if b not in self.blocks or b.shape[0] != b.shape[1]:
                raise DeclarationError(f"joint symmetry {self.name!r}: diagonal block {b} must be a square block of a part")
        for i in range(len(self.parts)):
            for j in range(i + 1, len(self.parts)):
                lhs = self.act(i, point=self.act(j))
                rhs = self.act(j, point=self.act(i))
                for b in self.blocks:
                    d = _simplify(canonicalize(lhs[b] - rhs[b]), self, (i, j))
                    if not is_zero(d):
                        raise DeclarationError(
                            f"joint symmetry {self.name!r}: the actions of parts {i} and {j} do not commute on {b} "
                            f"(difference {d}); a product group needs commuting actions")


@dataclass(frozen=True)
class JointMetric(Metric):
    """A :class:`Metric` on the union blocks of a :class:`JointSymmetry` (same call convention)."""

    def __post_init__(self):
        if not isinstance(self.symmetry, JointSymmetry):
            raise DeclarationError(f"JointMetric needs a JointSymmetry, got {type(self.symmetry).__name__}")


def _diagonal_part(part) -> bool:
    sub = part.subalgebra
    return sub is not None and sub.kind == "basis" and all(
        M[r, c] == 0 for M in sub.matrices for r in range(M.rows) for c in range(M.cols) if r != c)


def _simplify(expr, joint, parts):
    """Canonical form for identities in the group elements of ``parts``: diagonal elements are symmetric and
    commute with the diagonal blocks (and their tangents)."""
    for i in parts:
        A = joint.element(i)
        if joint.commuting(i):
            expr = canonicalize(expr.xreplace({A.T: A}))
        for _ in range(2):
            expr = canonicalize(_expand_group_inverses(expr, A))
        if joint.commuting(i):
            expr = canonicalize(_symmetric(expr, joint.diagonal_blocks + (A,)))
            expr = canonicalize(move_group_factors_left(expr, A, joint.commuting(i)))
        expr = simplify_under_group(expr, A) if not isinstance(expr, sp.MatrixExpr) else expr
    return expr


def _symmetric(expr, symbols):
    """Xᵀ → X for symmetric (diagonal) symbols, also inside inverses."""
    rep = {}
    for s in symbols:
        rep[s.T] = s
        rep[Inverse(s.T)] = Inverse(s)
    return expr.xreplace(rep)


def prove_joint_invariance(metric: Metric, joint: JointSymmetry) -> list:
    """One :class:`InvarianceResult` per part: g_{ψ_i(A_i,θ)}(dψ_i ξ, dψ_i η) − g_θ(ξ, η) canonicalized (proved) or
    not (status ``"counterexample"`` with the remaining difference; refuted numerically by the caller)."""
    out = []
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    for i in range(len(joint.parts)):
        acted = joint.act(i)
        moved = metric(joint.pushforward(i, xi), joint.pushforward(i, eta), point=tuple(acted[b] for b in joint.blocks))
        diff = canonicalize(moved - canonicalize(metric.expr))
        diff = _simplify(_symmetric(diff, joint.diagonal_blocks), joint, (i,))
        if is_zero(diff):
            out.append(InvarianceResult("proved", diff, proof=f"part {i} ({joint.parts[i].name}): symbolic"))
            continue
        witness = _refute(diff, joint, i)
        out.append(InvarianceResult("counterexample", diff, witness) if witness is not None else
                   InvarianceResult("numerical", diff, proof=f"part {i}: did not cancel symbolically; zero at "
                                                             "random exact points"))
    return out


def _refute(diff, joint, i, sizes=None, trials=3, seed=0):
    """An exact point (diagonal blocks diagonal, a group element of part i) where ``diff`` ≠ 0, else None."""
    rng = random.Random(seed)
    dims = {s for b in joint.blocks for d in b.shape for s in sp.sympify(d).free_symbols}
    part = joint.parts[i]
    fixed = part.subalgebra.fixed_h if part.subalgebra is not None else None
    for t in range(trials):
        sz = {s: (fixed if fixed and s in sp.sympify(part.group_element.shape[0]).free_symbols else 2 + (t + k) % 3)
              for k, s in enumerate(sorted(dims, key=str))}
        if fixed:  # every dimension equal to the diagonal group's
            sz = {s: fixed for s in dims}
        env = {}
        for b, x, e in zip(joint.blocks, joint.tangent("xi"), joint.tangent("eta")):
            for s in (b, x, e):
                env[s] = (_random_block(b, joint, sz, rng), None)
        h = int(sp.sympify(part.group_element.shape[0]).xreplace(sz))
        if part.subalgebra is not None:
            A = sum((Fraction(rng.randint(1, 5), 2) * fraction_matrix(E) for E in part.subalgebra.basis(h)),
                    np.zeros((h, h), dtype=object) + Fraction(0))
        else:
            A = random_int_matrix(h, h, rng) + 5 * np.eye(h, dtype=int).astype(object)
        env[joint.element(i)] = (A, None)
        try:
            val = DualEvaluator(sz, env).value(diff)
        except ZeroDivisionError:
            continue
        if val != 0:
            return {"sizes": {str(k): v for k, v in sz.items()}, "value": val}
    return None


# ------------------------------------------------------------------------------------------------
# Built-in joint declarations
# ------------------------------------------------------------------------------------------------

def diagonal_scaling(d: int, blocks: tuple, scaled: MatrixSymbol, name: str = "diag_scaling") -> Symmetry:
    """Γ ↦ Γ D, B ↦ D⁻¹ B for each B in ``blocks`` (D diagonal d×d: the subgroup of GL(d) with the diagonal Lie
    algebra); preserves Γ B. ``d`` is the concrete dimension of the diagonal algebra's basis."""
    dim = scaled.shape[0]
    D = MatrixSymbol("D", dim, dim)
    basis = tuple(sp.Matrix(d, d, lambda r, c: int(r == c == k)) for k in range(d))
    return Symmetry(name=name, blocks=(scaled, *blocks), group_element=D, identity=Identity(dim),
                    action=(scaled * D, *[Inverse(D) * b for b in blocks]),
                    invariant=tuple(scaled * b for b in blocks),
                    description=f"diagonal scaling {scaled} -> {scaled} D, B -> D^-1 B for B in {list(blocks)}",
                    dims=(dim,), subalgebra=Subalgebra("basis", matrices=basis))


def norm_qk(d: int = 3) -> JointSymmetry:
    """Pre-norm weight Γ = diag(γ) (d×d) × the Q/K pair (G, H ∈ R^{d×h}): GL(h) × diagonal scalings."""
    pair = gl_pair("G", "H", n="d", m="d", h="h")
    G, H = pair.blocks
    Gam = MatrixSymbol("Gam", G.shape[0], G.shape[0])
    return JointSymmetry("norm_qk", (pair, diagonal_scaling(d, (G, H), Gam, "norm_scaling")), diagonal_blocks=(Gam,),
                         description="norm weight diag(gamma) x Q/K pair: (Gam D, D^-1 G A, D^-1 H A^-T)")


def lora_attention() -> JointSymmetry:
    """LoRA on the query, ΔW_Qᵀ = Aᵀ Bᵀ (At ∈ R^{d×r}, Bt ∈ R^{r×h}), × the Q/K pair: GL(h) on (G, H, Bt) by
    (G M, H M⁻ᵀ, Bt M), GL(r) on (At, Bt) by (At N, N⁻¹ Bt); preserves G + At Bt and H."""
    att = gl_pair("G", "H", n="d", m="d", h="h")
    G, H = att.blocks
    M = att.group_element
    r = sp.Symbol("r", integer=True, positive=True)
    At, Bt = MatrixSymbol("At", G.shape[0], r), MatrixSymbol("Bt", r, G.shape[1])
    att3 = Symmetry("attention_gl", (G, H, Bt), M, Identity(M.shape[0]), (G * M, H * Inverse(M).T, Bt * M),
                    (G * H.T, At * Bt * H.T), description="GL(h) on (G, H, Bt)", dims=att.dims)
    N = MatrixSymbol("N", r, r)
    lora = Symmetry("lora_gl", (At, Bt), N, Identity(r), (At * N, Inverse(N) * Bt), (At * Bt,),
                    description="GL(r) on (At, Bt)", dims=(r,))
    return JointSymmetry("lora_attention", (att3, lora), description="LoRA GL(r) x attention GL(h)")


# ------------------------------------------------------------------------------------------------
# Invariant metrics of a joint symmetry
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JointInvariantMetric:
    """A basis element of a joint family: its invariance per part and its definiteness at random points."""

    name: str
    metric: Metric
    invariance: tuple            # InvarianceResult per part
    definiteness: str            # "positive definite" | "positive semidefinite" | "indefinite"
    positive_on: tuple = ()


@dataclass
class JointFamily:
    joint: JointSymmetry
    basis: list               # [JointInvariantMetric]
    n_candidates: int
    n_independent: int
    sizes: dict
    pd_conditions: str = ""

    @property
    def symmetry(self):
        return self.joint

    def summary(self) -> str:
        lines = [f"joint symmetry: {self.joint.description}",
                 f"solved: {self.n_candidates} terms, {self.n_independent} independent -> {len(self.basis)} metrics"]
        for m in self.basis:
            lines.append(f"{m.name}: {m.metric.expr}   [{', '.join(p.status for p in m.invariance)}]; "
                         f"{m.definiteness}" + (f" on {', '.join(map(str, m.positive_on))}"
                                                if m.definiteness == "positive semidefinite" else ""))
        if self.pd_conditions:
            lines.append(f"PD: {self.pd_conditions}")
        return "\n".join(lines)


def joint_definiteness(metric, joint, sizes, trials: int = 2, seed: int = 3) -> tuple[str, tuple]:
    """Definiteness of ``metric`` from its float64 coordinate Gram matrix g(e_a, e_b) at random points (a diagonal
    block's coordinates are its diagonal entries), and the blocks on which it is positive definite."""
    rng = np.random.default_rng(seed)
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    order = ["positive definite", "positive semidefinite", "indefinite"]
    worst, positive_on = 0, None
    for _ in range(trials):
        vals, coords = {}, []
        for k, b in enumerate(joint.blocks):
            r, c = (int(sp.sympify(d).xreplace(sizes)) for d in b.shape)
            if b in joint.diagonal_blocks:
                vals[b] = np.diag(rng.uniform(0.5, 2.0, r) * rng.choice([-1.0, 1.0], r))
                coords += [(k, (q, q)) for q in range(r)]
            else:
                vals[b] = rng.standard_normal((r, c))
                coords += [(k, (p, q)) for p in range(r) for q in range(c)]

        def unit(a):
            out = [np.zeros(vals[b].shape) for b in joint.blocks]
            k, idx = coords[a]
            out[k][idx] = 1.0
            return out

        units = [unit(a) for a in range(len(coords))]
        shared, N = {}, len(coords)
        Gm = np.zeros((N, N))
        for a in range(N):
            for c in range(a, N):
                env = {b: (v, None) for b, v in vals.items()}
                env.update({x: (u, None) for x, u in zip(xi, units[a])})
                env.update({t: (u, None) for t, u in zip(eta, units[c])})
                ev = DualEvaluator(sizes, env, exact=False, shared=shared, volatile=(*xi, *eta))
                Gm[a, c] = Gm[c, a] = float(ev.value(metric.expr))
        scale = max(1.0, float(np.abs(Gm).max()))
        low = float(np.linalg.eigvalsh(Gm).min())
        worst = max(worst, 0 if low > 1e-9 * scale else 1 if low > -1e-9 * scale else 2)
        pos = tuple(b for k, b in enumerate(joint.blocks)
                    if np.linalg.eigvalsh(Gm[np.ix_(*[[a for a, (kk, _) in enumerate(coords) if kk == k]] * 2)]).min()
                    > 1e-9 * scale)
        positive_on = pos if positive_on is None else tuple(b for b in positive_on if b in pos)
    return order[worst], positive_on


def _letters(joint, dim, depth=2):
    """Gram letters acting on the ``dim`` side: XᵀX, (XᵀX)⁻¹ for blocks with ``dim`` columns, and (depth 2)
    XᵀUX, (XᵀUX)⁻¹ with U a row-side letter of X."""
    out = []
    for X in joint.blocks:
        if X.shape[1] != dim:
            continue
        out += [X.T * X, Inverse(X.T * X)]
        if depth > 1 and X not in joint.diagonal_blocks:
            for U in _letters(joint, X.shape[0], depth=1):
                out += [X.T * U * X, Inverse(X.T * U * X)]
    return out


def _joint_candidates(joint, degree=1):
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    swap = {**dict(zip(xi, eta)), **dict(zip(eta, xi))}
    B = joint.blocks
    terms = []
    for i in range(len(B)):
        for j in range(len(B)):
            if B[i].shape != B[j].shape:
                continue
            rows, cols = B[i].shape
            Ws = [Identity(cols)] + (_letters(joint, cols) if degree >= 1 else [])
            Vs = [Identity(rows)] + _letters(joint, rows, depth=1)
            for W in Ws:
                for V in Vs:
                    t = Trace(W * xi[i].T * V * eta[j])
                    terms.append((f"tr(W xi_{B[i]}^T V eta_{B[j]})", canonicalize(t + t.xreplace(swap))))
    return [(lab, t) for lab, t in terms if not is_zero(t)]


def _random_block(b, joint, sizes, rng):
    r, c = (int(sp.sympify(s).xreplace(sizes)) for s in b.shape)
    if b in joint.diagonal_blocks:
        vals = [Fraction(rng.choice([-3, -2, -1, 1, 2, 3]), rng.randint(1, 2)) for _ in range(r)]
        return np.array([[vals[p] if p == q else Fraction(0) for q in range(c)] for p in range(r)], dtype=object)
    return random_int_matrix(r, c, rng)


def _joint_evaluators(joint, sizes, rng, ctx, n_tangents=6):
    """For one random base point θ and ``n_tangents`` random tangent pairs (ξ, η): one DualEvaluator per part and
    pair (dual parts = the Lie derivative along a random element of part i's algebra). Sub-expressions of θ alone
    (Grams, their inverses and derivatives) are shared between the pairs."""
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    base = {b: _random_block(b, joint, sizes, rng) for b in joint.blocks}
    pairs = [({x: _random_block(b, joint, sizes, rng) for b, x in zip(joint.blocks, xi)},
              {t: _random_block(b, joint, sizes, rng) for b, t in zip(joint.blocks, eta)}) for _ in range(n_tangents)]
    out = []
    for i, part in enumerate(joint.parts):
        h = int(sp.sympify(part.group_element.shape[0]).xreplace(sizes))
        if part.subalgebra is not None:
            basis = [fraction_matrix(E) for E in part.subalgebra.basis(h)]
            X = sum((rng.randint(-3, 3) * E for E in basis), np.zeros((h, h), dtype=object) + Fraction(0))
        else:
            X = random_int_matrix(h, h, rng)
        v, dvx, dve = ctx[i]
        theta_env = {joint.lie(i): (X, None), **{b: (val, None) for b, val in base.items()}}
        plain = DualEvaluator(sizes, dict(theta_env))
        dual_theta = {b: (base[b], plain.value(vb)) for b, vb in zip(joint.blocks, v)}
        shared = {}
        for k, (xs, es) in enumerate(pairs):
            e = {**theta_env, **{s: (val, None) for s, val in {**xs, **es}.items()}}
            plain = DualEvaluator(sizes, dict(e))
            e.update(dual_theta)
            for dx, de, x, t in zip(dvx, dve, xi, eta):
                e[x] = (xs[x], plain.value(dx))
                e[t] = (es[t], plain.value(de))
            out.append((DualEvaluator(sizes, e, shared=shared, volatile=(*xi, *eta)), i == 0))
    return out


def vertical_context(joint) -> list:
    """Per part i of ``joint``: (v_i, D_ξ v_i, D_η v_i), its vertical vectors and their directional derivatives
    along the symbolic tangents ξ, η (what the exact Lie-derivative evaluations of a candidate metric need)."""
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    ctx = []
    for i in range(len(joint.parts)):
        v = joint.vertical(i)
        ctx.append((v, tuple(directional_derivative(e, dict(zip(joint.blocks, xi))) for e in v),
                    tuple(directional_derivative(e, dict(zip(joint.blocks, eta))) for e in v)))
    return ctx


def joint_invariant_metrics(joint: JointSymmetry, sizes: dict, degree: int = 1, seed: int = 0) -> JointFamily:
    """Invariant, symmetric, bilinear metrics of ``joint`` in the two-sided ansatz (module docstring), solved
    exactly at the concrete ``sizes`` {dimension name: int} (the diagonal algebra's d included), each proved
    invariant under every part symbolically."""
    sizes = {s: sizes[s.name] for b in joint.blocks for s in b.free_symbols | set().union(
        *[sp.sympify(d).free_symbols for d in b.shape]) if getattr(s, "name", None) in sizes}
    sizes = dict(sorted(sizes.items(), key=lambda kv: kv[0].name))  # by name: not by the hash seed's set order
    cands = _joint_candidates(joint, degree)
    ctx = vertical_context(joint)
    rng = random.Random(seed)
    # drop candidates undefined at the sizes (inverse of a rank-deficient Gram)
    probe = _joint_evaluators(joint, sizes, random.Random(seed + 1), ctx, n_tangents=1)[0][0]
    ok = []
    for lab, t in cands:
        try:
            probe(t)
            ok.append((lab, t))
        except ZeroDivisionError:
            continue
    n_all = len(cands)
    cands, dense, _ = solve_invariant_span(ok, lambda p: _joint_evaluators(joint, sizes, rng, ctx))
    fam = JointFamily(joint, [], n_all, len(cands), sizes)
    if dense is None:
        return fam
    for r in range(dense.rows):
        expr = tidy(sp.Add(*[dense[r, k] * cands[k][1] for k in range(dense.cols) if dense[r, k] != 0]))
        expr = _symmetric(expr, joint.diagonal_blocks).as_content_primitive()[1]
        metric = JointMetric(joint, expr, f"m{r}")
        kind, pos = joint_definiteness(metric, joint, sizes)
        fam.basis.append(JointInvariantMetric(f"m{r}", metric, tuple(prove_joint_invariance(metric, joint)), kind, pos))
    fam.pd_conditions = pd_text(fam).replace(". `metric(choice)` + check_metric re-checks a combination exactly", "")
    return fam
