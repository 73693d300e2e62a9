"""Calling a model on functional parameters: the one place every layer calls a model through (no parameter is
ever modified).

``model_loss(model, params, (inputs, targets), loss_fn)`` calls the model with ``params`` through
``torch.func.functional_call`` (inputs: a tensor passed positionally, or a dict passed as keyword
arguments), takes its logits (``.logits`` if present, the first element of a tuple, or the output)
and applies ``loss_fn`` (default: mean cross-entropy over all positions).

A batch may also be a :class:`LengthBuckets` (the fast path for padded text, :func:`length_buckets`):
``model_loss`` then evaluates its groups of similar length, each cut to its longest row, and weights their
losses by their share of the counted targets, which is the plain pair's mean cross-entropy up to round-off.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import functional_call

from .precision import keep_float64

__all__ = ["IGNORE_INDEX", "model_logits", "check_targets", "default_loss", "call_model", "model_loss",
           "group_by_group_loss", "to_device", "check_finite_batch", "float64_inputs", "LengthBuckets",
           "length_buckets", "check_length_buckets", "padded_extent",
           "batch_to_device", "model_device"]


def model_logits(out):
    """The logits of a model output: ``.logits``, the first element of a tuple, or the output itself (a
    backbone's hidden states are refused: it has no logits)."""
    if hasattr(out, "last_hidden_state") and getattr(out, "logits", None) is None:
        raise ValueError("the model returned hidden states, not logits (a backbone without a task head); attach "
                         "a head first (geosharp evaluate/verify --num-labels K fits one as a linear probe)")
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


#: a target that takes no part in the loss (cross-entropy's ``ignore_index``): the unmasked positions of a
#: masked-LM batch, the padding of a causal-LM batch
IGNORE_INDEX = -100


def check_targets(logits, targets) -> None:
    """Targets fit the logits: integer class indices in [0, C) (or :data:`IGNORE_INDEX`) of shape
    ``logits.shape[:-1]``."""
    if not torch.is_tensor(targets):
        raise ValueError(f"targets must be a tensor of class indices, got {type(targets).__name__}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer class indices (torch.long), got dtype {targets.dtype}; "
                         f"convert them with targets.long() if they are whole numbers")
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"targets of shape {tuple(targets.shape)} do not match the model's logits of shape "
                         f"{tuple(logits.shape)}: expected {tuple(logits.shape[:-1])} (one class index per "
                         f"example, or per position for per-token logits)")
    C = logits.shape[-1]
    wrong = ((targets < 0) & (targets != IGNORE_INDEX)) | (targets >= C)
    if bool(wrong.any()):
        bad = targets[wrong]
        raise ValueError(f"targets must be class indices in [0, {C}) for this model's {C} logits; found "
                         f"{sorted(set(bad.tolist()))[:5]} (a label set larger than the model's head? "
                         f"fit a head with --num-labels K)")


def default_loss(logits, targets):
    """Mean cross-entropy over all positions (logits (..., C), integer targets (...)) whose target is not
    :data:`IGNORE_INDEX` (−100): a classifier's loss, or a checkpoint's own pre-training loss (masked-LM:
    targets the original tokens at masked positions, −100 elsewhere; causal-LM: the next tokens). Targets
    that do not fit the logits are refused with a clear message (:func:`check_targets`)."""
    check_targets(logits, targets)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def call_model(model, params, inputs):
    """``model`` evaluated at the parameters ``params`` (name → tensor) on ``inputs`` (a tensor passed
    positionally, or a dict passed as keyword arguments), through ``torch.func.functional_call``. With float64
    parameters the forward runs inside :func:`geosharp_ref.precision.keep_float64` (no float32 softmax or
    RMSNorm inside a float64 model)."""
    with keep_float64(_float64_params(params)):
        if isinstance(inputs, dict):
            return functional_call(model, params, args=(), kwargs=inputs)
        return functional_call(model, params, args=(inputs,))


def _float64_params(params) -> bool:
    """Whether a forward at ``params`` (a dict) runs inside :func:`keep_float64`: its first tensor is float64."""
    first = next(iter(params.values()), None) if isinstance(params, dict) else None
    return first is not None and first.dtype is torch.float64


