"""The exactness check every binding passes before it is used: acting on the model must not change it.

* :func:`check_binding` — act on a float64 copy of the model with given group elements and measure the
  largest relative change of ``output(model output)``; refused (ValueError with the change) above ``tol``;
* :func:`check_symmetry` — the standard check: the binding's own random elements at :data:`CHECK_SCALES`
  (10⁻² and 10²), on the log-probabilities (:func:`log_probabilities`), tolerance :data:`CHECK_TOL` (1e-10).
"""
from __future__ import annotations

import contextlib
import copy
import weakref

import torch

from ..forward import batch_to_device, call_model, float64_inputs, model_device
from ..kernels import load_kernels

__all__ = ["check_binding", "check_symmetry", "shared_float64_reference", "float64_parameters",
           "check_symmetries_together", "check_attention_pairs", "output_tensors", "rank_refusal",
           "log_probabilities", "CHECK_SCALES", "CHECK_TOL"]

#: the scales a of the group elements a·Ã every binding is checked with
CHECK_SCALES = (1e-2, 1e2)
#: the largest relative change of the log-probabilities an accepted binding may cause (float64)
CHECK_TOL = 1e-10


def log_probabilities(out):
    """What the checks compare: log softmax of a model output's logits (``.logits``, the first element of a
    tuple, or the output), or a backbone's ``last_hidden_state`` as it is."""
    if getattr(out, "logits", None) is None and hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    logits = out.logits if hasattr(out, "logits") else out[0] if isinstance(out, (tuple, list)) else out
    return torch.log_softmax(logits, dim=-1)


#: inside :func:`shared_float64_reference`: model -> (fingerprint of its parameters, float64 model, its params,
#: {batch key: (inputs, base output)}), so that checking many bindings copies the model once and runs its
#: unmoved forward once per batch; None outside (every check makes its own copy, freed after it)
_REFERENCES = None


@contextlib.contextmanager
def shared_float64_reference():
    """Within this block, :func:`check_binding` calls on one model share one float64 copy and one unmoved
    forward per batch (released at the end of the outermost block)."""
    global _REFERENCES
    outer = _REFERENCES
    if outer is None:
        _REFERENCES = weakref.WeakKeyDictionary()
    try:
        yield
    finally:
        if outer is None:
            _REFERENCES = None


def _fingerprint(model) -> tuple:
    """Which tensors the model's parameters are and how often they were modified in place (``_version``): a
    cached copy is reused only while this is unchanged."""
    return tuple((id(p), p._version, p.dtype, p.device) for p in model.parameters())


def _float64_reference(model):
    """``(m, params, bases)``: ``model`` itself when all its parameters are float64 already (calls are
    functional: nothing is modified), else one float64 copy (eval), cached while the model's parameters are
    unchanged; ``bases`` caches unmoved outputs."""
    fingerprint = _fingerprint(model)
    ref = _REFERENCES.get(model) if _REFERENCES is not None else None
    if ref is None or ref[0] != fingerprint:
        if all(p.dtype == torch.float64 for p in model.parameters()):
            m = model
        else:
            m = copy.deepcopy(model).to(torch.float64).eval()
        ref = (fingerprint, m, {n: p.detach() for n, p in m.named_parameters()}, {})
        if _REFERENCES is not None:
            _REFERENCES[model] = ref
    return ref[1:]


def float64_parameters(model) -> dict:
    """Name → detached float64 tensor of ``model``'s parameters: those of the shared float64 reference inside
    :func:`shared_float64_reference` (no further copy), else a fresh copy."""
    return _float64_reference(model)[1]


