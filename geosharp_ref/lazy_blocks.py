"""Block matrices kept as combinations Σᵢ Bᵢ Cᵢ of a few n×h blocks (lazy evaluation of the kernels).

A GL(h) pair kernel maps n×h blocks (G, ξ_G, a cotangent ū_G, …) to n×h blocks, and every n×h result
it builds has the form

    X = Σᵢ Bᵢ Cᵢ        Bᵢ (…, n, h) one of the named input blocks,  Cᵢ (…, h, h),

while every h×h quantity it needs is a combination of the Gram products BᵢᵀBⱼ. A :class:`Span` holds
X as its coefficients {name of Bᵢ: Cᵢ}; running a *generated* kernel on Spans instead of tensors
(the kernels use only ``@``, ``.mT``, ``+``, ``-`` and scalar multiples on their n×h arguments)
therefore evaluates it with h×h work only, plus one n·h² product per Gram product BᵢᵀBⱼ it needs,
computed once by the shared :class:`GramTable` and reused by every later kernel. The result becomes
a tensor only when asked (:meth:`Span.materialize`: one accumulated product per term).

This is how Auto-PGD turns the cotangent ū at the perturbed weights E(ξ) into the ascent direction
P 𝔾⁻¹ (∂E/∂ξ)ᵀ ū: chaining the generated VJP, Riemannian gradient and horizontal projection on
Spans costs the VJP's four Gram products (Gᵀū_G, ū_Gᵀξ_G, and the H side) and six products for the
result, against ten (VJP) + two (𝔾⁻¹) + four (projection) when every intermediate is a tensor;
Gᵀξ_G and ξ_Gᵀξ_G come from the forward pass's table. The generated metric ``inner`` runs on Spans
too: its pattern ((M Xᵀ) ⊙ Yᵀ) summed equals ⟨M, YᵀX⟩_F, so g(ξ, ξ) of a block costs the Gram ξᵀξ.

Shapes: all blocks of one table share the leading (batch) dimensions and h; a coefficient None
stands for the identity (no product).
"""
from __future__ import annotations

import torch

__all__ = ["GramTable", "Span", "SpanT"]


class GramTable:
    """Named n×h blocks and their memoised Gram products BᵢᵀBⱼ (one n·h² product each, BⱼᵀBᵢ free).

    ``products`` counts the n·h² products computed so far (tests and benchmarks read it)."""

    def __init__(self):
        self.blocks: dict[str, torch.Tensor] = {}
        self._grams: dict[tuple[str, str], torch.Tensor] = {}
        self.products = 0

    def block(self, name: str, X: torch.Tensor) -> "Span":
        """Register X (…, n, h) under ``name`` and return it as the Span X·I."""
        if name in self.blocks and self.blocks[name] is not X:
            raise ValueError(f"block {name!r} is already registered with a different tensor")
        self.blocks[name] = X
        return self.span(name)

    def span(self, name: str) -> "Span":
        """The registered block ``name`` as the Span X·I."""
        X = self.blocks[name]
        return Span(self, {name: None}, X.shape, X.dtype, X.device)

    def copy(self) -> "GramTable":
        """A new table with the same blocks and known Gram products (``products`` restarts at 0); what
        is computed in the copy does not reach this table."""
        t = GramTable()
        t.blocks, t._grams = dict(self.blocks), dict(self._grams)
        return t

    def seed(self, a: str, b: str, value: torch.Tensor) -> None:
        """Record BₐᵀB_b = ``value`` (computed elsewhere, e.g. by the forward pass)."""
        self._grams[(a, b)] = value

    def has_gram(self, a: str, b: str) -> bool:
        return (a, b) in self._grams or (b, a) in self._grams

    def gram(self, a: str, b: str) -> torch.Tensor:
        if (a, b) in self._grams:
            return self._grams[(a, b)]
        if (b, a) in self._grams:
            return self._grams[(b, a)].mT
        value = self.blocks[a].mT @ self.blocks[b]
        self.products += 1
        self._grams[(a, b)] = value
        return value


def _mul(c, M):
    return M if c is None else c @ M


def _eye_like(span):
    return torch.eye(span.shape[-1], dtype=span.dtype, device=span.device)


