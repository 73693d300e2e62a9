r"""Find the GL(h) attention symmetries of a torch model and group its parameters.

Canonical block (``shared/DESIGN.md``, "Canonical GL(h) block"): a function that uses
G ∈ R^{n×h} and H ∈ R^{m×h} only through G Hᵀ is invariant under

    ψ(A, (G, H)) = (G A, H A⁻ᵀ),        A ∈ GL(h).

In multi-head attention with head dimension h, input x ∈ R^d (a row vector) and head i:

* **Q/K pair.**  Scores are ``Q_i K_iᵀ = [x, 1] G_i H_iᵀ [x', 1]ᵀ`` with

      G_i = [W_Q^iᵀ ; b_Q^iᵀ] ∈ R^{(d+1)×h},   H_i = [W_K^iᵀ ; b_K^iᵀ] ∈ R^{(d'+1)×h}

  where W_Q^i ∈ R^{h×d} are the rows ``i·h … (i+1)·h−1`` of an ``nn.Linear`` weight (shape
  (out, in)) — for a GPT-2 ``Conv1D`` (weight (in, out), ``y = x W + b``) G_i is the column slice
  ``W[:, i·h:(i+1)·h]`` directly.  The bias row exists only when the projection has a bias.
  ``nn.MultiheadAttention(add_bias_kv=True)`` appends a learned key ``bias_k``; its head-i slice is
  one more row of H_i.

* **V/O pair.**  The head-i contribution to the attention output is
  ``P_i [x, 1] G_i H_iᵀ`` (P_i the attention weights) with

      G_i = [W_V^iᵀ ; b_V^iᵀ] ∈ R^{(d+1)×h},   H_i = W_O[:, i·h:(i+1)·h] ∈ R^{d_out×h}

  for an ``nn.Linear`` output projection (weight (d_out, N·h)); H_i is the slice of W_O's *input*
  columns for head i (for a ``Conv1D`` output projection, weight (N·h, d_out): H_i = W[i·h:(i+1)·h, :]ᵀ).
  The bias of the output projection is added once, outside every head: it is not part of a pair
  and stays in the adaptive geometry.  ``bias_v`` of ``nn.MultiheadAttention`` is one more row of G_i.

* **Grouped-query attention** (N query heads, K < N key/value heads, r = N / K, query head
  j·r + t uses KV head j, as in ``repeat_kv``).  Handled exactly, per KV head j:

      Q/K:  G_j = [G^Q_{jr} ; … ; G^Q_{jr+r−1}] ∈ R^{r(d+1)×h},  H_j = [W_K^jᵀ ; b_K^jᵀ]
      V/O:  G_j = [W_V^jᵀ ; b_V^jᵀ],  H_j = [W_O^{jr} ; … ; W_O^{jr+r−1}] ∈ R^{r·d_out×h}

  (row-stacking the r query-head blocks).  The model uses only G_j H_jᵀ, so a group has K heads.

* **Rotary position embeddings** rotate queries and keys per position, q ↦ q R_p, k ↦ k R_p, so
  scores use G_i R_{p−p'} H_iᵀ: invariant only for A that commute with every rotation R_θ, a
  proper subgroup of GL(h).  The Q/K pair of such a layer is *refused* (its weights go to the
  adaptive geometry); V/O is unaffected.  Normalisations of q/k inside the head (QK-norm) and
  non-absolute position encodings are refused for the same reason.

Refusals are conservative: Q/K is refused when the attention class's code names a rotary
embedding, its forward takes ``position_embeddings``/``freqs_cis``-like arguments, a rotary module
sits in the stack containing it, or its config declares rotary/relative positions.  A module
whose class name contains "Attention" but whose layout is not recognised (e.g. per-head interleaved
fused QKV as in GPT-NeoX) is refused as a whole; declare such pairs by hand with :class:`PairSpec`.

Every parameter (or part of one) that no group covers — output-projection biases, layer norms,
embeddings, MLPs, classifier, refused Q/K weights — is listed in :attr:`SymmetryMap.adaptive`
and gets the element-wise ("adaptive") geometry.

Public API: :class:`PairSpec`, :class:`PairGroup`, :class:`SymmetryMap`, :func:`symmetry_map`.
"""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor, nn

