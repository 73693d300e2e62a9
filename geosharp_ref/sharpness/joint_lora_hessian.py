r"""The Riemannian Hessian's view of the joint LoRA × attention factor (:mod:`.joint_lora`): the block interface
of :func:`~geosharp_ref.sharpness.hessian.hessian_block` from the factor's hand-written geometry.

The joint metric is, block by block, a left times a right multiplication (notation of :mod:`.joint_lora`;
g(ξ, η) = ⟨ξ, 𝕄 η⟩_F):

    pair side X (heads, n, h):  𝕄 η = D η W,   W = T_X⁻¹ (inv) or T_X' (mix, X' the pair's other side),
                                D = Ω_a = s_a²(Y_aᵀY_a + εI) on the rows of adapter a, the identity elsewhere;
    adapter A (into a head):    𝕄 η = C⁻¹ η,   C = AAᵀ + εI;
    adapter B (out of a head):  𝕄 η = η C⁻¹,   C = BᵀB + εI.

Every factor is symmetric positive definite and the left and right factors commute as operators, so the
metric-orthonormal coordinates are explicit: S = 𝕄^{-1/2} is η ↦ D^{-1/2} η W^{-1/2} (C^{1/2} η, η C^{1/2}) and
S⁻¹ the same with the opposite powers (both roots of each matrix from one ``torch.linalg.eigh``,
:func:`~geosharp_ref.sharpness.hessian.spd_sqrt_pair`). 𝔾⁻¹ is the factor's
``metric_apply(…, inverse=True)``, P its ``project``, and c(ξ) = ½ (Dγ̈(ξ))ᵀ ∇L one VJP of its closed-form
acceleration (:func:`~geosharp_ref.sharpness.joint_lora_geodesic.joint_lora_acceleration`). The parameter
blocks are cut and placed through the bindings (pairs, then each adapter's factor outside the pairs), and the
covector's blocks are the adjoint of that insert (``torch.func.vjp``), since the pairs' blocks hold the adapter's
rows.
"""
from __future__ import annotations

import torch

from .hessian import insert_adjoint, spd_sqrt_pair

__all__ = ["JointLoRAHessianBlock"]


class JointLoRAHessianBlock:
    """The block interface of :func:`~geosharp_ref.sharpness.hessian.hessian_block` for a
    :class:`~geosharp_ref.sharpness.joint_lora.JointLoRAFactorAt` ``at`` (see the module doc)."""

    def __init__(self, at):
        self.at, self.factor = at, at.factor
        self._roots = None

    def roots(self):
        """``{power: [(left, right) per block]}``, the factors of S^power for power −½ (whiten) and ½ (unwhiten),
        computed on first use: None for the identity; on a pair side ``left`` is ``[(adapter rows, Ω^power)]``."""
        if self._roots is None:
            self._roots = self._factors()
        return self._roots

    def _factors(self):
        at, out = self.at, {-0.5: [], 0.5: []}
        for k in range(len(at.pairs)):
            TG, TH, _, _ = at._grams(at.point, k)
            for t, T_own, T_other in ((0, TG, TH), (1, TH, TG)):
                # S = D^{-1/2} · W^{-1/2} on the right: inv W = T_own⁻¹ (right T_own^{1/2}), mix W = T_other
                half, inv_half = spd_sqrt_pair(T_own if self.factor.metric == "inv" else T_other)
                right = (half, inv_half) if self.factor.metric == "inv" else (inv_half, half)
                rows = [(idx, spd_sqrt_pair(at._omega(at.point, ai))) for ai, idx in at.rows[2 * k + t]]
                out[-0.5].append(([(idx, r[1]) for idx, r in rows], right[0]))
                out[0.5].append(([(idx, r[0]) for idx, r in rows], right[1]))
        for ai, i in enumerate(at.lora_index):
            L = at.point[i]
            eye = torch.eye(L.shape[0] if at.into[ai] else L.shape[1], dtype=L.dtype, device=L.device)
            half, inv_half = spd_sqrt_pair((L @ L.mT if at.into[ai] else L.mT @ L) + at.eps * eye)  # 𝕄 ∝ C⁻¹
            for power, C in ((-0.5, half), (0.5, inv_half)):
                out[power].append((C, None) if at.into[ai] else ([], C))
        return out

    def _apply(self, xi, power):
        out = []
        for x, (left, right) in zip(xi, self.roots()[power]):
            if isinstance(left, list):
                for idx, M in left:
                    x = x.index_copy(-2, idx, M @ x.index_select(-2, idx))
            elif left is not None:
                x = left @ x
            out.append(x if right is None else x @ right)
        return out

    def whiten(self, xi):
        """S ξ = 𝕄^{-1/2} ξ."""
        return self._apply(xi, -0.5)

    def unwhiten(self, xi):
        """S⁻¹ ξ = 𝕄^{1/2} ξ."""
        return self._apply(xi, 0.5)

    def metric_inverse(self, w):
        return self.at.metric_apply(self.at.point, list(w), inverse=True)

    def project(self, xi):
        return self.at.project(list(xi))

    def acceleration_covector(self, xi, grad):
        """c(ξ) = ½ (Dγ̈(ξ))ᵀ ∇L (one VJP of the closed-form acceleration at θ)."""
        _, pull = torch.func.vjp(lambda *x: tuple(self.at.acceleration(self.at.point, list(x))), *xi)
        return [0.5 * c for c in pull(tuple(grad))]

    def geodesic_acceleration(self, point, xi):
        """γ̈ = −Γ_x(ξ, ξ) at the blocks ``point``."""
        return self.at.acceleration(list(point), list(xi))

    def extract(self, d):
        at = self.at
        return [X for p in at.pairs for X in p.extract(d)] + [at._outside(a, into, d)
                                                              for a, into in zip(at.loras, at.into)]

    def pull(self, d, zeroed):
        return insert_adjoint(self.at, self.factor.param_names, d, zeroed())
