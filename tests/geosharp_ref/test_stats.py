"""Rank statistics (geosharp_ref.stats): the vectorised Kendall τ-b against scipy, and the bootstrap interval."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.stats import kendalltau

from geosharp_ref.stats import kendall_tau_b, kendall_with_ci


@settings(max_examples=20)
@given(seed=st.integers(0, 10_000), m=st.integers(3, 15), ties=st.booleans())
def test_vectorised_kendall_matches_scipy(seed, m, ties):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, m).astype(float) if ties else rng.standard_normal(m)
    y = rng.integers(0, 3, m).astype(float) if ties else rng.standard_normal(m)
    ref = kendalltau(x, y).statistic
    got = kendall_tau_b(x[None], y[None])[0]
    assert (np.isnan(ref) and np.isnan(got)) or np.isclose(got, ref, atol=1e-12)


def test_kendall_with_ci():
    """scipy's τ and p; the interval brackets τ, is deterministic in the seed, and drops non-finite pairs."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(30)
    y = x + 0.8 * rng.standard_normal(30)
    res = kendall_with_ci(x, y, n_boot=400, seed=1)
    ref = kendalltau(x, y)
    assert res["tau"] == pytest.approx(ref.statistic, abs=1e-15) and res["p"] == pytest.approx(ref.pvalue)
    assert res["n"] == 30 and res["ci"][0] < res["tau"] < res["ci"][1]
    assert kendall_with_ci(x, y, n_boot=400, seed=1) == res
    assert kendall_with_ci(x, y, n_boot=400, seed=2)["ci"] != res["ci"]
    xn, yn = np.append(x, np.nan), np.append(y, 1.0)
    assert kendall_with_ci(xn, yn, n_boot=400, seed=1) == res
    few = kendall_with_ci([1.0, 2.0], [2.0, 1.0])
    assert few["n"] == 2 and np.isnan(few["tau"]) and all(np.isnan(few["ci"]))

