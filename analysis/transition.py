"""Transition width of each shallower depth, from adjacent depth pairs (section 5.2 of Levine et al.).

For an adjacent pair (L_shallow, L_deep) the two loss-vs-size curves are
compared at equal non-embedding size N = 12·L·d²:

1. The comparison sizes are the sizes at which the *shallower* depth was
   trained, restricted to the range the deeper depth covers (widened by 5% in
   N at both ends, so widths rounded to hardware multiples still match). The
   deeper depth's seed-mean loss is interpolated there, linearly in log N.
2. At each size the difference D = loss_shallow - loss_deep (nats per token;
   D > 0 means the shallower net is worse) gets a standard error and a
   one-sided test "the shallower net is worse".
3. Walking sizes upward, the first size where that test passes is the
   "significantly worse" point; the size just before it is the point where the
   two were not yet told apart. The transition width of the shallower depth
   is the mean of its widths d = sqrt(N / (12·L_shallow)) at those two sizes,
   and its error is the distance between them.

Significance test (``method``):

* ``"pooled"`` (default): a two-sample t-test with the seed-to-seed standard
  deviation pooled over every (depth, width) point of the whole table,
  sigma_p, with its pooled degrees of freedom. se = sigma_p·sqrt(1/n_s + 1/n_d)
  where n_s, n_d are the seed counts, and "worse" means D > t_{1-alpha}·se.
  Pooling is the right default for sweeps with 2-3 seeds per point, whose
  per-point standard deviations are too noisy to test with.
* ``"welch"``: Welch's t-test with each point's own seed variance and the
  Welch-Satterthwaite degrees of freedom. A point with a single seed falls
  back to sigma_p (and its degrees of freedom) for its variance term.

If no point has two seeds, sigma_p is unknown; pass ``loss_std`` (nats per
token, e.g. from repeated runs elsewhere), which is then used as a known
standard deviation (a z-test). Interpolating the deeper curve averages two
noisy means, so its true noise is a little lower than assumed: the test errs
on the conservative side.

The crossing point is estimated separately: the last upward zero crossing of
the interpolated difference curve D(log N). Its confidence interval is a
bootstrap over seeds: each (depth, width) point's seeds are resampled with
replacement (a single-seed point instead gets Gaussian noise of sigma_p), the
crossing is recomputed, and the percentiles of the crossing widths are
reported together with the fraction of resamples that had a crossing at all.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats

from analysis.errors import AnalysisInputError
from analysis.results import aggregate_seeds, pooled_seed_std, seed_losses

# How far (relative, in N) the deeper curve may be extended beyond its measured range.
RANGE_TOLERANCE = 0.05
METHODS = ("pooled", "welch")


@dataclasses.dataclass(frozen=True)
class PairComparison:
    """The pair's curves compared at the shallower depth's sizes (arrays over sizes).

    params in parameters (12·L·d²), widths of the shallower depth in channels,
    diff = loss_shallow - loss_deep and its standard error in nats per token,
    critical = the t (or z) value the ratio diff/se must exceed.
    """

    params: np.ndarray
    widths: np.ndarray
    loss_shallow: np.ndarray
    loss_deep: np.ndarray
    diff: np.ndarray
    se: np.ndarray
    critical: np.ndarray

    @property
    def worse(self) -> np.ndarray:
        """True where the shallower net is significantly worse."""
        return self.diff > self.critical * self.se

    @property
    def better(self) -> np.ndarray:
        """True where the shallower net is significantly better."""
        return self.diff < -self.critical * self.se


@dataclasses.dataclass(frozen=True)
class Transition:
    """Transition of one adjacent depth pair.

    status is "found", "below_range" (already significantly worse at the
    smallest compared size), "above_range" (never significantly worse in the
    compared range) or "no_overlap" (fewer than two comparable sizes).
    Widths are the shallower depth's widths in channels; params in parameters.
    """

    shallow_depth: int
    deep_depth: int
    status: str
    message: str
    comparison: PairComparison | None = None
    params_before: float | None = None
    params_after: float | None = None
    width: float | None = None
    width_error: float | None = None
    crossing_width: float | None = None
    crossing_ci: tuple | None = None
    crossing_fraction: float | None = None

    @property
    def found(self) -> bool:
        return self.status == "found"

    def to_dict(self) -> dict:
        """JSON-ready summary (no per-size arrays)."""
        out = {key: getattr(self, key) for key in (
            "shallow_depth", "deep_depth", "status", "message", "params_before", "params_after",
            "width", "width_error", "crossing_width", "crossing_fraction")}
        out["crossing_ci"] = list(self.crossing_ci) if self.crossing_ci else None
        return {key: _plain(value) for key, value in out.items()}


def _plain(value):
    if isinstance(value, (np.floating, float)):
        return None if not math.isfinite(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def width_at(params, depth):
    """Width d = sqrt(N / (12·L)) in channels for size N (parameters) at depth L (layers)."""
    return np.sqrt(np.asarray(params, dtype=float) / (12.0 * depth))


def _interpolation_matrix(x_known, x_query):
    """Matrix W with y_query = y_known @ W: linear interpolation, edge segments extrapolated."""
    right = np.clip(np.searchsorted(x_known, x_query), 1, len(x_known) - 1)
    left = right - 1
    weight = (x_query - x_known[left]) / (x_known[right] - x_known[left])
    matrix = np.zeros((len(x_known), len(x_query)))
    columns = np.arange(len(x_query))
    matrix[left, columns] += 1.0 - weight
    matrix[right, columns] += weight
    return matrix, left, right


def _last_upward_crossing(log_params, diff):
    """log N of the last place D goes from <= 0 to > 0, per row of ``diff``; NaN if none."""
    diff = np.atleast_2d(diff)
    ups = (diff[:, :-1] <= 0) & (diff[:, 1:] > 0)
    has = ups.any(axis=1)
    last = ups.shape[1] - 1 - np.argmax(ups[:, ::-1], axis=1)
    rows = np.arange(diff.shape[0])
    d0, d1 = diff[rows, last], diff[rows, last + 1]
    x0, x1 = log_params[last], log_params[last + 1]
    crossing = x0 + (-d0) / (d1 - d0) * (x1 - x0)
    return np.where(has, crossing, np.nan)


class _Noise:
    """Seed noise used by the significance test: pooled std and degrees of freedom."""

    def __init__(self, runs: pd.DataFrame, method: str, loss_std: float | None):
        if method not in METHODS:
            raise AnalysisInputError(f"unknown significance test {method!r}; choose from {', '.join(METHODS)}")
        self.method = method
        if loss_std is not None:
            if not loss_std > 0:
                raise AnalysisInputError(f"--loss-std must be positive, got {loss_std}")
            self.std, self.dof = float(loss_std), math.inf
        else:
            self.std, self.dof = pooled_seed_std(runs)
            if self.dof == 0:
                raise AnalysisInputError(
                    "every (depth, width) point has a single seed, so seed noise cannot be estimated; "
                    "rerun with more seeds or pass --loss-std (nats per token)")

    def describe(self, alpha: float) -> str:
        source = "given" if math.isinf(self.dof) else f"pooled over seeds, {self.dof} dof"
        name = "pooled two-sample t-test" if self.method == "pooled" else "Welch t-test"
        return f"{name}, one-sided alpha={alpha:g}, seed std {self.std:.4g} nats ({source})"

    def test(self, std_s, n_s, std_d, n_d, alpha):
        """Standard error of the difference and its critical value, per size."""
        if self.method == "pooled":
            se = self.std * np.sqrt(1.0 / n_s + 1.0 / n_d)
            critical = np.full(se.shape, _t_quantile(1 - alpha, self.dof))
            return se, critical
        var_s, dof_s = self._variance(std_s, n_s)
        var_d, dof_d = self._variance(std_d, n_d)
        term_s, term_d = var_s / n_s, var_d / n_d
        se = np.sqrt(term_s + term_d)
        with np.errstate(divide="ignore", invalid="ignore"):
            dof = (term_s + term_d) ** 2 / (term_s ** 2 / dof_s + term_d ** 2 / dof_d)
        dof = np.where(np.isfinite(dof) & (dof > 0), dof, np.inf)
        return se, np.array([_t_quantile(1 - alpha, value) for value in dof])

    def _variance(self, std, n):
        own = (n >= 2) & np.isfinite(std)
        return np.where(own, np.nan_to_num(std) ** 2, self.std ** 2), np.where(own, n - 1.0, self.dof)


def _t_quantile(probability, dof):
    return float(stats.norm.ppf(probability) if math.isinf(dof) else stats.t.ppf(probability, dof))


def compare_pair(points: pd.DataFrame, shallow: int, deep: int, noise: _Noise, alpha: float):
    """Compare two depths at the shallower depth's sizes; None if fewer than 2 sizes overlap.

    ``points`` is the output of ``aggregate_seeds``.
    """
    low = points[points["depth"] == shallow].sort_values("params")
    high = points[points["depth"] == deep].sort_values("params")
    if len(low) < 2 or len(high) < 2:
        return None
    x_deep = np.log(high["params"].to_numpy(float))
    x_all = np.log(low["params"].to_numpy(float))
    tolerance = math.log1p(RANGE_TOLERANCE)
    keep = (x_all >= x_deep[0] - tolerance) & (x_all <= x_deep[-1] + tolerance)
    if keep.sum() < 2:
        return None
    low = low[keep]
    x = x_all[keep]
    matrix, left, right = _interpolation_matrix(x_deep, x)
    loss_deep = high["loss_mean"].to_numpy(float) @ matrix
    std_deep = high["loss_std"].to_numpy(float) @ matrix
    n_deep = np.minimum(high["n_seeds"].to_numpy()[left], high["n_seeds"].to_numpy()[right]).astype(float)
    loss_shallow = low["loss_mean"].to_numpy(float)
    se, critical = noise.test(low["loss_std"].to_numpy(float), low["n_seeds"].to_numpy(float),
                              std_deep, n_deep, alpha)
    params = low["params"].to_numpy(float)
    return PairComparison(params=params, widths=width_at(params, shallow), loss_shallow=loss_shallow,
                          loss_deep=loss_deep, diff=loss_shallow - loss_deep, se=se, critical=critical)


def _classify(shallow, deep, comparison: PairComparison | None) -> dict:
    pair = f"L={shallow} vs L={deep}"
    if comparison is None:
        return {"status": "no_overlap",
                "message": f"{pair}: fewer than two sizes where both depths were trained; cannot compare"}
    worse = np.flatnonzero(comparison.worse)
    n, w = comparison.params, comparison.widths
    if worse.size == 0:
        return {"status": "above_range", "message": (
            f"{pair}: no transition in range: the shallower net is never significantly worse up to "
            f"N={n[-1]:.3g} (width {w[-1]:.0f}); the transition lies above or is not resolved")}
    k = int(worse[0])
    if k == 0:
        return {"status": "below_range", "message": (
            f"{pair}: no transition in range: the shallower net is already significantly worse at the "
            f"smallest compared size N={n[0]:.3g} (width {w[0]:.0f}); the transition lies below")}
    before = "significantly better" if comparison.better[k - 1] else "indistinguishable"
    width, error = 0.5 * (w[k - 1] + w[k]), abs(w[k] - w[k - 1])
    return {"status": "found", "params_before": n[k - 1], "params_after": n[k], "width": width,
            "width_error": error,
            "message": (f"{pair}: shallower net {before} at N={n[k - 1]:.3g} (width {w[k - 1]:.0f}), "
                        f"significantly worse at N={n[k]:.3g} (width {w[k]:.0f}); "
                        f"transition width {width:.0f} ± {error:.0f}")}


def _bootstrap_crossings(runs, points, shallow, deep, comparison, noise, n_bootstrap, rng):
    """Crossing log N for ``n_bootstrap`` seed resamples of both depths' points."""
    losses = seed_losses(runs)

    def resampled_means(depth):
        rows = points[points["depth"] == depth].sort_values("params")
        columns = []
        for width in rows["width"]:
            values = losses[(depth, width)]
            if len(values) >= 2:
                columns.append(values[rng.integers(0, len(values), (n_bootstrap, len(values)))].mean(axis=1))
            else:
                columns.append(values[0] + rng.normal(0.0, noise.std, n_bootstrap))
        return rows, np.stack(columns, axis=1)

    low_rows, low_means = resampled_means(shallow)
    high_rows, high_means = resampled_means(deep)
    keep = np.isin(low_rows["params"].to_numpy(float), comparison.params)
    x = np.log(comparison.params)
    matrix, _, _ = _interpolation_matrix(np.log(high_rows["params"].to_numpy(float)), x)
    diff = low_means[:, keep] - high_means @ matrix
    return _last_upward_crossing(x, diff)


