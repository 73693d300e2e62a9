"""Generic factors (geosharp_ref.sharpness.factors): every hook from the generated kernels, so the ablations
(metric_norm=False, gradient="perturbed", geodesic_correction=False) and the rank check work on every
geometry: on the unit-scaling, translation and diagonal factors as on the GL pairs; the VJP fallback
(torch.func) equals the generated VJP."""
import copy
import math
import types

import pytest
import torch

from geosharp_ref.apgd import apgd, value_and_grad
from geosharp_ref.sampling import sample_point, sample_tangent
from geosharp_ref.sharpness import Cotangents, Factor, ProductSpace, geodesic_sharpness, model_loss
from geosharp_ref.sharpness.factors import GenericFactorAt, check_rank
from geosharp_ref.sharpness.space import SpaceOptions
from tests import cases

f64 = torch.float64


class _Block:
    """Binds one parameter (a matrix W, or a column w) as a factor's single block."""

    def __init__(self, name, column=False):
        self.key, self.param_names, self.column = f"{name}:test", (name,), column

    def extract(self, params):
        W = params[self.param_names[0]]
        return (W.reshape(-1, 1) if self.column else W,)

    def insert(self, params, blocks):
        out = dict(params)
        out[self.param_names[0]] = blocks[0].reshape(out[self.param_names[0]].shape)
        return out


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    batch = (torch.randn(8, 6, dtype=f64), torch.randint(0, 3, (8,)))
    params = {k: v.detach() for k, v in model.named_parameters()}
    return model, batch, params


def _factors():
    return [Factor("scaling", _Block("0.weight")), Factor("translation", _Block("2.bias", column=True))]


@pytest.mark.parametrize("kw", [{}, {"metric_norm": False}, {"gradient": "perturbed"}, {"geodesic_correction": False}])
def test_ablations_on_generic_factors_match_autograd(kw):
    """The cotangent path of generic factors (E as leaves, the generated VJP, 𝔾⁻¹ or the identity, P) equals
    autograd through perturbed_params followed by the same map with ∂E/∂ξ = I, for every ablation."""
    model, batch, params = _mlp()
    loss = lambda p: model_loss(model, p, batch)  # noqa: E731
    space = ProductSpace(params, _factors(), **kw)
    ref = ProductSpace(params, _factors(), **{**kw, "geodesic_correction": False, "gradient": "exact"})
    gen = torch.Generator().manual_seed(1)
    xi = space.project([torch.randn(t.shape, generator=gen, dtype=f64) for t in space.zeros()], 0.3)
    f_c, g_c = space.value_and_grad(loss)(xi)
    f_a, g_a = value_and_grad(lambda x: loss(space.perturbed_params(x)))(xi)
    assert f_c == pytest.approx(f_a, rel=1e-13)
    d_c, dd_c, xd_c = space.ascent_step(xi, g_c)
    d_a, dd_a, xd_a = ref.ascent_step(xi, Cotangents(g_a, xi))
    for a, b in zip(d_c, d_a):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert float(dd_c) == pytest.approx(float(dd_a), rel=1e-10)
    assert float(xd_c) == pytest.approx(float(xd_a), rel=1e-10)
    assert float(dd_c) == pytest.approx(float(space.inner(d_c, d_c)), rel=1e-10)
    assert float(xd_c) == pytest.approx(float(space.inner(xi, d_c)), rel=1e-10)
    res = apgd(space.value_and_grad(loss), space, 0.3, n_iter=6)
    assert res.best_value >= res.start_value and space.norm(res.best_xi) <= 0.3 * (1 + 1e-12)


def test_ablations_differ_on_generic_factors():
    model, batch, params = _mlp()
    loss = lambda p: model_loss(model, p, batch)  # noqa: E731
    vals = {}
    for name, kw in (("full", {}), ("frobenius", {"metric_norm": False}), ("first-order", {"geodesic_correction": False})):
        space = ProductSpace(params, _factors(), **kw)
        vals[name] = apgd(space.value_and_grad(loss), space, 0.5, n_iter=8).best_value
    assert vals["full"] != pytest.approx(vals["frobenius"], rel=1e-6)
    assert vals["full"] != pytest.approx(vals["first-order"], rel=1e-9)


