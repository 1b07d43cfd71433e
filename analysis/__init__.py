"""Analysis of depth-vs-width sweeps: records -> transitions -> fit -> projections, tables, plots.

Reads run records only (it imports neither ``scaling`` nor ``sweeps``):

* ``results``    sweep directory or CSV -> one table; seed means
* ``transition`` transition width ± error for each adjacent depth pair
* ``fit``        weighted fit of log d = a + b·L
* ``projection`` N_tr(L) ± ΔN (eq. 9), optimal depth and width, Table 1
* ``theory``     separation-rank bounds, L_th = log₃ d
* ``plots``      Figs. 2-4 (matplotlib, Agg backend)
* ``synthetic``  loss curves with planted transitions, for tests and demos

The names below are importable from ``analysis`` directly; each submodule is
loaded on first use, so the command line (``python -m analysis --help``)
starts without pandas or matplotlib.
"""

import importlib

_EXPORTS = {
    "AnalysisInputError": "errors",
    "LogWidthFit": "fit", "fit_log_width": "fit", "load_fit": "fit", "save_fit": "fit",
    "BUDGET_PRESETS": "projection", "FIT_PRESETS": "projection", "Budget": "projection",
    "optimal_shape": "projection", "optimal_table": "projection", "parse_params": "projection",
    "transition_params": "projection", "transition_params_error": "projection",
    "aggregate_seeds": "results", "load_runs": "results",
    "Transition": "transition", "find_transitions": "transition", "transition_points": "transition",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    return getattr(importlib.import_module(f"analysis.{_EXPORTS[name]}"), name)
