"""Stream scaling quotiented jointly with the symmetries that hold its writers (geosharp_ref/symmetry/norms.py:
``NormScalingBinding.joint_with``, ``StreamFold``): on pre-LN models with eps = 0 (where the stream scaling is
exact) ``symmetries="all"`` no longer refuses it for overlap with the V/O pairs or the gated units; its free
writers carry the ``scaling`` geometry, the held ones are folded by ‖free writers‖, and whole-model geodesic
sharpness is invariant along every orbit at once (stream scaling and norm weights included).

Observed (float64, n_iter 3, ρ 0.05, elements of scale 1e-2 and 1e2 of every group at once): ≤ 1.5e-13 relative
on ViT, GPT-2 (untied head) and Llama with eps = 0; adaptive sharpness changes by ≥ 3.6e-3.
"""
from __future__ import annotations

import pytest
import torch

from geosharp_ref.sharpness import geodesic_sharpness
from geosharp_ref.symmetry import NormScalingBinding, Quotient
from geosharp_ref.symmetry.norms import StreamFold
from tests import cases
from tests.cases.orbits import assert_invariant_along_every_orbit, moved_along_every_orbit

cases.quiet_transformers()

MODELS = {
    "vit": (lambda: cases.vit(initializer_range=cases.IR, layer_norm_eps=0.0), "sharpness"),
    "gpt2": (lambda: cases.gpt2(initializer_range=cases.IR, layer_norm_epsilon=0.0, tie_word_embeddings=False),
             "sharpness"),
    "llama": (lambda: cases.llama(initializer_range=cases.IR, rms_norm_eps=0.0), "decoder"),
}


def _case(name):
    factory, table = MODELS[name]
    torch.manual_seed(0)
    model = cases.randomize_vectors(factory().to(torch.float64).eval())
    case = cases.CASES[table][name]
    return cases.SharpnessModel(model, case.batch, case.loss_fn, case.output, None), case.batch(
        torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_stream_scaling_is_bound_jointly_instead_of_refused_for_overlap(name):
    M, batch = _case(name)
    q = Quotient.resolve(M.model, batch, metric="mix", symmetries="all")
    (stream,) = [b for b in q.bindings if isinstance(b, NormScalingBinding)]
    fold = stream.joint_fold
    assert isinstance(fold, StreamFold) and set(fold.free) == set(stream.param_names)
    assert set(fold.free) | set(fold.readers) == set(stream.writers) and not set(fold.free) & set(fold.readers)
    assert not any("belong to" in why for _, _, why in q.refused) and q.yielded == []
    held = {n: k for s in q.all if s is not stream for n, k in ((n, s.key) for n in s.param_names)}
    assert all(n in held for n in fold.readers)  # exactly the writers another symmetry holds are folded
    joined = dict(q.joint)[stream.key]
    assert sorted(joined) == sorted({held[n] for n in fold.readers})
    # the action still scales every writer
    params = cases.params_of(M.model)
    moved = stream.act(params, torch.tensor([3.0], dtype=torch.float64))
    for n in stream.writers:
        torch.testing.assert_close(moved[n], 3.0 * params[n], rtol=1e-15, atol=0)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_geodesic_sharpness_is_invariant_with_the_stream_scaling_moving_too(name, metric):
    M, batch = _case(name)
    q = Quotient.resolve(M.model, batch, metric=metric, symmetries="all")
    assert_invariant_along_every_orbit(M, batch, q, metric)


def test_without_the_stream_fold_mix_is_not_invariant_under_the_stream_scaling():
    """The control: the V/O pairs' mix geometry on the raw W_O is not invariant under W_O ↦ a W_O."""
    M, batch = _case("gpt2")
    q = Quotient.resolve(M.model, batch, metric="mix", symmetries="all")
    (stream,) = [b for b in q.bindings if isinstance(b, NormScalingBinding)]
    m1 = moved_along_every_orbit(M, q, 1.0, 0, kinds=NormScalingBinding)
    kw = dict(metric="mix", n_iter=3, loss_fn=M.loss_fn, symmetries=[])  # the pairs alone, unfolded
    s0 = geodesic_sharpness(M.model, [batch], 0.05, **kw).mean
    s1 = geodesic_sharpness(m1, [batch], 0.05, **kw).mean
    assert abs(s1 - s0) > 1e-4 * abs(s0), (s0, s1)
