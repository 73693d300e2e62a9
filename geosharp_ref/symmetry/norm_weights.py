r"""Norm weights quotiented jointly with the symmetries of their readers: the fold.

A pre-norm block computes N(z) = γ ⊙ n(z) (+ β for LayerNorm; Gemma's RMSNorm stores w with γ = 1 + w) and
reads N(z) only through linear maps, its **readers** (q/k/v, gate/up, fc1, a classifier head, LoRA's
``lora_A``): y_r = W_r N(z) + b_r. For D = diag(d), every dᵢ ≠ 0,

    (γ, β, W_r) ↦ (D γ, D β, W_r D⁻¹)        (every reader r at once)

leaves every y_r, hence the model, unchanged **at any eps** (the normalisation n(z) is not touched). Its
readers carry further symmetries (GL(h) pairs, gated units, LoRA's GL(r), the head's translation): the
groups overlap, so the norm group is quotiented *jointly* with them.

**The fold.** φ(γ, W) = (γ, Ŵ) with Ŵ_r = W_r Γ (Γ = diag γ; the reader's input axis scaled by γ) is a
diffeomorphism where every γᵢ ≠ 0. In these coordinates the norm group acts on γ alone (transitively on each
orthant: the quotient of the γ coordinates is a point) and the readers' symmetries act on Ŵ alone (they act
on the readers' other axis, so they commute with Γ). The metric of the joint quotient is the pullback by φ
of the product metric Σ dγᵢ²/γᵢ² ⊕ g(Ŵ), g the readers' own invariant geometry evaluated on the folded
blocks: invariant under the whole product group, because φ intertwines its action with the product action.
Consequences, all used by the evaluator:

* horizontal vectors have ξ_γ = 0 (γ does not move) and Γ ξ_W horizontal for the readers' geometry at Ŵ;
* geodesics are φ⁻¹ of product geodesics: γ fixed, W(t) = Ŵ(t) Γ⁻¹ with Ŵ(t) the readers' geodesic;
* a reader in the adaptive geometry needs nothing: the element-wise ball {|W| ⊙ z : ‖z‖ ≤ ρ} is the same
  set for W and Ŵ; β stays adaptive (its ball is invariant under β ↦ Dβ for the same reason).

So the joint quotient is implemented by :func:`fold_binding`: any binding whose parameters read a norm sees
the folded blocks (``extract`` of Ŵ, ``insert`` mapping a new Ŵ back to W = Ŵ Γ⁻¹), and the norm's own
binding (:class:`NormWeightsBinding`) moves nothing (``kernels`` None: no factor, γ leaves the adaptive
geometry). The invariance proof of the folded metric and its projection/geodesic against a dense reference
are in ``derivations/joint_folded.py`` and its tests (docs/MATH.md, "Folded metrics of norm × Q/K" and "In the
evaluator").

Detection (:func:`norm_weight_candidates`): one forward pass with hooks records which linear layers receive
a norm module's output tensor itself; a candidate is bound only once acting with random elements at scales
10⁻² and 10² leaves the log-probabilities unchanged (float64, 1e-10): a post-LN model, whose norm output also
feeds the residual stream, fails that check. A reader whose weight is tied to another parameter (a language
model's head tied to the input embeddings) is refused before any check.
"""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Optional

import torch

from ..forward import call_model, model_device, to_device
from .binding import Candidate

__all__ = ["NormFold", "NormWeightsBinding", "fold_binding", "folds_of", "norm_weight_candidates", "KIND"]

#: the family's name in reports
KIND = "norm weights"


@dataclass(frozen=True)
class NormFold:
    """A norm's weight and its readers: ``gamma`` (parameter name; γ = params[gamma] + ``offset``),
    ``bias`` (β's name or None), ``readers``: (parameter name, input axis) per reader weight (nn.Linear /
    LoRA's ``lora_A``: axis -1, transformers' Conv1D: axis 0)."""

    norm: str
    gamma: str
    offset: float
    bias: Optional[str]
    readers: tuple

    @property
    def reader_names(self) -> tuple:
        return tuple(n for n, _ in self.readers)

    def gamma_of(self, params) -> torch.Tensor:
        return params[self.gamma] + self.offset if self.offset else params[self.gamma]

    def _along(self, g, W, axis):
        """γ shaped to broadcast along ``axis`` of W."""
        shape = [1] * W.dim()
        shape[axis] = -1
        return g.reshape(shape).to(W.dtype)

    def fold(self, params, names) -> dict:
        """``params`` with each reader among ``names`` folded, Ŵ = W Γ (a new dict)."""
        out = dict(params)
        g = self.gamma_of(params)
        for n, axis in self.readers:
            if n in names:
                out[n] = params[n] * self._along(g, params[n], axis)
        return out

    def unfold(self, params, folded, moved, names) -> dict:
        """``moved`` (a dict built from ``folded``) mapped back: each reader among ``names`` gets
        W + (Ŵ' − Ŵ) Γ⁻¹, so its elements the binding did not touch stay bit for bit what they were."""
        out = dict(moved)
        g = self.gamma_of(params)
        for n, axis in self.readers:
            if n in names:
                out[n] = params[n] + (moved[n] - folded[n]) / self._along(g, params[n], axis)
        return out


