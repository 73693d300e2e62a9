"""Declaring a parameter symmetry: a group acting on blocks of parameters.

A :class:`Symmetry` is a Lie group action ψ(A, θ) on parameter blocks θ = (θ_1, …, θ_k) that leaves
a declared function f(θ) unchanged, f(ψ(A, θ)) = f(θ). The engine derives everything else from it:
the pushforward of tangent vectors dψ_A(ξ) (derivative of the action in θ), the vertical space
{d/dt ψ(exp tX, θ)|_{t=0}} (derivative of the action at the identity), and, with a metric, the
quotient geometry (see :mod:`derivations.quotient`).

Blocks are SymPy ``MatrixSymbol`` objects with symbolic shapes (``n × h``) for matrix symmetries,
so every derived formula holds for all sizes, or scalar ``Symbol`` objects for *element-wise*
symmetries (the same scalar action on every coordinate independently, e.g. diagonal networks).

Built-in declarations (paper Section 3.1):

=====================  ==================================  =================================
name                   action ψ(A, θ)                      preserved function f(θ)
=====================  ==================================  =================================
``gl_pair``            (G A, H A⁻ᵀ), A ∈ GL(h)             G Hᵀ (attention, LoRA, W₂W₁)
``rope_pair``          (G A, H A⁻ᵀ), A in the RoPE         G R Hᵀ for every rotation R
                       commutant ⊂ GL(h) (a subalgebra)    (Q/K under rotary embeddings)
``elementwise_rescaling`` (a u, v / a), a > 0 per coordinate  u v (diagonal linear networks)
``positive_scaling``   a W, a > 0                          W / ‖W‖ (weights before a norm)
``translation``        w + a 𝟙, a ∈ R                      w − mean(w) (softmax logits)
=====================  ==================================  =================================
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import sympy as sp
from sympy import Identity, Inverse, MatrixExpr, MatrixSymbol, OneMatrix

from .errors import DeclarationError
from .matrix_calculus import canonicalize, directional_derivative, is_zero

__all__ = [
    "Symmetry",
    "gl_pair",
    "rope_pair",
    "subgroup_pair",
    "elementwise_rescaling",
    "positive_scaling",
    "translation",
    "BUILTIN_SYMMETRIES",
    "get_symmetry",
]


@dataclass(frozen=True)
class Symmetry:
    """A declared parameter symmetry.

    Attributes:
        name: identifier (used for generated module names).
        blocks: the parameter blocks θ the group acts on (``MatrixSymbol`` or scalar ``Symbol``).
        group_element: the symbol of a group element A (``MatrixSymbol`` h×h or scalar ``Symbol``).
        identity: the identity element (``Identity(h)``, ``1`` or ``0``).
        action: ψ(A, θ) as a tuple of expressions, one per block, in ``blocks`` and ``group_element``.
        invariant: the function f(θ) the action must preserve (an expression or tuple of them).
        elementwise: True when blocks are scalars standing for every coordinate independently.
        sample_group_element: callable ``(sizes, rng) -> value`` drawing a concrete group element
            (exact rationals) for numerical checks; defaults to a random well-conditioned one.
        description: one line for tables and generated headers.
    """

    name: str
    blocks: tuple
    group_element: sp.Basic
    identity: sp.Basic
    action: tuple
    invariant: tuple
    elementwise: bool = False
    description: str = ""
    positive_blocks: bool = False
    positive_group: bool = False
    dims: tuple = field(default=())
    #: for a symmetry acting by a subgroup K ⊂ GL(h) only: its Lie algebra (:class:`derivations.subgroup.Subalgebra`);
    #: None for the whole group. The action, vertical map and metric are those of the whole group, restricted.
    subalgebra: object = None

    def __post_init__(self):
        self.validate()

    # ---------------------------------------------------------------------------------------------
    @property
    def is_matrix(self) -> bool:
        return isinstance(self.blocks[0], MatrixExpr)

    def tangent(self, prefix: str) -> tuple:
        """Symbols for a tangent vector (one per block), named ``{prefix}_{block}``."""
        out = []
        for b in self.blocks:
            if isinstance(b, MatrixSymbol):
                out.append(MatrixSymbol(f"{prefix}_{b.name}", *b.shape))
            else:
                out.append(sp.Symbol(f"{prefix}_{b.name}", real=True))
        return tuple(out)

    @property
    def lie_algebra(self):
        """Symbol for an element X of the Lie algebra (tangent space at the identity)."""
        A = self.group_element
        if isinstance(A, MatrixSymbol):
            return MatrixSymbol("X", *A.shape)
        return sp.Symbol("x", real=True)

    def act(self, A=None):
        """The action ψ(A, θ) as a dict block → expression (A defaults to the group symbol)."""
        sub = {} if A is None else {self.group_element: A}
        return {b: (e.subs(sub) if sub else e) for b, e in zip(self.blocks, self.action)}

    def pushforward(self, tangent: tuple) -> tuple:
        """dψ_A(ξ): the derivative of the action in θ along ξ (how tangent vectors transform)."""
        dirs = dict(zip(self.blocks, tangent))
        return tuple(directional_derivative(e, dirs) for e in self.action)

    def vertical(self, X=None) -> tuple:
        """Vertical vector v(X) = d/dt ψ(γ(t), θ)|_{t=0} for a curve γ through the identity with
        velocity X: the derivative of the action in A at the identity."""
        X = self.lie_algebra if X is None else X
        A = self.group_element
        out = []
        for e in self.action:
            d = directional_derivative(e, {A: X})
            out.append(canonicalize(_substitute_identity(d, A, self.identity)))
        return tuple(out)

    # ---------------------------------------------------------------------------------------------
    def validate(self):
        """Check shapes, identity and that the action preserves the declared function.

        Raises :class:`DeclarationError` with a message naming the offending block."""
        if not self.blocks:
            raise DeclarationError(f"symmetry {self.name!r} declares no parameter blocks")
        if len(self.action) != len(self.blocks):
            raise DeclarationError(
                f"symmetry {self.name!r}: {len(self.blocks)} blocks but {len(self.action)} action "
                "expressions; give one expression ψ_B(A, θ) per block"
            )
        for b, e in zip(self.blocks, self.action):
            bshape = getattr(b, "shape", ())
            eshape = getattr(e, "shape", ())
            if tuple(bshape) != tuple(eshape):
                raise DeclarationError(
                    f"symmetry {self.name!r}: action on block {b} has shape {eshape}, the block has "
                    f"shape {bshape}; the action must map each block to a block of the same shape"
                )
        for b, e in zip(self.blocks, self.action):
            at_id = canonicalize(_substitute_identity(e, self.group_element, self.identity))
            if not _equal(at_id, b, self):
                raise DeclarationError(
                    f"symmetry {self.name!r}: the action at the identity {self.identity} sends {b} to "
                    f"{at_id}, not to itself; check the action or the identity element"
                )
        if self.subalgebra is not None:
            if not isinstance(self.group_element, MatrixSymbol):
                raise DeclarationError(f"symmetry {self.name!r}: a subalgebra needs a matrix group element A ∈ GL(h)")
            object.__setattr__(self, "subgroup_proof", self.subalgebra.validate(self.name))
        acted = self.act()
        for f in self.invariant:
            moved = f.xreplace(acted) if isinstance(f, sp.Basic) else f
            diff = canonicalize(moved - f)
            if is_zero(diff):
                continue
            witness = find_nonzero(diff, self)
            if witness is not None:
                raise DeclarationError(
                    f"symmetry {self.name!r}: the action does not preserve the declared function "
                    f"{f}: f(ψ(A, θ)) − f(θ) = {diff}, nonzero at {witness}. A symmetry must leave "
                    "the function unchanged; check the action (e.g. A⁻ᵀ vs A⁻¹)"
                )


# ------------------------------------------------------------------------------------------------
# Helpers: identity substitution, exact numerical evaluation at random points
# ------------------------------------------------------------------------------------------------

def _substitute_identity(expr, A, identity):
    return sp.sympify(expr).xreplace({A: identity}).doit() if isinstance(expr, sp.Basic) else expr


def _equal(a, b, sym) -> bool:
    d = canonicalize(a - b)
    return is_zero(d) or find_nonzero(d, sym) is None


DEFAULT_SIZES = ({"n": 3, "m": 2, "h": 2}, {"n": 2, "m": 3, "h": 1}, {"n": 4, "m": 3, "h": 3})


def concrete_sizes(expr, sizes: dict) -> dict:
    """Map the dimension symbols appearing in ``expr`` to integers by name (default 3)."""
    dims = {s for s in expr.free_symbols if getattr(s, "is_integer", False)}
    for M in expr.atoms(MatrixSymbol):
        for d in M.shape:
            dims |= {s for s in sp.sympify(d).free_symbols}
    return {s: sizes.get(s.name, 3) for s in dims}


def random_rational_matrix(rows, cols, rng, lo=-3, hi=3, denominator=4):
    return sp.Matrix(rows, cols, lambda i, j: sp.Rational(rng.randint(lo * denominator, hi * denominator), denominator))


def random_point(symbols, sizes, rng, positive=()):
    """Exact random rational values for scalar and matrix symbols at concrete sizes.

    Square matrices get a diagonal shift so they are safely invertible; symbols in ``positive`` get
    positive values."""
    values = {}
    for s in symbols:
        if isinstance(s, MatrixSymbol):
            r, c = (int(sp.sympify(d).subs(sizes)) for d in s.shape)
            M = random_rational_matrix(r, c, rng)
            if r == c:
                M = M + 7 * sp.eye(r)
            values[s] = M
        else:
            lo = 1 if s in positive else -3
            v = sp.Rational(rng.randint(lo * 4, 12), 4)
            values[s] = v if v != 0 else sp.Rational(1, 2)
    return values


def evaluate(expr, values: dict, sizes: dict, simplify: bool = True):
    """Evaluate a (matrix) expression exactly at concrete sizes and values."""
    expr = sp.sympify(expr)
    size_sub = {s: v for s, v in sizes.items()}
    concrete = expr.subs(size_sub) if size_sub else expr
    repl = {}
    for s, v in values.items():
        key = s.subs(size_sub) if isinstance(s, MatrixSymbol) else s
        repl[key] = v
    for one in concrete.atoms(OneMatrix):
        repl[one] = sp.ones(*(int(d) for d in one.shape))
    for eye in concrete.atoms(Identity):
        repl[eye] = sp.eye(int(eye.shape[0]))
    out = concrete.xreplace(repl)
    out = out.doit()
    if isinstance(out, MatrixExpr) and not isinstance(out, sp.MatrixBase):
        out = out.as_explicit()
    if not simplify:
        return out
    if isinstance(out, sp.MatrixBase):
        return out.applyfunc(sp.simplify)
    return sp.simplify(out)


def find_nonzero(expr, sym: Symmetry, trials: int = 3, seed: int = 0):
    """Search for a point where ``expr`` is nonzero: returns a readable witness dict or None."""
    rng = random.Random(seed)
    symbols = sorted(
        (s for s in (expr.atoms(MatrixSymbol) | expr.free_symbols) if not getattr(s, "is_integer", False)),
        key=str,
    )
    for k in range(trials):
        dims = DEFAULT_SIZES[k % len(DEFAULT_SIZES)]
        sizes = concrete_sizes(expr, dims)
        positive = set(sym.blocks) if sym.positive_blocks else set()
        if sym.positive_group:
            positive.add(sym.group_element)
        values = random_point(symbols, sizes, rng, positive=positive)
        val = evaluate(expr, values, sizes)
        nonzero = any(x != 0 for x in val) if isinstance(val, sp.MatrixBase) else val != 0
        if nonzero:
            return {"sizes": {str(k_): v for k_, v in sizes.items()},
                    "values": {str(k_): (v.tolist() if isinstance(v, sp.MatrixBase) else v) for k_, v in values.items()},
                    "value": val.tolist() if isinstance(val, sp.MatrixBase) else val}
    return None


# ------------------------------------------------------------------------------------------------
# Built-in declarations
# ------------------------------------------------------------------------------------------------

def _dims(*names):
    return tuple(sp.Symbol(n, integer=True, positive=True) for n in names)


def gl_pair(G: str = "G", H: str = "H", n: str = "n", m: str = "m", h: str = "h") -> Symmetry:
    """GL(h) acting on a pair G ∈ R^{n×h}, H ∈ R^{m×h} by (G A, H A⁻ᵀ); preserves G Hᵀ.

    Attention Q/K and V/O per head, LoRA's B·A (G = B, H = Aᵀ, GL(r)), a shallow linear net W₂W₁."""
    n_, m_, h_ = _dims(n, m, h)
    Gs, Hs = MatrixSymbol(G, n_, h_), MatrixSymbol(H, m_, h_)
    A = MatrixSymbol("A", h_, h_)
    return Symmetry(
        name="gl_pair",
        blocks=(Gs, Hs),
        group_element=A,
        identity=Identity(h_),
        action=(Gs * A, Hs * Inverse(A).T),
        invariant=(Gs * Hs.T,),
        description=f"GL({h}) acting on ({G}, {H}) by ({G}A, {H}A^-T); preserves {G} {H}^T",
        dims=(n_, m_, h_),
    )


