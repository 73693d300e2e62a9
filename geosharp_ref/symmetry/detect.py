r"""Find the GL(h) attention symmetries of a torch model and group its parameters.

Canonical block (docs/MATH.md, "Canonical GL(h) block"): a function that uses
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

* **LoRA-adapted projections** (peft's ``LoraLayer``, recognised by structure: a module with a linear
  ``base_layer`` and ``lora_A`` / ``lora_B`` module dicts of ``nn.Linear``; peft is not imported).
  Adapter k has A_k ∈ R^{r_k×d_in} (``lora_A.<k>.weight``), B_k ∈ R^{d_out×r_k} (``lora_B.<k>.weight``),
  scaling s_k, and the projection computes (dropout is the identity in eval)

      y = x W0ᵀ + b + Σ_k s_k (x A_kᵀ) B_kᵀ,      effective weight  W = W0 + Σ_k s_k B_k A_k.

  The group element (written M ∈ GL(h) here, A_k being the adapter factor) acts on the effective
  weight's head rows, W^i ↦ Mᵀ W^i (Q, K, V: G_i ↦ G_i M), or head columns, W[:, cols_i] ↦
  W[:, cols_i] M⁻ᵀ (O: H_i ↦ H_i M⁻ᵀ), cols_i = i·h … (i+1)·h−1.  Acting alike on the adapter factor
  that carries the head channels realises this exactly on the parameters, for every s_k, since
  (Mᵀ B_k^i) A_k = Mᵀ (B_k^i A_k) and B_k (A_k[:, cols_i] M⁻ᵀ) = (B_k A_k[:, cols_i]) M⁻ᵀ:

      into a head (Q, K, V):  G_i = [W0^iᵀ ; b^iᵀ ; (B_1^i)ᵀ ; … ] ∈ R^{(d+1+Σ_k r_k)×h},
                              B_k^i = B_k[cols_i, :] ∈ R^{h×r_k};  A_k not in the pair (adaptive);
      out of a head (O):      H_i = [W0[:, cols_i] ; A_1[:, cols_i] ; … ] ∈ R^{(d_out+Σ_k r_k)×h};
                              B_k not in the pair (adaptive).

  A ``lora_B`` bias (``lora_bias=True``) is one more row of G_i into a head (after (B_k^i)ᵀ) and stays
  adaptive on O.  The base layer may be an ``nn.Linear`` or a ``Conv1D`` (the adapter is (out, in)
  either way), fused [Q|K|V] included; all adapters of the layer are covered, active or not.  The pair
  holds B_k (or A_k), so the adapter's own GL(r) symmetry (``bindings.lora_bindings``) is not bound
  there as well (a parameter belongs to one symmetry).  Refused (the pair's parameters stay
  adaptive): DoRA (``lora_magnitude_vector`` / ``use_dora``: each output row is renormalised by
  ‖W0 + s B A‖_row, not GL(h)-equivariant), any ``lora_variant``, adapter parameters outside
  ``lora_A``/``lora_B``, other adapter wrappers (a ``base_layer`` without ``lora_A``/``lora_B``), and
  peft's wrapped ``nn.MultiheadAttention``.

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

Public API: :func:`symmetry_map` (the classes live in :mod:`geosharp_ref.symmetry.groups`).
"""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from torch import Tensor, nn

from .groups import PairGroup, PairSpec, Piece, Side, SymmetryMap, coverage_counts_from_pieces

__all__ = ["symmetry_map"]

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
    #: LoRA adapters on top of the weight (empty for a plain projection)
    adapters: tuple["_Adapter", ...] = ()
    #: why the projection cannot be part of a GL(h) pair (an unsupported adapter), or None
    refusal: Optional[str] = None

    @property
    def out_axis(self) -> int:
        return 0 if self.layout == "out_in" else 1

    @property
    def in_axis(self) -> int:
        return 1 - self.out_axis


@dataclass(frozen=True)
class _Adapter:
    """One LoRA adapter of a projection: ``lora_A`` weight (r, in), ``lora_B`` weight (out, r) [+ bias (out,)]."""

    a: str
    a_shape: tuple[int, int]
    b: str
    b_shape: tuple[int, int]
    b_bias: Optional[str]


def _is_adapter_wrapper(mod: nn.Module) -> bool:
    """A module wrapping a layer as ``mod.base_layer`` (peft's tuner layers, matched by structure)."""
    return isinstance(getattr(mod, "base_layer", None), nn.Module)


