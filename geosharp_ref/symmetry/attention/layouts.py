"""Projection layouts of attention modules and the evidence that refuses a Q/K pair.

* :class:`Lin` — a linear-like module (``nn.Linear``, HF ``Conv1D``, or either wrapped by peft LoRA adapters,
  :class:`Adapter`), read by :func:`as_lin`; :func:`into_head` / :func:`out_of_head` cut its head slices into
  :class:`~.groups.Piece` objects and :func:`make_group` assembles a :class:`~.groups.PairGroup`;
* :func:`qk_refusal` — why a Q/K pair is not GL(h) (rotary / relative positions, QK-norm), or None (a rotary
  layer whose RoPE is understood is bound under the RoPE subgroup instead: :mod:`.rope`).

The mathematics (which rows and columns form G_i and H_i) is written out in :mod:`.detect`.
"""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from torch import Tensor, nn

from .groups import PairGroup, Piece, Side

__all__ = ["Lin", "Adapter", "is_adapter_wrapper", "as_lin", "as_lora_lin", "into_head", "out_of_head", "make_group",
           "layer_index", "join_path", "qk_refusal", "is_norm_module", "ROTARY_CLASS", "QK_NORM", "ROTARY_ARGS",
           "REL_POS", "rotary_identifier", "rotary_evidence"]


def layer_index(path: str) -> Optional[int]:
    nums = [int(p) for p in path.split(".") if p.isdigit()]
    return nums[-1] if nums else None