def elementwise_rescaling(u: str = "u", v: str = "v") -> Symmetry:
    """Element-wise GL(1): (u, v) ↦ (a u, v / a) per coordinate, a > 0; preserves u v.

    Diagonal linear networks f(x) = ⟨u ⊙ v, x⟩ (β = u ⊙ v); ReLU re-scaling of a hidden unit."""
    us, vs = sp.Symbol(u, positive=True), sp.Symbol(v, positive=True)
    a = sp.Symbol("a", positive=True)
    return Symmetry(
        name="elementwise_rescaling",
        blocks=(us, vs),
        group_element=a,
        identity=sp.S.One,
        action=(a * us, vs / a),
        invariant=(us * vs,),
        elementwise=True,
        description=f"element-wise ({u}, {v}) -> (a {u}, {v}/a); preserves {u} {v}",
        positive_blocks=True,
        positive_group=True,
    )


def positive_scaling(W: str = "W", n: str = "n", k: str = "k") -> Symmetry:
    """Positive scaling W ↦ a W, a > 0 (weights followed by a normalisation); preserves W/‖W‖."""
    n_, k_ = _dims(n, k)
    Ws = MatrixSymbol(W, n_, k_)
    a = sp.Symbol("a", positive=True)
    return Symmetry(
        name="positive_scaling",
        blocks=(Ws,),
        group_element=a,
        identity=sp.S.One,
        action=(a * Ws,),
        invariant=(Ws / sp.sqrt(sp.Trace(Ws.T * Ws)),),
        description=f"{W} -> a {W}, a > 0; preserves {W}/||{W}||",
        positive_group=True,
        dims=(n_, k_),
    )


