"""Emission of the kernels of subgroups of GL(h) given by a Lie subalgebra (projection kind ``"subalgebra"``;
e.g. the RoPE commutant of ``derivations.subgroup``; SymPy).

:func:`generate_module <codegen.generate.generate_module>` calls these for such a geometry:

* :func:`subalgebra_constants` — the module constants ``SUBALGEBRA``, ``PAIRING``, ``ROTARY_DIM`` (and the declared
  basis of a ``"basis"`` subalgebra);
* :func:`subalgebra_helpers` — ``subalgebra_basis(h, rotary_dim=None)``, the per-call basis lookup and
  ``random_group_element``;
* :func:`subalgebra_residual` — ``horizontal_residual``, P_𝔨 C(ξ);
* :func:`subalgebra_lambda` — ``projection_factors`` (the h×h factors of C(v(Λ)) = Σ L_i Λ K_i) and
  ``horizontal_lambda`` (the dim 𝔨 system M λ = b, assembled and solved by ``codegen.runtime_subgroup``);
* :func:`subalgebra_prepare` — ``prepare(…, rotary_dim=None)``, which also keeps the basis and M⁻¹.
"""
from __future__ import annotations

from derivations.matrix_calculus import canonicalize

from .emitter import define, fmt
from .rewrites import gram_symbol

__all__ = ["subalgebra_constants", "subalgebra_helpers", "subalgebra_residual", "subalgebra_lambda",
           "subalgebra_prepare"]


def subalgebra_constants(sub) -> str:
    """Source of the module constants of subalgebra ``sub`` (a ``derivations.subgroup`` declaration)."""
    out = f"SUBALGEBRA = {sub.kind!r}\nPAIRING = {sub.pairing!r}\nROTARY_DIM = {sub.rotary_dim!r}\n"
    if sub.kind == "basis":
        h = sub.fixed_h
        entries = [[(int(i), int(j), float(v)) for i, j, v in e] for e in sub.entries(h)]
        out += f"_BASIS = _rt.SparseBasis({h}, {entries!r})\n"
    return out


def subalgebra_helpers(em, B, proj) -> list[str]:
    """``subalgebra_basis``, ``_basis`` (the basis of a call) and ``random_group_element``."""
    sub = proj.subalgebra
    ref = B[0]
    if sub.kind == "rope":
        basis_doc = ("Basis (E_k) of the subalgebra at head dimension h (``codegen.runtime.rope_basis``): per pair "
                     "(i, j) of PAIRING over the first r coordinates I_p = e_i e_iᵀ + e_j e_jᵀ, J_p = e_i e_jᵀ − e_j "
                     "e_iᵀ, then the elementary matrices of gl(h − r) on the free coordinates; dimension r + (h − r)².\n\n"
                     "r = ``rotary_dim`` if given, else ROTARY_DIM if set, else h (full rotary).")
        basis_body = ["r = ROTARY_DIM if rotary_dim is None else rotary_dim",
                      "return _rt.rope_basis(h, PAIRING, None if r is None or int(r) == h else int(r))"]
        sample_body = ["r = ROTARY_DIM if rotary_dim is None else rotary_dim",
                       "return _rt.random_rope_element(ref, PAIRING, r, generator=generator, scale=scale)"]
    else:
        basis_doc = f"The declared basis (E_k) of the subalgebra ({sub.fixed_h}×{sub.fixed_h}; ``rotary_dim`` unused)."
        basis_body = [f"if h != {sub.fixed_h}:",
                      f"    raise ValueError(f'this subalgebra is declared for h = {sub.fixed_h}, not {{h}}')",
                      "return _BASIS"]
        sample_body = ["basis = subalgebra_basis(ref.shape[-1])",
                       "c = 0.5 * torch.randn(*ref.shape[:-2], basis.dim, generator=generator, dtype=ref.dtype)",
                       "return scale * torch.linalg.matrix_exp(_rt.subalgebra_element(c, basis)).to(ref.device)"]
    return [
        define("subalgebra_basis", "h, rotary_dim=None", basis_doc, basis_body),
        define("_basis", f"{ref}, rotary_dim, cache",
             "The basis for a call: from ``rotary_dim``, else from the cache's (they must agree), else the default.",
             ["if cache is not None:",
              "    if rotary_dim is not None and subalgebra_basis(" + ref + ".shape[-1], rotary_dim) is not cache.basis:",
              "        raise ValueError(f'rotary_dim={rotary_dim} differs from that of the cache ({cache.rotary_dim}); '",
              "                         'call prepare(..., rotary_dim=...) again')",
              "    return cache.basis",
              f"return subalgebra_basis({ref}.shape[-1], rotary_dim)"]),
        define("random_group_element", "ref, generator=None, scale=1.0, rotary_dim=None",
             "A random element A of the subgroup, shape ref.shape[:-2] + (h, h), times ``scale`` (for checks).",
             sample_body),
    ]


