r"""LoRA GL(r) × attention GL(h), quotiented jointly: :class:`JointLoRAFactor`.

A peft adapter ΔW = s·B A on an attention projection shares its parameters with the projection's GL(h)
pairs (:mod:`geosharp_ref.symmetry.attention.detect`, "LoRA-adapted projections"): into a head (Q, K, V)
the pair side of head i is G_i = [W0^iᵀ ; b^iᵀ ; (B^i)ᵀ] (B^i = B[cols_i, :], h × r) and A is outside every
pair; out of a head (O) H_i = [W0[:, cols_i] ; A[:, cols_i]] and B is outside. The adapter's own symmetry
(B R, R⁻¹ A), R ∈ GL(r), moves the adapter rows ρ of every head (r × h) as

    into a head:  ρ ↦ Rᵀ ρ,  A ↦ R⁻¹ A;        out of a head:  ρ ↦ R⁻¹ ρ,  B ↦ B R,

a left action on rows that commutes with the pairs' right action (G_i M_i, H_i M_i⁻ᵀ): the joint group
GL(r) × Π_i GL(h) acts on the union of the blocks. Its Lie algebra gl(r) × Π gl(h) gives the vertical vectors

    v(X, Λ) = (G_i Λ_i + [adapter rows] Xᵀρ | −Xρ ,  −H_i Λ_iᵀ + [adapter rows] Xᵀρ | −Xρ ,  −X A | B X).

**Metric** (invariant under the whole group; eps = 0). With Y = Aᵀ (into) or Y = B (out) and
Ω = s² YᵀY (r × r), let D be the identity on every row of a pair side except its adapter rows, where it
is Ω (so XᵀDX = X̂ᵀX̂ with X̂ the side with each adapter row block ρ replaced by s·Yρ, i.e. by the adapter's
share of the effective weight, s·Aᵀ(B^i)ᵀ or s·B A[:, cols_i]). Per pair and head, S_X = XᵀDX,

    inv:  g = tr(S_G⁻¹ ξ_Gᵀ D_G η_G) + tr(S_H⁻¹ ξ_Hᵀ D_H η_H) + g_L
    mix:  g = tr(S_H ξ_Gᵀ D_G η_G)   + tr(S_G ξ_Hᵀ D_H η_H)   + g_L
    g_L = tr((AAᵀ)⁻¹ ξ_A η_Aᵀ)  (into)      g_L = tr((BᵀB)⁻¹ ξ_Bᵀ η_B)  (out)

The motion of Y does not enter the pair terms (D weights ξ's own rows). Invariance: under GL(h) D is fixed,
S_X ↦ MᵀS_X M, ξ_X ↦ ξ_X M; under GL(r) ρᵀΩρ, ξ_ρᵀΩη_ρ (so S_X, ξ_XᵀDη_X) and g_L are unchanged (the proof:
docs/guides/joint-quotients.md). PD when every X̂ and Y have full column rank; eps > 0 relaxes every Gram (not
invariant). As a matrix g(ξ, η) = ⟨ξ, 𝕄 η⟩_F, 𝕄 block diagonal: inv 𝕄_G η = D_G η S_G⁻¹, mix 𝕄_G η = D_G η S_H.

**Horizontal projection** P ξ = ξ − v(X, Λ): the normal equations v*𝕄v (X, Λ) = v*(𝕄ξ) in the joint algebra
(v* the Frobenius adjoint), by block elimination: per head a Sylvester equation P Λ + Λ Q = C (eigenbasis; a
rotary Q/K pair: the d×d system on its RoPE commutant's basis, ``codegen.runtime_subgroup``), the adapters
through the Σ r² × Σ r² Schur complement (once per base point; LU).

**Second-order geodesic** E(ξ) = θ + ξ + ½γ̈(0), γ̈ = −Γ(ξ, ξ) = −𝕄⁻¹[(D_ξ𝕄)ξ − ½∇_θ⟨ξ, 𝕄(θ)ξ⟩] (the
Euler–Lagrange equation of ½⟨γ̇, 𝕄(γ)γ̇⟩) written out in :mod:`.joint_lora_geodesic` (tested against
``torch.func``), 𝕄⁻¹ in closed form; d = P 𝕄⁻¹ (∂E/∂ξ)ᵀ ū by vjp. Tangent slice: the pairs' blocks, then each
adapter's factor outside the pairs (A into, B out). :func:`joint_lora_factors` builds the factors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from codegen.runtime_subgroup import rope_basis, solve_subalgebra, subalgebra_system

from ..apgd import combine
from ..symmetry import LoRABinding, lora_bindings
from .exact_geodesic import GeodesicPart
from .factors import check_rank, random_tangent_like
from .joint_lora_geodesic import joint_lora_acceleration, spd_product_eig
from .joint_lora_hessian import JointLoRAHessianBlock
from .space import SpaceOptions, frobenius

__all__ = ["JointLoRAFactor", "JointLoRAFactorAt", "joint_lora_factors", "lora_scaling"]


@dataclass(frozen=True)
class JointLoRAFactor:
    """LoRA adapters (``lora``: a :class:`~geosharp_ref.symmetry.LoRABinding` or a sequence of them, with
    ``scaling`` s per adapter) and the GL(h) pair groups (``pairs``: :class:`~geosharp_ref.symmetry.PairGroup`)
    that hold their B rows (adapter on a projection into the heads) or A columns (out of the heads), under the
    joint metric ``metric`` ("inv" or "mix", see the module doc) with Gram relaxation ``eps``. A rotary Q/K pair
    (``rotary`` set: the RoPE subgroup) contributes its subalgebra instead of gl(h)."""

    lora: object
    pairs: tuple
    metric: str = "mix"
    eps: float = 0.0
    scaling: object = 1.0

    def __post_init__(self):
        loras = (self.lora,) if isinstance(self.lora, LoRABinding) else tuple(self.lora)
        scal = tuple(float(s) for s in self.scaling) if isinstance(self.scaling, (list, tuple)) \
            else (float(self.scaling),) * len(loras)
        if not loras or len(scal) != len(loras):
            raise ValueError(f"JointLoRAFactor needs at least one adapter and one scaling per adapter, got "
                             f"{len(loras)} adapters and {len(scal)} scalings")
        if self.metric not in ("inv", "mix"):
            raise ValueError(f"unknown metric {self.metric!r}: the joint LoRA factor has 'inv' and 'mix'")
        if any(s == 0 or not math.isfinite(s) for s in scal):
            raise ValueError(f"LoRA scalings must be finite and non-zero, got {scal}")
        for name, value in (("lora", loras), ("pairs", tuple(self.pairs)), ("scaling", scal)):
            object.__setattr__(self, name, value)

    @property
    def param_names(self) -> tuple:
        return tuple(dict.fromkeys([n for b in (*self.pairs, *self.lora) for n in b.param_names]))

    @property
    def keys(self) -> list:
        return [p.key for p in self.pairs] + [a.key for a in self.lora]

    def generic(self) -> list:
        return [self]

    def at(self, params, options: SpaceOptions = SpaceOptions()) -> "JointLoRAFactorAt":
        return JointLoRAFactorAt(self, params, options)


def _adapter_rows(pairs, lora: LoRABinding, into: bool, like):
    """``[(block index, [idx_1, …])]``: idx_k the rows (length r, in B's column / A's row order) of one copy of the
    adapter rows in that pair block (several under GQA stacking); found with a marker (j + 1 in r-index j, the
    pair's other parameters 0); partial coverage refused."""
    name = lora.b_weight if into else lora.a_weight
    P = like[name]
    r = P.shape[1] if into else P.shape[0]
    j = torch.arange(1, r + 1, dtype=torch.float64, device=P.device)
    marker = (j[None, :] if into else j[:, None]).expand(P.shape).contiguous()
    found, covered = [], torch.zeros(P.shape, dtype=torch.float64, device=P.device)
    for k, pair in enumerate(pairs):
        if name not in pair.param_names:
            continue
        # the pair's own parameters zeroed (the others as they are: a pair seen through a norm's fold reads γ)
        zeros = {**like, **{n: torch.zeros(like[n].shape, dtype=torch.float64, device=P.device)
                            for n in pair.param_names}}
        blocks = pair.extract({**zeros, name: marker})
        ones = pair.insert(zeros, tuple(torch.ones_like(b) for b in blocks))
        covered = covered + ones[name]
        for side, X in enumerate(blocks):
            lab = X[0, :, 0]
            if bool((X != lab[None, :, None]).any()):
                raise ValueError(f"{pair.key}: the rows of {name} are not whole rows of the pair's blocks")
            rows = [torch.nonzero(lab == v).flatten() for v in j]
            copies = {len(x) for x in rows}
            if len(copies) != 1:
                raise ValueError(f"{pair.key}: {name} appears an unequal number of times per rank index")
            if copies.pop():
                found.append((2 * k + side, [torch.stack([x[c] for x in rows]) for c in range(len(rows[0]))]))
    if not found or not bool((covered == 1).all()):
        raise ValueError(f"{lora.key}: {name} must be covered exactly once by the given pairs (every head of its "
                         "projection); give all pair groups of that layer")
    return found


class JointLoRAFactorAt:
    """:class:`JointLoRAFactor` at a base point (the factor hooks of :mod:`~geosharp_ref.sharpness.factors`,
    generic: no per-vector state)."""

    def __init__(self, factor: JointLoRAFactor, params, options: SpaceOptions):
        self.factor, self.options, self.eps = factor, options, float(factor.eps)
        self.pairs, self.loras, self.s = list(factor.pairs), list(factor.lora), list(factor.scaling)
        in_pairs = {n for p in self.pairs for n in p.param_names}
        self.into = []
        for a in self.loras:
            b_in, a_in = a.b_weight in in_pairs, a.a_weight in in_pairs
            if b_in == a_in:
                raise ValueError(f"{a.key}: exactly one of lora_B (projection into the heads) or lora_A (out of the "
                                 f"heads) must be held by the given pairs; B held: {b_in}, A held: {a_in}")
            self.into.append(b_in)
        blocks = [X for p in self.pairs for X in p.extract(params)]
        self.n_pair_blocks = len(blocks)
        self.lora_index = list(range(len(blocks), len(blocks) + len(self.loras)))
        blocks += [self._outside(a, into, params) for a, into in zip(self.loras, self.into)]
        self.point, self.size = blocks, len(blocks)
        # rows[b] = [(adapter index, idx), …]: the adapter row blocks of pair block b
        self.rows = [[] for _ in range(self.n_pair_blocks)]
        for ai, (a, into) in enumerate(zip(self.loras, self.into)):
            for b, idxs in _adapter_rows(self.pairs, a, into, params):
                self.rows[b] += [(ai, idx) for idx in idxs]
        self.ranks = [(p.shape[0] if into else p.shape[1]) for p, into in zip(blocks[self.n_pair_blocks:], self.into)]
        for a, into, L in zip(self.loras, self.into, blocks[self.n_pair_blocks:]):
            check_rank(a.key, ("lora_A" if into else "lora_B",), ((L.mT if into else L)[None],), self.eps)
        for k, pair in enumerate(self.pairs):
            lifted = [self._lift(self.point, 2 * k + t, self.point[2 * k + t]) for t in (0, 1)]
            check_rank(pair.key, ("G (adapter rows weighted)", "H (adapter rows weighted)"), lifted, self.eps)
        self._solver, self._base_grams = None, {}

    @staticmethod
    def _outside(a, into, params):
        """The adapter's factor outside the pairs, through its binding (so a fold applies): A (r, d_in) into a
        head, B (d_out, r) out of one."""
        G, H = a.extract(params)
        return H[0].mT if into else G[0]

    # -- the metric ------------------------------------------------------------------------------------
    def _Y(self, p, ai):
        """Y = Aᵀ (into) or B (out) of adapter ``ai`` at p: its rows ρ enter the effective weight as s·Yρ."""
        L = p[self.lora_index[ai]]
        return L.mT if self.into[ai] else L

    def _omega(self, p, ai):
        """Ω = s²(YᵀY + εI), (r, r)."""
        Y = self._Y(p, ai)
        return self.s[ai] ** 2 * (Y.mT @ Y + self.eps * torch.eye(Y.shape[-1], dtype=Y.dtype, device=Y.device))

    def _weigh(self, p, b, X, inverse=False):
        """D X (or D⁻¹ X) for pair block b: Ω (Ω⁻¹) on every adapter row block, the identity elsewhere."""
        for ai, idx in self.rows[b]:
            Om = self._omega(p, ai)
            rows = X.index_select(-2, idx)
            X = X.index_copy(-2, idx, torch.linalg.solve(Om, rows) if inverse else Om @ rows)
        return X

    def _lift(self, p, b, X):
        """X̂: the adapter row blocks ρ of pair block b replaced by s·Yρ (X̂ᵀX̂ = XᵀDX at eps = 0)."""
        parts = [self.s[ai] * self._Y(p, ai) @ X.index_select(-2, idx) for ai, idx in self.rows[b]]
        return torch.cat([X[..., self._plain(b), :]] + parts, dim=-2) if parts else X

    def _plain(self, b):
        """The rows of pair block b that are no adapter's (a bool mask)."""
        keep = torch.ones(self.point[b].shape[-2], dtype=torch.bool, device=self.point[b].device)
        for _, idx in self.rows[b]:
            keep[idx] = False
        return keep

    def _grams(self, p, k):
        """(S_G, S_H) = (GᵀD_G G + εI, HᵀD_H H + εI) of pair k at p, and the unrelaxed Grams (cached at θ)."""
        if p is self.point and k in self._base_grams:
            return self._base_grams[k]
        G, H = p[2 * k], p[2 * k + 1]
        SG, SH = G.mT @ self._weigh(p, 2 * k, G), H.mT @ self._weigh(p, 2 * k + 1, H)
        I = self.eps * torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
        if p is self.point:
            self._base_grams[k] = (SG + I, SH + I, SG, SH)
        return SG + I, SH + I, SG, SH

    def _adapter_metric(self, p, ai, w, inverse=False):
        """g_L's matrix on w: (AAᵀ + εI)^{∓1} w (into) or w (BᵀB + εI)^{∓1} (out)."""
        L = p[self.lora_index[ai]]
        if self.into[ai]:
            C = L @ L.mT + self.eps * torch.eye(L.shape[0], dtype=L.dtype, device=L.device)
            return C @ w if inverse else torch.linalg.solve(C, w)
        C = L.mT @ L + self.eps * torch.eye(L.shape[1], dtype=L.dtype, device=L.device)
        return w @ C if inverse else torch.linalg.solve(C, w.mT).mT

    def metric_apply(self, p, eta, inverse=False):
        """𝕄(p) η (or 𝕄(p)⁻¹ η): g_p(ξ, η) = ⟨ξ, 𝕄(p) η⟩_F (see the module doc)."""
        out = []
        for k in range(len(self.pairs)):
            TG, TH, _, _ = self._grams(p, k)
            for t, T_own, T_other in ((0, TG, TH), (1, TH, TG)):
                b, x = 2 * k + t, eta[2 * k + t]
                if self.factor.metric == "inv":  # D η S_own⁻¹ ; inverse D⁻¹ w S_own
                    y = x @ T_own if inverse else torch.linalg.solve(T_own, x.mT).mT
                else:  # D η S_other ; inverse D⁻¹ w S_other⁻¹
                    y = torch.linalg.solve(T_other, x.mT).mT if inverse else x @ T_other
                out.append(self._weigh(p, b, y, inverse))
        out += [self._adapter_metric(p, ai, eta[i], inverse) for ai, i in enumerate(self.lora_index)]
        return out

    def metric_inner(self, p, xi, eta):
        return frobenius(xi, self.metric_apply(p, eta))

    # -- the vertical space and the projection ----------------------------------------------------------
    def vertical(self, Xs, Lams):
        """v(X, Λ) at the base point: X per adapter (r, r), Λ per pair (heads, h, h)."""
        p = self.point
        out = []
        for k, Lam in enumerate(Lams):
            out += [p[2 * k] @ Lam, -(p[2 * k + 1] @ Lam.mT)]
        for b in range(self.n_pair_blocks):
            for ai, idx in self.rows[b]:
                rho = p[b].index_select(-2, idx)
                move = Xs[ai].mT @ rho if self.into[ai] else -(Xs[ai] @ rho)
                out[b] = out[b].index_add(-2, idx, move)
        for ai, i in enumerate(self.lora_index):
            out.append(-(Xs[ai] @ p[i]) if self.into[ai] else p[i] @ Xs[ai])
        return out

    def _zeros_algebra(self):
        P = self.point
        Xs = [torch.zeros(r, r, dtype=P[0].dtype, device=P[0].device) for r in self.ranks]
        Lams = [P[2 * k].new_zeros(P[2 * k].shape[0], P[2 * k].shape[-1], P[2 * k].shape[-1])
                for k in range(len(self.pairs))]
        return Xs, Lams

    def vertical_adjoint(self, w):
        """v*(w), the Frobenius adjoint of v, as (Xs, Lams): Λ̄_k = G_kᵀ w_G − w_Hᵀ H_k per head; X̄ = Σ ρ w_ρᵀ
        (into) or −Σ w_ρ ρᵀ (out) over the adapter rows, − w_A Aᵀ (into) or + Bᵀ w_B (out)."""
        p = self.point
        Lams = [p[2 * k].mT @ w[2 * k] - w[2 * k + 1].mT @ p[2 * k + 1] for k in range(len(self.pairs))]
        Xs = [-(w[i] @ p[i].mT) if self.into[ai] else p[i].mT @ w[i] for ai, i in enumerate(self.lora_index)]
        for b in range(self.n_pair_blocks):
            for ai, idx in self.rows[b]:
                rho, w_rho = p[b].index_select(-2, idx), w[b].index_select(-2, idx)
                Xs[ai] = Xs[ai] + ((rho @ w_rho.mT) if self.into[ai] else -(w_rho @ rho.mT)).sum(0)
        return Xs, Lams

    def normal_operator(self, Xs, Lams):
        """N(X, Λ) = v*(𝕄 v(X, Λ)): the metric's Gram operator on the joint algebra."""
        return self.vertical_adjoint(self.metric_apply(self.point, self.vertical(Xs, Lams)))

    def _prepare_solver(self):
        """Per pair the eigenbases of N_ΛΛ's Sylvester form (or its commutant system), then the Schur complement."""
        eig = []
        for k in range(len(self.pairs)):
            TG, TH, SG, SH = self._grams(self.point, k)
            # inv: (T_H S_G) Λ + Λ (S_H T_G) = T_H C T_G;  mix: (T_G⁻¹ S_G) Λ + Λ (S_H T_H⁻¹) = T_G⁻¹ C T_H⁻¹
            l, r = (TH, TG) if self.factor.metric == "inv" else (torch.linalg.inv(TG), torch.linalg.inv(TH))
            rotary = getattr(self.pairs[k], "rotary", None)
            if rotary is not None:  # N_ΛΛ Λ = S_G Λ r⁻¹ + l⁻¹ Λ S_H restricted to the RoPE commutant (a d×d system)
                basis = rope_basis(SG.shape[-1], rotary[0], rotary[1])
                Ls, Ks = (SG, torch.linalg.inv(l)), (torch.linalg.inv(r), SH)
                eig.append(("subalgebra", basis, (Ls, Ks, torch.linalg.inv(subalgebra_system(Ls, Ks, basis)))))
                continue
            eig.append((spd_product_eig(l, SG), spd_product_eig(SH, r), (l, r)))
        self._eig = eig
        Xs, Lams = self._zeros_algebra()
        m, red = sum(r * r for r in self.ranks), self._adapter_rows_only()
        self._red, cols = red, []
        for e in torch.eye(m, dtype=Xs[0].dtype, device=Xs[0].device):  # S e = N_XX e − N_XΛ N_ΛΛ⁻¹ N_ΛX e
            nX, nL = red.normal_operator(self._unflat(e), Lams)
            cols.append(self._flat(nX) - self._flat(red.normal_operator(Xs, self._solve_pairs(nL))[0]))
        S = torch.stack(cols, dim=1)
        self._schur = torch.linalg.lu_factor(0.5 * (S + S.mT))
        self._solver = True

    def _adapter_rows_only(self):
        """This factor with every pair block cut to its adapter rows and the base point's Grams: the same N_XX,
        N_ΛX and N_XΛ (v(X, 0) lives on those rows and the adapter blocks, 𝕄 is row-local given the Grams, and
        the X part of v* reads only them), at the cost of r rows per head instead of n."""
        red = object.__new__(type(self))
        red.__dict__.update(self.__dict__)
        red.point, red.rows = list(self.point), []
        for b in range(self.n_pair_blocks):
            idx = [i for _, i in self.rows[b]]
            keep = torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long, device=self.point[b].device)
            red.point[b] = self.point[b].index_select(-2, keep)
            starts = [sum(len(i) for i in idx[:j]) for j in range(len(idx))]
            red.rows.append([(ai, torch.arange(a, a + len(i), device=keep.device))
                             for (ai, i), a in zip(self.rows[b], starts)])
        red._grams = lambda p, k: self._grams(self.point, k)
        return red

    def _flat(self, Xs):
        return torch.cat([X.reshape(-1) for X in Xs])

    def _unflat(self, flat):
        return [x.reshape(r, r) for x, r in zip(flat.split([r * r for r in self.ranks]), self.ranks)]

    def _solve_pairs(self, Cs):
        """N_ΛΛ⁻¹: per pair and head the Sylvester equation P Λ + Λ Q = (preconditioned) C."""
        out = []
        for C, (first, second, third) in zip(Cs, self._eig):
            if isinstance(first, str):  # a rotary pair: the Galerkin system on the commutant's basis
                Ls, Ks, M_inv = third
                out.append(solve_subalgebra(Ls, Ks, C, second, M_inv))
                continue
            (VP, aP, VPi), (VQ, aQ, VQi), (l, r) = first, second, third
            rhs = VPi @ (l @ C @ r) @ VQ
            out.append(VP @ (rhs / (aP[..., :, None] + aQ[..., None, :])) @ VQi)
        return out

    def lie_coefficients(self, xi):
        """(X, Λ) with v(X, Λ) the g-orthogonal projection of ξ onto the vertical space (block elimination)."""
        if self._solver is None:
            self._prepare_solver()
        bX, bL = self.vertical_adjoint(self.metric_apply(self.point, xi))
        zX, zL = self._zeros_algebra()
        L0 = self._solve_pairs(bL)
        rhs = self._flat(bX) - self._flat(self._red.normal_operator(zX, L0)[0])  # N_XΛ Λ0 on the adapter rows
        Xs = self._unflat(torch.linalg.lu_solve(*self._schur, rhs[:, None])[:, 0])
        nL = self._red.normal_operator(Xs, zL)[1]  # N_ΛX X
        Lams = self._solve_pairs([b - n for b, n in zip(bL, nL)])
        return Xs, Lams

    # -- geodesics ------------------------------------------------------------------------------------
    def acceleration(self, p, xi):
        """γ̈(0) = −Γ_p(ξ, ξ) = −𝕄⁻¹[(D_ξ𝕄)ξ − ½∇_θ⟨ξ, 𝕄(θ)ξ⟩] at p, in closed form (:mod:`.joint_lora_geodesic`)."""
        return joint_lora_acceleration(self, p, xi)

    def geodesic2(self, xi):
        """E(ξ) = θ + ξ + ½γ̈(0)."""
        return [t + x + 0.5 * a for t, x, a in zip(self.point, xi, self.acceleration(self.point, xi))]

    # -- factor hooks -----------------------------------------------------------------------------------
    def zeros(self):
        return [torch.zeros_like(b) for b in self.point]

    def random(self, generator):
        """Unprojected, and transforming like a tangent vector under the joint group: per pair block
        X̌ W X̂ (W Gaussian square on the lifted block X̂, X̌ the lift's left inverse: adapter rows
        (1/s)(YᵀY)⁻¹Yᵀ), per adapter A W (into) or W B (out)."""
        out = []
        for b in range(self.n_pair_blocks):
            X = self.point[b]
            Xh = self._lift(self.point, b, X)
            Z, keep, xi = random_tangent_like(Xh, generator), self._plain(b), torch.zeros_like(X)
            at = int(keep.sum())
            xi[..., keep, :] = Z[..., :at, :]
            for ai, idx in self.rows[b]:
                Y = self._Y(self.point, ai)
                back = torch.linalg.solve(Y.mT @ Y, Y.mT @ Z[..., at:at + Y.shape[0], :]) / self.s[ai]
                xi = xi.index_copy(-2, idx, back)
                at += Y.shape[0]
            out.append(xi)
        for ai, i in enumerate(self.lora_index):
            L = self.point[i]
            n = L.shape[1] if self.into[ai] else L.shape[0]
            W = torch.randn(n, n, generator=generator, dtype=L.dtype).to(L.device) / math.sqrt(n)
            out.append(L @ W if self.into[ai] else W @ L)
        return out

    def inner(self, xi, eta, state=None):
        if self.options.metric_norm:
            return self.metric_inner(self.point, xi, eta)
        return frobenius(xi, eta)

    def project(self, xi):
        Xs, Lams = self.lie_coefficients(xi)
        return [x - v for x, v in zip(xi, self.vertical(Xs, Lams))]

    def forward(self, xi, state):
        """E(ξ); for the exact gradient the forward state is E's pullback (``torch.func.vjp``), which the ascent
        step applies to ū instead of recomputing E."""
        o = self.options
        if not o.geodesic_correction:
            return [b + x for b, x in zip(self.point, xi)], None
        if o.gradient == "exact":
            E, pull = torch.func.vjp(lambda *x: tuple(self.geodesic2(list(x))), *xi)
            return list(E), pull
        return self.geodesic2(xi), None

    def perturbed(self, xi):
        o = self.options
        if not o.geodesic_correction:
            return [b + x for b, x in zip(self.point, xi)]
        if o.gradient == "perturbed":  # value E(ξ), derivative in ξ the identity
            with torch.no_grad():
                E = self.geodesic2([x.detach() for x in xi])
            return [e + (x - x.detach()) for e, x in zip(E, xi)]
        return self.geodesic2(xi)

    def ascent(self, xi, cot, forward_state):
        o = self.options
        if o.geodesic_correction and o.gradient == "exact":
            pull = forward_state or torch.func.vjp(lambda *x: tuple(self.geodesic2(list(x))),
                                                   *[x.detach() for x in xi])[1]
            grad = list(pull(tuple(cot)))
        else:
            grad = list(cot)
        if o.metric_norm:
            d = self.project(self.metric_apply(self.point, grad, inverse=True))
            return d, None, frobenius(d, grad), frobenius(xi, grad)
        d = self.project(grad)
        return d, None, frobenius(d, d), frobenius(xi, d)

    def insert(self, params, blocks):
        for k, pair in enumerate(self.pairs):
            params = pair.insert(params, (blocks[2 * k], blocks[2 * k + 1]))
        for a, into, i in zip(self.loras, self.into, self.lora_index):  # through the binding (a fold applies)
            G, H = a.extract(params)
            params = a.insert(params, (G, blocks[i].mT[None]) if into else (blocks[i][None], H))
        return params

    def geodesic_parts(self) -> list:
        """Hook of the exact geodesic: one part, every block, acceleration −Γ_x(v, v) at the current x."""
        return [GeodesicPart([[i] for i in range(self.size)], tuple(self.point),
                             lambda q, v: tuple(self.acceleration(list(q), list(v))))]

    def hessian_block(self):
        """The Riemannian Hessian's view of this factor (:mod:`.joint_lora_hessian`)."""
        return JointLoRAHessianBlock(self)

    def lincomb(self, terms):
        return [combine([(c, x[j]) for c, x, _ in terms]) for j in range(self.size)], None

    def scale(self, xi, state, s):
        return [x * (s.to(x.dtype) if torch.is_tensor(s) else s) for x in xi], None


