"""Kernel modules for joint symmetries (:mod:`derivations.joint_geometry`): batched torch functions.

:func:`generate_joint_module` turns a :class:`derivations.joint_geometry.JointGeometry` into module source with

==============================  =====================================================================
function                        computes
==============================  =====================================================================
``inner``                       g_θ(ξ, η)
``vertical_<i>``                v_i(X_i) on every block (part i)
``condition_<i>``               C_i(ξ), the representer of X_i ↦ g(ξ, v_i(X_i))
``geodesic_acceleration``       γ̈(0) = −Γ(ξ, ξ) (diagonal blocks: their diagonal part)
``second_order_geodesic``       E(ξ) = θ + ξ + ½ γ̈(0)
``second_order_geodesic_vjp``   (∂E/∂ξ)ᵀ ū (diagonal blocks: restricted to diagonal tangents)
``act_<i>``                     ψ_i(A_i, θ)
``prepare``                     per-base-point cache: the orthonormal bases of the parts' Lie algebras
``horizontal_lambda``           Λ = (Λ_1, …, Λ_p) by conjugate gradients (:func:`codegen.runtime_joint.joint_lambda`)
``horizontal_projection``       ξ − v(Λ)
``..._with_residual``           (ξ − v(Λ), CG iterations, ‖b − 𝕄λ‖/‖b‖ per batch element)
==============================  =====================================================================

Every function takes blocks and tangents with leading batch dimensions, (…, r, c) (heads, layers), like the
other generated modules. The projection has no closed form when the parts couple through the metric: the
generated ``condition_<i>`` and ``vertical_<i>`` are the operator 𝕄 and the run-time solves 𝕄λ = b by batched CG
in an orthonormal basis of the joint Lie algebra (``PART_ALGEBRAS``), every batch element to a relative residual
``tol`` (default 1e-12, float64; ≈1e-5 for float32) within ``maxiter`` iterations (default 2·dim 𝔨).
The header records the invariance status per part; ``eps`` is accepted for signature parity and unused.
"""
from __future__ import annotations

import textwrap
from types import SimpleNamespace

from derivations.matrix_calculus import is_zero

from .emitter import Emitter, define, fmt
from .printer import BatchedTorchPrinter

__all__ = ["generate_joint_module", "joint_module_from_source", "generate_joint_choice", "joint_suggestion"]

HEADER = "# GENERATED FILE - DO NOT EDIT."


class _PowerPrinter(BatchedTorchPrinter):
    """Integer matrix powers (Γ², Γ⁻²: the joint metrics' row weights) as ``torch.linalg.matrix_power``."""

    def _print_MatPow(self, expr):
        k = int(expr.exp)
        base = self._print(expr.base)
        if k < 0:
            base, k = f"torch.linalg.inv({base})", -k
        return f"torch.linalg.matrix_power({base}, {k})"


class _JointEmitter(Emitter):
    def printer(self, spd=None):
        return _PowerPrinter(dims=self.dims, spd=spd or {}, ref=self.ref, small_dims=self.small)


def _algebra(part):
    sub = part.subalgebra
    if sub is None:
        return ("gl", str(part.group_element.shape[0]), None)
    mats = [M.tolist() for M in sub.matrices]
    n = len(mats[0])
    if len(mats) == n and all(M[r][c] == int(r == c == k) for k, M in enumerate(mats) for r in range(n)
                              for c in range(n)):  # every diagonal unit: the diagonal algebra at any size
        return ("diag", str(part.group_element.shape[0]), None)
    return ("basis", str(part.group_element.shape[0]), mats)


