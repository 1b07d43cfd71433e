"""The preflight's plain-text table: one line per run, notes for failures, then the sweep's hours."""

from __future__ import annotations

from scaling.cli import fmt, text_table
from scaling.hardware import GIB


def _gib(value) -> str:
    return fmt(value and value / GIB, ".2f")


def _cell(value, form: str, row: dict | None = None) -> str:
    """A number, "-" where the run has none, "unknown" where a loop or kernel left it uncounted."""
    uncounted = row is not None and row.get("fits") and (row.get("loops_uncounted") or row.get("kernels_uncounted"))
    return fmt(value, form, missing="unknown" if uncounted else "-")


def _range(row: dict, low: str, high: str, plain: str, form: str) -> str:
    """``low..high`` of the two estimates (``?`` where the compiler gave none), else the row's ``plain`` figure."""
    if row.get(low) is None:
        return _cell(row.get(plain), form, row)
    return f"{fmt(row[low], form)}..{fmt(row.get(high), form, missing='?')}"


def _loops(row: dict) -> str:
    if row.get("loops_counted") is None:
        return "-"
    uncounted = row.get("loops_uncounted") or 0
    return f"{row['loops_counted']}" + (f" ({uncounted} not)" if uncounted else "")


def _method(row: dict) -> str:
    """How the row was priced: compile seconds, ``re-priced``, ``interpolated ±x%`` (``sweeps.preflight.quick``)."""
    if row.get("same_program_as"):
        return "same as " + row["same_program_as"]
    method = row.get("method", "compiled")
    if method == "interpolated":
        return f"interpolated ±{row['interpolation_error']:.1%}"
    if method != "compiled":
        return method
    return _cell(row["compile_seconds"], ".1f") + (" cached" if row.get("compile_cached") else "")


def _parallelism(row: dict) -> str:
    """The mode chosen and a run's seconds per step in it, roofline..compiler (``sweeps.preflight.parallelism``)."""
    compared = row.get("parallelism")
    if not compared:
        return "-"
    chosen = next((mode for mode in compared["modes"] if mode["mode"] == compared["choice"]), None)
    if chosen is None:
        return "none fits"
    name = chosen["mode"] + (f"×{chosen['pack_size']}" if chosen["pack_size"] > 1 else "")
    return f"{name} {fmt(chosen['run_roofline_seconds'], '.3g')}..{fmt(chosen['run_compiler_seconds'], '.3g', '?')}"


