"""Learning-rate transfer across widths and depths per parametrization, from run records.

    python -m analysis hp-transfer results/hp_transfer
    python -m analysis hp-transfer results/hp_transfer --json
    python -m analysis hp-transfer results/hp_transfer --figure results/hp_transfer/loss_vs_lr.png

Reads the finished runs of ``sweeps/configs/hp_transfer.py`` (through
``analysis.results.load_runs``: one row per run, duplicates and unfinished
runs left out and counted) and, per parametrization, takes the width axis
(runs at ``--base-depth``) and the depth axis (runs at ``--base-width``). For
each shape it finds the best peak rate on the grid (lowest final evaluation
loss; a diverged run counts as worse than any finished one) and, along each
axis, the spread of the best rates: the largest over the smallest, 1 when
every shape has the same optimum. The pre-registered criterion of
``results/hp_transfer/README.md`` is evaluated from these spreads
(``criterion``). A best rate at either end of a shape's grid is flagged: the
optimum may lie beyond it.

The parametrization is read from the record's ``lr_rule``: ``constant`` is
the standard parametrization, ``parametrization=NAME`` the others
(``scaling.model.optim.rule_name``).
"""

from __future__ import annotations

import json
import math

import pandas as pd

from analysis.errors import AnalysisInputError
from analysis.results import load_runs

# Pre-registered (results/hp_transfer/README.md): on a grid of rates a factor 2 apart, the transferring
# parametrization's best rates lie within one grid step across the 4× range, the standard one's do not.
TRANSFER_SPREAD = 2.0
CRITERION = {"width": ("mup", "standard"), "depth": ("completep", "standard")}


def parametrization_of(lr_rule: str) -> str:
    """``standard`` for a standard-parametrization record (``lr_rule`` ``constant``), else the name after
    ``parametrization=``; other rules keep their name (``standard/width_scaled``)."""
    if lr_rule.startswith("parametrization="):
        return lr_rule.split("=", 1)[1]
    return "standard" if lr_rule == "constant" else f"standard/{lr_rule}"


def best_rates(directory, base_width: int = 64, base_depth: int = 2) -> pd.DataFrame:
    """One row per (parametrization, axis, shape): ``best_lr``, its ``loss``, the rates tried (``rates``),
    and ``at_edge`` (the best rate is the grid's smallest or largest)."""
    runs = load_runs(directory).runs.copy()
    runs["parametrization"] = runs["lr_rule"].map(parametrization_of)
    rows = []
    for axis, fixed, value in (("width", "depth", base_depth), ("depth", "width", base_width)):
        on_axis = runs[runs[fixed] == value]
        for (name, size), group in on_axis.groupby(["parametrization", axis]):
            best = group.loc[group["loss"].idxmin()]
            rates = sorted(group["peak_lr"].tolist())
            rows.append({"parametrization": name, "axis": axis, "size": int(size), "best_lr": float(best["peak_lr"]),
                         "loss": float(best["loss"]), "rates": rates,
                         "at_edge": best["peak_lr"] in (rates[0], rates[-1]) and len(rates) > 1})
    if not rows:
        raise AnalysisInputError(f"{directory}: no finished runs at depth {base_depth} or width {base_width}")
    return pd.DataFrame(rows).sort_values(["axis", "parametrization", "size"]).reset_index(drop=True)


def spreads(table: pd.DataFrame) -> pd.DataFrame:
    """Per (parametrization, axis): the sizes, best rates and their spread (largest / smallest best rate)."""
    rows = []
    for (name, axis), group in table.groupby(["parametrization", "axis"]):
        if group["size"].nunique() < 2:
            continue
        best = group["best_lr"]
        rows.append({"parametrization": name, "axis": axis, "sizes": group["size"].tolist(),
                     "best_lrs": best.tolist(), "spread": float(best.max() / best.min()),
                     "any_at_edge": bool(group["at_edge"].any())})
    return pd.DataFrame(rows)