def find_transitions(runs: pd.DataFrame, alpha: float = 0.05, method: str = "pooled",
                     loss_std: float | None = None, n_bootstrap: int = 1000,
                     confidence: float = 0.95, seed: int = 0) -> tuple[list[Transition], str]:
    """Transition widths for every adjacent depth pair of a per-run table.

    ``runs`` has the columns depth, width, params (12·L·d²), seed, loss (nats
    per token). Returns the transitions (one per adjacent pair, in depth
    order) and a one-line description of the significance test used.
    """
    if not 0 < alpha < 1:
        raise AnalysisInputError(f"alpha must lie in (0, 1), got {alpha}")
    if n_bootstrap < 0:
        raise AnalysisInputError(f"the number of bootstrap resamples must be >= 0, got {n_bootstrap}")
    noise = _Noise(runs, method, loss_std)
    points = aggregate_seeds(runs)
    depths = sorted(points["depth"].unique().tolist())
    if len(depths) < 2:
        raise AnalysisInputError(f"need two or more depths to find transitions, found only {depths}")
    rng = np.random.default_rng(seed)
    transitions = []
    for shallow, deep in zip(depths[:-1], depths[1:]):
        comparison = compare_pair(points, shallow, deep, noise, alpha)
        fields = _classify(shallow, deep, comparison)
        if comparison is not None:
            fields.update(_crossing(runs, points, shallow, deep, comparison, noise, n_bootstrap,
                                    confidence, rng))
        transitions.append(Transition(shallow_depth=int(shallow), deep_depth=int(deep),
                                      comparison=comparison, **fields))
    return transitions, noise.describe(alpha)


def _crossing(runs, points, shallow, deep, comparison, noise, n_bootstrap, confidence, rng) -> dict:
    x = np.log(comparison.params)
    observed = _last_upward_crossing(x, comparison.diff)[0]
    out = {"crossing_width": float(width_at(np.exp(observed), shallow)) if np.isfinite(observed) else None}
    if n_bootstrap > 0:
        samples = _bootstrap_crossings(runs, points, shallow, deep, comparison, noise, n_bootstrap, rng)
        found = samples[np.isfinite(samples)]
        out["crossing_fraction"] = found.size / n_bootstrap
        if found.size >= 2:
            tail = 50.0 * (1.0 - confidence)
            low, high = np.percentile(found, [tail, 100.0 - tail])
            out["crossing_ci"] = (float(width_at(np.exp(low), shallow)), float(width_at(np.exp(high), shallow)))
    return out


def transition_points(transitions: list[Transition]):
    """Arrays (depth in layers, width and width error in channels) of the found transitions."""
    found = [t for t in transitions if t.found]
    return (np.array([t.shallow_depth for t in found], dtype=float),
            np.array([t.width for t in found], dtype=float),
            np.array([t.width_error for t in found], dtype=float))
