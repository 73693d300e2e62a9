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
  holds B_k (or A_k), so the adapter's own GL(r) symmetry (:func:`~geosharp_ref.symmetry.adapters.lora_bindings`) is not bound
  there as well (a parameter belongs to one symmetry).  Refused (the pair's parameters stay
  adaptive): DoRA (``lora_magnitude_vector`` / ``use_dora``: each output row is renormalised by
  ‖W0 + s B A‖_row, not GL(h)-equivariant), any ``lora_variant``, adapter parameters outside
  ``lora_A``/``lora_B``, other adapter wrappers (a ``base_layer`` without ``lora_A``/``lora_B``), and
  peft's wrapped ``nn.MultiheadAttention``.

* **Rotary position embeddings** rotate queries and keys per position, q ↦ q R_p, k ↦ k R_p, so
  scores use G_i R_p R_{p'}ᵀ H_iᵀ: invariant only for A that commute with every R_p, the RoPE
  subgroup (ℂ*)^{r/2} × GL(h − r) of GL(h) (:mod:`.rope`).  The Q/K pair of a rotary layer whose
  implementation is understood (:func:`~.rope.rotary_layout`: the pairing ``rotate_half`` /
  ``rotate_every_two`` and the rotary dimension r read from the model) is bound under that subgroup
  (``PairGroup.rotary = (pairing, r)``, kernels ``rope_<pairing>_<metric>``), per KV head with the query
  heads of its GQA group row-stacked into G and q/k biases as rows, as for GL(h); other rotary layers are
  refused with the reason (their weights go to the adaptive geometry); V/O is unaffected.
  Normalisations of q/k inside the head (QK-norm) and relative position encodings are refused.

Rotary evidence is conservative: a layer is rotary when the attention class's code names a rotary
embedding, its forward takes ``position_embeddings``/``freqs_cis``-like arguments, a rotary module
sits in the stack containing it, or its config declares rotary positions.

* **Fused projections.** ``[Q | K | V]`` along the output channels (GPT-2's ``c_attn``, Phi-3's
  ``qkv_proj`` with N query and K key/value heads: Q rows 0 … N·h, K rows N·h … (N+K)·h, V after) are cut
  into head-major pieces; a projection viewed per head as ``[q_i | k_i | v_i]`` (GPT-NeoX's
  ``query_key_value``, recognised from its forward's ``view(…, -1, 3 * self.head_size)`` and
  ``chunk(3, dim=-1)``) into strided pieces (head i at channel 3h·i, + h for k, + 2h for v:
  :class:`~.groups.Piece` ``stride``).

A module whose class name contains "Attention" but whose layout is not recognised is refused as a whole;
declare such pairs by hand with :class:`PairSpec`.

Every parameter (or part of one) that no group covers — output-projection biases, layer norms,
embeddings, MLPs, classifier, refused Q/K weights — is listed in :attr:`SymmetryMap.adaptive`
and gets the element-wise ("adaptive") geometry.

Public API: :func:`symmetry_map` and :class:`NoAttentionPairsWarning` (the classes live in
:mod:`geosharp_ref.symmetry.attention.groups`, the projection layouts and refusal evidence in
:mod:`geosharp_ref.symmetry.attention.layouts`).
"""
from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Optional

from torch import Tensor, nn

from .groups import PairGroup, PairSpec, Piece, SymmetryMap, coverage_counts_from_pieces
from .layouts import (ROTARY_CLASS, QK_NORM, REL_POS, Lin, as_lin, into_head, is_adapter_wrapper, is_norm_module,
                      join_path, make_group, out_of_head, qk_refusal, rotary_evidence)
from .rope import rotary_layout

__all__ = ["symmetry_map", "NoAttentionPairsWarning"]


class NoAttentionPairsWarning(UserWarning):
    """:func:`symmetry_map` recognised no GL(h) attention pair: every parameter falls back to the adaptive
    (element-wise) geometry. The message starts with ``"symmetry_map: no GL(h) attention pair recognised"``."""


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


def _adapter_refusal(*lins: Lin) -> Optional[str]:
    why = list(dict.fromkeys(lin.refusal for lin in lins if lin.refusal))
    if not why:
        return None
    return "; ".join(why) + "; the pair's parameters stay adaptive"


#: a fused projection whose output is viewed per head as [q_i | k_i | v_i] (GPT-NeoX / Pythia)
_PER_HEAD_FUSED = ("query_key_value",)
_PER_HEAD_VIEW = re.compile(r"\(\s*\*input_shape\s*,\s*-1\s*,\s*3\s*\*\s*self\.head_size\s*\)")


def _per_head_fused(mod) -> bool:
    """The module's forward views its fused projection per head as (…, heads, 3·head_size) and chunks it into
    q, k, v (GPT-NeoX's ``query_key_value``): channel i·3h + k is q of head i, + h is k, + 2h is v."""
    try:
        src = inspect.getsource(type(mod).forward)
    except (OSError, TypeError):
        return False
    return bool(_PER_HEAD_VIEW.search(src)) and "chunk(3, dim=-1)" in src


def _relative_positions(configs) -> bool:
    return any(isinstance(getattr(c, "position_embedding_type", None), str)
               and c.position_embedding_type.lower() in REL_POS for c in configs)


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
    b = join_path(path, "in_proj_bias") if mod.in_proj_bias is not None else None
    if mod._qkv_same_embed_dim:
        W = Lin(path, join_path(path, "in_proj_weight"), b, "out_in", E, 3 * E, (3 * E, E))
        q = into_head(W, 0, N, h, bias_shape)
        k = into_head(W, E, N, h, bias_shape)
        v = into_head(W, 2 * E, N, h, bias_shape)
    else:
        parts = []
        for i, nm in enumerate(("q_proj_weight", "k_proj_weight", "v_proj_weight")):
            w = getattr(mod, nm)
            lin = Lin(path, join_path(path, nm), b, "out_in", w.shape[1], E, tuple(w.shape))
            parts.append([Piece(lin.weight, lin.wshape, 0, 0, N, h)]
                         + ([Piece(b, bias_shape, 0, i * E, N, h)] if b else []))
        q, k, v = parts
    if mod.bias_k is not None:  # learned extra key / value (1, 1, E): one more row of H / G
        k = k + [Piece(join_path(path, "bias_k"), (1, 1, E), 2, 0, N, h)]
        v = v + [Piece(join_path(path, "bias_v"), (1, 1, E), 2, 0, N, h)]
    o = as_lin(join_path(path, "out_proj"), mod.out_proj)
    found.groups.append(make_group(path, "qk", q, k, 1, 1, src))
    if o is None or o.adapters or o.refusal:
        # nn.MultiheadAttention reads out_proj.weight directly (a wrapper's forward is never called)
        what = "is not linear" if o is None else \
            f"is wrapped by an adapter layer ({type(mod.out_proj).__name__}) that nn.MultiheadAttention bypasses"
        found.refused.append((f"{path}:vo", f"out_proj {what}; its parameters stay adaptive"))
    else:
        found.groups.append(make_group(path, "vo", v, out_of_head(o, N, h), 1, 1, src))
    found.matched.add(path)


def _child_lins(mod: nn.Module, path: str) -> dict[str, Lin]:
    out = {}
    for n, c in mod.named_children():
        lin = as_lin(join_path(path, n), c)
        if lin is not None:
            out[n] = lin
    return out


def _first(lins: dict[str, Lin], aliases) -> Optional[tuple[str, Lin]]:
    for a in aliases:
        if a in lins:
            return a, lins[a]
    return None


def _match_projections(path, mod, parent, parent_path, model_cfg, model_rotary, found) -> None:
    lins = _child_lins(mod, path)
    q, k, v = _first(lins, _Q), _first(lins, _K), _first(lins, _V)
    fused = _first(lins, _FUSED)
    per_head = _first(lins, _PER_HEAD_FUSED) if _per_head_fused(mod) else None
    if not ((q and k and v) or fused or per_head):
        return
    src = f"auto:{type(mod).__name__}"
    stride = 0  # head-major channels; 3h for a per-head interleaved [q_i | k_i | v_i] projection
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
    if per_head and not (q and k and v):
        used.add(per_head[0])
        F = per_head[1]
        if h is None or N is None or 3 * N * h != F.out_features or (Kh is not None and Kh != N):
            return refuse_all(f"per-head fused projection {per_head[0]} of width {F.out_features} does not split "
                              f"as [q_i | k_i | v_i] per head with the known head counts")
        qlin = klin = vlin = F
        q_out = k_out = v_out = N * h
        q_off, k_off, v_off, stride = 0, h, 2 * h, 3 * h
    elif q and k and v:
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
            lin = as_lin(join_path(parent_path, n), c)
            if lin is not None and n.split(".")[-1] in _O and lin.in_features == N * hv:
                cands.append(lin)
        if len(cands) == 1:
            o = ("<parent>", cands[0])
    if o is not None:
        used.add(o[0])

    extra, qk_norms = [], []
    for n, c in mod.named_children():
        if n in used or not any(True for _ in c.parameters()) or ROTARY_CLASS.search(type(c).__name__):
            continue
        if is_norm_module(n, c) and QK_NORM.match(n):
            qk_norms.append(n)
        else:
            extra.append(n)
    extra += [n for n, _ in mod.named_parameters(recurse=False)]
    if extra:
        return refuse_all(f"unrecognised parameters in the attention module ({', '.join(extra)}) "
                          f"may act between the projections")

    found.matched.add(path)
    rotary, why = None, _adapter_refusal(qlin, klin)
    if not why and qk_norms:  # QK-norm (with or without RoPE): q / ‖q‖ is equivariant under no subgroup used here
        why = (f"normalisation inside the Q/K path ({', '.join(qk_norms)}): scores are not a function of G Hᵀ "
               f"(or G R Hᵀ) alone, so Q/K is neither a GL(h) nor a RoPE-subgroup pair; its weights stay adaptive")
    elif not why and rotary_evidence(mod, path, configs, model_rotary) and not _relative_positions(configs):
        rotary, why = rotary_layout(mod, configs, h)  # the RoPE subgroup, or why not
    elif not why:
        why = qk_refusal(mod, path, configs, model_rotary, qk_norms)
    if why:
        found.refused.append((f"{path}:qk", why))
    else:
        found.groups.append(make_group(
            path, "qk", into_head(qlin, q_off, N, h, stride=stride), into_head(klin, k_off, K, h, stride=stride), r, 1,
            src, rotary=rotary))
    if o is None:
        found.refused.append((f"{path}:vo", "no output projection found (in_features = heads × head dim)"))
    elif _adapter_refusal(vlin, o[1]):
        found.refused.append((f"{path}:vo", _adapter_refusal(vlin, o[1])))
    else:
        found.groups.append(make_group(
            path, "vo", into_head(vlin, v_off, K, hv, stride=stride), out_of_head(o[1], N, hv), 1, r, src))


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
    return make_group(path, spec.kind, gp, hp, 1, 1, "user")


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
    RoBERTa, ViT, DeiT, CLIP, GPT-2, Llama-style decoders (GQA; Q/K under the RoPE subgroup) and similar.
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
                        if ROTARY_CLASS.search(type(m).__name__)]
        modules = dict(model.named_modules())
        for path, mod in modules.items():
            if path in found.matched:
                continue
            parent_path = path.rpartition(".")[0] if path else None
            parent = modules.get(parent_path) if parent_path is not None else None
            if isinstance(mod, nn.MultiheadAttention):
                if parent is not None and is_adapter_wrapper(parent) and parent.base_layer is mod:
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
                    if c is not None and int(p.take(c).max()) > 0:
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
            NoAttentionPairsWarning, stacklevel=2,
        )
    return smap
