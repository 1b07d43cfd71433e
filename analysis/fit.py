"""Weighted least-squares fit of log(d) = a + b·L to transition widths (section 5.2).

Each transition contributes its shallower depth L (layers), its transition
width d (channels) and the width's error Δd. The error of log d is
σ = Δd / d (first-order propagation), and the fit weights each point by 1/σ².
The covariance is absolute (``absolute_sigma=True``): it comes from the given
errors, not rescaled by the scatter, so it is what eq. 9's error propagation
needs. The fit also reports R² (weighted, about the weighted mean of log d)
and the reduced chi-square χ²/(n - 2). Both need three or more points: a line
through two points has no degrees of freedom left to judge it by, so they are
None (and not printed) then. The fit remembers the depths it was made from,
so projections can say when they extrapolate.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from analysis.errors import AnalysisInputError


@dataclasses.dataclass(frozen=True)
class LogWidthFit:
    """Fit of log d = a + b·L (d in channels, L in layers, natural log).

    ``cov`` is the 2x2 covariance of (a, b). ``r2``, ``chi2_red`` and
    ``n_points`` describe the data the fit came from (None when unknown;
    ``r2`` and ``chi2_red`` are None below three points). ``depth_range``
    is (shallowest, deepest) depth of the fitted transitions in layers, None
    if unknown; ``estimate`` names the transition estimate that was fitted.
    """

    a: float
    b: float
    cov: tuple
    name: str = "fit"
    r2: float | None = None
    chi2_red: float | None = None
    n_points: int | None = None
    depth_range: tuple | None = None
    estimate: str | None = None

    def __post_init__(self):
        cov = np.asarray(self.cov, dtype=float)
        if cov.shape != (2, 2) or not np.all(np.isfinite(cov)):
            raise AnalysisInputError(f"fit {self.name}: cov must be a finite 2x2 matrix, got {self.cov!r}")
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            raise AnalysisInputError(f"fit {self.name}: a and b must be finite, got a={self.a}, b={self.b}")
        object.__setattr__(self, "cov", tuple(tuple(float(v) for v in row) for row in cov))
        if self.depth_range is not None:
            object.__setattr__(self, "depth_range", tuple(float(v) for v in self.depth_range))

    @property
    def dof(self) -> int | None:
        """Degrees of freedom left after fitting a and b (None when the point count is unknown)."""
        return None if self.n_points is None else self.n_points - 2

    @property
    def sigma_a(self) -> float:
        return math.sqrt(self.cov[0][0])

    @property
    def sigma_b(self) -> float:
        return math.sqrt(self.cov[1][1])

    @property
    def cov_ab(self) -> float:
        return self.cov[0][1]

    def log_width(self, depth):
        """Fitted log d (natural log of channels) at depth L (layers); broadcasts."""
        return self.a + self.b * np.asarray(depth, dtype=float)

    def log_width_error(self, depth):
        """One-sigma error of the fitted log d at depth L, from the full covariance."""
        depth = np.asarray(depth, dtype=float)
        return np.sqrt(self.cov[0][0] + 2 * depth * self.cov_ab + depth ** 2 * self.cov[1][1])

    def describe(self) -> str:
        """One line: a, b with errors, covariance and goodness of fit."""
        text = (f"{self.name}: a = {self.a:.4g} ± {self.sigma_a:.2g}, b = {self.b:.4g} ± {self.sigma_b:.2g}, "
                f"cov_ab = {self.cov_ab:.3g}")
        if self.dof is not None and self.dof < 1:
            return text + f" ({self.n_points} points, 0 degrees of freedom: no goodness of fit)"
        if self.r2 is not None:
            text += f", R² = {self.r2:.4f}"
        if self.chi2_red is not None:
            text += f", χ²_red = {self.chi2_red:.3f}"
        if self.n_points is not None:
            text += f" ({self.n_points} points, {self.dof} degree{'s' if self.dof != 1 else ''} of freedom)"
        return text

    def to_dict(self) -> dict:
        """JSON-ready dict with a, b, cov and the goodness-of-fit fields."""
        return {"name": self.name, "a": self.a, "b": self.b, "cov": [list(row) for row in self.cov],
                "sigma_a": self.sigma_a, "sigma_b": self.sigma_b, "r2": self.r2,
                "chi2_red": self.chi2_red, "n_points": self.n_points, "dof": self.dof,
                "depth_range": list(self.depth_range) if self.depth_range else None, "estimate": self.estimate}


def _line(depth, a, b):
    return a + b * depth


def _line_jacobian(depth, a, b):
    # Exact derivatives: the covariance then carries no finite-difference error.
    return np.stack([np.ones_like(depth), depth], axis=1)


def fit_log_width(depths, widths, width_errors, name: str = "fit", estimate: str | None = None) -> LogWidthFit:
    """Weighted fit of log d = a + b·L with absolute errors σ_log d = Δd / d.

    ``depths`` in layers, ``widths`` and ``width_errors`` in channels (one per
    transition). Needs two or more distinct depths; χ²_red needs three points.
    """
    depths, widths, errors = (np.asarray(v, dtype=float) for v in (depths, widths, width_errors))
    if not depths.shape == widths.shape == errors.shape or depths.ndim != 1:
        raise AnalysisInputError("depths, widths and width errors must be 1-D arrays of one length")
    if np.unique(depths).size < 2:
        raise AnalysisInputError(
            f"not enough points for the fit: need transitions at 2 or more depths, have {depths.size}")
    if not (np.all(np.isfinite(widths)) and np.all(widths > 0)):
        raise AnalysisInputError("transition widths must be positive and finite")
    if not (np.all(np.isfinite(errors)) and np.all(errors > 0)):
        raise AnalysisInputError("width errors must be positive and finite (they set the fit weights)")
    # Imported here: scipy.optimize alone takes about half a second, and the query commands
    # (`optimal`, `table`, `transition-size`) load this module without ever fitting.
    from scipy.optimize import curve_fit

    log_width = np.log(widths)
    sigma = errors / widths
    (a, b), cov = curve_fit(_line, depths, log_width, p0=(log_width.mean(), 0.0), sigma=sigma,
                            absolute_sigma=True, jac=_line_jacobian)
    weights = 1.0 / sigma ** 2
    residual = log_width - _line(depths, a, b)
    chi2 = float(np.sum(weights * residual ** 2))
    mean = np.average(log_width, weights=weights)
    spread = float(np.sum(weights * (log_width - mean) ** 2))
    dof = depths.size - 2
    r2 = 1.0 - chi2 / spread if spread > 0 and dof >= 1 else None
    return LogWidthFit(a=float(a), b=float(b), cov=cov, name=name, r2=r2,
                       chi2_red=chi2 / dof if dof >= 1 else None, n_points=int(depths.size),
                       depth_range=(float(depths.min()), float(depths.max())), estimate=estimate)


def save_fit(fit: LogWidthFit, path) -> None:
    """Write the fit to ``path`` (local or ``gs://``) as JSON (a, b, cov and fit statistics)."""
    from etils import epath  # in the functions that use it: the command line starts without it

    epath.Path(path).write_text(json.dumps(fit.to_dict(), indent=2) + "\n")


def load_fit(path) -> LogWidthFit:
    """Read a fit written by ``save_fit`` (or any JSON with a, b and a 2x2 cov), local or ``gs://``."""
    from etils import epath

    path = epath.Path(path)
    if not path.is_file():
        raise AnalysisInputError(f"{path}: no such fit file (and not a preset name)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise AnalysisInputError(f"{path}: fit file is not valid JSON") from None
    missing = [key for key in ("a", "b", "cov") if not isinstance(data, dict) or key not in data]
    if missing:
        raise AnalysisInputError(f"{path}: fit file lacks {', '.join(missing)}")
    try:
        return LogWidthFit(a=float(data["a"]), b=float(data["b"]), cov=data["cov"],
                           name=data.get("name") or path.stem, r2=data.get("r2"),
                           chi2_red=data.get("chi2_red"), n_points=data.get("n_points"),
                           depth_range=data.get("depth_range"), estimate=data.get("estimate"))
    except (TypeError, ValueError) as error:
        raise AnalysisInputError(f"{path}: bad fit values ({error})") from None
