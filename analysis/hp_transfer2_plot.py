"""The figure of the second transfer experiment: loss against rate with seed intervals, per shape and parametrization.

Drawn by ``python -m analysis hp-transfer2 DIR --figure PATH`` (``analysis.hp_transfer2``). Two rows of
three panels:
- top: the base tuning (stage 1, one curve per output multiplier and readout start), then the width axis
  (depth 2) under the standard parametrization and under μP;
- bottom: the best rate against size with its interval (both axes, the criterion's input), then the
  depth axis (width 64) under the standard parametrization and under CompleteP.
In every loss panel a point is the mean over seeds at one rate, its bar the range from the lowest to the
highest seed; the dashed curve is the fitted parabola, the star its vertex, and the horizontal bar under
a curve's lowest point the vertex's bootstrap interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import hp_transfer2 as design


def _rate_ticks(panel):
    """Short rate labels (``3e-3``) at 1, 2 and 5 times each power of ten: matplotlib's default labels every
    minor tick of an axis spanning under a decade, and they overlap."""
    from matplotlib import ticker

    def label(value, _):
        mantissa, exponent = f"{value:.0e}".split("e")
        return f"{mantissa}e{int(exponent)}" if mantissa in ("1", "2", "5") else ""

    panel.xaxis.set_major_formatter(ticker.FuncFormatter(label))
    panel.xaxis.set_minor_formatter(ticker.FuncFormatter(label))


def _curve(panel, points: pd.DataFrame, label: str, color=None, result_row: dict | None = None):
    """One curve: seed means and ranges at each rate, the parabola through all runs, the vertex and its interval."""
    finished = points[points["status"] == "finished"]
    by_rate = finished.groupby("x")["loss"]
    x, mean, low, high = by_rate.mean().index.to_numpy(), by_rate.mean(), by_rate.min(), by_rate.max()
    line = panel.errorbar(2 ** x, mean, yerr=[mean - low, high - mean], marker="o", ms=3, capsize=2, lw=1,
                          label=label, color=color)
    color = line[0].get_color()
    if len(x) >= 3:
        a, b, c = np.polyfit(finished["x"], finished["loss"], 2)
        grid = np.linspace(x.min(), x.max(), 50)
        panel.plot(2 ** grid, a * grid ** 2 + b * grid + c, ls="--", lw=0.8, color=color)
    if result_row and result_row.get("best_rate"):
        best = result_row["best_rate"]
        panel.plot([best], [result_row["loss_at_best"]], marker="*", ms=10, color=color)
        if result_row.get("interval"):
            panel.plot(result_row["interval"], [mean.min()] * 2, lw=3, alpha=0.4, color=color)


def _shape_panel(panel, frame: pd.DataFrame, result: dict, name: str, axis: str):
    sizes = design.WIDTHS if axis == "width" else design.DEPTHS
    rows = {(row["parametrization"], row["axis"], row["size"]): row for row in result["shapes"]}
    chosen = result["chosen"]
    for size in sizes:
        if size == sizes[0]:
            points = frame[frame["tag"] == chosen["tag"]] if chosen else frame.iloc[:0]
        else:
            points = frame[frame["tag"].isin([design.shape_tag(name, axis, size),
                                              design.shape_tag(name, axis, size, extension=True)])]
        if not points.empty:
            _curve(panel, points, f"{axis} {size}", result_row=rows.get((name, axis, size)))
    fixed = f"depth {design.BASE_DEPTH}" if axis == "width" else f"width {design.BASE_WIDTH}"
    panel.set(xscale="log", xlabel="peak learning rate", title=f"{name}: {axis}s at {fixed}")
    _rate_ticks(panel)


def _best_rate_panel(panel, result: dict):
    for axis, names in design.COMPARED.items():
        for name in names:
            rows = [row for row in result["shapes"] if row["parametrization"] == name and row["axis"] == axis
                    and row.get("interval")]
            if rows:
                base = design.BASE_WIDTH if axis == "width" else design.BASE_DEPTH
                sizes = [row["size"] / base for row in rows]
                best = np.array([row["best_rate"] for row in rows])
                low = np.array([row["interval"][0] for row in rows])
                high = np.array([row["interval"][1] for row in rows])
                located = next((row for row in result.get("located_drifts", ())
                                if (row["parametrization"], row["axis"]) == (name, axis)), None)
                slope = f": {located['drift']:+.2f} per doubling" if located else ""
                panel.errorbar(sizes, best, yerr=[best - low, high - best], marker="o", capsize=3,
                               label=f"{name}, {axis}{slope}")
    panel.set(xscale="log", yscale="log", xlabel="size / base size (width or depth)", ylabel="best rate",
              title="best rate (vertex), 95% interval; drift over these (descriptive)")
    from matplotlib import ticker

    panel.xaxis.set_major_locator(ticker.FixedLocator([1, 2, 4, 8]))
    panel.xaxis.set_major_formatter(ticker.FormatStrFormatter("×%d"))
    panel.xaxis.set_minor_formatter(ticker.NullFormatter())


def figure(frame: pd.DataFrame, result: dict, path) -> None:
    """Write the experiment's figure (PNG or PDF) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot, axes = plt.subplots(2, 3, figsize=(14, 8.5), squeeze=False)
    base = axes[0][0]
    for multiplier in design.BASE_MULTIPLIERS:
        for init in design.READOUT_INITS:
            tag = design.base_tag(multiplier, init)
            points = frame[frame["tag"] == tag]
            if not points.empty:
                row = next((row for row in result["base"] if row["tag"] == tag), None)
                if result.get("exploratory") and result["chosen"] and tag == result["chosen"]["tag"]:
                    # its points include the extension's: draw the fit they make (the base shape's)
                    row = next(row for row in result["shapes"] if row["size"] == design.BASE_WIDTH
                               and row["axis"] == "width")
                _curve(base, points, tag.removeprefix("base-"), result_row=row)
    base.set(xscale="log", xlabel="peak learning rate", title="base shape: output multiplier, readout start")
    _rate_ticks(base)
    _shape_panel(axes[0][1], frame, result, "standard", "width")
    _shape_panel(axes[0][2], frame, result, "mup", "width")
    _best_rate_panel(axes[1][0], result)
    _shape_panel(axes[1][1], frame, result, "standard", "depth")
    _shape_panel(axes[1][2], frame, result, "completep", "depth")
    for panel in axes.flat:
        if panel.lines or panel.collections:
            panel.legend(fontsize=7)
    for row in axes:
        row[0].set_ylabel("final eval loss (nats/token)")
    axes[1][0].set_ylabel("best peak rate")
    if result.get("exploratory"):
        plot.suptitle("EXPLORATORY: the base shape's fit takes the extensions' runs (not the registered outcome)")
    plot.tight_layout()
    plot.savefig(path, dpi=120)
    plt.close(plot)
