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


def _loops(row: dict) -> str:
    if row.get("loops_counted") is None:
        return "-"
    uncounted = row.get("loops_uncounted") or 0
    return f"{row['loops_counted']}" + (f" ({uncounted} not)" if uncounted else "")


def format_table(rows: list[dict], summary: dict | None = None) -> str:
    """A plain-text table of preflight rows (GiB per chip, TFLOP and GB per chip per step, seconds), then notes."""
    header = ("run", "HBM GiB/chip", "of GiB", "fits", "TFLOP/chip", "ICI GB/chip", "step s", "bound", "MFU est",
              "MFU max", "loops", "compile s", "result")
    lines = []
    for row in rows:
        lines.append((row["name"], _gib(row["hbm_bytes_per_device"]), _gib(row["hbm_capacity_bytes"]),
                      "yes" if row["fits"] else "no",
                      _cell(row["flops"] and row["flops"] / 1e12, ".3g", row),
                      _cell(row["collective_bytes"] and row["collective_bytes"] / 1e9, ".3g", row),
                      _cell(row["estimated_step_seconds"], ".3g", row), row["bound"] or "-",
                      _cell(row["estimated_mfu"], ".1%", row), _cell(row["mfu_upper_bound"], ".1%", row),
                      _loops(row),
                      "same as " + row["same_program_as"] if row.get("same_program_as") else
                      _cell(row["compile_seconds"], ".1f") + (" cached" if row.get("compile_cached") else ""),
                      row["status"]))
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
    text.append("step s: the compiled schedule replayed, each op max(FLOPs / peak, HBM bytes / bandwidth), each "
                "collective on its axis' links, async ones overlapped (sweeps/preflight/roofline.py); loops: while "
                "loops counted by trip count; MFU from model FLOPs (scaling/flops.py); MFU max: every op at peak")
    if any(row.get("kernels_analytic") for row in rows):
        text.append("attention kernels (Pallas custom calls) carry no cost analysis: counted analytically "
                    "(sweeps/preflight/kernels.py)")
    if summary:
        hours = ("unknown chip-hours (a loop or kernel left uncounted)" if summary.get("chip_hours") is None else
                 f"{summary['chip_hours']:.1f} chip-hours, {summary['wall_hours']:.1f} h wall")
        text.append(f"sweep on {summary['topology']} ({summary['mode']}, each run on {summary['checked_topology']}): "
                    f"{summary['runs_estimated']} of {summary['runs']} runs estimated, {hours} "
                    f"({summary['in_parallel']} in parallel; training steps only); loops counted "
                    f"{summary.get('loops_counted', 0)}, uncounted {summary.get('loops_uncounted', 0)}")
        if summary.get("programs_from_cache"):
            text.append(f"programs: {summary['programs_compiled']} compiled, {summary['programs_from_cache']} from "
                        "the compile cache (sweeps/preflight/compile_cache.py; --compile-cache off to compile all)")
    return "\n".join(text)