def _as_lora_lin(path: str, mod: nn.Module) -> Optional[_Lin]:
    r"""A projection wrapped by LoRA adapters: y = x W0ᵀ + b + Σ_k s_k (x A_kᵀ) B_kᵀ (peft ``LoraLayer``).

    The base layer must be linear-like; the result names the base weight/bias and lists the adapters.
    Anything but plain LoRA (DoRA's magnitude vector, LoRA variants, embedding adapters, other tuner
    types, adapters of unexpected shapes) gives a ``_Lin`` carrying a ``refusal``."""
    base = _as_lin(_join(path, "base_layer"), mod.base_layer)
    if base is None:
        return None
    kind = f"{type(mod).__module__}.{type(mod).__name__}"
    la, lb = getattr(mod, "lora_A", None), getattr(mod, "lora_B", None)
    if not (isinstance(la, nn.ModuleDict) and isinstance(lb, nn.ModuleDict)):
        base.refusal = (f"{path} is wrapped by an adapter layer ({kind}) that is not LoRA (no lora_A/lora_B); "
                        f"its effective weight need not transform with the head rows")
        return base
    why = []
    stray = sorted({n.split(".")[0] for n, _ in mod.named_parameters()
                    if n.split(".")[0] not in ("base_layer", "lora_A", "lora_B")})
    if stray:
        why.append(f"adapter parameters outside lora_A/lora_B ({', '.join(stray)}"
                   + ("; DoRA rescales each output row by m / ‖W0 + s B A‖_row, not GL(h)-equivariant"
                      if "lora_magnitude_vector" in stray else "") + ")")
    variants = getattr(mod, "lora_variant", None)
    if isinstance(variants, Mapping) and variants:
        why.append("LoRA variant(s) " + ", ".join(f"{k}: {type(v).__name__}" for k, v in variants.items()))
    dora = getattr(mod, "use_dora", None)
    if isinstance(dora, Mapping) and any(bool(v) for v in dora.values()):
        why.append("use_dora=True (DoRA)")
    if set(la.keys()) != set(lb.keys()):
        why.append(f"lora_A adapters {sorted(la.keys())} differ from lora_B adapters {sorted(lb.keys())}")
    adapters = []
    for k in la.keys():
        if k not in lb:
            continue
        A, B = la[k], lb[k]
        if type(A) is not nn.Linear or type(B) is not nn.Linear:
            why.append(f"adapter {k!r}: lora_A/lora_B are {type(A).__name__}/{type(B).__name__}, not nn.Linear")
            continue
        r = A.weight.shape[0]
        if A.bias is not None or tuple(A.weight.shape) != (r, base.in_features) \
                or tuple(B.weight.shape) != (base.out_features, r):
            why.append(f"adapter {k!r}: lora_A {tuple(A.weight.shape)} / lora_B {tuple(B.weight.shape)} do not "
                       f"factor a ({base.out_features}, {base.in_features}) update B A (or lora_A has a bias)")
            continue
        pa, pb = _join(path, f"lora_A.{k}"), _join(path, f"lora_B.{k}")
        adapters.append(_Adapter(_join(pa, "weight"), (r, base.in_features), _join(pb, "weight"),
                                 (base.out_features, r), _join(pb, "bias") if B.bias is not None else None))
    base.adapters = tuple(adapters)
    if why:
        base.refusal = f"{path} ({kind}) is not a plain LoRA projection: " + "; ".join(why)
    return base


def _as_lin(path: str, mod: nn.Module) -> Optional[_Lin]:
    if _is_adapter_wrapper(mod):
        return _as_lora_lin(path, mod)
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


def _into_head(lin: _Lin, start: int, heads: int, h: int, bias_shape=None) -> list[Piece]:
    """Pieces [W^iᵀ ; b^iᵀ ; (B_k^i)ᵀ ; (b_{B,k}^i)ᵀ …] for a projection into head space, channels
    start … start+heads·h: B_k^i (h × r) are the head-i rows of each LoRA ``lora_B`` weight (out, r)."""
    pieces = [Piece(lin.weight, lin.wshape, lin.out_axis, start, heads, h)]
    if lin.bias is not None:
        pieces.append(Piece(lin.bias, (lin.out_features,) if bias_shape is None else bias_shape,
                             0, start, heads, h))
    for ad in lin.adapters:
        pieces.append(Piece(ad.b, ad.b_shape, 0, start, heads, h))
        if ad.b_bias is not None:
            pieces.append(Piece(ad.b_bias, (ad.b_shape[0],), 0, start, heads, h))
    return pieces


