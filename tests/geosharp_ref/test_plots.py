"""Population scatter plots (geosharp_ref.plots): each panel shows every model at its (sharpness, gap), and a
``color`` splits the points by a hyper-parameter (one series per level, or a colour map for many numbers)."""
import numpy as np
import pytest

from geosharp_ref.plots import plot_population_scatter

MEASURES = ["adaptive", "geodesic-mix"]


def _population(n, seed=0):
    rng = np.random.default_rng(seed)
    names = [f"model_{i:03d}" for i in range(n)]
    grid = {"adaptive": ["0.01", "0.1"], "geodesic-mix": ["0.005", "0.05"]}
    recs = {n_: {"values": {m: {r: float(rng.uniform(1e-3, 1e-2)) for r in grid[m]} for m in MEASURES}}
            for n_ in names}
    gap = rng.uniform(0.0, 0.1, size=n)
    table = {row: {m: dict(tau=0.1, ci=[-0.2, 0.3]) for m in MEASURES} for row in ("size=2e-05", "size=0.0002")}
    return names, recs, gap, dict(measures=MEASURES, rho_grid=grid), table


def test_uncoloured_panels_hold_every_model(tmp_path):
    names, recs, gap, cfg, table = _population(7)
    fig = plot_population_scatter(tmp_path / "s.png", names, recs, gap, cfg, table)
    assert (tmp_path / "s.png").stat().st_size > 1000 and len(fig.axes) == 4
    ax = fig.axes[3]  # second row, geodesic-mix at its second radius
    want = np.column_stack([[recs[n]["values"]["geodesic-mix"]["0.05"] for n in names], gap])
    assert np.allclose(ax.collections[0].get_offsets(), want)


@pytest.mark.parametrize("color, levels", [
    ([True, False] * 4, [False, True]),
    (["a", "b", "c"] * 3 + ["d"] * 4, ["a", "b", "c", "d"]),
    (list(range(8))[::-1] * 2, list(range(8))),
    ([1e-4, 2e-5, 3e-5, 1e-5] * 3, [1e-5, 2e-5, 3e-5, 1e-4]),  # by value: in string order 0.0001 comes first
])
def test_coloured_by_a_hyperparameter(tmp_path, color, levels):
    names, recs, gap, cfg, table = _population(len(color), seed=1)
    fig = plot_population_scatter(tmp_path / "c.png", names, recs, gap, cfg, table, color=color, color_label="h")
    ax = fig.axes[1]  # first row, geodesic-mix
    x = np.array([recs[n]["values"]["geodesic-mix"]["0.005"] for n in names])
    if len(levels) <= 6:  # one series per level, each holding exactly that level's models, and a legend
        assert len(ax.collections) == len(levels)
        for level, coll in zip(levels, ax.collections):
            sel = np.array([c == level for c in color])
            assert np.allclose(coll.get_offsets(), np.column_stack([x[sel], gap[sel]]))
        assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [f"h={v}" for v in levels]
    else:  # many numbers: one series coloured by value, and a colour bar
        assert len(ax.collections) == 1 and np.allclose(ax.collections[0].get_array(), color)
        assert len(fig.axes) == 5 and fig.axes[4].get_ylabel() == "h"
