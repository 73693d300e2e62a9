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

For a subgroup of GL(h) given by a Lie subalgebra (projection kind ``"subalgebra"``, e.g. the RoPE
commutant) the module also has ``subalgebra_basis(h, rotary_dim=None)``, ``projection_factors`` (the h×h
factors of C(v(Λ)) = Σ L_i Λ K_i), ``random_group_element`` (for checks) and constants ``SUBALGEBRA``,
``PAIRING``, ``ROTARY_DIM``; ``horizontal_residual`` returns P_𝔨 C(ξ); ``horizontal_lambda`` assembles and solves
the dim 𝔨 system M λ = b numerically (``codegen.runtime.subalgebra_system``); ``prepare(…, rotary_dim=None)``
keeps M⁻¹ and the rotary dimension, which the projection kernels also take as a keyword.

Matrix symmetries take ``eps`` (default 0): Gram matrices XᵀX become XᵀX + εI (relaxation for
rank-deficient weights, paper App. H.2). :func:`write_modules` writes several modules atomically:
all sources are generated in memory first, then each file is replaced with ``os.replace``, so a
failing derivation never leaves a half-written module.

This module assembles the module text and writes files; the parts live beside it: :mod:`codegen.rewrites`
(Gram symbols, factored inverses, shared products: :func:`introduce_grams`, :func:`factor_inverses`,
:func:`share_products`, re-exported here), :mod:`codegen.emitter` (one function's source from its output
expressions) and :mod:`codegen.subgroup` (the functions of projection kind ``"subalgebra"``). The generated
modules import only :mod:`codegen.runtime`.
"""
from __future__ import annotations

import os
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from sympy import MatrixExpr

from derivations.matrix_calculus import canonicalize
from derivations.quotient import QuotientGeometry

from .emitter import Emitter, define, fmt
# introduce_grams / factor_inverses / share_products were defined here; re-exported from codegen.rewrites
from .rewrites import factor_inverses, gram_symbol, introduce_grams, share_products  # noqa: F401
from .subgroup import (subalgebra_constants, subalgebra_helpers, subalgebra_lambda, subalgebra_prepare,
                       subalgebra_residual)

__all__ = ["generate_module", "write_modules", "GeneratedModule", "GENERATED_DIR"]

GENERATED_DIR = Path(__file__).resolve().parent / "generated"
HEADER = "# GENERATED FILE - DO NOT EDIT."


@dataclass(frozen=True)
class GeneratedModule:
    name: str
    source: str


def generate_module(geo: QuotientGeometry, module_name: str, origin: str = "") -> GeneratedModule:
    """The source text of the kernel module for ``geo``."""
    em = Emitter(geo)
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
        f"g_θ(ξ, η) = {fmt(metric.expr)}.", tuple_out=False))
    funcs.append(em.function(
        "vertical", B + [X], list(geo.vertical), "Vertical vector v(X): " + ", ".join(
            f"{b}: {fmt(v)}" for b, v in zip(B, geo.vertical)) + ".", tuple_out=True, eps=False))
    sub = proj.kind == "subalgebra"
    if sub:
        funcs.append(subalgebra_residual(em, B, xi, C_expr))
    else:
        funcs.append(em.function(
            "horizontal_residual", B + xi, [C_expr],
            f"C(ξ) = {fmt(C_expr)}; ξ is horizontal iff C(ξ) = 0.", tuple_out=False))
    lam_doc = "Λ such that ξ − v(Λ) is horizontal: "
    if sub:
        funcs += subalgebra_lambda(em, B, xi, C_expr, proj)
    elif proj.kind == "explicit":
        lam = canonicalize(proj.solution.xreplace({proj.rhs: C_expr}))
        funcs.append(em.function("horizontal_lambda", B + xi, [lam], lam_doc + f"Λ = {fmt(proj.solution)} with C = C(ξ).", tuple_out=False))
    elif proj.kind == "sylvester":
        C2 = canonicalize(proj.rhs_transform.xreplace({proj.rhs: C_expr}))
        if proj.spd_factors:
            S1, S2 = proj.spd_factors
            funcs.append(em.function(
                "sylvester_system", B + xi, [S1, S2, C2],
                f"(S₁, S₂, C') of P Λ + Λ P = C' with P = S₁ S₂ = {fmt(proj.P)}, C' = {fmt(proj.rhs_transform)}."))
            call = "_rt.solve_sylvester_spd_product(S1, S2, Cp)"
            cached_call = "_rt.solve_sylvester_factored(cache.sylvester, Cp)"
            unpack = "S1, S2, Cp"
        else:
            funcs.append(em.function(
                "sylvester_system", B + xi, [proj.P, proj.Q, C2],
                f"(P, Q, C') of P Λ + Λ Q = C' with P = {fmt(proj.P)}, Q = {fmt(proj.Q)}, C' = {fmt(proj.rhs_transform)}."))
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
    lam_call = ", ".join(B + xi + (["eps=eps", "cache=cache"] if em.matrix else []) + (["rotary_dim=rotary_dim"] if sub else []))
    vert_out = ", ".join(f"v_{b}" for b in B)
    proj_lines = [f"Lam = horizontal_lambda({lam_call})",
                  f"{vert_out}{',' if len(B) == 1 else ''} = vertical({', '.join(B)}, Lam)",
                  "return " + ", ".join(f"{x} - v_{b}" for x, b in zip(xi, B)) + ("," if len(B) == 1 else "")]
    if sub:
        funcs.append(define("horizontal_projection", ", ".join(B + xi + ["eps=0.0", "cache=None", "rotary_dim=None"]),
                          "Horizontal part ξ − v(Λ) of ξ, Λ in the subalgebra (``rotary_dim``: see subalgebra_basis).",
                          proj_lines))
    else:
        funcs.append(em.function(
            "horizontal_projection", B + xi, [], "Horizontal part ξ − v(Λ) of ξ.", extra_lines=proj_lines))
    funcs.append(em.function(
        "riemannian_gradient", B + eg, list(geo.riemannian_gradient),
        "Riemannian gradient 𝔾⁻¹(∇f): " + ", ".join(f"{b}: {fmt(v)}" for b, v in zip(B, geo.riemannian_gradient)) + ".",
        tuple_out=True))
    funcs.append(em.function(
        "geodesic_acceleration", B + xi, list(geo.geodesic_acceleration),
        "γ̈(0) = −Γ(ξ, ξ): " + ", ".join(f"{b}: {fmt(v)}" for b, v in zip(B, geo.geodesic_acceleration)) + ".",
        tuple_out=True))
    cot = [em.name(x) for x in geo.cotangent]
    e_doc = "Second-order geodesic E(ξ) = θ + ξ + ½ γ̈(0) (≈ γ_ξ(1), paper Eq. 4): " + ", ".join(
        f"{b}: {fmt(v)}" for b, v in zip(B, geo.second_order_geodesic)) + "."
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
                f"{x}: {fmt(v)}" for x, v in zip(xi, geo.second_order_geodesic_vjp)) + ".", tuple_out=True))
    funcs.append(em.function(
        "act", B + [A], list(sym.action), "Group action ψ(A, θ): " + ", ".join(
            f"{b}: {fmt(v)}" for b, v in zip(B, sym.action)) + ".", tuple_out=True, eps=False))

    if sub:
        funcs = subalgebra_helpers(em, B, proj) + [subalgebra_prepare(em, proj)] + funcs
    elif em.matrix:
        funcs.insert(0, _prepare_function(em, proj))

    doc = textwrap.dedent(f'''\
        {HEADER}
        # Source: derivations ({origin or "built-in declarations"}); symmetry {sym.name!r}, metric {metric.name!r}.
        # Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py`.
        """Quotient-geometry kernels: {sym.description}; metric {metric.name!r}.

        Blocks: {shapes}. Every function broadcasts over leading batch dimensions.
        Metric          g = {fmt(metric.expr)}
        Invariance      {geo.invariance.status}
        Horizontal      C(ξ) = {fmt(C_expr)} = 0
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
    if sub:
        doc += subalgebra_constants(proj.subalgebra)
    source = doc + "\n\n" + "\n\n".join(funcs)
    compile(source, module_name, "exec")  # syntax check before anything is written
    return GeneratedModule(module_name, source)


def _forward_backward_functions(em: Emitter, B, xi, cot, geo) -> list[str]:
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
               + ", ".join(f"{x}: {fmt(v)}" for x, v in zip(xi, geo.second_order_geodesic_vjp)) + ".")
    bwd = ("def second_order_geodesic_vjp(" + bsig + "):\n" + textwrap.indent(f'"""{bwd_doc}"""\n', "    ")
           + textwrap.indent("\n".join(b_lines + [f"return {', '.join(b_codes)}" + ("," if len(b_codes) == 1 else "")]),
                             "    ") + "\n")
    return [fwd, bwd]


def _prepare_function(em: Emitter, proj) -> str:
    """``prepare(blocks, eps)``: every per-base-point factor the kernels use, as a ``_rt.BasePoint``."""
    B = em.block_names
    lines, fields = [], []
    for b in em.mat_blocks:
        gs = gram_symbol(b).name
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
