"""Rewrites of the derived matrix expressions before they are printed as torch code (SymPy).

What the generated kernels compute is decided here, by cost:

* :func:`introduce_grams` replaces each adjacent pair Bᵀ B of a product by a Gram symbol ``BtB``
  (:func:`gram_symbol`), computed (or taken from a prepared cache) once per function;
* :func:`factor_inverses` pulls shared factors out of sums, so an inverse applied by a solve is applied once and
  the additions move into small h×h matrices;
* :func:`share_products` is common-subexpression elimination for the expensive two-factor products (those
  contracting a large dimension, n h² flops), a product and its transpose counting as one.
"""
from __future__ import annotations

import re

import sympy as sp
from sympy import Identity, Inverse, MatAdd, MatMul, MatrixExpr, MatrixSymbol, Transpose

from derivations.matrix_calculus import canonicalize

__all__ = ["gram_symbol", "introduce_grams", "factor_inverses", "share_products"]


def gram_symbol(B: MatrixSymbol) -> MatrixSymbol:
    """The symbol ``BtB`` standing for the Gram matrix BᵀB (B of shape n×h: h×h)."""
    return MatrixSymbol(f"{B.name}t{B.name}", B.shape[1], B.shape[1])


def introduce_grams(expr, blocks):
    """Replace every adjacent pair (Bᵀ, B) in a product by the symbol ``BtB``."""
    mats_blocks = [b for b in blocks if isinstance(b, MatrixSymbol)]
    if not isinstance(expr, sp.Basic) or getattr(expr, "is_Atom", False) or isinstance(expr, MatrixSymbol):
        return expr
    args = [introduce_grams(a, blocks) for a in expr.args]
    if isinstance(expr, MatMul):
        coeff, mats = MatMul(*args).as_coeff_matrices() if args else (1, [])
        out, i = [], 0
        while i < len(mats):
            if i + 1 < len(mats) and any(mats[i] == Transpose(b) and mats[i + 1] == b for b in mats_blocks):
                out.append(gram_symbol(mats[i + 1]))
                i += 2
            else:
                out.append(mats[i])
                i += 1
        if len(out) == 1 and coeff == 1:
            return out[0]
        return MatMul(coeff, *out) if coeff != 1 else MatMul(*out)
    return expr.func(*args)


_GRAM = re.compile(r"^(\w+)t\1$")  # the names gram_symbol gives: GtG, HtH, WtW


def _is_small(shape, small) -> bool:
    return all(sp.sympify(d).is_Integer or sp.sympify(d) in small for d in shape)


def _is_solve(M) -> bool:
    """An inverse applied by a solve (not a Gram symbol's explicit inverse)."""
    return isinstance(M, Inverse) and not (isinstance(M.arg, MatrixSymbol) and _GRAM.match(M.arg.name))


def factor_inverses(expr, small=()):
    """Pull shared factors out of sums, so each is applied once:

    * Σ_i A_i M⁻¹ → (Σ_i A_i) M⁻¹ and Σ_i M⁻¹ B_i → M⁻¹ (Σ_i B_i) for inverses applied by a solve
      (one solve instead of one per term); inverses of Gram symbols (``BtB``) are explicit h×h
      matrices (``BtB_inv``) and are treated like any other factor;
    * Σ_i P B_i → P (Σ_i B_i) and Σ_i A_i P → (Σ_i A_i) P for any common first / last factor P when
      the bracketed sum is small (all its dimensions in ``small``, e.g. h×h), e.g. the ``inv``
      acceleration ξ M⁻¹ Gᵀξ + ξ M⁻¹ ξᵀG → ξ M⁻¹ (Gᵀξ + ξᵀG): one n×h·h×h product instead of two.
      A large sum is left distributed: (G S₁ + ξ S₂) M⁻¹ costs three n×h·h×h products,
      G (S₁ M⁻¹) + ξ (S₂ M⁻¹) two (the ``mix`` acceleration).
    * a bare symbol P among such terms counts as P·I, so B + ξ + ½(B S₁ + ξ S₂) (the second-order
      geodesic) becomes B (I + ½S₁) + ξ (I + ½S₂): the additions move into h×h matrices and no
      n×h-sized sum is left but one.
    Solve-inverses are tried first (right, then left), then other factors (left, then right)."""
    if isinstance(expr, sp.Basic) and not isinstance(expr, MatAdd) and expr.args and isinstance(expr, MatrixExpr):
        return expr.func(*[factor_inverses(a, small) if isinstance(a, MatrixExpr) else a for a in expr.args])
    if not isinstance(expr, MatAdd):
        return expr
    for side, need_inverse in ((-1, True), (0, True), (0, False), (-1, False)):
        groups, rest = {}, []  # key -> [(bracketed body, the original term)]
        for t in expr.args:
            coeff, mats = t.as_coeff_matrices() if isinstance(t, MatMul) else (1, [t])
            if len(mats) > 1 and (_is_solve(mats[side]) if need_inverse else True):
                body = mats[:-1] if side == -1 else mats[1:]
                groups.setdefault(mats[side], []).append(
                    (coeff * MatMul(*body) if len(body) > 1 else coeff * body[0], t))
            elif not need_inverse and len(mats) == 1 and isinstance(mats[0], MatrixSymbol):
                P = mats[0]  # P = P·I (side 0) = I·P (side −1)
                groups.setdefault(P, []).append((coeff * Identity(P.shape[1] if side == 0 else P.shape[0]), t))
            else:
                rest.append(t)
        if not need_inverse:  # only factor when the bracketed sum is small
            for key in [k for k, v in groups.items() if len(v) < 2 or not _is_small(v[0][0].shape, small)]:
                rest += [t for _, t in groups.pop(key)]
        if any(len(v) > 1 for v in groups.values()):
            terms = list(rest)
            for key, members in groups.items():
                bodies = [b for b, _ in members]
                inner = factor_inverses(MatAdd(*bodies), small) if len(bodies) > 1 else bodies[0]
                terms.append(MatMul(inner, key) if side == -1 else MatMul(key, inner))
            return MatAdd(*terms) if len(terms) > 1 else terms[0]
    return expr


