"""The emitter of generated kernel functions (SymPy): one function's source text from its output expressions.

:class:`Emitter` holds what a module's functions share (the geometry, its blocks, the symbolic dimensions
and how to read them off the block tensors, the small dimensions) and turns a list of output expressions into the
lines of a batched torch function: expressions rewritten by :mod:`codegen.rewrites`, Gram matrices and their
inverses read from a prepared cache or computed (:meth:`Emitter.factor_lines`), then printed by
:class:`codegen.printer.BatchedTorchPrinter`. :meth:`Emitter.function` writes a whole ``def``;
:meth:`Emitter.forward_backward` the bodies of a forward/backward pair that share products.
:func:`define` writes a ``def`` from given lines and :func:`fmt` an expression for a docstring.
"""
from __future__ import annotations

import textwrap

import sympy as sp
from sympy import Inverse, MatrixSymbol

from derivations.matrix_calculus import canonicalize
from derivations.quotient import QuotientGeometry

from .printer import BatchedTorchPrinter
from .rewrites import factor_inverses, gram_symbol, introduce_grams, share_products

__all__ = ["Emitter", "define", "fmt"]


class Emitter:
    """Writes the functions of the kernel module of one quotient geometry."""

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
            gs = gram_symbol(b)
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


def fmt(expr) -> str:
    """An expression as text for a docstring (x**(-1) as x^-1)."""
    return str(expr).replace("**(-1)", "^-1")


def define(name, sig, doc, lines) -> str:
    """Source of ``def name(sig):`` with docstring ``doc`` and body ``lines``."""
    return (f"def {name}({sig}):\n" + textwrap.indent(f'"""{doc}"""\n', "    ")
            + textwrap.indent("\n".join(lines), "    ") + "\n")