def lora_scaling(model, lora: LoRABinding) -> float:
    """The peft scaling s of ``lora`` in ``model`` (``LoraLayer.scaling[adapter]``, alpha / r by default)."""
    path, rest = lora.b_weight.rsplit(".lora_B.", 1)
    return float(model.get_submodule(path).scaling[rest.rsplit(".weight", 1)[0]])


def joint_lora_factors(model, pairs, metric: str = "mix", eps: float = 0.0, loras=None) -> tuple:
    """``(factors, pairs left)``: one :class:`JointLoRAFactor` per connected set of LoRA adapters (``loras``,
    default :func:`~geosharp_ref.symmetry.lora_bindings` of ``model``) and the attention ``pairs`` holding
    their B rows or A columns (two adapters sharing a pair, or one adapter on a fused [Q|K|V] reaching
    several pairs, land in one factor); the pairs no adapter reaches are returned for the plain GL(h) factor.
    Adapters no pair holds are not covered (quotient them with their own GL(r) factor). An adapter's scaling is
    its binding's ``scaling`` (set by :func:`~geosharp_ref.symmetry.lora_bindings`), else read from ``model``."""
    loras = lora_bindings(model) if loras is None else list(loras)
    pairs = list(pairs)
    links = [[k for k, p in enumerate(pairs) if a.b_weight in p.param_names or a.a_weight in p.param_names]
             for a in loras]
    comp = list(range(len(loras)))  # union-find over adapters sharing a pair

    def root(i):
        while comp[i] != i:
            i = comp[i]
        return i
    for i in range(len(loras)):
        for j in range(i):
            if set(links[i]) & set(links[j]):
                comp[root(i)] = root(j)
    factors, used = [], set()
    for c in dict.fromkeys(root(i) for i in range(len(loras)) if links[i]):
        members = [i for i in range(len(loras)) if root(i) == c]
        ks = sorted({k for i in members for k in links[i]})
        used |= set(ks)
        scal = tuple(getattr(loras[i], "scaling", None) or lora_scaling(model, loras[i]) for i in members)
        factors.append(JointLoRAFactor(tuple(loras[i] for i in members), tuple(pairs[k] for k in ks), metric, eps,
                                       scal))
    return factors, [p for k, p in enumerate(pairs) if k not in used]