def model_loss(model, params, batch, loss_fn=default_loss):
    """``loss_fn(logits of model at params on inputs, targets)`` for a batch ``(inputs, targets)``; for a
    :class:`LengthBuckets` Σ_k w_k · (the same on group k). With :func:`default_loss` the K groups run inside one
    ``functional_call`` (the parameters are put in place once, not K times: :class:`_GroupsLoss`; the same
    operations in the same order as :func:`group_by_group_loss`, the readable reference, so the same value and
    gradient bit for bit). Another ``loss_fn`` may read the model or cast the logits, so it runs as before: once
    per group, after the call, with the model's own parameters back in place and outside
    :func:`~geosharp_ref.precision.keep_float64`."""
    if isinstance(batch, LengthBuckets):
        if loss_fn is not default_loss or not isinstance(params, dict) \
                or any(isinstance(g, LengthBuckets) for g in batch.groups):
            return group_by_group_loss(model, params, batch, loss_fn)
        return functional_call(_GroupsLoss(model, _float64_params(params)),
                               {"model." + n: t for n, t in params.items()}, args=(batch,))
    inputs, targets = batch
    return loss_fn(model_logits(call_model(model, params, inputs)), targets)


def group_by_group_loss(model, params, batch, loss_fn=default_loss):
    """Σ_k w_k · loss_fn(logits of model at params on group k, its targets) for a :class:`LengthBuckets`, one
    ``functional_call`` per group: the reference :func:`model_loss`'s one-call path is tested against."""
    return sum(w * model_loss(model, params, group, loss_fn) for w, group in zip(batch.weights, batch.groups))


class _GroupsLoss(torch.nn.Module):
    """The :func:`default_loss` of a :class:`LengthBuckets` batch as one module call: ``model`` (a submodule, so
    its parameters are this module's ``model.*``) on each group in turn (inside
    :func:`~geosharp_ref.precision.keep_float64` where ``float64``, as :func:`call_model` runs it), Σ_k w_k ·
    default_loss(logits_k, targets_k) summed as :func:`group_by_group_loss` sums it. ``functional_call`` on it
    swaps the parameters in (and checks tied weights) once per batch instead of once per group."""

    def __init__(self, model, float64: bool):
        super().__init__()
        self.model, self.float64 = model, float64

    def forward(self, batch):
        def group_loss(inputs, targets):
            with keep_float64(self.float64):
                out = self.model(**inputs) if isinstance(inputs, dict) else self.model(inputs)
            return default_loss(model_logits(out), targets)
        return sum(w * group_loss(*group) for w, group in zip(batch.weights, batch.groups))


def to_device(x, device, dtype):
    if isinstance(x, dict):
        return {k: to_device(v, device, dtype) for k, v in x.items()}
    if torch.is_tensor(x):
        x = x.to(device)
        return x.to(dtype) if x.is_floating_point() else x
    return x


def batch_to_device(batch, device):
    """``(inputs, targets)`` with every tensor moved to ``device`` (dtypes kept)."""
    def move(x):
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        return x.to(device) if torch.is_tensor(x) else x
    inputs, targets = batch
    return move(inputs), move(targets)


def model_device(model) -> torch.device:
    """The device of ``model``'s parameters (the CPU for a model without any); the library computes there."""
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def check_finite_batch(batch, i):
    """Batch ``i`` is usable: finite floating-point inputs and targets, and (integer targets) at least one
    target that is not :data:`IGNORE_INDEX`: a batch whose every position is ignored has no loss (the mean
    cross-entropy over zero positions is NaN), refused here before any compute."""
    inputs, targets = batch
    if torch.is_tensor(targets) and not targets.is_floating_point() and targets.numel() \
            and bool((targets == IGNORE_INDEX).all()):
        raise ValueError(f"batch {i}: every target is {IGNORE_INDEX} (ignored), so no position is scored and its "
                         f"loss is undefined (NaN); use a larger --batch-size, or drop the documents that have no "
                         f"target (too short for --max-length; `geosharp data` warns about them)")
    items = inputs.items() if isinstance(inputs, dict) else [("inputs", inputs)]
    for name, t in list(items) + [("targets", targets)]:
        if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all():
            raise ValueError(f"batch {i}: {name} contains NaN or inf; clean the data before evaluating")


def float64_inputs(inputs):
    """Floating-point input tensors (a tensor or a dict of them) in float64, for a model's float64 copy."""
    def cast(x):
        return x.to(torch.float64) if torch.is_tensor(x) and x.is_floating_point() else x
    return {k: cast(v) for k, v in inputs.items()} if isinstance(inputs, dict) else cast(inputs)


