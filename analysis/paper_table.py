"""Table 1 of Levine et al. 2020 as published, and why our recomputation differs, row by row.

``python -m analysis table --preset gpt3`` solves N_tr(L) = N with the
published fit (eq. 10) for each GPT-3 shape. Most rows come out as printed;
a few do not. This module holds the printed values and works out, for each
row, which reading of the fit reproduces them, so the table can say how it
differs instead of leaving the reader to guess:

* **Depth.** Ours is the integer next to the root whose N_tr is nearer the
  budget. The published a and b are rounded (a = 5.039, b = 5.55e-2), so the
  paper may have solved with slightly different values; we solve again at
  the corners of the rounding intervals (±half a unit in the last printed
  digit) and say whether that can move the depth to the printed one.
* **Width.** The candidates are sqrt(N / (12·L)) at the printed depth, and the
  fit's own transition width e^(a + b·L), each rounded or cut to three
  significant figures (the precision of the printed widths).

Nothing here is fitted: the printed numbers below are the table's data, the
explanations are computed from them.
"""

from __future__ import annotations

import dataclasses
import decimal
import math

from analysis import projection
from analysis.shapes import non_embedding_params, width_at

# Table 1 as printed: optimal depth (layers) and width (channels) per GPT-3 shape and for a 1e12 budget.
PUBLISHED = {
    "GPT-3 Small": (23, 555), "GPT-3 Medium": (32, 886), "GPT-3 Large": (38, 1220),
    "GPT-3 XL": (42, 1550), "GPT-3 2.7B": (47, 2110), "GPT-3 6.7B": (54, 3150),
    "GPT-3 13B": (60, 4200), "GPT-3 175B": (80, 13500), "1T budget": (95, 30100),
}
# Eq. 10's a and b to the digits printed; their last digit sets how far the values the paper solved with may lie.
PUBLISHED_A, PUBLISHED_B = "5.039", "5.55e-2"
SIGNIFICANT_FIGURES = 3  # of the printed widths


def half_unit(printed: str) -> float:
    """Half a unit in the last printed digit of ``printed`` ("5.039" -> 0.0005, "5.55e-2" -> 5e-5)."""
    return 0.5 * 10.0 ** decimal.Decimal(printed).as_tuple().exponent


def round_significant(value: float, figures: int = SIGNIFICANT_FIGURES) -> float:
    """``value`` rounded to ``figures`` significant figures."""
    return float(f"{value:.{figures - 1}e}")


