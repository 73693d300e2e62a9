"""Run-time helpers imported by the generated PyTorch kernels (torch only, no SymPy).

Linear matrix equations that appear in the quotient geometries (horizontal projections, e.g. the
Sylvester equation P Λ + Λ P = C of the ``inv`` metric with P = HᵀH GᵀG) have no batched solver in
PyTorch. This module provides them:

* :func:`solve_sylvester` -- general  P Λ + Λ Q = C  by complex eigendecomposition;
* :func:`solve_sylvester_spd_product` -- fast real path for P = Q = S1 S2 with S1, S2 symmetric
  positive definite (Cholesky + ``eigh``, no complex arithmetic);
* :func:`solve_linear_matrix_equation` -- generic  Σ_i L_i Λ K_i = C  via the Kronecker form
  (small sizes only: it solves an (nm)×(nm) system).

It also holds the per-base-point factors (:func:`gram`, :func:`spd_inverse`, :class:`BasePoint`,
:class:`SylvesterFactors`). The helpers of subgroups of GL(h) given by a Lie subalgebra (RoPE: :func:`rope_basis`,
:func:`subalgebra_system`, :func:`solve_subalgebra`, …) live in :mod:`codegen.runtime_subgroup` and are
re-exported here: generated code reaches every helper as ``_rt.<name>``.

Conventions shared by all three:

* Every argument is a tensor of shape ``(..., rows, cols)``; the leading (batch) dimensions, e.g.
  layers × heads, broadcast against each other like ordinary torch operations.
* float32, float64 (and complex64/128) are supported; integer inputs are promoted to the default
  float dtype, mixed dtypes to their common torch type. Real inputs give a real result.
* Autograd: the two Sylvester solvers are ``torch.autograd.Function`` s whose derivatives come
  from the implicit-function theorem (themselves Sylvester solves), not from differentiating the
  eigendecomposition. The derivative is therefore finite even when P has repeated eigenvalues (e.g.
  P = I, where differentiating ``eig``/``eigh`` gives inf/NaN). Reverse mode (any order: the
  backward is built from the same differentiable solvers), forward mode (``jvp``) and
  ``torch.func`` transforms (``grad``, ``jvp``, ``vmap``) are supported.
* Per-base-point factors (:class:`BasePoint`, :class:`SylvesterFactors`): everything in the
  geometry that depends on the base point θ only -- Gram matrices, their inverses, and for the
  ``inv`` projection the eigendecomposition of P = S1 S2 -- is computed once by a generated module's
  ``prepare(G, H, eps)`` and passed to its kernels as ``cache=``. With the factors at hand every
  kernel is a few batched matmuls (plus one elementwise division for the Sylvester solve): no
  factorisation, no triangular solve, no host synchronisation per call.
* Validation: a shape mismatch raises ``ValueError`` naming the argument and the shapes; so does a
  NaN/inf in any input (this check synchronises with the device once per call; pass
  ``check_finite=False`` to skip it, which is required inside ``torch.func.vmap``/``torch.compile``
  where data-dependent Python branches are not allowed).
"""
from __future__ import annotations

from typing import Sequence

import torch

# subgroups of GL(h) given by a Lie subalgebra (RoPE): defined in runtime_subgroup, re-exported here, where the
# generated kernels (``from codegen import runtime as _rt``) and callers find them
from . import runtime_subgroup as _subgroup
from .runtime_subgroup import (
    PAIRINGS,
    SparseBasis,
    random_rope_element,
    rope_basis,
    rope_pairs,
    solve_subalgebra,
    subalgebra_coordinates,
    subalgebra_element,
    subalgebra_project,
    subalgebra_system,
)

__all__ = [
    "solve_sylvester",
    "solve_sylvester_spd_product",
    "solve_linear_matrix_equation",
    "gram",
    "spd_inverse",
    "BasePoint",
    "SylvesterFactors",
    "sylvester_spd_product_factors",
    "solve_sylvester_factored",
    *_subgroup.__all__,
]


# --------------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------------
def _as_tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x)
        except Exception as exc:  # pragma: no cover - message only
            raise ValueError(f"{name} must be a tensor, got {type(x).__name__}") from exc
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (..., rows, cols) with at least 2 dims, "
                         f"got shape {tuple(x.shape)}")
    return x


def _common_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if not (dtype.is_floating_point or dtype.is_complex):
        dtype = torch.get_default_dtype()
    return dtype


