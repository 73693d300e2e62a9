"""Subgroups of GL(h) given by their Lie algebra: the symmetry of rotary position embeddings (RoPE).

A symmetry may act by a subgroup K ⊂ GL(h) only, given by its Lie algebra 𝔨 ⊂ gl(h) (:class:`Subalgebra`):
either a structured parameterisation (``kind="rope"``: block-diagonal 2×2 rotation-scalings [[a, b], [−b, a]]
on coordinate pairs, ⊕ gl(h − r) on the coordinates a partial rotary embedding leaves free) or an explicit basis
of h×h matrices at one concrete h (``kind="basis"``).

**RoPE.** Scores are q R_{p−p'} kᵀ with q = x G, k = y H and R_s = ⊕_pairs [[cos sθ_j, sin sθ_j], [−sin sθ_j,
cos sθ_j]] (⊕ I on the free coordinates). (G A, H A⁻ᵀ) keeps every score iff A R_s A⁻¹ = R_s for every s, i.e.
A is in the commutant of the rotations. With distinct frequencies θ_j ∉ πℤ the commutant is, exactly:

* on each pair, aI + bJ (J = e_i e_jᵀ − e_j e_iᵀ): a complex scalar a − ib acting on that frequency;
* on the free coordinates, any matrix (R_s = I there): gl(h − r);
* no entries across pairs, nor between rotary and free coordinates: (R_rot − I) A_rf = 0 and A_fr (R_rot − I) = 0
  with R_rot − I invertible for a generic rotation.

So 𝔨 = ⊕_pairs span{I_p, J_p} ⊕ gl(h − r), of dimension r + (h − r)² (h for full rotary). :meth:`Subalgebra.
validate` re-derives this: it solves X R = R X exactly (rationals; rotations with cos, sin from Pythagorean
triples, distinct angles) at small sizes and checks that the declared basis spans exactly that null space.

Which coordinates form a pair is the implementation's: Hugging Face's ``rotate_half`` pairs i with i + r/2
(``pairing="half"``), GPT-J-style ``rotate_every_two`` pairs 2i with 2i + 1 (``pairing="interleaved"``).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .errors import DeclarationError

__all__ = ["Subalgebra", "rope_subalgebra", "rope_pairs", "rope_rotation", "commutant"]

PAIRINGS = ("half", "interleaved")
#: Pythagorean triples: exact rational rotations with distinct angles (none a multiple of π/2)
_TRIPLES = ((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29), (12, 35, 37), (9, 40, 41))


def rope_pairs(h: int, pairing: str, rotary_dim: int | None = None) -> list[tuple[int, int]]:
    """Coordinate pairs rotated together (same convention as ``codegen.runtime.rope_pairs``)."""
    r = h if rotary_dim is None else int(rotary_dim)
    if pairing not in PAIRINGS:
        raise DeclarationError(f"unknown RoPE pairing {pairing!r}; choose one of {PAIRINGS}")
    if r % 2 or not 0 <= r <= h:
        raise DeclarationError(f"rotary_dim must be even and in [0, h={h}], got {rotary_dim}")
    if pairing == "half":
        return [(i, i + r // 2) for i in range(r // 2)]
    return [(2 * i, 2 * i + 1) for i in range(r // 2)]


def rope_rotation(h: int, pairing: str, rotary_dim: int | None = None) -> sp.Matrix:
    """An exact rational RoPE-type rotation: pair k rotated by the angle of triple k (distinct angles), identity on
    the free coordinates."""
    R = sp.eye(h)
    for k, (i, j) in enumerate(rope_pairs(h, pairing, rotary_dim)):
        a, b, c = _TRIPLES[k % len(_TRIPLES)]
        if k >= len(_TRIPLES):  # more pairs than triples: swap legs for a new angle
            a, b = b, a
        cs, sn = sp.Rational(a, c), sp.Rational(b, c)
        R[i, i], R[j, j], R[i, j], R[j, i] = cs, cs, sn, -sn
    return R


def commutant(Rs) -> list[sp.Matrix]:
    """A basis of {X : X R = R X for every R in Rs} (exact null space of Σ (I ⊗ R − Rᵀ ⊗ I))."""
    h = Rs[0].shape[0]
    rows = []
    for R in Rs:
        K = sp.kronecker_product(sp.eye(h), R) - sp.kronecker_product(R.T, sp.eye(h))  # vec(RX − XR), column-major
        rows.append(K)
    null = sp.Matrix.vstack(*rows).nullspace()
    return [sp.Matrix(h, h, lambda i, j: v[j * h + i]) for v in null]


@dataclass(frozen=True)
class Subalgebra:
    """The Lie algebra 𝔨 ⊂ gl(h) of a subgroup K = ⟨exp 𝔨⟩ ⊂ GL(h).

    kind ``"rope"``: rotation-scalings on the pairs of ``pairing`` over the first ``rotary_dim`` coordinates (None:
    all h, known at run time) ⊕ gl(h − r) on the rest; kind ``"basis"``: ``matrices`` (h×h SymPy matrices at one
    concrete h, a Lie subalgebra: closed under commutators)."""

    kind: str
    pairing: str | None = None
    rotary_dim: int | None = None
    matrices: tuple = ()

    def __post_init__(self):  # immutable matrices keep the (frozen) declaration hashable
        object.__setattr__(self, "matrices", tuple(sp.ImmutableMatrix(M) for M in self.matrices))

    @property
    def description(self) -> str:
        if self.kind == "rope":
            r = "h" if self.rotary_dim is None else str(self.rotary_dim)
            pair = "i with i + r/2" if self.pairing == "half" else "2i with 2i + 1"
            return (f"the RoPE commutant: rotation-scalings [[a, b], [-b, a]] on the pairs ({pair}) of the first "
                    f"r = {r} coordinates, (+) gl(h - r) on the rest; dimension r + (h - r)^2")
        return f"the span of {len(self.matrices)} declared {self.fixed_h}x{self.fixed_h} matrices"

    @property
    def fixed_h(self) -> int | None:
        return self.matrices[0].shape[0] if self.kind == "basis" else None

    def entries(self, h: int) -> list[list[tuple[int, int, sp.Rational]]]:
        """The basis as sparse entries [(row, col, value)] per element (Frobenius-orthogonal)."""
        if self.kind == "rope":
            pairs = rope_pairs(h, self.pairing, self.rotary_dim)
            r = 2 * len(pairs)
            out = []
            for i, j in pairs:
                out += [[(i, i, 1), (j, j, 1)], [(i, j, 1), (j, i, -1)]]
            return out + [[(a, b, 1)] for a in range(r, h) for b in range(r, h)]
        if h != self.fixed_h:
            raise DeclarationError(f"the declared subalgebra basis is {self.fixed_h}x{self.fixed_h}, not {h}x{h}")
        return [[(i, j, M[i, j]) for i in range(h) for j in range(h) if M[i, j] != 0] for M in self.matrices]

    def basis(self, h: int) -> list[sp.Matrix]:
        out = []
        for e in self.entries(h):
            M = sp.zeros(h, h)
            for i, j, v in e:
                M[i, j] += v
            out.append(M)
        return out

    def dimension(self, h: int) -> int:
        return len(self.entries(h))

    # ---------------------------------------------------------------------------------------------
    def validate(self, name: str = "") -> str:
        """Exact checks; returns a one-paragraph record of what was proved (DeclarationError otherwise)."""
        if self.kind == "basis":
            return self._validate_basis(name)
        if self.kind != "rope":
            raise DeclarationError(f"symmetry {name!r}: unknown subalgebra kind {self.kind!r} ('rope' or 'basis')")
        if self.pairing not in PAIRINGS:
            raise DeclarationError(f"symmetry {name!r}: unknown RoPE pairing {self.pairing!r}; choose one of {PAIRINGS}")
        sizes = ([(4, None), (6, None), (6, 4), (5, 2)] if self.rotary_dim is None
                 else [(self.rotary_dim, None), (self.rotary_dim + 2, self.rotary_dim)])
        for h, r in sizes:
            R = rope_rotation(h, self.pairing, r)
            null = commutant([R])
            sub = Subalgebra("rope", self.pairing, r)
            mine = sub.basis(h)
            span = sp.Matrix.hstack(*[M.reshape(h * h, 1) for M in mine + null])
            if not (len(null) == len(mine) == span.rank()):
                raise DeclarationError(
                    f"symmetry {name!r}: at h = {h}, rotary_dim = {r} the commutant of the rotations has dimension "
                    f"{len(null)} but the declared subalgebra has {len(mine)} elements spanning "
                    f"{span.rank() - len(null) + len(mine)}; the pairing does not match the rotation")
        return ("K = {A in GL(h) : A R = R A for every RoPE rotation R} is a subgroup of GL(h); its Lie algebra, "
                f"{self.description}, equals the exact null space of X -> XR - RX for a rotation with distinct "
                f"rational angles at (h, r) = {sizes} (r = None: r = h). A commutant is an associative algebra, "
                "hence closed under commutators.")

    def _validate_basis(self, name):
        h = self.fixed_h
        mats = [sp.Matrix(M) for M in self.matrices]
        if any(M.shape != (h, h) for M in mats):
            raise DeclarationError(f"symmetry {name!r}: subalgebra basis matrices must all be {h}x{h}")
        stack = sp.Matrix.hstack(*[M.reshape(h * h, 1) for M in mats])
        if stack.rank() != len(mats):
            raise DeclarationError(f"symmetry {name!r}: the subalgebra basis matrices are linearly dependent")
        for a in mats:
            for b in mats:
                if (a.T * b).trace() != 0 and a is not b:
                    raise DeclarationError(f"symmetry {name!r}: give a Frobenius-orthogonal basis (tr(E_kᵀ E_l) = 0 for "
                                           "k != l), e.g. by Gram-Schmidt")
                br = (a * b - b * a).reshape(h * h, 1)
                if sp.Matrix.hstack(stack, br).rank() != len(mats):
                    raise DeclarationError(f"symmetry {name!r}: the declared matrices are not closed under the "
                                           f"commutator [X, Y] = XY - YX; they span no Lie subalgebra")
        return (f"K = the connected subgroup of GL({h}) with Lie algebra {self.description}; closure under commutators "
                "checked exactly.")


def rope_subalgebra(pairing: str = "half", rotary_dim: int | None = None) -> Subalgebra:
    return Subalgebra("rope", pairing, rotary_dim)
