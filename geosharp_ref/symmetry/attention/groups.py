r"""GL(h) pair groups of a model's parameters: pieces, groups, hand-declared pairs, the symmetry map.

Canonical block: a function that uses G ∈ R^{n×h} and H ∈ R^{m×h} only through G Hᵀ is invariant under

    ψ(A, (G, H)) = (G A, H A⁻ᵀ),        A ∈ GL(h).

A :class:`Piece` is one head-major slice of one parameter seen as per-head blocks; a :class:`Side` row-
concatenates pieces into G (or H); a :class:`PairGroup` is all heads of one pair kind ("qk" or "vo") of
one attention module; :class:`SymmetryMap` holds the groups of a model plus the parameters left to the
adaptive geometry. How attention layers are recognised, and which pairs are refused, is
:mod:`geosharp_ref.symmetry.attention.detect`; the mathematics of the pairs is written out there.

A :class:`PairGroup` is a :class:`~geosharp_ref.symmetry.binding.Binding`: its blocks are (G, H), its
``kernels`` the GL(h) pair geometry (``"gl_mix"`` by default, :meth:`PairGroup.with_metric`), its ``act`` the
action above with one A per head.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Optional

import torch
from torch import Tensor

from ...kernels import gl_kernels, load_kernels
from ...sampling import orbit_element
from ..summary import summary_lines

__all__ = ["Piece", "Side", "PairGroup", "PairSpec", "SymmetryMap", "coverage_counts_from_pieces", "Params"]

Params = dict[str, Tensor]
# --------------------------------------------------------------------------------------------
# Parameter pieces: one head-major slice of one parameter, seen as per-head blocks (heads, R, h).
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """Slice ``[start, start + heads·h)`` along ``axis`` of parameter ``name`` (of shape ``shape``).

    Channel ``start + i·h + k`` is head i, head coordinate k.  The block of head i is the slice
    with the head axis moved last and every other axis flattened into rows: shape (rows, h), so
    ``block(P)`` has shape (heads, rows, h).

    ``stride`` > 0: the heads are not contiguous but ``stride`` channels apart, channel
    ``start + i·stride + k`` (a per-head interleaved fused projection, GPT-NeoX's ``query_key_value``:
    head i holds [q_i | k_i | v_i], stride 3h).
    """

    name: str
    shape: tuple[int, ...]
    axis: int
    start: int
    heads: int
    h: int
    stride: int = 0

    @property
    def length(self) -> int:
        return self.heads * self.h

    @property
    def rows(self) -> int:
        r = 1
        for a, s in enumerate(self.shape):
            if a != self.axis:
                r *= s
        return r

    def channels(self, device=None) -> Tensor:
        """The channel indices along ``axis``, head-major (heads·h,)."""
        step = self.stride or self.h
        return (self.start + step * torch.arange(self.heads, device=device)[:, None]
                + torch.arange(self.h, device=device)[None, :]).reshape(-1)

    def take(self, T: Tensor) -> Tensor:
        """The covered slice of ``T`` (a tensor of the parameter's shape) along ``axis``."""
        if not self.stride:
            return T.narrow(self.axis, self.start, self.length)
        return T.index_select(self.axis, self.channels(T.device))

    def _check(self, P: Tensor) -> None:
        if tuple(P.shape) != self.shape:
            raise ValueError(
                f"parameter {self.name!r} has shape {tuple(P.shape)}, expected {self.shape}"
            )

    def block(self, P: Tensor) -> Tensor:
        """(heads, rows, h) view-like copy of the slice; differentiable."""
        self._check(P)
        X = self.take(P).movedim(self.axis, -1)
        return X.reshape(-1, self.heads, self.h).permute(1, 0, 2)

    def write(self, P: Tensor, B: Tensor) -> Tensor:
        """A new tensor equal to P with the slice replaced by blocks B (heads, rows, h)."""
        self._check(P)
        moved = [s for a, s in enumerate(self.shape) if a != self.axis] + [self.length]
        X = B.permute(1, 0, 2).reshape(moved).movedim(-1, self.axis).to(P.dtype)
        if self.stride:
            return P.index_copy(self.axis, self.channels(P.device), X)
        size = self.shape[self.axis]
        if self.start == 0 and self.length == size:
            return X  # the whole axis: no copy into P (X may be a strided view; torch ops accept it)
        parts = [
            P.narrow(self.axis, 0, self.start),
            X,
            P.narrow(self.axis, self.start + self.length, size - self.start - self.length),
        ]
        return torch.cat(parts, dim=self.axis)

    def mark(self, counts: Tensor) -> None:
        """Add 1 to ``counts`` (the parameter's shape) on the covered elements, in place."""
        if not self.stride:
            counts.narrow(self.axis, self.start, self.length).add_(1)
        else:
            counts.movedim(self.axis, -1)[..., self.channels()] += 1

    def describe(self) -> str:
        idx = [":"] * len(self.shape)
        idx[self.axis] = (f"{self.start}:{self.start + self.length}" if not self.stride else
                          f"{self.start}+{self.stride}i:{self.start}+{self.stride}i+{self.h} for i<{self.heads}")
        return f"{self.name}[{', '.join(idx)}]"


@dataclass(frozen=True)
class Side:
    """One side (G or H) of a group: pieces row-concatenated per head, then ``stack`` consecutive
    heads row-stacked into one group head (grouped-query attention; stack = 1 otherwise)."""

    pieces: tuple[Piece, ...]
    stack: int = 1

    @property
    def heads(self) -> int:
        return self.pieces[0].heads

    @property
    def h(self) -> int:
        return self.pieces[0].h

    @property
    def rows(self) -> int:
        return self.stack * sum(p.rows for p in self.pieces)

    def extract(self, params: Mapping[str, Tensor]) -> Tensor:
        X = torch.cat([p.block(params[p.name]) for p in self.pieces], dim=1)  # (heads, R, h)
        return X.reshape(self.heads // self.stack, self.rows, self.h)

    def insert(self, params: Params, X: Tensor) -> None:
        """Write X (heads/stack, rows, h) into ``params`` (a dict owned by the caller)."""
        X = X.reshape(self.heads, self.rows // self.stack, self.h)
        blocks = torch.split(X, [p.rows for p in self.pieces], dim=1)
        for p, B in zip(self.pieces, blocks):
            params[p.name] = p.write(params[p.name], B)


# --------------------------------------------------------------------------------------------
# Public classes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairGroup:
    r"""All heads of one GL(h) pair kind ("qk" or "vo") of one attention module.

    Attributes:
        key: stable unique id, ``"<module path>:<kind>"``.
        layer: module path of the attention module (``""`` for a bare attention module).
        layer_index: last integer in ``layer`` (the block index), or None.
        kind: ``"qk"`` or ``"vo"``.
        num_heads: number of GL(h) blocks (KV heads under grouped-query attention).
        head_dim: h.
        n, m: rows of G and H, bias rows included.
        param_names: parameters this group covers, fully or partly.
        source: ``"auto:<ModuleClass>"`` or ``"user"``.
        kernels: the geometry that quotients it (a :class:`~geosharp_ref.symmetry.binding.Binding`'s
            ``kernels``): ``"gl_mix"`` (default), ``"gl_inv"``, or a generated module for a ``gl_pair``
            metric; :meth:`with_metric` or ``dataclasses.replace`` sets it. For a rotary Q/K pair
            ``"rope_<pairing>_<metric>"``.
        rotary: None for a GL(h) pair; ``(pairing, rotary_dim)`` for the Q/K pair of a rotary attention
            layer (``pairing`` ``"half"`` for Hugging Face ``rotate_half``, ``"interleaved"`` for
            ``rotate_every_two``; ``rotary_dim`` r, the first r head coordinates rotated): the group is
            then the RoPE subgroup of GL(h) (per frequency pair a rotation-scaling, GL(h − r) on the free
            coordinates; :mod:`~geosharp_ref.symmetry.attention.rope`), its kernels
            ``rope_<pairing>_<metric>`` and :attr:`kernel_options` ``{"rotary_dim": r}``.

    For every head i the model depends on this group only through G_i H_iᵀ, so
    ``(G, H) ↦ (G A, H A⁻ᵀ)`` with A of shape (num_heads, h, h) leaves it unchanged (for a rotary pair:
    through G_i R H_iᵀ for every rotation R, so A must commute with the rotations).
    """

    key: str
    layer: str
    layer_index: Optional[int]
    kind: str
    num_heads: int
    head_dim: int
    n: int
    m: int
    param_names: tuple[str, ...]
    source: str
    _g: Side = field(repr=False)
    _h: Side = field(repr=False)
    kernels: object = "gl_mix"
    rotary: Optional[tuple] = None

    def __post_init__(self):
        if self.rotary is not None and self.kernels == "gl_mix":  # the default: the subgroup's own kernels
            object.__setattr__(self, "kernels", f"rope_{self.rotary[0]}_mix")

    @property
    def kernel_options(self) -> dict:
        """Extra keyword arguments of the kernels' ``prepare`` (and uncached calls): ``{"rotary_dim": r}`` for
        a rotary pair, none for a GL(h) pair."""
        return {} if self.rotary is None else {"rotary_dim": self.rotary[1]}

    @property
    def group_name(self) -> str:
        """``"GL(h)"``, or ``"RoPE-<pairing>(r) ⊂ GL(h)"`` for a rotary pair."""
        if self.rotary is None:
            return f"GL({self.head_dim})"
        return f"RoPE-{self.rotary[0]}(r={self.rotary[1]}) ⊂ GL({self.head_dim})"

    def with_metric(self, metric) -> "PairGroup":
        """The same group quotiented by ``gl_<metric>`` (``"inv"``/``"mix"``), or by a kernel module given as is;
        a rotary pair by ``rope_<pairing>_<metric>`` (a module given is refused: its metric is declared for
        the full GL(h))."""
        if self.rotary is not None:
            if not isinstance(metric, str):
                raise ValueError(f"{self.key}: a rotary Q/K pair is quotiented by the built-in "
                                 f"rope_{self.rotary[0]}_<inv|mix> kernels, not by a declared gl_pair metric")
            return replace(self, kernels=f"rope_{self.rotary[0]}_{metric}")
        return replace(self, kernels=gl_kernels(metric))

    def extract(self, params: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """``(G, H)`` of shapes (num_heads, n, h), (num_heads, m, h); differentiable, no in-place."""
        return self._g.extract(params), self._h.extract(params)

    def insert(self, params: Mapping[str, Tensor], blocks, H: Optional[Tensor] = None) -> Params:
        """A NEW dict: ``params`` with the covered parts rebuilt from ``blocks = (G, H)``, G (num_heads, n, h)
        and H (num_heads, m, h); uncovered parts and other entries are passed through.  Only the
        covered slices change, so several groups sharing a parameter (a fused ``in_proj_weight``,
        or W_O whose bias stays adaptive) compose when inserted one after another.

        ``insert(params, (G, H))`` is the :class:`~geosharp_ref.symmetry.binding.Binding` form;
        ``insert(params, G, H)`` (the older form) is accepted too."""
        G, H = (blocks, H) if H is not None else tuple(blocks)
        h = self.head_dim
        if tuple(G.shape) != (self.num_heads, self.n, h):
            raise ValueError(f"{self.key}: G has shape {tuple(G.shape)}, expected {(self.num_heads, self.n, h)}")
        if tuple(H.shape) != (self.num_heads, self.m, h):
            raise ValueError(f"{self.key}: H has shape {tuple(H.shape)}, expected {(self.num_heads, self.m, h)}")
        out = dict(params)
        self._g.insert(out, G)
        self._h.insert(out, H)
        return out

    def act(self, params: Mapping[str, Tensor], A: Tensor) -> Params:
        """ψ(A, θ): per head i, (G_i, H_i) ↦ (G_i A_i, H_i A_i⁻ᵀ), A of shape (num_heads, h, h)."""
        if tuple(A.shape) != (self.num_heads, self.head_dim, self.head_dim):
            raise ValueError(f"{self.key}: A has shape {tuple(A.shape)}, expected "
                             f"{(self.num_heads, self.head_dim, self.head_dim)}")
        G, H = self.extract(params)
        A = A.to(device=G.device, dtype=G.dtype)  # an element drawn on the CPU follows the parameters
        return self.insert(params, (G @ A, torch.linalg.solve(A, H.mT).mT))

    def random_element(self, params: Mapping[str, Tensor], scale: float = 1.0, seed: int = 0) -> Tensor:
        """A = scale · Q·diag(u) per head (:func:`~geosharp_ref.sampling.orbit_element`), shape (num_heads, h, h);
        for a rotary pair an element of the RoPE subgroup (the kernels' ``random_group_element``)."""
        G, _ = self.extract(params)
        gen = torch.Generator().manual_seed(seed)
        return self.orbit_element(scale, gen, G.dtype).to(G.device)

    def orbit_element(self, scale: float, generator, dtype=torch.float64) -> Tensor:
        """A random element of this pair's group, (num_heads, h, h), condition number ≤ 4, times ``scale``."""
        if self.rotary is None:
            return orbit_element(self.num_heads, self.head_dim, scale, generator, dtype)
        ref = torch.zeros(self.num_heads, 1, self.head_dim, dtype=dtype)
        mod = load_kernels(f"rope_{self.rotary[0]}_mix")
        return mod.random_group_element(ref, generator=generator, scale=scale, rotary_dim=self.rotary[1])

    def pieces(self) -> list[str]:
        """Human-readable slices covered, e.g. ``'attn.in_proj_weight[0:16, :]'``."""
        return [p.describe() for side in (self._g, self._h) for p in side.pieces]


@dataclass(frozen=True)
class PairSpec:
    r"""A hand-declared GL(h) pair of parameters (for a user's own module).

    ``G`` and ``H`` name weight parameters (names as in ``model.named_parameters()``); the
    pair has ``num_heads`` heads; h is inferred from the shapes.

    Layouts say how a parameter stores its linear map: ``"out_in"`` as ``nn.Linear.weight``
    (shape (out, in), y = x Wᵀ), ``"in_out"`` as x @ W / HF ``Conv1D`` (shape (in, out)).

    * ``kind="qk"`` (default): both G and H map *into* the head space (like W_Q, W_K); the head
      channels are their outputs.  G_i = W[i·h:(i+1)·h, :]ᵀ for "out_in", W[:, i·h:(i+1)·h] for
      "in_out".  The optional biases ``g_bias``, ``h_bias`` (shape (num_heads·h,)) add one row.
    * ``kind="vo"``: G maps into the head space (W_V, as above), H maps *out of* it (W_O): its
      head channels are its inputs, H_i = W[:, i·h:(i+1)·h] for "out_in", W[i·h:(i+1)·h, :]ᵀ for
      "in_out".  ``h_bias`` must be None (the output bias is outside every head).

    The user is responsible for the model depending on them only through G_i H_iᵀ per head.
    """

    G: str
    H: str
    num_heads: int
    g_bias: Optional[str] = None
    h_bias: Optional[str] = None
    g_layout: str = "out_in"
    h_layout: str = "out_in"
    kind: str = "qk"
    name: Optional[str] = None  # key prefix; default: G's module path


class SymmetryMap:
    r"""The GL(h) groups of a model plus the parameters left to the adaptive geometry.

    Attributes:
        groups: list of :class:`PairGroup` (each a GL(h) block per head).
        adaptive: names of parameters (or parts ``'name[0:32, :]'``) covered by no group.
        adaptive_masks: name → bool mask of the adaptive elements, or None for the whole tensor.
        refused: list of ``(key, reason)`` for pairs that were recognised but not mapped.
        param_shapes: name → shape of every parameter of the model.
    """

    def __init__(self, groups, param_shapes, refused):
        self.groups: list[PairGroup] = list(groups)
        self.param_shapes: dict[str, tuple[int, ...]] = dict(param_shapes)
        self.refused: list[tuple[str, str]] = list(refused)
        keys = [g.key for g in self.groups]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate group keys: {keys}")
        covered = coverage_counts_from_pieces(self.groups, self.param_shapes)
        for name, c in covered.items():
            if c is not None and int(c.max()) > 1:
                raise ValueError(f"parameter {name!r} is covered by more than one GL(h) group")
        self.adaptive_masks: dict[str, Optional[Tensor]] = {}
        self.adaptive: list[str] = []
        for name, shape in self.param_shapes.items():
            c = covered.get(name)
            if c is None:
                self.adaptive_masks[name] = None
                self.adaptive.append(name)
            elif int(c.min()) == 0:
                mask = c == 0
                self.adaptive_masks[name] = mask
                self.adaptive.append(_describe_mask(name, mask))

    def group(self, key: str) -> PairGroup:
        for g in self.groups:
            if g.key == key:
                return g
        raise KeyError(key)

    def act(self, params: Mapping[str, Tensor], A_per_group) -> Params:
        r"""ψ(A, θ): per group and head i, (G_i, H_i) ↦ (G_i A_i, H_i A_i⁻ᵀ).

        ``A_per_group``: a mapping key → A, or a sequence aligned with :attr:`groups`; each A has
        shape (num_heads, h, h).  Groups absent from a mapping (or given None) are unchanged.
        Returns a new dict; differentiable."""
        if isinstance(A_per_group, Mapping):
            unknown = set(A_per_group) - {g.key for g in self.groups}
            if unknown:
                raise KeyError(f"unknown group keys: {sorted(unknown)}")
            pairs = [(g, A_per_group.get(g.key)) for g in self.groups]
        else:
            As = list(A_per_group)
            if len(As) != len(self.groups):
                raise ValueError(f"got {len(As)} matrices for {len(self.groups)} groups")
            pairs = list(zip(self.groups, As))
        out = dict(params)
        for g, A in pairs:
            if A is not None:
                out = g.act(out, A)
        return out

    def coverage_counts(self, params: Optional[Mapping[str, Tensor]] = None) -> dict[str, Tensor]:
        """name → int tensor: how many times each element is covered (groups, through their own
        ``insert``, plus the adaptive masks).  Exactly 1 everywhere for a consistent map."""
        shapes = self.param_shapes if params is None else {k: tuple(v.shape) for k, v in params.items()}
        counts = {k: torch.zeros(s, dtype=torch.long) for k, s in shapes.items()}
        for g in self.groups:
            zeros = {k: torch.zeros(shapes[k], dtype=torch.float64) for k in g.param_names}
            ones = g.insert(zeros, (torch.ones(g.num_heads, g.n, g.head_dim, dtype=torch.float64),
                                    torch.ones(g.num_heads, g.m, g.head_dim, dtype=torch.float64)))
            for k in g.param_names:
                counts[k] += ones[k].round().long()
        for k, mask in self.adaptive_masks.items():
            counts[k] += 1 if mask is None else mask.long()
        return counts

    def __str__(self) -> str:
        cols = ("layer", "kind", "heads", "head dim", "G shape", "H shape", "geometry")
        rows = [
            (g.layer or "<root>", g.kind, str(g.num_heads), str(g.head_dim),
             str((g.num_heads, g.n, g.head_dim)), str((g.num_heads, g.m, g.head_dim)),
             f"{g.group_name} per head")
            for g in self.groups
        ]
        widths = [max([len(c)] + [len(r[j]) for r in rows]) for j, c in enumerate(cols)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        n_adapt = sum(
            _numel(self.param_shapes[k]) if m is None else int(m.sum())
            for k, m in self.adaptive_masks.items()
        )
        n_total = sum(_numel(s) for s in self.param_shapes.values())
        n_rope = sum(1 for g in self.groups if g.rotary is not None)
        lines = [
            f"SymmetryMap: {len(self.groups)} GL(h) groups"
            + (f" ({n_rope} of them under the RoPE subgroup)" if n_rope else "") + f", {len(self.refused)} refused, "
            f"{len(self.adaptive)} adaptive entries ({n_adapt} of {n_total} elements)",
            fmt.format(*cols).rstrip(),
            "  ".join("-" * w for w in widths),
        ]
        lines += [fmt.format(*r).rstrip() for r in rows]
        if self.refused:
            lines.append("refused (adaptive instead):")
            lines += summary_lines(self.refused)  # one line per reason repeated over layers
        return "\n".join(lines)

    __repr__ = __str__


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def coverage_counts_from_pieces(groups, shapes) -> dict[str, Tensor]:
    counts: dict[str, Tensor] = {}
    for g in groups:
        for side in (g._g, g._h):
            for p in side.pieces:
                if p.name not in shapes:
                    raise ValueError(f"group {g.key}: unknown parameter {p.name!r}")
                if tuple(shapes[p.name]) != p.shape:
                    raise ValueError(f"group {g.key}: parameter {p.name!r} has shape "
                                     f"{tuple(shapes[p.name])}, expected {p.shape}")
                c = counts.setdefault(p.name, torch.zeros(p.shape, dtype=torch.int32))
                p.mark(c)
    return counts


def _runs(v: Tensor) -> list[tuple[int, int]]:
    out, start = [], None
    for i, b in enumerate(v.tolist()):
        if b and start is None:
            start = i
        if not b and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(v)))
    return out


def _describe_mask(name: str, mask: Tensor) -> str:
    """'name[0:32, :]' when the mask varies along one axis only, else 'name[k of N elements]'."""
    for axis in range(mask.dim()):
        line = mask.movedim(axis, 0).reshape(mask.shape[axis], -1)
        if bool((line == line[:, :1]).all()):
            runs = _runs(line[:, 0])
            idx = [":"] * mask.dim()
            idx[axis] = ",".join(f"{a}:{b}" for a, b in runs)
            return f"{name}[{', '.join(idx)}]"
    return f"{name}[{int(mask.sum())} of {mask.numel()} elements]"
