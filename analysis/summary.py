"""A whole sweep analysed in one call: rates chosen, transitions by both estimates, both fits.

``analyse(table)`` is what ``python -m analysis fit`` prints; ``summarize(records)``
does the same for run records in memory (the sweep launcher's end-of-sweep
summary) and never raises for data it cannot use: its ``outcome`` says, as
a typed value, how far the analysis got, so callers branch on that and not
on the text of a message.
"""

from __future__ import annotations

import dataclasses
import enum

import pandas as pd

from analysis.errors import AnalysisInputError, SingleSeedError
from analysis.fit import LogWidthFit, fit_log_width
from analysis.points import RateChoice, aggregate_seeds, choose_rates, rate_table
from analysis.results import RunTable, table_from_records
from analysis.transition import ESTIMATES, Transition, find_transitions, transition_points


class Outcome(enum.Enum):
    """How far the analysis of a sweep got."""

    FITTED = "fitted"                            # at least one estimate gave the log d = a + b·L fit
    TOO_FEW_TRANSITIONS = "too_few_transitions"  # transitions found at fewer than 2 depths
    NO_SEED_NOISE = "no_seed_noise"              # one seed per point and no known seed std
    TOO_FEW_DEPTHS = "too_few_depths"            # finished runs at fewer than 2 depths
    NO_FINISHED_RUNS = "no_finished_runs"
    UNUSABLE_INPUT = "unusable_input"            # e.g. runs of different step counts or data mixed


@dataclasses.dataclass(frozen=True)
class SweepAnalysis:
    """Everything the analysis says about one sweep.

    ``runs`` are the runs used (one learning rate per shape, see ``choices``);
    ``fits`` maps each estimate ("crossing", "paper") to its fit or None;
    ``fit_messages`` says why an estimate has no fit; ``message`` explains an
    outcome other than ``FITTED``.
    """

    outcome: Outcome
    message: str = ""
    table: RunTable | None = None
    runs: pd.DataFrame | None = None
    choices: tuple = ()
    transitions: tuple = ()
    significance: str | None = None
    fits: dict = dataclasses.field(default_factory=dict)
    fit_messages: dict = dataclasses.field(default_factory=dict)

    def fit(self, estimate: str = "crossing") -> LogWidthFit | None:
        return self.fits.get(estimate)

    def rate_lines(self, show_all: bool = False) -> list[str]:
        """Which learning rate each shape uses; with ``show_all``, every rate's mean loss."""
        several = [c for c in self.choices if c.others]
        if not self.choices or (not several and not show_all):
            rates = sorted({c.peak_lr for c in self.choices if c.peak_lr == c.peak_lr})
            return [f"learning rate: {', '.join(f'{r:.3g}' for r in rates)} (one per shape)"] if rates else []
        lines = ["learning rate per shape (lowest mean loss over seeds; the paper tunes the rate per shape):"]
        lines += ["  " + c.describe() for c in self.choices if show_all or c.others]
        return lines

    def seed_mean_lines(self) -> list[str]:
        """Per depth, the seed-mean eval loss ± std (nats/token) and seed count at each width used."""
        if self.runs is None or self.runs.empty:
            return []
        points = aggregate_seeds(self.runs)
        lines = ["eval loss per shape (nats/token; mean±std over seeds, n seeds):"]
        for depth, rows in points.groupby("depth"):
            cells = [f"d{row.width} {row.loss_mean:.4f}" + (f"±{row.loss_std:.4f}" if row.n_seeds > 1 else "")
                     + f" ({row.n_seeds})" for row in rows.itertuples()]
            lines.append(f"  L={depth}: " + ", ".join(cells))
        return lines

    def lines(self, show_all_rates: bool = False) -> list[str]:
        """The summary as text lines (no trailing newlines)."""
        out = []
        if self.table is not None:
            out.append(self.table.describe())
            out += list(self.table.notes)
            unfinished = self.table.unfinished_lines()
            if unfinished:
                out.append("runs that did not finish, per shape:")
                out += ["  " + line for line in unfinished]
            out += self.rate_lines(show_all_rates)
            out += self.seed_mean_lines()
        if self.outcome in (Outcome.NO_FINISHED_RUNS, Outcome.TOO_FEW_DEPTHS, Outcome.NO_SEED_NOISE,
                            Outcome.UNUSABLE_INPUT):
            return out + [self.message]
        out.append(f"significance: {self.significance}")
        for transition in self.transitions:
            out.append(transition.message)
            if transition.noise is not None and transition.comparison is not None:
                out.append(f"  {transition.noise.describe()}; {transition.paper.text(transition.confidence)}; "
                           f"{transition.crossing.text(transition.confidence)}")
                out += ["    " + line for line in transition.size_lines()]
        for estimate in ESTIMATES:
            fit = self.fits.get(estimate)
            label = "zero-crossing estimate" if estimate == "crossing" else "paper's significance rule"
            out.append(f"fit of log d = a + b·L, {label}: " + (fit.describe() if fit else self.fit_messages[estimate]))
        return out

    def to_dict(self) -> dict:
        """JSON-ready: outcome, rates, transitions (both estimates) and both fits."""
        table = self.table
        return {
            "outcome": self.outcome.value, "message": self.message,
            "source": table.source if table else None, "runs": len(self.runs) if self.runs is not None else 0,
            "skipped": table.skipped if table else {}, "fingerprint": table.fingerprint if table else None,
            "steps": table.steps if table else None, "notes": list(table.notes) if table else [],
            "unfinished": table.unfinished.to_dict("records") if table and table.unfinished is not None else [],
            "learning_rates": [c.to_dict() for c in self.choices], "significance": self.significance,
            "transitions": [t.to_dict() for t in self.transitions],
            "fits": {key: (fit.to_dict() if fit else None) for key, fit in self.fits.items()},
            "fit_messages": self.fit_messages,
        }


