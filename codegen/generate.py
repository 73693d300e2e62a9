"""Generate PyTorch kernel modules from a derived quotient geometry.

:func:`generate_module` turns a :class:`derivations.quotient.QuotientGeometry` into the source text of
a Python module of batched torch functions:

==========================  =========================================================
function                    computes
==========================  =========================================================
``inner``                   g_θ(ξ, η), shape (...)
``vertical``                v(X) = d/dt ψ(exp tX, θ)|₀
``horizontal_residual``     C(ξ); ξ is horizontal iff C(ξ) = 0
``horizontal_lambda``       Λ with C(ξ − v(Λ)) = 0 (explicit, Sylvester or Kronecker)
``horizontal_projection``   ξ − v(Λ)
``riemannian_gradient``     𝔾⁻¹(∇f), the metric's gradient from the Euclidean one
``geodesic_acceleration``   γ̈(0) = −Γ(ξ, ξ)
``second_order_geodesic``   E(ξ) = θ + ξ + ½ γ̈(0)
``second_order_geodesic_vjp``  (∂E/∂ξ)ᵀ ū, the reverse-mode derivative of E
``act``                     ψ(A, θ)
==========================  =========================================================

Matrix symmetries take ``eps`` (default 0): Gram matrices XᵀX become XᵀX + εI (relaxation for
rank-deficient weights, paper App. H.2). :func:`write_modules` writes several modules atomically:
all sources are generated in memory first, then each file is replaced with ``os.replace``, so a
failing derivation never leaves a half-written module.
"""
from __future__ import annotations

import os
import re
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import sympy as sp
from sympy import Identity, Inverse, MatAdd, MatMul, MatrixExpr, MatrixSymbol, Transpose

from derivations.matrix_calculus import canonicalize
from derivations.quotient import QuotientGeometry

from .printer import BatchedTorchPrinter

__all__ = ["generate_module", "write_modules", "GeneratedModule", "GENERATED_DIR"]

GENERATED_DIR = Path(__file__).resolve().parent / "generated"
HEADER = "# GENERATED FILE - DO NOT EDIT."


@dataclass(frozen=True)
class GeneratedModule:
    name: str
    source: str


# ------------------------------------------------------------------------------------------------
# Gram matrices: XᵀX → symbol, factorised once per function
# ------------------------------------------------------------------------------------------------

def _gram_symbol(B: MatrixSymbol) -> MatrixSymbol:
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
                out.append(_gram_symbol(mats[i + 1]))
                i += 2
            else:
                out.append(mats[i])
                i += 1
        if len(out) == 1 and coeff == 1:
            return out[0]
        return MatMul(coeff, *out) if coeff != 1 else MatMul(*out)
    return expr.func(*args)


_GRAM = re.compile(r"^(\w+)t\1$")  # the names _gram_symbol gives: GtG, HtH, WtW


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


# ------------------------------------------------------------------------------------------------

