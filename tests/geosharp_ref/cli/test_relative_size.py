"""Comparable radii: every result reports ‖Δθ‖/‖θ‖, and ``evaluate --target-relative-size`` picks ρ so the
maximiser moves the weights by the requested relative amount."""
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geosharp_ref.cli import main
from geosharp_ref.sharpness import rho_for_size


@given(c=st.floats(1e-4, 1e2), k=st.floats(0.5, 3.0), target=st.floats(1e-6, 1.0))
def test_rho_for_size_inverts_a_power_law(c, k, target):
    probes = (0.01, 0.03)
    sizes = [c * r ** k for r in probes]
    (rho,) = rho_for_size(probes, sizes, [target])
    assert c * rho ** k == pytest.approx(target, rel=1e-9)


def test_rho_for_size_refuses_probes_that_moved_nothing():
    with pytest.raises(ValueError, match="must move the weights"):
        rho_for_size((0.01, 0.03), (0.0, 1e-3), [1e-3])
    with pytest.raises(ValueError, match="did not grow"):
        rho_for_size((0.01, 0.03), (2e-3, 1e-3), [1e-3])


@pytest.mark.parametrize("metric", ["adaptive", "mix"])
def test_target_relative_size_is_met_on_the_first_batch(saved, tmp_path, metric, capsys):
    out = tmp_path / "r.json"
    target = 2e-3
    assert main(["evaluate", str(saved / "bert"), "--data", str(saved / "bert.pt"), "--metric", metric,
                 "--target-relative-size", str(target), "--batch-size", "5", "--batches", "2", "--iters", "5",
                 "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    text = capsys.readouterr().out
    assert f"for ‖Δθ‖/‖θ‖ = {target:g}" in text and "‖Δθ‖/‖θ‖  : median" in text
    # the fit is exact at the probes and the maximiser's size is close to linear in ρ: within 30 %
    assert abs(math.log(d["relative_size"][0] / target)) < math.log(1.3)
    assert len(d["relative_size"]) == 2 and all(x > 0 for x in d["relative_size"])
    if metric == "mix":
        assert set(d["relative_size_groups"][0]) == {"gl_pairs", "rest"}
