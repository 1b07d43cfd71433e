"""Transition detection on synthetic loss curves with a planted crossing, and the end-to-end fit."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis.fit import fit_log_width
from analysis.errors import AnalysisInputError, SingleSeedError
from analysis.synthetic import planted_width, synthetic_runs
from analysis.transition import find_transitions, transition_points

SHALLOW, DEEP = 6, 12


def pair_runs(planted_params, offset=0.5, ratio=1.5, points=9, noise=0.002, seeds=3, slope=0.05,
              rng=0, ragged_seeds=False):
    """Two depths on one size grid; the deep net wins above ``planted_params`` (parameters).

    The planted size sits ``offset`` grid steps above grid point 4 (offset 0.5
    = halfway, in log N, between two trained sizes).
    """
    rng = np.random.default_rng(rng)
    log_grid = math.log(planted_params) + (np.arange(points) - 4 - offset) * math.log(ratio)
    rows = []
    for depth in (SHALLOW, DEEP):
        for index, target in enumerate(np.exp(log_grid)):
            width = int(round(math.sqrt(target / (12 * depth))))
            params = 12.0 * depth * width ** 2
            loss = 1.5 + 2.0 * (params / 1e6) ** -0.1
            if depth == DEEP:
                loss -= slope * (math.log(params) - math.log(planted_params))
            count = 1 if ragged_seeds and index % 3 == 0 else seeds
            for seed in range(count):
                rows.append({"depth": depth, "width": width, "params": params, "seed": seed,
                             "loss": loss + rng.normal(0.0, noise)})
    return pd.DataFrame(rows)


def planted_shallow_width(planted_params):
    return math.sqrt(planted_params / (12 * SHALLOW))


@pytest.mark.parametrize("planted, rng", [(3e7, 0), (3e7, 1), (1.1e8, 2), (5e8, 3), (2e9, 4)])
@pytest.mark.parametrize("method", ["pooled", "welch"])
def test_detected_transition_brackets_planted_width(planted, rng, method):
    transitions, _ = find_transitions(pair_runs(planted, rng=rng), method=method, n_bootstrap=200)
    (transition,) = transitions
    assert transition.status == "found"
    paper = transition.paper
    before = math.sqrt(paper.params_before / (12 * SHALLOW))
    after = math.sqrt(paper.params_after / (12 * SHALLOW))
    target = planted_shallow_width(planted)
    assert before <= target <= after
    assert paper.width == pytest.approx(0.5 * (before + after))
    assert paper.width_error == pytest.approx(after - before)
    assert transition.estimate("paper") == (paper.width, paper.width_error)


def test_bootstrap_ci_covers_the_planted_crossing():
    planted = 2e8
    transitions, _ = find_transitions(pair_runs(planted, offset=0.3, noise=0.004, rng=5), n_bootstrap=500)
    (transition,) = transitions
    low, high = transition.crossing.interval
    target = planted_shallow_width(planted)
    assert low <= target <= high
    assert transition.crossing.width == pytest.approx(target, rel=0.03)
    assert transition.crossing.bootstrap.fraction > 0.95


def test_the_paper_rules_interval_spans_brackets_not_one_mid_width():
    # Quiet data: every resample finds the same bracket. Percentiles of its mid-width gave "244–244";
    # the interval is that bracket's edges, which contain the rule's own width and the planted one.
    planted = 2e8
    (transition,), _ = find_transitions(pair_runs(planted, noise=0.0005, rng=7), n_bootstrap=300)
    paper = transition.paper
    assert transition.found and paper.bootstrap.fraction > 0.95
    low, high = paper.interval
    before = math.sqrt(paper.params_before / (12 * SHALLOW))
    after = math.sqrt(paper.params_after / (12 * SHALLOW))
    assert low < high
    assert low <= before < paper.width < after <= high and low <= planted_shallow_width(planted) <= high
    assert f"interval {low:.0f}–{high:.0f}" in paper.text(0.95)


def test_noisier_data_widens_the_paper_rules_interval():
    def spans(noise):
        (transition,), _ = find_transitions(pair_runs(2e8, noise=noise, rng=8), n_bootstrap=300)
        widths = transition.comparison.widths
        low, high = transition.paper.interval
        return int(np.sum((widths >= low) & (widths <= high)))  # compared sizes inside the interval

    assert spans(0.02) > spans(0.0005) == 2


def test_noisier_data_widens_the_crossing_ci():
    def ci_width(noise):
        (transition,), _ = find_transitions(pair_runs(2e8, offset=0.3, noise=noise, rng=6), n_bootstrap=400)
        low, high = transition.crossing.interval
        return high - low

    assert ci_width(0.008) > 2 * ci_width(0.001)


def test_transition_above_range_is_reported():
    transitions, _ = find_transitions(pair_runs(2e8, offset=8.0), n_bootstrap=50)
    assert transitions[0].status == "above_range"
    assert "no transition in range" in transitions[0].message
    assert transitions[0].paper.width is None and transitions[0].estimate("paper") is None


def test_transition_below_range_is_reported():
    transitions, _ = find_transitions(pair_runs(2e8, offset=-8.0), n_bootstrap=50)
    assert transitions[0].status == "below_range"
    assert "no transition in range" in transitions[0].message


def test_disjoint_sizes_cannot_be_compared():
    runs = pair_runs(2e8)
    runs.loc[runs["depth"] == DEEP, "params"] *= 1e4
    transitions, _ = find_transitions(runs, n_bootstrap=0)
    assert transitions[0].status == "no_overlap"


def test_single_seed_points_fall_back_to_pooled_std():
    transitions, _ = find_transitions(pair_runs(1.1e8, ragged_seeds=True, rng=8), method="welch",
                                      n_bootstrap=100)
    transition = transitions[0]
    assert transition.found
    assert np.all(np.isfinite(transition.comparison.se)) and np.all(transition.comparison.se > 0)


def test_all_single_seed_needs_loss_std():
    runs = pair_runs(1.1e8, seeds=1)
    with pytest.raises(SingleSeedError, match="--loss-std"):
        find_transitions(runs)
    transitions, description = find_transitions(runs, loss_std=0.002, n_bootstrap=50)
    assert transitions[0].found and "known seed std" in description
    assert "given with --loss-std" in transitions[0].noise.describe()


def test_stricter_alpha_never_finds_an_earlier_transition():
    runs = pair_runs(1.1e8, noise=0.01, rng=9)
    loose, _ = find_transitions(runs, alpha=0.2, n_bootstrap=0)
    strict, _ = find_transitions(runs, alpha=0.001, n_bootstrap=0)
    assert loose[0].found and strict[0].found
    assert strict[0].paper.params_after >= loose[0].paper.params_after


def test_end_to_end_fit_recovers_planted_slope():
    a, b = 3.0, 0.25
    runs = synthetic_runs(depths=(2, 4, 6, 8, 10), a=a, b=b, seeds=3, noise=0.002, rng=11)
    transitions, _ = find_transitions(runs, n_bootstrap=100)
    assert all(t.found for t in transitions)
    for transition in transitions:
        target = float(planted_width(transition.shallow_depth, a, b))
        assert abs(transition.paper.width - target) <= transition.paper.width_error
    fit = fit_log_width(*transition_points(transitions))
    assert abs(fit.b - b) < 3 * fit.sigma_b
    assert abs(fit.a - a) < 3 * fit.sigma_a


def test_one_depth_is_refused():
    runs = pair_runs(2e8)
    with pytest.raises(AnalysisInputError, match="two or more depths"):
        find_transitions(runs[runs["depth"] == SHALLOW])


def test_per_size_rows_agree_with_the_test_and_name_where_depth_did_not_pay_off():
    (transition,), _ = find_transitions(pair_runs(3e7, rng=0), n_bootstrap=0)
    assert transition.status == "found"
    out = transition.to_dict()
    rows = out["sizes"]
    assert [row["params"] for row in rows] == sorted(row["params"] for row in rows)
    for row in rows:
        low, high = row["diff_interval"]
        assert low < row["diff"] < high
        assert row["diff"] == pytest.approx(row["loss_shallow"] - row["loss_deep"])
        # a 90% two-sided interval excludes zero exactly where a one-sided 5% test is significant
        assert row["interval_level"] == pytest.approx(0.9)
        assert (row["verdict"] != "not significant") == (low > 0 or high < 0)
        assert (row["verdict"] == "deeper better") == (low > 0)
    assert rows[0]["verdict"] == "shallower better" and rows[-1]["verdict"] == "deeper better"
    assert out["largest_gap"]["diff"] == max((row["diff"] for row in rows), key=abs)
    assert out["no_gain_params"] == [rows[0]["params"], transition.paper.params_before]
    assert (out["width"], out["width_error"]) == transition.estimate("paper")
    lines = transition.size_lines()
    assert len(lines) == len(rows) and "90% interval" in lines[0] and lines[-1].endswith("deeper better")


def test_without_a_transition_depth_did_not_pay_off_over_the_whole_range():
    (above,), _ = find_transitions(pair_runs(2e8, offset=8.0), n_bootstrap=0)
    rows = above.to_dict()["sizes"]
    assert above.to_dict()["no_gain_params"] == [rows[0]["params"], rows[-1]["params"]]
    (below,), _ = find_transitions(pair_runs(2e8, offset=-8.0), n_bootstrap=0)
    assert below.to_dict()["no_gain_params"] is None


def test_an_interval_is_quoted_only_when_most_resamples_find_the_transition():
    from analysis.transition import Bootstrap, PaperRule

    def paper_text(fraction):
        return PaperRule(bootstrap=Bootstrap((140.0, 165.0), fraction)).text(confidence=0.95)

    assert "interval 140–165" in paper_text(0.8) and "80% of resamples" in paper_text(0.8)
    # 4 resamples in 1000: no interval, and not rounded down to 0%
    assert "interval" not in paper_text(0.004).replace("for an interval", "") and "0.4%" in paper_text(0.004)


def test_a_pair_in_the_opposite_order_is_flagged_not_called_a_transition():
    # negative slope: the deeper net wins at small N and loses at large N
    (reversed_pair,), _ = find_transitions(pair_runs(3e7, slope=-0.05, rng=0), n_bootstrap=0)
    verdicts = [row["verdict"] for row in reversed_pair.to_dict()["sizes"]]
    assert verdicts[0] == "deeper better" and verdicts[-1] == "shallower better"
    assert reversed_pair.status == "below_range"
    first_better_again = next(row["params"] for row in reversed_pair.to_dict()["sizes"]
                              if row["verdict"] == "shallower better")
    assert reversed_pair.to_dict()["reversed_params"] == first_better_again
    assert "opposite of the predicted order" in reversed_pair.message
    # the predicted order carries no such flag
    (ordinary,), _ = find_transitions(pair_runs(3e7, rng=0), n_bootstrap=0)
    assert ordinary.reversed_params is None and "opposite" not in ordinary.message
    from analysis.plots import plot_pair_differences

    labels = [t.get_text() for t in plot_pair_differences([reversed_pair]).get_legend().get_texts()]
    assert labels == [f"L{SHALLOW} − L{DEEP}: deeper better at the smallest size, then shallower better"]


def test_size_lines_say_the_deeper_loss_is_interpolated_and_whose_width_is_named():
    (pair,), _ = find_transitions(pair_runs(3e7, rng=0), n_bootstrap=0)
    lines = pair.size_lines()
    assert lines and all(f"(L={SHALLOW} width " in line and "(interpolated in ln N)" in line for line in lines)
