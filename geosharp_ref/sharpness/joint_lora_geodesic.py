r"""The geodesic acceleration of the joint LoRA × attention metric in closed form (:mod:`.joint_lora`), and
:func:`spd_product_eig` (the eigendecomposition of a product of two SPD matrices its Sylvester solve uses).

The metric (notation of :mod:`~geosharp_ref.sharpness.joint_lora`): per pair side X (heads, n, h) with row
weights D_X (Ω_a = s_a²(Y_aᵀY_a + εI) on the rows ρ of adapter a, identity elsewhere), T_X = XᵀD_X X + εI,
K_X = ξ_Xᵀ D_X ξ_X, W_X = T_X⁻¹ (inv) or T_X' (mix, X' the other side of the pair), and per adapter its other
factor L (A into a head, C = AAᵀ + εI; B out of a head, C = BᵀB + εI):

    q(θ; ξ) = g_θ(ξ, ξ) = Σ_X tr(W_X K_X) + Σ_a tr(C⁻¹ ξ_A ξ_Aᵀ)  |  tr(C⁻¹ ξ_Bᵀ ξ_B).

The Euler–Lagrange equation of ½ q(γ; γ̇) gives γ̈ = 𝕄⁻¹[½∇_θ q − (D_ξ𝕄)ξ], block by block (dots: derivative
along ξ; Ω̇_a = s_a²(ξ_YᵀY + Yᵀξ_Y), Ḋ_X that on the adapter rows and 0 elsewhere, Ṫ_X = ξ_XᵀD X + XᵀD ξ_X + XᵀḊ X):

* pair side X:  (D_ξ𝕄)ξ = Ḋ ξ W + D ξ Ẇ  (inv Ẇ = −T⁻¹ṪT⁻¹; mix Ẇ_X = Ṫ_X');
  ½∇_X q = −D X T_X⁻¹ K_X T_X⁻¹ (inv) or D X K_X' (mix);  γ̈_X = D⁻¹ [·] W⁻¹.
* adapter a: q depends on Y through every Ω_a: dq = tr(dΩ_a Φ_a) with, summed over heads and row blocks of a,
  Φ_a = Σ ξ_ρ W_X ξ_ρᵀ + (inv: −ρ T_X⁻¹ K_X T_X⁻¹ ρᵀ; mix: ρ K_X' ρᵀ), so ½∇_A q = s² Φ A (into) or s² B Φ
  (out); its own term adds −C⁻¹ξ_Aξ_AᵀC⁻¹A (into) or −B C⁻¹ξ_Bᵀξ_B C⁻¹ (out); (D_ξ𝕄)ξ = −C⁻¹ĊC⁻¹ξ_A with
  Ċ = ξ_AAᵀ + Aξ_Aᵀ (into) or −ξ_B C⁻¹ĊC⁻¹ with Ċ = ξ_BᵀB + Bᵀξ_B (out); γ̈_A = C [·] (into), γ̈_B = [·] C (out).

Checked against ``torch.func`` of the metric and by the Koszul identity with finite differences
(tests/geosharp_ref/sharpness/test_joint_lora.py).
"""
from __future__ import annotations

import torch

__all__ = ["joint_lora_acceleration", "spd_product_eig"]


def _on_rows(fa, b, X, mats, plain: bool):
    """Per adapter row block (a, idx) of pair block b: mats[a] @ X[idx]; the other rows kept (``plain``) or 0."""
    out = X if plain else torch.zeros_like(X)
    for ai, idx in fa.rows[b]:
        out = out.index_copy(-2, idx, mats[ai] @ X.index_select(-2, idx))
    return out


def _solve_right(T, X):
    """X T⁻¹ for symmetric T."""
    return torch.linalg.solve(T, X.mT).mT