def check_binding(model, binding, batch, output, elements, tol: float = 1e-10) -> float:
    """Act on a float64 copy of the model with each group element and measure the largest relative change
    of ``output(model output)``; a binding that changes it by more than ``tol`` is refused (ValueError with
    the measured change). Returns the largest change.

    The float64 copy (none when the model is float64 already) and the unmoved output on ``batch`` are made
    once per model and reused by later checks while its parameters are unchanged (forwards without autograd:
    memory is one float64 model plus one forward's activations)."""
    m, params, bases = _float64_reference(model)
    inputs = float64_inputs(batch_to_device(batch, model_device(m))[0])  # on the model's device

    def run(p):
        with torch.no_grad():
            return output(call_model(m, p, inputs))

    key = (id(batch[0]), output)
    cached = bases.get(key)
    if cached is None or cached[0] is not batch[0]:
        bases.clear()
        cached = bases[key] = (batch[0], run(params))  # the batch is held, so its id is not reused
    base = cached[1]
    worst = 0.0
    for a in elements:
        moved = run(binding.act(params, a))
        worst = max(worst, float((moved - base).abs().max() / base.abs().max().clamp_min(1e-300)))
    if not worst <= tol:
        raise ValueError(f"binding {binding.key} is not a symmetry of this model: acting on it changed the "
                         f"output by {worst:.3g} (relative, float64; tolerance {tol:g})")
    return worst


class _Together:
    """Several bindings on disjoint parameters acting at once: ``act(params, elements)`` composes their
    actions (one element per binding)."""

    def __init__(self, bindings):
        self.bindings = list(bindings)
        self.key = f"{len(self.bindings)} bindings together"

    def act(self, params, elements):
        for b, a in zip(self.bindings, elements):
            params = b.act(params, a)
        return params


def check_symmetries_together(model, bindings, batch, seed: int = 0, params64=None,
                              output=log_probabilities) -> float:
    """:func:`check_symmetry` of several bindings on disjoint parameters at once: each binding's own random
    elements (the same ones :func:`check_symmetry` draws) applied together, one forward per scale of
    :data:`CHECK_SCALES` instead of one per binding and scale. Returns the largest relative change of
    ``output(model output)`` (default the log-probabilities); ValueError above :data:`CHECK_TOL` (then check them
    one by one to name the culprit; generic random elements of different bindings do not cancel each other's
    changes)."""
    with shared_float64_reference():
        if params64 is None:
            params64 = float64_parameters(model)
        elements = [[b.random_element(params64, scale=a, seed=seed + i) for b in bindings]
                    for i, a in enumerate(CHECK_SCALES)]
        worst = check_binding(model, _Together(bindings), batch, output, elements, tol=CHECK_TOL)
    for b in bindings:
        if hasattr(b, "checked"):
            b.checked = True
    return worst


def rank_refusal(binding, params, eps: float = 0.0):
    """Why ``binding``'s quotient geometry cannot be used at ``params``, or None: for a GL-type geometry (its
    kernels a matrix group, as :class:`~geosharp_ref.sharpness.factors.GenericFactorAt` tests), a matrix block
    X (…, n, h) of ``binding.extract(params)`` whose Gram matrix XᵀX (+ eps I) is singular (smallest eigenvalue ≤ 1e-12 × the
    largest, per leading index, e.g. per head: the test of the GL factors), e.g. a fresh LoRA adapter (peft
    initialises B = 0). Checked before any compute, so that such a binding is refused and its parameters stay
    in the adaptive geometry instead of failing in a Cholesky factorisation."""
    extract = getattr(binding, "extract", None)
    module = getattr(binding, "kernels", None)
    try:
        module = load_kernels(module) if isinstance(module, str) else module
    except Exception:  # noqa: BLE001 - kernels that do not load are refused later, with their own message
        return None
    matrix_group = (module is not None and not getattr(module, "ELEMENTWISE", True)
                    and isinstance(getattr(module, "GROUP", None), tuple))
    if extract is None or not matrix_group:  # only GL-type geometries need (XᵀX)⁻¹
        return None
    blocks = tuple(extract(params))
    names = getattr(module, "BLOCKS", tuple(str(i) for i in range(len(blocks))))
    shapes = getattr(module, "BLOCK_SHAPES", ((),) * len(blocks))
    for name, X, shape in zip(names, blocks, shapes):
        if not (len(shape) == 2 and torch.is_tensor(X) and X.dim() >= 2):  # the matrix blocks, as the factor
            continue
        X = X.detach().to(torch.float64)
        ev = torch.linalg.eigvalsh(X.mT @ X)
        bad = (ev[..., 0] + eps) <= 1e-12 * ev[..., -1].clamp_min(1e-300)
        if bool(bad.any()):
            where = bad.nonzero().flatten().tolist() if bad.dim() else []
            zero = " (all zero: a freshly initialised adapter, peft's B = 0?)" if not bool(X.abs().max() > 0) else ""
            return (f"its block {name} is rank deficient{f' for heads {where[:8]}' if bad.numel() > 1 else ''}"
                    f"{zero}: {name}ᵀ{name} is singular (smallest eigenvalue {float(ev[..., 0].min()):.3g}), so the "
                    f"quotient metric is undefined there; its parameters stay in the adaptive geometry")
    return None


