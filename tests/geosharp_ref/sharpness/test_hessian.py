"""The Riemannian Hessian on the quotient (geosharp_ref.sharpness.hessian) against independent computations:

* its quadratic form g(ξ, Hess L[ξ]) equals d²/dt² L(γ(t))|₀ along the horizontal geodesic γ integrated with
  scipy's solve_ivp (DOP853, float64) from the generated geodesic acceleration at the moving point, the second
  derivative taken by a 5-point stencil on L(γ(±h)), L(γ(±2h));
* its flat operator Ã equals the dense reference: the Hessian of F(ξ) = L(E(ξ)) at ξ = 0 (autograd through the
  second-order geodesic, whose second derivative is ∇²L + ⟨∇L, γ̈⟩), restricted to a basis of the horizontal
  space (range of the dense projection) with the dense metric Gram matrix: trace and eigenvalues;
* the Euclidean operator equals torch.autograd.functional.hessian.

Models: the one-attention classifier (GL(h) Q/K and V/O pairs under inv and mix, the adaptive rest), the
ReLU MLP with its built-in GL(1) unit binding, the same MLP with a declared scaling binding (a generic
factor of the generated ``scaling`` kernels on its output layer), and a one-layer BERT with peft LoRA on the
query (into the heads) and the attention output (out of them), each adapter quotiented jointly with its pair
(:class:`~geosharp_ref.sharpness.joint_lora.JointLoRAFactor`, inv and mix: the hand-written block of
:mod:`~geosharp_ref.sharpness.joint_lora_hessian`); for the geodesic check also the tiny Llama's
grouped-query Q/K pairs under the RoPE subgroup (``rope_half_mix``, kernel options).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp
from torch.nn.attention import SDPBackend, sdpa_kernel

from geosharp_ref.sharpness import Factor, ProductSpace, build_space, default_loss, model_loss
from geosharp_ref.sharpness.curvature import exact_trace, top_eigenvalues
from geosharp_ref.sharpness.hessian import EuclideanHessian, QuotientHessian, hessian_vector_product
from geosharp_ref.sharpness.joint_lora import joint_lora_factors
from geosharp_ref.symmetry import NoAttentionPairsWarning, symmetry_map
from tests import cases
from tests.cases.reference import DENSE_TOL, dense_horizontal_hessian

DT = torch.float64
ODE_TOL = 1e-7     # quadratic form vs the ODE geodesic's second derivative, relative (observed ≤ 9.1e-9)


class OutputScaling:
    """A declared binding: the output layer's weight W (3, 6) as one block (n=3, k=6) of the ``scaling``
    geometry W ↦ a W (a generic factor; the loss is not invariant, which the operator does not need)."""

    key = "declared-scaling"
    param_names = ("2.weight",)

    def extract(self, params):
        return (params["2.weight"],)

    def insert(self, params, blocks):
        return {**params, "2.weight": blocks[0]}


def _attention(d=8, seed=0):
    torch.manual_seed(seed)
    model = cases.TinyAttention(d=d).double().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    batch = (torch.randn(4, 5, d, generator=gen, dtype=DT), torch.tensor([0, 1, 2, 1]))
    return model, batch


def _space(kind, metric="mix"):
    """(model, batch, space) of a named case."""
    if kind == "attention":
        model, batch = _attention()
        params = {n: p.detach() for n, p in model.named_parameters()}
        return model, batch, build_space(params, symmetry_map(model), metric)
    if kind == "joint-lora":
        return _joint_lora(metric)
    if kind == "llama-rope":  # the RoPE subgroup on grouped-query Q/K pairs (generic factors, kernel options)
        case = cases.build_binding_case("llama-rope-qk")
        return case.model, case.batch, build_space(case.params, None, None, case.bindings)
    case = cases.build_binding_case("mlp-relu-units")
    model, batch, params = case.model, case.batch, case.params
    if kind == "relu-units":
        return model, batch, build_space(params, None, None, case.bindings)
    return model, batch, ProductSpace(params, [Factor("scaling", OutputScaling())])


def _joint_lora(metric, hidden=8):
    """LoRA × attention: a one-layer BERT (``hidden`` wide, 2 heads) with LoRA on query (into the heads) and on the
    attention output (out of them), one joint factor per adapter and its pair; nothing else perturbed."""
    pytest.importorskip("peft")
    torch.manual_seed(0)
    model = cases.lora(cases.bert(initializer_range=cases.IR, hidden_size=hidden, intermediate_size=2 * hidden,
                                  num_attention_heads=2, num_hidden_layers=1),
                       targets=("query", "attention.output.dense")).to(DT).eval()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
        factors, _ = joint_lora_factors(model, symmetry_map(model).groups, metric)
    params = {n: p.detach() for n, p in model.named_parameters()}
    batch = ({"input_ids": torch.randint(3, 50, (4, 7), generator=torch.Generator().manual_seed(1))},
             torch.tensor([0, 1, 2, 1]))
    return model, batch, ProductSpace(params, factors, adaptive_masks={})


CASES = [("attention", "inv"), ("attention", "mix"), ("relu-units", "mix"), ("declared-scaling", None),
         ("joint-lora", "inv"), ("joint-lora", "mix")]
IDS = ["attention-inv", "attention-mix", "relu-units", "declared-scaling", "joint-lora-inv", "joint-lora-mix"]


def _loss(kind, model, batch):
    loss_fn = cases.lm_loss if kind == "llama-rope" else default_loss
    return lambda p: model_loss(model, p, batch, loss_fn)


def _geodesic_loss(op, space, loss, xi, ts):
    """L(γ(t)) for t in ``ts``: γ̈ = −Γ_γ(γ̇, γ̇) integrated with solve_ivp (float64) from (θ, ξ), factor by
    factor from the geodesic acceleration at the moving point (the generated one, no cache; the joint LoRA
    factor's closed form), flat on the rest."""
    parts, rest = op._split(xi)
    shapes = [x.shape for p in parts for x in p]
    sizes = [int(np.prod(s)) for s in shapes]
    x0 = np.concatenate([X.reshape(-1).numpy() for b in op.blocks for X in b.at.point])
    v0 = np.concatenate([x.reshape(-1).numpy() for p in parts for x in p])

    def unflat(z):
        out, i = [], 0
        for s, k in zip(shapes, sizes):
            out.append(torch.from_numpy(z[i:i + k].copy()).reshape(s))
            i += k
        return out

    def blocks_of(z):
        flat, out, i = unflat(z), [], 0
        for b in op.blocks:
            out.append(flat[i:i + b.at.size])
            i += b.at.size
        return out

    def rhs(_, y):
        n = len(y) // 2
        acc = []
        for b, X, V in zip(op.blocks, blocks_of(y[:n]), blocks_of(y[n:])):
            acc += [a.reshape(-1).numpy() for a in b.geodesic_acceleration(X, V)]
        return np.concatenate([y[n:], np.concatenate(acc)])

    values = []
    for t in ts:
        if t == 0:
            blocks = blocks_of(x0)
        else:
            sol = solve_ivp(rhs, (0.0, t), np.concatenate([x0, v0]), method="DOP853", rtol=1e-13, atol=1e-15)
            blocks = blocks_of(sol.y[: len(x0), -1])
        params = dict(space.base)
        for b, X in zip(op.blocks, blocks):
            params = b.at.insert(params, X)
        for n, m, x in zip(space.adaptive_names, space.masks, rest):
            params[n] = params[n] + t * (x if m is None else x * m)
        values.append(float(loss(params)))
    return values


@pytest.mark.parametrize("kind,metric", CASES + [("llama-rope", "mix")], ids=IDS + ["llama-rope-gqa"])
def test_quadratic_form_equals_the_second_derivative_along_the_ode_geodesic(kind, metric):
    model, batch, space = _space(kind, metric)
    op = QuotientHessian(space, _loss(kind, model, batch))
    gen = torch.Generator().manual_seed(3)
    xi = space.random(1.0, gen)
    xi = [x / space.norm(xi) for x in xi]  # g-unit, horizontal
    h = 1e-2  # 5-point stencil: truncation ~h⁴, round-off ~ε·L/h² (both ≤ 2e-8 relative here)
    fm2, fm1, f0, f1, f2 = _geodesic_loss(op, space, _loss(kind, model, batch), xi, (-2 * h, -h, 0.0, h, 2 * h))
    second = (-f2 + 16 * f1 - 30 * f0 + 16 * fm1 - fm2) / (12 * h * h)
    q = op.quadratic_form(xi)
    assert abs(q - second) <= ODE_TOL * max(abs(q), 1e-3), (q, second)
    # the Euclidean quadratic form alone misses ⟨∇L, γ̈(0)⟩ wherever a factor has a connection
    euclid = float(sum((a * b).sum() for a, b in zip(op.hvp(op.to_params(xi)).values(), op.to_params(xi).values())))
    if kind == "attention":
        assert abs(euclid - second) > 1e3 * ODE_TOL * abs(second)


@pytest.mark.parametrize("kind,metric", CASES, ids=IDS)
def test_trace_and_eigenvalues_equal_the_dense_horizontal_hessian(kind, metric):
    model, batch, space = _space(kind, metric)
    if kind == "attention":  # a smaller attention model keeps the dense Hessian cheap
        model, batch = _attention(d=4)
        params = {n: p.detach() for n, p in model.named_parameters()}
        space = build_space(params, symmetry_map(model), metric)
    if kind == "joint-lora":  # so does a narrower BERT (heads of width 2)
        model, batch, space = _joint_lora(metric, hidden=4)
    op = QuotientHessian(space, lambda p: model_loss(model, p, batch))
    ref, dim_h = dense_horizontal_hessian(space, model, batch)
    assert dim_h < op.dim  # a vertical space exists: the restriction is a real restriction
    tr = exact_trace(op)
    assert abs(tr - float(ref.sum())) <= DENSE_TOL * float(ref.abs().sum())
    top = top_eigenvalues(op, 3, steps=op.dim).values
    scale = float(ref.abs().max())
    assert np.allclose(top, ref.flip(0)[:3].numpy(), rtol=0, atol=DENSE_TOL * scale)
    assert np.allclose(top_eigenvalues(op, 2, method="scipy").values, top[:2], rtol=0, atol=1e-8 * scale)


def test_operator_is_self_adjoint_and_horizontal_with_parameter_dicts():
    model, batch, space = _space("attention", "inv")
    op = QuotientHessian(space, lambda p: model_loss(model, p, batch))
    gen = torch.Generator().manual_seed(5)
    xi, eta = space.random(1.0, gen), space.random(1.0, gen)
    h_xi, h_eta = op.matvec(xi), op.matvec(eta)
    assert float(op.inner(h_xi, eta)) == pytest.approx(float(op.inner(xi, h_eta)), rel=1e-11)
    assert float(sum((a - b).abs().max() for a, b in zip(space.project_horizontal(h_xi), h_xi))) < 1e-10
    # the parameter-dict matvec is the tangent matvec placed on the parameters
    d = op.to_params(xi)
    assert all(torch.allclose(op.matvec_params(d)[n], op.to_params(h_xi)[n], atol=1e-12) for n in d)
    # a vertical direction is projected out: Hess(ξ + v) = Hess(ξ)
    raw = [torch.randn(t.shape, generator=gen, dtype=DT) for t in space.zeros()]
    vert = [r - p for r, p in zip(raw, space.project_horizontal(raw))]
    moved = op.matvec([x + v for x, v in zip(xi, vert)])
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(moved, h_xi))


