"""Transition width of each shallower depth, from adjacent depth pairs (section 5.2 of Levine et al.).

For an adjacent pair (L_shallow, L_deep) the two loss-vs-size curves are
compared at the sizes N = 12·L·d² where the *shallower* depth was trained,
restricted to the range the deeper depth covers (widened by 5% in N at both
ends, so widths rounded to hardware multiples still match). The deeper
depth's seed-mean loss is interpolated there, linearly in ln N. At each size
D = loss_shallow - loss_deep (nats per token; D > 0: the shallower net is
worse). Two estimates of the transition width are made from D:

* ``paper``: the paper's significance rule. Walking sizes upward, the first
  size where the shallower net is significantly worse (one-sided test) and
  the size before it bracket the transition; the width is the mean of the
  shallower depth's widths d = sqrt(N / (12·L_shallow)) at the two, and the
  bracket is its error. This lags the true crossing by about t·se/slope,
  which differs by pair, so it is biased towards larger widths.
* ``crossing``: where D crosses zero. A straight line is fitted to D against
  ln N over the ``window`` compared sizes around the last upward sign change
  of D, and its root is the crossing. It has no such lag.

Both get an interval from a parametric bootstrap: each point's mean is
redrawn as mean + s·σ·z/sqrt(n_seeds), z standard normal, with σ the seed
noise of the pair and s = sqrt(dof/χ²_dof) drawn once per replicate, so that
each redrawn mean has the t distribution that σ's uncertainty implies. The
rule is reapplied to every replicate and the percentiles of the widths form
the interval; the fraction of replicates with an estimate is reported. The
paper rule answers only with brackets between compared sizes, so its
interval spans the brackets of the central replicates (edge to edge), not
their mid-widths, which would collapse to one value when most replicates
find the same bracket.

Seed noise σ is estimated per pair, pooled over the (depth, width) points of
the two depths (noise differs several-fold between shallow and deep nets).
A pair without repeated seeds falls back to the noise pooled over the whole
table, and says so. The significance test (``method``): ``"pooled"``, a
two-sample t-test with the pair's pooled σ and its degrees of freedom; or
``"welch"``, Welch's t-test with each point's own variance (a single-seed
point falls back to the pooled σ). ``loss_std`` (nats per token) replaces
σ with a known value (a z-test), for sweeps with one seed per point.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats

from analysis.comparison import (METHODS, PairComparison, PairData, PairNoise, compare_pair, pair_data,
                                 pair_noise)
from analysis.shapes import width_at
from analysis.errors import AnalysisInputError
from analysis.points import aggregate_seeds, pooled_seed_std

ESTIMATES = ("crossing", "paper")
# Compared sizes used for the line whose root is the crossing (about 3 either side of it).
CROSSING_WINDOW = 6


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    """One estimate's width over the bootstrap replicates (see the module docstring).

    ``interval`` is the (low, high) percentile interval of the widths, in
    channels, at the transition's ``confidence`` (for the paper rule: the
    edges of the brackets within those percentiles); None when fewer than two
    replicates gave a width. ``fraction`` is the share of replicates that gave
    one (0 to 1).
    """

    interval: tuple[float, float] | None
    fraction: float

    @property
    def enough(self) -> bool:
        """Whether at least half the replicates gave a width.

        A percentile interval over the few replicates that happen to give one
        describes those replicates, not the estimate, so it is not used then.
        """
        return self.fraction >= 0.5


@dataclasses.dataclass(frozen=True)
class PaperRule:
    """The paper rule's transition: the bracket where the shallower net turns significantly worse.

    ``params_before`` is the last compared size (non-embedding parameters)
    where the shallower net is not significantly worse, ``params_after`` the
    first where it is; ``width`` is the mean of the shallower depth's widths at
    the two and ``width_error`` their difference (channels). All four are None
    unless the rule found a transition in range (status "found"), while
    ``bootstrap`` is there whenever the pair was compared and resampled:
    replicates may find a transition that the observed means do not.
    """

    params_before: float | None = None
    params_after: float | None = None
    width: float | None = None
    width_error: float | None = None
    bootstrap: Bootstrap | None = None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The bootstrap interval (channels); None without one."""
        return self.bootstrap.interval if self.bootstrap is not None else None

    def estimate(self) -> tuple[float, float] | None:
        """(width, bracket) in channels, as in the paper; None without a transition."""
        return None if self.width is None else (self.width, self.width_error)

    def text(self, confidence: float) -> str:
        """Its bootstrap interval at ``confidence`` (0 to 1), or why none is quoted."""
        if self.bootstrap is not None and not self.bootstrap.enough:
            return (f"paper rule: {_percent(self.bootstrap.fraction)} of resamples find a transition, "
                    "too few for an interval")
        if not self.interval:
            return "paper rule: no bootstrap interval"
        low, high = self.interval
        return (f"paper rule {confidence:.0%} interval {low:.0f}–{high:.0f}, the brackets of the resamples "
                f"({_percent(self.bootstrap.fraction)} of resamples find one)")


