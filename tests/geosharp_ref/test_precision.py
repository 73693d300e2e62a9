"""geosharp_ref.precision.keep_float64: transformers' eager decoders round a float64 forward through float32
(softmax, RMSNorm); inside keep_float64 they do not, so the exactness checks see float64 round-off."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch.func import functional_call

from geosharp_ref.forward import call_model
from geosharp_ref.precision import keep_float64
from tests import cases

cases.quiet_transformers()


def _llama():
    torch.manual_seed(0)
    model = cases.randomize_vectors(cases.llama(initializer_range=cases.IR).to(torch.float64).eval())
    x = torch.randint(3, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    return model, dict(input_ids=x, use_cache=False)


def _logits(model, params, kw):
    with torch.no_grad():
        return functional_call(model, params, args=(), kwargs=kw).logits


def test_the_eager_decoder_rounds_through_float32_and_keep_float64_stops_it():
    model, kw = _llama()
    params = cases.params_of(model)
    vo = next(g for g in cases.symmetry_case("llama")[3].groups if g.kind == "vo")
    moved = vo.act(params, vo.random_element(params, scale=10.0, seed=3))
    y0, y1 = _logits(model, params, kw), _logits(model, moved, kw)
    with keep_float64():
        z0, z1 = _logits(model, params, kw), _logits(model, moved, kw)
    # float32 inside: the logits sit on float32-rounded values (~1e-8 away from the float64 forward)
    assert float((y0 - z0).abs().max()) > 1e-10 * float(z0.abs().max())
    # the symmetry moves the float64 forward by round-off only
    assert 0 < float((z1 - z0).abs().max()) <= 1e-13 * float(z0.abs().max())
    assert float((y1 - y0).abs().max()) == 0.0 or float((y1 - y0).abs().max()) > 1e-12 * float(y0.abs().max())


def test_keep_float64_is_scoped_and_leaves_other_dtypes_alone():
    to, flt, softmax = torch.Tensor.to, torch.Tensor.float, F.softmax
    x64 = torch.randn(3, dtype=torch.float64)
    x32 = torch.randn(3, dtype=torch.float32)
    with keep_float64():
        with keep_float64():  # re-entrant
            assert x64.to(torch.float32).dtype is torch.float64 and x64.float().dtype is torch.float64
        assert x64.to(dtype=torch.float32).dtype is torch.float64
        assert F.softmax(x64, dim=-1, dtype=torch.float32).dtype is torch.float64
        assert x32.double().to(torch.float32).dtype is torch.float64  # a float64 tensor is never down-cast
        assert x32.to(torch.float64).dtype is torch.float64 and x32.half().dtype is torch.float16
        assert F.softmax(x32, dim=-1, dtype=torch.float64).dtype is torch.float64
        assert x64.to(torch.float16).dtype is torch.float16  # only float32 targets are kept
    assert torch.Tensor.to is to and torch.Tensor.float is flt and F.softmax is softmax
    assert x64.to(torch.float32).dtype is torch.float32
    with keep_float64(enabled=False):
        assert x64.float().dtype is torch.float32


def test_call_model_runs_a_float64_model_in_float64():
    model, kw = _llama()
    params = cases.params_of(model)
    with keep_float64():
        ref = _logits(model, params, kw)
    with torch.no_grad():
        out = call_model(model, params, kw).logits
    assert torch.equal(out, ref)
    m32 = copy.deepcopy(model).float()
    with torch.no_grad():
        assert call_model(m32, cases.params_of(m32), kw).logits.dtype is torch.float32