class NormWeightsBinding:
    """The norm group (γ, β, W_r) ↦ (Dγ, Dβ, W_r D⁻¹) of one norm and its readers (the module doc).

    It binds γ only (``param_names``), whose quotient is a point: ``kernels`` is None (no factor; γ is not
    perturbed). Its readers are quotiented by their own symmetries on folded blocks (:func:`fold_binding`,
    which :class:`~geosharp_ref.symmetry.quotient.Quotient` applies) or stay adaptive; β stays adaptive."""

    kernels = None

    def __init__(self, fold: NormFold):
        self.fold = self.joint_fold = fold
        self.key = f"{fold.norm}:norm-weights"
        self.param_names = (fold.gamma,)

    @property
    def summary(self) -> str:
        readers = ", ".join(n.rsplit(".", 1)[0].rsplit(".", 1)[-1] for n in self.fold.reader_names)
        return f"folded into {len(self.fold.readers)} readers ({readers}); γ not perturbed (its quotient is a point)"

    def extract(self, params) -> tuple:
        return (self.fold.gamma_of(params),)

    def insert(self, params, blocks) -> dict:
        out = dict(params)
        out[self.fold.gamma] = blocks[0] - self.fold.offset if self.fold.offset else blocks[0]
        return out

    def random_element(self, params, scale: float = 1.0, seed: int = 0, signs: bool = False):
        """d = scale · exp(N(0, 0.3²)) per channel, in the identity component (d > 0, as the other built-ins'
        elements: Monte Carlo measures with common random numbers are equivariant there); ``signs``: random signs
        too (the group's other components: γᵢ ↦ −γᵢ with the reader's column negated)."""
        g = self.fold.gamma_of(params)
        gen = torch.Generator().manual_seed(seed)
        mag = torch.exp(0.3 * torch.randn(g.shape, generator=gen, dtype=torch.float64))
        sign = torch.where(torch.rand(g.shape, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
        return (scale * mag * (sign if signs else 1.0)).to(dtype=g.dtype, device=g.device)

    def act(self, params, d) -> dict:
        """γ ↦ d γ, β ↦ d β, every reader W ↦ W D⁻¹ along its input axis."""
        f = self.fold
        out = dict(params)
        out[f.gamma] = d * f.gamma_of(params) - f.offset if f.offset else d * params[f.gamma]
        if f.bias is not None:
            out[f.bias] = d * params[f.bias]
        for n, axis in f.readers:
            out[n] = params[n] / f._along(d, params[n], axis)
        return out


class _Folded:
    """Mixin of :func:`fold_binding`: the binding's blocks read through the folds (``norm_folds``)."""

    norm_folds: tuple = ()

    def _names(self, fold):
        return set(fold.reader_names) & set(self.param_names)

    def extract(self, params) -> tuple:
        for f in self.norm_folds:
            params = f.fold(params, self._names(f))
        return super().extract(params)

    def insert(self, params, blocks) -> dict:
        folded = params
        for f in self.norm_folds:
            folded = f.fold(folded, self._names(f))
        out = super().insert(folded, blocks)
        for f in self.norm_folds:  # readers of different norms are different tensors: undo each fold
            out = f.unfold(params, folded, out, self._names(f))
        return out

    def with_metric(self, metric):
        return fold_binding(super().with_metric(metric), self.norm_folds)


_CLASSES: dict = {}


def fold_binding(binding, folds):
    """``binding`` seen through the norm folds that touch its parameters (the module doc): a copy of it whose
    ``extract`` returns the blocks of the folded parameters Ŵ = W Γ and whose ``insert`` maps new blocks back
    (W = Ŵ Γ⁻¹); its action, key, kernels and every other attribute are unchanged (the readers' symmetries
    act on the readers' other axis, so they commute with the fold). Returned unchanged when no fold touches
    it; an instance of a subclass of its class, so ``isinstance`` still holds."""
    names = set(binding.param_names)
    folds = tuple(f for f in folds if names & set(f.reader_names))
    if not folds:
        return binding
    base = type(binding)
    if issubclass(base, _Folded):
        folds = tuple(dict.fromkeys(binding.norm_folds + folds))
        base = base.__mro__[2]  # the class it was made from
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = type(f"Folded{base.__name__}", (_Folded, base), {"__module__": base.__module__})
    out = copy.copy(binding)
    object.__setattr__(out, "__class__", cls)
    object.__setattr__(out, "norm_folds", folds)
    return out


def folds_of(bindings) -> tuple:
    """The folds (``joint_fold``) of the bindings among ``bindings`` that are quotiented jointly with the
    symmetries of other parameters: every :class:`NormWeightsBinding`, and a stream scaling whose writers
    other symmetries hold (:meth:`~geosharp_ref.symmetry.norms.NormScalingBinding.joint_with`)."""
    return tuple(f for b in bindings if (f := getattr(b, "joint_fold", None)) is not None)


# -- detection --------------------------------------------------------------------------------------------

def _is_norm(m) -> bool:
    w = getattr(m, "weight", None)
    name = type(m).__name__
    return (isinstance(w, torch.nn.Parameter) and w.dim() == 1 and "Norm" in name and "Group" not in name
            and "Batch" not in name and "Instance" not in name)


def _reader_axis(m) -> Optional[int]:
    """The input axis of a linear layer's weight: nn.Linear -1, transformers' Conv1D 0; None otherwise."""
    if isinstance(m, torch.nn.Linear):
        return -1
    if type(m).__name__ == "Conv1D" and getattr(m, "weight", None) is not None and m.weight.dim() == 2:
        return 0
    return None


def _gamma_offset(m) -> float:
    """1.0 where the norm multiplies by (1 + w) (Gemma's RMSNorm), else 0."""
    try:
        src = inspect.getsource(type(m).forward)
    except (OSError, TypeError):
        return 0.0
    return 1.0 if "1.0 + self.weight" in src or "1 + self.weight" in src else 0.0


def norm_weight_candidates(model, batch) -> list:
    """Every norm module whose output tensor is passed, as it is, to linear layers (one forward pass on
    ``batch`` with hooks): a :class:`~geosharp_ref.symmetry.binding.Candidate` with a
    :class:`NormWeightsBinding` per such norm, or its refusal (a reader's weight tied to another parameter).
    Norms whose output no linear layer receives (post-LN models' last norms, a stream read by the residual
    only) are not candidates."""
    names = {m: n for n, m in model.named_modules()}
    norms = [m for m in names if _is_norm(m)]
    if not norms:
        return []
    outputs, readers, returned, handles = {}, {}, {}, []
    norm_set = set(norms)

    def root(t):
        """The tensor ``t`` is a view of (itself when not a view)."""
        return t._base if t._base is not None else t

    def on_output(m, inp, out):
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        if not torch.is_tensor(first) or (inp and first is inp[0]):  # an identity (dropout in eval) passes nothing on
            return
        if m in norm_set:
            outputs[id(first)] = (m, first)  # held: its id is not reused during the pass
        else:  # a module that returns a norm's output passes it on (a post-LN block: the residual stream)
            returned[id(root(first))] = first

    def on_linear(m, inp):
        if inp and torch.is_tensor(inp[0]):  # the norm's output itself, or a view of it (e.g. the last position)
            readers.setdefault(id(root(inp[0])), []).append((m, inp[0]))

    for m in names:
        handles.append(m.register_forward_hook(on_output))
        if _reader_axis(m) is not None:
            handles.append(m.register_forward_pre_hook(on_linear))
    try:
        with torch.no_grad():
            dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
            call_model(model, {}, to_device(batch[0], model_device(model), dtype))
    finally:
        for h in handles:
            h.remove()
    owners = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(n)
    out = []
    for key, (norm, tensor) in outputs.items():
        found = [m for m, t in readers.get(key, [])
                 if (t is tensor or root(t) is tensor) and t.shape[-1] == tensor.shape[-1]]
        if not found or key in returned:
            continue
        path = names[norm]
        cand_key = f"{path}:norm-weights"
        tied = [owners[id(m.weight)] for m in found if len(owners.get(id(m.weight), ())) > 1]
        if tied:
            return_names = tied[0]
            out.append(Candidate(cand_key, None, f"its reader's weight {return_names[-1]} is tied to "
                                                  f"{', '.join(return_names[:-1])} (e.g. a head tied to the input "
                                                  f"embeddings): scaling its input axis would scale that too"))
            continue
        rs = tuple(dict.fromkeys((owners[id(m.weight)][0], _reader_axis(m)) for m in found))
        bias = getattr(norm, "bias", None)
        fold = NormFold(path, owners[id(norm.weight)][0], _gamma_offset(norm),
                        owners[id(bias)][0] if isinstance(bias, torch.nn.Parameter) else None, rs)
        out.append(Candidate(cand_key, NormWeightsBinding(fold), ""))
    return out
