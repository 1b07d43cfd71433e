"""Transition size N_tr(L) ± ΔN (eq. 9) and the optimal depth and width for a budget.

With the fitted transition width d = e^a·e^{bL}, the size at which depth L
stops being too shallow is N_tr(L) = 12·L·e^{2a}·e^{2bL} parameters. Its error
comes from first-order propagation with the full covariance of (a, b), using
∂N/∂a = 2N and ∂N/∂b = 2L·N. Above the curve a net is too shallow for its
size; below it, too deep. So the best depth for a budget N is the root of
N_tr(L) = N, and the best width is sqrt(N / (12·L)).

The band around N_tr is drawn and solved in ln N: ln N_tr ± ΔN/N_tr, i.e.
N_tr·e^(±ΔN/N_tr). To first order this is eq. 9's N_tr ± ΔN, but it stays
positive where the first-order ΔN exceeds N_tr (as it does at large L for
a fit from a few noisy transitions), so it can be drawn on a log axis and
always bounds the depth:
the roots of N_tr(L)·e^(±ΔN/N_tr) = N give ``depth_low`` and ``depth_high``.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from analysis.fit import LogWidthFit, load_fit
from analysis.errors import AnalysisInputError
from analysis.shapes import non_embedding_params, width_at

# Eq. 10 of Levine et al. 2020, with their reported goodness of fit.
FIT_PRESETS = {
    # Its six transitions are those of the shallower nets of the paper's adjacent depth pairs
    # (networks of depths 6 to 48), so the fit covers L = 6 to 36.
    "levine2020": LogWidthFit(a=5.039, b=5.55e-2, cov=((9.4e-4, -3.74e-5), (-3.74e-5, 1.7e-6)),
                              name="levine2020", r2=0.998, chi2_red=0.854, n_points=6,
                              depth_range=(6.0, 36.0), estimate="paper"),
}


@dataclasses.dataclass(frozen=True)
class Budget:
    """A parameter budget (non-embedding parameters), optionally with the shape it was trained at."""

    name: str
    params: float
    trained_depth: int | None = None
    trained_width: int | None = None

    @classmethod
    def from_shape(cls, name: str, depth: int, width: int) -> "Budget":
        """Budget of a trained shape: N = 12·L·d² parameters."""
        return cls(name, float(non_embedding_params(depth, width)), depth, width)

    @classmethod
    def from_params(cls, params: float) -> "Budget":
        """A budget given only as a parameter count, named by it: 1.25e8 -> '125M budget'."""
        return cls(f"{short_count(params)} budget", float(params))


def short_count(value: float) -> str:
    """A parameter count to three significant figures with a suffix: 125M, 1.3B, 175B, 2T (else 1e+30)."""
    value = float(f"{value:.3g}")  # rounded first, so that 999.9M reads 1B, not 1e+03M
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if scale <= abs(value) < 1000 * scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


# Table 1's sizes are 12·L·d² of each trained shape (not the headline counts).
BUDGET_PRESETS = {
    "gpt3": (
        Budget.from_shape("GPT-3 Small", 12, 768),
        Budget.from_shape("GPT-3 Medium", 24, 1024),
        Budget.from_shape("GPT-3 Large", 24, 1536),
        Budget.from_shape("GPT-3 XL", 24, 2048),
        Budget.from_shape("GPT-3 2.7B", 32, 2560),
        Budget.from_shape("GPT-3 6.7B", 32, 4096),
        Budget.from_shape("GPT-3 13B", 40, 5140),
        Budget.from_shape("GPT-3 175B", 96, 12288),
        Budget("1T budget", 1e12),
    ),
    "gpt2": (
        Budget.from_shape("GPT-2 Small", 12, 768),
        Budget.from_shape("GPT-2 Medium", 24, 1024),
        Budget.from_shape("GPT-2 Large", 36, 1280),
        Budget.from_shape("GPT-2 XL", 48, 1600),
    ),
}

_SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_params(text: str) -> float:
    """Parse a parameter count: ``175e9``, ``1.3B``, ``800M``, ``2T``, ``50k`` -> parameters."""
    # The sign is read too, so that "-5" is told it must be positive rather than that it is unreadable.
    match = re.fullmatch(r"\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", str(text))
    if not match:
        raise AnalysisInputError(f"cannot read {text!r} as a parameter count (try 175e9, 1.3B or 800M)")
    value = float(match.group(1)) * _SUFFIXES[match.group(2).upper()]
    if not value > 0 or not math.isfinite(value):
        raise AnalysisInputError(f"parameter count must be positive, got {text!r}")
    return value


def resolve_fit(spec) -> LogWidthFit:
    """A fit from a preset name (e.g. ``levine2020``), a JSON path, or a ``LogWidthFit``."""
    if isinstance(spec, LogWidthFit):
        return spec
    if spec in FIT_PRESETS:
        return FIT_PRESETS[spec]
    from etils import epath  # here, not at the top: the command line starts without it

    if str(spec).endswith(".json") or epath.Path(str(spec)).exists():
        return load_fit(spec)
    raise AnalysisInputError(
        f"unknown fit {spec!r}: use a preset ({', '.join(FIT_PRESETS)}) or a JSON file saved by `fit --save`")


def transition_params(depth, fit: LogWidthFit):
    """N_tr(L) = 12·L·e^{2a}·e^{2bL} in parameters, at depth L (layers); broadcasts."""
    return non_embedding_params(depth, np.exp(fit.log_width(np.asarray(depth, dtype=float))))


def transition_params_error(depth, fit: LogWidthFit):
    """ΔN_tr(L) in parameters: eq. 9's first-order error with the full (a, b) covariance."""
    depth = np.asarray(depth, dtype=float)
    size = transition_params(depth, fit)
    # ∂N/∂a = 2N and ∂N/∂b = 2L·N, so ΔN = 2N·sqrt(σ_a² + 2L·σ_ab + L²·σ_b²).
    return 2.0 * size * fit.log_width_error(depth)


