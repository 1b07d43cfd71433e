"""Figures in the style of Levine et al. 2020, Figs. 2-4 (matplotlib, written as PNG and PDF).

* ``plot_depth_pair``: loss against N for an adjacent depth pair, the
  transition bracket shaded (Fig. 2).
* ``plot_width_fit``: transition widths log d against L with error bars and
  the weighted fit with its one-sigma band (Fig. 3a).
* ``plot_transition_size``: N_tr(L) with its ±ΔN band out to L = 100, with
  trained models and measured transitions marked (Figs. 3b and 4).
* ``plot_threshold``: the empirical transition depth (ln d - a)/b against
  the theory's threshold L_th = log₃ d (section 4).

Figures are plain ``matplotlib.figure.Figure`` objects rendered by Agg, not
pyplot figures: no global state, nothing to close, and the caller's
backend (e.g. a notebook's inline one) is left alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from analysis import projection, theory
from analysis.fit import LogWidthFit
from analysis.results import aggregate_seeds
from analysis.transition import Transition, transition_points


def save_figure(fig, out_dir, stem: str) -> list[Path]:
    """Write ``fig`` as ``out_dir/stem.png`` (150 dpi) and ``.pdf``; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.pdf"]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    return paths


def plot_depth_pair(runs, transition: Transition, axes=None):
    """Loss against N (parameters) for one depth pair, and their difference below it.

    Top: seed-mean loss (nats/token) ± seed std of both depths. Bottom: the
    difference loss_shallow - loss_deep at the compared sizes with its
    significance threshold (critical value × standard error). The bracket
    between the last indistinguishable and the first significantly-worse size
    is shaded grey; the bootstrap 95% CI of the crossing is shaded orange.
    """
    if axes is None:
        axes = Figure(figsize=(5.4, 5.2)).subplots(2, 1, sharex=True, height_ratios=(3, 2))
    top, bottom = axes
    points = aggregate_seeds(runs)
    for depth, colour in ((transition.shallow_depth, "tab:blue"), (transition.deep_depth, "tab:red")):
        rows = points[points["depth"] == depth]
        top.errorbar(rows["params"], rows["loss_mean"], yerr=rows["loss_std"].fillna(0.0), fmt="o-",
                     ms=3.5, lw=1.2, capsize=2, color=colour, label=f"L = {depth}")
    comparison = transition.comparison
    if comparison is not None:
        threshold = comparison.critical * comparison.se
        bottom.errorbar(comparison.params, comparison.diff, yerr=comparison.se, fmt="o-", ms=3.5,
                        color="k", capsize=2, label=f"L{transition.shallow_depth} − L{transition.deep_depth}")
        bottom.fill_between(comparison.params, -threshold, threshold, color="0.85", step=None,
                            label="|difference| < critical·se")
        bottom.axhline(0.0, color="0.4", lw=0.8)
    for ax in axes:
        if transition.found:
            ax.axvspan(transition.params_before, transition.params_after, color="0.55", alpha=0.35,
                       label="transition bracket" if ax is top else None)
        if transition.crossing_ci:
            low, high = (12.0 * transition.shallow_depth * w ** 2 for w in transition.crossing_ci)
            ax.axvspan(low, high, color="tab:orange", alpha=0.35,
                       label="crossing 95% CI" if ax is top else None)
        ax.set_xscale("log")
    bottom.set_xlabel("non-embedding parameters N = 12·L·d²")
    top.set_ylabel("eval loss (nats/token)")
    bottom.set_ylabel("loss difference")
    top.set_title(f"L = {transition.shallow_depth} vs L = {transition.deep_depth}: {transition.status}")
    top.legend(fontsize=8)
    bottom.legend(fontsize=7, loc="upper left")
    return axes


def plot_width_fit(transitions, fit: LogWidthFit, ax=None):
    """Transition widths as log d against L (with σ = Δd/d bars) and the fitted line ± 1σ."""
    if ax is None:
        ax = Figure(figsize=(5.2, 3.8)).subplots()
    depth, width, error = transition_points(transitions)
    ax.errorbar(depth, np.log(width), yerr=error / width, fmt="o", color="k", capsize=3,
                label="measured transition widths")
    grid = np.linspace(0.0, max(depth.max() if depth.size else 50.0, 10.0) * 1.1, 200)
    line, band = fit.log_width(grid), fit.log_width_error(grid)
    ax.plot(grid, line, color="tab:green", label=f"log d = {fit.a:.3f} + {fit.b:.4f}·L")
    ax.fill_between(grid, line - band, line + band, color="tab:green", alpha=0.2, label="fit ± 1σ")
    ax.set_xlabel("depth L (shallower of the pair)")
    ax.set_ylabel("ln(transition width d)")
    title = fit.name
    if fit.r2 is not None:
        title += f"  R² = {fit.r2:.3f}"
    if fit.chi2_red is not None:
        title += f", χ²_red = {fit.chi2_red:.2f}"
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax


