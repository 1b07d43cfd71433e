"""Figures in the style of Levine et al. 2020, Figs. 2-4 (matplotlib, written as PNG and PDF).

* ``plot_depth_pair``: loss against N for an adjacent depth pair, the
  transition bracket shaded (Fig. 2).
* ``plot_pair_differences``: every pair's loss difference against N with its
  significance interval, in one panel.
* ``plot_width_fit``: transition widths log d against L with error bars and
  the weighted fit with its one-sigma band (Fig. 3a).
* ``plot_transition_size``: N_tr(L) with its ±ΔN band out to L = 100, with
  GPT-3's trained shapes and the sweep's measured transitions marked (Figs.
  3b and 4). The band is N_tr·e^(±ΔN/N_tr), eq. 9's ±ΔN taken in ln N, so it
  stays on a log axis where the first-order ΔN exceeds N_tr.
* ``plot_threshold``: the empirical transition depth (ln d - a)/b against
  the theory's threshold L_th = log₃ d (section 4).

Every figure says whose data it shows: the user's runs are labelled "your
runs" with the sweep's name, and the paper's fit and GPT-3's shapes are
labelled as the paper's.

Figures are plain ``matplotlib.figure.Figure`` objects rendered by Agg, not
pyplot figures: no global state, nothing to close, and the caller's
backend (e.g. a notebook's inline one) is left alone.
"""

from __future__ import annotations

import io
import os
import re

import numpy as np
from etils import epath
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter
from matplotlib.transforms import offset_copy

from analysis import projection, theory
from analysis.errors import AnalysisInputError
from analysis.fit import LogWidthFit
from analysis.points import aggregate_seeds
from analysis.shapes import non_embedding_params
from analysis.transition import Transition, transition_points

# What each estimate of a transition is, in a legend: the zero crossing carries no significance test.
ESTIMATE_LABELS = {
    "crossing": "zero crossing of a line fitted to the loss difference (not a significance test)",
    "paper": "transitions by the paper's significance rule",
}


def compact_number(value: float, _position=None) -> str:
    """A short tick label: 300, 2k, 600k, 1.5M, 3B (so neighbouring labels do not run into each other)."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _log_x(ax):
    """Log x axis with short labels: decades, plus 2-4 labels per decade when the axis spans few decades.

    Call it after plotting, so that the data limits are known.
    """
    ax.set_xscale("log")
    low, high = ax.get_xlim()
    decades = np.log10(high / low)
    ax.xaxis.set_major_locator(LogLocator(base=10.0, numticks=8))
    ax.xaxis.set_major_formatter(FuncFormatter(compact_number))
    if decades <= 1.2:
        subs, formatter = (2.0, 3.0, 4.0, 6.0), FuncFormatter(compact_number)
    elif decades <= 2.5:
        subs, formatter = (2.0, 5.0), FuncFormatter(compact_number)
    else:
        subs, formatter = tuple(range(2, 10)), NullFormatter()
    ax.xaxis.set_minor_locator(LogLocator(base=10.0, subs=subs, numticks=12))
    ax.xaxis.set_minor_formatter(formatter)


def _legend_below(ax, **options):
    """The legend under the axes and their x label (a fixed 38 points down), where it cannot cover data."""
    below = offset_copy(ax.transAxes, fig=ax.figure, y=-38, units="points")
    return ax.legend(loc="upper left", bbox_to_anchor=(0.0, 0.0), bbox_transform=below, borderaxespad=0.0,
                     frameon=False, **options)


def _fit_label(fit: LogWidthFit) -> str:
    return f"{fit.name} (the paper's eq. 10)" if fit.name == "levine2020" else f"{fit.name} (your runs)"


SOURCE_FILE = "figures-source.txt"  # in a folder of sweep figures: the records they were drawn from


def check_output_directory(out_dir, source=None) -> None:
    """Raise ``AnalysisInputError`` (one line) when ``out_dir`` or a folder above it is an existing file, or
    when ``out_dir`` holds the figures of records other than ``source`` (its ``SOURCE_FILE`` says whose):
    figures of two sweeps would overwrite each other file by file.

    Checked before a sweep is analysed, so that a mistyped ``--out`` costs no
    analysis and names the path instead of the operating system's "File exists".
    Only local paths are checked: a bucket has no folders to collide with.
    """
    if "://" in str(out_dir):
        return
    path = epath.Path(str(out_dir))
    drawn_from = path / SOURCE_FILE
    if source is not None and drawn_from.is_file() and drawn_from.read_text().strip() != _source_key(source):
        raise AnalysisInputError(f"--out {out_dir} holds the figures of {drawn_from.read_text().strip()}; give "
                                 f"another folder for those of {source} (or remove that one)")
    for candidate in (path, *path.parents):
        if candidate.exists() and not candidate.is_dir():
            where = "is" if candidate == path else f"lies under {candidate}, which is"
            raise AnalysisInputError(f"--out {out_dir} {where} a file, not a directory: give a directory "
                                     "for the PNG and PDF figures")


def _source_key(source) -> str:
    """How ``SOURCE_FILE`` names the records figures were drawn from: a local path made absolute."""
    text = str(source).rstrip("/")
    return text if "://" in text else os.path.abspath(text)


def mark_source(out_dir, source) -> None:
    """Write ``out_dir``'s ``SOURCE_FILE``: the figures in it were drawn from ``source``'s records."""
    if "://" not in str(out_dir):
        (epath.Path(str(out_dir)) / SOURCE_FILE).write_text(_source_key(source) + "\n")


def save_figure(fig, out_dir, stem: str) -> list[epath.Path]:
    """Write ``fig`` as ``out_dir/stem.png`` (150 dpi) and ``.pdf`` (local or ``gs://``); return the paths."""
    out_dir = epath.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.pdf"]
    for path, dpi in zip(paths, (150, "figure")):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=path.suffix[1:], dpi=dpi, bbox_inches="tight")
        path.write_bytes(buffer.getvalue())
    return paths