def subalgebra_residual(em, B, xi, C_expr) -> str:
    """``horizontal_residual``: P_𝔨 C(ξ), the horizontal condition projected onto the subalgebra."""
    lines, codes = em.body([C_expr])
    return define("horizontal_residual", ", ".join(B + xi + ["eps=0.0", "cache=None", "rotary_dim=None"]),
                f"P_𝔨 C(ξ): the Frobenius projection onto the subalgebra 𝔨 of C(ξ) = {fmt(C_expr)}; ξ is horizontal "
                "(g-orthogonal to every v(X), X ∈ 𝔨) iff it is 0.",
                [f"basis = _basis({B[0]}, rotary_dim, cache)"] + lines + [f"return _rt.subalgebra_project({codes[0]}, basis)"])


def subalgebra_lambda(em, B, xi, C_expr, proj) -> list[str]:
    """``projection_factors`` and ``horizontal_lambda`` (the dim 𝔨 system, solved at run time)."""
    Ls = [canonicalize(l) for l, _ in proj.terms]
    Ks = [canonicalize(k) for _, k in proj.terms]
    k = len(Ls)
    system = "M_kl = " + " + ".join(f"⟨E_k, ({fmt(l)}) E_l ({fmt(kk)})⟩" for l, kk in zip(Ls, Ks))
    factors = em.function(
        "projection_factors", list(B), Ls + Ks,
        "Flat tuple (" + ", ".join([f"L_{i + 1}" for i in range(k)] + [f"K_{i + 1}" for i in range(k)])
        + ") of C(v(Λ)) = Σ_i L_i Λ K_i (per-base-point h×h factors).",
        tuple_out=True)
    lines, codes = em.body([C_expr])
    body = ([f"basis = _basis({B[0]}, rotary_dim, cache)"] + lines + [f"C = {codes[0]}",
            "if cache is not None:",
            "    return _rt.solve_subalgebra(None, None, C, basis, M_inv=cache.subalgebra_M_inv)",
            f"parts = projection_factors({', '.join(B)}, eps=eps)",
            f"return _rt.solve_subalgebra(parts[:{k}], parts[{k}:], C, basis)"])
    lam = define("horizontal_lambda", ", ".join(B + xi + ["eps=0.0", "cache=None", "rotary_dim=None"]),
               "Λ = Σ_l λ_l E_l in the subalgebra such that ξ − v(Λ) is horizontal: M λ = b with "
               f"{system} = g(v(E_l), v(E_k)) (symmetric positive definite) and b_k = ⟨E_k, C(ξ)⟩, "
               "C(ξ) = " + fmt(C_expr) + ". A dim 𝔨 system per head (h for full-rotary RoPE), assembled from the "
               "h×h factors by ``_rt.subalgebra_system``; with a prepared cache one matrix-vector product.",
               body)
    return [factors, lam]


def subalgebra_prepare(em, proj) -> str:
    """``prepare(blocks, eps, rotary_dim)``: Gram factors, the basis and M⁻¹ as a ``_rt.BasePoint``."""
    B = em.block_names
    lines, fields = [], []
    for b in em.mat_blocks:
        gs = gram_symbol(b).name
        if gs in em.used:
            lines.append(f"{gs} = _rt.gram({b.name}, eps)")
            fields.append(f"{gs}={gs}")
        if f"{gs}_inv" in em.used:
            lines.append(f"{gs}_inv = _rt.spd_inverse({gs})")
            fields.append(f"{gs}_inv={gs}_inv")
    k = len(proj.terms)
    lines += [f"basis = subalgebra_basis({B[0]}.shape[-1], rotary_dim)",
              f"bp = _rt.BasePoint(({', '.join(B)},), eps" + "".join(f", {f}" for f in fields)
              + ", basis=basis, rotary_dim=rotary_dim)",
              f"parts = projection_factors({', '.join(B)}, eps=eps, cache=bp)",
              f"bp.subalgebra_M_inv = _rt.spd_inverse(_rt.subalgebra_system(parts[:{k}], parts[{k}:], basis))",
              "return bp"]
    doc = ("Per-base-point factors: Gram matrices + εI (and inverses), the subalgebra basis for ``rotary_dim`` and the "
           "inverse of the projection system M (dim 𝔨 × dim 𝔨).\n\nCompute once per base point and pass as "
           "``cache=`` to the other kernels (they then take ``rotary_dim`` from it).")
    return define("prepare", ", ".join(B + ["eps=0.0", "rotary_dim=None"]), doc, lines)
