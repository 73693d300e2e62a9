"""The Riemannian Hessian with the norms' weights quotiented jointly (folded bindings, issue 26) against the dense
reference of tests/geosharp_ref/sharpness/test_hessian.py (the Hessian of L(E(ξ)) on a basis of the horizontal space
in the space's own metric), on a tiny pre-norm network: LayerNorm → a hand-written attention (q/k/v/o nn.Linear)
and a final LayerNorm → the classifier head. The folded bindings map a tangent direction by Γ⁻¹ and a covector by
Γ⁻¹ as well (the adjoint of W = Ŵ Γ⁻¹), which ``QuotientHessian.from_params`` must get right; and the trace is
invariant when the model moves along every quotiented orbit at once."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from geosharp_ref.sharpness import build_space, model_loss
from geosharp_ref.sharpness.curvature import exact_trace, top_eigenvalues
from geosharp_ref.sharpness.hessian import QuotientHessian
from geosharp_ref.symmetry import NormWeightsBinding, Quotient
from geosharp_ref.verification.orbits import model_with_params
from tests.cases.models import GQAAttention
from tests.cases.reference import DENSE_TOL, dense_horizontal_hessian

DT = torch.float64


class PreNormNet(nn.Module):
    """(B, T, 3) → embed → x + attention(LayerNorm(x)) → LayerNorm → head (3 classes) → mean over T."""

    def __init__(self, d=4):
        super().__init__()
        self.embed = nn.Linear(3, d)
        self.norm = nn.LayerNorm(d)
        self.attn = GQAAttention(d=d, num_heads=2, num_key_value_heads=2, head_dim=2)
        self.final_norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        x = self.embed(x)
        x = x + self.attn(self.norm(x))
        return self.head(self.final_norm(x)).mean(1)


def _case(seed=0):
    torch.manual_seed(seed)
    model = PreNormNet().to(DT).eval()
    with torch.no_grad():
        for m in (model.norm, model.final_norm):
            m.weight.uniform_(0.5, 2.0).mul_(torch.where(torch.rand(4) < 0.3, -1.0, 1.0).to(DT))
            m.bias.normal_(0.0, 0.3)
    gen = torch.Generator().manual_seed(seed + 1)
    batch = (torch.randn(4, 5, 3, generator=gen, dtype=DT), torch.tensor([0, 1, 2, 1]))
    return model, batch


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_trace_and_eigenvalues_equal_the_dense_horizontal_hessian_with_folded_norms(metric):
    model, batch = _case()
    q = Quotient.resolve(model, batch, metric=metric, symmetries="all")
    assert sum(isinstance(b, NormWeightsBinding) for b in q.bindings) == 2 and len(q.pairs) == 2
    assert all(getattr(g, "norm_folds", ()) for g in q.pairs)
    params = {n: p.detach() for n, p in model.named_parameters()}
    space = build_space(params, quotient=q)
    op = QuotientHessian(space, lambda p: model_loss(model, p, batch))
    ref, dim_h = dense_horizontal_hessian(space, model, batch)
    assert dim_h < op.dim
    tr = exact_trace(op)
    assert abs(tr - float(ref.sum())) <= DENSE_TOL * float(ref.abs().sum()), (tr, float(ref.sum()))
    top = top_eigenvalues(op, 3, steps=op.dim).values
    assert np.allclose(top, ref.flip(0)[:3].numpy(), rtol=0, atol=DENSE_TOL * float(ref.abs().max()))


def test_parameter_dict_matvec_is_the_tangent_matvec_placed_on_the_parameters():
    model, batch = _case()
    q = Quotient.resolve(model, batch, metric="inv", symmetries="all")
    space = build_space({n: p.detach() for n, p in model.named_parameters()}, quotient=q)
    op = QuotientHessian(space, lambda p: model_loss(model, p, batch))
    xi = space.random(1.0, torch.Generator().manual_seed(5))
    d = op.to_params(xi)
    hd, hx = op.matvec_params(d), op.to_params(op.matvec(xi))
    assert all(torch.allclose(hd[n], hx[n], atol=1e-12, rtol=1e-10) for n in d)


def test_the_quotient_trace_is_invariant_along_every_orbit_at_once():
    model, batch = _case()
    q = Quotient.resolve(model, batch, metric="mix", symmetries="all")
    params = {n: p.detach() for n, p in model.named_parameters()}

    def trace(p):
        m = model_with_params(model, p)
        qq = Quotient.resolve(m, batch, metric="mix", symmetries="all")
        space = build_space({n: t.detach() for n, t in m.named_parameters()}, quotient=qq)
        return exact_trace(QuotientHessian(space, lambda pp: model_loss(m, pp, batch)))

    t0 = trace(params)
    moved = params
    for i, b in enumerate(q.pairs + q.bindings):
        moved = b.act(moved, b.random_element(moved, scale=10.0 if i % 2 else 0.1, seed=i))
    assert abs(trace(moved) - t0) <= 1e-8 * abs(t0)