@dataclasses.dataclass(frozen=True)
class ZeroCrossing:
    """Where the loss difference crosses zero: the root of a line fitted to it against ln N.

    ``width`` is the shallower depth's width there (channels); None when the
    difference has no upward sign change, or the fitted line does not rise.
    ``bootstrap`` is None without resampling or without a crossing.
    """

    width: float | None = None
    bootstrap: Bootstrap | None = None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The bootstrap interval (channels); None without one."""
        return self.bootstrap.interval if self.bootstrap is not None else None

    def estimate(self, confidence: float) -> tuple[float, float] | None:
        """(width, one-sigma width error) in channels; None if missing or too noisy to fit.

        The error is the bootstrap interval's half-width in ln d, divided by
        the normal quantile of ``confidence``, times the width. A crossing
        that fewer than half of the replicates reproduce (the fitted line does
        not rise in the rest) gives None.
        """
        if self.width is None or not self.interval or not self.bootstrap.enough:
            return None
        low, high = self.interval
        z = stats.norm.ppf(0.5 + confidence / 2)
        sigma_log = (math.log(high) - math.log(low)) / (2 * z)
        return (self.width, self.width * max(sigma_log, 1e-6)) if sigma_log >= 0 else None

    def text(self, confidence: float) -> str:
        """The crossing with its interval at ``confidence`` (0 to 1), and whether the fit can use it."""
        if self.width is None:
            return "no zero crossing of the loss difference in the compared range"
        text = f"zero crossing at width {self.width:.0f}"
        if self.interval:
            low, high = self.interval
            text += (f" ({confidence:.0%} interval {low:.0f}–{high:.0f}, "
                     f"{_percent(self.bootstrap.fraction)} of resamples cross)")
        if self.bootstrap is None or not self.bootstrap.enough:
            text += "; too few resamples cross to use it in the fit"
        return text


@dataclasses.dataclass(frozen=True)
class Transition:
    """Transition of one adjacent depth pair, by both estimates.

    ``status`` is the paper rule's outcome: "found", "below_range" (already
    significantly worse at the smallest compared size), "above_range" (never
    significantly worse in the compared range) or "no_overlap" (fewer than
    two comparable sizes). ``paper`` and ``crossing`` hold the two estimates,
    each with its bootstrap interval at ``confidence``. ``reversed_params`` is
    the first size above the first deeper-better one where the shallower net
    is significantly better again (the opposite of the predicted order), or
    None. Widths are the shallower depth's, in channels; params in parameters.
    """

    shallow_depth: int
    deep_depth: int
    status: str
    message: str
    comparison: PairComparison | None = None
    noise: PairNoise | None = None
    paper: PaperRule = PaperRule()
    crossing: ZeroCrossing = ZeroCrossing()
    confidence: float = 0.95
    reversed_params: float | None = None

    @property
    def found(self) -> bool:
        return self.status == "found"

    def estimate(self, which: str) -> tuple[float, float] | None:
        """(width, one-sigma width error) in channels for ``which`` of ``ESTIMATES``; None if missing.

        The paper rule's error is its bracket (as in the paper); the
        crossing's comes from its bootstrap interval (``ZeroCrossing.estimate``).
        """
        if which == "paper":
            return self.paper.estimate()
        if which == "crossing":
            return self.crossing.estimate(self.confidence)
        raise AnalysisInputError(f"unknown estimate {which!r}; choose from {', '.join(ESTIMATES)}")

    def size_lines(self) -> list[str]:
        """One text line per compared size: both losses, the difference with its interval, the verdict. The
        sizes are the shallower depth's (its width is named); the deeper depth's loss there is interpolated in
        ln N between its own sizes (``analysis.comparison``), and the line says so."""
        if self.comparison is None:
            return []
        shallow, deep = self.shallow_depth, self.deep_depth
        return [f"N={row['params']:.3g} (L={shallow} width {row['width']:.0f}): L={shallow} {row['loss_shallow']:.4f}, "
                f"L={deep} {row['loss_deep']:.4f} (interpolated in ln N), difference {row['diff']:+.4f} "
                f"({row['interval_level']:.0%} interval {row['diff_interval'][0]:+.4f} to "
                f"{row['diff_interval'][1]:+.4f}): {row['verdict']}" for row in self.comparison.rows()]

    def to_dict(self) -> dict:
        """JSON-ready summary, flat: the schema of the committed ``fit.json`` files.

        The paper rule's fields appear as ``params_before``, ``params_after``,
        ``width``, ``width_error``, ``paper_ci`` and ``paper_fraction``; the
        crossing's as ``crossing_width``, ``crossing_ci`` and
        ``crossing_fraction`` (None where missing). Besides the fields:
        ``sizes`` is the per-size comparison (``PairComparison.rows``),
        ``largest_gap`` its row with the largest |diff|, and ``no_gain_params``
        the range of N where the deeper net was not (yet) significantly better,
        None when it was at the smallest size.
        """
        paper, crossing = self.paper, self.crossing
        out = {"shallow_depth": self.shallow_depth, "deep_depth": self.deep_depth, "status": self.status,
               "message": self.message, "params_before": paper.params_before, "params_after": paper.params_after,
               "width": paper.width, "width_error": paper.width_error,
               "paper_fraction": paper.bootstrap.fraction if paper.bootstrap else None,
               "crossing_width": crossing.width,
               "crossing_fraction": crossing.bootstrap.fraction if crossing.bootstrap else None,
               "confidence": self.confidence, "reversed_params": self.reversed_params}
        rows = self.comparison.rows() if self.comparison is not None else []
        out["sizes"] = rows
        out["largest_gap"] = max(rows, key=lambda row: abs(row["diff"])) if rows else None
        no_gain = self.comparison.no_gain_range() if self.comparison is not None else None
        out["no_gain_params"] = list(no_gain) if no_gain else None
        out["paper_ci"] = list(paper.interval) if paper.interval else None
        out["crossing_ci"] = list(crossing.interval) if crossing.interval else None
        out["noise"] = dataclasses.asdict(self.noise) if self.noise else None
        if out["noise"] and math.isinf(out["noise"]["dof"]):
            out["noise"]["dof"] = None
        return {key: _plain(value) for key, value in out.items()}


def _plain(value):
    if isinstance(value, (np.floating, float)):
        return None if not math.isfinite(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _last_upward_change(diff) -> int | None:
    """Index i of the last pair (i, i+1) with diff[i] <= 0 < diff[i+1]; None if there is none."""
    ups = np.flatnonzero((diff[:-1] <= 0) & (diff[1:] > 0))
    return int(ups[-1]) if ups.size else None


def crossing_window(diff, window: int = CROSSING_WINDOW) -> slice | None:
    """The compared sizes (a slice) around the last upward sign change of ``diff``; None if none."""
    index = _last_upward_change(np.asarray(diff, dtype=float))
    if index is None:
        return None
    half = window // 2
    low = max(0, index + 1 - half)
    high = min(len(diff), low + window)
    return slice(max(0, high - window), high)


def line_roots(x, diff):
    """Root in x of the least-squares line through (x, diff) per row of ``diff``; NaN if not rising."""
    diff = np.atleast_2d(diff)
    centred = x - x.mean()
    slope = (diff * centred).sum(axis=1) / (centred ** 2).sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        root = x.mean() - diff.mean(axis=1) / slope
    return np.where(slope > 0, root, np.nan)


def paper_rule_brackets(diff, threshold):
    """Per row of ``diff``, the index k of the first significantly worse size: the bracket is (k-1, k).

    ``threshold`` = critical·se per size (nats). NaN where the first worse size
    is the smallest one or no size is worse.
    """
    worse = np.atleast_2d(diff) > threshold
    first = np.argmax(worse, axis=1)
    valid = worse.any(axis=1) & (first >= 1)
    return np.where(valid, first, np.nan)


def paper_rule(diff, threshold, widths):
    """The paper rule's width per row of ``diff``: mean width of the last not-worse and first worse size.

    ``threshold`` = critical·se per size (nats). NaN where the first worse size
    is the smallest one or no size is worse.
    """
    first = paper_rule_brackets(diff, threshold)
    found = np.isfinite(first)
    index = np.where(found, first, 1).astype(int)
    return np.where(found, 0.5 * (widths[index - 1] + widths[index]), np.nan)


def _bracket_bootstrap(first, widths, confidence) -> Bootstrap:
    """The widths spanned by the brackets of the central ``confidence`` of the replicates that find one.

    The paper rule can only answer with a bracket between two compared sizes,
    so percentiles of its mid-widths collapse to one value (an interval
    "244–244") whenever most replicates find the same bracket. The interval
    is instead the lower edge of the lowest and the upper edge of the highest
    of those brackets (channels): the widths inside which the transition lies
    in at least ``confidence`` of the replicates that find one.
    """
    found = first[np.isfinite(first)]
    fraction = found.size / max(first.size, 1)
    if found.size < 2:
        return Bootstrap(None, fraction)
    tail = 50.0 * (1.0 - confidence)
    low = int(np.percentile(found, tail, method="lower"))
    high = int(np.percentile(found, 100.0 - tail, method="higher"))
    return Bootstrap((float(widths[low - 1]), float(widths[high])), fraction)


def _classify(shallow, deep, comparison: PairComparison | None) -> dict:
    """Transition fields from the significance test alone: status, message, reversed_params, paper (no bootstrap)."""
    pair = f"L={shallow} vs L={deep}"
    if comparison is None:
        return {"status": "no_overlap", "paper": PaperRule(),
                "message": f"{pair}: fewer than two sizes where both depths were trained; cannot compare"}
    worse = np.flatnonzero(comparison.worse)
    n, w = comparison.params, comparison.widths
    if worse.size == 0:
        return {"status": "above_range", "paper": PaperRule(), "message": (
            f"{pair}: no transition in range: the shallower net is never significantly worse up to "
            f"N={n[-1]:.3g} (width {w[-1]:.0f}); the transition lies above or is not resolved")}
    k = int(worse[0])
    # The predicted order is shallower-better, then deeper-better. A shallower net that is
    # significantly better again above the first deeper-better size contradicts it; that is
    # worth a warning (a depth-dependent learning rate is one cause), not a transition.
    again = np.flatnonzero(comparison.better[k + 1:])
    reversed_params = float(n[k + 1 + again[0]]) if again.size else None
    reversal = "" if reversed_params is None else (
        f"; but the shallower net is significantly better again at N={reversed_params:.3g} "
        f"(width {w[k + 1 + again[0]]:.0f}), the opposite of the predicted order")
    if k == 0:
        return {"status": "below_range", "paper": PaperRule(), "reversed_params": reversed_params, "message": (
            f"{pair}: no transition in range: the shallower net is already significantly worse at the "
            f"smallest compared size N={n[0]:.3g} (width {w[0]:.0f}); the transition lies below" + reversal)}
    before = "significantly better" if comparison.better[k - 1] else "indistinguishable"
    width, error = 0.5 * (w[k - 1] + w[k]), abs(w[k] - w[k - 1])
    return {"status": "found", "reversed_params": reversed_params,
            "paper": PaperRule(params_before=n[k - 1], params_after=n[k], width=width, width_error=error),
            "message": (f"{pair}: shallower net {before} at N={n[k - 1]:.3g} (width {w[k - 1]:.0f}), "
                        f"significantly worse at N={n[k]:.3g} (width {w[k]:.0f}); "
                        f"transition width {width:.0f} ± {error:.0f} (paper rule)" + reversal)}


def _resampled_means(rows: pd.DataFrame, noise: PairNoise, scale, rng) -> np.ndarray:
    """Seed means redrawn around the observed ones: (replicates, points), nats per token."""
    n = rows["n_seeds"].to_numpy(float)
    z = rng.standard_normal((scale.size, n.size))
    return rows["loss_mean"].to_numpy(float) + scale[:, None] * noise.std * z / np.sqrt(n)


def _percent(fraction: float) -> str:
    """A fraction as a percentage that does not round a few resamples down to 0% or up to 100%."""
    if 0 < fraction < 0.01 or 0.99 < fraction < 1:
        return f"{fraction:.1%}"
    return f"{fraction:.0%}"


def _bootstrap(samples, confidence, to_width=float) -> Bootstrap:
    """Percentile interval of the finite ``samples`` (one per replicate, NaN: no estimate), as widths.

    ``to_width`` maps a sample to a width in channels; it must be increasing.
    """
    found = samples[np.isfinite(samples)]
    fraction = found.size / max(samples.size, 1)
    if found.size < 2:
        return Bootstrap(None, fraction)
    tail = 50.0 * (1.0 - confidence)
    low, high = np.percentile(found, [tail, 100.0 - tail])
    return Bootstrap((to_width(low), to_width(high)), fraction)


def _estimates(data: PairData, comparison: PairComparison, shallow: int, noise: PairNoise,
               n_bootstrap: int, confidence: float, window: int, rng) -> tuple[Bootstrap | None, ZeroCrossing]:
    """The paper rule's bootstrap (None when ``n_bootstrap`` is 0) and the zero crossing with its own."""

    def to_width(log_params):
        return float(width_at(np.exp(log_params), shallow))

    threshold = comparison.critical * comparison.se
    span = crossing_window(comparison.diff, window)
    root = line_roots(data.x[span], comparison.diff[span])[0] if span is not None else math.nan
    crossing_width = to_width(root) if np.isfinite(root) else None
    if n_bootstrap <= 0:
        return None, ZeroCrossing(crossing_width)
    dof = noise.dof
    scale = np.ones(n_bootstrap) if math.isinf(dof) else np.sqrt(dof / rng.chisquare(dof, n_bootstrap))
    diff = (_resampled_means(data.low, noise, scale, rng)[:, data.keep]
            - _resampled_means(data.high, noise, scale, rng) @ data.matrix)
    paper = _bracket_bootstrap(paper_rule_brackets(diff, threshold), comparison.widths, confidence)
    if crossing_width is None:
        return paper, ZeroCrossing()
    roots = line_roots(data.x[span], diff[:, span])
    return paper, ZeroCrossing(crossing_width, _bootstrap(roots, confidence, to_width))