def _check_square(x: torch.Tensor, name: str) -> int:
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{name} must be square in its last two dims, got shape {tuple(x.shape)}")
    return x.shape[-1]


def _batch_shape(named: Sequence[tuple[str, torch.Tensor]]) -> torch.Size:
    try:
        return torch.broadcast_shapes(*(t.shape[:-2] for _, t in named))
    except RuntimeError as exc:
        desc = ", ".join(f"{n}: {tuple(t.shape)}" for n, t in named)
        raise ValueError(f"batch (leading) dimensions do not broadcast ({desc})") from exc


def _check_finite(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    for name, t in named:
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} contains non-finite values (NaN or inf); shape {tuple(t.shape)}")


def _prepare(named: Sequence[tuple[str, torch.Tensor]], check_finite: bool) -> list[torch.Tensor]:
    """Promote to a common dtype and expand the batch dims to their broadcast shape.

    Expanding *before* the autograd.Function lets ordinary ``expand`` autograd reduce the
    gradients back to each input's own shape.
    """
    if check_finite:
        _check_finite(named)
    dtype = _common_dtype(*(t for _, t in named))
    batch = _batch_shape(named)
    return [t.to(dtype).expand(*batch, *t.shape[-2:]) for _, t in named]


def _sym(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (x + x.mT)


# --------------------------------------------------------------------------------------------------
# general Sylvester equation by eigendecomposition
# --------------------------------------------------------------------------------------------------
def _sylvester_eig_forward(P: torch.Tensor, Q: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    real = not (P.is_complex() or Q.is_complex() or C.is_complex())
    p, V = torch.linalg.eig(P)  # P = V diag(p) V^-1
    q, W = torch.linalg.eig(Q)  # Q = W diag(q) W^-1
    Cc = C.to(V.dtype)
    Ct = torch.linalg.solve(V, Cc @ W)  # V^-1 C W
    Lt = Ct / (p.unsqueeze(-1) + q.unsqueeze(-2))  # (V^-1 C W)_ij / (p_i + q_j)
    L = torch.linalg.solve(W, V @ Lt, left=False)  # V Lt W^-1
    return L.real if real else L


class _SylvesterEig(torch.autograd.Function):
    """Λ = Sylv(P, Q, C): P Λ + Λ Q = C, with implicit-function derivatives."""

    generate_vmap_rule = True

    @staticmethod
    def forward(P, Q, C):
        return _sylvester_eig_forward(P, Q, C)

    @staticmethod
    def setup_context(ctx, inputs, output):
        P, Q, _ = inputs
        ctx.save_for_backward(P, Q, output)
        ctx.save_for_forward(P, Q, output)

    @staticmethod
    def backward(ctx, gL):
        # Adjoint of dΛ = Sylv(P, Q, dC - dP Λ - Λ dQ):  X = Sylv(Pᴴ, Qᴴ, ḡ),
        # C̄ = X, P̄ = -X Λᴴ, Q̄ = -Λᴴ X.
        P, Q, L = ctx.saved_tensors
        X = _SylvesterEig.apply(P.mH, Q.mH, gL)
        gP = -X @ L.mH if ctx.needs_input_grad[0] else None
        gQ = -L.mH @ X if ctx.needs_input_grad[1] else None
        gC = X if ctx.needs_input_grad[2] else None
        return gP, gQ, gC

    @staticmethod
    def jvp(ctx, dP, dQ, dC):
        P, Q, L = ctx.saved_tensors
        rhs = torch.zeros_like(L) if dC is None else dC
        if dP is not None:
            rhs = rhs - dP @ L
        if dQ is not None:
            rhs = rhs - L @ dQ
        return _SylvesterEig.apply(P, Q, rhs)


def solve_sylvester(P: torch.Tensor, Q: torch.Tensor, C: torch.Tensor, *,
                    check_finite: bool = True) -> torch.Tensor:
    r"""Solve the Sylvester equation  P Λ + Λ Q = C  for Λ, batched.

    Shapes: P ``(..., n, n)``, Q ``(..., m, m)``, C ``(..., n, m)``; the leading dims broadcast;
    returns Λ ``(..., n, m)`` (real if all inputs are real).

    Method (general, P and Q need not be symmetric): diagonalise P = V diag(p) V⁻¹ and
    Q = W diag(q) W⁻¹ with ``torch.linalg.eig`` (complex arithmetic). Substituting
    Λ = V Λ̃ W⁻¹ gives diag(p) Λ̃ + Λ̃ diag(q) = V⁻¹ C W, i.e.

        Λ̃_ij = (V⁻¹ C W)_ij / (p_i + q_j),     Λ = V Λ̃ W⁻¹.

    The solution is unique iff p_i + q_j ≠ 0 for all i, j (e.g. P = HᵀH·GᵀG of the ``inv``
    horizontal projection, Q = P: all eigenvalues positive). Accuracy degrades with the condition
    numbers of the eigenvector matrices V, W (non-normal P, Q) and with 1/min|p_i + q_j|; P and Q
    must be diagonalisable. For P = Q = S1 S2 with S1, S2 SPD prefer
    :func:`solve_sylvester_spd_product` (real, faster, better conditioned).

    Derivatives (implicit function theorem, not through ``eig``):
    dΛ = Sylv(P, Q, dC − dP Λ − Λ dQ); reverse mode X = Sylv(Pᴴ, Qᴴ, Λ̄), C̄ = X, P̄ = −X Λᴴ,
    Q̄ = −Λᴴ X. Finite also when eigenvalues repeat.

    Raises ``ValueError`` on mismatched shapes or (if ``check_finite``) NaN/inf input.
    """
    P, Q, C = _as_tensor(P, "P"), _as_tensor(Q, "Q"), _as_tensor(C, "C")
    n = _check_square(P, "P")
    m = _check_square(Q, "Q")
    if C.shape[-2:] != (n, m):
        raise ValueError(f"C must have shape (..., {n}, {m}) to match P {tuple(P.shape)} and "
                         f"Q {tuple(Q.shape)}, got C {tuple(C.shape)}")
    P, Q, C = _prepare([("P", P), ("Q", Q), ("C", C)], check_finite)
    return _SylvesterEig.apply(P, Q, C)


# --------------------------------------------------------------------------------------------------
# fast path: P = Q = S1 S2 with S1, S2 SPD
# --------------------------------------------------------------------------------------------------
def _sylvester_spd_forward(S1: torch.Tensor, S2: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    S1 = _sym(S1)
    S2 = _sym(S2)
    Lc = torch.linalg.cholesky(S1)  # S1 = Lc Lcᵀ
    M = Lc.mT @ S2 @ Lc  # SPD, similar to P = S1 S2
    p, U = torch.linalg.eigh(_sym(M))  # M = U diag(p) Uᵀ, p > 0
    V = Lc @ U  # P = V diag(p) V⁻¹,  V⁻¹ = Uᵀ Lc⁻¹
    Ct = U.mT @ torch.linalg.solve_triangular(Lc, C @ V, upper=False)  # V⁻¹ C V
    Lt = Ct / (p.unsqueeze(-1) + p.unsqueeze(-2))
    # Λ = V Λ̃ V⁻¹ = (V Λ̃ Uᵀ) Lc⁻¹
    return torch.linalg.solve_triangular(Lc, V @ Lt @ U.mT, upper=False, left=False)


class _SylvesterSPDProduct(torch.autograd.Function):
    """Λ with (S1 S2) Λ + Λ (S1 S2) = C, S1 ← sym(S1), S2 ← sym(S2)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(S1, S2, C):
        return _sylvester_spd_forward(S1, S2, C)

    @staticmethod
    def setup_context(ctx, inputs, output):
        S1, S2, _ = inputs
        ctx.save_for_backward(S1, S2, output)
        ctx.save_for_forward(S1, S2, output)

    @staticmethod
    def backward(ctx, gL):
        # With P = S1 S2: X solves Pᵀ X + X Pᵀ = Λ̄, and Pᵀ = S2 S1 is again an SPD product.
        S1, S2, L = ctx.saved_tensors
        X = _SylvesterSPDProduct.apply(S2, S1, gL)
        gS1 = gS2 = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            gP = -(X @ L.mT + L.mT @ X)
            if ctx.needs_input_grad[0]:
                gS1 = _sym(gP @ _sym(S2).mT)
            if ctx.needs_input_grad[1]:
                gS2 = _sym(_sym(S1).mT @ gP)
        gC = X if ctx.needs_input_grad[2] else None
        return gS1, gS2, gC

    @staticmethod
    def jvp(ctx, dS1, dS2, dC):
        S1, S2, L = ctx.saved_tensors
        rhs = torch.zeros_like(L) if dC is None else dC
        dP = None
        if dS1 is not None:
            dP = _sym(dS1) @ _sym(S2)
        if dS2 is not None:
            t = _sym(S1) @ _sym(dS2)
            dP = t if dP is None else dP + t
        if dP is not None:
            rhs = rhs - dP @ L - L @ dP
        return _SylvesterSPDProduct.apply(S1, S2, rhs)


def solve_sylvester_spd_product(S1: torch.Tensor, S2: torch.Tensor, C: torch.Tensor, *,
                                check_finite: bool = True) -> torch.Tensor:
    r"""Solve  P Λ + Λ P = C  with P = S1 S2, S1 and S2 symmetric positive definite, batched.

    Shapes: S1, S2, C ``(..., h, h)`` (leading dims broadcast); returns Λ ``(..., h, h)``.
    Typical use: the ``inv`` horizontal projection, S1 = HᵀH, S2 = GᵀG (after the ε relaxation).

    Derivation. Factor S1 = F Fᵀ with any invertible F; the code takes the Cholesky factor
    F = L (F = S1^{1/2} works identically). Then

        P = S1 S2 = F Fᵀ S2 = F (Fᵀ S2 F) F⁻¹ = F M F⁻¹,   M := Fᵀ S2 F,

    and M is symmetric positive definite (congruent to S2), so ``torch.linalg.eigh`` gives
    M = U diag(p) Uᵀ with U orthogonal and p > 0. Hence P = V diag(p) V⁻¹ with V = F U,
    V⁻¹ = Uᵀ F⁻¹: P is diagonalisable with real positive eigenvalues (those of S1^{1/2} S2 S1^{1/2}).
    Writing Λ = V Λ̃ V⁻¹, the equation becomes diag(p) Λ̃ + Λ̃ diag(p) = V⁻¹ C V, so

        Λ̃_ij = (Uᵀ F⁻¹ C F U)_ij / (p_i + p_j),     Λ = F U Λ̃ Uᵀ F⁻¹.

    p_i + p_j ≥ 2 min(p) > 0, so the solution always exists and is unique. Only real arithmetic
    (one Cholesky, one ``eigh``, triangular solves); the conditioning is that of F, i.e.
    sqrt(cond(S1)), instead of an arbitrary non-normal eigenvector matrix.

    Only the symmetric parts of S1 and S2 are used (sym(X) = (X + Xᵀ)/2), and gradients are
    returned symmetric, so the function is exactly Λ(sym(S1), sym(S2), C).
    Derivatives via the implicit function theorem: X = Sylv(S2 S1, Λ̄) (again an SPD product),
    C̄ = X, P̄ = −(X Λᵀ + Λᵀ X), S1̄ = sym(P̄ S2), S2̄ = sym(S1 P̄).

    Raises ``ValueError`` on mismatched shapes or (if ``check_finite``) NaN/inf input;
    ``torch.linalg.LinAlgError`` if S1 is not positive definite.
    """
    S1, S2, C = _as_tensor(S1, "S1"), _as_tensor(S2, "S2"), _as_tensor(C, "C")
    h = _check_square(S1, "S1")
    if S2.shape[-2:] != (h, h):
        raise ValueError(f"S2 must have shape (..., {h}, {h}) to match S1 {tuple(S1.shape)}, "
                         f"got S2 {tuple(S2.shape)}")
    if C.shape[-2:] != (h, h):
        raise ValueError(f"C must have shape (..., {h}, {h}) to match S1 {tuple(S1.shape)}, "
                         f"got C {tuple(C.shape)}")
    S1, S2, C = _prepare([("S1", S1), ("S2", S2), ("C", C)], check_finite)
    if S1.is_complex():
        raise ValueError("solve_sylvester_spd_product needs real S1, S2, C; use solve_sylvester")
    return _SylvesterSPDProduct.apply(S1, S2, C)


# --------------------------------------------------------------------------------------------------
# generic linear matrix equation via the Kronecker form
# --------------------------------------------------------------------------------------------------
def solve_linear_matrix_equation(Ls: Sequence[torch.Tensor], Ks: Sequence[torch.Tensor],
                                 C: torch.Tensor, *, check_finite: bool = True) -> torch.Tensor:
    r"""Solve  Σ_i L_i Λ K_i = C  for Λ, batched (generic fallback for small sizes).

    Shapes: each L_i ``(..., n, n)``, each K_i ``(..., m, m)``, C ``(..., n, m)``; leading dims
    broadcast; returns Λ ``(..., n, m)``.

    With column-major vec (vec(X)[j n + i] = X[i, j]) one has vec(L Λ K) = (Kᵀ ⊗ L) vec(Λ), so

        (Σ_i K_iᵀ ⊗ L_i) vec(Λ) = vec(C),

    an (nm)×(nm) dense system solved with ``torch.linalg.solve`` (cost O((nm)³), fine for h ≲ 10;
    use the Sylvester solvers for the two-term case P Λ + Λ Q = C, i.e. Ls = [P, I], Ks = [I, Q]).
    Autograd flows through ``torch.linalg.solve``. Raises ``ValueError`` on mismatched shapes /
    list lengths or (if ``check_finite``) NaN/inf input; ``torch.linalg.LinAlgError`` if the
    Kronecker matrix is singular.
    """
    Ls, Ks = list(Ls), list(Ks)
    if len(Ls) == 0 or len(Ls) != len(Ks):
        raise ValueError(f"Ls and Ks must be non-empty lists of equal length, "
                         f"got len(Ls)={len(Ls)}, len(Ks)={len(Ks)}")
    C = _as_tensor(C, "C")
    n, m = C.shape[-2:]
    named: list[tuple[str, torch.Tensor]] = []
    for i, (L, K) in enumerate(zip(Ls, Ks)):
        L, K = _as_tensor(L, f"Ls[{i}]"), _as_tensor(K, f"Ks[{i}]")
        if L.shape[-2:] != (n, n):
            raise ValueError(f"Ls[{i}] must have shape (..., {n}, {n}) to match C "
                             f"{tuple(C.shape)}, got {tuple(L.shape)}")
        if K.shape[-2:] != (m, m):
            raise ValueError(f"Ks[{i}] must have shape (..., {m}, {m}) to match C "
                             f"{tuple(C.shape)}, got {tuple(K.shape)}")
        named += [(f"Ls[{i}]", L), (f"Ks[{i}]", K)]
    named.append(("C", C))
    tensors = _prepare(named, check_finite)
    C = tensors[-1]
    A = None
    for L, K in zip(tensors[0:-1:2], tensors[1:-1:2]):
        # (Kᵀ ⊗ L)[a n + c, b n + d] = K[b, a] L[c, d]
        term = K.mT[..., :, None, :, None] * L[..., None, :, None, :]
        A = term if A is None else A + term
    A = A.reshape(*A.shape[:-4], n * m, n * m)
    vecC = C.mT.reshape(*C.shape[:-2], n * m)
    vecX = torch.linalg.solve(A, vecC)
    return vecX.reshape(*C.shape[:-2], m, n).mT


def gram(X: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Relaxed Gram matrix XᵀX + εI, shape (..., h, h) for X of shape (..., n, h).

    ε > 0 (paper App. H.2) keeps (XᵀX)⁻¹ defined for rank-deficient X (e.g. heads whose projection
    has collapsed); ε = 0 gives the exact Gram matrix. The relaxation makes the metric only
    approximately invariant, with an error of order ε relative to the smallest eigenvalue of XᵀX."""
    G = X.mT @ X
    if eps:
        G = G + eps * torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)
    return G


# --------------------------------------------------------------------------------------------------
# per-base-point factors (computed once, reused by every kernel call at that base point)
# --------------------------------------------------------------------------------------------------
def spd_inverse(S: torch.Tensor) -> torch.Tensor:
    """S⁻¹ of a batch of symmetric positive definite matrices: S = L Lᵀ, S⁻¹ = L⁻ᵀ L⁻¹.

    Applying an h×h inverse by a matmul is ~15× faster on the CPU than ``torch.cholesky_solve``
    with an n-column right-hand side (LAPACK potrs per batch item with layout copies), and costs
    O(h³) per matrix once. Differentiable in every AD mode (reverse, forward, ``torch.func``).
    (Not ``torch.cholesky_inverse``: its forward-mode derivative is wrong in torch 2.13, which
    the Koszul-reference test of the generated kernels catches.)
    Raises ``torch.linalg.LinAlgError`` if S is not positive definite."""
    L = torch.linalg.cholesky(S)
    eye = torch.eye(S.shape[-1], dtype=S.dtype, device=S.device).expand_as(S)
    L_inv = torch.linalg.solve_triangular(L, eye, upper=False)
    return L_inv.mT @ L_inv


class BasePoint:
    """Factors of a base point θ, built by a generated module's ``prepare(G, H, eps)``.

    Attributes are named after the generated code's symbols: ``GtG`` (Gram matrix GᵀG + εI),
    ``GtG_inv`` (its inverse), likewise for every other block, and ``sylvester`` (a
    :class:`SylvesterFactors`, or None when the projection needs none). ``eps`` records the
    relaxation the factors were built with; ``blocks`` the block tensors (identity-checked by
    :meth:`check`, so a cache is never applied to a different point by mistake).

    The factors carry autograd history if the blocks do; derivatives with respect to ξ through a
    cached kernel are exact. For derivatives with respect to the base point itself prefer the
    uncached call (``cache=None``): it differentiates the Sylvester solve implicitly, while the
    cached eigendecomposition is differentiated through ``eigh`` (undefined at repeated eigenvalues).
    """

    def __init__(self, blocks, eps: float, **factors):
        self.blocks = tuple(blocks)
        self.eps = float(eps)
        self.sylvester = None
        for k, v in factors.items():
            setattr(self, k, v)

    def check(self, *blocks, eps: float = 0.0) -> "BasePoint":
        """Raise ValueError unless ``blocks`` are the tensors (same objects or same storage and
        shape) and ``eps`` the relaxation this cache was built from; returns self."""
        if len(blocks) != len(self.blocks) or float(eps) != self.eps:
            raise ValueError(f"cache was built with eps={self.eps} for {len(self.blocks)} blocks; "
                             f"called with eps={eps} and {len(blocks)} blocks")
        for a, b in zip(blocks, self.blocks):
            if a is b:
                continue
            if not (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
                    and a.data_ptr() == b.data_ptr() and a.stride() == b.stride()):
                raise ValueError("cache was built for a different base point (block tensors differ); "
                                 "call prepare(...) again for this point")
        return self

    def __repr__(self):
        names = ", ".join(k for k in vars(self) if k not in ("blocks", "eps"))
        return f"BasePoint(eps={self.eps}, factors: {names})"


class SylvesterFactors:
    """P = V diag(p) V⁻¹ for P = S1 S2 (S1, S2 SPD), with D_ij = 1/(p_i + p_j).

    Then P Λ + Λ P = C is solved by Λ = V ((V⁻¹ C V) ⊙ D) V⁻¹: four batched matmuls and one
    elementwise product (:func:`solve_sylvester_factored`)."""

    def __init__(self, V: torch.Tensor, V_inv: torch.Tensor, D: torch.Tensor):
        self.V, self.V_inv, self.D = V, V_inv, D


def sylvester_spd_product_factors(S1: torch.Tensor, S2: torch.Tensor) -> SylvesterFactors:
    """Factors of P = S1 S2 (S1, S2 SPD, batched) for :func:`solve_sylvester_factored`.

    Same construction as :func:`solve_sylvester_spd_product`: S1 = L Lᵀ (Cholesky), M = Lᵀ S2 L =
    U diag(p) Uᵀ (``eigh``), V = L U, V⁻¹ = Uᵀ L⁻¹ (L⁻¹ by one triangular solve against I)."""
    S1, S2 = _sym(S1), _sym(S2)
    L = torch.linalg.cholesky(S1)
    p, U = torch.linalg.eigh(_sym(L.mT @ S2 @ L))
    eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L)
    L_inv = torch.linalg.solve_triangular(L, eye, upper=False)
    return SylvesterFactors(L @ U, U.mT @ L_inv, 1.0 / (p.unsqueeze(-1) + p.unsqueeze(-2)))


def solve_sylvester_factored(f: SylvesterFactors, C: torch.Tensor) -> torch.Tensor:
    """Λ = V ((V⁻¹ C V) ⊙ D) V⁻¹ solving P Λ + Λ P = C with the factors of P (batched, linear in C,
    differentiable). No validation and no host synchronisation: the hot path of the ``inv``
    horizontal projection at a fixed base point."""
    return f.V @ (((f.V_inv @ C) @ f.V) * f.D) @ f.V_inv

