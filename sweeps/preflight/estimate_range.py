"""Two estimates per preflight row, and the sweep's step time, MFU and chip-hours as the range between them.

For each compiled program the preflight gives (``sweeps.preflight``):

- ``roofline_corrected_step_seconds``: the roofline with its four corrections
  (``sweeps.preflight.roofline_corrections``; ``corrections`` says what each added);
- ``compiler_step_seconds``: libtpu's own estimate (``sweeps.preflight.compiler_estimate``),
  None with ``compiler_estimate_missing`` saying why where the backend gave none;
- ``step_seconds_low`` / ``step_seconds_high``: the two, fastest first
  (high None when the compiler gave none), and the MFU at each:
  ``mfu_low`` at the slow end, ``mfu_high`` at the fast end.

MFU conventions. ``full`` is the trainer's (``scaling.model.flops``; "PaLM",
appendix B): attention counted over the whole T×T square of scores.
``causal`` counts only the half a causal mask keeps, as papers that report
causal-attention MFU often do; it is lower by 6·L·T·d FLOPs per token. Rows
carry both (``mfu_low``/``mfu_high`` and ``mfu_causal_low``/``mfu_causal_high``);
``MFU_CONVENTIONS`` names them in the summary.

Nothing here ran on a TPU: both are estimates from the compiled program.
"""

from __future__ import annotations

import statistics

from scaling.config import TrainConfig
from scaling.model.flops import training_flops_per_token
from sweeps.preflight import compiler_estimate, roofline, roofline_corrections
from sweeps.preflight.topology import CHIPS

MFU_CONVENTIONS = {"full": "attention over the whole T x T score square, as the trainer's mfu (scaling/model/flops.py)",
                   "causal": "attention over the causal half of the square only (6·L·T·d FLOPs per token fewer)"}
EMPTY_FIELDS = {"roofline_corrected_step_seconds": None, "corrections": None, "compiler_step_seconds": None,
                "compiler_cycles_seconds": None, "compiler_ops_estimated": None, "compiler_ops_not_estimated": None,
                "compiler_estimate_missing": None, "step_seconds_low": None, "step_seconds_high": None,
                "mfu_low": None, "mfu_high": None, "mfu_causal_low": None, "mfu_causal_high": None,
                "model_flops_per_chip": None}


def model_flops_per_step(config: TrainConfig, convention: str = "full") -> float:
    """Model FLOPs of one training step (all chips), under the MFU ``convention`` ("full" or "causal")."""
    if convention not in MFU_CONVENTIONS:
        raise ValueError(f"convention={convention!r}: allowed {', '.join(MFU_CONVENTIONS)}")
    per_token = training_flops_per_token(config.model, config.data.seq_len)
    flops = per_token.total - (per_token.attention / 2 if convention == "causal" else 0.0)
    return flops * config.batch_size * config.data.seq_len


def mfu(config: TrainConfig, step_seconds: float | None, chips: int, peak_flops: float,
        convention: str = "full") -> float | None:
    """MFU of a step taking ``step_seconds`` on ``chips`` chips of ``peak_flops`` each; None without a time."""
    if not step_seconds:
        return None
    return model_flops_per_step(config, convention) / (step_seconds * chips * peak_flops)


def row_fields(config: TrainConfig, hlo_text: str, generation: str, devices, kernel_cost, chips: int) -> dict:
    """The row's two estimates and their range (``EMPTY_FIELDS``' keys) for one compiled step."""
    devices = list(devices)
    peak = CHIPS[generation].bf16_flops
    corrected = roofline_corrections.corrected_step_estimate(hlo_text, generation, devices, kernel_cost)
    compiler = compiler_estimate.compiler_estimate(hlo_text, generation, devices, kernel_cost)
    known = [s for s in (corrected.step_seconds, compiler.step_seconds) if s is not None]
    low = min(known) if known else None
    high = max(known) if corrected.step_seconds is not None and compiler.known else None
    return {"roofline_corrected_step_seconds": corrected.step_seconds,
            "corrections": roofline_corrections.contributions(hlo_text, generation, devices, kernel_cost),
            "compiler_step_seconds": compiler.step_seconds, "compiler_cycles_seconds": compiler.cycles_seconds,
            "compiler_ops_estimated": compiler.ops_estimated, "compiler_ops_not_estimated": compiler.ops_not_estimated,
            "compiler_estimate_missing": compiler.reason, "step_seconds_low": low, "step_seconds_high": high,
            "mfu_low": mfu(config, high, chips, peak), "mfu_high": mfu(config, low, chips, peak),
            "mfu_causal_low": mfu(config, high, chips, peak, "causal"),
            "mfu_causal_high": mfu(config, low, chips, peak, "causal"),
            "model_flops_per_chip": model_flops_per_step(config) / chips}


def summary_fields(rows: list[dict], runs, chips_per_run: int, shares: list | None = None) -> dict:
    """Chip-hours and wall hours at each end of the range, over the runs that fit (``roofline.sweep_time``).

    The low end is None if any run that fits has no estimate at all, the high
    end if any lacks the compiler's.
    """
    fitting = [(run, row) for run, row in zip(runs, rows) if row["fits"]]
    out = {"mfu_conventions": MFU_CONVENTIONS}
    for end in ("low", "high"):
        seconds = {run.run_id: row.get(f"step_seconds_{end}") for run, row in fitting}
        hours = roofline.sweep_time(seconds, runs, chips_per_run, shares)
        complete = all(value is not None for value in seconds.values())
        out[f"chip_hours_{end}"] = hours["chip_hours"] if complete else None
        out[f"wall_hours_{end}"] = hours["wall_hours"] if complete else None
    for key in ("mfu_low", "mfu_high", "mfu_causal_low", "mfu_causal_high"):
        values = [row.get(key) for _, row in fitting if row.get(key) is not None]
        out[f"median_{key}"] = statistics.median(values) if values and len(values) == len(fitting) else None
    return out
