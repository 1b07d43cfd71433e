"""analysis.paper_table: each way a printed Table 1 value can arise is recognised, and only that one."""

import math

import pytest

from analysis import paper_table, projection

PAPER = projection.FIT_PRESETS["levine2020"]
SMALL = projection.BUDGET_PRESETS["gpt3"][0]  # GPT-3 Small, 12·12·768² parameters


def test_rounding_helpers():
    assert paper_table.half_unit("5.039") == pytest.approx(5e-4)
    assert paper_table.half_unit("5.55e-2") == pytest.approx(5e-5)
    assert paper_table.round_significant(886.81) == 887 and paper_table.cut_significant(886.81) == 886
    assert paper_table.round_significant(30076.5) == 30100 and paper_table.cut_significant(29617.4) == 29600


def printed(monkeypatch, depth, width):
    monkeypatch.setitem(paper_table.PUBLISHED, SMALL.name, (depth, width))
    return paper_table.compare(SMALL, PAPER)


def test_a_row_computed_as_we_do_is_the_same(monkeypatch):
    shape = projection.optimal_shape(SMALL.params, PAPER)
    row = printed(monkeypatch, shape.depth, int(paper_table.round_significant(shape.width)))
    assert row.same and row.note.startswith("same;")


def test_a_cut_width_is_named(monkeypatch):
    shape = projection.optimal_shape(SMALL.params, PAPER)
    cut = int(paper_table.cut_significant(shape.width))
    assert cut != paper_table.round_significant(shape.width)  # 554.7: cutting and rounding differ
    row = printed(monkeypatch, shape.depth, cut)
    assert not row.same and "cut to 3 significant figures" in row.note


def test_the_fits_own_width_is_named(monkeypatch):
    shape = projection.optimal_shape(SMALL.params, PAPER)
    fitted = math.exp(PAPER.a + PAPER.b * shape.depth)
    row = printed(monkeypatch, shape.depth, int(paper_table.round_significant(fitted)))
    assert f"e^(a+b·{shape.depth})" in row.note and "not N" in row.note


def test_a_depth_no_published_a_b_gives_is_called_a_rounding(monkeypatch):
    shape = projection.optimal_shape(SMALL.params, PAPER)
    other = shape.depth + 1
    row = printed(monkeypatch, other, int(paper_table.round_significant(math.sqrt(SMALL.params / (12 * other)))))
    low, high = row.root_range
    assert low < shape.depth_continuous < high and high - low < 0.5
    assert row.note.startswith("L:") and f"the printed {other} is the root rounded up" in row.note


def test_an_unrelated_width_is_not_explained_away(monkeypatch):
    shape = projection.optimal_shape(SMALL.params, PAPER)
    row = printed(monkeypatch, shape.depth, 999)
    assert "d: not sqrt" in row.note


def test_only_the_papers_fit_is_compared():
    assert paper_table.applies(PAPER)
    assert not paper_table.applies(projection.LogWidthFit(a=5.0, b=0.05, cov=PAPER.cov))
