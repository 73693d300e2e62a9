"""A batched PyTorch printer for SymPy matrix expressions.

Subclasses SymPy's own :class:`sympy.printing.pytorch.TorchPrinter` and changes what must change for
kernels that broadcast over leading batch dimensions (layers × heads):

* transposes print as ``X.mT`` (last two dims), not ``permute(1, 0)``;
* ``tr(M₁ ⋯ M_k)`` prints as ``((M₁⋯M_{k−1}) * M_kᵀ).sum((-2, -1))`` (no diagonal of a product);
* ``L⁻¹ B`` and ``B L⁻¹`` print as solves: ``torch.cholesky_solve`` with a precomputed Cholesky
  factor for symbols known to be symmetric positive definite (Gram matrices XᵀX), otherwise
  ``torch.linalg.solve(L, B)`` / ``torch.linalg.solve(L, B, left=False)``; never an explicit inverse
  when a product follows or precedes it;
* scalar coefficients that are themselves batched (traces) broadcast with ``[..., None, None]``;
* dimension symbols print as ``X.shape[-2]`` / ``X.shape[-1]`` of a block that carries them.
"""
from __future__ import annotations

import sympy as sp
from sympy import Inverse, MatAdd, MatMul, MatrixSymbol, Transpose
from sympy.printing.pytorch import TorchPrinter

__all__ = ["BatchedTorchPrinter"]


class BatchedTorchPrinter(TorchPrinter):
    """Print matrix expressions as batched torch code.

    Args:
        dims: mapping dimension symbol → code string (e.g. ``{h: "G.shape[-1]"}``).
        spd: mapping symbol name → name of its Cholesky factor variable, for symmetric positive
            definite symbols whose inverses are applied with ``torch.cholesky_solve``.
        ref: name of a tensor giving dtype/device for constants (identity, ones).
    """

    printmethod = "_geosharp_torchcode"

    def __init__(self, dims=None, spd=None, ref="G", settings=None):
        super().__init__(settings or {})
        self.dims = dict(dims or {})
        self.spd = dict(spd or {})
        self.ref = ref

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
        return s if isinstance(expr, (MatrixSymbol, sp.Symbol)) or s.startswith("torch.") and s.endswith(")") and s.count("(") == 1 else f"({s})"

    # -- inverses -------------------------------------------------------------------------------
    def _print_Inverse(self, expr):
        if isinstance(expr.arg, MatrixSymbol) and expr.arg.name in self.spd:
            return f"torch.cholesky_inverse({self.spd[expr.arg.name]})"
        return f"torch.linalg.inv({self._print(expr.arg)})"

    def _solve_left(self, M, B: str) -> str:
        """M⁻¹ B."""
        if isinstance(M, MatrixSymbol) and M.name in self.spd:
            return f"torch.cholesky_solve({B}, {self.spd[M.name]})"
        return f"torch.linalg.solve({self._print(M)}, {B})"

    def _solve_right(self, M, B: str) -> str:
        """B M⁻¹."""
        if isinstance(M, MatrixSymbol) and M.name in self.spd:
            Bt = f"{B}.mT" if B.isidentifier() else f"({B}).mT"
            return f"torch.cholesky_solve({Bt}, {self.spd[M.name]}).mT"
        return f"torch.linalg.solve({self._print(M)}, {B}, left=False)"

    def _chain(self, mats) -> str:
        if len(mats) == 1:
            return self._print(mats[0])
        if isinstance(mats[0], Inverse):
            return self._solve_left(mats[0].arg, self._chain(mats[1:]))
        if isinstance(mats[-1], Inverse):
            return self._solve_right(mats[-1].arg, self._chain(mats[:-1]))
        head = self._wrap(mats[0])
        rest = self._chain(mats[1:])
        rest = rest if len(mats) == 2 and not isinstance(mats[1], (MatAdd,)) else f"({rest})" if not rest.startswith("torch.") else rest
        return f"{head} @ {rest}"

    def _scalar_factor(self, coeff) -> str | None:
        if coeff == 1:
            return None
        if coeff.is_Number:
            return self._print(coeff)
        return f"({self._print(coeff)})[..., None, None]"

    def _print_MatMul(self, expr):
        coeff, mats = expr.as_coeff_matrices()
        body = self._chain(list(mats)) if mats else "1"
        c = self._scalar_factor(coeff)
        if c is None:
            return body
        if c == "-1":
            return f"-({body})"
        return f"{c} * ({body})" if " " in body else f"{c} * {body}"

    def _print_MatAdd(self, expr):
        parts = [self._print(a) for a in expr.args]
        out = parts[0]
        for p in parts[1:]:
            out += f" - {p[1:]}" if p.startswith("-") else f" + {p}"
        return out

    # -- traces ----------------------------------------------------------------------------------
    def _print_Trace(self, expr):
        arg = expr.arg
        if isinstance(arg, MatMul):
            coeff, mats = arg.as_coeff_matrices()
            if len(mats) >= 2:
                left = self._chain(list(mats[:-1]))
                last = mats[-1]
                right = self._print(last.arg) if isinstance(last, Transpose) else f"{self._wrap(last)}.mT"
                body = f"(({left}) * {right}).sum((-2, -1))"
                c = coeff if coeff == 1 else coeff
                return body if c == 1 else f"{self._print(c)} * {body}"
        return f"torch.diagonal({self._print(arg)}, dim1=-2, dim2=-1).sum(-1)"
