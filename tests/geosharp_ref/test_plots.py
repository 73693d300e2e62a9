"""Population plots (geosharp_ref.plots): each scatter panel shows every model at its (sharpness, gap), and a
``color`` splits the points by a hyper-parameter (one series per level, or a colour map for many numbers); the
signed-contrast plot shows each contrast, its interval, its partial-τ version and the paper's value."""
import numpy as np
import pytest

from geosharp_ref.plots import plot_population_scatter, plot_signed_contrast

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


def _contrast(d, ci, partial, paper, better=False):
    return dict(difference=d, ci=ci, given_train_error=dict(difference=partial, ci=[partial - 0.1, partial + 0.2]),
                paper_attenuated_difference=paper, geodesic_better=better)


def test_signed_contrast_plot_shows_each_contrast_in_size_order(tmp_path):
    result = dict(models=80, reliability=dict(pearson_full_spearman_brown=0.93), signed_contrast={
        "size=0.0002": {"geodesic-inv - adaptive": _contrast(0.2, [0.05, 0.3], 0.1, 0.21, better=True),
                        "geodesic-mix - adaptive": _contrast(0.1, [-0.1, 0.25], 0.05, 0.30),
                        "geodesic-mix-linearised - adaptive-linearised": _contrast(9.0, [8.0, 10.0], 9.0, 9.0)},
        "size=2e-05": {"geodesic-inv - adaptive": _contrast(-0.05, [-0.2, 0.1], -0.02, 0.21),
                       "geodesic-mix - adaptive": _contrast(0.0, [-0.15, 0.12], 0.01, 0.30)}})
    fig = plot_signed_contrast(tmp_path / "c.png", result)
    assert (tmp_path / "c.png").stat().st_size > 1000
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2e-05", "0.0002"]  # by size, not as the dict lists them
    (inv, inv_partial, mix, mix_partial) = ax.containers  # the linearised contrast is not drawn
    rows = ["size=2e-05", "size=0.0002"]
    for bars, key, field in ((inv, "geodesic-inv - adaptive", None), (mix, "geodesic-mix - adaptive", None),
                             (inv_partial, "geodesic-inv - adaptive", "given_train_error")):
        cells = [result["signed_contrast"][r][key] for r in rows]
        cells = [c[field] for c in cells] if field else cells
        line, _, (segments,) = bars
        assert np.allclose(line.get_ydata(), [c["difference"] for c in cells])
        assert np.allclose([seg[:, 1] for seg in segments.get_segments()], [c["ci"] for c in cells])
    assert np.all(np.diff(inv[0].get_xdata()) > 0) and np.all(mix[0].get_xdata() > inv[0].get_xdata())
    paper = [ln for ln in ax.lines if ln.get_marker() == "x"]
    assert [list(ln.get_ydata()) for ln in paper] == [[0.21, 0.21], [0.30, 0.30]]
    stars = [t for t in ax.texts if t.get_text() == "*"]
    assert len(stars) == 1 and stars[0].xy == (inv[0].get_xdata()[1], 0.3)
    assert "80 models" in ax.get_title() and "R = 0.93" in ax.get_title()


def test_signed_contrast_plot_draws_a_point_outside_its_interval(tmp_path):
    """A skewed bootstrap can leave Δ outside its percentile interval; the plot is still drawn (matplotlib refuses a
    negative bar), the bar reaching from the point to the interval's far end."""
    cell = dict(difference=0.2, ci=[-0.1, 0.1], given_train_error=dict(difference=-0.3, ci=[-0.2, 0.1]))
    result = dict(models=80, signed_contrast={"size=0.001": {"geodesic-mix - adaptive": cell}})  # above / below
    fig = plot_signed_contrast(tmp_path / "c.png", result)
    assert (tmp_path / "c.png").stat().st_size > 1000
    (point, _, (bar,)), (partial, _, (partial_bar,)) = fig.axes[0].containers
    assert point.get_ydata()[0] == 0.2 and np.allclose(bar.get_segments()[0][:, 1], [-0.1, 0.2])
    assert partial.get_ydata()[0] == -0.3 and np.allclose(partial_bar.get_segments()[0][:, 1], [-0.3, 0.1])
