"""Rung 5 of the verification ladder (docs/MATH.md): invariance along GL(h) orbits of whole models.

Tiny float64 transformers, the sharpness cases of tests/cases/tables.py (eager attention, large
initializer_range ≈ 0.5 so that attention is far from uniform and the Q/K pairs matter): BERT (sequence
classification), ViT (image classification), CLIP (CLIPModel, cross-entropy on logits_per_image), GPT-2
(next-token LM loss), an ``nn.TransformerEncoder`` (``nn.MultiheadAttention``) with a linear head, and the
model-soups CLIP classifier (geosharp_ref.io.clip_soups).

For random per-head A = a·Ã (a log-uniform in [1e-2, 1e2], Ã = orthogonal × diag U[0.5, 2]:
tests.cases.random_gl) applied with :meth:`SymmetryMap.act` to a copy of the parameters, loaded into a deep
copy of the model:

(a) the model's output is unchanged (≤ 1e-8 relative);
(b) geodesic sharpness (inv and mix) is unchanged (≤ 1e-6 relative), also with a random start;
(c) the Riemannian gradient norm of the loss is unchanged (the Euclidean one is not);
(d) adaptive sharpness changes (and is invariant under the diagonal subgroup only: see below).

Plus: parameters untouched by every call, determinism, ablations, float32 vs float64, bad input.
"""
from __future__ import annotations

import copy
import logging
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from geosharp_ref.sharpness import adaptive_sharpness, build_space, geodesic_sharpness, model_loss
from geosharp_ref.sampling import well_conditioned
from geosharp_ref.sharpness.pipeline import MAX_RHO, gradient_dual_norm
from geosharp_ref.symmetry import NoAttentionPairsWarning
from tests import cases

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()

DT = torch.float64
OUT_TOL = 1e-8     # (a) model outputs, relative
SHARP_TOL = 1e-6   # (b) sharpness values, relative
GRAD_TOL = 1e-8    # (c) Riemannian gradient norm, relative
# Observed maxima over 30 random (seed, a) per metric across the five models (float64): outputs 1.3e-14,
# geodesic sharpness 7.7e-14 (random start 7.7e-14), Riemannian gradient norm 9.2e-15, adaptive
# sharpness under the diagonal subgroup 2.8e-13; float32 vs float64 geodesic sharpness 4.2e-6.
RHO = 0.1
N_ITER = 5

