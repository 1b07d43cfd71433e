"""Length generalisation with and without log-length attention scaling, from run records.

    python -m analysis log-length results/log_length
    python -m analysis log-length results/log_length --format csv
    python -m analysis log-length results/log_length --figure results/log_length/accuracy.png

Reads every ``<run dir>/result.json`` (through ``scaling.store.records``) and the
``config.json`` beside it under a sweep directory of classification runs
(``sweeps/configs/log_length.py``), local or ``gs://`` (through
``etils.epath``, as ``fit`` reads), and groups finished runs by task
(``first``/``parity``), training setup (position encoding, and a fixed
training set of K strings or a fresh string per example), training length n
(bits) and arm (attention scale ``standard`` or ``log_length``). For each
group it reports the number of seeds and the mean ± sample standard deviation
over seeds of the test accuracy and of the test cross-entropy in bits, both
measured on the evaluation strings (length 1000 in the sweep). For each
(task, setup, n) it compares the two arms' accuracies with Welch's t-test
(unequal variances, two-sided; ``scipy.stats.ttest_ind``). Each run counts once: a copied
run directory (same run id) is counted a single time. Runs that are not
finished are counted per status and left out.

Only ``scaling.store.records`` is imported from the project, so this runs wherever
the records are, without JAX.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import warnings

import pandas as pd
from etils import epath

from analysis.errors import AnalysisInputError
from scaling.store import records

ARMS = ("standard", "log_length")
GROUP = ["task", "position", "train_strings", "train_length"]  # a setup and length; the arms are compared within
TABLE_COLUMNS = ("task", "position", "train_strings", "train_length", "arm", "seeds", "test_length", "accuracy_mean", "accuracy_std",
                 "bits_mean", "bits_std", "train_bits_mean", "fitted")
FITTED_BITS = 0.1  # a run "fitted" its training strings if its last logged training batch is below this


@dataclasses.dataclass
class LogLengthRuns:
    """Finished runs, one row each (task, position, train_strings, train_length, arm, seed, test_length,
    accuracy, bits, train_bits, run_id), and the count of records left out per reason. ``train_strings``
    is the size of the fixed training set, 0 for a fresh string per example."""

    runs: pd.DataFrame
    skipped: dict


def load(directory) -> LogLengthRuns:
    """The finished classification runs under ``directory`` (local or ``gs://``; searched recursively for
    result.json)."""
    root = epath.Path(directory)  # local or gs://
    if not root.is_dir():
        raise AnalysisInputError(f"{directory}: not a directory")
    rows, skipped, seen = [], {}, set()

    def skip(reason):
        skipped[reason] = skipped.get(reason, 0) + 1

    for record_file in records.find_records(root):  # one listing on an object store, not a walk
        run_dir = record_file.parent
        try:
            record = records.read_record(run_dir)
        except records.RecordError:
            skip("unreadable record")
            continue
        except records.OutdatedRecord as error:  # not damaged: skipping it would change the table unseen
            raise AnalysisInputError(str(error)) from None
        if record.status != "finished":
            skip(record.status)
            continue
        if record.run_id in seen:
            skip("duplicate run id")
            continue
        try:
            config = json.loads((run_dir / "config.json").read_text())
            task, data = config["data"]["source"], config["data"]
            arm = config["model"]["attention_scale"]
        except (OSError, ValueError, KeyError, TypeError):
            skip("no readable config.json")
            continue
        if task not in ("first", "parity"):
            skip(f"not a classification run ({task})")
            continue
        if record.final_eval_accuracy is None or record.final_eval_bits is None:
            raise AnalysisInputError(f"{record_file}: finished classification record lacks "
                                     "final_eval_accuracy/final_eval_bits (written by older code?)")
        seen.add(record.run_id)
        rows.append({"task": task, "position": config["model"].get("position", "learned"),
                     "train_strings": int(data.get("synthetic_train_size", 0)),
                     "train_length": int(data["synthetic_max_length"]), "arm": arm,
                     "seed": record.seed, "test_length": int(data["synthetic_eval_max_length"]),
                     "accuracy": float(record.final_eval_accuracy), "bits": float(record.final_eval_bits),
                     "train_bits": (math.nan if record.final_train_loss is None
                                    else record.final_train_loss / math.log(2)),
                     "run_id": record.run_id})
    if not rows:
        reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items())) or "none found"
        raise AnalysisInputError(f"{directory}: no finished FIRST/PARITY runs ({reasons})")
    return LogLengthRuns(pd.DataFrame(rows), skipped)


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std over seeds of test accuracy (fraction) and test cross-entropy (bits) per
    (task, position, train_strings, train_length, arm, test_length); std is NaN for a single seed. Also the mean training
    cross-entropy of the last logged batch (bits; 10 strings, so noisy) and how many seeds fitted
    their training strings (that batch below ``FITTED_BITS``)."""
    runs = runs.assign(fitted=runs["train_bits"] < FITTED_BITS)
    grouped = runs.groupby([*GROUP, "arm", "test_length"])
    table = grouped.agg(seeds=("seed", "count"), accuracy_mean=("accuracy", "mean"),
                        accuracy_std=("accuracy", "std"), bits_mean=("bits", "mean"),
                        bits_std=("bits", "std"), train_bits_mean=("train_bits", "mean"),
                        fitted=("fitted", "sum")).reset_index()
    table["arm"] = pd.Categorical(table["arm"], categories=list(ARMS) + sorted(set(table["arm"]) - set(ARMS)))
    # the first experiment's setup (learned positions) first, then the others in name order
    table["setup_order"] = table["position"] != "learned"
    table = table.sort_values(["setup_order", "position", "train_strings", "task", "train_length", "arm"])
    table = table.reset_index(drop=True)
    table["arm"] = table["arm"].astype(str)
    return table[list(TABLE_COLUMNS)]