def plot_depth_pair(runs, transition: Transition, axes=None, source: str = "your runs"):
    """Loss against N (parameters) for one depth pair, and their difference below it.

    Top: seed-mean loss (nats/token) ± seed std of both depths. Bottom: the
    difference loss_shallow - loss_deep at the compared sizes with the same
    bars as ``plot_pair_differences``: the two-sided interval at the test's
    level (diff ± critical·se, 90% at alpha = 0.05), so a bar that misses
    zero is a significant difference. The bracket between the last
    indistinguishable and the first significantly-worse size is shaded grey;
    the bootstrap 95% CI of the crossing is shaded orange.
    """
    if axes is None:
        axes = Figure(figsize=(5.4, 5.2)).subplots(2, 1, sharex=True, height_ratios=(3, 2))
    top, bottom = axes
    points = aggregate_seeds(runs)
    for depth, colour in ((transition.shallow_depth, "tab:blue"), (transition.deep_depth, "tab:red")):
        rows = points[points["depth"] == depth]
        top.errorbar(rows["params"], rows["loss_mean"], yerr=rows["loss_std"].fillna(0.0), fmt="o-",
                     ms=3.5, lw=1.2, capsize=2, color=colour, label=f"your runs, L = {depth} (mean ± seed std)")
    comparison = transition.comparison
    if comparison is not None:
        _difference_bars(bottom, comparison, color="k", ms=3.5, capsize=2,
                         label=f"L{transition.shallow_depth} − L{transition.deep_depth}, "
                               f"{interval_words(comparison.interval_level)}")
        bottom.axhline(0.0, color="0.4", lw=0.8)
    for ax in axes:
        if transition.found:
            ax.axvspan(transition.paper.params_before, transition.paper.params_after, color="0.55", alpha=0.35,
                       label="paper rule's bracket" if ax is top else None)
        if transition.crossing.interval:
            low, high = non_embedding_params(transition.shallow_depth, np.asarray(transition.crossing.interval))
            ax.axvspan(low, high, color="tab:orange", alpha=0.35,
                       label=f"zero crossing, {transition.confidence:.0%} interval" if ax is top else None)
        _log_x(ax)
    bottom.set_xlabel("non-embedding parameters N = 12·L·d²")
    top.set_ylabel("eval loss (nats/token)")
    bottom.set_ylabel(_difference_axis_label({comparison.interval_level} if comparison is not None else set()))
    top.set_title(f"{source}: L = {transition.shallow_depth} vs L = {transition.deep_depth}\n"
                  f"paper's rule: {_STATUS_WORDS[transition.status]}", fontsize=9)
    top.legend(fontsize=8)
    _legend_below(bottom, fontsize=7, ncol=2)
    return axes


_STATUS_WORDS = {"found": "transition found", "above_range": "deeper never significantly better",
                 "below_range": "deeper better at the smallest size", "no_overlap": "no common sizes"}


def interval_words(level: float) -> str:
    """How the loss-difference bars are drawn, in words: '90% interval (difference ± critical·se)'."""
    return f"{level:.0%} interval (difference ± critical·se)"


