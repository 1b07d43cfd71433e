"""Figures: what a reader sees (labels that do not collide, legends off the data, words for states)."""

import itertools

import numpy as np
import pandas as pd
import pytest

from planted import planted_pair_runs
from analysis import plots, projection
from analysis.synthetic import synthetic_runs
from analysis.transition import find_transitions

PAPER = projection.FIT_PRESETS["levine2020"]


def single_seed_runs():
    """The smoke sweep's shapes: depths 1 and 2, one seed, N from 2e4 to 2e5."""
    rows = [{"depth": depth, "width": width, "params": 12 * depth * width ** 2, "seed": 0,
             "loss": 2.5 - 0.001 * width + 0.1 * depth}
            for depth, widths in ((1, (48, 64, 128)), (2, (32, 48, 96))) for width in widths]
    return pd.DataFrame(rows)


def drawn(ax):
    """Lay the figure out with Agg, as save_figure does, and return its renderer (text extents are then real)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(ax.figure)
    canvas.draw()
    return canvas.get_renderer()


def visible_tick_labels(ax, renderer):
    ticks = ax.xaxis.get_major_ticks() + ax.xaxis.get_minor_ticks()
    low, high = ax.get_xlim()
    return [t.label1 for t in ticks
            if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high]


@pytest.mark.parametrize("runs", [single_seed_runs(), synthetic_runs(depths=(2, 4), seeds=2, rng=1)],
                         ids=["one decade", "several decades"])
def test_size_axis_labels_do_not_collide(runs):
    ax = plots.plot_loss_curves(runs)
    renderer = drawn(ax)
    labels = visible_tick_labels(ax, renderer)
    assert len(labels) >= 3, [label.get_text() for label in labels]
    boxes = [label.get_window_extent(renderer) for label in labels]
    for first, second in itertools.combinations(boxes, 2):
        assert not first.overlaps(second), [label.get_text() for label in labels]


def test_loss_curves_title_says_mean_and_std_only_with_several_seeds():
    single = plots.plot_loss_curves(single_seed_runs()).get_title()
    assert "std" not in single and "one seed" in single
    several = plots.plot_loss_curves(synthetic_runs(depths=(2, 4), seeds=3, rng=0)).get_title()
    assert "mean ± std over seeds" in several


def pair_transitions():
    runs = planted_pair_runs(2, 4, 3e6, np.random.default_rng(0))
    transitions, _ = find_transitions(runs, n_bootstrap=50)
    return runs, transitions


def test_pair_titles_use_words_not_internal_names():
    runs, transitions = pair_transitions()
    for transition in transitions:
        title = plots.plot_depth_pair(runs, transition)[0].get_title()
        assert transition.status not in title or "_" not in transition.status
        assert plots._STATUS_WORDS[transition.status] in title


@pytest.mark.parametrize("figure", ["pair_differences", "threshold", "pair_lower_panel", "transition_size"])
def test_legends_sit_below_the_data(figure):
    runs, transitions = pair_transitions()
    ax = {"pair_differences": lambda: plots.plot_pair_differences(transitions),
          "threshold": lambda: plots.plot_threshold(PAPER),
          "pair_lower_panel": lambda: plots.plot_depth_pair(runs, transitions[0])[1],
          "transition_size": lambda: plots.plot_transition_size(PAPER, transitions=transitions)}[figure]()
    renderer = drawn(ax)
    legend = ax.get_legend().get_window_extent(renderer)
    axis_area = ax.get_window_extent(renderer)
    label = ax.xaxis.label.get_window_extent(renderer)
    assert legend.y1 <= axis_area.y0 and not legend.overlaps(label)


def test_transition_size_names_its_points_and_shows_the_runs_without_a_fit():
    runs, transitions = pair_transitions()
    shapes = runs.groupby(["depth", "width"], as_index=False)["params"].first()
    ax = plots.plot_transition_size(PAPER, transitions=transitions, shapes=shapes, max_depth=6)
    texts = [text.get_text() for text in ax.texts]
    assert "L2–L4" in texts
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert any(label.startswith("your runs' shapes") for label in legend)
    assert ax.get_ylim()[0] <= shapes["params"].min()  # every run is inside the axes


def test_sweep_figures_without_transitions_still_show_the_sweep(tmp_path):
    paths = plots.write_sweep_figures(single_seed_runs(), [], None, tmp_path, reference=PAPER)
    assert tmp_path / "transition_size.png" in paths
    ax = plots.plot_transition_size(PAPER, shapes=single_seed_runs(), max_depth=4)
    assert ax.get_xlim()[1] == 4 and len(ax.collections) >= 2  # the band and the runs' dots


def test_compact_numbers():
    assert [plots.compact_number(v) for v in (300, 2e3, 6e5, 1.5e6, 3e9, 1e12)] == ["300", "2k", "600k", "1.5M", "3B", "1T"]


def bar_extents(ax):
    """Low and high ends of every vertical error bar drawn on ``ax`` (data units), as one flat sorted list."""
    extents = []
    for container in ax.containers:
        for collection in container.lines[2]:
            extents += [(float(segment[0][1]), float(segment[1][1])) for segment in collection.get_segments()]
    return [end for pair in sorted(extents) for end in pair]


def test_both_difference_figures_draw_the_same_labelled_interval():
    # pair_L*_L*.png drew ±1 standard error where pair_differences.png drew 90% intervals of the same numbers.
    runs, transitions = pair_transitions()
    (transition,) = transitions
    low, high = transition.comparison.interval()
    expected = [end for pair in sorted(zip(low.tolist(), high.tolist())) for end in pair]
    pair_panel = plots.plot_depth_pair(runs, transition)[1]
    overview = plots.plot_pair_differences(transitions)
    for ax in (pair_panel, overview):
        assert bar_extents(ax) == pytest.approx(expected)
        assert "bars: 90% interval" in ax.get_ylabel()
    legend = [text.get_text() for text in pair_panel.get_legend().get_texts()]
    assert any("90% interval (difference ± critical·se)" in label for label in legend)
    assert "90% interval (difference ± critical·se)" in overview.get_title()
    top_legend = [text.get_text() for text in plots.plot_depth_pair(runs, transition)[0].get_legend().get_texts()]
    assert any("mean ± seed std" in label for label in top_legend)


def test_threshold_figure_has_a_plain_title_and_names_its_regions():
    ax = plots.plot_threshold(PAPER)
    assert "How deep" in ax.get_title() and "stops sufficing" not in ax.get_title()
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert plots.THRESHOLD_REGIONS["shallow"] in legend and plots.THRESHOLD_REGIONS["deep"] in legend
    # the "too shallow" region lies under the fitted line: at width 1e4 it reaches (ln 1e4 - a)/b layers
    shallow = ax.collections[0].get_paths()[0].vertices
    at = np.argmin(np.abs(np.log(shallow[:, 0]) - np.log(1e4)))
    near = shallow[np.isclose(shallow[:, 0], shallow[at, 0])][:, 1]
    assert near.max() == pytest.approx((np.log(shallow[at, 0]) - PAPER.a) / PAPER.b, rel=1e-6)
    assert near.min() == 0.0


def test_projection_names_every_gpt3_marker():
    budgets = projection.BUDGET_PRESETS["gpt3"]
    ax = plots.plot_transition_size(PAPER, budgets=budgets)
    named = {text.get_text(): text.xy for text in ax.texts if text.get_text()}
    for budget in budgets:
        label = plots.budget_label(budget.name)
        assert label in named, (label, sorted(named))
        depth = budget.trained_depth or projection.optimal_shape(budget.params, PAPER).depth
        assert named[label] == pytest.approx((depth, budget.params))
    assert plots.budget_label("GPT-3 175B") == "175B" and plots.budget_label("1T budget") == "1T budget"