def translation(w: str = "w", n: str = "n") -> Symmetry:
    """Translation w ↦ w + a 𝟙 of a logit vector w ∈ R^n (softmax is invariant); preserves w − mean."""
    (n_,) = _dims(n)
    ws = MatrixSymbol(w, n_, 1)
    a = sp.Symbol("a", real=True)
    one = OneMatrix(n_, 1)
    centre = ws - one * one.T * ws / n_
    return Symmetry(
        name="translation",
        blocks=(ws,),
        group_element=a,
        identity=sp.S.Zero,
        action=(ws + a * one,),
        invariant=(centre,),
        description=f"{w} -> {w} + a 1; preserves {w} - mean({w})",
        dims=(n_,),
    )


def rope_pair(pairing: str = "half", rotary_dim: int | None = None, G: str = "G", H: str = "H", n: str = "n",
              m: str = "m", h: str = "h") -> Symmetry:
    """The subgroup of GL(h) that commutes with rotary position embeddings, acting on a Q/K pair like ``gl_pair``:
    (G A, H A⁻ᵀ) with A = exp(X), X ∈ 𝔨 = ⊕_pairs span{I₂, J₂} ⊕ gl(h − r) (see :mod:`derivations.subgroup`).

    ``pairing``: ``"half"`` (Hugging Face ``rotate_half``: i with i + r/2) or ``"interleaved"`` (2i with 2i + 1);
    ``rotary_dim`` r: None (the generated kernels take r at run time, default h) or a fixed even integer.
    Preserves G R Hᵀ for every rotation R (in particular G Hᵀ, which is what the symbolic check verifies; the
    commutation with R is checked exactly on the Lie algebra)."""
    from .subgroup import rope_subalgebra  # local: subgroup imports errors only

    suffix = "" if rotary_dim is None else f"_r{int(rotary_dim)}"
    return subgroup_pair(
        rope_subalgebra(pairing, rotary_dim), f"rope_{pairing}{suffix}", G, H, n, m, h,
        description=(f"RoPE subgroup of GL({h}) ({pairing} pairing"
                     + ("" if rotary_dim is None else f", rotary_dim {rotary_dim}")
                     + f") acting on ({G}, {H}) by ({G}A, {H}A^-T); preserves {G} R {H}^T for every rotation R"))


