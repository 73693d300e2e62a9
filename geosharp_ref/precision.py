r"""float64 that is float64: keep a model's forward in the dtype of its tensors.

transformers' decoders compute parts of their forward in float32 whatever the model's dtype (5.x, eager):
the attention softmax (``softmax(scores, dim=-1, dtype=torch.float32)`` in Llama, Mistral, Qwen2, Gemma,
Phi-3, GPT-NeoX), the RMSNorm (``hidden_states.to(torch.float32)``; Gemma's ``x.float()``), the rotary
frequencies (``inv_freq.float()``) and GPT-J's scores (``query.to(torch.float32)``). In a float64 model these
round every activation through float32: an exactness check of a symmetry then measures either 0 (the
difference rounded away) or float32 noise (~1e-7), never the float64 round-off it is meant to see.

:func:`keep_float64` is a context manager that, while it is active, turns every *down-cast of a float64
tensor to float32* inside the forward into a no-op: ``Tensor.to(torch.float32)``, ``Tensor.float()``,
``Tensor.type(torch.float32)`` and the ``dtype=torch.float32`` of ``softmax`` / ``log_softmax`` return (or
compute in) float64. A cast of an *integer or bool* tensor to float32 gives float64 as well: transformers ≤ 5.17
computes the rotary angles as ``inv_freq.float() @ position_ids.float()``, which would otherwise multiply the
kept float64 frequencies by float32 positions (an error); integers up to 2⁵³ are exact in float64. Float tensors of
any other dtype are untouched, so a float32 model is unaffected (:func:`~geosharp_ref.forward.call_model` enters
the block only for a model whose parameters are float64). It patches
``torch.Tensor`` methods and ``torch.nn.functional`` for the duration of the block (process-wide, re-entrant,
restored on exit), so use it around model forwards only. The exactness checks
(:func:`geosharp_ref.symmetry.check.check_binding`) run inside it.

Measured on the tiny decoders of the case table (transformers 5.24; tests/geosharp_ref/test_precision.py):
with the float32 softmax/RMSNorm every binding check (RoPE Q/K, V/O, gated units) reported a change of exactly
0.0 (the difference rounded away); inside :func:`keep_float64` they report float64 round-off (2e-16 … 3e-15).
:func:`geosharp_ref.forward.call_model` (every check and every evaluation) runs a model whose parameters are
float64 inside it.
"""
from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F

__all__ = ["keep_float64"]

_lock = threading.RLock()
_depth = 0
_saved: dict = {}


def _is_f32(dtype) -> bool:
    return dtype is torch.float32 or dtype == "torch.FloatTensor"


def _kept(t) -> bool:
    """Whether a cast of ``t`` to float32 gives float64 inside the block: float64 tensors, and integer and bool
    ones (position ids, masks), whose float32 copies would otherwise meet float64 tensors in a product."""
    return t.dtype is torch.float64 or not (t.is_floating_point() or t.is_complex())


def _install():
    to, flt, typ = torch.Tensor.to, torch.Tensor.float, torch.Tensor.type
    softmax, log_softmax = F.softmax, F.log_softmax
    _saved.update(to=to, float=flt, type=typ, softmax=softmax, log_softmax=log_softmax)

    def to_(self, *args, **kwargs):
        if _kept(self):
            dtype = kwargs.get("dtype", args[0] if args and isinstance(args[0], torch.dtype) else
                               args[1] if len(args) > 1 and isinstance(args[1], torch.dtype) else None)
            if dtype is torch.float32:
                if "dtype" in kwargs:
                    kwargs = dict(kwargs, dtype=torch.float64)
                else:
                    args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        return to(self, *args, **kwargs)

    def float_(self, *args, **kwargs):
        if self.dtype is torch.float64:
            return self
        if _kept(self):  # integer or bool: to float64, not float32
            return to(self, torch.float64, *args, **kwargs)
        return flt(self, *args, **kwargs)

    def type_(self, dtype=None, *args, **kwargs):
        if _kept(self) and dtype is not None and _is_f32(dtype):
            return self if self.dtype is torch.float64 else to(self, torch.float64, *args, **kwargs)
        return typ(self, dtype, *args, **kwargs) if dtype is not None else typ(self, *args, **kwargs)

    def _keep(fn):
        def wrapped(input, *args, **kwargs):
            if isinstance(input, torch.Tensor) and input.dtype is torch.float64 \
                    and kwargs.get("dtype") is torch.float32:
                kwargs = dict(kwargs, dtype=torch.float64)
            return fn(input, *args, **kwargs)
        return wrapped

    torch.Tensor.to, torch.Tensor.float, torch.Tensor.type = to_, float_, type_
    F.softmax, F.log_softmax = _keep(softmax), _keep(log_softmax)


def _uninstall():
    torch.Tensor.to, torch.Tensor.float, torch.Tensor.type = _saved["to"], _saved["float"], _saved["type"]
    F.softmax, F.log_softmax = _saved["softmax"], _saved["log_softmax"]
    _saved.clear()


@contextlib.contextmanager
def keep_float64(enabled: bool = True):
    """Inside the block, float64 tensors are not down-cast to float32 (module doc). ``enabled=False``: a no-op."""
    global _depth
    if not enabled:
        yield
        return
    with _lock:
        if _depth == 0:
            _install()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _uninstall()