def _difference_axis_label(levels) -> str:
    """The y label of a loss-difference axis, naming its bars' level."""
    bars = ", ".join(f"{level:.0%}" for level in sorted(levels))
    return "loss difference (nats/token)" + (f"\nbars: {bars} interval" if bars else "")


def _difference_bars(ax, comparison, shift: float = 1.0, **style):
    """The loss difference at each compared size with its two-sided interval at the test's level, as bars."""
    low, high = comparison.interval()
    return ax.errorbar(comparison.params * shift, comparison.diff,
                       yerr=(comparison.diff - low, high - comparison.diff), fmt="o-", lw=1.2, **style)


def plot_pair_differences(transitions, ax=None, source: str = "your runs"):
    """Every pair's loss difference loss_shallow - loss_deep (nats/token) against N, in one panel.

    Bars are the two-sided interval at the test's level (diff ± critical·se),
    so a point whose bar misses zero is significant; below zero the shallower
    net is better. Pairs without comparable sizes are left out.
    """
    if ax is None:
        ax = Figure(figsize=(5.6, 3.8)).subplots()
    levels = set()
    for index, transition in enumerate(t for t in transitions if t.comparison is not None):
        comparison = transition.comparison
        levels.add(comparison.interval_level)
        # a small offset in N per pair keeps bars at shared sizes apart
        _difference_bars(ax, comparison, shift=1.0 + 0.02 * (index - 1), ms=4, capsize=3,
                         label=f"L{transition.shallow_depth} − L{transition.deep_depth}: "
                               f"{_STATUS_WORDS[transition.status]}"
                               + (", then shallower better" if transition.reversed_params is not None else ""))
    ax.axhline(0.0, color="0.4", lw=0.8)
    _log_x(ax)
    ax.set_xlabel("non-embedding parameters N = 12·L·d² (of the shallower net)")
    ax.set_ylabel(_difference_axis_label(levels))
    bars = ("bars: " + ", ".join(interval_words(level) for level in sorted(levels)) if levels
            else "no comparable sizes")
    ax.set_title(f"{source}: shallower minus deeper net, {bars}\nbelow 0 the shallower net is better", fontsize=9)
    _legend_below(ax, fontsize=8)
    return ax


def plot_width_fit(transitions, fit: LogWidthFit, ax=None, estimate: str = "crossing"):
    """Transition widths (``estimate``) as log d against L with σ = Δd/d bars, and the fitted line ± 1σ."""
    if ax is None:
        ax = Figure(figsize=(5.2, 3.8)).subplots()
    depth, width, error = transition_points(transitions, estimate)
    ax.errorbar(depth, np.log(width), yerr=error / width, fmt="o", color="k", capsize=3,
                label=f"your runs: transition widths ({estimate} estimate)")
    grid = np.linspace(0.0, max(depth.max() if depth.size else 50.0, 10.0) * 1.1, 200)
    line, band = fit.log_width(grid), fit.log_width_error(grid)
    ax.plot(grid, line, color="tab:green", label=f"log d = {fit.a:.3f} + {fit.b:.4f}·L")
    ax.fill_between(grid, line - band, line + band, color="tab:green", alpha=0.2, label="fit ± 1σ")
    ax.set_xlabel("depth L (shallower of the pair)")
    ax.set_ylabel("ln(transition width d)")
    title = f"fit to your runs: {fit.name}"
    if fit.dof is not None and fit.dof < 1:
        title += f"\n{fit.n_points} points, 0 degrees of freedom: no goodness of fit"
    elif fit.r2 is not None:
        title += f"\nR² = {fit.r2:.3f}" + (f", χ²_red = {fit.chi2_red:.2f}" if fit.chi2_red is not None else "")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return ax