def cut_significant(value: float, figures: int = SIGNIFICANT_FIGURES) -> float:
    """``value`` cut (rounded towards zero) to ``figures`` significant figures."""
    scale = 10.0 ** (math.floor(math.log10(abs(value))) - figures + 1)
    return math.floor(value / scale) * scale


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One row of Table 1 against its recomputation.

    ``depth`` and ``width`` are ours (layers, channels, unrounded width);
    ``paper_depth`` and ``paper_width`` the printed ones; ``note`` says how the
    printed values arise, and ``same`` whether depth and width (to three
    significant figures) agree.
    """

    name: str
    depth: int
    width: float
    paper_depth: int
    paper_width: int
    root: float
    root_range: tuple
    note: str

    @property
    def same(self) -> bool:
        return self.depth == self.paper_depth and round_significant(self.width) == self.paper_width

    @property
    def summary(self) -> str:
        """A few words for a table cell: "same", or which of L and d differ ("L, d: see --explain"; ``note`` says why)."""
        differs = [name for name, same in (("L", self.depth == self.paper_depth),
                                           ("d", round_significant(self.width) == self.paper_width)) if not same]
        if not differs:
            return "same"
        return f"{', '.join(differs)}: see --explain"

    def to_dict(self) -> dict:
        return {"paper_depth": self.paper_depth, "paper_width": self.paper_width,
                "paper_depth_difference": self.paper_depth - self.depth,
                "paper_width_difference_percent": 100.0 * (self.paper_width / self.width - 1.0),
                "root_range_published_digits": list(self.root_range), "paper_summary": self.summary,
                "paper_note": self.note}


def _fit_corners(fit):
    """The fit with a and b moved to each corner of their published rounding intervals (same covariance)."""
    da, db = half_unit(PUBLISHED_A), half_unit(PUBLISHED_B)
    return [dataclasses.replace(fit, a=fit.a + sa * da, b=fit.b + sb * db) for sa in (-1, 1) for sb in (-1, 1)]


def _width_note(params: float, paper_depth: int, paper_width: int, fit) -> str:
    """How the printed width arises at the printed depth, or that none of the candidates gives it."""
    balanced = float(width_at(params, paper_depth))
    if round_significant(balanced) == paper_width:
        return ""
    if cut_significant(balanced) == paper_width:
        return (f"d: sqrt(N/(12·{paper_depth})) = {balanced:,.1f} cut to {SIGNIFICANT_FIGURES} significant figures "
                f"(rounding gives {round_significant(balanced):,.0f})")
    fitted = [math.exp(corner.a + corner.b * paper_depth) for corner in [fit, *_fit_corners(fit)]]
    if min(fitted) <= paper_width <= max(fitted) or round_significant(fitted[0]) == paper_width:
        return (f"d: the fit's transition width e^(a+b·{paper_depth}) = {fitted[0]:,.0f}, not "
                f"sqrt(N/(12·{paper_depth})) = {balanced:,.0f}; {paper_depth} × {paper_width:,} holds "
                f"12·L·d² = {non_embedding_params(paper_depth, paper_width):.3g}, not N")
    return f"d: not sqrt(N/(12·L)) = {balanced:,.0f} nor e^(a+b·L) = {fitted[0]:,.0f} at L = {paper_depth}"


def _digits() -> str:
    """The published a and b with the half unit of their last digit, e.g. 'a in 5.039 ± 0.0005'."""
    return (f"a in {float(PUBLISHED_A):g} ± {half_unit(PUBLISHED_A):g} and "
            f"b in {float(PUBLISHED_B):g} ± {half_unit(PUBLISHED_B):g}")


def _depth_note(depth: int, root: float, corners: list, paper_depth: int, params: float) -> str:
    """Why the printed depth differs from ours (empty when it does not); ``corners``: shapes at the corner fits."""
    if paper_depth == depth:
        return ""
    low, high = min(c.depth_continuous for c in corners), max(c.depth_continuous for c in corners)
    if paper_depth in {c.depth for c in corners}:
        return f"L: root {root:.2f}, {low:.2f}–{high:.2f} for {_digits()}: a, b within the printed digits give {paper_depth}"
    direction = "up" if paper_depth > root else "down"
    return (f"L: root {root:.2f}, and {low:.2f}–{high:.2f} for any {_digits()} (the printed digits), so {depth}; "
            f"the printed {paper_depth} is the root rounded {direction}; "
            f"d = sqrt(N/(12·{paper_depth})) = {width_at(params, paper_depth):,.1f} follows from it")


def compare(budget, fit) -> Comparison | None:
    """Our optimal shape for ``budget`` against Table 1's printed one; None if the table lacks the row."""
    if budget.name not in PUBLISHED:
        return None
    paper_depth, paper_width = PUBLISHED[budget.name]
    shape = projection.optimal_shape(budget.params, fit)
    corners = [projection.optimal_shape(budget.params, corner) for corner in _fit_corners(fit)]
    notes = [note for note in (_depth_note(shape.depth, shape.depth_continuous, corners, paper_depth, budget.params),
                               _width_note(budget.params, paper_depth, paper_width, fit)) if note]
    if not notes:
        notes = [f"same; d to {SIGNIFICANT_FIGURES} significant figures"]
    elif paper_depth == shape.depth:
        notes.insert(0, "same L")
    roots = [c.depth_continuous for c in corners]
    return Comparison(name=budget.name, depth=shape.depth, width=shape.width, paper_depth=paper_depth,
                      paper_width=paper_width, root=shape.depth_continuous, root_range=(min(roots), max(roots)),
                      note="; ".join(notes))


def applies(fit) -> bool:
    """Whether ``fit`` is the paper's own, so that printed and recomputed values can be compared."""
    return fit == projection.FIT_PRESETS["levine2020"]