def _pm(mean, std, digits):
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def setup_name(position: str, train_strings: int) -> str:
    """A training setup in words: its position encoding and its training strings."""
    strings = f"a fixed set of {train_strings} strings" if train_strings else "a fresh string per example"
    return f"{position} positions, {strings}"


def compare_arms(runs: pd.DataFrame) -> pd.DataFrame:
    """Log-length minus standard attention, per (task, position, train_strings, train_length): the
    difference of mean test accuracies (fraction) and Welch's two-sided t-test p-value over seeds.
    p is NaN where an arm has fewer than two seeds or both arms have zero variance."""
    from scipy import stats

    rows = []
    for key, cell in runs.groupby(GROUP):
        arms = {arm: cell.loc[cell["arm"] == arm, "accuracy"].to_numpy() for arm in ARMS}
        if any(len(values) == 0 for values in arms.values()):
            continue
        standard, scaled = arms["standard"], arms["log_length"]
        p_value = float("nan")
        if min(len(standard), len(scaled)) >= 2 and (standard.std() > 0 or scaled.std() > 0):
            with warnings.catch_warnings():  # an arm at 100% on every seed has zero variance: still valid
                warnings.simplefilter("ignore", RuntimeWarning)
                p_value = float(stats.ttest_ind(scaled, standard, equal_var=False).pvalue)
        rows.append(dict(zip(GROUP, key), standard_seeds=len(standard), log_length_seeds=len(scaled),
                         standard_mean=standard.mean(), log_length_mean=scaled.mean(),
                         difference=scaled.mean() - standard.mean(), welch_p=p_value))
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    order = (table["position"] != "learned", table["position"], table["train_strings"], table["task"],
             table["train_length"])
    return table.assign(_order=list(zip(*order))).sort_values("_order").drop(columns="_order").reset_index(drop=True)