def transition_band(depth, fit: LogWidthFit):
    """(low, high) edges N_tr·e^(∓ΔN/N_tr) in parameters: the ±ΔN band in ln N, positive everywhere."""
    depth = np.asarray(depth, dtype=float)
    size = transition_params(depth, fit)
    relative = 2.0 * fit.log_width_error(depth)  # ΔN / N_tr
    return size * np.exp(-relative), size * np.exp(relative)


def _root_in_depth(gap, max_depth: float = 1e4) -> float:
    """Smallest depth in (0, max_depth] where ``gap`` changes sign from < 0 to >= 0; nan if none."""
    grid = np.concatenate([np.geomspace(1e-3, 1.0, 30, endpoint=False), np.linspace(1.0, max_depth, 20000)])
    with np.errstate(over="ignore", invalid="ignore"):
        values = gap(grid)
    change = np.flatnonzero((values[:-1] < 0) & (values[1:] >= 0))
    if change.size == 0:
        return math.nan
    return _bisect(gap, float(grid[change[0]]), float(grid[change[0] + 1]))


def _bisect(gap, low: float, high: float, tolerance: float = 1e-10) -> float:
    """The root of ``gap`` in [low, high], where gap(low) < 0 <= gap(high), to ``tolerance`` layers.

    Plain bisection rather than scipy's brentq: importing scipy.optimize takes
    about half a second, longer than a whole `optimal` query should, and ~35
    halvings of a half-layer bracket cost microseconds.
    """
    while high - low > tolerance:
        middle = 0.5 * (low + high)
        if gap(middle) < 0:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def _nearest_depth(centre: float, params: float, fit: LogWidthFit) -> int:
    """The integer depth next to the root whose N_tr is nearest the budget, in parameters.

    This is the paper's own reading ("L = 80, since N_tr(80) = 1.65e11" for a
    175B budget). It agrees with rounding the root except in a thin band just
    above a half layer (175e9 itself has root 80.51: N_tr(80) misses by 10.7B,
    N_tr(81) by 10.9B), where the choice is far inside the ±ΔN depth range.
    """
    candidates = sorted({max(1, math.floor(centre)), max(1, math.ceil(centre))})
    return min(candidates, key=lambda depth: abs(float(transition_params(depth, fit)) - params))


