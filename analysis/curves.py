"""Loss curves of trained runs: train and eval loss against optimizer step and against training tokens.

``python -m analysis curves RUN_OR_SWEEP_DIR --out DIR [--by depth|width]``

A run is a directory holding the trainer's ``config.json``; the directory
given may be one run or hold many at any depth (a sweep, or a work directory
of several sweeps), local or ``gs://``. Each run's rows come from its metrics
log (``scaling.store.metrics_log.read_metrics``: ``metrics.jsonl``, or the
per-flush files a ``gs://`` run writes), its depth, width, seed and peak
learning rate from ``config.json``, and its status (when it has one) from
``result.json``.

One figure per depth (``--by depth``: every run of that depth, one colour
per width) or per width (``--by width``: one colour per depth), each with two
panels sharing the loss axis: loss (nats per token) against the optimizer
step and against the training tokens seen (sequences × tokens per sequence,
summed over steps). Train loss is a solid line through every logged step;
eval loss (on the run's fixed validation set, its initial evaluation at step
0 included) is dashed, with a marker at each evaluation; the evaluation
before training is a marker of its own, not joined to the next one.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
from etils import epath
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from analysis.errors import AnalysisInputError
from analysis.plots import compact_number, save_figure
from analysis.results import open_source
from scaling.store.metrics_log import read_metrics
from scaling.store.storage import find

GROUPINGS = ("depth", "width")
CONFIG_FILE = "config.json"  # what makes a directory a run (scaling.run.train writes it first)


@dataclasses.dataclass(frozen=True)
class RunCurve:
    """One run's losses. ``train``: (step, tokens, loss) of every logged step with a finite loss;
    ``eval``: (step, tokens, loss) of every evaluation. Steps are optimizer steps done, tokens the
    training tokens seen by then, losses in nats per token."""

    path: str
    name: str
    depth: int
    width: int
    seed: int
    peak_lr: float
    status: str | None
    train: np.ndarray  # [rows, 3]
    eval: np.ndarray  # [rows, 3]


def _read_json(path: epath.Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _tokens_per_step(record: dict, rows: list[dict]) -> float:
    """Training tokens per optimizer step: as logged (classification rows are shorter than seq_len), else
    the run record's ``tokens_per_step``, else NaN (unknown)."""
    logged = [row["tokens"] / row["step"] for row in rows if row.get("tokens") and row["step"] > 0]
    if logged:
        return float(np.median(logged))
    return float(record.get("tokens_per_step") or math.nan)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def read_run(run_dir) -> RunCurve | None:
    """The curves of the run in ``run_dir`` (local or URI), or None if it has no run config or no losses."""
    run_dir = epath.Path(run_dir)
    config = _read_json(run_dir / CONFIG_FILE)
    model = (config or {}).get("model")
    if not isinstance(model, dict) or "depth" not in model or "width" not in model:
        return None
    rows = read_metrics(run_dir)
    record = _read_json(run_dir / "result.json") or {}
    per_step = _tokens_per_step(record, rows)
    train = [(row["step"], row["step"] * per_step, row["loss"]) for row in rows if _finite(row.get("loss"))]
    evals = [(row["step"], row["step"] * per_step, row["eval_loss"]) for row in rows
             if _finite(row.get("eval_loss"))]
    if not train and not evals:
        return None
    return RunCurve(path=str(run_dir), name=config.get("name") or run_dir.name, depth=int(model["depth"]),
                    width=int(model["width"]), seed=int(config.get("seed", 0)),
                    peak_lr=float(config.get("optim", {}).get("peak_lr", math.nan)), status=record.get("status"),
                    train=np.asarray(train, float).reshape(-1, 3), eval=np.asarray(evals, float).reshape(-1, 3))


def load_curves(source) -> tuple[list[RunCurve], list[str]]:
    """Every run under ``source`` (itself one run, or a folder of runs at any depth; local or URI) with
    losses logged, ordered by depth, width, seed and path; and notes on the run folders left out.
    ``AnalysisInputError`` (one line) if ``source`` is missing, a file, or holds no run with losses."""
    path, is_dir = open_source(source, missing="no such directory")
    if not is_dir:
        raise AnalysisInputError(f"{source}: is a file; expected a run directory or a folder of runs")
    runs, notes = [], []
    for config_file in find(source, CONFIG_FILE):
        run = read_run(config_file.parent)
        if run is None:
            notes.append(f"{config_file.parent}: no losses logged yet (or not a run), left out")
        else:
            runs.append(run)
    if not runs:
        raise AnalysisInputError(f"{source}: no runs with logged losses under this directory (a run directory "
                                 f"holds {CONFIG_FILE} and metrics.jsonl)")
    runs.sort(key=lambda run: (run.depth, run.width, run.seed, run.path))
    return runs, notes


