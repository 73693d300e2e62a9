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
``act``                     ψ(A, θ)
==========================  =========================================================

Matrix symmetries take ``eps`` (default 0): Gram matrices XᵀX become XᵀX + εI (relaxation for
rank-deficient weights, paper App. H.2). :func:`write_modules` writes several modules atomically:
all sources are generated in memory first, then each file is replaced with ``os.replace``, so a
failing derivation never leaves a half-written module.
"""
from __future__ import annotations

import os
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import sympy as sp
from sympy import Inverse, MatAdd, MatMul, MatrixExpr, MatrixSymbol, Transpose

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


def factor_inverses(expr):
    """Σ_i A_i M⁻¹ → (Σ_i A_i) M⁻¹ and Σ_i M⁻¹ B_i → M⁻¹ (Σ_i B_i): one solve instead of one per term."""
    if isinstance(expr, sp.Basic) and not isinstance(expr, MatAdd) and expr.args and isinstance(expr, MatrixExpr):
        return expr.func(*[factor_inverses(a) if isinstance(a, MatrixExpr) else a for a in expr.args])
    if not isinstance(expr, MatAdd):
        return expr
    for side in (-1, 0):
        groups, rest = {}, []
        for t in expr.args:
            coeff, mats = t.as_coeff_matrices() if isinstance(t, MatMul) else (1, [t])
            if len(mats) > 1 and isinstance(mats[side], Inverse):
                key = mats[side]
                body = mats[:-1] if side == -1 else mats[1:]
                groups.setdefault(key, []).append(coeff * MatMul(*body) if len(body) > 1 else coeff * body[0])
            else:
                rest.append(t)
        if any(len(v) > 1 for v in groups.values()):
            terms = list(rest)
            for key, bodies in groups.items():
                inner = factor_inverses(MatAdd(*bodies)) if len(bodies) > 1 else bodies[0]
                terms.append(MatMul(inner, key) if side == -1 else MatMul(key, inner))
            return MatAdd(*terms) if len(terms) > 1 else terms[0]
    return expr


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

    @staticmethod
    def name(s):
        return s.name if hasattr(s, "name") else str(s)

    def printer(self, spd=None):
        return BatchedTorchPrinter(dims=self.dims, spd=spd or {}, ref=self.ref)

    # -- function bodies -------------------------------------------------------------------------
    def body(self, outputs):
        """Lines computing ``outputs`` (list of expressions) and the list of their code strings."""
        lines = []
        if self.matrix:
            outs = [factor_inverses(introduce_grams(canonicalize(o), self.blocks)) for o in outputs]
            spd = {}
            for b in self.blocks:
                if not isinstance(b, MatrixSymbol):
                    continue
                gs = _gram_symbol(b)
                used = any(o.has(gs) for o in outs)
                if used:
                    lines.append(f"{gs.name} = _rt.gram({b.name}, eps)")
                    if any(o.has(Inverse(gs)) for o in outs):
                        lines.append(f"{gs.name}_chol = torch.linalg.cholesky({gs.name})")
                        spd[gs.name] = f"{gs.name}_chol"
            p = self.printer(spd)
            return lines, [p.doprint(o) for o in outs]
        replacements, reduced = sp.cse([sp.sympify(o) for o in outputs], symbols=sp.numbered_symbols("t"))
        p = self.printer()
        for s, v in replacements:
            lines.append(f"{s} = {p.doprint(v)}")
        return lines, [p.doprint(o) for o in reduced]

    def function(self, name, args, outputs, doc, tuple_out=None, extra_lines=(), eps=None):
        eps = self.matrix if eps is None else eps
        sig = ", ".join(args + (["eps=0.0"] if eps else []))
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
            unpack = "S1, S2, Cp"
        else:
            funcs.append(em.function(
                "sylvester_system", B + xi, [proj.P, proj.Q, C2],
                f"(P, Q, C') of P Λ + Λ Q = C' with P = {_fmt(proj.P)}, Q = {_fmt(proj.Q)}, C' = {_fmt(proj.rhs_transform)}."))
            call = "_rt.solve_sylvester(P, Q, Cp)"
            unpack = "P, Q, Cp"
        args = ", ".join(B + xi + ["eps=eps"])
        funcs.append(em.function(
            "horizontal_lambda", B + xi, [], lam_doc + "solves the Sylvester equation of sylvester_system (batched).",
            extra_lines=[f"{unpack} = sylvester_system({args})", f"return {call}"]))
    else:
        Ls = [canonicalize(l) for l, _ in proj.terms]
        Ks = [canonicalize(k) for _, k in proj.terms]
        funcs.append(em.function(
            "kronecker_system", B + xi, Ls + Ks + [C_expr],
            "Flat tuple (L_1, …, L_k, K_1, …, K_k, C) of Σ_i L_i Λ K_i = C(ξ)."))
        k = len(Ls)
        args = ", ".join(B + xi + ["eps=eps"])
        funcs.append(em.function(
            "horizontal_lambda", B + xi, [], lam_doc + "solves Σ_i L_i Λ K_i = C(ξ) in Kronecker form (batched).",
            extra_lines=[f"parts = kronecker_system({args})",
                         f"return _rt.solve_linear_matrix_equation(list(parts[:{k}]), list(parts[{k}:{2 * k}]), parts[{2 * k}])"]))
    lam_call = ", ".join(B + xi + (["eps=eps"] if em.matrix else []))
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
    funcs.append(em.function(
        "act", B + [A], list(sym.action), "Group action ψ(A, θ): " + ", ".join(
            f"{b}: {_fmt(v)}" for b, v in zip(B, sym.action)) + ".", tuple_out=True, eps=False))

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
        with os.fdopen(fd, "w") as f:
            f.write(mod.source)
        staged.append((tmp, directory / f"{mod.name}.py"))
    for tmp, final in staged:
        os.replace(tmp, final)
        paths.append(final)
    return paths
