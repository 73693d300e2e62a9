"""Run-time helpers of generated joint-symmetry kernel modules (:mod:`codegen.joint`): no SymPy.

:func:`joint_projection` solves the coupled projection of a joint symmetry, C_i(Σ_j v_j(Λ_j)) = C_i(ξ) for every
part i, by conjugate gradients in the coordinates λ of a Frobenius-orthonormal basis of the joint Lie algebra
(the matrix units of gl(h), the diagonal units of a diagonal algebra, or a declared basis,
normalised: :class:`Algebra`). The operator 𝕄: λ ↦ (⟨E_ik, C_i(v(Λ))⟩)_ik is
symmetric positive semidefinite (⟨X, C(v(Λ))⟩ = g(v(Λ), v(X))), so CG from λ = 0 converges, also on the singular
but consistent systems of parts whose vertical spaces intersect.

**Batched.** Blocks and tangents carry leading batch dimensions (…, r, c) (heads, layers), broadcast against each
other; λ has shape (…, dim 𝔨). CG runs on every batch element at once with its own step sizes; an element stops
updating once its residual ‖b − 𝕄λ‖ ≤ tol ‖b‖, and the loop ends when every element has, or after ``maxiter``
iterations (default 2·dim 𝔨; in exact arithmetic CG ends in dim 𝔨). The default tol = 1e-12 is for float64; in
float32 pass tol ≈ 1e-5 (otherwise the loop runs to ``maxiter`` at round-off). The residual reported is the true
one, ‖b − 𝕄λ‖ / ‖b‖ per batch element, recomputed after the loop (0 where b = 0).
"""
from __future__ import annotations

import torch

__all__ = ["joint_projection", "joint_lambda", "diagonal_parts", "Algebra", "algebra_basis", "algebra_bases"]


def diagonal_parts(values, is_diagonal):
    """Each diagonal block's value replaced by its diagonal part (the Frobenius projection onto its tangent space)."""
    return tuple(torch.diag_embed(torch.diagonal(v, dim1=-2, dim2=-1)) if d else v
                 for v, d in zip(values, is_diagonal))


class Algebra:
    """A part's Lie algebra with Frobenius-orthonormal coordinates: ``kind`` "gl" (the h² matrix units: the
    coordinates are the entries), "diag" (the h diagonal units: the diagonal entries) or "basis" (declared
    matrices, normalised, stacked as ``basis`` (K, h, h)). ``mat`` maps coordinates (…, K) to matrices (…, h, h),
    ``coords`` maps matrices to the Frobenius products with the basis (its adjoint)."""

    def __init__(self, kind: str, h: int, basis=None):
        self.kind, self.h, self.basis = kind, h, basis
        self.dim = h * h if kind == "gl" else h if kind == "diag" else len(basis)

    def mat(self, lam):
        if self.kind == "gl":
            return lam.reshape(*lam.shape[:-1], self.h, self.h)
        if self.kind == "diag":
            return torch.diag_embed(lam)
        return torch.einsum("...k,kab->...ab", lam, self.basis)

    def coords(self, M):
        if self.kind == "gl":
            return M.flatten(-2)
        if self.kind == "diag":
            return torch.diagonal(M, dim1=-2, dim2=-1)
        return torch.einsum("...ab,kab->...k", M, self.basis)


def algebra_basis(spec, h: int, like: torch.Tensor) -> Algebra:
    """The :class:`Algebra` of a part's spec: ``("gl", …, None)``, ``("diag", …, None)`` or ``("basis", …, mats)``
    (the declared matrices, normalised)."""
    kind, _, mats = spec
    if kind in ("gl", "diag"):
        return Algebra(kind, h)
    out = torch.tensor([[[float(x) for x in row] for row in M] for M in mats], dtype=like.dtype, device=like.device)
    return Algebra("basis", h, out / out.flatten(1).norm(dim=1)[:, None, None])