def _out_of_head(lin: _Lin, heads: int, h: int) -> list[Piece]:
    """Pieces [W_O[:, i·h:(i+1)·h] ; A_k[:, i·h:(i+1)·h] …] ((d_out + Σ r_k) × h) of an output projection,
    A_k (r, N·h) the ``lora_A`` weights of its LoRA adapters; its biases (and lora_B's) are not included."""
    return [Piece(lin.weight, lin.wshape, lin.in_axis, 0, heads, h)] + \
        [Piece(ad.a, ad.a_shape, 1, 0, heads, h) for ad in lin.adapters]


def _make_group(path, kind, g_pieces, h_pieces, g_stack, h_stack, source) -> PairGroup:
    g, hs = Side(tuple(g_pieces), g_stack), Side(tuple(h_pieces), h_stack)
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


def _adapter_refusal(*lins: _Lin) -> Optional[str]:
    why = list(dict.fromkeys(lin.refusal for lin in lins if lin.refusal))
    if not why:
        return None
    return "; ".join(why) + "; the pair's parameters stay adaptive"


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
            parts.append([Piece(lin.weight, lin.wshape, 0, 0, N, h)]
                         + ([Piece(b, bias_shape, 0, i * E, N, h)] if b else []))
        q, k, v = parts
    if mod.bias_k is not None:  # learned extra key / value (1, 1, E): one more row of H / G
        k = k + [Piece(_join(path, "bias_k"), (1, 1, E), 2, 0, N, h)]
        v = v + [Piece(_join(path, "bias_v"), (1, 1, E), 2, 0, N, h)]
    o = _as_lin(_join(path, "out_proj"), mod.out_proj)
    found.groups.append(_make_group(path, "qk", q, k, 1, 1, src))
    if o is None or o.adapters or o.refusal:
        # nn.MultiheadAttention reads out_proj.weight directly (a wrapper's forward is never called)
        what = "is not linear" if o is None else \
            f"is wrapped by an adapter layer ({type(mod.out_proj).__name__}) that nn.MultiheadAttention bypasses"
        found.refused.append((f"{path}:vo", f"out_proj {what}; its parameters stay adaptive"))
    else:
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
    why = _qk_refusal(mod, path, configs, model_rotary, qk_norms) or _adapter_refusal(qlin, klin)
    if why:
        found.refused.append((f"{path}:qk", why))
    else:
        found.groups.append(_make_group(
            path, "qk", _into_head(qlin, q_off, N, h), _into_head(klin, k_off, K, h), r, 1, src))
    if o is None:
        found.refused.append((f"{path}:vo", "no output projection found (in_features = heads × head dim)"))
    elif _adapter_refusal(vlin, o[1]):
        found.refused.append((f"{path}:vo", _adapter_refusal(vlin, o[1])))
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
    gp = [Piece(spec.G, tuple(G.shape), g_axis, 0, N, h)]
    hp = [Piece(spec.H, tuple(H.shape), h_axis, 0, N, h)]
    for bname, pieces, wname, wshape in ((spec.g_bias, gp, spec.G, G.shape), (spec.h_bias, hp, spec.H, H.shape)):
        if bname is None:
            continue
        b = named[bname]
        if tuple(b.shape) != (width,):
            raise ValueError(f"PairSpec: bias {bname!r} has shape {tuple(b.shape)}, expected ({width},) "
                             f"to match {wname!r} {tuple(wshape)}")
        pieces.append(Piece(bname, (width,), 0, 0, N, h))
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
    fused [Q|K|V], each possibly wrapped by peft LoRA adapters) and an output projection (a child, or
    under the parent as in BERT), with heads
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
            parent_path = path.rpartition(".")[0] if path else None
            parent = modules.get(parent_path) if parent_path is not None else None
            if isinstance(mod, nn.MultiheadAttention):
                if parent is not None and _is_adapter_wrapper(parent) and parent.base_layer is mod:
                    why = (f"nn.MultiheadAttention wrapped by an adapter layer ({type(parent).__name__} at "
                           f"{parent_path}): the adapters change the fused in_proj and out_proj weights, a "
                           f"layout not supported here; its parameters stay adaptive")
                    found.refused += [(f"{path}:qk", why), (f"{path}:vo", why)]
                    found.matched.add(path)
                    continue
                _match_mha(path, mod, found)
                continue
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
        user_cov = coverage_counts_from_pieces(user, shapes)
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