def check_symmetry(model, binding, batch, seed: int = 0, params64=None) -> float:
    """:func:`check_binding` of ``binding`` on ``batch`` with its own random elements at :data:`CHECK_SCALES`
    (``binding.random_element``), on the log-probabilities; returns the largest relative change, ValueError
    (with it) above :data:`CHECK_TOL`. A binding with a ``checked`` flag (a declared binding) is marked checked."""
    with shared_float64_reference():
        if params64 is None:
            params64 = float64_parameters(model)
        elements = [binding.random_element(params64, scale=a, seed=seed + i) for i, a in enumerate(CHECK_SCALES)]
        worst = check_binding(model, binding, batch, log_probabilities, elements, tol=CHECK_TOL)
    if hasattr(binding, "checked"):
        binding.checked = True
    return worst


def output_tensors(out):
    """What :func:`check_attention_pairs` compares: :func:`log_probabilities` where the output has logits (or is a
    tensor, a tuple, or a backbone's ``last_hidden_state``), else every top-level tensor of the model output,
    flattened into one (CLIP's ``logits_per_image``, ``logits_per_text``, embeddings, …). Kept apart from
    :func:`log_probabilities`, whose other readers (the head-translation detection) need a logit width."""
    if torch.is_tensor(out) or isinstance(out, (tuple, list)) or getattr(out, "logits", None) is not None \
            or getattr(out, "last_hidden_state", None) is not None or not hasattr(out, "values"):
        return log_probabilities(out)
    return torch.cat([v.flatten() for v in out.values() if torch.is_tensor(v) and v.is_floating_point()])


#: model → (fingerprint of its parameters, the symmetry map whose pairs were measured exact on it)
_PAIRS_CHECKED = weakref.WeakKeyDictionary()


def check_attention_pairs(model, smap, batch, seed: int = 0) -> None:
    """Measure that the attention pairs of ``smap`` — read off the model's structure by
    :func:`~geosharp_ref.symmetry.symmetry_map`, not measured — are a symmetry of the model's forward on ``batch``:
    all pairs at once (:func:`check_symmetries_together` on :func:`output_tensors`: random elements at
    :data:`CHECK_SCALES`, float64, tolerance :data:`CHECK_TOL`), in eval mode, once per model and map
    while the model's parameters are unchanged.
    A model whose attention the detector misreads (a transformers release that computes it otherwise, a custom
    attention) is refused here with ValueError rather than quotiented by a group that is no symmetry of it."""
    if smap is None or not smap.groups:
        return
    fingerprint = _fingerprint(model)
    done = _PAIRS_CHECKED.get(model)
    if done is not None and done[0] == fingerprint and done[1] is smap:
        return
    was_training = model.training
    model.eval()
    try:
        check_symmetries_together(model, smap.groups, batch, seed, output=output_tensors)
    except ValueError as e:
        raise ValueError(f"the attention pairs read off this {type(model).__name__} are not a symmetry of its forward "
                         f"({str(e).split(': ', 1)[-1]}): its attention is computed in a way the detector does not "
                         f"read (transformers older than 5.17, or a custom attention); `geosharp verify MODEL_DIR` "
                         f"names the pair, or measure adaptive sharpness (--metric adaptive)") from None
    finally:
        model.train(was_training)
    _PAIRS_CHECKED[model] = (fingerprint, smap)
