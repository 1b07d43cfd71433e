"""The coordinate check (benchmarks/coord_check.py) on a tiny model: what each parametrization promises.

Widths 32 and 128 at depth 1, depths 1 and 4 at width 32 (the base shape 32 × 1), three Adam steps at
1e-2. The slopes are log-log, from the two ends of a 4× range; the thresholds leave wide margins around
what theory says and what this setting measures on the development machine:
- standard, Δlogits against width: theory 1 (Adam moves each of d weights by about the rate), measured
  0.97; asserted > 0.5. μP: theory 0, measured 0.04; asserted |slope| < 0.25.
- standard, Δ(residual stream after the last block) against depth: theory up to 1 (each of L branches
  adds its own change), measured 0.79; asserted > 0.4. CompleteP: theory 0, measured -0.02; asserted
  |slope| < 0.25.
"""

import sys

import pytest

import helpers
from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import coord_check  # noqa: E402

SETTINGS = {"base_width": 32, "base_depth": 1, "steps": 3, "lr": 1e-2, "batch_size": 4, "seq_len": 32}


@pytest.fixture(scope="module")
def records():
    widths = coord_check.run(("standard", "mup"), widths=(32, 128), depths=(1,), **SETTINGS)
    depths = coord_check.run(("standard", "completep"), widths=(32,), depths=(1, 4), **SETTINGS)
    return [r for r in widths if r["axis"] == "width"] + [r for r in depths if r["axis"] == "depth"]


def test_logits_change_grows_with_width_under_standard_and_stays_flat_under_mup(records):
    assert coord_check.slope(records, "standard", "width", "logits") > 0.5
    assert abs(coord_check.slope(records, "mup", "width", "logits")) < 0.25
    # μP's means: the hidden matrices' updates shrink as 1/width (the rate), the other parameters' do not.
    assert coord_check.slope(records, "mup", "width", "update_hidden") == pytest.approx(-1.0, abs=0.1)
    assert abs(coord_check.slope(records, "mup", "width", "update_other")) < 0.1


def test_residual_stream_change_grows_with_depth_under_standard_and_stays_flat_under_completep(records):
    assert coord_check.slope(records, "standard", "depth", "residual") > 0.4
    assert abs(coord_check.slope(records, "completep", "depth", "residual")) < 0.25


def test_every_step_records_each_blocks_activations_and_their_change(records):
    deep = next(r for r in records if r["parametrization"] == "completep" and r["depth"] == 4)
    assert [row["step"] for row in deep["steps"]] == [1, 2, 3]
    for index in range(4):
        for name in ("attention", "mlp", "residual"):
            assert deep["steps"][-1][f"{name}_{index}"] > 0 and deep["steps"][-1][f"delta_{name}_{index}"] > 0
    assert {"update_hidden", "update_block", "update_other"} <= set(deep["steps"][0])


def test_plot_writes_a_png(records, tmp_path):
    path = tmp_path / "coord.png"
    coord_check.plot(records, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_runs_without_jax_work():
    out = helpers.run([sys.executable, REPO / "benchmarks" / "coord_check.py", "--help"], check=True,
                      timeout=60).stdout
    assert "Coordinate check" in out and "--widths" in out