class _Emitter:
    def __init__(self, geo: QuotientGeometry):
        self.geo = geo
        sym = geo.symmetry
        self.sym = sym
        self.matrix = sym.is_matrix
        self.blocks = list(sym.blocks)
        self.block_names = [self.name(b) for b in self.blocks]
        dims = {}
        for b in self.blocks:
            if isinstance(b, MatrixSymbol):
                for k, d in enumerate(b.shape):
                    d = sp.sympify(d)
                    if d.is_Symbol and d not in dims:
                        dims[d] = f"{b.name}.shape[{k - 2}]"
        self.dims = dims
        self.ref = self.block_names[0]
        A = sym.group_element
        self.small = {sp.sympify(d) for d in getattr(A, "shape", ()) if sp.sympify(d).is_Symbol}
        self.mat_blocks = [b for b in self.blocks if isinstance(b, MatrixSymbol)]
        self.used = set()  # names of the per-base-point factors the kernels use (for ``prepare``)

    @staticmethod
    def name(s):
        return s.name if hasattr(s, "name") else str(s)

    def printer(self, spd=None):
        return BatchedTorchPrinter(dims=self.dims, spd=spd or {}, ref=self.ref, small_dims=self.small)

    def factor_lines(self, outs):
        """Gram matrices / inverses the expressions ``outs`` use: from ``cache`` when given, else
        computed here. Returns (lines, spd map for the printer)."""
        lines, spd = [], {}
        for b in self.mat_blocks:
            gs = _gram_symbol(b)
            if any(o.has(gs) for o in outs):
                self.used.add(gs.name)
                lines.append(f"{gs.name} = _rt.gram({b.name}, eps) if cache is None else cache.{gs.name}")
                if any(o.has(Inverse(gs)) for o in outs):
                    self.used.add(f"{gs.name}_inv")
                    lines.append(f"{gs.name}_inv = _rt.spd_inverse({gs.name}) if cache is None else cache.{gs.name}_inv")
                    spd[gs.name] = f"{gs.name}_inv"
        return lines, spd

    def prepared(self, outs):
        return [factor_inverses(introduce_grams(canonicalize(o), self.blocks), self.small) for o in outs]

    # -- function bodies -------------------------------------------------------------------------
    def body(self, outputs):
        """Lines computing ``outputs`` (list of expressions) and the list of their code strings."""
        lines = []
        if self.matrix:
            outs = self.prepared(outputs)
            assigns, outs = share_products(outs, self.small)
            lines, spd = self.factor_lines(outs + [e for _, e in assigns])
            p = self.printer(spd)
            lines += [f"{t.name} = {p.doprint(e)}" for t, e in assigns]
            return lines, [p.doprint(o) for o in outs]
        replacements, reduced = sp.cse([sp.sympify(o) for o in outputs], symbols=sp.numbered_symbols("t"))
        p = self.printer()
        for s, v in replacements:
            lines.append(f"{s} = {p.doprint(v)}")
        return lines, [p.doprint(o) for o in reduced]

    def forward_backward(self, fwd_outputs, bwd_outputs):
        """Bodies of a forward function and its backward that share products: common-subexpression
        elimination runs over both output lists, the forward computes the products it uses and
        returns those the backward also uses (``saved``), and the backward takes them as ``saved=``
        (or computes them when it is None). Returns (forward lines, forward codes, backward lines,
        backward codes, names of the saved products)."""
        fwd, bwd = self.prepared(fwd_outputs), self.prepared(bwd_outputs)
        assigns, outs = share_products(fwd + bwd, self.small)
        fwd, bwd = outs[:len(fwd)], outs[len(fwd):]
        in_fwd = [(t, e) for t, e in assigns if any(o.has(t) for o in fwd)]
        in_bwd = [(t, e) for t, e in assigns if any(o.has(t) for o in bwd)]
        saved = [(t, e) for t, e in in_fwd if (t, e) in in_bwd]
        f_lines, f_spd = self.factor_lines(fwd + [e for _, e in in_fwd])
        b_lines, b_spd = self.factor_lines(bwd + [e for _, e in in_bwd])
        pf, pb = self.printer(f_spd), self.printer(b_spd)
        f_lines += [f"{t.name} = {pf.doprint(e)}" for t, e in in_fwd]
        names = [t.name for t, _ in saved]
        if saved:
            b_lines += ["if saved is None:"]
            b_lines += [f"    {t.name} = {pb.doprint(e)}" for t, e in saved]
            b_lines += ["else:", f"    {', '.join(names)}{',' if len(names) == 1 else ''} = saved"]
        b_lines += [f"{t.name} = {pb.doprint(e)}" for t, e in in_bwd if (t, e) not in saved]
        return f_lines, [pf.doprint(o) for o in fwd], b_lines, [pb.doprint(o) for o in bwd], names

    def function(self, name, args, outputs, doc, tuple_out=None, extra_lines=(), eps=None):
        eps = self.matrix if eps is None else eps
        sig = ", ".join(args + (["eps=0.0", "cache=None"] if eps else []))
        lines, codes = self.body(outputs) if outputs else ([], [])
        lines = list(extra_lines) + lines if not outputs else lines + list(extra_lines)
        tuple_out = len(codes) > 1 if tuple_out is None else tuple_out
        ret = ("return " + ", ".join(codes)) if codes else ""
        if tuple_out and len(codes) == 1:
            ret = f"return ({codes[0]},)"
        body = "\n".join(lines + ([ret] if ret else []))
        return (
            f"def {name}({sig}):\n"
            + textwrap.indent(f'"""{doc}"""\n', "    ")
            + textwrap.indent(body, "    ")
            + "\n"
        )


def _fmt(expr) -> str:
    return str(expr).replace("**(-1)", "^-1")