def join_path(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@dataclass
class Lin:
    """A linear-like module: weight name/shape, bias name, layout, in/out features."""

    path: str
    weight: str
    bias: Optional[str]
    layout: str  # "out_in" (nn.Linear) or "in_out" (Conv1D)
    in_features: int
    out_features: int
    wshape: tuple[int, ...]
    #: LoRA adapters on top of the weight (empty for a plain projection)
    adapters: tuple["Adapter", ...] = ()
    #: why the projection cannot be part of a GL(h) pair (an unsupported adapter), or None
    refusal: Optional[str] = None

    @property
    def out_axis(self) -> int:
        return 0 if self.layout == "out_in" else 1

    @property
    def in_axis(self) -> int:
        return 1 - self.out_axis


@dataclass(frozen=True)
class Adapter:
    """One LoRA adapter of a projection: ``lora_A`` weight (r, in), ``lora_B`` weight (out, r) [+ bias (out,)]."""

    a: str
    a_shape: tuple[int, int]
    b: str
    b_shape: tuple[int, int]
    b_bias: Optional[str]


def is_adapter_wrapper(mod: nn.Module) -> bool:
    """A module wrapping a layer as ``mod.base_layer`` (peft's tuner layers, matched by structure)."""
    return isinstance(getattr(mod, "base_layer", None), nn.Module)


def as_lora_lin(path: str, mod: nn.Module) -> Optional[Lin]:
    r"""A projection wrapped by LoRA adapters: y = x W0ᵀ + b + Σ_k s_k (x A_kᵀ) B_kᵀ (peft ``LoraLayer``).

    The base layer must be linear-like; the result names the base weight/bias and lists the adapters.
    Anything but plain LoRA (DoRA's magnitude vector, LoRA variants, embedding adapters, other tuner
    types, adapters of unexpected shapes) gives a ``Lin`` carrying a ``refusal``."""
    base = as_lin(join_path(path, "base_layer"), mod.base_layer)
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
        pa, pb = join_path(path, f"lora_A.{k}"), join_path(path, f"lora_B.{k}")
        adapters.append(Adapter(join_path(pa, "weight"), (r, base.in_features), join_path(pb, "weight"),
                                 (base.out_features, r), join_path(pb, "bias") if B.bias is not None else None))
    base.adapters = tuple(adapters)
    if why:
        base.refusal = f"{path} ({kind}) is not a plain LoRA projection: " + "; ".join(why)
    return base


def as_lin(path: str, mod: nn.Module) -> Optional[Lin]:
    if is_adapter_wrapper(mod):
        return as_lora_lin(path, mod)
    w = getattr(mod, "weight", None)
    if not isinstance(w, Tensor) or w.dim() != 2:
        return None
    b = getattr(mod, "bias", None)
    bname = join_path(path, "bias") if isinstance(b, Tensor) else None
    if isinstance(mod, nn.Linear):
        return Lin(path, join_path(path, "weight"), bname, "out_in", w.shape[1], w.shape[0], tuple(w.shape))
    # transformers' Conv1D (GPT-2): weight (nx, nf), y = x W + b.  Recognised by structure.
    if type(mod).__name__ == "Conv1D" and getattr(mod, "nf", None) == w.shape[1] \
            and getattr(mod, "nx", None) == w.shape[0]:
        return Lin(path, join_path(path, "weight"), bname, "in_out", w.shape[0], w.shape[1], tuple(w.shape))
    return None


def into_head(lin: Lin, start: int, heads: int, h: int, bias_shape=None, stride: int = 0) -> list[Piece]:
    """Pieces [W^iᵀ ; b^iᵀ ; (B_k^i)ᵀ ; (b_{B,k}^i)ᵀ …] for a projection into head space, channels
    start … start+heads·h (``stride`` > 0: head i at start + i·stride, :class:`~.groups.Piece`): B_k^i (h × r)
    are the head-i rows of each LoRA ``lora_B`` weight (out, r)."""
    pieces = [Piece(lin.weight, lin.wshape, lin.out_axis, start, heads, h, stride)]
    if lin.bias is not None:
        pieces.append(Piece(lin.bias, (lin.out_features,) if bias_shape is None else bias_shape,
                             0, start, heads, h, stride))
    for ad in lin.adapters:
        pieces.append(Piece(ad.b, ad.b_shape, 0, start, heads, h, stride))
        if ad.b_bias is not None:
            pieces.append(Piece(ad.b_bias, (ad.b_shape[0],), 0, start, heads, h, stride))
    return pieces


def out_of_head(lin: Lin, heads: int, h: int) -> list[Piece]:
    """Pieces [W_O[:, i·h:(i+1)·h] ; A_k[:, i·h:(i+1)·h] …] ((d_out + Σ r_k) × h) of an output projection,
    A_k (r, N·h) the ``lora_A`` weights of its LoRA adapters; its biases (and lora_B's) are not included."""
    return [Piece(lin.weight, lin.wshape, lin.in_axis, 0, heads, h)] + \
        [Piece(ad.a, ad.a_shape, 1, 0, heads, h) for ad in lin.adapters]


def make_group(path, kind, g_pieces, h_pieces, g_stack, h_stack, source, rotary=None) -> PairGroup:
    g, hs = Side(tuple(g_pieces), g_stack), Side(tuple(h_pieces), h_stack)
    assert g.h == hs.h and g.heads // g_stack == hs.heads // h_stack
    names = []
    for p in g.pieces + hs.pieces:
        if p.name not in names:
            names.append(p.name)
    return PairGroup(
        key=f"{path}:{kind}", layer=path, layer_index=layer_index(path), kind=kind,
        num_heads=g.heads // g_stack, head_dim=g.h, n=g.rows, m=hs.rows,
        param_names=tuple(names), source=source, _g=g, _h=hs, rotary=rotary,
    )


# --------------------------------------------------------------------------------------------
# Refusal evidence
# --------------------------------------------------------------------------------------------

ROTARY_CLASS = re.compile(r"[Rr]otary|RoPE|(?<![a-z])[Rr]ope(?![a-z])")
_ROTARY_IDENT = re.compile(r"rotary|freqs_cis|(?:^|_)rope(?:_|$)", re.IGNORECASE)


def rotary_identifier(cls) -> Optional[str]:
    """First identifier (name, attribute, argument, function) of the class's code that names a
    rotary embedding (comments and docstrings are ignored), or None; None if there is no source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        for ident in (getattr(node, "id", None), getattr(node, "attr", None), getattr(node, "arg", None),
                      node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None):
            if isinstance(ident, str) and (_ROTARY_IDENT.search(ident) or ROTARY_CLASS.search(ident)):
                return ident
    return None
ROTARY_ARGS = ("position_embeddings", "rotary_pos_emb", "rotary_emb", "freqs_cis", "rope",
                "cos", "sin")
REL_POS = ("rotary", "relative_key", "relative_key_query", "relative")


def rotary_evidence(mod, path: str, configs, model_rotary) -> list:
    """Why ``mod`` (an attention module at ``path``) is rotary: its forward's arguments, its code, a rotary
    module in the stack containing it, or its config (empty: not rotary)."""
    why = []
    try:
        params = inspect.signature(type(mod).forward).parameters
        hit = [a for a in ROTARY_ARGS if a in params]
        if hit:
            why.append(f"forward takes {hit[0]!r}")
    except (TypeError, ValueError):
        pass
    ident = rotary_identifier(type(mod))
    if ident:
        why.append(f"its code uses {ident!r}")
    for rpath, rname in model_rotary:
        scope = rpath.rpartition(".")[0]
        if not scope or path == scope or path.startswith(scope + "."):
            why.append(f"{rname} at {rpath or '<root>'} feeds the stack containing it")
            break
    for cfg in configs:
        if getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_theta", None) \
                or getattr(cfg, "rotary_dim", None):
            why.append("config has rotary parameters")
    return list(dict.fromkeys(why))


def qk_refusal(mod: nn.Module, path: str, configs, model_rotary, qk_norms=()) -> Optional[str]:
    why = rotary_evidence(mod, path, configs, model_rotary)
    for cfg in configs:
        pet = getattr(cfg, "position_embedding_type", None)
        if isinstance(pet, str) and pet.lower() in REL_POS:
            why.append(f"config.position_embedding_type={pet!r}")
    if why:
        return ("rotary/relative position encoding (" + "; ".join(dict.fromkeys(why)) + "): scores use "
                "G R_{p-p'} Hᵀ, invariant only under A commuting with the rotations (a subgroup of "
                "GL(h)), so Q/K is not a GL(h) pair; its weights stay adaptive")
    if qk_norms:
        return (f"normalisation inside the Q/K path ({', '.join(qk_norms)}): scores are not a function "
                f"of G Hᵀ alone, so Q/K is not a GL(h) pair; its weights stay adaptive")
    return None


def is_norm_module(name: str, mod: nn.Module) -> bool:
    return "norm" in type(mod).__name__.lower() or "norm" in name.lower()


QK_NORM = re.compile(r"^(q|k|query|key)_?(layer_?)?norm", re.IGNORECASE)
