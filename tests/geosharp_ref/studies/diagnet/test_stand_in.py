"""The paper's stand-in for S_mix, ρ‖β − β*‖ with β* the minimum-norm least-squares predictor, as a column of
the diagonal-network experiment: against numpy's least squares (independent of the torch pseudo-inverse)."""
import numpy as np
import pytest
import torch

from geosharp_ref.studies.diagnet import compute_sharpness, make_data


def test_paper_stand_in_column_is_rho_times_distance_to_min_norm_solution():
    data = make_data(d=12, n=6, n_test=50, seed=3)
    g = torch.Generator().manual_seed(0)
    U = torch.rand(4, 12, generator=g, dtype=torch.float64) + 0.1
    V = torch.randn(4, 12, generator=g, dtype=torch.float64)
    cols, _ = compute_sharpness(U, V, data, (0.1, 0.5), n_iter=2, apgd_models=0, ref_iter=5, n_random=0,
                                progress=False)
    beta_star = np.linalg.lstsq(data.X.numpy(), data.y.numpy(), rcond=None)[0]  # minimum-norm solution
    dist = np.linalg.norm((U * V).numpy() - beta_star, axis=1)
    for rho in (0.1, 0.5):
        assert cols[f"paper_mix_stand_in@rho={rho:g}"] == pytest.approx(rho * dist, rel=1e-10)