def generate_module(geo: QuotientGeometry, module_name: str, origin: str = "") -> GeneratedModule:
    """The source text of the kernel module for ``geo``."""
    em = _Emitter(geo)
    sym, metric = geo.symmetry, geo.metric
    B = em.block_names
    xi = [em.name(x) for x in geo.xi]
    eta = [em.name(x) for x in metric.eta]
    eg = [em.name(x) for x in geo.egrad]
    X = em.name(geo.lie)
    A = em.name(sym.group_element)
    proj = geo.projection
    C_expr = geo.horizontal_condition
    block_shapes = tuple(tuple(str(d) for d in getattr(b, "shape", ())) for b in sym.blocks)
    A_sym = sym.group_element
    group = (tuple(str(d) for d in A_sym.shape) if isinstance(A_sym, MatrixExpr)
             else "positive" if sym.positive_group else "real")
    shapes = ", ".join(f"{b} {tuple(getattr(s, 'shape', ()))}" for b, s in zip(B, sym.blocks)) if em.matrix else "elementwise"
    funcs = []
    funcs.append(em.function(
        "inner", B + xi + eta, [metric(geo.xi, metric.eta)],
        f"g_θ(ξ, η) = {_fmt(metric.expr)}.", tuple_out=False))
    funcs.append(em.function(
        "vertical", B + [X], list(geo.vertical), "Vertical vector v(X): " + ", ".join(
            f"{b}: {_fmt(v)}" for b, v in zip(B, geo.vertical)) + ".", tuple_out=True, eps=False))
    funcs.append(em.function(
        "horizontal_residual", B + xi, [C_expr],
        f"C(ξ) = {_fmt(C_expr)}; ξ is horizontal iff C(ξ) = 0.", tuple_out=False))
    lam_doc = "Λ such that ξ − v(Λ) is horizontal: "
    if proj.kind == "explicit":
        lam = canonicalize(proj.solution.xreplace({proj.rhs: C_expr}))
        funcs.append(em.function("horizontal_lambda", B + xi, [lam], lam_doc + f"Λ = {_fmt(proj.solution)} with C = C(ξ).", tuple_out=False))
    elif proj.kind == "sylvester":
        C2 = canonicalize(proj.rhs_transform.xreplace({proj.rhs: C_expr}))
        if proj.spd_factors:
            S1, S2 = proj.spd_factors
            funcs.append(em.function(
                "sylvester_system", B + xi, [S1, S2, C2],
                f"(S₁, S₂, C') of P Λ + Λ P = C' with P = S₁ S₂ = {_fmt(proj.P)}, C' = {_fmt(proj.rhs_transform)}."))
            call = "_rt.solve_sylvester_spd_product(S1, S2, Cp)"
            cached_call = "_rt.solve_sylvester_factored(cache.sylvester, Cp)"
            unpack = "S1, S2, Cp"
        else:
            funcs.append(em.function(
                "sylvester_system", B + xi, [proj.P, proj.Q, C2],
                f"(P, Q, C') of P Λ + Λ Q = C' with P = {_fmt(proj.P)}, Q = {_fmt(proj.Q)}, C' = {_fmt(proj.rhs_transform)}."))
            call = "_rt.solve_sylvester(P, Q, Cp)"
            cached_call = None
            unpack = "P, Q, Cp"
        args = ", ".join(B + xi + ["eps=eps", "cache=cache"])
        lines = [f"{unpack} = sylvester_system({args})"]
        if cached_call:
            lines += ["if cache is not None and cache.sylvester is not None:", f"    return {cached_call}"]
        funcs.append(em.function(
            "horizontal_lambda", B + xi, [], lam_doc + "solves the Sylvester equation of sylvester_system (batched"
            + ("; with a prepared cache: four matmuls and one division" if cached_call else "") + ").",
            extra_lines=lines + [f"return {call}"]))
    else:
        Ls = [canonicalize(l) for l, _ in proj.terms]
        Ks = [canonicalize(k) for _, k in proj.terms]
        funcs.append(em.function(
            "kronecker_system", B + xi, Ls + Ks + [C_expr],
            "Flat tuple (L_1, …, L_k, K_1, …, K_k, C) of Σ_i L_i Λ K_i = C(ξ)."))
        k = len(Ls)
        args = ", ".join(B + xi + ["eps=eps", "cache=cache"])
        funcs.append(em.function(
            "horizontal_lambda", B + xi, [], lam_doc + "solves Σ_i L_i Λ K_i = C(ξ) in Kronecker form (batched).",
            extra_lines=[f"parts = kronecker_system({args})",
                         f"return _rt.solve_linear_matrix_equation(list(parts[:{k}]), list(parts[{k}:{2 * k}]), parts[{2 * k}])"]))
    lam_call = ", ".join(B + xi + (["eps=eps", "cache=cache"] if em.matrix else []))
    vert_out = ", ".join(f"v_{b}" for b in B)
    funcs.append(em.function(
        "horizontal_projection", B + xi, [], "Horizontal part ξ − v(Λ) of ξ.",
        extra_lines=[f"Lam = horizontal_lambda({lam_call})",
                     f"{vert_out}{',' if len(B) == 1 else ''} = vertical({', '.join(B)}, Lam)",
                     "return " + ", ".join(f"{x} - v_{b}" for x, b in zip(xi, B)) + ("," if len(B) == 1 else "")]))
    funcs.append(em.function(
        "riemannian_gradient", B + eg, list(geo.riemannian_gradient),
        "Riemannian gradient 𝔾⁻¹(∇f): " + ", ".join(f"{b}: {_fmt(v)}" for b, v in zip(B, geo.riemannian_gradient)) + ".",
        tuple_out=True))
    funcs.append(em.function(
        "geodesic_acceleration", B + xi, list(geo.geodesic_acceleration),
        "γ̈(0) = −Γ(ξ, ξ): " + ", ".join(f"{b}: {_fmt(v)}" for b, v in zip(B, geo.geodesic_acceleration)) + ".",
        tuple_out=True))
    cot = [em.name(x) for x in geo.cotangent]
    e_doc = "Second-order geodesic E(ξ) = θ + ξ + ½ γ̈(0) (≈ γ_ξ(1), paper Eq. 4): " + ", ".join(
        f"{b}: {_fmt(v)}" for b, v in zip(B, geo.second_order_geodesic)) + "."
    if em.matrix:  # E is the forward of the forward/backward pair without its saved products
        call = ", ".join(B + xi + ["eps=eps", "cache=cache"])
        funcs.append(em.function("second_order_geodesic", B + xi, [], e_doc,
                                 extra_lines=[f"return second_order_geodesic_fwd({call})[:-1]"]))
        funcs += _forward_backward_functions(em, B, xi, cot, geo)
    else:  # element-wise: nothing worth saving between the two
        funcs.append(em.function("second_order_geodesic", B + xi, list(geo.second_order_geodesic), e_doc,
                                 tuple_out=True))
        funcs.append(em.function(
            "second_order_geodesic_fwd", B + xi, [],
            "Second-order geodesic E(ξ) and the (empty) tuple of products its VJP reuses.",
            extra_lines=[f"return (*second_order_geodesic({', '.join(B + xi)}), ())"]))
        funcs.append(em.function(
            "second_order_geodesic_vjp", B + xi + cot + ["saved=None"], list(geo.second_order_geodesic_vjp),
            "Vector-Jacobian product (∂E/∂ξ)ᵀ ū of second_order_geodesic for a cotangent ū = ("
            + ", ".join(cot) + "); ``saved`` is unused (element-wise): " + ", ".join(
                f"{x}: {_fmt(v)}" for x, v in zip(xi, geo.second_order_geodesic_vjp)) + ".", tuple_out=True))
    funcs.append(em.function(
        "act", B + [A], list(sym.action), "Group action ψ(A, θ): " + ", ".join(
            f"{b}: {_fmt(v)}" for b, v in zip(B, sym.action)) + ".", tuple_out=True, eps=False))

    if em.matrix:
        funcs.insert(0, _prepare_function(em, proj))

    doc = textwrap.dedent(f'''\
        {HEADER}
        # Source: derivations ({origin or "built-in declarations"}); symmetry {sym.name!r}, metric {metric.name!r}.
        # Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py`.
        """Quotient-geometry kernels: {sym.description}; metric {metric.name!r}.

        Blocks: {shapes}. Every function broadcasts over leading batch dimensions.
        Metric          g = {_fmt(metric.expr)}
        Invariance      {geo.invariance.status}
        Horizontal      C(ξ) = {_fmt(C_expr)} = 0
        Projection      {proj.kind}
        """
        import torch

        from codegen import runtime as _rt

        SYMMETRY = {sym.name!r}
        METRIC = {metric.name!r}
        BLOCKS = {tuple(B)!r}
        BLOCK_SHAPES = {block_shapes!r}
        GROUP = {group!r}
        POSITIVE_BLOCKS = {sym.positive_blocks!r}
        ELEMENTWISE = {sym.elementwise!r}
        PROJECTION_KIND = {proj.kind!r}
        ''')
    source = doc + "\n\n" + "\n\n".join(funcs)
    compile(source, module_name, "exec")  # syntax check before anything is written
    return GeneratedModule(module_name, source)


