"""Gated-MLP unit rescaling (geosharp_ref/symmetry/gated.py): the whole GL(1) per unit (negative scales too),
the fused gate_up_proj bound on its up half only, and the layouts refused with their reason. Exactness and the
protocol on the decoders of the case table are in test_binding.py (BINDING_CASES "*-gated-units")."""
from __future__ import annotations

import torch
from torch import nn

from geosharp_ref.symmetry import GatedUnitsBinding, check_binding, gated_mlp_candidates
from geosharp_ref.symmetry.check import CHECK_TOL, log_probabilities
from tests import cases

cases.quiet_transformers()


def _decoder(factory):
    torch.manual_seed(0)
    model = cases.randomize_vectors(factory(initializer_range=cases.IR).to(torch.float64).eval())
    x = torch.randint(3, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    return model, (dict(input_ids=x, use_cache=False), None)


def test_negative_unit_scales_are_symmetries_too():
    """σ(gate) ⊙ (a·up) / a: any a ≠ 0 (a ReLU unit only keeps a > 0)."""
    model, batch = _decoder(cases.llama)
    (b, _) = [c.binding for c in gated_mlp_candidates(model)]
    U = b.units
    signs = torch.tensor([(-1.0) ** j for j in range(U)], dtype=torch.float64)
    elements = [-torch.ones(U, dtype=torch.float64), 1e2 * signs, 1e-2 * signs]
    assert check_binding(model, b, batch, log_probabilities, elements, tol=CHECK_TOL) <= CHECK_TOL


def test_fused_gate_up_proj_binds_its_up_half_only():
    model, _ = _decoder(cases.phi3)
    (b, _) = [c.binding for c in gated_mlp_candidates(model)]
    assert isinstance(b, GatedUnitsBinding) and (b.offset, b.units) == (24, 24)
    name = "model.layers.0.mlp.gate_up_proj.weight"
    params = cases.params_of(model)
    mask = b.coverage({n: p.shape for n, p in params.items()})[name]
    assert mask[24:].all() and not mask[:24].any()
    moved = b.act(params, b.random_element(params, scale=1e2, seed=0))
    assert torch.equal(moved[name][:24], params[name][:24])  # the gate half is untouched
    assert not torch.equal(moved[name][24:], params[name][24:])


class _Gated(nn.Module):
    def __init__(self, wrap=False):
        super().__init__()
        self.gate_up_proj = nn.Linear(4, 12, bias=False)
        self.down_proj = nn.Sequential(nn.Linear(6, 4)) if wrap else nn.Linear(6, 4)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        up, gate = self.gate_up_proj(x).chunk(2, dim=-1)  # the opposite order: `up` is the first half here
        return self.down_proj(up * self.act_fn(gate))


class _Separate(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(4, 6), nn.Sequential(nn.Linear(4, 6))
        self.down_proj, self.act_fn = nn.Linear(6, 4), nn.SiLU()


def test_layouts_not_understood_are_refused_with_the_reason():
    (c,) = gated_mlp_candidates(_Gated())
    assert c.binding is None and "which half is `up` is unknown" in c.reason
    (c,) = gated_mlp_candidates(_Gated(wrap=True))
    assert c.binding is None and "not plain nn.Linear" in c.reason
    (c,) = gated_mlp_candidates(_Separate())
    assert c.binding is None and "not plain nn.Linear" in c.reason
    assert gated_mlp_candidates(cases.mlp(nn.ReLU)) == []