@dataclasses.dataclass(frozen=True)
class OptimalShape:
    """Optimal depth (layers) and width (channels) for a budget of ``params`` parameters.

    ``depth`` is the integer depth next to the continuous root
    ``depth_continuous`` whose N_tr is nearest N; ``width`` = sqrt(N / (12·depth)) and
    ``width_rounded`` that width rounded to a multiple of ``head_size``
    channels. ``depth_low`` and ``depth_high`` solve N_tr·e^(±ΔN/N_tr) = N.
    ``n_transition`` and ``delta_n`` are N_tr and ΔN at the integer depth.
    ``warning`` says when the depth lies outside the depths the fit was made
    from (an extrapolation), else None; ``fit_range`` says where it lies
    (``fit_range()``: inside, outside, far outside, unknown). ``budget_warning`` says when the
    rounded shape, depth × ``width_rounded``, holds more than 10% more or less
    than the budget (small budgets, where the width rounds to one head), else None.
"""

    params: float
    depth: int
    depth_continuous: float
    width: float
    depth_low: float
    depth_high: float
    n_transition: float
    delta_n: float
    fit: str
    a: float
    b: float
    width_rounded: int = 0
    head_size: int = 0
    warning: str | None = None
    budget_warning: str | None = None
    fit_range: str = "unknown"

    def to_dict(self) -> dict:
        """JSON-ready dict (nan becomes None)."""
        return {key: (None if isinstance(value, float) and not math.isfinite(value) else value)
                for key, value in dataclasses.asdict(self).items()}


# A depth more than this factor above the deepest (or below the shallowest) fitted depth is "far outside"
# the fit. The paper's own projections reach 2.6 times its deepest fitted depth (95 layers for a 1e12 budget,
# from depths 6 to 36); N_tr grows as e^(2bL), so 3 times that depth (108 layers, N_tr ≈ 5e12 under eq. 10)
# is already 10^4 times the largest fitted size.
FAR_FACTOR = 3.0


def fit_range(depth: float, fit: LogWidthFit) -> str:
    """Where ``depth`` (layers) lies against the depths ``fit`` was made from.

    "inside" (within half a layer of ``fit.depth_range``), "outside", "far outside"
    (beyond ``FAR_FACTOR`` times the range's ends), or "unknown" for a fit without a depth range.
    """
    if not fit.depth_range:
        return "unknown"
    low, high = fit.depth_range
    if low - 0.5 <= depth <= high + 0.5:
        return "inside"
    return "far outside" if depth > FAR_FACTOR * high or depth < low / FAR_FACTOR else "outside"


def extrapolation_warning(depth: float, fit: LogWidthFit) -> str | None:
    """A one-line warning when ``depth`` (layers) lies outside ``fit.depth_range``; None inside it.

    Far outside it (``FAR_FACTOR``), the warning says how far, in depth and in N_tr (parameters).
    """
    where = fit_range(depth, fit)
    if where in ("inside", "unknown"):
        return None
    low, high = fit.depth_range
    if where == "outside":
        side = "below" if depth < low else "above"
        return (f"extrapolated: depth {depth:.3g} lies {side} the depths L = {low:g} to {high:g} that fit "
                f"{fit.name} was made from; treat the result as a guess")
    edge = low if depth < low else high
    how = (f"1/{low / depth:.3g} of the shallowest" if depth < low else f"{depth / high:.3g} times the deepest")
    with np.errstate(over="ignore"):
        size_ratio = float(transition_params(depth, fit) / transition_params(edge, fit))
    return (f"extrapolated far outside the fit: depth {depth:.3g} is {how} of the depths L = {low:g} to {high:g} "
            f"that fit {fit.name} was made from (far: beyond {FAR_FACTOR:g} times), and N_tr there is "
            f"{size_ratio:.2g} times N_tr({edge:g}); the shape is the formula's output, not a prediction")


