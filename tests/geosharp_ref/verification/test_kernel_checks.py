"""The kernel checks (geosharp_ref.verification.kernel_checks) and their random inputs
(geosharp_ref.sampling): the built-in modules pass, a broken module fails, points and
group elements are as well conditioned as promised."""
import types

import pytest
import torch

from geosharp_ref.kernels import load_kernels
from geosharp_ref.verification.kernel_checks import (acceleration_vs_koszul, run_checks, second_order_vjp_error,
                                                     verification_table)
from geosharp_ref.sampling import draw_orbit_elements, sample_group_element, sample_point, well_conditioned
from tests import cases


def _broken(name="gl_mix", factor=1.01):
    """A copy of a built-in module whose geodesic acceleration is off by a factor."""
    good = load_kernels(name)
    mod = types.ModuleType(f"broken_{name}")
    mod.__dict__.update({k: v for k, v in vars(good).items() if not k.startswith("__")})
    mod.geodesic_acceleration = lambda *a, **k: tuple(factor * t for t in good.geodesic_acceleration(*a, **k))
    return mod


def test_builtins_pass_and_the_table_names_them():
    ok, table = verification_table(("gl_inv", "diag_mix", "scaling"))
    assert ok, table
    assert "FAIL" not in table
    for name in ("gl_inv", "diag_mix", "scaling"):
        assert sum(line.split()[:1] == [name] for line in table.splitlines()) == 1
    r = run_checks("gl_mix", seed=3)
    assert r["module"] == "gl_mix" and abs(r["geodesic_slope"] - 3) < 0.3
    errors = ("accel_vs_koszul", "horizontal", "idempotent", "orthogonal", "gradient", "metric_invariance",
              "accel_equivariance", "second_order_vjp")
    assert max(r[k] for k in errors) < 1e-9 and 0 < r["geodesic_err_min_t"] < 1e-4


def test_a_wrong_acceleration_is_caught():
    bad = _broken()
    assert acceleration_vs_koszul(bad) > 1e-3
    assert second_order_vjp_error(bad) > 1e-3  # E(ξ) no longer agrees with θ + ξ + ½γ̈ of the module
    r = run_checks(bad)
    assert r["module"] == "broken_gl_mix" and r["accel_vs_koszul"] > 1e-3
    ok, table = verification_table([bad])
    assert not ok and "broken_gl_mix" in table and "FAIL" in table


@pytest.mark.parametrize("cond", [4.0, 16.0])
def test_sampled_points_and_group_elements_are_well_conditioned(cond):
    gen = torch.Generator().manual_seed(0)
    s = torch.linalg.svdvals(well_conditioned((5, 7, 3), gen, torch.float64, cond=cond))
    assert s.shape == (5, 3) and float(s.min()) >= 1 - 1e-12 and float(s.max()) <= cond * (1 + 1e-12)
    mod = load_kernels("gl_inv")
    point = sample_point(mod, batch=(2,), seed=1)
    assert len(point) == len(mod.BLOCKS) and all(p.shape[0] == 2 and p.dtype == torch.float64 for p in point)
    assert torch.equal(point[0], sample_point(mod, batch=(2,), seed=1)[0])
    A = sample_group_element(mod, point, seed=2, scale=10.0)
    sv = torch.linalg.svdvals(A) / 10.0
    assert float(sv.min()) >= 1 - 1e-12 and float(sv.max()) <= 4 * (1 + 1e-12)


def test_orbit_elements_per_group():
    """A = a·Q·diag(u): (heads, h, h) per group, singular values a·u with u in [0.5, 2]."""
    _, smap = cases.build("symmetry", "mha-cross")
    assert len(smap.groups) == 2
    As = draw_orbit_elements(smap, 100.0, torch.Generator().manual_seed(0))
    assert len(As) == len(smap.groups)
    for g, A in zip(smap.groups, As):
        assert A.shape == (g.num_heads, g.head_dim, g.head_dim)
        sv = torch.linalg.svdvals(A) / 100.0
        assert float(sv.min()) >= 0.5 - 1e-12 and float(sv.max()) <= 2 + 1e-12