def _forward_backward_functions(em: _Emitter, B, xi, cot, geo) -> list[str]:
    """``second_order_geodesic_fwd`` (E and the n·h² products its VJP reuses) and
    ``second_order_geodesic_vjp(..., saved=None)``, from one shared product elimination."""
    f_lines, f_codes, b_lines, b_codes, saved = em.forward_backward(
        list(geo.second_order_geodesic), list(geo.second_order_geodesic_vjp))
    sig = ", ".join(B + xi + ["eps=0.0", "cache=None"])
    saved_tuple = "(" + ", ".join(saved) + ("," if len(saved) == 1 else "") + ")"
    fwd_doc = ("Second-order geodesic E(ξ) and the products its VJP reuses: "
               f"returns (" + ", ".join(f"E_{b}" for b in B) + f", saved) with saved = {saved_tuple}, "
               "to pass to second_order_geodesic_vjp(..., saved=saved).")
    fwd = ("def second_order_geodesic_fwd(" + sig + "):\n" + textwrap.indent(f'"""{fwd_doc}"""\n', "    ")
           + textwrap.indent("\n".join(f_lines + [f"return {', '.join(f_codes)}, {saved_tuple}"]), "    ") + "\n")
    bsig = ", ".join(B + xi + cot + ["eps=0.0", "cache=None", "saved=None"])
    bwd_doc = ("Vector-Jacobian product (∂E/∂ξ)ᵀ ū of second_order_geodesic for a cotangent ū = ("
               + ", ".join(cot) + "); ``saved`` from second_order_geodesic_fwd skips the products it holds: "
               + ", ".join(f"{x}: {_fmt(v)}" for x, v in zip(xi, geo.second_order_geodesic_vjp)) + ".")
    bwd = ("def second_order_geodesic_vjp(" + bsig + "):\n" + textwrap.indent(f'"""{bwd_doc}"""\n', "    ")
           + textwrap.indent("\n".join(b_lines + [f"return {', '.join(b_codes)}" + ("," if len(b_codes) == 1 else "")]),
                             "    ") + "\n")
    return [fwd, bwd]