def _p(value: float) -> str:
    if math.isnan(value):
        return "-"
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def markdown(table: pd.DataFrame, comparison: pd.DataFrame | None = None) -> str:
    """The table as Markdown, one table per training setup: accuracy in percent, cross-entropy in
    bits, mean ± std over seeds, and the number of seeds that fitted their training strings; then,
    when ``comparison`` is given, the arm differences with Welch's p-values."""
    lines = []
    for (position, strings), part in table.groupby(["position", "train_strings"], sort=False):
        if lines:
            lines.append("")
        lines += [f"{setup_name(position, strings)}:", "",
                  "| task | train n | arm | seeds | test n | test accuracy (%) | test cross-entropy (bits) "
                  f"| fitted training set (train CE < {FITTED_BITS} bits) |",
                  "|---|---:|---|---:|---:|---:|---:|---:|"]
        for row in part.itertuples():
            lines.append(f"| {row.task.upper()} | {row.train_length} | {row.arm} | {row.seeds} | "
                         f"{row.test_length} | {_pm(100 * row.accuracy_mean, 100 * row.accuracy_std, 1)} | "
                         f"{_pm(row.bits_mean, row.bits_std, 3)} | {row.fitted}/{row.seeds} |")
    if comparison is not None and not comparison.empty:
        lines += ["", "log-length minus standard attention, test accuracy (Welch's t-test, two-sided):", "",
                  "| task | setup | train n | seeds (standard, log-length) | standard (%) | log-length (%) "
                  "| difference (points) | p |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for row in comparison.itertuples():
            lines.append(f"| {row.task.upper()} | {setup_name(row.position, row.train_strings)} | "
                         f"{row.train_length} | {row.standard_seeds}, {row.log_length_seeds} | "
                         f"{100 * row.standard_mean:.1f} | {100 * row.log_length_mean:.1f} | "
                         f"{100 * row.difference:+.1f} | {_p(row.welch_p)} |")
    return "\n".join(lines)


def figure(runs: pd.DataFrame, path) -> None:
    """Test accuracy against training length (log axis), one panel per task and training setup, one
    line per arm: mean over seeds with ± std bars, each seed a faint dot, chance as a dotted line.
    Written to ``path`` (format from its suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = summary_table(runs)
    panels = [key for key, _ in runs.groupby(["task", "position", "train_strings"])]
    panels.sort(key=lambda key: (key[0] != "first", key[1] != "learned", key))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.9), squeeze=False, sharey=True)
    colors = {"standard": "tab:blue", "log_length": "tab:orange"}
    for ax, (task, position, strings) in zip(axes[0], panels):
        in_panel = (runs["task"] == task) & (runs["position"] == position) & (runs["train_strings"] == strings)
        cells = table[(table["task"] == task) & (table["position"] == position)
                      & (table["train_strings"] == strings)]
        for index, arm in enumerate(ARMS):
            cell = cells[cells["arm"] == arm]
            if cell.empty:
                continue
            shift = 1.04 if index else 1 / 1.04  # side by side, so the error bars do not overlap
            seeds = runs[in_panel & (runs["arm"] == arm)]
            ax.scatter(seeds["train_length"] * shift, 100 * seeds["accuracy"], s=9, alpha=0.35, color=colors[arm])
            ax.errorbar(cell["train_length"] * shift, 100 * cell["accuracy_mean"],
                        yerr=100 * cell["accuracy_std"].fillna(0.0), marker="o", capsize=3, color=colors[arm],
                        label=f"{arm} attention")
        ax.axhline(50, color="grey", lw=0.8, ls=":", label="chance (50%)")
        ax.set_xscale("log")
        lengths = sorted(set(runs.loc[in_panel, "train_length"]))
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()
        test = sorted(set(runs.loc[in_panel, "test_length"]))
        strings_text = f"{strings} fixed strings" if strings else "fresh strings"
        ax.set_title(f"{task.upper()}: {position} positions, {strings_text}\ntested at n = "
                     f"{', '.join(map(str, test))}", fontsize=9)
        ax.set_xlabel("training length n (bits)")
    axes[0][0].set_ylabel("test accuracy (%)")
    axes[0][0].set_ylim(0, 102)
    axes[0][0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = epath.Path(path)  # local or gs://
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=150, format=path.suffix.lstrip(".") or None)
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())


def run(directory, fmt: str = "markdown", figure_path=None) -> str:
    """The table of ``directory``'s runs as text in ``fmt`` (markdown, csv or json); also draws the
    figure when ``figure_path`` is given."""
    loaded = load(directory)
    table = summary_table(loaded.runs)
    if figure_path:
        figure(loaded.runs, figure_path)
    if fmt == "csv":
        return table.to_csv(index=False, float_format="%.6g").rstrip("\n")
    comparison = compare_arms(loaded.runs)
    if fmt == "json":
        def records_of(frame):
            return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
                    for row in json.loads(frame.to_json(orient="records"))]
        return json.dumps({"cells": records_of(table), "arm_differences": records_of(comparison),
                           "skipped": loaded.skipped}, indent=2)
    text = markdown(table, comparison)
    if loaded.skipped:
        text += "\n\nleft out: " + ", ".join(f"{count} {reason}" for reason, count in sorted(loaded.skipped.items()))
    return text
