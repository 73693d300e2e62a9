"""Run-time helpers for subgroups of GL(h) given by a Lie subalgebra (torch only, no SymPy).

Imported by the generated kernels of projection kind ``"subalgebra"`` (the RoPE modules
``codegen/generated/rope_*.py``) through :mod:`codegen.runtime`, which re-exports every public name here:

* the RoPE commutant: :data:`PAIRINGS`, :func:`rope_pairs` (the coordinate pairs a rotary embedding rotates
  together), :func:`rope_basis` (a sparse orthogonal basis of the commutant of the rotations in gl(h)) and
  :func:`random_rope_element` (a random well-conditioned group element, for checks);
* :class:`SparseBasis`, a Frobenius-orthogonal basis E_1, …, E_d stored by its few non-zero entries;
* the horizontal projection restricted to the subalgebra: :func:`subalgebra_system` (assembles the d×d
  system M_kl = Σ_i ⟨E_k, L_i E_l K_i⟩ from the h×h factors), :func:`subalgebra_coordinates`,
  :func:`subalgebra_element`, :func:`subalgebra_project` and :func:`solve_subalgebra` (M λ = b, Λ = Σ λ_l E_l).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = [
    "PAIRINGS",
    "rope_pairs",
    "rope_basis",
    "SparseBasis",
    "subalgebra_system",
    "subalgebra_coordinates",
    "subalgebra_element",
    "subalgebra_project",
    "solve_subalgebra",
    "random_rope_element",
]


#: coordinate pairings of rotary position embeddings (see :func:`rope_pairs`)
PAIRINGS = ("half", "interleaved")


def rope_pairs(h: int, pairing: str, rotary_dim: int | None = None) -> list[tuple[int, int]]:
    """The coordinate pairs a rotary embedding rotates together, for head dimension ``h``.

    ``"half"`` (Hugging Face ``rotate_half``, Llama/Mistral/Qwen2/Gemma/Phi-3/GPT-NeoX): i with i + r/2,
    ``"interleaved"`` (GPT-J, Meta's original Llama, ``rotate_every_two``): 2i with 2i + 1, i < r/2;
    ``rotary_dim`` r (default h, even) rotates the first r coordinates; the last h − r are free."""
    r = h if rotary_dim is None else int(rotary_dim)
    if pairing not in PAIRINGS:
        raise ValueError(f"unknown RoPE pairing {pairing!r}; choose one of {PAIRINGS}")
    if not (0 <= r <= h) or r % 2:
        raise ValueError(f"rotary_dim must be even and in [0, h={h}], got {rotary_dim}")
    if pairing == "half":
        return [(i, i + r // 2) for i in range(r // 2)]
    return [(2 * i, 2 * i + 1) for i in range(r // 2)]


class SparseBasis:
    """A Frobenius-orthogonal basis E_1, …, E_d of a Lie subalgebra of gl(h), each E_k with at most ``k`` entries:
    E_k = Σ_u signs[k, u] e_{rows[k, u]} e_{cols[k, u]}ᵀ (unused slots have sign 0).

    ``dense(dtype, device)`` is the (d, h·h) matrix of the flattened E_k; ``norm2`` their squared norms."""

    def __init__(self, h: int, entries: list[list[tuple[int, int, float]]]):
        width = max((len(e) for e in entries), default=1)
        padded = [e + [e[0][:2] + (0.0,)] * (width - len(e)) if e else [(0, 0, 0.0)] * width for e in entries]
        self.h, self.dim = int(h), len(entries)
        self.rows = torch.tensor([[r for r, _, _ in e] for e in padded], dtype=torch.long).reshape(self.dim, width)
        self.cols = torch.tensor([[c for _, c, _ in e] for e in padded], dtype=torch.long).reshape(self.dim, width)
        self._signs = torch.tensor([[s for _, _, s in e] for e in padded], dtype=torch.float64).reshape(self.dim, width)
        self._cache = {}

    def _on(self, dtype, device):
        key = (dtype, str(device))
        if key not in self._cache:
            s = self._signs.to(dtype=dtype, device=device)
            dense = torch.zeros(self.dim, self.h * self.h, dtype=dtype, device=device)
            dense.index_put_((torch.arange(self.dim).repeat_interleave(s.shape[1]).to(device),
                              (self.rows * self.h + self.cols).reshape(-1).to(device)), s.reshape(-1), accumulate=True)
            self._cache[key] = (s, self.rows.to(device), self.cols.to(device), dense, (s * s).sum(-1))
        return self._cache[key]

    def dense(self, dtype=torch.float64, device="cpu") -> torch.Tensor:
        return self._on(dtype, device)[3]

    def matrices(self, dtype=torch.float64, device="cpu") -> torch.Tensor:
        """The basis as a (d, h, h) tensor."""
        return self.dense(dtype, device).reshape(self.dim, self.h, self.h)

    def norm2(self, dtype=torch.float64, device="cpu") -> torch.Tensor:
        return self._on(dtype, device)[4]


_ROPE_BASES: dict = {}


def rope_basis(h: int, pairing: str, rotary_dim: int | None = None) -> SparseBasis:
    """Basis of the commutant of the RoPE rotations in gl(h): per pair (i, j) of :func:`rope_pairs`,
    I_p = e_i e_iᵀ + e_j e_jᵀ and J_p = e_i e_jᵀ − e_j e_iᵀ (the rotation-scalings aI + bJ on the pair), then
    the elementary matrices e_a e_bᵀ of gl(h − r) on the free coordinates (row-major). Dimension r + (h − r)²."""
    key = (int(h), pairing, None if rotary_dim is None or int(rotary_dim) == h else int(rotary_dim))
    if key not in _ROPE_BASES:
        pairs = rope_pairs(h, pairing, rotary_dim)
        r = 2 * len(pairs)
        entries = []
        for i, j in pairs:
            entries.append([(i, i, 1.0), (j, j, 1.0)])
            entries.append([(i, j, 1.0), (j, i, -1.0)])
        entries += [[(a, b, 1.0)] for a in range(r, h) for b in range(r, h)]
        _ROPE_BASES[key] = SparseBasis(h, entries)
    return _ROPE_BASES[key]


def subalgebra_system(Ls: Sequence[torch.Tensor], Ks: Sequence[torch.Tensor], basis: SparseBasis) -> torch.Tensor:
    r"""The matrix M of the projection system restricted to a subalgebra with basis (E_k):

        M_kl = Σ_i ⟨E_k, L_i E_l K_i⟩_F = Σ_i Σ_{u,v} s_ku s_lv L_i[r_ku, r_lv] K_i[c_lv, c_ku],

    shape (..., d, d), by gathering entries of the h×h factors (O(d² k²) work, O(d²) memory per head; no h×h
    products per basis element). Full-rotary RoPE: d = h, k = 2. Partial rotary: d = r + (h − r)², so a large free
    part makes this system (and its d³ solve in ``prepare``) the expensive step.
    When Σ_i L_i Λ K_i = C(v(Λ)) (the horizontal condition applied to a vertical vector), M_kl = g(v(E_l), v(E_k)):
    the metric's Gram matrix of the vertical vectors of the basis, symmetric positive definite."""
    ref = Ls[0]
    s, rows, cols, _, _ = basis._on(ref.dtype, ref.device)
    k = rows.shape[1]
    M = None
    for u in range(k):  # one (d, d) gather per pair of entry slots: memory O(d²) per head, not O(d² k²)
        ru, cu = rows[:, u, None], cols[:, u, None]
        for v in range(k):
            rv, cv = rows[None, :, v], cols[None, :, v]
            w = s[:, u, None] * s[None, :, v]
            for L, K in zip(Ls, Ks):
                term = L[..., ru, rv] * K[..., cv, cu] * w
                M = term if M is None else M + term
    return 0.5 * (M + M.mT)  # symmetric in exact arithmetic; remove the round-off asymmetry


def subalgebra_coordinates(C: torch.Tensor, basis: SparseBasis) -> torch.Tensor:
    """b_k = ⟨E_k, C⟩_F, shape (..., d)."""
    s, rows, cols, _, _ = basis._on(C.dtype, C.device)
    return (C[..., rows, cols] * s).sum(-1)


def subalgebra_element(coords: torch.Tensor, basis: SparseBasis) -> torch.Tensor:
    """Σ_k coords_k E_k, shape (..., h, h)."""
    dense = basis.dense(coords.dtype, coords.device)
    return (coords @ dense).reshape(*coords.shape[:-1], basis.h, basis.h)


def subalgebra_project(C: torch.Tensor, basis: SparseBasis) -> torch.Tensor:
    """Frobenius-orthogonal projection of C (..., h, h) onto the subalgebra (the basis is orthogonal)."""
    b = subalgebra_coordinates(C, basis) / basis.norm2(C.dtype, C.device)
    return subalgebra_element(b, basis)


def solve_subalgebra(Ls, Ks, C: torch.Tensor, basis: SparseBasis, M_inv: torch.Tensor | None = None) -> torch.Tensor:
    """Λ in the subalgebra with ⟨E_k, Σ_i L_i Λ K_i − C⟩_F = 0 for every basis element E_k:
    Λ = Σ_l λ_l E_l, M λ = b with M = :func:`subalgebra_system`, b = :func:`subalgebra_coordinates` (C).
    ``M_inv`` (from a base-point cache) replaces the solve by a matrix-vector product."""
    b = subalgebra_coordinates(C, basis)
    if M_inv is None:
        lam = torch.linalg.solve(subalgebra_system(Ls, Ks, basis), b)
    else:
        lam = (M_inv @ b.unsqueeze(-1)).squeeze(-1)
    return subalgebra_element(lam, basis)


def random_rope_element(ref: torch.Tensor, pairing: str, rotary_dim: int | None = None, generator=None,
                        scale: float = 1.0) -> torch.Tensor:
    """A random element of the RoPE commutant, shape ref.shape[:-2] + (h, h) (h = ref.shape[-1]): per pair
    ρ(cos φ I + sin φ J) with ρ ∈ [0.5, 2], φ ∈ [0, 2π), on the free coordinates Q·diag(u) with Q orthogonal,
    u ∈ [0.5, 2]; all times ``scale``. Condition number ≤ 4 whatever the scale."""
    h = ref.shape[-1]
    batch, dtype = ref.shape[:-2], ref.dtype
    pairs = rope_pairs(h, pairing, rotary_dim)
    r = 2 * len(pairs)
    A = torch.zeros(*batch, h, h, dtype=dtype)
    rho = 0.5 + 1.5 * torch.rand(*batch, len(pairs), generator=generator, dtype=dtype)
    phi = 2 * math.pi * torch.rand(*batch, len(pairs), generator=generator, dtype=dtype)
    for p, (i, j) in enumerate(pairs):
        a, b = rho[..., p] * torch.cos(phi[..., p]), rho[..., p] * torch.sin(phi[..., p])
        A[..., i, i], A[..., j, j], A[..., i, j], A[..., j, i] = a, a, b, -b
    if h > r:
        f = h - r
        Q, R = torch.linalg.qr(torch.randn(*batch, f, f, generator=generator, dtype=dtype))
        Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
        u = 0.5 + 1.5 * torch.rand(*batch, f, generator=generator, dtype=dtype)
        A[..., r:, r:] = Q * u.unsqueeze(-2)
    return (scale * A).to(ref.device)
