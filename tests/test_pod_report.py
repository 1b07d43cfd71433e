"""The pod cost report's arithmetic: chip-hours and dollars from step times, and GPT-3 XL's ICI against FSDP's."""

import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import pod_report  # noqa: E402

PRICES = {"on_demand": 1.0, "spot": 0.25}


def test_sweep_cost_counts_every_seed_at_its_seed_zero_row_and_prices_chip_hours():
    row = {"name": "L6-d128-s0", "fits": True, "estimated_step_seconds": 0.36, "estimated_mfu": 0.4}
    cost = pod_report.sweep_cost([row], ["L6-d128-s0", "L6-d128-s1", "L6-d128-s2"], PRICES)
    steps = 5000  # the paper sweep's steps per run
    assert cost["runs"] == 3 and cost["chip_hours"] == pytest.approx(3 * steps * 0.36 * 8 / 3600)
    assert cost["usd_on_demand"] == pytest.approx(cost["chip_hours"]) and cost["usd_spot"] == cost["chip_hours"] / 4
    unknown = pod_report.sweep_cost([dict(row, estimated_step_seconds=None)], ["L6-d128-s0"], PRICES)
    assert unknown["chip_hours"] is None and unknown["usd_spot"] is None


def test_gpt3_ici_is_compared_with_what_fsdp_must_move():
    parameters, chips = 1_000_000, 256
    fsdp = (chips - 1) / chips * 6 * parameters  # bf16 gathers forward and backward, bf16 gradient reduce-scatter
    row = {"chips": chips, "estimated_step_seconds": 0.2, "parameters": parameters, "collective_bytes": 1.5 * fsdp}
    cost = pod_report.gpt3_cost(row, PRICES)
    assert cost["ici_over_reference"] == pytest.approx(1.5)
    assert cost["chip_hours"] == pytest.approx(0.2 * 1000 * 256 / 3600)