@pytest.mark.parametrize("kernels", ["scaling", "translation", "gl_mix", "gl_inv", "diag_mix"])
def test_vjp_fallback_equals_the_generated_vjp(kernels):
    """(∂E/∂ξ)ᵀ ū by torch.func.vjp of second_order_geodesic (modules without a generated VJP) equals the
    generated second_order_geodesic_vjp."""
    f = Factor(kernels, None)
    point = sample_point(f.module, batch=(2,) if kernels.startswith("gl_") else (), sizes={"n": 7, "m": 6, "h": 3},
                         seed=3)
    xi = tuple(0.1 * t for t in sample_tangent(f.module, point, seed=4))
    cot = sample_tangent(f.module, point, seed=5)
    cache = f.prepare(point)
    a = f.second_order_geodesic_vjp(point, xi, cot, cache)
    module = types.ModuleType(f"{kernels}_without_vjp")
    module.__dict__.update({k: v for k, v in vars(f.module).items()
                            if k not in ("second_order_geodesic_vjp", "__name__", "__spec__", "__loader__")})
    b = Factor(module, None).second_order_geodesic_vjp(point, xi, cot, cache)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-13)


def test_rank_check_on_generic_gl_factor_and_helper():
    """A rank-deficient block of a matrix-group factor is refused with the clear error (not a raw
    LinAlgError), naming the key, block and heads; eps > 0 passes; element-wise and non-matrix groups
    are not checked."""
    G = torch.randn(2, 5, 3, dtype=f64)
    G[1, :, 2] = G[1, :, 1]
    H = torch.randn(2, 4, 3, dtype=f64)
    with pytest.raises(ValueError, match=r"k: G is rank deficient for heads \[1\].*eps=1e-6"):
        check_rank("k", ("G", "H"), (G, H))
    check_rank("k", ("G", "H"), (G, H), eps=1e-6)

    class Pair:
        key, param_names = "pair", ("G", "H")

        @staticmethod
        def extract(params):
            return params["G"], params["H"]

    with pytest.raises(ValueError, match="pair: G is rank deficient"):
        GenericFactorAt(Factor("gl_mix", Pair()), {"G": G, "H": H}, SpaceOptions())
    GenericFactorAt(Factor("gl_mix", Pair(), 1e-6), {"G": G, "H": H}, SpaceOptions())
    W = torch.zeros(4, 3, dtype=f64)
    W[:, 0] = 1.0
    GenericFactorAt(Factor("scaling", _Block("W")), {"W": W}, SpaceOptions())  # positive scaling: no Gram inverse


def test_rank_deficient_bert_on_the_generic_path_gives_the_clear_error():
    """symmetries=[] (generic factors for the given symmetries, the attention pairs in the GL factor) and
    the fast GL factor switched off both refuse a rank-deficient head with the ValueError."""
    M = cases.sharpness_case("bert")
    batch = M.make_batch(torch.Generator().manual_seed(0))
    m = copy.deepcopy(M.model)
    g = M.smap.groups[0]
    G, H = g.extract({k: v.detach() for k, v in m.named_parameters()})
    name = [n for n in g.param_names if "query" in n and n.endswith("weight")][0]
    with torch.no_grad():
        w = dict(m.named_parameters())[name]
        h = G.shape[-1]
        w[h + 1] = w[h]
        b = dict(m.named_parameters())[name.replace("weight", "bias")]
        b[h + 1] = b[h]
    with pytest.raises(ValueError, match="rank deficient"):
        geodesic_sharpness(m, [batch], 0.05, metric="mix", n_iter=2, symmetries=[], loss_fn=M.loss_fn)
    params = {k: v.detach() for k, v in m.named_parameters()}
    from geosharp_ref.sharpness import gl_pair_factors
    from geosharp_ref.symmetry import symmetry_map
    smap = symmetry_map(m)
    with pytest.raises(ValueError, match="rank deficient"):
        ProductSpace(params, gl_pair_factors(smap.groups, "inv"), smap.adaptive_masks, fast=False)
    r = geodesic_sharpness(m, [batch], 0.05, metric="mix", n_iter=2, symmetries=[], eps=1e-6, loss_fn=M.loss_fn)
    assert math.isfinite(r.mean)


def test_generic_path_offers_the_ablations():
    """geodesic_sharpness(..., symmetries=[...]) accepts metric_norm=False and gradient="perturbed" (no refusal)
    and gives with symmetries=[] the value of the attention-pairs-only space."""
    M = cases.sharpness_case("bert")
    batch = M.make_batch(torch.Generator().manual_seed(0))
    for kw in ({"metric_norm": False}, {"gradient": "perturbed"}):
        a = geodesic_sharpness(M.model, [batch], 0.05, metric="mix", n_iter=3, symmetries=[], loss_fn=M.loss_fn, **kw)
        b = geodesic_sharpness(M.model, [batch], 0.05, metric="mix", n_iter=3, loss_fn=M.loss_fn, **kw)
        assert a.mean == pytest.approx(b.mean, rel=1e-9)
