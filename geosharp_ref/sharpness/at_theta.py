"""What an evaluation computes at θ alone, kept for the next evaluation of the same model inside a
:func:`keeping` scope: each batch's length buckets, their check against the plain batch, and the losses L_B(θ).

A population measures each model in about thirty evaluations of their own (one per measure and size), and each
computed these again: on the tweets' MiniLM, 4 batches of 128 with 8 length buckets, a whole first-order
evaluation took 26.6 CPU-seconds where it computed them and 18.0 where they were kept
(``docs/tweets/timing_at_theta.json``); an Auto-PGD evaluation takes about 400. The Auto-PGD and first-order
evaluations keep all three; the curvature and average-case measures, which compute L(θ) their own way, share the
buckets and their check. Each batch's Euclidean gradient at θ is kept as well (:func:`gradient_at_theta`, up to
:data:`GRADIENT_BYTES`): every Auto-PGD run starts at ξ = 0, where its first gradient is this one mapped into the
run's space, and a first-order measure is its dual norm, so a model's twelve Auto-PGD runs and three first-order
measures per batch compute it once, not fifteen times (one forward and backward in 21 of each run).

Nothing is kept outside a scope: ``with keeping(model):`` promises that, until it ends, nothing changes the
model's forward except through its parameters and buffers (no hook added or removed, no attribute set, no write
through ``.data`` or a NumPy view, which move no version counter). The population's
:func:`~geosharp_ref.studies.population.evaluation.evaluate_model` opens one per model, and so does the
calibration's probing (:mod:`~geosharp_ref.studies.population.calibration`). Inside it, values are
kept only for :func:`~geosharp_ref.forward.default_loss` (a loss of one's own may read anything), for a model in
eval mode (dropout draws anew), and used only while

- the parameters given and the model's buffers are the same storages at the same in-place versions
  (``_version``), dtypes, shapes and strides, under the same names in the same order (the memo holds them, so no
  other tensor can take their addresses; any change starts a new memo), and
- the batch is made of the same tensor objects at the same in-place versions (referenced weakly: the memo keeps
  no batch alive), with the same dict keys, the same plain non-tensor values (None, numbers, strings) and number
  of groups; a batch with any other input (a nested dict, a list) keeps nothing.

Inference-mode tensors carry no version counter: with any, nothing is kept. A kept value is what the same
operations on the same tensors give again (bit for bit where the forward is deterministic, as on the CPU).
"""
from __future__ import annotations

import contextlib
import weakref

import torch

from ..apgd import tensor_bytes
from ..forward import LengthBuckets, default_loss, length_buckets, model_loss

__all__ = ["GRADIENT_BYTES", "keeping", "bucketed", "is_checked", "mark_checked", "losses_at_theta",
           "gradient_at_theta"]

#: a scope keeps Euclidean gradients at θ (:func:`gradient_at_theta`) of at most this many bytes in all (MiniLM-L6's
#: float32 gradient, 91 MB, for 4 batches; a 135 M-parameter float64 model's, 1.1 GB, not even for one)
GRADIENT_BYTES = 1 << 30
#: model → its :class:`_Memo` (None until its first use), only while a :func:`keeping` scope of the model is open
_MEMOS = weakref.WeakKeyDictionary()
_MISSING = object()


@contextlib.contextmanager
def keeping(model):
    """Keep what evaluations of ``model`` compute at θ alone until the scope ends (see the module doc for what the
    caller promises); the memo is dropped at the end. Nested scopes of one model share the outermost's memo."""
    outer = model in _MEMOS
    if not outer:
        _MEMOS[model] = None
    try:
        yield
    finally:
        if not outer:
            _MEMOS.pop(model, None)


def _signature(params: dict, model) -> tuple:
    tensors = list(params.items()) + [("buffer " + n, b) for n, b in model.named_buffers()]
    return tuple((n, t.data_ptr(), t._version, t.dtype, tuple(t.shape), t.stride()) for n, t in tensors)


def _leaves(batch) -> tuple:
    """The tensors a batch is made of (a plain pair or a :class:`LengthBuckets`), in order."""
    if isinstance(batch, LengthBuckets):
        return tuple(t for g in batch.groups for t in _leaves(g))
    inputs, targets = batch
    parts = list(inputs.values()) if isinstance(inputs, dict) else [inputs]
    return tuple(t for t in parts + [targets] if torch.is_tensor(t))


def _layout(batch):
    """The batch's structure beside its tensors: dict keys and plain non-tensor values, per group; None where an
    input is neither a tensor nor plain (None, a number, a string): such a batch keeps nothing."""
    if isinstance(batch, LengthBuckets):
        groups = tuple(_layout(g) for g in batch.groups)
        return None if None in groups else ("buckets", batch.weights) + groups
    inputs, targets = batch
    items = list(inputs.items()) if isinstance(inputs, dict) else [(None, inputs)]
    items += [("targets", targets)]
    if not all(torch.is_tensor(v) or v is None or isinstance(v, (bool, int, float, str)) for _, v in items):
        return None
    return tuple((k, None if torch.is_tensor(v) else (type(v).__name__, v)) for k, v in items)


