"""Text tables of optimal shapes: several budgets in one answer (`optimal`), and Table 1 beside the paper (`table`).

Both fit a terminal: every line stays within ``MAX_WIDTH`` characters. The
long account of how each of Table 1's printed values arises (which a, b and
rounding; ``analysis.paper_table``) is a short word in the table and a list
under it with ``--explain``.
"""

from __future__ import annotations

import math
import textwrap

import tabulate

# Widest line a table prints (characters): a terminal beside an editor.
MAX_WIDTH = 120


def _fmt(value, spec, missing="–"):
    return missing if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _depth_range(low, high) -> str:
    return f"{_fmt(low, '.1f', '?')}–{_fmt(high, '.1f', '?')}"


def _width(value: float) -> str:
    """A width in channels: with thousands separators, or in powers of ten once it is absurdly large."""
    return f"{value:,.0f}" if value < 1e7 else f"{value:.3g}"


def shapes_table(shapes) -> str:
    """One row per ``projection.OptimalShape``: budget, depth and its ±ΔN range, width and rounded width.

    Depths in layers, widths in channels, N and N_tr in parameters; "fit range"
    says where the depth lies against the depths the fit was made from.
    """
    header = ["budget N", "optimal L", "L range", "optimal d", "d rounded", "N_tr(L) ± ΔN", "fit range"]
    rows = [[f"{shape.params:.3g}", str(shape.depth), _depth_range(shape.depth_low, shape.depth_high),
             _width(shape.width), _width(shape.width_rounded), f"{shape.n_transition:.3g} ± {shape.delta_n:.2g}",
             shape.fit_range] for shape in shapes]
    return tabulate.tabulate(rows, headers=header, tablefmt="pipe", disable_numparse=True,
                             colalign=["right"] * 6 + ["left"])


def table1(rows, comparisons, explain: bool = False) -> str:
    """Table 1 as markdown: ``rows`` from ``projection.optimal_table``, ``comparisons`` from ``paper_table.compare``.

    The paper's columns and the "vs the paper" cell appear when any row has a
    comparison; with ``explain`` each compared row's full note follows the table.
    """
    compared = any(comparisons)
    header = ["model", "size N", "trained", "optimal L", "optimal d", "L range"]
    if compared:  # "our" beside "paper", which also keeps the table within MAX_WIDTH
        header[3:5] = ["our L", "paper L", "our d", "paper d"]
        header.append("vs the paper")
    table = []
    for row, comparison in zip(rows, comparisons):
        trained = (f"{row['trained_depth']}×{row['trained_width']}" if row["trained_depth"] is not None
                   else "–")  # L×d, as the paper writes a shape
        cells = [row["name"], f"{row['params']:.3g}", trained, str(row["optimal_depth"]),
                 _width(row["optimal_width"]), _depth_range(row["depth_low"], row["depth_high"])]
        if compared:
            cells[4:4] = [_fmt(comparison and comparison.paper_depth, "d")]
            cells[6:6] = [_fmt(comparison and comparison.paper_width, ",d")]
            cells.append(comparison.summary if comparison else "not in the paper")
        table.append(cells)
    align = ["left"] + ["right"] * (len(header) - 1)  # names left, numbers right, the words left
    if compared:
        align[-1] = "left"
    text = tabulate.tabulate(table, headers=header, tablefmt="pipe", disable_numparse=True, colalign=align)
    if explain and compared:
        text += "\n\nHow each printed value of Table 1 arises:\n" + "\n".join(
            textwrap.fill(f"- {row['name']}: {comparison.note}", width=MAX_WIDTH, subsequent_indent="  ")
            for row, comparison in zip(rows, comparisons) if comparison is not None)
    return text
