"""A batched PyTorch printer for SymPy matrix expressions.

Subclasses SymPy's own :class:`sympy.printing.pytorch.TorchPrinter` and changes what must change for
kernels that broadcast over leading batch dimensions (layers × heads):

* transposes print as ``X.mT`` (last two dims), not ``permute(1, 0)``;
* ``tr(M₁ ⋯ M_k)`` prints as ``((M₁⋯M_{k−1}) * M_kᵀ).sum((-2, -1))`` (no diagonal of a product);
* inverses of symbols known to be symmetric positive definite (Gram matrices XᵀX) print as a
  precomputed inverse variable (``GtG_inv``, from ``_rt.spd_inverse`` or a base-point cache) used
  in matmuls: for an h×h Gram matrix applied to an n×h block this is one GEMM, much faster than
  ``torch.cholesky_solve`` (a LAPACK solve per batch item); other inverses ``L⁻¹ B`` / ``B L⁻¹``
  print as ``torch.linalg.solve(L, B)`` / ``torch.linalg.solve(L, B, left=False)``;
* products of three or more factors are parenthesised by the matrix-chain rule with
  ``small_dims`` (the group dimension h) counted as small and every other dimension as large, so
  n×h·h×h·h×n-type chains never build an n×n intermediate;
* scalar coefficients that are themselves batched (traces) broadcast with ``[..., None, None]``;
* dimension symbols print as ``X.shape[-2]`` / ``X.shape[-1]`` of a block that carries them.
"""
from __future__ import annotations

import re

import sympy as sp
from sympy import Inverse, MatAdd, MatMul, MatrixSymbol, Transpose
from sympy.printing.pytorch import TorchPrinter

__all__ = ["BatchedTorchPrinter"]

_ATOM = re.compile(r"^[A-Za-z_]\w*(\.mT)?$")