def subgroup_pair(subalgebra, name: str, G: str = "G", H: str = "H", n: str = "n", m: str = "m", h: str = "h",
                  description: str = "") -> Symmetry:
    """A subgroup K ⊂ GL(h), given by its Lie algebra (a :class:`derivations.subgroup.Subalgebra`: ``"rope"`` or an
    explicit Frobenius-orthogonal basis ``Subalgebra("basis", matrices=(E_1, …))`` at one h), acting on a pair like
    :func:`gl_pair`: (G A, H A⁻ᵀ), A ∈ K. Every GL(h)-invariant metric is K-invariant; the vertical space is
    {(G X, −H Xᵀ) : X ∈ 𝔨} and the projection solves a dim 𝔨 system (:func:`derivations.derive_geometry`)."""
    base = gl_pair(G, H, n, m, h)
    return Symmetry(
        name=name,
        blocks=base.blocks,
        group_element=base.group_element,
        identity=base.identity,
        action=base.action,
        invariant=base.invariant,
        description=description or (f"subgroup of GL({h}) with Lie algebra {subalgebra.description}, acting on "
                                    f"({G}, {H}) by ({G}A, {H}A^-T); preserves {G} {H}^T"),
        dims=base.dims,
        subalgebra=subalgebra,
    )


BUILTIN_SYMMETRIES = {
    "gl_pair": gl_pair,
    "rope_half": lambda: rope_pair("half"),
    "rope_interleaved": lambda: rope_pair("interleaved"),
    "elementwise_rescaling": elementwise_rescaling,
    "positive_scaling": positive_scaling,
    "translation": translation,
}


def get_symmetry(name: str) -> Symmetry:
    """A built-in symmetry by name; a clear error lists the known names."""
    try:
        return BUILTIN_SYMMETRIES[name]()
    except KeyError:
        raise DeclarationError(
            f"unknown symmetry {name!r}; built-in symmetries are {sorted(BUILTIN_SYMMETRIES)}, "
            "or declare your own with derivations.Symmetry(...)"
        ) from None
