"""Analysis of depth-vs-width sweeps: records -> transitions -> fit -> projections, tables, plots.

Reads run records only: from the project it imports just ``scaling.store.records``
(the run record's single definition), ``scaling.store.metrics_log`` (a run's logged
losses) and ``scaling.store.storage`` (finding files), all JAX-free; never the
trainer or ``sweeps``.

* ``results``    sweep directory, records or CSV -> one table, each run once
* ``points``     one learning rate per shape; seed means and pooled noise
* ``transition`` both transition estimates (paper rule, zero crossing) per depth pair
* ``summary``    the whole pipeline: ``analyse(table)``, ``summarize(records)``
* ``fit``        weighted fit of log d = a + b·L
* ``projection`` N_tr(L) ± ΔN (eq. 9), optimal depth and width, Table 1
* ``paper_table`` Table 1 as the paper prints it, and how each printed value arises
* ``theory``     separation-rank bounds, L_th = log₃ d
* ``shapes``     N = 12·L·d² and its inverse d = sqrt(N / (12·L))
* ``plots``      Figs. 2-4 (matplotlib, Agg backend)
* ``curves``     train and eval loss against step and tokens, per run (metrics logs)
* ``synthetic``  loss curves with planted transitions, for tests and demos

The names below are importable from ``analysis`` directly; each submodule is
loaded on first use, so the command line (``python -m analysis --help``)
starts without pandas or matplotlib.
"""

import importlib

_EXPORTS = {
    "AnalysisInputError": "errors", "SingleSeedError": "errors",
    "Outcome": "summary", "SweepAnalysis": "summary", "analyse": "summary", "summarize": "summary",
    "choose_rates": "points", "rate_table": "points", "pooled_seed_std": "points",
    "LogWidthFit": "fit", "fit_log_width": "fit", "load_fit": "fit", "save_fit": "fit",
    "BUDGET_PRESETS": "projection", "FIT_PRESETS": "projection", "Budget": "projection",
    "optimal_shape": "projection", "optimal_table": "projection", "parse_params": "projection",
    "transition_params": "projection", "transition_params_error": "projection",
    "aggregate_seeds": "points", "load_runs": "results", "table_from_records": "results",
    "Transition": "transition", "find_transitions": "transition", "transition_points": "transition",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    return getattr(importlib.import_module(f"analysis.{_EXPORTS[name]}"), name)