def criterion(spread_table: pd.DataFrame) -> dict:
    """The pre-registered criterion per axis: holds when the transferring parametrization's spread is at
    most ``TRANSFER_SPREAD`` and the standard one's is larger; ``undecided`` when a curve is missing or its
    best rate sits at a grid end."""
    verdicts = {}
    for axis, (transferring, standard) in CRITERION.items():
        found = {row.parametrization: row for row in spread_table.itertuples() if row.axis == axis}
        if transferring not in found or standard not in found:
            verdicts[axis] = {"verdict": "undecided", "why": f"needs {transferring} and {standard} along {axis}"}
            continue
        ours, theirs = found[transferring], found[standard]
        entry = {f"{transferring}_spread": ours.spread, f"{standard}_spread": theirs.spread}
        if ours.any_at_edge or theirs.any_at_edge:
            verdicts[axis] = {**entry, "verdict": "undecided", "why": "a best rate is at an end of its grid"}
        else:
            holds = ours.spread <= TRANSFER_SPREAD * (1 + 1e-9) and theirs.spread > ours.spread
            verdicts[axis] = {**entry, "verdict": "holds" if holds else "fails"}
    return verdicts


def figure(directory, path, base_width: int = 64, base_depth: int = 2) -> None:
    """Loss against peak rate, a curve per width (top row) or depth (bottom row), a column per
    parametrization, best rates marked: the layout of "Tensor Programs V"'s first figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_runs(directory).runs.copy()
    runs["parametrization"] = runs["lr_rule"].map(parametrization_of)
    names = sorted(runs["parametrization"].unique(), key=lambda n: (n != "standard", n))
    plot, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 7.0), sharey="row", squeeze=False)
    for row, (axis, fixed, value) in enumerate((("width", "depth", base_depth), ("depth", "width", base_width))):
        for column, name in enumerate(names):
            panel = axes[row][column]
            chosen = runs[(runs["parametrization"] == name) & (runs[fixed] == value)]
            for size, group in chosen.groupby(axis):
                group = group.sort_values("peak_lr")
                line, = panel.plot(group["peak_lr"], group["loss"], marker="o", label=f"{axis} {size}")
                best = group.loc[group["loss"].idxmin()]
                panel.plot([best["peak_lr"]], [best["loss"]], marker="*", markersize=14, color=line.get_color())
            panel.set(xscale="log", xlabel="peak learning rate", title=f"{name}: {axis}s at {fixed} {value}")
            rates = sorted(chosen["peak_lr"].unique())  # the grid's rates as the ticks, a factor 2 apart
            panel.set_xticks(rates, [f"{rate:.3g}" for rate in rates], rotation=45, fontsize=7)
            panel.minorticks_off()
            if column == 0:
                panel.set_ylabel("final eval loss (nats/token)")
            if panel.lines:
                panel.legend(fontsize=7)
    plot.tight_layout()
    plot.savefig(path, dpi=120)
    plt.close(plot)


def run(directory, as_json: bool = False, figure_path=None, base_width: int = 64, base_depth: int = 2) -> str:
    """The report: best rate per shape, spreads and the criterion (markdown, or JSON)."""
    table = best_rates(directory, base_width, base_depth)
    spread_table = spreads(table)
    verdicts = criterion(spread_table)
    if figure_path:
        figure(directory, figure_path, base_width, base_depth)
    if as_json:
        return json.dumps({"best": table.to_dict("records"), "spreads": spread_table.to_dict("records"),
                           "criterion": verdicts}, indent=2)
    lines = ["| parametrization | axis | size | best peak rate | loss | at grid end |", "|---|---|---|---|---|---|"]
    for row in table.itertuples():
        lines.append(f"| {row.parametrization} | {row.axis} | {row.size} | {row.best_lr:.3g} | {row.loss:.4f} | "
                     f"{'yes' if row.at_edge else ''} |")
    lines += ["", "| parametrization | axis | best rates | spread (max/min) |", "|---|---|---|---|"]
    for row in spread_table.itertuples():
        rates = ", ".join(f"{size}: {lr:.3g}" for size, lr in zip(row.sizes, row.best_lrs))
        lines.append(f"| {row.parametrization} | {row.axis} | {rates} | {row.spread:.3g} |")
    lines.append("")
    for axis, verdict in verdicts.items():
        numbers = ", ".join(f"{k} {v:.3g}" for k, v in verdict.items() if isinstance(v, float) and math.isfinite(v))
        why = f" ({verdict['why']})" if "why" in verdict else ""
        lines.append(f"criterion along {axis}: {verdict['verdict']}{why}" + (f"; {numbers}" if numbers else ""))
    return "\n".join(lines)