def plot_transition_size(fit: LogWidthFit, budgets=(), transitions=(), max_depth: float = 100.0,
                         reference: LogWidthFit | None = None, ax=None, estimate: str = "crossing",
                         title: str | None = None, shapes=None):
    """N_tr(L) (parameters) with the ±ΔN band up to ``max_depth`` layers.

    ``budgets`` with a trained shape (the paper's GPT-3 shapes) are marked
    at (trained depth, N) and their optimal shape under ``fit`` drawn as an
    open marker; ``transitions`` (the user's, ``estimate``) are marked at
    (L, 12·L·d²), each named by its depth pair; ``shapes`` (a table with
    depth and params columns: the user's trained shapes) are drawn as dots,
    so a sweep without transitions still shows where its runs lie;
    ``reference`` (another fit) is drawn dashed. The band is
    N_tr·e^(±ΔN/N_tr), which stays positive on the log axis.
    """
    if ax is None:
        ax = Figure(figsize=(6.0, 4.2)).subplots()
    grid = np.linspace(1.0, max_depth, 400)
    size = projection.transition_params(grid, fit)
    low, high = projection.transition_band(grid, fit)
    ax.plot(grid, size, color="tab:green", label=f"N_tr(L), {_fit_label(fit)}")
    ax.fill_between(grid, low, high, color="tab:green", alpha=0.25, label="± ΔN (eq. 9, in ln N)")
    if reference is not None and reference != fit:
        ax.plot(grid, projection.transition_params(grid, reference), color="0.3", ls="--",
                label=f"N_tr(L), {_fit_label(reference)}")
    trained = [b for b in budgets if b.trained_depth]
    if trained:
        ax.scatter([b.trained_depth for b in trained], [b.params for b in trained], marker="x",
                   color="tab:red", zorder=3, label="GPT-3's trained shapes (paper's Table 1)")
    for budget in budgets:
        shape = projection.optimal_shape(budget.params, fit)
        ax.scatter([shape.depth], [budget.params], marker="o", facecolor="none", edgecolor="tab:blue",
                   zorder=3, label=f"optimal depth for those budgets under {fit.name}"
                   if budget is budgets[0] else None)
        if budget.trained_depth:
            ax.annotate("", xy=(shape.depth, budget.params), xytext=(budget.trained_depth, budget.params),
                        arrowprops={"arrowstyle": "->", "color": "0.5", "lw": 0.8})
        # The name sits beside the marker the arrow leaves from, on the side away from the arrow.
        start = budget.trained_depth or shape.depth
        left = shape.depth >= start
        ax.annotate(budget_label(budget.name), (start, budget.params), xytext=(-5 if left else 5, 0),
                    textcoords="offset points", ha="right" if left else "left", va="center", fontsize=6,
                    color="0.25")
    floor = low.min()
    if shapes is not None and len(shapes):
        ax.scatter(shapes["depth"], shapes["params"], s=12, color="0.45", zorder=2,
                   label="your runs' shapes (L, N): above the curve too shallow, below too deep")
        floor = min(floor, float(np.min(shapes["params"])))
    located = [t for t in transitions if t.estimate(estimate) is not None]
    depth, width, error = transition_points(located, estimate)
    if depth.size:
        measured = non_embedding_params(depth, width)
        relative = 2.0 * error / width  # ΔN/N = 2·Δd/d, drawn in ln N like the band
        ax.errorbar(depth, measured, yerr=(measured * (1 - np.exp(-relative)), measured * (np.exp(relative) - 1)),
                    fmt="s", color="k", ms=4, capsize=2, label=f"your runs: {ESTIMATE_LABELS[estimate]}")
        for transition, x, y in zip(located, depth, measured):
            ax.annotate(f"L{transition.shallow_depth}–L{transition.deep_depth}", (x, y), xytext=(6, -10),
                        textcoords="offset points", fontsize=7)
        floor = min(floor, float(measured.min()) * np.exp(-relative.max()))
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor / 3.0)
    ax.set_xlim(0, max_depth)
    ax.set_xlabel("depth L")
    ax.set_ylabel("non-embedding parameters N")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # depths are whole layers
    ax.set_title(title or "above the curve: too shallow; below: too deep", fontsize=9)
    _legend_below(ax, fontsize=7)
    return ax


# What the two sides of the fitted line in plot_threshold mean (at equal size N = 12·L·d²).
THRESHOLD_REGIONS = {
    "shallow": "below the line: too shallow for its width (a deeper net of the same size does better)",
    "deep": "above the line: too deep for its width (a shallower, wider net of the same size does better)",
}


def budget_label(name: str) -> str:
    """A budget's name as written beside its marker: 'GPT-3 175B' -> '175B' (the legend names the family)."""
    return re.sub(r"^GPT-\d\s+", "", name)