def optimal_shape(params: float, fit: LogWidthFit, head_size: int = 64) -> OptimalShape:
    """Optimal depth and width for ``params`` non-embedding parameters under ``fit``.

    ``head_size`` (channels per attention head) sets the rounding of ``width_rounded``.
    """
    if not (isinstance(head_size, int) and head_size >= 1):
        raise AnalysisInputError(f"head size must be a positive integer number of channels, got {head_size!r}")
    if not params > 0:
        raise AnalysisInputError(f"parameter count must be positive, got {params}")
    if not fit.b > 0:
        raise AnalysisInputError(f"fit {fit.name} has b = {fit.b:.3g} <= 0: N_tr(L) does not grow with depth")
    log_n = math.log(params)
    centre = _root_in_depth(lambda d: np.log(transition_params(d, fit)) - log_n)
    if not math.isfinite(centre):
        raise AnalysisInputError(f"no depth up to 10,000 layers has N_tr(L) = {params:.3g}")
    depth = _nearest_depth(centre, params, fit)

    def band(edge):
        return lambda d: np.log(transition_band(d, fit)[edge]) - log_n

    width = float(width_at(params, depth))
    width_rounded = int(max(1, round(width / head_size)) * head_size)
    return OptimalShape(
        params=float(params), depth=depth, depth_continuous=centre, width=float(width),
        depth_low=_root_in_depth(band(1)), depth_high=_root_in_depth(band(0)),
        n_transition=float(transition_params(depth, fit)),
        delta_n=float(transition_params_error(depth, fit)),
        fit=fit.name, a=fit.a, b=fit.b,
        width_rounded=width_rounded, head_size=head_size,
        warning=extrapolation_warning(centre, fit), fit_range=fit_range(centre, fit),
        budget_warning=rounding_warning(params, depth, width_rounded, head_size))


# How far the rounded shape's 12·L·d² may stray from the budget before it is called out.
BUDGET_TOLERANCE = 0.10


def rounding_warning(params: float, depth: int, width_rounded: int, head_size: int) -> str | None:
    """A one-line warning when depth × width_rounded holds a size more than 10% off ``params``; else None.

    Rounding to whole heads moves the size by about 2·(head_size/2)/width, so
    this fires only for small budgets: 1e3 parameters round up to one head of
    64 channels, a shape 49 times the budget.
    """
    size = float(non_embedding_params(depth, width_rounded))
    ratio = size / params
    if abs(ratio - 1.0) <= BUDGET_TOLERANCE:
        return None
    how = f"{ratio:.3g} times" if ratio > 1 else f"{ratio:.0%} of"
    return (f"rounded to the head size {head_size}, the width {width_rounded} gives 12·{depth}·{width_rounded}² = "
            f"{size:.3g} parameters, {how} the budget {params:.3g}; a smaller --head-size rounds finer")


def resolve_budgets(preset: str):
    """The budgets of a named preset (e.g. ``gpt3``)."""
    if preset not in BUDGET_PRESETS:
        raise AnalysisInputError(f"unknown budget preset {preset!r}; choose from {', '.join(BUDGET_PRESETS)}")
    return BUDGET_PRESETS[preset]


def optimal_table(budgets, fit: LogWidthFit) -> list[dict]:
    """One row per budget: name, params, trained and optimal depth/width, depth range, fit range.

    Widths in channels, depths in layers, params in non-embedding parameters;
    ``fit_range`` as ``OptimalShape.fit_range``.
    """
    rows = []
    for budget in budgets:
        shape = optimal_shape(budget.params, fit)
        rows.append({"name": budget.name, "params": budget.params,
                     "trained_depth": budget.trained_depth, "trained_width": budget.trained_width,
                     "optimal_depth": shape.depth, "optimal_width": shape.width,
                     "optimal_depth_continuous": shape.depth_continuous,
                     "depth_low": shape.to_dict()["depth_low"], "depth_high": shape.to_dict()["depth_high"],
                     "fit_range": shape.fit_range})
    return rows