def plot_transition_size(fit: LogWidthFit, budgets=(), transitions=(), max_depth: float = 100.0,
                         reference: LogWidthFit | None = None, ax=None):
    """N_tr(L) (parameters) with the ±ΔN band up to ``max_depth`` layers.

    ``budgets`` with a trained shape are marked at (trained depth, N) and
    their optimal shape drawn as an open marker; ``transitions`` that were
    found are marked at (L, 12·L·d²); ``reference`` (another fit) is drawn
    dashed. Where the first-order ΔN exceeds N the band runs to the bottom.
    """
    if ax is None:
        ax = Figure(figsize=(6.0, 4.2)).subplots()
    grid = np.linspace(1.0, max_depth, 400)
    size, delta = projection.transition_params(grid, fit), projection.transition_params_error(grid, fit)
    bottom = size.min() / 10.0
    ax.plot(grid, size, color="tab:green", label=f"N_tr(L), {fit.name}")
    ax.fill_between(grid, np.where(size > delta, size - delta, bottom), size + delta, color="tab:green",
                    alpha=0.25, label="± ΔN")
    if reference is not None and reference != fit:
        ax.plot(grid, projection.transition_params(grid, reference), color="0.3", ls="--",
                label=f"N_tr(L), {reference.name}")
    trained = [b for b in budgets if b.trained_depth]
    if trained:
        ax.scatter([b.trained_depth for b in trained], [b.params for b in trained], marker="x",
                   color="tab:red", zorder=3, label="trained shapes")
    for budget in budgets:
        shape = projection.optimal_shape(budget.params, fit)
        ax.scatter([shape.depth], [budget.params], marker="o", facecolor="none", edgecolor="tab:blue",
                   zorder=3, label="optimal depth" if budget is budgets[0] else None)
        if budget.trained_depth:
            ax.annotate("", xy=(shape.depth, budget.params), xytext=(budget.trained_depth, budget.params),
                        arrowprops={"arrowstyle": "->", "color": "0.5", "lw": 0.8})
    depth, width, error = transition_points(list(transitions))
    if depth.size:
        measured = 12.0 * depth * width ** 2
        spread = 24.0 * depth * width * error  # dN = 24·L·d·Δd
        ax.errorbar(depth, measured, yerr=spread, fmt="s", color="k", ms=4, capsize=2,
                    label="measured transitions")
    ax.set_yscale("log")
    ax.set_ylim(bottom=bottom)
    ax.set_xlim(0, max_depth)
    ax.set_xlabel("depth L")
    ax.set_ylabel("non-embedding parameters N")
    ax.set_title("above the curve: too shallow; below: too deep")
    ax.legend(fontsize=8, loc="upper left")
    return ax


def plot_threshold(fit: LogWidthFit, widths=None, ax=None):
    """Depth at the transition against width: the fit's (ln d - a)/b and theory's log₃ d."""
    if ax is None:
        ax = Figure(figsize=(5.2, 3.8)).subplots()
    widths = np.geomspace(16, 65536, 200) if widths is None else np.asarray(widths, dtype=float)
    ax.plot(widths, (np.log(widths) - fit.a) / fit.b, color="tab:green",
            label=f"measured transition, {fit.name}: (ln d - a)/b")
    ax.plot(widths, theory.depth_threshold(widths), color="tab:purple", ls="--",
            label="theory threshold L_th = log₃ d")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_title("depth at which width d stops sufficing")
    ax.set_xlabel("width d")
    ax.set_ylabel("depth L")
    ax.legend(fontsize=8)
    return ax


def plot_loss_curves(runs, ax=None):
    """Seed-mean eval loss (nats/token, ± seed std) against N = 12·L·d² for every depth of a sweep."""
    if ax is None:
        ax = Figure(figsize=(5.4, 3.8)).subplots()
    points = aggregate_seeds(runs)
    for depth in sorted(points["depth"].unique()):
        rows = points[points["depth"] == depth].sort_values("params")
        ax.errorbar(rows["params"], rows["loss_mean"], yerr=rows["loss_std"].fillna(0.0), fmt="o-", ms=3.5,
                    lw=1.2, capsize=2, label=f"L = {depth}")
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters N = 12·L·d²")
    ax.set_ylabel("eval loss (nats/token)")
    ax.set_title("loss against size, by depth")
    ax.legend(fontsize=8)
    return ax


def write_sweep_figures(runs, transitions, fit: LogWidthFit | None, out_dir, reference: LogWidthFit,
                        budgets=()) -> list[Path]:
    """All figures for a sweep: one per depth pair, the width fit (if ``fit``), N_tr(L) over the
    sweep's depths, its projection to L = 100 with ``budgets`` marked, and the threshold.

    ``reference`` is drawn when the data gave no fit of its own. Returns the
    written paths (PNG and PDF for each figure).
    """
    paths = save_figure(plot_loss_curves(runs).figure, out_dir, "loss_vs_size")
    for transition in transitions:
        paths += save_figure(plot_depth_pair(runs, transition)[0].figure, out_dir,
                             f"pair_L{transition.shallow_depth}_L{transition.deep_depth}")
    if fit is not None:
        paths += save_figure(plot_width_fit(transitions, fit).figure, out_dir, "width_fit")
    shown = fit or reference
    deepest = max(t.deep_depth for t in transitions) if transitions else 50
    paths += save_figure(plot_transition_size(shown, transitions=transitions, max_depth=1.25 * deepest).figure,
                         out_dir, "transition_size")
    paths += save_figure(plot_transition_size(shown, budgets=budgets, transitions=transitions,
                                              reference=reference).figure, out_dir, "projection")
    paths += save_figure(plot_threshold(shown).figure, out_dir, "threshold")
    return paths