def analyse(table: RunTable, alpha: float = 0.05, method: str = "pooled", loss_std: float | None = None,
            n_bootstrap: int = 1000, seed: int = 0, name: str = "fit") -> SweepAnalysis:
    """Choose a rate per shape, find transitions by both estimates and fit each.

    Raises ``AnalysisInputError`` only for bad arguments; data that allow no
    fit give an outcome other than ``FITTED``.
    """
    runs, choices = choose_rates(table.runs)
    base = {"table": table, "runs": runs, "choices": tuple(choices)}
    depths = sorted(runs["depth"].unique().tolist())
    if len(depths) < 2:
        return SweepAnalysis(Outcome.TOO_FEW_DEPTHS, f"not enough points for transitions: finished runs at "
                             f"{len(depths)} depth(s) {depths}; need two or more depths", **base)
    try:
        transitions, significance = find_transitions(runs, alpha=alpha, method=method, loss_std=loss_std,
                                                     n_bootstrap=n_bootstrap, seed=seed)
    except SingleSeedError as error:
        return SweepAnalysis(Outcome.NO_SEED_NOISE, f"not enough points for transitions: {error}", **base)
    fits, messages = {}, {}
    for estimate in ESTIMATES:
        fits[estimate], messages[estimate] = _fit(transitions, estimate, f"{name} ({estimate})")
    outcome = Outcome.FITTED if any(fits.values()) else Outcome.TOO_FEW_TRANSITIONS
    return SweepAnalysis(outcome, "" if outcome is Outcome.FITTED else messages["crossing"],
                         transitions=tuple(transitions), significance=significance, fits=fits,
                         fit_messages=messages, **base)


def _fit(transitions: list[Transition], estimate: str, name: str):
    depths, widths, errors = transition_points(transitions, estimate)
    if depths.size >= 2:
        return fit_log_width(depths, widths, errors, name=name, estimate=estimate), ""
    missing = [f"{t.shallow_depth}->{t.deep_depth}" for t in transitions if t.estimate(estimate) is None]
    reason = (f"no {estimate} estimate for pair(s) {', '.join(missing)}" if missing else
              f"{len(transitions)} adjacent depth pair(s) only; train more depths")
    if estimate == "crossing" and any(t.crossing.width is not None and not t.crossing.interval for t in transitions):
        reason += " (the crossing's error comes from its bootstrap interval: use --bootstrap > 0)"
    return None, f"not enough points for the fit: {depths.size} transition(s), need 2 or more; {reason}"


def summarize(records, loss_std: float | None = None, n_bootstrap: int = 200, seed: int = 0,
              source: str = "records") -> SweepAnalysis:
    """Analyse run records (``scaling.store.records.RunRecord`` objects or their dicts) as a sweep.

    Each run counts once (by ``run_id``); unusable data give a typed
    ``outcome`` with a one-line ``message`` instead of an exception.
    """
    records = list(records)
    if not any((r.status if hasattr(r, "status") else r.get("status")) == "finished" for r in records):
        return SweepAnalysis(Outcome.NO_FINISHED_RUNS, "no finished runs yet")
    try:
        table = table_from_records(records, source=source)
    except AnalysisInputError as error:
        return SweepAnalysis(Outcome.UNUSABLE_INPUT, str(error))
    return analyse(table, loss_std=loss_std, n_bootstrap=n_bootstrap, seed=seed, name=source)


__all__ = ["Outcome", "SweepAnalysis", "analyse", "summarize", "RateChoice", "rate_table"]