# Each example of the invariance property costs several sharpness evaluations; keep the count low
# but let the "dev" profile (60 examples) scale it up.
EXAMPLES = max(2, settings.default.max_examples // 5)  # ci: 3, dev: 12

MODELS = cases.SHARPNESS_NAMES  # bert, vit, clip, gpt2, mha, clip-soup (tests/cases/tables.py)
EXPECTED_GROUPS = {c.name: sum(c.groups) for c in cases.SHARPNESS_CASES}
build = cases.sharpness_case  # name -> model, make_batch(gen) -> (inputs, targets), loss_fn, output(o), smap


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same_state(model, before):
    after = model.state_dict()
    assert set(after) == set(before)
    for k, v in before.items():
        assert torch.equal(after[k], v), f"{k} was modified"


# Generic A = a·Q·diag(u) comes from tests.cases.random_gl; kept here: the monomial and scale-then-mix families
# of the adaptive-sharpness tests, which geosharp_ref.sampling does not draw.
def _special_A(smap, gen, log10_a, kind):
    """Per group and head A = a·Ã. ``kind``: "diagonal" Ã = D·(random signs), D = diag U[0.5, 2]; "shear"
    Ã = diag(10^U[-1, 1])·Q, Q orthogonal (scaling before mixing, see the adaptive-sharpness tests). a =
    10**log10_a with a per-group jitter ×10^U[-0.2, 0.2] (clipped to [1e-2, 1e2]) so that groups differ."""
    As = {}
    for g in smap.groups:
        h, N = g.head_dim, g.num_heads
        if kind == "diagonal":
            D = torch.rand(N, h, generator=gen, dtype=DT) * 1.5 + 0.5
            signs = torch.randint(0, 2, (N, h), generator=gen).to(DT) * 2 - 1
            At = torch.diag_embed(D * signs)
        elif kind == "shear":  # scale the head coordinates, THEN mix them; cond(Ã) <= 100
            S = 10.0 ** (torch.rand(N, h, generator=gen, dtype=DT) * 2 - 1)
            At = S.unsqueeze(-1) * well_conditioned((N, h, h), gen, DT, cond=1.0)  # cond 1: Q orthogonal
        else:
            raise KeyError(kind)
        jitter = float(torch.empty(()).uniform_(-0.2, 0.2, generator=gen))
        As[g.key] = 10.0 ** max(-2.0, min(2.0, log10_a + jitter)) * At
    return As


def _moved_model(M: cases.SharpnessModel, As):
    """A deep copy of the model carrying ψ(A, θ)."""
    moved = M.smap.act(_params(M.model), As)
    m2 = copy.deepcopy(M.model)
    with torch.no_grad():
        for k, p in m2.named_parameters():
            p.copy_(moved[k])
    return m2, moved


def _rel(a, b):
    a, b = torch.as_tensor(a, dtype=DT), torch.as_tensor(b, dtype=DT)
    return float((a - b).norm() / b.norm())


def _rgrad_norm(model, smap, batch, loss_fn, metric):
    """‖grad L‖_g at θ (the library's dual norm of the gradient in the quotient geometry) and the Euclidean
    norm of the gradient w.r.t. the GL(h) pair blocks G, H (autograd through extract; not invariant)."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    space = build_space(params, smap, metric)
    blocks = [X.requires_grad_() for g in smap.groups for X in g.extract(params)]
    new = dict(params)
    for i, g in enumerate(smap.groups):
        new = g.insert(new, (blocks[2 * i], blocks[2 * i + 1]))
    egrad = torch.autograd.grad(model_loss(model, new, batch, loss_fn), blocks)
    enorm = math.sqrt(sum(float((e**2).sum()) for e in egrad))
    return gradient_dual_norm(model, space, batch, loss_fn), enorm


def _run(model, batch):
    inputs, _ = batch
    with torch.no_grad():
        if isinstance(inputs, dict):
            return model(**inputs)
        return model(inputs)


# ---------------------------------------------------------------------------------------------
# Sanity: the models are what the invariance tests need
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_models_have_groups_and_attention_matters(name):
    """Every model has its GL(h) groups, and a NON-symmetry (G ↦ 2G, H fixed: attention temperature /
    value scale) changes the output: the invariance below is not vacuous."""
    M = build(name)
    assert len(M.smap.groups) == EXPECTED_GROUPS[name], str(M.smap)
    kinds = [g.kind for g in M.smap.groups]
    assert (kinds.count("qk"), kinds.count("vo")) == cases.CASES["sharpness"][name].groups, str(M.smap)
    batch = M.make_batch(torch.Generator().manual_seed(0))
    y0 = M.output(_run(M.model, batch))
    params = _params(M.model)
    for kind in ("qk", "vo"):
        p = params
        for g in M.smap.groups:
            if g.kind == kind:
                G, H = g.extract(p)
                p = g.insert(p, 2 * G, H)
        m2 = copy.deepcopy(M.model)
        m2.load_state_dict(p, strict=False)
        assert _rel(M.output(_run(m2, batch)), y0) > 1e-3, kind
    loss = float(model_loss(M.model, params, batch, M.loss_fn))
    assert math.isfinite(loss) and loss > 0


# ---------------------------------------------------------------------------------------------
# (a)-(c): outputs, geodesic sharpness, Riemannian gradient norm are invariant
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31 - 1), log10_a=st.floats(-2.0, 2.0))
def test_orbit_invariance(name, seed, log10_a):
    M = build(name)
    gen = torch.Generator().manual_seed(seed)
    batch = M.make_batch(gen)
    As = cases.random_gl(M.smap, gen, log10_a)
    m1, moved = _moved_model(M, As)
    state0, state1 = _state(M.model), _state(m1)
    # the parameters did move
    for g in M.smap.groups:
        assert _rel(g.extract(moved)[0], g.extract(_params(M.model))[0]) > 1e-3
    # (a) functional output
    y0, y1 = M.output(_run(M.model, batch)), M.output(_run(m1, batch))
    assert _rel(y1, y0) <= OUT_TOL
    for metric in ("inv", "mix"):
        # (b) geodesic sharpness
        r0 = geodesic_sharpness(M.model, [batch], RHO, metric=metric, n_iter=N_ITER, loss_fn=M.loss_fn)
        r1 = geodesic_sharpness(m1, [batch], RHO, metric=metric, n_iter=N_ITER, loss_fn=M.loss_fn)
        assert r0.mean > 0, (name, metric, r0)
        assert _rel(r1.mean, r0.mean) <= SHARP_TOL, (name, metric, r0.mean, r1.mean)
        assert _rel(r1.loss_after, r0.loss_after) <= SHARP_TOL
        assert _rel(r1.perturbation_norms, r0.perturbation_norms) <= SHARP_TOL
        assert r0.perturbation_norms[0] <= RHO * (1 + 1e-9)
        # (c) Riemannian gradient norm (the Euclidean gradient norm is not invariant)
        g0, e0 = _rgrad_norm(M.model, M.smap, batch, M.loss_fn, metric)
        g1, e1 = _rgrad_norm(m1, M.smap, batch, M.loss_fn, metric)
        assert _rel(g1, g0) <= GRAD_TOL, (name, metric, g0, g1)
        if abs(log10_a) >= 0.5:  # |a| ≥ 10^0.3 after jitter: ∇_G ~ 1/a, ∇_H ~ a
            assert _rel(e1, e0) > 1e-2
    _assert_same_state(M.model, state0)
    _assert_same_state(m1, state1)


# ---------------------------------------------------------------------------------------------
# (d) adaptive sharpness is not invariant; random start keeps geodesic invariance
# ---------------------------------------------------------------------------------------------

# Which A reliably changes adaptive sharpness? It perturbs θ + |θ| ⊙ δ, ‖δ‖ ≤ ρ, and is exactly
# invariant under the diagonal (monomial) subgroup of GL(h): for A = diag(s) (any scale a, any signs)
# (G A + |G A| ⊙ δ_G)(H A⁻ᵀ + |H A⁻ᵀ| ⊙ δ_H)ᵀ = (G + |G| ⊙ δ_G)(H + |H| ⊙ δ_H)ᵀ, so a = 10 alone does not
# change it. For the same reason the "generic" family A = a·Q·D acts on it like the rotation Q alone
# (the trailing diagonal is absorbed), and for randomly initialised weights, whose distribution is
# rotation invariant, a rotation changes adaptive sharpness only by a fluctuation: observed relative
# changes 8e-5 … 3e-2, too close to 1e-4 to be a reliable test (GPT-2, whose tied embedding
# dominates the worst case, gave 8e-5). Scaling BEFORE mixing, A = a·D·Q with D = diag 10^U[-1, 1],
# makes |G A| and |H A⁻ᵀ| anisotropic in a way the element-wise ball cannot follow (to first order
# S ≈ ρ‖|θ| ⊙ ∇L‖ grows like cond(D)²): observed relative changes 0.06 … 19 on these models, while
# geodesic sharpness is unchanged for the same A (≤ 1e-13).

@pytest.mark.parametrize("name", MODELS)
@settings(max_examples=max(2, EXAMPLES - 1))
@given(seed=st.integers(0, 2**31 - 1), log10_a=st.floats(-2.0, 2.0))
def test_adaptive_sharpness_not_invariant(name, seed, log10_a):
    M = build(name)
    gen = torch.Generator().manual_seed(seed)
    batch = M.make_batch(gen)
    m1, _ = _moved_model(M, _special_A(M.smap, gen, log10_a, "shear"))
    a0 = adaptive_sharpness(M.model, [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn)
    a1 = adaptive_sharpness(m1, [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn)
    assert _rel(a1.mean, a0.mean) > 1e-2, (name, a0.mean, a1.mean)
    # same A: geodesic sharpness does not move
    g0 = geodesic_sharpness(M.model, [batch], RHO, metric="mix", n_iter=N_ITER, loss_fn=M.loss_fn)
    g1 = geodesic_sharpness(m1, [batch], RHO, metric="mix", n_iter=N_ITER, loss_fn=M.loss_fn)
    assert _rel(g1.mean, g0.mean) <= SHARP_TOL, (name, g0.mean, g1.mean)
    # the diagonal subgroup (scale a, D, signs) leaves adaptive sharpness unchanged
    m2, _ = _moved_model(M, _special_A(M.smap, gen, log10_a, "diagonal"))
    a2 = adaptive_sharpness(m2, [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn)
    assert _rel(a2.mean, a0.mean) <= SHARP_TOL, (name, a0.mean, a2.mean)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_adaptive_scaling_alone_vs_shear(name):
    """a = 10 with Ã = I: adaptive unchanged (diagonal subgroup); a = 10 with Ã = D·Q: changed."""
    M = build(name)
    gen = torch.Generator().manual_seed(11)
    batch = M.make_batch(gen)
    a0 = adaptive_sharpness(M.model, [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn).mean
    scale = {g.key: 10.0 * torch.eye(g.head_dim, dtype=DT).expand(g.num_heads, -1, -1) for g in M.smap.groups}
    shear = {k: 10.0 / float(A.abs().max()) * A for k, A in _special_A(M.smap, gen, 0.0, "shear").items()}
    a_scale = adaptive_sharpness(_moved_model(M, scale)[0], [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn).mean
    a_shear = adaptive_sharpness(_moved_model(M, shear)[0], [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn).mean
    assert _rel(a_scale, a0) <= SHARP_TOL
    assert _rel(a_shear, a0) > 1e-2


@pytest.mark.parametrize("name", MODELS)
@settings(max_examples=max(2, EXAMPLES - 1))
@given(seed=st.integers(0, 2**31 - 1), log10_a=st.floats(-2.0, 2.0), metric=st.sampled_from(["inv", "mix"]))
def test_random_start_invariant(name, seed, log10_a, metric):
    M = build(name)
    gen = torch.Generator().manual_seed(seed)
    batch = M.make_batch(gen)
    m1, _ = _moved_model(M, cases.random_gl(M.smap, gen, log10_a))
    kw = dict(metric=metric, n_iter=N_ITER, loss_fn=M.loss_fn, random_start=True, seed=seed % 1000)
    r0 = geodesic_sharpness(M.model, [batch], RHO, **kw)
    r1 = geodesic_sharpness(m1, [batch], RHO, **kw)
    assert _rel(r1.mean, r0.mean) <= SHARP_TOL, (name, metric, r0.mean, r1.mean)
    # the random start differs from the zero start (it is really used)
    z = geodesic_sharpness(M.model, [batch], RHO, **dict(kw, random_start=False))
    assert r0.mean != z.mean


# ---------------------------------------------------------------------------------------------
# Side effects, determinism, ablations, dtype
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["bert", "mha"])
def test_parameters_untouched_and_mode_restored(name):
    M = build(name)
    batch = M.make_batch(torch.Generator().manual_seed(2))
    state = _state(M.model)
    M.model.train()
    try:
        calls = [
            lambda: adaptive_sharpness(M.model, [batch], RHO, n_iter=3, loss_fn=M.loss_fn, random_start=True),
            lambda: geodesic_sharpness(M.model, [batch, batch], RHO, metric="inv", n_iter=3, loss_fn=M.loss_fn),
            lambda: geodesic_sharpness(M.model, [batch], RHO, metric="mix", n_iter=3, loss_fn=M.loss_fn,
                                       random_start=True, geodesic_correction=False, metric_norm=False),
            lambda: geodesic_sharpness(M.model, [batch], RHO, metric="mix", n_iter=3, loss_fn=M.loss_fn,
                                       dtype=torch.float32, eps=1e-6),
        ]
        for call in calls:
            call()
            _assert_same_state(M.model, state)
            assert M.model.training
            assert all(p.grad is None for p in M.model.parameters())
            assert next(M.model.parameters()).dtype == DT
    finally:
        M.model.eval()


def test_determinism_and_seed():
    M = build("bert")
    batch = M.make_batch(torch.Generator().manual_seed(3))
    kw = dict(metric="inv", n_iter=N_ITER, loss_fn=M.loss_fn, random_start=True)
    r1 = geodesic_sharpness(M.model, [batch], RHO, seed=7, **kw)
    r2 = geodesic_sharpness(M.model, [batch], RHO, seed=7, **kw)
    assert r1.per_batch == r2.per_batch and r1.loss_after == r2.loss_after
    assert r1.perturbation_norms == r2.perturbation_norms
    r3 = geodesic_sharpness(M.model, [batch], RHO, seed=8, **kw)
    assert r3.per_batch != r1.per_batch
    a1 = adaptive_sharpness(M.model, [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn, random_start=True, seed=1)
    a2 = adaptive_sharpness(M.model, [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn, random_start=True, seed=1)
    assert a1.per_batch == a2.per_batch


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_ablations_differ_from_default(metric):
    M = build("bert")
    batch = M.make_batch(torch.Generator().manual_seed(4))
    kw = dict(metric=metric, n_iter=N_ITER, loss_fn=M.loss_fn)
    base = geodesic_sharpness(M.model, [batch], RHO, **kw)
    flat = geodesic_sharpness(M.model, [batch], RHO, geodesic_correction=False, **kw)
    frob = geodesic_sharpness(M.model, [batch], RHO, metric_norm=False, **kw)
    for r in (base, flat, frob):
        assert math.isfinite(r.mean) and r.mean > 0
    assert flat.config["geodesic_correction"] is False and frob.config["metric_norm"] is False
    assert _rel(flat.mean, base.mean) > 1e-6
    assert _rel(frob.mean, base.mean) > 1e-6
    # results are consistent with their own bookkeeping
    for r in (base, flat, frob):
        assert r.per_batch[0] == pytest.approx(r.loss_after[0] - r.loss_before[0], abs=1e-12)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_float32_agrees_with_float64(metric):
    M = build("bert")
    batch = M.make_batch(torch.Generator().manual_seed(5))
    kw = dict(metric=metric, n_iter=N_ITER, loss_fn=M.loss_fn)
    r64 = geodesic_sharpness(M.model, [batch], RHO, **kw)
    r32 = geodesic_sharpness(M.model, [batch], RHO, dtype=torch.float32, **kw)
    assert r32.config["dtype"] == "torch.float32" and r64.config["dtype"] == "torch.float64"
    assert r32.loss_before[0] == pytest.approx(r64.loss_before[0], rel=1e-5)
    assert r32.mean == pytest.approx(r64.mean, rel=1e-4)  # observed <= 4.2e-6


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

def test_bad_rho_and_empty_batches_and_metric():
    M = build("mha")
    batch = M.make_batch(torch.Generator().manual_seed(0))
    for rho in (0, -0.1, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="rho must be a positive finite number"):
            geodesic_sharpness(M.model, [batch], rho, n_iter=1)
        with pytest.raises(ValueError, match="rho must be a positive finite number"):
            adaptive_sharpness(M.model, [batch], rho, n_iter=1)
    # the largest radius: above MAX_RHO refused as a likely typo; at it accepted (amendment 12 of
    # docs/tweets/PROTOCOL.md raised it from 10, which a relative size of 1e-2 on MiniLM-L6 can need)
    with pytest.raises(ValueError, match=f"rho = {MAX_RHO * 1.5:g} is larger than {MAX_RHO:g}"):
        adaptive_sharpness(M.model, [batch], MAX_RHO * 1.5, n_iter=1)
    assert math.isfinite(adaptive_sharpness(M.model, [batch], MAX_RHO, n_iter=1).mean)
    with pytest.raises(ValueError, match="no batches given"):
        geodesic_sharpness(M.model, [], RHO, n_iter=1)
    with pytest.raises(ValueError, match="no batches given"):
        adaptive_sharpness(M.model, iter([]), RHO, n_iter=1)
    with pytest.raises(ValueError, match="unknown metric 'euclid'"):
        geodesic_sharpness(M.model, [batch], RHO, metric="euclid", n_iter=1)


def test_nan_in_weight_names_parameter():
    M = build("bert")
    batch = M.make_batch(torch.Generator().manual_seed(0))
    m = copy.deepcopy(M.model)
    name = "bert.encoder.layer.1.attention.output.dense.weight"
    with torch.no_grad():
        dict(m.named_parameters())[name][3, 2] = float("nan")
    with pytest.raises(ValueError, match=name.replace(".", r"\.") + ".*NaN"):
        geodesic_sharpness(m, [batch], RHO, n_iter=1)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        adaptive_sharpness(m, [batch], RHO, n_iter=1)


def test_nan_in_inputs():
    M = build("vit")
    inputs, y = M.make_batch(torch.Generator().manual_seed(0))
    inputs = dict(pixel_values=inputs["pixel_values"].clone())
    inputs["pixel_values"][1, 0, 2, 2] = float("nan")
    good = M.make_batch(torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="batch 1: pixel_values contains NaN"):
        geodesic_sharpness(M.model, [good, (inputs, y)], RHO, n_iter=1)
    M = build("mha")
    x, y = M.make_batch(torch.Generator().manual_seed(0))
    x = x.clone()
    x[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="batch 0: inputs contains NaN"):
        adaptive_sharpness(M.model, [(x, y)], RHO, n_iter=1)


def test_rank_deficient_head_needs_eps():
    """Head 1 of layer 0's Q/K pair with two equal columns in G (W_Q rows and bias equal): GᵀG is
    singular. Without eps: ValueError naming the group and head and suggesting eps; eps=1e-6 works."""
    M = build("bert")
    batch = M.make_batch(torch.Generator().manual_seed(0))
    m = copy.deepcopy(M.model)
    p = "bert.encoder.layer.0.attention.self"
    h = 8
    with torch.no_grad():
        q = m.get_submodule(f"{p}.query")
        q.weight[h + 1] = q.weight[h]
        q.bias[h + 1] = q.bias[h]
    for metric in ("inv", "mix"):
        with pytest.raises(ValueError) as e:
            geodesic_sharpness(m, [batch], RHO, metric=metric, n_iter=2)
        msg = str(e.value)
        assert f"{p}:qk" in msg and "rank deficient" in msg and "heads [1]" in msg
        assert "eps" in msg and "1e-6" in msg
        r = geodesic_sharpness(m, [batch], RHO, metric=metric, n_iter=2, eps=1e-6)
        assert math.isfinite(r.mean) and r.mean > 0 and r.config["eps"] == 1e-6


def test_model_without_attention_warns_and_equals_adaptive():
    torch.manual_seed(0)
    mlp = cases.mlp().to(DT)
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(6, 4, generator=gen, dtype=DT), torch.randint(0, 3, (6,), generator=gen))
    for random_start in (False, True):
        with pytest.warns(UserWarning) as record:
            g = geodesic_sharpness(mlp, [batch], RHO, n_iter=N_ITER, random_start=random_start, seed=3)
        messages = [str(w.message) for w in record if issubclass(w.category, NoAttentionPairsWarning)]
        assert len(messages) == 1, messages  # said once (the detector's own warning is folded into it)
        assert "geodesic sharpness equals adaptive sharpness" in messages[0] and "(Sequential)" in messages[0]
        a = adaptive_sharpness(mlp, [batch], RHO, n_iter=N_ITER, random_start=random_start, seed=3)
        assert g.mean == a.mean and g.per_batch == a.per_batch
        assert g.config["pairs"] == 0