# ------------------------------------------------------------------------------------------------
# Length buckets: padded text evaluated in groups of similar length (the fast path of model_loss)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LengthBuckets:
    """One batch of N padded sequences as K groups of rows of similar length, each cut to its longest row.

    ``groups``: K ``(inputs, targets)`` pairs (rows sorted by :func:`padded_extent`, then split into K runs of
    ⌈N/K⌉ or ⌊N/K⌋ rows; every tensor of shape (n, L, …) cut to the group's extent ℓ_k); ``weights``: w_k =
    c_k / c, the group's share of the counted targets (those not :data:`IGNORE_INDEX`), so that
    Σ_k w_k L_k is the whole batch's mean cross-entropy; ``rows``: the batch's row indices of each group.

    With right padding and a model whose real positions ignore the padded ones (masked attention, positions
    counted from the left), the loss equals the plain batch's up to round-off, at Σ_k n_k ℓ_k instead of N·L
    token evaluations."""

    groups: tuple
    weights: tuple
    rows: tuple

    @property
    def tokens(self) -> int:
        """Σ_k n_k ℓ_k: the token positions evaluated (N·L for the plain batch)."""
        return sum(int(r.numel()) * int(g[0]["attention_mask"].shape[1]) for r, g in zip(self.rows, self.groups))


def padded_extent(inputs: dict, targets=None) -> torch.Tensor:
    """Per row, 1 + the last position that is real (``attention_mask`` ≠ 0) or scored (a per-position target
    that is not :data:`IGNORE_INDEX`): the row's length without its right padding, shape (N,) long."""
    mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
    if not torch.is_tensor(mask) or mask.dim() != 2:
        raise ValueError("length buckets need padded text: a dict of inputs with an attention_mask of shape "
                         "(batch, length); this batch has none (leave length buckets off)")
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    used = mask != 0
    if torch.is_tensor(targets) and tuple(targets.shape) == tuple(mask.shape):
        used = used | (targets != IGNORE_INDEX)
    return (used * positions).amax(dim=1)


def _take(x, rows, n: int, length: int, width: int):
    """``x`` restricted to ``rows`` (tensors whose first dimension is the batch's ``n``) and cut to ``width``
    positions (tensors of shape (n, length, …))."""
    if isinstance(x, dict):
        return {k: _take(v, rows, n, length, width) for k, v in x.items()}
    if not torch.is_tensor(x) or x.dim() == 0 or x.shape[0] != n:
        return x
    x = x[rows]
    return x[:, :width] if x.dim() >= 2 and x.shape[1] == length else x


def check_length_buckets(k, required: bool = False) -> None:
    """``k`` is an integer ≥ 1 (the number of length buckets), or None where not ``required`` (no buckets)."""
    if (k is None and not required) or (not isinstance(k, bool) and isinstance(k, int) and k >= 1):
        return
    raise ValueError(f"length_buckets (--length-buckets) must be an integer of at least 1 (groups of similar "
                     f"length per batch), got {k!r}")


def length_buckets(batch, k: int) -> LengthBuckets:
    """``batch = (inputs, targets)`` (inputs a dict with ``attention_mask`` (N, L)) as at most ``k`` groups of
    similar length (see :class:`LengthBuckets`; ``k`` ≥ 1, at most N groups; ``k`` = 1 only cuts the common
    right padding)."""
    check_length_buckets(k, required=True)
    inputs, targets = batch
    extent = padded_extent(inputs, targets)
    n, length = inputs["attention_mask"].shape
    order = torch.argsort(extent, stable=True)
    rows = tuple(r for r in order.tensor_split(min(k, n)) if r.numel())
    widths = [max(int(extent[r].max()), 1) for r in rows]
    groups = tuple((_take(inputs, r, n, length, w), _take(targets, r, n, length, w)) for r, w in zip(rows, widths))
    counted = [int((g[1] != IGNORE_INDEX).sum()) if torch.is_tensor(g[1]) and not g[1].is_floating_point()
               else int(r.numel()) for g, r in zip(groups, rows)]
    total = sum(counted)
    weights = tuple(c / total for c in counted) if total else tuple(int(r.numel()) / n for r in rows)
    return LengthBuckets(groups=groups, weights=weights, rows=rows)