__all__ = ["PairSpec", "PairGroup", "SymmetryMap", "symmetry_map"]

Params = dict[str, Tensor]

# --------------------------------------------------------------------------------------------
# Parameter pieces: one head-major slice of one parameter, seen as per-head blocks (heads, R, h).
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    """Slice ``[start, start + heads·h)`` along ``axis`` of parameter ``name`` (of shape ``shape``).

    Channel ``start + i·h + k`` is head i, head coordinate k.  The block of head i is the slice
    with the head axis moved last and every other axis flattened into rows: shape (rows, h), so
    ``block(P)`` has shape (heads, rows, h).
    """

    name: str
    shape: tuple[int, ...]
    axis: int
    start: int
    heads: int
    h: int

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

    def _check(self, P: Tensor) -> None:
        if tuple(P.shape) != self.shape:
            raise ValueError(
                f"parameter {self.name!r} has shape {tuple(P.shape)}, expected {self.shape}"
            )

    def block(self, P: Tensor) -> Tensor:
        """(heads, rows, h) view-like copy of the slice; differentiable."""
        self._check(P)
        X = P.narrow(self.axis, self.start, self.length).movedim(self.axis, -1)
        return X.reshape(-1, self.heads, self.h).permute(1, 0, 2)

    def write(self, P: Tensor, B: Tensor) -> Tensor:
        """A new tensor equal to P with the slice replaced by blocks B (heads, rows, h)."""
        self._check(P)
        moved = [s for a, s in enumerate(self.shape) if a != self.axis] + [self.length]
        X = B.permute(1, 0, 2).reshape(moved).movedim(-1, self.axis).to(P.dtype)
        size = self.shape[self.axis]
        if self.start == 0 and self.length == size:
            return X  # the whole axis: no copy into P (X may be a strided view; torch ops accept it)
        parts = [
            P.narrow(self.axis, 0, self.start),
            X,
            P.narrow(self.axis, self.start + self.length, size - self.start - self.length),
        ]
        return torch.cat(parts, dim=self.axis)

    def describe(self) -> str:
        idx = [":"] * len(self.shape)
        idx[self.axis] = f"{self.start}:{self.start + self.length}"
        return f"{self.name}[{', '.join(idx)}]"