def _prepare_function(em: _Emitter, proj) -> str:
    """``prepare(blocks, eps)``: every per-base-point factor the kernels use, as a ``_rt.BasePoint``."""
    B = em.block_names
    lines, fields = [], []
    for b in em.mat_blocks:
        gs = _gram_symbol(b).name
        if gs in em.used or proj.kind == "sylvester":
            lines.append(f"{gs} = _rt.gram({b.name}, eps)")
            fields.append(f"{gs}={gs}")
        if f"{gs}_inv" in em.used:
            lines.append(f"{gs}_inv = _rt.spd_inverse({gs})")
            fields.append(f"{gs}_inv={gs}_inv")
    doc = "Per-base-point factors (Gram matrices + εI" + (" and their inverses" if any(
        u.endswith("_inv") for u in em.used) else "")
    if proj.kind == "sylvester" and proj.spd_factors:
        outs = em.prepared(list(proj.spd_factors))
        p = em.printer()
        lines.append(f"sylvester = _rt.sylvester_spd_product_factors({p.doprint(outs[0])}, {p.doprint(outs[1])})")
        fields.append("sylvester=sylvester")
        doc += "; eigendecomposition of P = S₁ S₂ for the Sylvester projection"
    doc += (").\n\nCompute once per base point and pass as ``cache=`` to the other kernels: they then "
            "do no\nfactorisation (results equal the uncached call to round-off).")
    body = "\n".join(lines + [f"return _rt.BasePoint(({', '.join(B)},), eps" + "".join(f", {f}" for f in fields) + ")"])
    return (f"def prepare({', '.join(B)}, eps=0.0):\n"
            + textwrap.indent(f'"""{doc}"""\n', "    ") + textwrap.indent(body, "    ") + "\n")


def _umask() -> int:
    """The process's umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_modules(modules: list[GeneratedModule], directory: Path = GENERATED_DIR) -> list[Path]:
    """Write generated modules atomically (temp file + os.replace each, after all are generated)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    init = directory / "__init__.py"
    if not init.exists():
        init.write_text(f'{HEADER}\n"""Generated PyTorch kernels (see codegen.generate)."""\n')
    paths = []
    staged = []
    for mod in modules:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{mod.name}.", suffix=".tmp")
        os.fchmod(fd, 0o644 & ~_umask())  # mkstemp makes 0600; a generated module is an ordinary file
        with os.fdopen(fd, "w") as f:
            f.write(mod.source)
        staged.append((tmp, directory / f"{mod.name}.py"))
    for tmp, final in staged:
        os.replace(tmp, final)
        paths.append(final)
    return paths
