"""Separation-rank bounds of Levine et al. 2020, sections 3-4 (Theorems 1 and 2).

The analysed network has depth L (layers), width d_x (channels) and H heads
per layer. The depth threshold L_th = log₃(d_x) splits two regimes:

* L < log₃ d_x (Theorem 1): log₃ of the separation rank lies between
  3^(L-2)·(log₃(d_x - H) + 2 - L - log₃ 2) and ((3^L - 1)/2)·log₃(d_x + H),
  i.e. it grows like 3^L: deepening beats any reasonable widening.
* L > log₃ d_x (Theorem 2): it lies between
  d_x·L/2 - L·(H/2 + 1) - d_x·(1 + log₃((d_x - H)/2)/2) and
  2·d_x·L + L - 2·d_x·log₃(d_x)/sqrt(2e) + log₃ d_x,
  i.e. it grows like d_x·L: depth and width count alike.

All bounds are on log₃(sep) (dimensionless). Each function is vectorised and
returns nan where its theorem does not apply. The formulas are returned as
the theorems state them, so Theorem 2's lower bound can be negative just
above the threshold; since sep >= 1, such a bound is vacuous, and
``bounds_table`` (what to print) clips it to 0 and says so.
"""

from __future__ import annotations

import math

import numpy as np

_LOG3_2 = math.log(2.0, 3.0)


def log3(x):
    """Base-3 logarithm, elementwise."""
    return np.log(np.asarray(x, dtype=float)) / math.log(3.0)


def depth_threshold(width):
    """L_th = log₃(d_x) in layers, for width d_x in channels."""
    return log3(width)


def _broadcast(depth, width, heads):
    depth, width, heads = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (depth, width, heads)))
    if np.any(heads < 1) or np.any(heads >= width):
        raise ValueError("need 1 <= heads < width (the head dimension d_x/H must be positive)")
    return depth, width, heads


def theorem1_bounds(depth, width, heads):
    """(lower, upper) bounds on log₃ sep below the threshold, L < log₃ d_x; nan elsewhere."""
    depth, width, heads = _broadcast(depth, width, heads)
    offset = 2.0 - depth - _LOG3_2
    lower = 3.0 ** (depth - 2.0) * (log3(width - heads) + offset)
    upper = (3.0 ** depth - 1.0) / 2.0 * log3(width + heads)
    applies = depth < depth_threshold(width)
    return np.where(applies, lower, np.nan), np.where(applies, upper, np.nan)


def theorem2_bounds(depth, width, heads):
    """(lower, upper) bounds on log₃ sep above the threshold, L > log₃ d_x; nan elsewhere."""
    depth, width, heads = _broadcast(depth, width, heads)
    b1 = -depth * (heads / 2.0 + 1.0)
    b2 = -width * (1.0 + 0.5 * log3((width - heads) / 2.0))
    c1 = depth
    c2 = -2.0 * width * log3(width) / math.sqrt(2.0 * math.e) + log3(width)
    lower = 0.5 * width * depth + b1 + b2
    upper = 2.0 * width * depth + c1 + c2
    applies = depth > depth_threshold(width)
    return np.where(applies, lower, np.nan), np.where(applies, upper, np.nan)


def separation_rank_bounds(depth, width, heads):
    """(lower, upper) bounds on log₃ sep from whichever theorem applies; nan on the threshold."""
    low1, up1 = theorem1_bounds(depth, width, heads)
    low2, up2 = theorem2_bounds(depth, width, heads)
    return np.where(np.isnan(low1), low2, low1), np.where(np.isnan(up1), up2, up1)


def bounds_table(depth, width, heads) -> dict:
    """Bounds on log₃ sep per depth, ready to print, with vacuous lower bounds clipped to 0.

    Theorem 2's lower bound is negative just above the threshold (e.g. about
    -200 at L = 7 for d_x = 768, H = 12). The separation rank is at least 1,
    so log₃ sep >= 0 always holds and a negative bound says nothing: the
    table shows 0 there and flags the row ``lower_vacuous``. Returns a dict
    of equal-length arrays: depth, theorem (1, 2, or 0 on the threshold),
    lower, upper (log₃ sep) and lower_vacuous (bool).
    """
    depth = np.atleast_1d(np.asarray(depth, dtype=float))
    low1, _ = theorem1_bounds(depth, width, heads)
    lower, upper = separation_rank_bounds(depth, width, heads)
    theorem = np.where(np.isfinite(low1), 1, np.where(np.isfinite(lower), 2, 0))
    vacuous = np.isfinite(lower) & (lower < 0)
    return {"depth": depth, "theorem": theorem, "lower": np.where(vacuous, 0.0, lower), "upper": upper,
            "lower_vacuous": vacuous}
