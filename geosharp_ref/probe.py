"""A linear probe: fit a fresh classification head on a frozen backbone, for checkpoints without a head.

An encoder checkpoint (``BertModel``, a sentence-transformers folder, a ViT backbone) outputs hidden
states, not logits, so it has no loss to be sharp about. ``load_model(…, num_labels=K)`` attaches the
architecture's standard K-class head (``…ForSequenceClassification`` / ``…ForImageClassification``,
initialised from a seed); :func:`fit_linear_probe` then fits that head alone:

    min_{W, b}  (1/N) Σᵢ CE(W fᵢ + b, yᵢ) + (λ/2) ‖W‖²_F,

where fᵢ is the head's input for example i (the pooled or [CLS] representation, computed once with the
backbone frozen and in eval mode). The problem is convex; L-BFGS solves it to a tolerance. The
backbone's weights are untouched, and sharpness is then measured on the whole model, head included.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .forward import call_model

__all__ = ["classification_head", "head_features", "fit_linear_probe"]


def classification_head(model: nn.Module, num_labels: int) -> nn.Linear:
    """The last ``nn.Linear`` of ``model`` with ``num_labels`` outputs (its classification head)."""
    heads = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == num_labels]
    if not heads:
        raise ValueError(f"{type(model).__name__} has no linear layer with {num_labels} outputs to fit as a probe")
    return heads[-1]


def _last_token(features, chunk, model):
    """A decoder's sequence head (``LlamaForSequenceClassification`` and kin) is applied at every position,
    (B, L, d), and its logits are taken at the last non-padding token: ``argmax_t t·[input_ids_t ≠ pad]`` as
    transformers computes it. The same pooling of the features, (B, d)."""
    if features.dim() != 3:
        return features
    ids = chunk.get("input_ids") if isinstance(chunk, dict) else None
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    if ids is None or pad is None:
        raise ValueError(f"{type(model).__name__}'s head reads every position, so the probe needs the last "
                         f"non-padding token of each example: give input_ids, and a pad_token_id in config.json")
    positions = torch.arange(ids.shape[-1], device=ids.device)
    last = (positions * (ids != pad).int()).argmax(-1)
    return features[torch.arange(features.shape[0], device=features.device), last.to(features.device)]


@torch.no_grad()
def head_features(model: nn.Module, head: nn.Linear, inputs, batch_size: int = 64) -> torch.Tensor:
    """The inputs of ``head`` for every example, (N, d), the model in eval mode (a decoder's per-position
    features pooled at the last non-padding token, as its sequence-classification head does)."""
    feats = []
    hook = head.register_forward_hook(lambda mod, args, out: feats.append(args[0].detach()))
    was_training = model.training
    model.eval()
    try:
        n = next(iter(inputs.values())).shape[0] if isinstance(inputs, dict) else inputs.shape[0]
        params = dict(model.named_parameters())
        for i in range(0, n, batch_size):
            chunk = ({k: (v[i:i + batch_size] if torch.is_tensor(v) else v) for k, v in inputs.items()}
                     if isinstance(inputs, dict) else inputs[i:i + batch_size])
            call_model(model, params, chunk)
            feats[-1] = _last_token(feats[-1], chunk, model)
    finally:
        hook.remove()
        model.train(was_training)
    return torch.cat(feats).reshape(-1, head.in_features)


def fit_linear_probe(model: nn.Module, inputs, targets: torch.Tensor, num_labels: int, l2: float = 1e-3,
                     max_iter: int = 500, batch_size: int = 64) -> dict:
    """Fit the K-class head of ``model`` on (inputs, targets) with everything else frozen (see the module
    doc); writes the head in place and returns ``{"accuracy", "loss", "examples", "num_labels", "l2",
    "iterations"}`` on the fitting data."""
    targets = torch.as_tensor(targets)
    if targets.dim() != 1:
        raise ValueError(f"a linear probe needs one class index per example, targets of shape (N,); got "
                         f"{tuple(targets.shape)}")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer class indices, got dtype {targets.dtype}")
    bad = (targets < 0) | (targets >= num_labels)
    if bool(bad.any()):
        raise ValueError(f"targets must lie in [0, {num_labels}) for --num-labels {num_labels}; "
                         f"found {sorted(set(targets[bad].tolist()))[:5]}")
    head = classification_head(model, num_labels)
    X = head_features(model, head, inputs, batch_size).double()
    y = targets.long()
    W = head.weight.detach().double().clone().requires_grad_(True)
    b = (head.bias.detach().double().clone() if head.bias is not None
         else torch.zeros(num_labels, dtype=torch.float64)).requires_grad_(True)
    opt = torch.optim.LBFGS([W, b], max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def objective():
        opt.zero_grad()
        loss = F.cross_entropy(X @ W.T + b, y) + 0.5 * l2 * W.square().sum()
        loss.backward()
        return loss

    opt.step(objective)
    with torch.no_grad():
        head.weight.copy_(W.to(head.weight.dtype))
        if head.bias is not None:
            head.bias.copy_(b.to(head.bias.dtype))
        logits = X @ W.T + b
        acc = float((logits.argmax(-1) == y).double().mean())
        loss = float(F.cross_entropy(logits, y))
    return dict(accuracy=acc, loss=loss, examples=int(len(y)), num_labels=int(num_labels), l2=float(l2),
                iterations=int(opt.state[W].get("n_iter", 0)))