def plot_threshold(fit: LogWidthFit, widths=None, ax=None):
    """Depth at the transition against width: the fit's (ln d - a)/b and theory's log₃ d.

    The fitted line splits the (width, depth) plane: a net below it is too
    shallow for its width, above it too deep (``THRESHOLD_REGIONS``); the two
    regions are shaded and named in the legend.
    """
    if ax is None:
        ax = Figure(figsize=(5.2, 3.8)).subplots()
    widths = np.geomspace(16, 65536, 200) if widths is None else np.asarray(widths, dtype=float)
    depth = (np.log(widths) - fit.a) / fit.b
    threshold = theory.depth_threshold(widths)
    top = 1.1 * max(float(np.max(depth)), float(np.max(threshold)), 1.0)
    line = np.clip(depth, 0.0, top)
    ax.fill_between(widths, 0.0, line, color="tab:blue", alpha=0.12, lw=0, label=THRESHOLD_REGIONS["shallow"])
    ax.fill_between(widths, line, top, color="tab:red", alpha=0.10, lw=0, label=THRESHOLD_REGIONS["deep"])
    ax.plot(widths, depth, color="tab:green",
            label=f"transition depth (ln d - a)/b, {_fit_label(fit)}")
    ax.plot(widths, threshold, color="tab:purple", ls="--",
            label="theory threshold L_th = log₃ d (section 4): above it, depth and width count alike")
    _log_x(ax)
    ax.set_ylim(0, top)
    ax.set_title("How deep can a net of width d usefully be?\n"
                 "Depth at which a deeper net of the same size stops doing better", fontsize=9)
    ax.set_xlabel("width d")
    ax.set_ylabel("depth L")
    _legend_below(ax, fontsize=8)
    return ax


def plot_loss_curves(runs, ax=None, source: str = "your runs"):
    """Seed-mean eval loss (nats/token, ± seed std) against N = 12·L·d² for every depth of a sweep."""
    if ax is None:
        ax = Figure(figsize=(5.4, 3.8)).subplots()
    points = aggregate_seeds(runs)
    for depth in sorted(points["depth"].unique()):
        rows = points[points["depth"] == depth].sort_values("params")
        ax.errorbar(rows["params"], rows["loss_mean"], yerr=rows["loss_std"].fillna(0.0), fmt="o-", ms=3.5,
                    lw=1.2, capsize=2, label=f"L = {depth}")
    _log_x(ax)
    ax.set_xlabel("non-embedding parameters N = 12·L·d²")
    ax.set_ylabel("eval loss (nats/token)")
    seeds = int(points["n_seeds"].max()) if len(points) else 0
    spread = "mean ± std over seeds" if seeds > 1 else "one seed per point, so no error bars"
    ax.set_title(f"{source}: loss against size, by depth ({spread})", fontsize=9)
    ax.legend(fontsize=8)
    return ax


def write_sweep_figures(runs, transitions, fit: LogWidthFit | None, out_dir, reference: LogWidthFit,
                        budgets=(), estimate: str = "crossing", source: str = "your runs") -> list[epath.Path]:
    """All figures for a sweep: one per depth pair, the width fit (if ``fit``), N_tr(L) over the
    sweep's depths, its projection to L = 100 with ``budgets`` marked, and the threshold.

    ``runs`` has one learning rate per shape. ``reference`` (the paper's fit
    by default) is drawn when the data gave no fit of its own, and labelled
    as such. Returns the written paths (PNG and PDF for each figure).
    """
    label = f"your runs ({epath.Path(str(source).rstrip('/')).name})"
    paths = save_figure(plot_loss_curves(runs, source=label).figure, out_dir, "loss_vs_size")
    if transitions:
        paths += save_figure(plot_pair_differences(transitions, source=label).figure, out_dir, "pair_differences")
    for transition in transitions:
        paths += save_figure(plot_depth_pair(runs, transition, source=label)[0].figure, out_dir,
                             f"pair_L{transition.shallow_depth}_L{transition.deep_depth}")
    if fit is not None:
        paths += save_figure(plot_width_fit(transitions, fit, estimate=estimate).figure, out_dir, "width_fit")
    shown = fit or reference
    whose = "fit to your runs" if fit is not None else "the paper's fit (your runs gave no fit of their own)"
    shapes = aggregate_seeds(runs)[["depth", "params"]]
    deepest = max([int(shapes["depth"].max())] + [t.deep_depth for t in transitions])
    paths += save_figure(plot_transition_size(
        shown, transitions=transitions, max_depth=max(1.25 * deepest, 4.0), estimate=estimate, shapes=shapes,
        title=f"N_tr(L) over your depths, {whose}").figure, out_dir, "transition_size")
    paths += save_figure(plot_transition_size(
        shown, budgets=budgets, transitions=transitions, reference=reference, estimate=estimate,
        title=f"projection to L = 100, {whose}; GPT-3 shapes from the paper").figure, out_dir, "projection")
    paths += save_figure(plot_threshold(shown).figure, out_dir, "threshold")
    return paths