def _projection_functions(B, xi) -> list:
    """``prepare``, ``horizontal_lambda``, ``horizontal_projection``, ``horizontal_projection_with_residual``."""
    sig = ", ".join(B + xi + ["eps=0.0", "cache=None", "tol=1e-12", "maxiter=None"])
    args = f"({', '.join(B)},), ({', '.join(xi)},), tol=tol, maxiter=maxiter, bases=_bases(cache)"
    return [
        define("prepare", ", ".join(B + ["eps=0.0"]),
               "Per-base-point cache for ``cache=``: the (K_i, h_i, h_i) orthonormal bases of the parts' Lie algebras "
               "(the CG coordinates). The other kernels factor inline and accept (and ignore) the cache.",
               [f"blocks = ({', '.join(B)},)",
                "return _rt.BasePoint(blocks, eps, bases=_rtj.algebra_bases(globals(), blocks))"]),
        define("_bases", "cache", "The cached algebra bases, or None.",
               ["return None if cache is None else getattr(cache, 'bases', None)"]),
        define("horizontal_lambda", sig,
               "Λ = (Λ_1, …, Λ_p), each (…, h_i, h_i): C_i(v(Λ)) = C_i(ξ) for every part, by batched CG on 𝕄λ = b "
               "(every batch element to ‖b − 𝕄λ‖ ≤ tol ‖b‖, at most maxiter iterations, default 2·dim 𝔨).",
               [f"return _rtj.joint_lambda(globals(), {args})[0]"]),
        define("horizontal_projection", sig,
               "Horizontal part ξ − v(Λ) of ξ (one tensor per block; Λ from horizontal_lambda).",
               [f"return _rtj.joint_projection(globals(), {args})[0]"]),
        define("horizontal_projection_with_residual", sig,
               "(ξ − v(Λ), CG iterations, true relative residual ‖b − 𝕄λ‖/‖b‖ with the batch shape).",
               [f"return _rtj.joint_projection(globals(), {args})"]),
    ]