def find_transitions(runs: pd.DataFrame, alpha: float = 0.05, method: str = "pooled",
                     loss_std: float | None = None, n_bootstrap: int = 1000,
                     confidence: float = 0.95, seed: int = 0,
                     window: int = CROSSING_WINDOW) -> tuple[list[Transition], str]:
    """Transition widths, by both estimates, for every adjacent depth pair of a per-run table.

    ``runs`` has the columns depth, width, params (12·L·d²), seed, loss (nats
    per token), one learning rate per shape. Returns the transitions (one per
    adjacent pair, in depth order) and a one-line description of the test.
    Raises ``SingleSeedError`` when no point has repeated seeds and no
    ``loss_std`` is given.
    """
    if method not in METHODS:
        raise AnalysisInputError(f"unknown significance test {method!r}; choose from {', '.join(METHODS)}")
    if not 0 < alpha < 1:
        raise AnalysisInputError(f"alpha must lie in (0, 1), got {alpha}")
    if not 0 < confidence < 1:
        raise AnalysisInputError(f"confidence must lie in (0, 1), got {confidence}")
    if n_bootstrap < 0:
        raise AnalysisInputError(f"the number of bootstrap resamples must be >= 0, got {n_bootstrap}")
    if window < 2:
        raise AnalysisInputError(f"the crossing window needs 2 or more sizes, got {window}")
    if loss_std is not None and not (loss_std > 0 and math.isfinite(loss_std)):
        raise AnalysisInputError(f"--loss-std must be positive and finite, got {loss_std}")
    points = aggregate_seeds(runs)
    depths = sorted(points["depth"].unique().tolist())
    if len(depths) < 2:
        raise AnalysisInputError(f"need two or more depths to find transitions, found only {depths}")
    std, dof = pooled_seed_std(runs)
    table_noise = PairNoise(std, float(dof), "pooled over the whole table") if dof > 0 and std > 0 else None
    rng = np.random.default_rng(seed)
    transitions = []
    for shallow, deep in zip(depths[:-1], depths[1:]):
        noise = pair_noise(runs, shallow, deep, table_noise, loss_std)
        data = pair_data(points, shallow, deep)
        comparison = None if data is None else compare_pair(data, shallow, method, noise, alpha)
        fields = _classify(shallow, deep, comparison)
        if comparison is not None:
            paper_bootstrap, crossing = _estimates(data, comparison, shallow, noise, n_bootstrap, confidence,
                                                   window, rng)
            fields.update(paper=dataclasses.replace(fields["paper"], bootstrap=paper_bootstrap),
                          crossing=crossing, confidence=confidence)
        transitions.append(Transition(shallow_depth=int(shallow), deep_depth=int(deep), comparison=comparison,
                                      noise=noise, **fields))
    name = "pooled two-sample t-test" if method == "pooled" else "Welch t-test"
    where = "known seed std" if loss_std is not None else "seed noise pooled per depth pair"
    return transitions, f"{name}, one-sided alpha={alpha:g}, {where}"


def transition_points(transitions: list[Transition], estimate: str = "paper"):
    """Arrays (depth in layers, width and one-sigma width error in channels) of one estimate's transitions.

    ``estimate`` is "paper" (the significance rule, error = bracket) or
    "crossing" (zero crossing, error from its bootstrap interval).
    """
    found = [(t.shallow_depth, t.estimate(estimate)) for t in transitions]
    found = [(depth, value) for depth, value in found if value is not None]
    return (np.array([depth for depth, _ in found], dtype=float),
            np.array([value[0] for _, value in found], dtype=float),
            np.array([value[1] for _, value in found], dtype=float))