def test_euclidean_operator_and_both_hvp_modes_equal_the_dense_hessian():
    model, batch = _attention(d=4)
    params = {n: p.detach() for n, p in model.named_parameters()}
    names = list(params)
    shapes = [params[n].shape for n in names]
    flat0 = torch.cat([params[n].reshape(-1) for n in names])

    def unflat(v):
        out, i = {}, 0
        for n, s in zip(names, shapes):
            k = int(np.prod(s))
            out[n] = v[i:i + k].reshape(s)
            i += k
        return out

    with sdpa_kernel([SDPBackend.MATH]):
        H = torch.autograd.functional.hessian(lambda v: model_loss(model, unflat(v), batch), flat0)
    op = EuclideanHessian(params, lambda p: model_loss(model, p, batch))
    assert exact_trace(op) == pytest.approx(float(H.trace()), rel=1e-11)
    v = torch.randn(flat0.shape, generator=torch.Generator().manual_seed(0), dtype=DT)
    for mode in ("forward", "reverse"):
        _, hv = hessian_vector_product(lambda p: model_loss(model, p, batch), params, names, unflat(v), mode)
        assert torch.allclose(torch.cat([hv[n].reshape(-1) for n in names]), H @ v, atol=1e-11)


def test_frobenius_ablation_and_bad_modes_are_refused():
    model, batch = _attention()
    params = {n: p.detach() for n, p in model.named_parameters()}
    space = build_space(params, symmetry_map(model), "mix", metric_norm=False)
    with pytest.raises(ValueError, match="metric_norm=False"):
        QuotientHessian(space, lambda p: model_loss(model, p, batch))
    with pytest.raises(ValueError, match="HVP mode"):
        EuclideanHessian(params, lambda p: model_loss(model, p, batch), hvp="sideways")