class _Memo:
    """The parameters and buffers (held: normally the model's own storages) and, per batch, what was computed,
    keyed by the identities and in-place versions of the batch's tensors and its layout. The tensors are referenced
    weakly: the memo keeps no batch alive, and an entry whose batch is gone is dropped when the next one is added
    (an identity reused by a new tensor does not match the dead reference)."""

    def __init__(self, params: dict, model, signature: tuple):
        self.held = list(params.values()) + list(model.buffers())
        self.signature = signature
        self.entries = {}  # (kind, identities and versions, layout, extra) → (weak references to the leaves, value)

    @staticmethod
    def _key(kind, batch, leaves, extra) -> tuple:
        return kind, tuple((id(t), t._version) for t in leaves), _layout(batch), extra

    def get(self, kind, batch, *extra):
        leaves = _leaves(batch)
        hit = self.entries.get(self._key(kind, batch, leaves, extra))
        if hit is None or len(hit[0]) != len(leaves) or any(r() is not t for r, t in zip(hit[0], leaves)):
            return _MISSING
        return hit[1]

    def put(self, kind, batch, value, *extra):
        while True:  # dropping a batch's buckets can free the tensors other entries are keyed by: again until none
            alive = {k: e for k, e in self.entries.items() if all(r() is not None for r in e[0])}
            if len(alive) == len(self.entries):
                break
            self.entries = alive
        leaves = _leaves(batch)
        self.entries[self._key(kind, batch, leaves, extra)] = (tuple(weakref.ref(t) for t in leaves), value)
        return value


def _usable(tensors) -> bool:
    return not any(t.is_inference() for t in tensors)


def _memo(model, params, batch, loss_fn=default_loss):
    """The model's memo for ``params`` (a new one where they changed); None where nothing may be kept: outside a
    :func:`keeping` scope, another loss, a module in training mode, inference-mode tensors."""
    if loss_fn is not default_loss or not isinstance(params, dict) or model not in _MEMOS or _layout(batch) is None:
        return None
    if any(m.training for m in model.modules()) \
            or not _usable(list(params.values()) + list(model.buffers()) + list(_leaves(batch))):
        return None
    signature = _signature(params, model)
    memo = _MEMOS[model]
    if memo is None or memo.signature != signature:
        memo = _MEMOS[model] = _Memo(params, model, signature)
    return memo


def bucketed(model, params, batch, k: int) -> LengthBuckets:
    """``length_buckets(batch, k)``, the same object for the same batch and ``k`` while kept (module doc)."""
    memo = _memo(model, params, batch)
    if memo is None:
        return length_buckets(batch, k)
    kept = memo.get("buckets", batch, k)
    return kept if kept is not _MISSING else memo.put("buckets", batch, length_buckets(batch, k), k)


def is_checked(model, params, batch, k: int, loss_fn=default_loss) -> bool:
    """Whether ``batch``'s ``k`` buckets were measured equal to it at these parameters (:func:`mark_checked`)."""
    memo = _memo(model, params, batch, loss_fn)
    return memo is not None and memo.get("checked", batch, k) is True


def mark_checked(model, params, batch, k: int, loss_fn=default_loss) -> None:
    """Record that ``batch``'s ``k`` buckets were measured equal to it at these parameters (while kept)."""
    memo = _memo(model, params, batch, loss_fn)
    if memo is not None:
        memo.put("checked", batch, True, k)


def losses_at_theta(model, params, batches, loss_fn=default_loss) -> list:
    """``[float(loss_fn(model at params on batch))]`` (no gradient), each computed once while kept (module doc)."""
    out = []
    with torch.no_grad():
        for batch in batches:
            memo = _memo(model, params, batch, loss_fn)
            kept = _MISSING if memo is None else memo.get("loss", batch)
            if kept is _MISSING:
                kept = float(model_loss(model, params, batch, loss_fn))
                if memo is not None:
                    memo.put("loss", batch, kept)
            out.append(kept)
    return out


def gradient_at_theta(model, params, batch, names, loss_fn=default_loss) -> tuple:
    """``(L_B(θ), {name: ∂L_B/∂θ_name})`` for the parameters ``names`` (None for one L_B does not depend on): one
    forward and backward of :func:`model_loss` with those parameters as leaves, computed once while kept (module
    doc) as long as this scope's gradients stay within :data:`GRADIENT_BYTES`, else each time. Every Auto-PGD run
    from ξ = 0 and every first-order measure starts from this gradient (a model's evaluations differ in the space
    and the radius, not in it: :func:`~geosharp_ref.sharpness.pipeline.at_zero`). Kept tensors are returned: read
    them, never write."""
    names = tuple(names)
    memo = _memo(model, params, batch, loss_fn)
    kept = _MISSING if memo is None else memo.get("gradient", batch, names)
    if kept is not _MISSING:
        return kept
    leaves = {n: params[n].detach().requires_grad_(True) for n in names}
    with torch.enable_grad():
        value = model_loss(model, {**params, **leaves}, batch, loss_fn)
        grads = torch.autograd.grad(value, list(leaves.values()), allow_unused=True)
    out = float(value.detach()), dict(zip(names, grads))
    if memo is not None and _gradient_bytes(memo) + tensor_bytes(params[n] for n in names) <= GRADIENT_BYTES:
        memo.put("gradient", batch, out, names)
    return out


def _gradient_bytes(memo) -> int:
    """The bytes of the gradients ``memo`` keeps for batches still alive."""
    return sum(tensor_bytes(v[1].values()) for k, (refs, v) in memo.entries.items()
               if k[0] == "gradient" and all(r() is not None for r in refs))
