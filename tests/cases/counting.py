"""A tiny BERT classifier that counts its forward passes, for tests of what an evaluation computes once
(:mod:`geosharp_ref.sharpness.at_theta`, :func:`geosharp_ref.sharpness.pipeline.at_zero`)."""
from __future__ import annotations

import torch

from geosharp_ref.sharpness.pipeline import prepare_inputs

from .inputs import padded_text
from .models import bert


def counted_bert(seed=0):
    """(model, params, batches, calls): a tiny BERT classifier in eval mode whose forward passes ``calls[0]`` counts,
    its parameters and two padded text batches of 6 examples (prepared by the pipeline)."""
    torch.manual_seed(seed)
    model = bert().eval()
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    gen = torch.Generator().manual_seed(seed + 1)
    raw = [(padded_text(gen, 6, 9), torch.randint(0, 3, (6,), generator=gen)) for _ in range(2)]
    params, batches, _, _ = prepare_inputs(model, raw)
    return model, params, batches, calls


def forwards_during(calls, run):
    """(run()'s result, the forward passes it made) for a model counted by :func:`counted_bert`."""
    n = calls[0]
    out = run()
    return out, calls[0] - n
