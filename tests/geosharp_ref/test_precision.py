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
        ints, mask = torch.arange(3), torch.tensor([True, False])  # integer and bool casts give float64 too
        assert ints.float().dtype is torch.float64 and ints.to(dtype=torch.float32).dtype is torch.float64
        assert mask.to(torch.float32).dtype is torch.float64 and ints.type(torch.float32).dtype is torch.float64
        assert ints.to(torch.float16).dtype is torch.float16 and ints.to(torch.int32).dtype is torch.int32
    assert torch.Tensor.to is to and torch.Tensor.float is flt and F.softmax is softmax
    assert x64.to(torch.float32).dtype is torch.float32 and torch.arange(3).float().dtype is torch.float32
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


class _RotaryAsInTransformers517(torch.nn.Module):
    """The rotary angles as transformers ≤ 5.17 computes them (LlamaRotaryEmbedding.forward): a matrix product of
    the frequencies cast to float32 by the positions cast to float32."""

    def __init__(self, dim=8):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim))
        self.proj = torch.nn.Linear(dim, 1)

    def forward(self, x, position_ids):
        inv = self.inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1).to(dtype=torch.float, device=x.device)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return self.proj(x * emb.cos().to(x.dtype) + x * emb.sin().to(x.dtype))


def test_float32_positions_meet_float64_frequencies_in_float64():
    """Inside the block the kept float64 frequencies meet float64 positions (not float32 ones: an error), and the
    angles are the float64 ones, computed here directly."""
    torch.manual_seed(0)
    m = _RotaryAsInTransformers517().double()
    x, pos = torch.randn(2, 5, 8, dtype=torch.float64), torch.arange(5).expand(2, 5)
    params = dict(m.named_parameters(), **dict(m.named_buffers()))
    out = call_model(m, params, dict(x=x, position_ids=pos))
    angles = pos[..., None].double() * m.inv_freq.double()
    emb = torch.cat((angles, angles), dim=-1)
    ref = m.proj(x * emb.cos() + x * emb.sin())
    assert out.dtype is torch.float64
    assert torch.allclose(out, ref, rtol=1e-13, atol=1e-13)
    with torch.no_grad():
        out32 = m(x, pos)  # outside the block: float32 angles, ≈ 1e-7 away
    assert float((out32 - ref).abs().max()) > 1e-10