def joint_lora_acceleration(fa, p, xi) -> list:
    """γ̈(0) = −Γ_p(ξ, ξ) of the joint metric of ``fa`` (a :class:`~.joint_lora.JointLoRAFactorAt`) at the point
    ``p`` (its block layout), in closed form (see the module doc)."""
    inv, eps, n_pairs = fa.factor.metric == "inv", fa.eps, len(fa.pairs)
    Ys = [fa._Y(p, a) for a in range(len(fa.loras))]
    dYs = [xi[i].mT if into else xi[i] for i, into in zip(fa.lora_index, fa.into)]
    Om = [fa._omega(p, a) for a in range(len(fa.loras))]
    dOm = [s * s * (dY.mT @ Y + Y.mT @ dY) for s, Y, dY in zip(fa.s, Ys, dYs)]
    I = eps * torch.eye(p[0].shape[-1], dtype=p[0].dtype, device=p[0].device)
    T, Td, K, D_X, D_xi = [], [], [], [], []
    for b in range(2 * n_pairs):
        X, x = p[b], xi[b]
        DX, Dx, DdX = _on_rows(fa, b, X, Om, True), _on_rows(fa, b, x, Om, True), _on_rows(fa, b, X, dOm, False)
        T.append(X.mT @ DX + I)
        Td.append(x.mT @ DX + DX.mT @ x + X.mT @ DdX)
        K.append(x.mT @ Dx)
        D_X.append(DX)
        D_xi.append(Dx)
    Phi = [torch.zeros_like(o) for o in Om]
    out = []
    for b in range(2 * n_pairs):
        o = b ^ 1  # the other side of the pair
        X, x = p[b], xi[b]
        if inv:
            Tinv = torch.linalg.inv(T[b])
            W, Wd, half_grad = Tinv, -Tinv @ Td[b] @ Tinv, -D_X[b] @ Tinv @ K[b] @ Tinv
            weight = -Tinv @ K[b] @ Tinv  # the T_X part of Φ
        else:
            W, Wd, half_grad, weight = T[o], Td[o], D_X[b] @ K[o], K[o]
        dM = _on_rows(fa, b, x, dOm, False) @ W + D_xi[b] @ Wd
        rhs = half_grad - dM
        rhs = _on_rows(fa, b, rhs, [torch.linalg.inv(m) for m in Om], True)  # D⁻¹
        out.append(rhs @ T[b] if inv else _solve_right(T[o], rhs))
        for ai, idx in fa.rows[b]:
            rho, xr = X.index_select(-2, idx), x.index_select(-2, idx)
            Phi[ai] = Phi[ai] + (xr @ W @ xr.mT + rho @ weight @ rho.mT).sum(0)
    for a, (i, into) in enumerate(zip(fa.lora_index, fa.into)):
        L, x, s2 = p[i], xi[i], fa.s[a] ** 2
        if into:  # L = A (r, d_in)
            C = L @ L.mT + eps * torch.eye(L.shape[0], dtype=L.dtype, device=L.device)
            Cx = torch.linalg.solve(C, x)  # C⁻¹ ξ_A
            Cd = x @ L.mT + L @ x.mT
            rhs = s2 * Phi[a] @ L - torch.linalg.solve(C, (x @ x.mT) @ torch.linalg.solve(C, L)) \
                + torch.linalg.solve(C, Cd @ Cx)
            out.append(C @ rhs)
        else:  # L = B (d_out, r)
            C = L.mT @ L + eps * torch.eye(L.shape[1], dtype=L.dtype, device=L.device)
            xC = _solve_right(C, x)  # ξ_B C⁻¹
            Cd = x.mT @ L + L.mT @ x
            rhs = s2 * L @ Phi[a] - _solve_right(C, _solve_right(C, L) @ (x.mT @ x)) + _solve_right(C, xC @ Cd)
            out.append(rhs @ C)
    return out


def spd_product_eig(P1, P2):
    """P1 P2 = V diag(a) V⁻¹ for SPD P1, P2 (batched): P1 = L Lᵀ, Lᵀ P2 L = U diag(a) Uᵀ, V = L U,
    V⁻¹ = Uᵀ L⁻¹; the eigenvalues a are positive. Returns (V, a, V⁻¹)."""
    L = torch.linalg.cholesky(0.5 * (P1 + P1.mT))
    a, U = torch.linalg.eigh(L.mT @ P2 @ L)
    Linv = torch.linalg.solve_triangular(L, torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L),
                                         upper=False)
    return L @ U, a, U.mT @ Linv
