"""12·L·d² budgets: widths for a budget, grids, and their errors."""

import math

import pytest

from scaling.model import budget


def test_non_embedding_params_is_twelve_l_d_squared():
    assert budget.non_embedding_params(12, 768) == 84_934_656
    assert budget.non_embedding_params(96, 12288) == 173_946_175_488


def test_gpt3_small_budget_gives_its_width():
    assert budget.width_for_budget(12, 84_934_656) == 768


@pytest.mark.parametrize("depth", [1, 2, 6, 12, 48])
@pytest.mark.parametrize("params", [3e5, 1e7, 1.3e9, 175e9])
@pytest.mark.parametrize("multiple_of", [16, 64, 128])
def test_width_is_the_nearest_multiple_in_log_n(depth, params, multiple_of):
    try:
        width = budget.width_for_budget(depth, params, multiple_of)
    except ValueError:
        assert budget.non_embedding_params(depth, multiple_of) > 2 * params
        return
    assert width % multiple_of == 0
    distance = abs(math.log(budget.non_embedding_params(depth, width) / params))
    for other in (width - multiple_of, width + multiple_of):
        if other >= multiple_of:
            assert distance <= abs(math.log(budget.non_embedding_params(depth, other) / params)) + 1e-12


def test_grid_points_are_within_rounding_of_their_budget_and_unique():
    depths, budgets = [1, 2, 4, 8, 6, 12], [3e4, 1e5, 3e5, 1e6, 1e6, 3e6, 1e7]
    points = budget.grid(depths, budgets, multiple_of=16)
    assert len({(p.depth, p.width) for p in points}) == len(points)
    for point in points:
        assert point.params == 12 * point.depth * point.width**2
        # the ideal width lies within one step m = 16 of the chosen one, so N is off by at most d / (d - m);
        # at the narrowest width the budget may be up to 2x smaller (beyond that it is rejected)
        tolerance = 2.0 if point.width <= 16 else point.width / (point.width - 16)
        assert point.budget / tolerance <= point.params <= point.budget * tolerance
        depth, width, params = point
        assert (depth, width, params) == (point.depth, point.width, point.params)
    # every (depth, budget) is either a point, a reported skip, or a duplicate of a kept shape
    for depth in set(depths):
        for b in set(budgets):
            kept = any(p.depth == depth and p.budget == b for p in points)
            skipped = (depth, b) in {(d, s) for d, s, _ in points.skipped}
            duplicate = any(p.depth == depth and p.width == budget.width_for_budget(depth, b, 16) for p in points) \
                if not skipped else False
            assert kept or skipped or duplicate


def test_grid_reports_budgets_too_small_for_a_depth():
    points = budget.grid([1, 48], [1e4, 1e6], multiple_of=64)
    skipped = {(depth, b) for depth, b, _ in points.skipped}
    assert (48, 1e4) in skipped and (48, 1e6) in skipped
    assert all("too small" in reason for _, _, reason in points.skipped)
    assert [(p.depth, p.width) for p in points] == [(1, 320)]


@pytest.mark.parametrize("args,field", [
    ((0, 1e6), "depth"), ((2.5, 1e6), "depth"), ((4, -1.0), "params"), ((4, float("nan")), "params"),
    ((4, 1e6, 0), "multiple_of"),
])
def test_bad_budget_inputs_name_the_problem(args, field):
    with pytest.raises(ValueError, match=field):
        budget.width_for_budget(*args)


def test_grid_needs_depths_and_budgets():
    with pytest.raises(ValueError, match="at least one"):
        budget.grid([], [1e6])