class Span:
    """X = Σᵢ Bᵢ Cᵢ over the blocks of one :class:`GramTable` (see the module doc)."""

    def __init__(self, table: GramTable, terms: dict, shape, dtype, device):
        self.table, self.terms = table, terms
        self.shape, self.dtype, self.device = torch.Size(shape), dtype, device

    def _new(self, terms):
        return Span(self.table, terms, self.shape, self.dtype, self.device)

    # -- linear algebra on the coefficients ------------------------------------------------------
    def __matmul__(self, M):
        if isinstance(M, (Span, SpanT)) or not torch.is_tensor(M):
            raise TypeError("a Span multiplies h×h tensors on the right only")
        return self._new({k: _mul(c, M) for k, c in self.terms.items()})

    def _coef(self, c):
        return _eye_like(self) if c is None else c

    def __add__(self, other):
        if not isinstance(other, Span):
            return NotImplemented
        if other.table is not self.table:
            raise ValueError("Spans of different Gram tables cannot be combined")
        terms = dict(self.terms)
        for k, c in other.terms.items():
            terms[k] = c if k not in terms else self._coef(terms[k]) + self._coef(c)
        return self._new(terms)

    def __neg__(self):
        return self._new({k: -self._coef(c) for k, c in self.terms.items()})

    def __sub__(self, other):
        if not isinstance(other, Span):
            return NotImplemented
        return self + (-other)

    def __mul__(self, s):
        if torch.is_tensor(s) or not isinstance(s, (int, float)):
            return NotImplemented
        return self._new({k: s * self._coef(c) for k, c in self.terms.items()})

    __rmul__ = __mul__

    @property
    def mT(self) -> "SpanT":
        return SpanT(self)

    # -- reductions that need no n×h work ---------------------------------------------------------
    def frobenius_with_block(self, name: str) -> torch.Tensor:
        """⟨B_name, X⟩_F = Σᵢ tr(B_nameᵀBᵢ Cᵢ) = Σᵢ ⟨BᵢᵀB_name, Cᵢ⟩_F, shape (…): h×h work on the
        table's Grams (a plain block whose Gram is not in the table: one element-wise pass instead)."""
        total = 0
        for k, c in self.terms.items():
            if c is None and not self.table.has_gram(k, name):
                total = total + (self.table.blocks[k] * self.table.blocks[name]).sum((-2, -1))
                continue
            Gr = self.table.gram(k, name)
            total = total + (Gr.diagonal(dim1=-2, dim2=-1).sum(-1) if c is None else (Gr * c).sum((-2, -1)))
        return total

    # -- the tensor -------------------------------------------------------------------------------
    def materialize(self) -> torch.Tensor:
        """Σᵢ Bᵢ Cᵢ as a tensor (…, n, h): products accumulated in place (``baddbmm``), no
        temporaries per term."""
        items = list(self.terms.items())
        items.sort(key=lambda kc: kc[1] is None)  # a plain block is added last
        blocks = self.table.blocks
        lead = self.shape[:-2]
        n, h = self.shape[-2], self.shape[-1]
        out = None
        for k, c in items:
            B = blocks[k].reshape(-1, n, h)
            if c is None:
                out = B.clone() if out is None else out.add_(B)
                continue
            C = c.expand(lead + c.shape[-2:]).reshape(-1, h, h)
            out = torch.bmm(B, C) if out is None else out.baddbmm_(B, C)
        return out.reshape(self.shape)


class SpanT:
    """The transpose Xᵀ = Σᵢ Cᵢᵀ Bᵢᵀ of a :class:`Span`; only ``Xᵀ @ Y`` (an h×h tensor) and the
    metric pattern ``((M @ Xᵀ) * Yᵀ).sum((-2, -1))`` are needed."""

    def __init__(self, span: Span):
        self.span = span

    @property
    def mT(self) -> Span:
        return self.span

    def __matmul__(self, other):
        if not isinstance(other, Span):
            raise TypeError("a transposed Span multiplies a Span (XᵀY, an h×h tensor) only")
        table = self.span.table
        if other.table is not table:
            raise ValueError("Spans of different Gram tables cannot be multiplied")
        total = 0
        for a, ca in self.span.terms.items():
            inner = 0
            for b, cb in other.terms.items():
                Gr = table.gram(a, b)
                inner = inner + (Gr if cb is None else Gr @ cb)
            total = total + (inner if ca is None else ca.mT @ inner)
        return total

    def __rmatmul__(self, M):
        if not torch.is_tensor(M):
            return NotImplemented
        return _LeftProductT(M, self.span)


class _LeftProductT:
    """M Xᵀ (…, h, n) for an h×h tensor M and a :class:`Span` X, kept unevaluated: the generated
    metrics use it only as ``((M @ Xᵀ) * Yᵀ).sum((-2, -1))`` = Σ (M Xᵀ) ⊙ Yᵀ = tr(X Mᵀ Yᵀ)
    = ⟨M, YᵀX⟩_F, which needs the h×h matrix YᵀX (Gram products) and no n×h work."""

    def __init__(self, M, span: Span):
        self.M, self.span = M, span

    def __mul__(self, other):
        if not isinstance(other, SpanT):
            raise TypeError("(M Xᵀ) of a Span multiplies a transposed Span element-wise only")
        return _FrobeniusPairing(self.M, self.span, other.span)


class _FrobeniusPairing:
    """(M Xᵀ) ⊙ Yᵀ awaiting its sum over the last two axes (see :class:`_LeftProductT`)."""

    def __init__(self, M, X: Span, Y: Span):
        self.M, self.X, self.Y = M, X, Y

    def sum(self, dim):
        if not isinstance(dim, (tuple, list)) or tuple(dim) != (-2, -1):
            raise TypeError("only the sum over both matrix axes, .sum((-2, -1)), is supported")
        return (self.M * (self.Y.mT @ self.X)).sum((-2, -1))
