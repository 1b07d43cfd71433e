"""Two adjacent depths compared at the shallower depth's sizes: the difference, its test, its interval.

The deeper depth's seed-mean loss is interpolated, linearly in ln N, at the
sizes N = 12·L·d² where the shallower depth was trained, within the range
the deeper depth covers (widened by ``RANGE_TOLERANCE`` in N). At each size
D = loss_shallow - loss_deep (nats per token; D > 0: the shallower net is
worse) is tested one-sided in both directions; the test is described in
``analysis.transition``, which turns these comparisons into transitions.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats

from analysis.errors import SingleSeedError
from analysis.points import pooled_seed_std
from analysis.shapes import width_at

# How far (relative, in N) the deeper curve may be extended beyond its measured range.
RANGE_TOLERANCE = 0.05
METHODS = ("pooled", "welch")


@dataclasses.dataclass(frozen=True)
class PairComparison:
    """The pair's curves compared at the shallower depth's sizes (arrays over sizes).

    params in parameters (12·L·d²), widths of the shallower depth in channels,
    diff = loss_shallow - loss_deep and its standard error in nats per token,
    critical = the t (or z) value the ratio diff/se must exceed in the
    one-sided test at level ``alpha``.
    """

    params: np.ndarray
    widths: np.ndarray
    loss_shallow: np.ndarray
    loss_deep: np.ndarray
    diff: np.ndarray
    se: np.ndarray
    critical: np.ndarray
    alpha: float = 0.05

    @property
    def worse(self) -> np.ndarray:
        """True where the shallower net is significantly worse."""
        return self.diff > self.critical * self.se

    @property
    def better(self) -> np.ndarray:
        """True where the shallower net is significantly better."""
        return self.diff < -self.critical * self.se

    @property
    def interval_level(self) -> float:
        """Coverage of ``interval``: 1 - 2·alpha (0.9 at the default alpha)."""
        return 1.0 - 2.0 * self.alpha

    def interval(self) -> tuple[np.ndarray, np.ndarray]:
        """Two-sided interval diff ± critical·se per size (nats per token).

        Its level is ``interval_level``, so it excludes zero exactly where one
        of the two one-sided tests is significant.
        """
        half = self.critical * self.se
        return self.diff - half, self.diff + half

    def rows(self) -> list[dict]:
        """One dict per compared size: params, width, both losses, diff, se, its interval and the verdict."""
        low, high = self.interval()
        verdicts = np.where(self.better, "shallower better", np.where(self.worse, "deeper better", "not significant"))
        return [{"params": float(self.params[i]), "width": float(self.widths[i]),
                 "loss_shallow": float(self.loss_shallow[i]), "loss_deep": float(self.loss_deep[i]),
                 "diff": float(self.diff[i]), "se": float(self.se[i]), "diff_interval": [float(low[i]), float(high[i])],
                 "interval_level": self.interval_level, "verdict": str(verdicts[i])} for i in range(self.params.size)]

    def no_gain_range(self) -> tuple[float, float] | None:
        """(smallest, largest) compared N before the first size where the deeper net is significantly better.

        None when it is already significantly better at the smallest compared size.
        """
        worse = np.flatnonzero(self.worse)
        last = self.params.size if worse.size == 0 else int(worse[0])
        return (float(self.params[0]), float(self.params[last - 1])) if last > 0 else None


@dataclasses.dataclass(frozen=True)
class PairNoise:
    """Seed noise used for one pair: std (nats per token), degrees of freedom (inf if given), source."""

    std: float
    dof: float
    source: str

    def describe(self) -> str:
        dof = "known" if math.isinf(self.dof) else f"{self.dof:g} dof"
        return f"seed std {self.std:.3g} nats ({self.source}, {dof})"


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


def _t_quantile(probability, dof):
    return float(stats.norm.ppf(probability) if math.isinf(dof) else stats.t.ppf(probability, dof))


def pair_noise(runs: pd.DataFrame, shallow: int, deep: int, table: PairNoise | None,
               loss_std: float | None) -> PairNoise:
    """Seed noise of a pair: ``loss_std`` if given, else pooled over the pair, else the table's."""
    if loss_std is not None:
        return PairNoise(float(loss_std), math.inf, "given with --loss-std")
    std, dof = pooled_seed_std(runs[runs["depth"].isin((shallow, deep))])
    if dof > 0 and std > 0:
        return PairNoise(std, float(dof), f"pooled over the seeds of L={shallow} and L={deep}")
    if table is None:
        raise SingleSeedError("every (depth, width) point has a single seed, so seed noise cannot be estimated; "
                              "rerun with more seeds or pass --loss-std (nats per token)")
    return PairNoise(table.std, table.dof, "no repeated seeds in this pair: pooled over the whole table")


def _test(method, noise: PairNoise, std_s, n_s, std_d, n_d, alpha):
    """Standard error of the difference and its critical value, per size."""
    if method == "pooled":
        se = noise.std * np.sqrt(1.0 / n_s + 1.0 / n_d)
        return se, np.full(se.shape, _t_quantile(1 - alpha, noise.dof))

    def variance(std, n):
        own = (n >= 2) & np.isfinite(std) & (np.nan_to_num(std) > 0)
        return np.where(own, np.nan_to_num(std) ** 2, noise.std ** 2), np.where(own, n - 1.0, noise.dof)

    var_s, dof_s = variance(std_s, n_s)
    var_d, dof_d = variance(std_d, n_d)
    term_s, term_d = var_s / n_s, var_d / n_d
    se = np.sqrt(term_s + term_d)
    with np.errstate(divide="ignore", invalid="ignore"):
        dof = (term_s + term_d) ** 2 / (term_s ** 2 / dof_s + term_d ** 2 / dof_d)
    dof = np.where(np.isfinite(dof) & (dof > 0), dof, np.inf)
    return se, np.array([_t_quantile(1 - alpha, value) for value in dof])


@dataclasses.dataclass(frozen=True)
class PairData:
    """Both depths' points and the interpolation from the deeper one to the compared sizes."""

    low: pd.DataFrame
    high: pd.DataFrame
    keep: np.ndarray
    matrix: np.ndarray
    left: np.ndarray
    right: np.ndarray
    x: np.ndarray


def pair_data(points: pd.DataFrame, shallow: int, deep: int) -> PairData | None:
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
    matrix, left, right = _interpolation_matrix(x_deep, x_all[keep])
    return PairData(low=low, high=high, keep=keep, matrix=matrix, left=left, right=right, x=x_all[keep])


def compare_pair(data: PairData, shallow: int, method: str, noise: PairNoise, alpha: float) -> PairComparison:
    """Compare two depths at the shallower depth's sizes."""
    low, high, matrix = data.low[data.keep], data.high, data.matrix
    n_high = high["n_seeds"].to_numpy(float)
    n_deep = np.minimum(n_high[data.left], n_high[data.right])  # the fewer seeds of the two interpolated points
    loss_deep = high["loss_mean"].to_numpy(float) @ matrix
    std_deep = high["loss_std"].to_numpy(float) @ matrix
    loss_shallow = low["loss_mean"].to_numpy(float)
    se, critical = _test(method, noise, low["loss_std"].to_numpy(float), low["n_seeds"].to_numpy(float),
                         std_deep, n_deep, alpha)
    params = low["params"].to_numpy(float)
    return PairComparison(params=params, widths=width_at(params, shallow), loss_shallow=loss_shallow,
                          loss_deep=loss_deep, diff=loss_shallow - loss_deep, se=se, critical=critical,
                          alpha=alpha)
