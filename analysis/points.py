"""Runs -> points: one learning rate per shape, then means and seed noise per point.

A *point* is one trained setting at one shape (depth L, width d): runs that
differ only by their seed. When a shape was trained at several learning
rates, the paper tunes the rate per shape, so ``choose_rates`` keeps, per
shape, the rate with the lowest mean eval loss over seeds and reports which
it chose (``RateChoice``); ``rate_table`` shows every rate.

Losses are in nats per token, sizes N = 12·L·d² in parameters, rates are
the peak learning rate of the run's schedule.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from analysis.errors import AnalysisInputError


@dataclasses.dataclass(frozen=True)
class RateChoice:
    """The learning rate kept for one shape, and the rates it beat (rate -> mean loss, nats)."""

    depth: int
    width: int
    peak_lr: float
    lr_rule: str
    loss_mean: float
    others: dict

    def describe(self) -> str:
        text = f"L={self.depth}, d={self.width}: peak_lr {_rate(self.peak_lr)} (mean loss {self.loss_mean:.4f})"
        if self.others:
            text += "; beat " + ", ".join(f"{_rate(lr)} ({loss:.4f})" for lr, loss in sorted(self.others.items()))
        return text

    def to_dict(self) -> dict:
        return {"depth": self.depth, "width": self.width, "peak_lr": _json_rate(self.peak_lr),
                "lr_rule": self.lr_rule, "loss_mean": self.loss_mean,
                "others": {_rate(lr): loss for lr, loss in sorted(self.others.items())}}


def _rate(value) -> str:
    return "unknown" if value is None or math.isnan(value) else f"{value:.3g}"


def _json_rate(value):
    return None if value is None or math.isnan(value) else float(value)


def rate_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean loss, std and seed count per (depth, width, lr_rule, peak_lr), every rate shown."""
    if "peak_lr" not in runs.columns:
        runs = runs.assign(peak_lr=math.nan, lr_rule="")
    keys = ["depth", "width", "lr_rule", "peak_lr"]
    table = runs.assign(peak_lr=runs["peak_lr"].fillna(-1.0)).groupby(keys, as_index=False).agg(
        params=("params", "first"), loss_mean=("loss", "mean"), loss_std=("loss", "std"),
        n_seeds=("loss", "size"))
    table["peak_lr"] = table["peak_lr"].replace(-1.0, math.nan)
    return table.sort_values(["depth", "params", "peak_lr"]).reset_index(drop=True)


def choose_rates(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[RateChoice]]:
    """Keep, per shape, the runs of the rate with the lowest mean loss.

    Returns the kept runs and one ``RateChoice`` per shape (also for shapes
    with a single rate, so the output can always name the rate used).
    """
    if "peak_lr" not in runs.columns:
        return runs, []
    table = rate_table(runs)
    choices, keep = [], np.zeros(len(runs), dtype=bool)
    lr_key = runs["peak_lr"].fillna(-1.0).to_numpy()
    for (depth, width), group in table.groupby(["depth", "width"]):
        best = group.loc[group["loss_mean"].idxmin()]
        others = {float(row.peak_lr): float(row.loss_mean) for row in group.itertuples() if row.Index != best.name}
        choices.append(RateChoice(depth=int(depth), width=int(width), peak_lr=float(best["peak_lr"]),
                                  lr_rule=str(best["lr_rule"]), loss_mean=float(best["loss_mean"]),
                                  others=others))
        best_lr = -1.0 if math.isnan(best["peak_lr"]) else best["peak_lr"]
        keep |= ((runs["depth"] == depth) & (runs["width"] == width) & (runs["lr_rule"] == best["lr_rule"])
                 & (lr_key == best_lr)).to_numpy()
    return runs[keep].reset_index(drop=True), choices


def _require_one_point_per_shape(runs: pd.DataFrame) -> None:
    if "peak_lr" not in runs.columns:
        return
    rates = runs.assign(peak_lr=runs["peak_lr"].fillna(-1.0)).groupby(["depth", "width"])[
        ["peak_lr", "lr_rule"]].nunique()
    several = rates[(rates["peak_lr"] > 1) | (rates["lr_rule"] > 1)]
    if not several.empty:
        depth, width = several.index[0]
        raise AnalysisInputError(f"L={depth}, d={width} has runs at several learning rates; choose one per "
                                 "shape first (analysis.points.choose_rates) instead of pooling them as seeds")


def aggregate_seeds(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean, standard deviation and count of the loss over seeds, per (depth, width).

    Needs one learning rate per shape (see ``choose_rates``). Returns columns
    depth, width, params (12·L·d²), loss_mean and loss_std (nats per token;
    std uses ddof=1 and is NaN for a single seed), n_seeds, sorted by depth
    then params.
    """
    _require_one_point_per_shape(runs)
    grouped = runs.groupby(["depth", "width"], as_index=False).agg(
        params=("params", "first"), loss_mean=("loss", "mean"),
        loss_std=("loss", "std"), n_seeds=("loss", "size"))
    return grouped.sort_values(["depth", "params"]).reset_index(drop=True)


def pooled_seed_std(runs: pd.DataFrame) -> tuple[float, int]:
    """Seed-to-seed standard deviation of the loss pooled over the (depth, width) points of ``runs``.

    Pools the within-point variances weighted by their degrees of freedom.
    Returns (std in nats per token, degrees of freedom); (nan, 0) when no point
    has two or more seeds.
    """
    groups = runs.groupby(["depth", "width"])["loss"]
    dof = (groups.size() - 1).clip(lower=0)
    squares = groups.var(ddof=1).fillna(0.0) * dof
    total_dof = int(dof.sum())
    if total_dof == 0:
        return math.nan, 0
    return float(np.sqrt(squares.sum() / total_dof)), total_dof