class BatchedTorchPrinter(TorchPrinter):
    """Print matrix expressions as batched torch code.

    Args:
        dims: mapping dimension symbol → code string (e.g. ``{h: "G.shape[-1]"}``).
        spd: mapping symbol name → name of the variable holding its inverse, for symmetric positive
            definite symbols (Gram matrices).
        ref: name of a tensor giving dtype/device for constants (identity, ones).
        small_dims: dimension symbols that are small (cost model of the matrix-chain order).
    """

    printmethod = "_geosharp_torchcode"

    #: dimension sizes assumed by the matrix-chain cost model
    SMALL, LARGE = 64, 1024

    def __init__(self, dims=None, spd=None, ref="G", settings=None, small_dims=()):
        super().__init__(settings or {})
        self.dims = dict(dims or {})
        self.spd = dict(spd or {})
        self.ref = ref
        self.small_dims = set(small_dims)

    # -- atoms ----------------------------------------------------------------------------------
    def _print_Symbol(self, expr):
        if expr in self.dims:
            return self.dims[expr]
        return super()._print_Symbol(expr)

    def _print_MatrixSymbol(self, expr):
        return expr.name

    def _print_Identity(self, expr):
        return f"torch.eye({self._print(expr.shape[0])}, dtype={self.ref}.dtype, device={self.ref}.device)"

    def _print_OneMatrix(self, expr):
        r, c = (self._print(d) for d in expr.shape)
        return f"{self.ref}.new_ones(({r}, {c}))"

    def _print_ZeroMatrix(self, expr):
        r, c = (self._print(d) for d in expr.shape)
        return f"{self.ref}.new_zeros({self.ref}.shape[:-2] + ({r}, {c}))"

    def _print_Transpose(self, expr):
        return f"{self._wrap(expr.arg)}.mT"

    def _wrap(self, expr):
        s = self._print(expr)
        if isinstance(expr, (MatrixSymbol, sp.Symbol)) or _ATOM.match(s):
            return s
        return s if s.startswith("torch.") and s.endswith(")") and s.count("(") == 1 else f"({s})"

    @staticmethod
    def _flat(expr):
        """(coefficient, factors) of a product, nested products flattened (so the chain order and the
        parenthesisation are decided here, never by Python's left-associative ``@``)."""
        coeff, mats = expr.as_coeff_matrices()
        out = []
        for m in mats:
            if isinstance(m, MatMul):
                c, sub = BatchedTorchPrinter._flat(m)
                coeff *= c
                out += sub
            else:
                out.append(m)
        return coeff, out

    # -- inverses -------------------------------------------------------------------------------
    def _is_spd_inverse(self, M) -> bool:
        return isinstance(M, Inverse) and isinstance(M.arg, MatrixSymbol) and M.arg.name in self.spd

    def _print_Inverse(self, expr):
        if self._is_spd_inverse(expr):
            return self.spd[expr.arg.name]
        return f"torch.linalg.inv({self._print(expr.arg)})"

    def _solve_left(self, M, B: str) -> str:
        """M⁻¹ B (M not a known SPD symbol)."""
        return f"torch.linalg.solve({self._print(M)}, {B})"

    def _solve_right(self, M, B: str) -> str:
        """B M⁻¹ (M not a known SPD symbol)."""
        return f"torch.linalg.solve({self._print(M)}, {B}, left=False)"

    def _size(self, d) -> int:
        d = sp.sympify(d)
        if d.is_Integer:
            return int(d)
        return self.SMALL if d in self.small_dims else self.LARGE

    def _chain(self, mats) -> str:
        if len(mats) == 1:
            return self._print(mats[0])
        if isinstance(mats[0], Inverse) and not self._is_spd_inverse(mats[0]):
            return self._solve_left(mats[0].arg, self._chain(mats[1:]))
        if isinstance(mats[-1], Inverse) and not self._is_spd_inverse(mats[-1]):
            return self._solve_right(mats[-1].arg, self._chain(mats[:-1]))
        if len(mats) == 2:
            return f"{self._wrap(mats[0])} @ {self._wrap(mats[1])}"
        k = self._split_point(mats)
        left = self._wrap(mats[0]) if k == 1 else f"({self._chain(mats[:k])})"
        right = self._wrap(mats[k]) if len(mats) - k == 1 else f"({self._chain(mats[k:])})"
        return f"{left} @ {right}"

    def _split_point(self, mats) -> int:
        """Top-level split of the cheapest parenthesisation (matrix-chain DP; ties → rightmost
        association, i.e. the split nearest the front)."""
        try:
            dims = [self._size(mats[0].shape[0])] + [self._size(m.shape[1]) for m in mats]
        except (AttributeError, TypeError):
            return 1
        n = len(mats)
        cost = [[0] * n for _ in range(n)]
        split = [[0] * n for _ in range(n)]
        for length in range(2, n + 1):
            for i in range(n - length + 1):
                j = i + length - 1
                best = None
                for k in range(i, j):
                    c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                    if best is None or c < best:
                        best, split[i][j] = c, k
                cost[i][j] = best
        return split[0][n - 1] + 1

    def _scalar_factor(self, coeff) -> str | None:
        if coeff == 1:
            return None
        if coeff.is_Number:
            return self._print(coeff)
        return f"({self._print(coeff)})[..., None, None]"

    def _is_large(self, expr) -> bool:
        """Some dimension of ``expr`` is neither an integer nor a small (group) dimension."""
        return any(not (sp.sympify(d).is_Integer or sp.sympify(d) in self.small_dims)
                   for d in getattr(expr, "shape", ()))

    def _print_MatMul(self, expr):
        coeff, mats = self._flat(expr)
        mats = list(mats)
        if coeff != 1 and coeff.is_Number and len(mats) > 1 and self._is_large(expr):
            # c·(G X) costs a pass over the large result; G (c X) one over the small factor X
            small = [i for i, m in enumerate(mats)
                     if not self._is_large(m) and not (isinstance(m, Inverse) and not self._is_spd_inverse(m))]
            if small:
                mats[small[-1]] = MatMul(coeff, mats[small[-1]])
                coeff = sp.S.One
        body = self._chain(mats) if mats else "1"
        c = self._scalar_factor(coeff)
        if c is None:
            return body
        if c == "-1":
            return f"-{body}" if _ATOM.match(body) else f"-({body})"
        return f"{c} * ({body})" if " " in body else f"{c} * {body}"

    def _print_MatAdd(self, expr):
        """Σ ± terms with a positive term first and negative ones printed as subtractions, so no
        term is negated on its own (for large terms that would be an extra pass over the result)."""
        signed = []
        for a in expr.args:
            coeff = a.as_coeff_matrices()[0] if isinstance(a, MatMul) else sp.S.One
            neg = bool(coeff.is_Number and coeff < 0)
            signed.append((neg, self._print(-a if neg else a), a))
        signed.sort(key=lambda t: t[0])  # stable: positive terms first, then the negative ones
        neg, first, a = signed[0]
        out = self._print(a) if neg else first
        for neg, p, _ in signed[1:]:
            out += f" - {p}" if neg else f" + {p}"
        return out

    # -- traces ----------------------------------------------------------------------------------
    def _print_Trace(self, expr):
        arg = expr.arg
        if isinstance(arg, MatMul):
            coeff, mats = self._flat(arg)
            if len(mats) >= 2:
                left = self._chain(list(mats[:-1]))
                last = mats[-1]
                right = self._print(last.arg) if isinstance(last, Transpose) else f"{self._wrap(last)}.mT"
                body = f"(({left}) * {right}).sum((-2, -1))"
                c = coeff if coeff == 1 else coeff
                return body if c == 1 else f"{self._print(c)} * {body}"
        return f"torch.diagonal({self._print(arg)}, dim1=-2, dim2=-1).sum(-1)"