@dataclass(frozen=True)
class _Side:
    """One side (G or H) of a group: pieces row-concatenated per head, then ``stack`` consecutive
    heads row-stacked into one group head (grouped-query attention; stack = 1 otherwise)."""

    pieces: tuple[_Piece, ...]
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

    For every head i the model depends on this group only through G_i H_iᵀ, so
    ``(G, H) ↦ (G A, H A⁻ᵀ)`` with A of shape (num_heads, h, h) leaves it unchanged.
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
    _g: _Side = field(repr=False)
    _h: _Side = field(repr=False)

    def extract(self, params: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """``(G, H)`` of shapes (num_heads, n, h), (num_heads, m, h); differentiable, no in-place."""
        return self._g.extract(params), self._h.extract(params)

    def insert(self, params: Mapping[str, Tensor], G: Tensor, H: Tensor) -> Params:
        """A NEW dict: ``params`` with the covered parts rebuilt from G (num_heads, n, h) and
        H (num_heads, m, h); uncovered parts and other entries are passed through.  Only the
        covered slices change, so several groups sharing a parameter (a fused ``in_proj_weight``,
        or W_O whose bias stays adaptive) compose when inserted one after another."""
        h = self.head_dim
        if tuple(G.shape) != (self.num_heads, self.n, h):
            raise ValueError(f"{self.key}: G has shape {tuple(G.shape)}, expected {(self.num_heads, self.n, h)}")
        if tuple(H.shape) != (self.num_heads, self.m, h):
            raise ValueError(f"{self.key}: H has shape {tuple(H.shape)}, expected {(self.num_heads, self.m, h)}")
        out = dict(params)
        self._g.insert(out, G)
        self._h.insert(out, H)
        return out

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
        covered = _coverage_counts_from_pieces(self.groups, self.param_shapes)
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
            if A is None:
                continue
            if tuple(A.shape) != (g.num_heads, g.head_dim, g.head_dim):
                raise ValueError(f"{g.key}: A has shape {tuple(A.shape)}, expected "
                                 f"{(g.num_heads, g.head_dim, g.head_dim)}")
            G, H = g.extract(out)
            A = A.to(G.dtype)
            out = g.insert(out, G @ A, torch.linalg.solve(A, H.mT).mT)
        return out

    def coverage_counts(self, params: Optional[Mapping[str, Tensor]] = None) -> dict[str, Tensor]:
        """name → int tensor: how many times each element is covered (groups, through their own
        ``insert``, plus the adaptive masks).  Exactly 1 everywhere for a consistent map."""
        shapes = self.param_shapes if params is None else {k: tuple(v.shape) for k, v in params.items()}
        counts = {k: torch.zeros(s, dtype=torch.long) for k, s in shapes.items()}
        for g in self.groups:
            zeros = {k: torch.zeros(shapes[k], dtype=torch.float64) for k in g.param_names}
            ones = g.insert(zeros, torch.ones(g.num_heads, g.n, g.head_dim, dtype=torch.float64),
                            torch.ones(g.num_heads, g.m, g.head_dim, dtype=torch.float64))
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
             f"GL({g.head_dim}) per head")
            for g in self.groups
        ]
        widths = [max([len(c)] + [len(r[j]) for r in rows]) for j, c in enumerate(cols)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        n_adapt = sum(
            _numel(self.param_shapes[k]) if m is None else int(m.sum())
            for k, m in self.adaptive_masks.items()
        )
        n_total = sum(_numel(s) for s in self.param_shapes.values())
        lines = [
            f"SymmetryMap: {len(self.groups)} GL(h) groups, {len(self.refused)} refused, "
            f"{len(self.adaptive)} adaptive entries ({n_adapt} of {n_total} elements)",
            fmt.format(*cols).rstrip(),
            "  ".join("-" * w for w in widths),
        ]
        lines += [fmt.format(*r).rstrip() for r in rows]
        if self.refused:
            lines.append("refused (adaptive instead):")
            lines += [f"  {k}: {why}" for k, why in self.refused]
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


def _coverage_counts_from_pieces(groups, shapes) -> dict[str, Tensor]:
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
                c.narrow(p.axis, p.start, p.length).add_(1)
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


def _layer_index(path: str) -> Optional[int]:
    nums = [int(p) for p in path.split(".") if p.isdigit()]
    return nums[-1] if nums else None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@dataclass
class _Lin:
    """A linear-like module: weight name/shape, bias name, layout, in/out features."""

    path: str
    weight: str
    bias: Optional[str]
    layout: str  # "out_in" (nn.Linear) or "in_out" (Conv1D)
    in_features: int
    out_features: int
    wshape: tuple[int, ...]

    @property
    def out_axis(self) -> int:
        return 0 if self.layout == "out_in" else 1

    @property
    def in_axis(self) -> int:
        return 1 - self.out_axis


def _as_lin(path: str, mod: nn.Module) -> Optional[_Lin]:
    w = getattr(mod, "weight", None)
    if not isinstance(w, Tensor) or w.dim() != 2:
        return None
    b = getattr(mod, "bias", None)
    bname = _join(path, "bias") if isinstance(b, Tensor) else None
    if isinstance(mod, nn.Linear):
        return _Lin(path, _join(path, "weight"), bname, "out_in", w.shape[1], w.shape[0], tuple(w.shape))
    # transformers' Conv1D (GPT-2): weight (nx, nf), y = x W + b.  Recognised by structure.
    if type(mod).__name__ == "Conv1D" and getattr(mod, "nf", None) == w.shape[1] \
            and getattr(mod, "nx", None) == w.shape[0]:
        return _Lin(path, _join(path, "weight"), bname, "in_out", w.shape[0], w.shape[1], tuple(w.shape))
    return None


def _into_head(lin: _Lin, start: int, heads: int, h: int, bias_shape=None) -> list[_Piece]:
    """Pieces [W^iᵀ ; b^iᵀ] for a projection into head space, channels start … start+heads·h."""
    pieces = [_Piece(lin.weight, lin.wshape, lin.out_axis, start, heads, h)]
    if lin.bias is not None:
        pieces.append(_Piece(lin.bias, (lin.out_features,) if bias_shape is None else bias_shape,
                             0, start, heads, h))
    return pieces


def _out_of_head(lin: _Lin, heads: int, h: int) -> list[_Piece]:
    """Piece W_O[:, i·h:(i+1)·h] (d_out × h) of an output projection; its bias is not included."""
    return [_Piece(lin.weight, lin.wshape, lin.in_axis, 0, heads, h)]


def _make_group(path, kind, g_pieces, h_pieces, g_stack, h_stack, source) -> PairGroup:
    g, hs = _Side(tuple(g_pieces), g_stack), _Side(tuple(h_pieces), h_stack)
    assert g.h == hs.h and g.heads // g_stack == hs.heads // h_stack
    names = []
    for p in g.pieces + hs.pieces:
        if p.name not in names:
            names.append(p.name)
    return PairGroup(
        key=f"{path}:{kind}", layer=path, layer_index=_layer_index(path), kind=kind,
        num_heads=g.heads // g_stack, head_dim=g.h, n=g.rows, m=hs.rows,
        param_names=tuple(names), source=source, _g=g, _h=hs,
    )


# --------------------------------------------------------------------------------------------
# Refusal evidence
# --------------------------------------------------------------------------------------------

_ROTARY_CLASS = re.compile(r"[Rr]otary|RoPE|(?<![a-z])[Rr]ope(?![a-z])")
_ROTARY_IDENT = re.compile(r"rotary|freqs_cis|(?:^|_)rope(?:_|$)", re.IGNORECASE)


def _rotary_identifier(cls) -> Optional[str]:
    """First identifier (name, attribute, argument, function) of the class's code that names a
    rotary embedding (comments and docstrings are ignored), or None; None if there is no source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        for ident in (getattr(node, "id", None), getattr(node, "attr", None), getattr(node, "arg", None),
                      node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None):
            if isinstance(ident, str) and (_ROTARY_IDENT.search(ident) or _ROTARY_CLASS.search(ident)):
                return ident
    return None
_ROTARY_ARGS = ("position_embeddings", "rotary_pos_emb", "rotary_emb", "freqs_cis", "rope",
                "cos", "sin")
_REL_POS = ("rotary", "relative_key", "relative_key_query", "relative")


def _qk_refusal(mod: nn.Module, path: str, configs, model_rotary, qk_norms=()) -> Optional[str]:
    why = []
    try:
        params = inspect.signature(type(mod).forward).parameters
        hit = [a for a in _ROTARY_ARGS if a in params]
        if hit:
            why.append(f"forward takes {hit[0]!r}")
    except (TypeError, ValueError):
        pass
    ident = _rotary_identifier(type(mod))
    if ident:
        why.append(f"its code uses {ident!r}")
    for rpath, rname in model_rotary:
        scope = rpath.rpartition(".")[0]
        if not scope or path == scope or path.startswith(scope + "."):
            why.append(f"{rname} at {rpath or '<root>'} feeds the stack containing it")
            break
    for cfg in configs:
        pet = getattr(cfg, "position_embedding_type", None)
        if isinstance(pet, str) and pet.lower() in _REL_POS:
            why.append(f"config.position_embedding_type={pet!r}")
        if getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_theta", None) \
                or getattr(cfg, "rotary_dim", None):
            why.append("config has rotary parameters")
    if why:
        return ("rotary/relative position encoding (" + "; ".join(dict.fromkeys(why)) + "): scores use "
                "G R_{p-p'} Hᵀ, invariant only under A commuting with the rotations (a subgroup of "
                "GL(h)), so Q/K is not a GL(h) pair; its weights stay adaptive")
    if qk_norms:
        return (f"normalisation inside the Q/K path ({', '.join(qk_norms)}): scores are not a function "
                f"of G Hᵀ alone, so Q/K is not a GL(h) pair; its weights stay adaptive")
    return None


def _is_norm(name: str, mod: nn.Module) -> bool:
    return "norm" in type(mod).__name__.lower() or "norm" in name.lower()


_QK_NORM = re.compile(r"^(q|k|query|key)_?(layer_?)?norm", re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# Recognisers
# --------------------------------------------------------------------------------------------

_Q = ("q_proj", "query", "q_lin", "q", "to_q", "wq", "q_attn", "query_proj")
_K = ("k_proj", "key", "k_lin", "k", "to_k", "wk", "key_proj")
_V = ("v_proj", "value", "v_lin", "v", "to_v", "wv", "value_proj")
_O = ("o_proj", "out_proj", "c_proj", "out_lin", "o", "wo", "dense", "proj", "output_proj")
_FUSED = ("c_attn", "qkv", "qkv_proj", "Wqkv", "wqkv", "to_qkv", "in_proj", "kv", "kv_proj")
_HEADS = ("num_heads", "num_attention_heads", "n_heads", "n_head", "nhead")
_HEAD_DIM = ("head_dim", "attention_head_size", "head_size", "d_head", "d_k")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_kv_head")


def _int_attr(objs, names) -> Optional[int]:
    for o in objs:
        if o is None:
            continue
        for n in names:
            v = getattr(o, n, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


class _Found:
    def __init__(self):
        self.groups: list[PairGroup] = []
        self.refused: list[tuple[str, str]] = []
        self.matched: set[str] = set()


def _match_mha(path: str, mod: nn.MultiheadAttention, found: _Found) -> None:
    E, N = mod.embed_dim, mod.num_heads
    h = E // N
    src = f"auto:{type(mod).__name__}"
    bias_shape = (3 * E,)
    b = _join(path, "in_proj_bias") if mod.in_proj_bias is not None else None
    if mod._qkv_same_embed_dim:
        W = _Lin(path, _join(path, "in_proj_weight"), b, "out_in", E, 3 * E, (3 * E, E))
        q = _into_head(W, 0, N, h, bias_shape)
        k = _into_head(W, E, N, h, bias_shape)
        v = _into_head(W, 2 * E, N, h, bias_shape)
    else:
        parts = []
        for i, nm in enumerate(("q_proj_weight", "k_proj_weight", "v_proj_weight")):
            w = getattr(mod, nm)
            lin = _Lin(path, _join(path, nm), b, "out_in", w.shape[1], E, tuple(w.shape))
            parts.append([_Piece(lin.weight, lin.wshape, 0, 0, N, h)]
                         + ([_Piece(b, bias_shape, 0, i * E, N, h)] if b else []))
        q, k, v = parts
    if mod.bias_k is not None:  # learned extra key / value (1, 1, E): one more row of H / G
        k = k + [_Piece(_join(path, "bias_k"), (1, 1, E), 2, 0, N, h)]
        v = v + [_Piece(_join(path, "bias_v"), (1, 1, E), 2, 0, N, h)]
    o = _as_lin(_join(path, "out_proj"), mod.out_proj)
    found.groups.append(_make_group(path, "qk", q, k, 1, 1, src))
    found.groups.append(_make_group(path, "vo", v, _out_of_head(o, N, h), 1, 1, src))
    found.matched.add(path)


def _child_lins(mod: nn.Module, path: str) -> dict[str, _Lin]:
    out = {}
    for n, c in mod.named_children():
        lin = _as_lin(_join(path, n), c)
        if lin is not None:
            out[n] = lin
    return out


def _first(lins: dict[str, _Lin], aliases) -> Optional[tuple[str, _Lin]]:
    for a in aliases:
        if a in lins:
            return a, lins[a]
    return None


def _match_projections(path, mod, parent, parent_path, model_cfg, model_rotary, found) -> None:
    lins = _child_lins(mod, path)
    q, k, v = _first(lins, _Q), _first(lins, _K), _first(lins, _V)
    fused = _first(lins, _FUSED)
    if not ((q and k and v) or fused):
        return
    src = f"auto:{type(mod).__name__}"
    cfg = getattr(mod, "config", None)
    configs = [c for c in (cfg, model_cfg) if c is not None]
    h = _int_attr([mod], _HEAD_DIM)
    N = _int_attr([mod] + configs, _HEADS)
    Kh = _int_attr([mod] + configs, _KV_HEADS)
    used = set()

    def refuse_all(reason):
        found.refused.append((f"{path}:qk", reason))
        found.refused.append((f"{path}:vo", reason))
        found.matched.add(path)

    # -- query / key / value projections: (lin, channel offset, out width) --
    if q and k and v:
        used |= {q[0], k[0], v[0]}
        q_out, k_out, v_out = q[1].out_features, k[1].out_features, v[1].out_features
        qlin, klin, vlin = q[1], k[1], v[1]
        q_off = k_off = v_off = 0
    else:
        used.add(fused[0])
        F = fused[1]
        if q:  # separate query, fused key/value (GPT-2 cross-attention)
            used.add(q[0])
            qlin, q_off, q_out = q[1], 0, q[1].out_features
            if F.out_features % 2:
                return refuse_all(f"fused projection {fused[0]} width {F.out_features} not 2·d")
            k_out = v_out = F.out_features // 2
            klin = vlin = F
            k_off, v_off = 0, k_out
        else:
            if h is None and N is not None and F.out_features % 3 == 0:
                h = F.out_features // 3 // N
            if h is None:
                return refuse_all("head dimension unknown for the fused projection")
            Nq = N if N is not None else None
            Nk = Kh if Kh is not None else Nq
            if Nq is None or (Nq + 2 * Nk) * h != F.out_features:
                return refuse_all(f"fused projection {fused[0]} of width {F.out_features} does not "
                                  f"split as [Q | K | V] with the known head counts")
            q_out, k_out, v_out = Nq * h, Nk * h, Nk * h
            qlin = klin = vlin = F
            q_off, k_off, v_off = 0, q_out, q_out + k_out

    # -- head counts --
    if h is None:
        if N is None:
            return refuse_all("number of heads unknown (declare the pairs with pairs=[PairSpec(...)])")
        h = q_out // N
    if N is None:
        N = q_out // h
    if N * h != q_out or k_out % h:
        return refuse_all(f"projection widths (q {q_out}, k {k_out}) do not match {N} heads × {h}")
    K = k_out // h
    if Kh is not None and Kh != K and Kh != N:
        return refuse_all(f"num_key_value_heads={Kh} disagrees with the key width {k_out} (head dim {h})")
    if N % K or v_out % K:
        return refuse_all(f"{N} query heads, {K} key heads, value width {v_out}: no head grouping")
    r = N // K
    hv = v_out // K

    # -- output projection: a direct child, else a linear under the parent (BERT's output.dense) --
    o = None
    for a in _O:
        if a in lins and a not in used and lins[a].in_features == N * hv:
            o = (a, lins[a])
            break
    if o is None and parent is not None:
        rel = path[len(parent_path) + 1:] if parent_path else path
        cands = []
        for n, c in parent.named_modules():
            if not n or n == rel or n.startswith(rel + ".") or n.count(".") > 1:
                continue
            lin = _as_lin(_join(parent_path, n), c)
            if lin is not None and n.split(".")[-1] in _O and lin.in_features == N * hv:
                cands.append(lin)
        if len(cands) == 1:
            o = ("<parent>", cands[0])
    if o is not None:
        used.add(o[0])

    extra, qk_norms = [], []
    for n, c in mod.named_children():
        if n in used or not any(True for _ in c.parameters()) or _ROTARY_CLASS.search(type(c).__name__):
            continue
        if _is_norm(n, c) and _QK_NORM.match(n):
            qk_norms.append(n)
        else:
            extra.append(n)
    extra += [n for n, _ in mod.named_parameters(recurse=False)]
    if extra:
        return refuse_all(f"unrecognised parameters in the attention module ({', '.join(extra)}) "
                          f"may act between the projections")

    found.matched.add(path)
    why = _qk_refusal(mod, path, configs, model_rotary, qk_norms)
    if why:
        found.refused.append((f"{path}:qk", why))
    else:
        found.groups.append(_make_group(
            path, "qk", _into_head(qlin, q_off, N, h), _into_head(klin, k_off, K, h), r, 1, src))
    if o is None:
        found.refused.append((f"{path}:vo", "no output projection found (in_features = heads × head dim)"))
    else:
        found.groups.append(_make_group(
            path, "vo", _into_head(vlin, v_off, K, hv), _out_of_head(o[1], N, hv), 1, r, src))


# --------------------------------------------------------------------------------------------
# User-declared pairs
# --------------------------------------------------------------------------------------------


def _spec_group(spec: PairSpec, named: Mapping[str, Tensor]) -> PairGroup:
    if spec.kind not in ("qk", "vo"):
        raise ValueError(f"PairSpec.kind must be 'qk' or 'vo', got {spec.kind!r}")
    for lay in (spec.g_layout, spec.h_layout):
        if lay not in ("out_in", "in_out"):
            raise ValueError(f"PairSpec layout must be 'out_in' or 'in_out', got {lay!r}")
    for nm in (spec.G, spec.H, spec.g_bias, spec.h_bias):
        if nm is not None and nm not in named:
            raise ValueError(f"PairSpec: the model has no parameter {nm!r}")
    if spec.num_heads < 1:
        raise ValueError("PairSpec.num_heads must be positive")
    G, H = named[spec.G], named[spec.H]
    for nm, t in ((spec.G, G), (spec.H, H)):
        if t.dim() != 2:
            raise ValueError(f"PairSpec: {nm!r} must be a 2-D weight, got shape {tuple(t.shape)}")
    g_axis = 0 if spec.g_layout == "out_in" else 1              # head channels = outputs
    if spec.kind == "qk":
        h_axis = 0 if spec.h_layout == "out_in" else 1          # outputs
    else:
        h_axis = 1 if spec.h_layout == "out_in" else 0          # inputs of the output projection
    width = G.shape[g_axis]
    if width % spec.num_heads:
        raise ValueError(f"PairSpec: G {spec.G!r} has shape {tuple(G.shape)}: its {width} head channels "
                         f"(axis {g_axis}) are not divisible by num_heads={spec.num_heads}")
    if H.shape[h_axis] != width:
        raise ValueError(
            f"PairSpec: shape mismatch between G {spec.G!r} {tuple(G.shape)} ({width} head channels on "
            f"axis {g_axis}, layout {spec.g_layout}) and H {spec.H!r} {tuple(H.shape)} "
            f"({H.shape[h_axis]} head channels on axis {h_axis}, layout {spec.h_layout}, kind {spec.kind})")
    N, h = spec.num_heads, width // spec.num_heads
    if spec.kind == "vo" and spec.h_bias is not None:
        raise ValueError("PairSpec: kind='vo' takes no h_bias (the output bias is outside every head)")
    gp = [_Piece(spec.G, tuple(G.shape), g_axis, 0, N, h)]
    hp = [_Piece(spec.H, tuple(H.shape), h_axis, 0, N, h)]
    for bname, pieces, wname, wshape in ((spec.g_bias, gp, spec.G, G.shape), (spec.h_bias, hp, spec.H, H.shape)):
        if bname is None:
            continue
        b = named[bname]
        if tuple(b.shape) != (width,):
            raise ValueError(f"PairSpec: bias {bname!r} has shape {tuple(b.shape)}, expected ({width},) "
                             f"to match {wname!r} {tuple(wshape)}")
        pieces.append(_Piece(bname, (width,), 0, 0, N, h))
    path = spec.name or spec.G.rpartition(".")[0]
    return _make_group(path, spec.kind, gp, hp, 1, 1, "user")


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def symmetry_map(model: nn.Module, pairs: Optional[Sequence[PairSpec]] = None, *,
                 detect: bool = True) -> SymmetryMap:
    r"""Find every GL(h) pair of ``model`` (per attention module: "qk" and "vo", all heads stacked).

    Detection is structural: ``nn.MultiheadAttention``; otherwise any module with child
    projections (``nn.Linear`` or HF ``Conv1D``) playing the query/key/value roles (separate or
    fused [Q|K|V]) and an output projection (a child, or under the parent as in BERT), with heads
    from module attributes / config and checked against the weight shapes.  Recognised: BERT,
    RoBERTa, ViT, DeiT, CLIP, GPT-2, Llama-style (GQA; Q/K refused for RoPE) and similar.
    A module whose class name contains "Attention" but matches nothing is listed in ``refused``.

    ``pairs``: hand-declared :class:`PairSpec` pairs; they take precedence over detected groups
    sharing a parameter (those are moved to ``refused``).  ``detect=False`` uses ``pairs`` only.
    Warns when no group is found (everything adaptive).
    """
    named = dict(model.named_parameters())
    shapes = {k: tuple(v.shape) for k, v in named.items()}
    found = _Found()
    if detect:
        model_cfg = getattr(model, "config", None)
        # rotary modules (e.g. LlamaRotaryEmbedding at model.rotary_emb): they apply to every
        # attention module below their parent (the decoder stack they belong to)
        model_rotary = [(p, type(m).__name__) for p, m in model.named_modules()
                        if _ROTARY_CLASS.search(type(m).__name__)]
        modules = dict(model.named_modules())
        for path, mod in modules.items():
            if path in found.matched:
                continue
            if isinstance(mod, nn.MultiheadAttention):
                _match_mha(path, mod, found)
                continue
            parent_path = path.rpartition(".")[0] if path else None
            parent = modules.get(parent_path) if parent_path is not None else None
            _match_projections(path, mod, parent, parent_path, model_cfg, model_rotary, found)
        for path, mod in modules.items():
            if "Attention" not in type(mod).__name__ or path in found.matched:
                continue
            related = [p for p in found.matched
                       if p == path or p.startswith(path + ".") or path.startswith(p + ".") or path == "" or p == ""]
            if related or not any(True for _ in mod.parameters()):
                continue
            found.refused.append((path, f"{type(mod).__name__} looks like attention but its layout was "
                                        f"not recognised; its parameters stay adaptive"))
    groups = found.groups
    if pairs:
        user = [_spec_group(s, named) for s in pairs]
        user_cov = _coverage_counts_from_pieces(user, shapes)
        for name, c in user_cov.items():
            if int(c.max()) > 1:
                raise ValueError(f"PairSpec: parameter {name!r} is covered by more than one declared pair")
        kept = []
        for g in groups:
            clash = False
            for side in (g._g, g._h):
                for p in side.pieces:
                    c = user_cov.get(p.name)
                    if c is not None and int(c.narrow(p.axis, p.start, p.length).max()) > 0:
                        clash = True
            if clash:
                found.refused.append((g.key, "superseded by a user-declared pair"))
            else:
                kept.append(g)
        groups = kept + user
    smap = SymmetryMap(groups, shapes, found.refused)
    if not smap.groups:
        warnings.warn(
            f"symmetry_map: no GL(h) attention pair recognised in {type(model).__name__}"
            + (f" ({len(smap.refused)} refused)" if smap.refused else "")
            + "; falling back to the adaptive (element-wise) geometry for every parameter",
            stacklevel=2,
        )
    return smap