def generate_joint_module(geo, module_name: str, origin: str = "") -> str:
    """Source text of the kernel module of a joint geometry (compiled before it is returned)."""
    joint = geo.joint
    shim = SimpleNamespace(is_matrix=True, blocks=joint.blocks,
                           group_element=joint.parts[0].group_element)
    em = _JointEmitter(SimpleNamespace(symmetry=shim))
    B = em.block_names
    xi = [em.name(x) for x in geo.xi]
    eta = [em.name(x) for x in joint.tangent("eta")]
    diag = [b.name for b in joint.diagonal_blocks]
    funcs = [em.function("inner", B + xi + eta, [geo.metric(geo.xi, joint.tangent("eta"))],
                         f"g_θ(ξ, η) = {fmt(geo.metric.expr)}.", tuple_out=False)]
    for i, part in enumerate(joint.parts):
        X = em.name(geo.lie[i])
        funcs.append(_function_with_zeros(em, f"vertical_{i}", B + [X], list(geo.vertical[i]), B,
                                          f"v_{i}(X) of part {i} ({part.name}) on every block."))
        funcs.append(em.function(f"condition_{i}", B + xi, [geo.conditions[i]],
                                 f"C_{i}(ξ) = {fmt(geo.conditions[i])}.", tuple_out=False))
        A = em.name(joint.element(i))
        funcs.append(_function_with_zeros(em, f"act_{i}", B + [A], [joint.act(i)[b] for b in joint.blocks], B,
                                          f"ψ_{i}(A, θ) of part {i} ({part.name}).", eps=False))
    acc = list(geo.geodesic_acceleration)
    funcs.append(_function_with_zeros(em, "_acceleration_ambient", B + xi, acc, B,
                                      "γ̈(0) with every block as a general matrix (diagonal blocks: see below)."))
    funcs.append(define("geodesic_acceleration", ", ".join(B + xi + ["eps=0.0", "cache=None"]),
                        "γ̈(0) = −Γ(ξ, ξ); a diagonal block's component is the diagonal part (its tangent space).",
                        [f"out = list(_acceleration_ambient({', '.join(B + xi)}, eps=eps, cache=cache))",
                         f"return _rtj.diagonal_parts(out, {[b in joint.diagonal_blocks for b in joint.blocks]!r})"]))
    funcs.append(define("second_order_geodesic", ", ".join(B + xi + ["eps=0.0", "cache=None"]),
                        "E(ξ) = θ + ξ + ½ γ̈(0) (paper Eq. 4).",
                        [f"acc = geodesic_acceleration({', '.join(B + xi)}, eps=eps, cache=cache)",
                         f"return tuple(b + x + a / 2 for b, x, a in zip(({', '.join(B)},), ({', '.join(xi)},), acc))"]))
    cot = [em.name(c) for c in geo.cotangent]
    funcs.append(_function_with_zeros(em, "_vjp_ambient", B + xi + cot, list(geo.second_order_geodesic_vjp), xi,
                                      "(∂E/∂ξ)ᵀ ū with every block as a general matrix."))
    flags = [b in joint.diagonal_blocks for b in joint.blocks]
    funcs.append(define("second_order_geodesic_vjp", ", ".join(B + xi + cot + ["eps=0.0", "cache=None"]),
                        "Vector-Jacobian product (∂E/∂ξ)ᵀ ū of second_order_geodesic: P(VJP_ambient(P ū)), P the "
                        "diagonal part on diagonal blocks (their tangent spaces), the identity elsewhere.",
                        [f"u = _rtj.diagonal_parts(({', '.join(cot)},), {flags!r})",
                         f"out = _vjp_ambient({', '.join(B + xi)}, *u, eps=eps, cache=cache)",
                         f"return _rtj.diagonal_parts(out, {flags!r})"]))
    funcs.extend(_projection_functions(B, xi))
    algebras = [_algebra(p) for p in joint.parts]
    shapes = ", ".join(f"{b} {tuple(b.shape)}" for b in joint.blocks)
    doc = textwrap.dedent(f'''\
        {HEADER}
        # Source: derivations.joint_geometry ({origin or "derive_joint_geometry"}); joint symmetry {joint.name!r}, metric {geo.metric.name!r}.
        # Regenerate with `geosharp derive` (built-ins) or `geosharp derive --spec FILE.py --metric CHOICE`.
        """Joint quotient-geometry kernels: {joint.description}; metric {geo.metric.name!r}.

        Blocks: {shapes}. Every function broadcasts over leading batch dimensions.

        Metric      g = {fmt(geo.metric.expr)}
        Invariance  {', '.join(r.status for r in geo.invariance)} (per part)
        Projection  {geo.projection_kind} (CG in the joint Lie algebra)
        """
        import torch

        from codegen import runtime as _rt
        from codegen import runtime_joint as _rtj

        JOINT = {joint.name!r}
        METRIC = {geo.metric.name!r}
        BLOCKS = {tuple(B)!r}
        BLOCK_SHAPES = {tuple(tuple(str(d) for d in b.shape) for b in joint.blocks)!r}
        DIAGONAL_BLOCKS = {tuple(diag)!r}
        N_PARTS = {len(joint.parts)}
        #: per part: ("gl" | "diag", dimension, None): gl(h) or the diagonal algebra, at the blocks' size (PART_DIMS);
        #: ("basis", dimension, matrices): the span of declared matrices (that size only)
        PART_ALGEBRAS = {algebras!r}
        #: per part: (block index, axis) giving the group dimension
        PART_DIMS = {[_dim_source(joint, p) for p in joint.parts]!r}
        ''')
    source = doc + "\n\n" + "\n\n".join(funcs)
    compile(source, module_name, "exec")
    return source


def joint_module_from_source(name: str, source: str):
    """Execute generated joint-kernel source as a module (nothing written)."""
    import types

    mod = types.ModuleType(name)
    exec(compile(source, name, "exec"), mod.__dict__)
    return mod


def _dim_source(joint, part):
    h = part.group_element.shape[0]
    for k, b in enumerate(joint.blocks):
        for ax, d in enumerate(b.shape):
            if d == h:
                return (k, ax - 2)
    raise ValueError(f"no block carries the dimension {h}")


def _function_with_zeros(em, name, args, outs, B, doc, eps=None):
    """A function returning one tensor per block; structural zeros print as zeros shaped like the block."""
    keep = [k for k, o in enumerate(outs) if not is_zero(o)]
    body = em.function(f"_{name}_nonzero", args, [outs[k] for k in keep], doc, tuple_out=True, eps=eps)
    eps_on = em.matrix if eps is None else eps
    sig = ", ".join(args + (["eps=0.0", "cache=None"] if eps_on else []))
    call = ", ".join(args + (["eps=eps", "cache=cache"] if eps_on else []))
    lines = [f"vals = _{name}_nonzero({call})", "out = []", "k = 0"]
    for idx, b in enumerate(B):
        if idx in keep:
            lines += ["out.append(vals[k])", "k += 1"]
        else:
            lines.append(f"out.append(torch.zeros_like({b}))")
    lines.append("return tuple(out)")
    return body + "\n\n" + define(name, sig, doc, lines)


