"""Separation-rank bounds (Theorems 1 and 2) and the depth threshold L_th = log₃ d."""

import math

import numpy as np
import pytest

from analysis import theory


@pytest.mark.parametrize("width", [3, 27, 100, 768, 12288])
def test_threshold_is_log3_width(width):
    assert float(theory.depth_threshold(width)) == pytest.approx(math.log(width) / math.log(3))
    assert 3.0 ** float(theory.depth_threshold(width)) == pytest.approx(width)  # the width at threshold depth L is 3^L


def test_threshold_values():
    assert float(theory.depth_threshold(729)) == pytest.approx(6.0)
    assert float(theory.depth_threshold(3 ** 10)) == pytest.approx(10.0)


WIDTH_HEADS = [(100, 4), (1000, 8), (1024, 16), (16384, 16), (65536, 64)]


@pytest.mark.parametrize("width, heads", WIDTH_HEADS)
def test_lower_bound_never_exceeds_upper(width, heads):
    depth = np.arange(1, 60)
    lower, upper = theory.separation_rank_bounds(depth, width, heads)
    applies = np.isfinite(lower)
    assert applies.sum() >= len(depth) - 1  # only an exactly integer threshold is excluded
    assert np.all(lower[applies] <= upper[applies])


@pytest.mark.parametrize("width, heads", WIDTH_HEADS)
def test_bounds_grow_with_depth_inside_each_regime(width, heads):
    threshold = float(theory.depth_threshold(width))
    below = np.arange(1, math.ceil(threshold))
    above = np.arange(math.floor(threshold) + 1, 80)
    low1, up1 = theory.theorem1_bounds(below, width, heads)
    low2, up2 = theory.theorem2_bounds(above, width, heads)
    for values in (low1, up1, low2, up2):
        assert np.all(np.isfinite(values)) and np.all(np.diff(values) > 0)


def test_each_theorem_applies_only_on_its_side_of_the_threshold():
    width, heads = 1000, 8  # log₃ 1000 ≈ 6.29
    low1, _ = theory.theorem1_bounds([6, 7], width, heads)
    low2, _ = theory.theorem2_bounds([6, 7], width, heads)
    assert np.isfinite(low1[0]) and np.isnan(low1[1])
    assert np.isnan(low2[0]) and np.isfinite(low2[1])


def test_theorem1_lower_bound_is_positive_below_threshold():
    # The paper notes log₃(d - H) + a > 0 in this regime.
    for width, heads in WIDTH_HEADS:
        depth = np.arange(1, math.ceil(float(theory.depth_threshold(width))))
        lower, _ = theory.theorem1_bounds(depth, width, heads)
        assert np.all(lower > 0)


def test_growth_rates_differ_between_regimes():
    """Below: log sep roughly triples per layer. Above: it grows by a constant ~d per layer."""
    width, heads = 65536, 64
    _, upper = theory.theorem1_bounds(np.array([5.0, 6.0]), width, heads)
    assert upper[1] / upper[0] == pytest.approx(3.0, rel=0.01)
    low2, up2 = theory.theorem2_bounds(np.array([20.0, 21.0, 22.0]), width, heads)
    np.testing.assert_allclose(np.diff(up2), 2 * width + 1)
    np.testing.assert_allclose(np.diff(low2), width / 2 - (heads / 2 + 1))


def test_theorem1_formula_at_one_point():
    depth, width, heads = 4, 1000, 10
    lower, upper = theory.theorem1_bounds(depth, width, heads)
    log3 = lambda x: math.log(x, 3)  # noqa: E731
    assert float(lower) == pytest.approx(9 * (log3(990) - 2 - log3(2)))
    assert float(upper) == pytest.approx(40 * log3(1010))


def test_heads_must_be_smaller_than_width():
    with pytest.raises(ValueError):
        theory.theorem2_bounds(10, 8, 8)


def test_table_clips_the_vacuous_negative_lower_bound():
    width, heads = 768, 12  # GPT-3 Small; log₃ 768 ≈ 6.04
    raw_lower, _ = theory.separation_rank_bounds(np.arange(1, 13), width, heads)
    table = theory.bounds_table(np.arange(1, 13), width, heads)
    negative = raw_lower < 0
    assert negative[6]  # L = 7, just above the threshold: the theorem's bound is below zero
    np.testing.assert_array_equal(table["lower_vacuous"], negative)
    assert np.all(table["lower"] >= 0)
    np.testing.assert_array_equal(table["lower"][~negative], raw_lower[~negative])
    assert table["theorem"].tolist() == [1] * 6 + [2] * 6