def algebra_bases(ns, blocks) -> list:
    """The :class:`Algebra` of every part of generated module ``ns`` (a module or its globals()), the sizes h_i
    read off ``blocks`` (``PART_DIMS``)."""
    ns = ns if isinstance(ns, dict) else vars(ns)
    out = []
    for i in range(ns["N_PARTS"]):
        k, ax = ns["PART_DIMS"][i]
        out.append(algebra_basis(ns["PART_ALGEBRAS"][i], blocks[k].shape[ax], blocks[0]))
    return out


def _broadcast(blocks, xi):
    batch = torch.broadcast_shapes(*(t.shape[:-2] for t in (*blocks, *xi)))
    return tuple(t.expand(*batch, *t.shape[-2:]) for t in blocks), tuple(t.expand(*batch, *t.shape[-2:]) for t in xi)


def joint_lambda(mod, blocks, xi, tol: float = 1e-12, maxiter: int | None = None, bases=None):
    """(Λ, iterations, relative residual): Λ = (Λ_1, …, Λ_p), each (…, h_i, h_i), with C_i(v(Λ)) = C_i(ξ) for every
    part i (module docstring); the residual ‖b − 𝕄λ‖/‖b‖ has the batch shape. ``bases`` from
    :func:`algebra_bases` (else built here)."""
    ns = mod if isinstance(mod, dict) else vars(mod)
    blocks, xi = _broadcast(blocks, xi)
    bases = bases if bases is not None else algebra_bases(ns, blocks)
    sizes = [B.dim for B in bases]
    diag = [b in ns["DIAGONAL_BLOCKS"] for b in ns["BLOCKS"]]

    def mats(lam):
        return [B.mat(part) for part, B in zip(lam.split(sizes, dim=-1), bases)]

    def vertical(lam):
        total = None
        for i, L in enumerate(mats(lam)):
            v = ns[f"vertical_{i}"](*blocks, L)
            total = list(v) if total is None else [t + x for t, x in zip(total, v)]
        return list(diagonal_parts(total, diag))

    def coords(vec):
        return torch.cat([B.coords(ns[f"condition_{i}"](*blocks, *vec)) for i, B in enumerate(bases)], dim=-1)

    b = coords(xi)
    nb = b.norm(dim=-1)
    thresh = tol * nb
    lam = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rs = (r * r).sum(-1)
    active = rs.sqrt() > thresh
    maxiter = maxiter or 2 * b.shape[-1]
    it = 0
    while bool(active.any()) and it < maxiter:
        Ap = coords(vertical(p))
        pAp = (p * Ap).sum(-1)
        step = active & (pAp > 0)
        alpha = torch.where(step, rs / torch.where(step, pAp, torch.ones_like(pAp)), torch.zeros_like(rs))
        lam = lam + alpha[..., None] * p
        r = r - alpha[..., None] * Ap
        rs_new = (r * r).sum(-1)
        beta = torch.where(step, rs_new / torch.where(step, rs, torch.ones_like(rs)), torch.zeros_like(rs))
        p = torch.where(step[..., None], r + beta[..., None] * p, p)
        rs = torch.where(step, rs_new, rs)
        active = step & (rs.sqrt() > thresh)
        it += 1
    true = (b - coords(vertical(lam))).norm(dim=-1)
    rel = torch.where(nb > 0, true / torch.where(nb > 0, nb, torch.ones_like(nb)), torch.zeros_like(nb))
    return tuple(mats(lam)), it, rel


def joint_projection(mod, blocks, xi, tol: float = 1e-12, maxiter: int | None = None, bases=None):
    """(ξ − v(Λ), iterations, relative residual per batch element) for the generated module ``mod`` (a module or
    its globals()); batched over leading dimensions (module docstring)."""
    ns = mod if isinstance(mod, dict) else vars(mod)
    blocks, xi = _broadcast(blocks, xi)
    lams, it, rel = joint_lambda(ns, blocks, xi, tol=tol, maxiter=maxiter, bases=bases)
    total = None
    for i, L in enumerate(lams):
        v = ns[f"vertical_{i}"](*blocks, L)
        total = list(v) if total is None else [t + x for t, x in zip(total, v)]
    v = diagonal_parts(total, [b in ns["DIAGONAL_BLOCKS"] for b in ns["BLOCKS"]])
    return tuple(x - vv for x, vv in zip(xi, v)), it, rel
