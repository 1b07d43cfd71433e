"""N_tr(L) ± ΔN (eq. 9), optimal shapes and Table 1 against the numbers in Levine et al. 2020."""

import math

import numpy as np
import pytest

from analysis import projection
from analysis.fit import LogWidthFit, save_fit
from analysis.results import AnalysisInputError

PAPER = projection.FIT_PRESETS["levine2020"]

# Table 1 of the paper: (name, trained L, trained d, optimal L, optimal d).
TABLE1 = [
    ("GPT-3 Small", 12, 768, 23, 555),
    ("GPT-3 Medium", 24, 1024, 32, 886),
    ("GPT-3 Large", 24, 1536, 38, 1220),
    ("GPT-3 XL", 24, 2048, 42, 1550),
    ("GPT-3 2.7B", 32, 2560, 47, 2110),
    ("GPT-3 6.7B", 32, 4096, 54, 3150),
    ("GPT-3 13B", 40, 5140, 60, 4200),
    ("GPT-3 175B", 96, 12288, 80, 13500),
    ("1T budget", None, None, 95, 30100),
]


def test_preset_is_the_papers_eq10():
    assert (PAPER.a, PAPER.b) == (5.039, 5.55e-2)
    np.testing.assert_array_equal(PAPER.cov, [[9.4e-4, -3.74e-5], [-3.74e-5, 1.7e-6]])


def test_transition_size_at_96_layers():
    size = float(projection.transition_params(96, PAPER))
    delta = float(projection.transition_params_error(96, PAPER))
    assert size == pytest.approx(1.17e12, rel=0.02)
    assert delta == pytest.approx(0.23e12, abs=0.02e12)


def test_transition_size_at_80_layers():
    assert float(projection.transition_params(80, PAPER)) == pytest.approx(1.65e11, rel=0.02)


def test_relative_error_at_100_layers():
    ratio = projection.transition_params_error(100, PAPER) / projection.transition_params(100, PAPER)
    assert float(ratio) == pytest.approx(0.20, abs=0.01)


def test_delta_n_matches_numerical_propagation():
    """ΔN from the analytic derivatives equals a finite-difference Jacobian with the full covariance."""
    depth, step = 64.0, 1e-6

    def size(a, b):
        return 12 * depth * math.exp(2 * a + 2 * b * depth)

    grad = np.array([(size(PAPER.a + step, PAPER.b) - size(PAPER.a - step, PAPER.b)) / (2 * step),
                     (size(PAPER.a, PAPER.b + step) - size(PAPER.a, PAPER.b - step)) / (2 * step)])
    expected = math.sqrt(grad @ np.array(PAPER.cov) @ grad)
    assert float(projection.transition_params_error(depth, PAPER)) == pytest.approx(expected, rel=1e-6)


def test_covariance_term_matters():
    """Dropping σ_ab (negative here) must change ΔN: the full covariance is used."""
    diagonal = LogWidthFit(a=PAPER.a, b=PAPER.b, cov=((PAPER.cov[0][0], 0.0), (0.0, PAPER.cov[1][1])))
    assert projection.transition_params_error(96, diagonal) > 1.25 * projection.transition_params_error(96, PAPER)


@pytest.mark.parametrize("row", TABLE1, ids=[r[0] for r in TABLE1])
def test_table1_row(row):
    name, trained_depth, trained_width, optimal_depth, optimal_width = row
    rows = {r["name"]: r for r in projection.optimal_table(projection.BUDGET_PRESETS["gpt3"], PAPER)}
    got = rows[name]
    assert got["trained_depth"] == trained_depth and got["trained_width"] == trained_width
    if trained_depth is not None:
        assert got["params"] == 12 * trained_depth * trained_width ** 2
    assert abs(got["optimal_depth"] - optimal_depth) <= 1
    assert got["optimal_width"] == pytest.approx(optimal_width, rel=0.02)


def test_gpt3_preset_has_nine_budgets_with_1t_last():
    budgets = projection.BUDGET_PRESETS["gpt3"]
    assert len(budgets) == 9
    assert budgets[-1].params == 1e12 and budgets[-1].trained_depth is None


def test_optimal_175b():
    shape = projection.optimal_shape(175e9, PAPER)
    assert shape.depth == 80
    assert shape.width == pytest.approx(13500, rel=0.02)
    assert shape.width == pytest.approx(math.sqrt(175e9 / (12 * 80)))
    assert shape.n_transition == pytest.approx(float(projection.transition_params(80, PAPER)))