def _contracting_pairs(mats, small):
    """Adjacent factor pairs (A, B) of a product chain, both symbols or transposed symbols, whose
    contracted dimension is large (A B costs a large·small² product, e.g. Gᵀξ_G)."""
    return [mats[i:i + 2] for i in range(len(mats) - 1)
            if all(isinstance(m, (MatrixSymbol, Transpose)) and not isinstance(m, Inverse) for m in mats[i:i + 2])
            and not _is_small([mats[i].shape[1]], small)]


def share_products(outputs, small=(), prefix="t"):
    """Common-subexpression elimination for the expensive two-factor products (those contracting a
    large dimension, e.g. Gᵀξ_G, n h² flops), treating a product and its transpose as the same
    (ξ_GᵀG = (Gᵀξ_G)ᵀ). Such a pair is found anywhere in a chain, e.g. ū_Hᵀξ_H inside
    M⁻¹ ū_Hᵀ ξ_H and as ξ_Hᵀū_H inside ξ_Hᵀ ū_H M⁻¹ (computed once). Returns (assignments
    [(symbol, expr)], rewritten outputs)."""
    counts, exprs = {}, {}

    def key_of(e):
        t = canonicalize(Transpose(e).doit())
        return min((str(e), e, False), (str(t), t, True), key=lambda x: x[0])

    def visit(e):
        if isinstance(e, sp.Trace):  # traces print as Σ(A ⊙ Bᵀ), cheaper than any product
            return
        if isinstance(e, MatMul):
            coeff, mats = e.as_coeff_matrices()
            for pair in _contracting_pairs(mats, small):
                k, canon, _ = key_of(MatMul(*pair))
                counts[k] = counts.get(k, 0) + 1
                exprs[k] = canon
        if isinstance(e, sp.Basic):
            for a in e.args:
                visit(a)

    for o in outputs:
        visit(o)
    shared = [k for k, c in counts.items() if c > 1]
    if not shared:
        return [], list(outputs)
    assigns, subs = [], {}
    for i, k in enumerate(sorted(shared)):
        canon = exprs[k]
        t = MatrixSymbol(f"{prefix}{i}", *canon.shape)
        assigns.append((t, canon))
        subs[canon] = t
        subs[canonicalize(Transpose(canon).doit())] = Transpose(t)

    def rewrite(e):
        if isinstance(e, sp.Trace):
            return e
        if isinstance(e, MatMul):
            coeff, mats = e.as_coeff_matrices()
            out, i, hit = [], 0, False
            while i < len(mats):
                if i + 1 < len(mats) and MatMul(*mats[i:i + 2]) in subs:
                    out.append(subs[MatMul(*mats[i:i + 2])])
                    i, hit = i + 2, True
                else:
                    out.append(mats[i])
                    i += 1
            if hit:
                r = out[0] if len(out) == 1 else MatMul(*out)
                return r if coeff == 1 else MatMul(coeff, r)
        if isinstance(e, sp.Basic) and e.args and isinstance(e, (MatrixExpr, sp.Expr)) \
                and not isinstance(e, MatrixSymbol):
            return e.func(*[rewrite(a) for a in e.args])
        return e

    return assigns, [rewrite(o) for o in outputs]