def _legend_label(runs: list[RunCurve], by: str) -> str:
    """The legend entry of one colour: the runs of ``runs`` (same depth and width), e.g. ``d = 64``,
    ``d = 64, 3 seeds``, ``L = 2, 2 rates, 1 diverged``."""
    first = runs[0]
    text = f"d = {first.width}" if by == "depth" else f"L = {first.depth}"
    seeds, rates = len({r.seed for r in runs}), len({r.peak_lr for r in runs})
    text += f", {seeds} seeds" if seeds > 1 else ""
    text += f", {rates} learning rates" if rates > 1 else ""
    for status in sorted({r.status for r in runs} - {None, "finished"}):
        text += f", {sum(r.status == status for r in runs)} {status}"
    return text


def plot_curves(group: list[RunCurve], by: str, value: int, source: str = "your runs", log: bool = False) -> Figure:
    """One figure of ``group`` (runs sharing ``by`` = ``value``): loss against step (left) and against
    training tokens (right); train loss solid, eval loss dashed with markers, one colour per value of
    the other dimension (its seeds and learning rates share it). ``log``: both axes logarithmic (the
    evaluation before the first step is then left out)."""
    other = "width" if by == "depth" else "depth"
    values = sorted({getattr(run, other) for run in group})
    colours = dict(zip(values, _palette(len(values))))
    fig = Figure(figsize=(10.0, 4.0), layout="constrained")
    by_step, by_tokens = fig.subplots(1, 2, sharey=True)
    for run in group:
        colour = colours[getattr(run, other)]
        train, evals = (rows[rows[:, 0] > 0] if log else rows for rows in (run.train, run.eval))
        for ax, column in ((by_step, 0), (by_tokens, 1)):
            if len(train):
                ax.plot(train[:, column], train[:, 2], "-", color=colour, lw=1.2)
            # The evaluation before training stands alone: a line from it to the next would draw a
            # straight descent that no evaluation measured.
            initial, later = evals[evals[:, 0] == 0], evals[evals[:, 0] > 0]
            if len(initial):
                ax.plot(initial[:, column], initial[:, 2], "o", color=colour, ms=3.5, zorder=3)
            if len(later):
                ax.plot(later[:, column], later[:, 2], "--o", color=colour, lw=1.0, ms=3.5, zorder=3)
    handles = [Line2D([], [], color=colours[v], lw=2.0,
                      label=_legend_label([r for r in group if getattr(r, other) == v], by)) for v in values]
    handles += [Line2D([], [], color="0.3", ls="-", lw=1.2, label="train loss (logged steps)"),
                Line2D([], [], color="0.3", ls="--", marker="o", ms=3.5, lw=1.0,
                       label="eval loss (validation set)")]
    if any(len(run.eval) and run.eval[0, 0] == 0 for run in group) and not log:
        handles.append(Line2D([], [], color="0.3", ls="", marker="o", ms=3.5, label="eval loss before training"))
    by_step.set_xlabel("optimizer step")
    by_tokens.set_xlabel("training tokens seen")
    by_step.set_ylabel("loss (nats/token)")
    for ax in (by_step, by_tokens):
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.grid(alpha=0.3, which="both" if log else "major")
    by_tokens.xaxis.set_major_formatter(FuncFormatter(compact_number))
    symbol = "L" if by == "depth" else "d"
    fig.suptitle(f"{source}: {by} {symbol} = {value}, {len(group)} run{'s' if len(group) != 1 else ''}, "
                 f"one colour per {other}", fontsize=10)
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    return fig


def _palette(count: int) -> list:
    """``count`` colours from light to dark along viridis (small to large), distinct on white."""
    from matplotlib import colormaps

    return [colormaps["viridis"](x) for x in np.linspace(0.0, 0.85, count)] if count > 1 else ["C0"]


def write_curves(runs: list[RunCurve], out_dir, by: str = "depth", source: str = "your runs",
                 log: bool = False) -> list[epath.Path]:
    """One figure per value of ``by`` (``depth`` or ``width``) as ``curves_L<depth>`` or ``curves_d<width>``,
    PNG and PDF in ``out_dir`` (local or URI); ``log``: logarithmic axes. Returns the written paths."""
    if by not in GROUPINGS:
        raise AnalysisInputError(f"--by {by!r}: allowed {' or '.join(GROUPINGS)}")
    paths = []
    for value in sorted({getattr(run, by) for run in runs}):
        group = [run for run in runs if getattr(run, by) == value]
        stem = f"curves_L{value}" if by == "depth" else f"curves_d{value}"
        paths += save_figure(plot_curves(group, by, value, source, log), out_dir, stem)
    return paths