@pytest.mark.parametrize("budget", [1e7, 3e9, 175e9, 1e12, 1e14])
def test_optimal_depth_solves_the_transition_equation(budget):
    shape = projection.optimal_shape(budget, PAPER)
    assert float(projection.transition_params(shape.depth_continuous, PAPER)) == pytest.approx(budget, rel=1e-8)
    assert abs(shape.depth - shape.depth_continuous) < 1
    # The band's upper edge reaches the budget at a shallower depth, its lower edge at a deeper one.
    assert shape.depth_low < shape.depth_continuous < shape.depth_high
    for depth, sign in ((shape.depth_low, +1), (shape.depth_high, -1)):
        relative = projection.transition_params_error(depth, PAPER) / projection.transition_params(depth, PAPER)
        edge = projection.transition_params(depth, PAPER) * np.exp(sign * relative)
        assert float(edge) == pytest.approx(budget, rel=1e-6)


def test_band_is_positive_and_first_order_equal_to_eq9():
    # A fit from a few noisy transitions, like a small CPU sweep's: its ΔN exceeds N_tr at large L.
    loose = LogWidthFit(a=3.0, b=0.25, cov=((0.05, -0.01), (-0.01, 0.004)), name="loose")
    depth = np.linspace(1, 100, 400)
    low, high = projection.transition_band(depth, loose)
    size, delta = projection.transition_params(depth, loose), projection.transition_params_error(depth, loose)
    assert np.all(low > 0) and np.all(low < size) and np.all(high > size)
    assert np.any(delta > size)  # eq. 9's first-order N_tr - ΔN would be negative (off a log axis) here
    paper_low, paper_high = projection.transition_band(depth, PAPER)
    paper_size, paper_delta = (projection.transition_params(depth, PAPER),
                               projection.transition_params_error(depth, PAPER))
    small = paper_delta / paper_size < 0.06  # where first order is accurate, the band is eq. 9's ± ΔN
    assert small.sum() > 10
    np.testing.assert_allclose(paper_high[small] - paper_size[small], paper_delta[small], rtol=0.04)
    np.testing.assert_allclose(paper_size[small] - paper_low[small], paper_delta[small], rtol=0.04)
    # So the depth range is bounded (no NaN) even where N_tr - ΔN < 0.
    deep = float(projection.transition_params(80, loose))
    shape = projection.optimal_shape(deep, loose)
    assert float(projection.transition_params_error(shape.depth_high, loose)) > deep
    assert np.isfinite(shape.depth_high) and shape.depth_low < shape.depth_continuous < shape.depth_high


@pytest.mark.parametrize("budget", [1e3, 175e9, 1e15])
def test_optimal_warns_outside_the_fitted_depths(budget):
    shape = projection.optimal_shape(budget, PAPER)
    assert shape.warning and "extrapolated" in shape.warning and "6 to 36" in shape.warning
    assert projection.optimal_shape(3e8, PAPER).warning is None  # L ≈ 26, inside


def test_optimal_width_rounded_to_head_size():
    shape = projection.optimal_shape(175e9, PAPER, head_size=128)
    assert shape.width_rounded % 128 == 0 and abs(shape.width_rounded - shape.width) <= 64
    assert projection.optimal_shape(1e3, PAPER).width_rounded == 64  # never below one head


def test_optimal_depth_grows_with_budget():
    depths = [projection.optimal_shape(n, PAPER).depth_continuous for n in np.geomspace(1e6, 1e13, 15)]
    assert np.all(np.diff(depths) > 0)


@pytest.mark.parametrize("text, value", [("175e9", 175e9), ("1.3B", 1.3e9), ("800M", 8e8), ("2T", 2e12),
                                         ("50k", 5e4), ("1.3e9", 1.3e9), (" 12 ", 12.0)])
def test_parse_params(text, value):
    assert projection.parse_params(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "", "1.3X", "-5B", "0"])
def test_parse_params_rejects(text):
    with pytest.raises(AnalysisInputError):
        projection.parse_params(text)


def test_resolve_fit_from_saved_file(tmp_path):
    custom = LogWidthFit(a=4.0, b=0.08, cov=((1e-3, -2e-5), (-2e-5, 1e-6)), name="mine")
    save_fit(custom, tmp_path / "mine.json")
    loaded = projection.resolve_fit(str(tmp_path / "mine.json"))
    assert (loaded.a, loaded.b, loaded.cov) == (custom.a, custom.b, custom.cov)
    assert projection.optimal_shape(1e9, loaded).depth != projection.optimal_shape(1e9, PAPER).depth


def test_resolve_fit_unknown_name():
    with pytest.raises(AnalysisInputError, match="unknown fit"):
        projection.resolve_fit("levine2021")


def test_negative_slope_is_refused():
    with pytest.raises(AnalysisInputError, match="b ="):
        projection.optimal_shape(1e9, LogWidthFit(a=5.0, b=-0.01, cov=((1e-3, 0), (0, 1e-6))))