def format_table(rows: list[dict], summary: dict | None = None) -> str:
    """A plain-text table of preflight rows (GiB per chip, TFLOP and GB per chip per step, seconds), then notes."""
    header = ("run", "HBM GiB/chip", "of GiB", "fits", "TFLOP/chip", "ICI GB/chip", "step s", "bound", "MFU est",
              "MFU causal", "MFU max", "loops", "compile s / method", "result")
    lines = []
    for row in rows:
        lines.append((row["name"], _gib(row["hbm_bytes_per_device"]), _gib(row["hbm_capacity_bytes"]),
                      "yes" if row["fits"] else "no",
                      _cell(row["flops"] and row["flops"] / 1e12, ".3g", row),
                      _cell(row["collective_bytes"] and row["collective_bytes"] / 1e9, ".3g", row),
                      _range(row, "step_seconds_low", "step_seconds_high", "estimated_step_seconds", ".3g"),
                      row["bound"] or "-", _range(row, "mfu_low", "mfu_high", "estimated_mfu", ".1%"),
                      _range(row, "mfu_causal_low", "mfu_causal_high", "", ".1%"),
                      _cell(row["mfu_upper_bound"], ".1%", row),
                      _loops(row),
                      _method(row),
                      row["status"]))
    if any(row.get("parallelism") for row in rows):
        header += ("parallelism",)
        lines = [line + (_parallelism(row),) for line, row in zip(lines, rows)]
    text = text_table(list(header), lines, align=("left",) + ("right",) * (len(header) - 1)).splitlines()
    for row in rows:
        if row.get("same_program_as"):
            continue
        if row["status"] == "FAIL":
            text.append(f"{row['name']}: {row['suggestion'] or row['error']}")
        if row.get("remat_suggestion") and row["remat_suggestion"]["remat"] != row.get("remat"):
            better = row["remat_suggestion"]
            text.append(f"{row['name']}: fits with model.remat={better['remat']} (now {row['remat']}): "
                        f"{_cell(better['estimated_step_seconds'], '.3g')} s/step, MFU "
                        f"{_cell(better['estimated_mfu'], '.1%')} (a different run id)")
        if row.get("kernels_uncounted"):
            text.append(f"{row['name']}: kernels the roofline cannot price: {', '.join(row['kernels_uncounted'])}")
    text.append("step s: low..high of two estimates of the compiled schedule replayed (loops by trip count, async "
                "collectives overlapped): the roofline, each op max(FLOPs / peak, HBM bytes / bandwidth), corrected "
                "for tile padding, a per-op floor, collective latency and attention's matrix-unit fill "
                "(sweeps/preflight/roofline_corrections.py), and the compiler's own estimated_cycles at the chip's clock "
                "(sweeps/preflight/compiler_estimate.py; ? where it gave none); MFU est from model FLOPs with attention's "
                "full square (the trainer's, scaling/model/flops.py), MFU causal with its causal half; MFU max: every op "
                "at peak")
    if any(row.get("parallelism") for row in rows):
        text.append("parallelism: the cheapest mode that fits among data (parameters replicated), fsdp (sharded) and "
                    "packed×k (k runs of the shape as one program, one per group of chips), and a run's seconds per "
                    "step in it, roofline..compiler (a pack's step over its k runs; sweeps/preflight/parallelism.py)")
    sources = sorted({source for row in rows for source in (row.get("kernel_cost_sources") or {}).values()})
    if sources or any(row.get("kernels_analytic") for row in rows):
        text.append("Pallas kernels (custom calls) carry no cost analysis in the HLO: priced by "
                    f"{' and by '.join(sources or ['stated model'])} (attention: a stated model; others: the "
                    "pl.CostEstimate they declare; sweeps/preflight/kernels.py)")
    if summary:
        hours = ("unknown chip-hours (a loop or kernel left uncounted)" if summary.get("chip_hours") is None else
                 f"{summary['chip_hours']:.1f} chip-hours, {summary['wall_hours']:.1f} h wall")
        text.append(f"sweep on {summary['topology']} ({summary['mode']}, each run on {summary['checked_topology']}): "
                    f"{summary['runs_estimated']} of {summary['runs']} runs estimated, {hours} "
                    f"({summary['in_parallel']} in parallel; training steps only); loops counted "
                    f"{summary.get('loops_counted', 0)}, uncounted {summary.get('loops_uncounted', 0)}")
        if summary.get("chip_hours_low") is not None:
            high = summary.get("chip_hours_high")
            text.append(f"range of the two estimates: {summary['chip_hours_low']:.1f}.."
                        f"{'?' if high is None else f'{high:.1f}'} chip-hours, "
                        f"{summary['wall_hours_low']:.1f}..{fmt(summary.get('wall_hours_high'), '.1f', missing='?')} "
                        f"h wall; median MFU {fmt(summary.get('median_mfu_low'), '.1%', missing='?')}.."
                        f"{fmt(summary.get('median_mfu_high'), '.1%')} (attention's full square; causal half: "
                        f"{fmt(summary.get('median_mfu_causal_low'), '.1%', missing='?')}.."
                        f"{fmt(summary.get('median_mfu_causal_high'), '.1%')})")
        if summary.get("price_line"):
            text.append(summary["price_line"])
        if summary.get("programs_repriced") or summary.get("programs_interpolated"):
            error = summary.get("largest_interpolation_error")
            text.append(f"programs ({summary.get('preflight_mode', 'quick')} mode): {summary['programs_compiled']} "
                        f"compiled, {summary['programs_from_cache']} from the compile cache, "
                        f"{summary['programs_repriced']} re-priced (a compiled width's layer loop run to their "
                        f"depth), {summary['programs_interpolated']} interpolated between compiled widths of "
                        f"their tiling" + (f" (±{error:.1%} at most, measured leave-one-out)" if error is not None
                                          else "") + "; --full compiles every one (sweeps/preflight/quick.py)")
        elif summary.get("programs_from_cache"):
            text.append(f"programs: {summary['programs_compiled']} compiled, {summary['programs_from_cache']} from "
                        "the compile cache (sweeps/preflight/compile_cache.py; --compile-cache off to compile all)")
    return "\n".join(text)