def joint_suggestion(fam) -> str:
    """A sum of semidefinite members of a joint family that together are positive on every block."""
    chosen = []
    for b in fam.joint.blocks:
        if any(b in m.positive_on for m in chosen):
            continue
        for m in fam.basis:
            if b in m.positive_on and m.definiteness != "indefinite":
                chosen.append(m)
                break
    return "+".join(m.name for m in chosen) or "m0"


def generate_joint_choice(path, name: str, joint, choice: str, sizes: dict, degree: int = 1, progress=None):
    """``geosharp derive --spec FILE --metric [NAME:]CHOICE`` for a joint symmetry: the metric ``choice`` (a built-in
    kind of the declaration, :func:`derivations.joint_choice.joint_builtin_names`, derived without solving the
    family; a folded kind through :func:`derivations.joint_folded.derive_folded_geometry`; else a member of
    :func:`derivations.joint.joint_invariant_metrics` at ``sizes`` {name: int}), refused unless positive definite
    (float64 coordinate Gram at random points of ``sizes``) and proved invariant under every part; returns
    ([GeneratedModule], {module name: seconds}) (nothing written)."""
    import re
    import time
    from pathlib import Path

    import sympy as sp

    from derivations.errors import MetricError
    from derivations.joint import joint_definiteness, joint_invariant_metrics
    from derivations.joint_choice import builtin_joint_metric_on, joint_builtin_names, joint_family_member
    from derivations.joint_builtins import JOINT_BUILTIN_METRICS
    from derivations.joint_folded import FOLDED_KINDS, derive_folded_geometry
    from derivations.joint_geometry import derive_joint_geometry

    from .generate import GeneratedModule

    t0 = time.perf_counter()
    metric, fam = builtin_joint_metric_on(joint, choice.strip()), None
    known = {k for _, k in JOINT_BUILTIN_METRICS} | set(FOLDED_KINDS)
    if metric is None and choice.strip() in known:  # a built-in name of another declaration: say which apply
        builtins = joint_builtin_names(joint)
        raise MetricError(f"the built-in metric {choice.strip()!r} does not apply to {name!r} ({joint.name}, blocks "
                          f"{', '.join(map(str, joint.blocks))}); its built-ins: {', '.join(builtins) or 'none'}; "
                          f"or a member of its invariant family (`geosharp derive --spec FILE` lists it)")
    if metric is None:
        fam = joint_invariant_metrics(joint, sizes, degree=degree)
        metric = joint_family_member(fam, choice)
    dims = {s: sizes[s.name] for b in joint.blocks for d in b.shape for s in sp.sympify(d).free_symbols
            if s.name in sizes}
    kind, positive_on = joint_definiteness(metric, joint, dims)
    if kind != "positive definite":
        missing = [str(b) for b in joint.blocks if b not in positive_on]
        hint = joint_suggestion(fam) if fam is not None else "m0"
        builtins = joint_builtin_names(joint)
        raise MetricError(
            f"metric {choice!r} of {name!r} is {kind}, not positive definite"
            + (f" (degenerate on {', '.join(missing)})" if missing else "")
            + f"; add members positive on every block, e.g. --metric {name}:{hint}"
            + (f", or a built-in: {', '.join(builtins)}" if builtins else ""))
    # a folded metric's operator is not block-diagonal: derived through the fold (closed-form projection proved,
    # geodesic the pullback of the product one), its kernels project by CG on the coupled conditions
    geo = derive_folded_geometry(metric).joint_geometry() if metric.name in FOLDED_KINDS else \
        derive_joint_geometry(metric)
    module_name = re.sub(r"\W+", "_", f"{name}_{metric.name}").strip("_")
    source = generate_joint_module(geo, module_name, origin=f"spec {Path(path).name}, joint metric {metric.name}")
    seconds = time.perf_counter() - t0
    if progress:
        progress(module_name, seconds)
    return [GeneratedModule(module_name, source)], {module_name: seconds}
