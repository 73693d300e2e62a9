r"""Positive scaling of everything that writes into a normalisation: the binding, its detection, its check.

A LayerNorm N(z) = γ ⊙ (z − μ)/√(σ² + eps) + β (RMSNorm: γ ⊙ z/√(mean z² + eps)) gives
N(c z) = γ ⊙ (c z − c μ)/√(c²σ² + eps) + β, which equals N(z) for every c > 0 **only when eps = 0**; with
eps > 0, N(c z) − N(z) ≈ (eps/2σ²)(1 − 1/c²)(N(z) − β). If every parameter that writes into z is scaled by
the same c and z is read only through such norms, the model is unchanged. The bound parameters,
flattened and concatenated, are ONE block W ∈ R^{N×1} (batch of one) of the built-in ``scaling`` kernel
(W ↦ a W, a > 0): g_W(ξ, η) = ⟨ξ, η⟩/‖W‖², vertical direction W itself, P ξ = ξ − (⟨ξ, W⟩/‖W‖²) W.
Where it is exact, found by :func:`norm_scaling_candidates` and confirmed by measuring
(:func:`norm_scaling_bindings`: :func:`check_binding` in float64 with a ∈ {1e-2, 1e2}, tolerance 1e-10):
(a) BERT/RoBERTa-style embeddings, z = word + position [+ token type] tables → ``embeddings.LayerNorm``:
the three tables, exact iff that LayerNorm has eps = 0 and no other module reads the tables (a masked-LM
decoder tied to the word table, ``get_output_embeddings()``, is refused); (b) pre-LN residual streams
(GPT-2, ViT/DeiT, Llama-like, CLIP towers): the embeddings (CLIP vision: ``pre_layrnorm``'s affine
parameters) and every block's output projections (attention out and MLP out, weight and bias), exact iff
every reading norm (the blocks' ln_1/ln_2, layernorm_before/after, …, and the final norm) has eps = 0 and
nothing reads the stream without a norm (GPT-2's LM head tied to ``wte`` is refused). A (b) binding
shares the attention output weights with the V/O GL(h) pairs: in one perturbation space a parameter
belongs to one symmetry, so those pairs must yield (their weights then adaptive;
:class:`~geosharp_ref.symmetry.quotient.Quotient`). Hidden states and any
output read before a norm scale with c: ``check_binding`` is only as strict as the ``output`` it checks.

* :class:`NormScalingBinding` — the binding (a :class:`~geosharp_ref.symmetry.binding.Binding`);
* :func:`norm_scaling_candidates` — patterns (a) and (b) found by module structure;
* :func:`norm_scaling_bindings` — the candidates measured exact (eps = 0 required), the rest refused with why.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from ..kernels import load_kernels
from .check import check_binding

__all__ = ["NormScalingBinding", "StreamFold", "NormScalingCandidate", "norm_scaling_candidates", "norm_scaling_bindings",
           "NORM_SCALING_ELEMENTS", "POWER_OF_TWO_ELEMENTS", "KIND"]

#: the family's name in reports
KIND = "norm scaling"


class NormScalingBinding:
    """The parameters ``param_names`` (everything that writes into the input z of the norms ``norm_names``)
    flattened and concatenated as ONE block W of shape (1, N, 1) of the ``scaling`` kernel (batch of one);
    the action W ↦ a·W, a > 0 (``a`` of shape (1,)), scales all of them by the same a.

    The ``scaling`` geometry on an (N, 1) block: g_W(ξ, η) = ⟨ξ, η⟩ / ‖W‖² (invariant under (W, ξ, η) ↦
    a·(W, ξ, η)); the vertical direction at W is W itself, and the horizontal projection removes the radial
    part, P ξ = ξ − (⟨ξ, W⟩ / ‖W‖²) W. Exact as a symmetry only where every reading norm has eps = 0 and
    nothing else reads the parameters (see the module doc and :func:`norm_scaling_bindings`)."""

    kernels = "scaling"

    def __init__(self, param_names, norm_names):
        self.param_names = tuple(param_names)
        self.norm_names = tuple(norm_names)
        if not self.param_names or not self.norm_names:
            raise ValueError("NormScalingBinding needs at least one parameter and one norm")
        self.key = f"{self.norm_names[0]}:norm-scaling"
        self.measured_change = None  # set when norm_scaling_bindings accepts it

    def extract(self, params) -> tuple:
        return (torch.cat([params[n].reshape(-1) for n in self.param_names])[None, :, None],)  # (1, N, 1)

    def insert(self, params, blocks) -> dict:
        (w,) = blocks
        flat = w.reshape(-1)
        out = dict(params)
        i = 0
        for n in self.param_names:
            k = params[n].numel()
            out[n] = flat[i:i + k].reshape(params[n].shape)
            i += k
        if i != flat.numel():
            raise ValueError(f"{self.key}: block of {flat.numel()} entries for parameters of {i} entries")
        return out

    def random_element(self, params, scale: float = 1.0, seed: int = 0):
        """a = scale · exp(N(0, 1)) > 0, shape (1,)."""
        (w,) = self.extract(params)
        return scale * torch.exp(torch.randn(1, generator=torch.Generator().manual_seed(seed), dtype=w.dtype)).to(w.device)

    def act(self, params, a) -> dict:
        """ψ(a, θ): every bound parameter times a > 0 (``a``: a number or a tensor of shape (1,)), by the
        ``scaling`` kernel's own ``act``; in a joint binding (:meth:`joint_with`) the writers other symmetries
        hold are scaled too (the action is the whole stream's)."""
        (w,) = self.extract(params)
        a = torch.as_tensor(a, dtype=w.dtype, device=w.device).reshape(1)
        out = self.insert(params, load_kernels(self.kernels).act(w, a))
        for n in getattr(self, "writers", ()):
            if n not in self.param_names:
                out[n] = params[n] * a.reshape(())
        return out

    def joint_with(self, taken) -> Optional["NormScalingBinding"]:
        """This stream scaling quotiented jointly with the symmetries that hold some of its writers (``taken``:
        parameter name → key), or None when they hold none or all of them.

        The fold (:class:`StreamFold`): with F the free writers (held by no other symmetry) and s = ‖F‖, the
        coordinates (F, Ŵ = W / s) for the held writers W make the stream group act on F alone (F ↦ aF,
        Ŵ fixed) and the other groups on Ŵ alone (they do not touch F). The joint binding binds F only (the
        ``scaling`` geometry: the radial direction of F is the orbit, its quotient the sphere of F) and its
        action still scales every writer; the symmetries holding the other writers see them folded
        (:func:`~geosharp_ref.symmetry.norm_weights.fold_binding`). Horizontal geodesics of F keep ‖F‖ (to
        fourth order for the second-order geodesic), so W = s Ŵ moves as its own geometry says."""
        free = tuple(n for n in self.param_names if n not in taken)
        held = tuple(n for n in self.param_names if n in taken)
        if not free or not held:
            return None
        out = copy.copy(self)
        out.writers, out.param_names = self.param_names, free
        out.joint_fold = StreamFold(self.key, free, held)
        return out

    @property
    def summary(self) -> Optional[str]:
        fold = getattr(self, "joint_fold", None)
        if fold is None:
            return None
        return (f"{self.kernels} on the {len(fold.free)} free writers; the {len(fold.readers)} writers other "
                f"symmetries hold are folded (÷ ‖free writers‖) and quotiented jointly")


@dataclass(frozen=True)
class StreamFold:
    """The fold of a stream scaling held partly by other symmetries (:meth:`NormScalingBinding.joint_with`):
    s = ‖F‖ over the free writers ``free``, Ŵ = W / s for the held writers ``readers`` (the name
    :func:`~geosharp_ref.symmetry.norm_weights.fold_binding` reads)."""

    key: str
    free: tuple
    readers: tuple

    @property
    def reader_names(self) -> tuple:
        return self.readers

    def scale_of(self, params) -> torch.Tensor:
        return torch.sqrt(sum(params[n].pow(2).sum() for n in self.free))

    def fold(self, params, names) -> dict:
        out, s = dict(params), self.scale_of(params)
        for n in self.readers:
            if n in names:
                out[n] = params[n] / s.to(params[n].dtype)
        return out

    def unfold(self, params, folded, moved, names) -> dict:
        out, s = dict(moved), self.scale_of(params)
        for n in self.readers:
            if n in names:
                out[n] = params[n] + (moved[n] - folded[n]) * s.to(params[n].dtype)
        return out


class NormScalingCandidate(NamedTuple):
    """A place where positive scaling into a norm may be a symmetry: ``binding`` is None where the model's
    structure already refuses it, and ``reason`` then says why (empty otherwise)."""

    key: str
    binding: Optional[NormScalingBinding]
    reason: str


#: module attribute names, tried in order, of the pre-LN pattern (b): the block list of a stream holder,
#: the norms that read the stream in a block, the projections that write into it, the final norm, and the
#: holder's embedding writers (GPT-2, ViT/DeiT (transformers ≥ 5 and older), Llama-like, CLIP towers)
_PRE_LN_BLOCKS = ("layers", "h", "encoder.layer", "encoder.layers")
_PRE_LN_READERS = ("layernorm_before", "layernorm_after", "ln_1", "ln_cross_attn", "ln_2", "input_layernorm",
                   "post_attention_layernorm", "layer_norm1", "layer_norm2")
_PRE_LN_WRITERS = ("attention.o_proj", "attention.output.dense", "attn.c_proj", "crossattention.c_proj",
                   "self_attn.o_proj", "self_attn.out_proj", "mlp.fc2", "mlp.c_proj", "mlp.down_proj", "output.dense")
_PRE_LN_FINAL = ("layernorm", "ln_f", "norm", "final_layer_norm", "post_layernorm")
_PRE_LN_EMBED = ("pre_layrnorm", "embeddings", "wte", "wpe", "embed_tokens")


def _sub(module, path: str):
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None or not isinstance(module, torch.nn.Module):
            return None
    return module


def _norm_eps(module):
    """The eps of a LayerNorm / RMSNorm-like module (``eps`` or ``variance_epsilon``); ``"?"`` if unknown."""
    for attr in ("eps", "variance_epsilon", "epsilon", "layer_norm_eps"):
        if hasattr(module, attr):
            return getattr(module, attr)
    return "?"


def _is_norm(module) -> bool:
    return module is not None and _norm_eps(module) != "?"


def _own_params(prefix: str, module) -> list:
    """The floating parameters whose scaling by c scales ``module``'s output by c: all of them, except the
    down-projections of peft adapters (``lora_A``, ``lora_embedding_A``): with ΔW = s·B A the base weight,
    bias and B scale (peft names the wrapped weight ``….base_layer.weight``)."""
    return [f"{prefix}.{n}" if prefix else n for n, p in module.named_parameters() if p.is_floating_point()
            and not any(part in ("lora_A", "lora_embedding_A") for part in n.split("."))]


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def _ties(model, names) -> list:
    """``(bound name, other name)`` for every bound parameter that is the same tensor as a parameter
    outside the binding (a tied weight: another module reads it)."""
    by_id = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(n)
    every = dict(model.named_parameters(remove_duplicate=False))
    bound = set(names)
    found = []
    for n in names:
        for other in by_id.get(id(every[n]), ()):
            if other not in bound:
                found.append((n, other))
    return found


def _tie_reason(model, ties) -> str:
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out_w = getattr(out_emb, "weight", None)
    parts = []
    for n, other in ties:
        is_out = out_w is not None and dict(model.named_parameters(remove_duplicate=False)).get(other) is out_w
        parts.append(f"{n} is tied to {other}" + (" (the output embedding, get_output_embeddings())" if is_out
                                                   else ""))
    return (f"{'; '.join(parts)}: that tied weight also reads the scaled parameters without a norm, so scaling "
            f"them scales its output (e.g. the logits) — not a symmetry (untie the weights, "
            f"tie_word_embeddings=False, to have it)")


def _embedding_candidates(model) -> list:
    """Pattern (a): ``embeddings`` modules with ``word_embeddings``, ``position_embeddings``, optional
    ``token_type_embeddings``, and a ``LayerNorm`` that reads their sum (BERT, RoBERTa, …)."""
    found = []
    for prefix, m in model.named_modules():
        word, pos, norm = (getattr(m, a, None) for a in ("word_embeddings", "position_embeddings", "LayerNorm"))
        if not (isinstance(word, torch.nn.Embedding) and isinstance(pos, torch.nn.Embedding) and _is_norm(norm)):
            continue
        names = [_join(prefix, "word_embeddings.weight"), _join(prefix, "position_embeddings.weight")]
        if isinstance(getattr(m, "token_type_embeddings", None), torch.nn.Embedding):
            names.append(_join(prefix, "token_type_embeddings.weight"))
        found.append(NormScalingBinding(names, [_join(prefix, "LayerNorm")]))
    return found


def _pre_ln_candidates(model) -> list:
    """Pattern (b): stream holders whose blocks read the residual stream only through norms (pre-LN) and
    write into it through output projections, with a final norm: GPT-2, ViT/DeiT, Llama-like, CLIP towers.
    The writers are the holder's embeddings (or, with a ``pre_layrnorm``, that norm's affine parameters)
    and every block's writer projections (weight and bias); the readers every block norm and the final."""
    found = []
    for prefix, m in model.named_modules():
        blocks = next((b for b in (_sub(m, p) for p in _PRE_LN_BLOCKS)
                       if isinstance(b, (torch.nn.ModuleList, torch.nn.Sequential)) and len(b)), None)
        final = next((a for a in _PRE_LN_FINAL if _is_norm(getattr(m, a, None))), None)
        if blocks is None or final is None:
            continue
        bpath = next(p for p in _PRE_LN_BLOCKS if _sub(m, p) is blocks)
        readers, writers = [], []
        ok = True
        for i, blk in enumerate(blocks):
            r = [a for a in _PRE_LN_READERS if _is_norm(_sub(blk, a))]
            w = [a for a in _PRE_LN_WRITERS if isinstance(_sub(blk, a), torch.nn.Module)
                 and getattr(_sub(blk, a), "weight", None) is not None]
            if not r or not w:
                ok = False
                break
            base = _join(prefix, f"{bpath}.{i}")
            readers += [f"{base}.{a}" for a in r]
            writers += [n for a in w for n in _own_params(f"{base}.{a}", _sub(blk, a))]  # peft-wrapped too
        if not ok:
            continue
        embed = []
        if _is_norm(getattr(m, "pre_layrnorm", None)):
            embed = _own_params(_join(prefix, "pre_layrnorm"), m.pre_layrnorm)
        else:
            for a in _PRE_LN_EMBED[1:]:
                sub = getattr(m, a, None)
                if isinstance(sub, torch.nn.Module):
                    embed += _own_params(_join(prefix, a), sub)
        if not embed:
            continue
        found.append(NormScalingBinding(embed + writers, readers + [_join(prefix, final)]))
    return found


def norm_scaling_candidates(model) -> list:
    """Every place in ``model`` where scaling the parameters that write into a normalisation by one c > 0
    may be a symmetry, found by module structure (duck typing on Hugging Face modules): pattern (a)
    (embedding tables → ``embeddings.LayerNorm``) and pattern (b) (pre-LN residual streams). Returns a list
    of :class:`NormScalingCandidate` ``(key, binding, reason)``: ``binding`` None and a ``reason`` where the
    structure already refuses it (a bound parameter is tied to another module, e.g. a masked-LM decoder or
    an LM head sharing the word table). Exactness (eps = 0, no other reader) is then decided by measuring,
    in :func:`norm_scaling_bindings`."""
    out = []
    for b in _embedding_candidates(model) + _pre_ln_candidates(model):
        ties = _ties(model, b.param_names)
        out.append(NormScalingCandidate(b.key, None, _tie_reason(model, ties)) if ties
                   else NormScalingCandidate(b.key, b, ""))
    return out


#: the group elements a norm-scaling binding is measured with
NORM_SCALING_ELEMENTS = (1e-2, 1e2)
#: powers of two: scaling by them is exact in binary floating point, so with eps = 0 the output is
#: unchanged to the last bit even where the model computes a norm in lower precision (the diagnostic of a
#: refusal whose reading norms all have eps = 0)
POWER_OF_TWO_ELEMENTS = (2.0 ** -7, 2.0 ** 7)


def _measure(model, binding, batch, output, elements) -> float:
    els = [torch.tensor([float(a)], dtype=torch.float64) for a in elements]
    try:
        return check_binding(model, binding, batch, output, els, tol=float("inf"))
    except ValueError:  # the change was not a number
        return float("nan")


def norm_scaling_bindings(model, batch, output, tol: float = 1e-10, elements=NORM_SCALING_ELEMENTS):
    """``(bindings, refused)``: the :class:`NormScalingBinding` of ``model`` that are exact symmetries, and
    ``(key, reason)`` for every candidate refused.

    ``batch``: one ``(inputs, targets)`` batch (inputs a dict of keyword arguments or one tensor);
    ``output``: the function of the model output that must stay unchanged (``lambda o: o.logits``). Each
    structural candidate (:func:`norm_scaling_candidates`) is acted on with each a of ``elements`` (default
    1e-2 and 1e2) in float64 (:func:`check_binding`) and accepted iff the largest relative change is
    ≤ ``tol`` **and** every reading norm has eps = 0 (with eps > 0 the symmetry is inexact even where a
    model's output happens to hide it below ``tol``, e.g. a freshly initialised model with tiny weights). With eps > 0 a LayerNorm gives N(c z) − N(z) ≈ (eps/2σ²)(1 − 1/c²)(N(z) − β), so the binding is
    refused and the reason gives the measured change and the norms' eps. Where every reading norm has
    eps = 0 and the change is still above ``tol``, the reason adds the change under a = 2^±7
    (:data:`POWER_OF_TWO_ELEMENTS`, exact in floating point): 0 there means the symmetry is exact and the
    change is the round-off of lower-precision arithmetic inside the model (Llama's RMSNorm computes in
    float32); pass ``elements=POWER_OF_TWO_ELEMENTS`` to accept it. A model with no candidate gives one
    refusal ``("norm-scaling", "not detected: …")``."""
    bindings, refused = [], []
    candidates = norm_scaling_candidates(model)
    if not candidates:
        return [], [("norm-scaling", "not detected: no embedding tables feeding a LayerNorm (pattern a) and no "
                                     "pre-LN residual stream (pattern b) found in the model's modules")]
    modules = dict(model.named_modules())
    shown = "{" + ", ".join(f"{float(a):g}" for a in elements) + "}"
    for key, b, reason in candidates:
        if b is None:
            refused.append((key, reason))
            continue
        change = _measure(model, b, batch, output, elements)
        eps = {n: _norm_eps(modules[n]) for n in b.norm_names}
        nonzero = {n: e for n, e in eps.items() if e != 0}
        if change <= tol and not nonzero:
            b.measured_change = change
            bindings.append(b)
            continue
        head = f"acting with a ∈ {shown} changed the output by {change:.3g} (relative, float64; tolerance {tol:g})"
        if nonzero:  # inexact whatever the batch shows: a small change only means this output hides it
            values = sorted({str(e) for e in nonzero.values()})
            where = next(iter(nonzero)) if len(nonzero) == 1 else f"{len(nonzero)} of {len(eps)} reading norms"
            refused.append((key, f"{head}: the norm's eps = {', '.join(values)} ({where}) breaks exact scale "
                                 f"invariance (N(c z) = N(z) only when eps = 0: (c z − c μ)/√(c²σ² + eps)); "
                                 f"set eps = 0 to have it"))
            continue
        exact = _measure(model, b, batch, output, POWER_OF_TWO_ELEMENTS)
        if exact <= tol:
            refused.append((key, f"{head} although every reading norm has eps = 0; with a = 2^±7 (exact in "
                                 f"floating point) the change is {exact:.3g}, so the symmetry is exact and the "
                                 f"change is round-off of lower-precision arithmetic inside the model (e.g. a norm "
                                 f"computed in float32); pass elements=POWER_OF_TWO_ELEMENTS to accept it"))
        else:
            refused.append((key, f"{head} although every reading norm has eps = 0 (and {exact:.3g} with a = "
                                 f"2^±7): something reads the scaled parameters without a norm, or a writer of "
                                 f"the stream is missing from the binding"))
    return bindings, refused
