"""What the paper sweep and GPT-3 XL cost on TPU v5e, before and after issue 27, side by side (estimates).

    python benchmarks/pod_report.py                          # the whole paper sweep on v5e:2x4, and GPT-3 XL
    python benchmarks/pod_report.py --only 'L6-*-s0'         # a part of the sweep (its hours are that part's)
    python benchmarks/pod_report.py --after after.json       # reuse rows saved by --save (no compiling)
    python benchmarks/pod_report.py --save after.json --json

After: every distinct program of the paper sweep (``sweeps/configs/paper.py``)
compiled for one ``v5litepod-8`` host (``v5e:2x4``, 8 chips) and GPT-3 XL
(``benchmarks/compiled_steps.gpt3_xl_config``: L24, d2048, 256 × 2048
tokens, fsdp=256) for the whole ``v5e:16x16``, by ``sweeps.preflight`` with
this checkout's code. Before: ``benchmarks/pod_report_before.json``, the
same runs compiled with the code of commit 3cb5523 (before the issue: the
loss gathering the unembedding per slice, XLA attention) and priced by this
checkout's roofline (``benchmarks/compiled_steps.py`` says how), so both
sides are measured with the same ruler; the figures the old roofline printed
then are quoted in that file's ``old_roofline`` entries.

Per run: step seconds, bound and MFU (``scaling.model.flops``'s model FLOPs);
per sweep: chip-hours of training steps and their price. Every figure is a
roofline estimate from compiled programs (``sweeps/preflight/roofline.py`` says what
it leaves out); nothing here ran on a TPU.

Measured on the shared 2-core dev machine (jax 0.10.2, libtpu 0.0.42.1, 2026-11-24), for the
paper sweep's depth-6 runs only (``--only 'L6-*'``; the whole sweep's 48 programs were not compiled
here: at 4 to 14 minutes a compile on this machine that is hours), saved in
``benchmarks/pod_report_after.json`` (``--after`` prints it again without compiling):

  run          before: step s  bound   MFU    after: step s  bound    MFU    loops (uncounted)
  L6-d128-s0   0.0800          memory  11.5%  0.0286         memory   32.1%  17 (0)
  L6-d192-s0   0.1008          memory  14.5%  0.0364         memory   40.2%  17 (0)
  L6-d256-s0   0.1286          memory  16.1%  0.0488         compute  42.4%  17 (0)
  L6-d320-s0   0.1537          memory  17.8%  0.0637         compute  42.9%  17 (0)
  L6 (12 runs, 3 seeds) on one v5e:2x4 host: 15.4 -> 5.9 chip-hours, $19 -> $7 on-demand, $7 -> $3 Spot
  GPT-3 XL, fsdp=256, v5e:16x16: 0.534 s/step (collectives-bound), MFU 17.7%, ICI 64.6 GB/chip/step
      (7.6x the FSDP minimum) -> 0.172 s/step (compute), MFU 54.7%, ICI 11.9 GB (1.40x);
      per 1,000 steps 38 -> 12 chip-hours, $46 -> $15 on-demand, $18 -> $6 Spot

Prices (USD per v5e chip-hour), from the Cloud TPU pricing page,
https://cloud.google.com/tpu/pricing, as last read for this project in 2024
(us-west4 / us-central1 list prices) and NOT re-checked here (no network):
on-demand 1.20, Spot 0.48. Change them with --on-demand / --spot.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import time
from pathlib import Path

from scaling import cli

HERE = Path(__file__).resolve().parent
BEFORE = HERE / "pod_report_before.json"
PRICES = {"on_demand": 1.20, "spot": 0.48}  # USD per v5e chip-hour; see the module docstring
PAPER_TOPOLOGY, GPT3_TOPOLOGY = "v5e:2x4", "v5e:16x16"


def after_rows(only: list[str], jobs: int) -> dict:
    """Preflight rows of this checkout: ``{"paper": [rows], "gpt3-xl": row}``."""
    sys.path.insert(0, str(HERE))
    from compiled_steps import gpt3_xl_config

    from sweeps import preflight, spec

    sweep = spec.load_sweep(str(HERE.parent / "sweeps" / "configs" / "paper.py"))
    runs = [run for run in sweep.expand().runs if not only or any(fnmatch.fnmatch(run.name, p) for p in only)]
    progress = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    paper = preflight.check_runs([(run.name, run.config) for run in runs], PAPER_TOPOLOGY, progress, jobs=jobs)
    paper_seconds = time.perf_counter() - started
    (gpt3,) = preflight.check_runs([("gpt3-xl-L24-d2048", gpt3_xl_config(sweep.base))], GPT3_TOPOLOGY, progress,
                                   pod_wide=True)
    return {"paper": paper, "paper_preflight_seconds": round(paper_seconds, 1), "gpt3-xl": gpt3,
            "runs": [run.name for run in runs]}


def sweep_cost(rows: list[dict], run_names: list[str], prices: dict) -> dict:
    """Chip-hours (and wall hours on one host) of the runs' training steps and their price; None if any is unknown."""
    from sweeps import preflight, spec

    sweep = spec.load_sweep(str(HERE.parent / "sweeps" / "configs" / "paper.py"))
    by_name = {run.name: run for run in sweep.expand().runs}
    known = {row["name"]: row for row in rows}

    def row_of(name):  # a seed-0 row stands for the other seeds of its shape (the same program)
        return known.get(name) or known.get(name.rsplit("-s", 1)[0] + "-s0")

    runs = [by_name[name] for name in run_names if row_of(name) is not None]
    shaped = [dict(row_of(run.name), name=run.name) for run in runs]
    summary = preflight.sweep_summary(shaped, runs, PAPER_TOPOLOGY)
    hours = summary["chip_hours"]
    return {"runs": len(runs), "runs_failing": summary["runs_failing"], "chip_hours": hours,
            "wall_hours": summary["wall_hours"],
            **{f"usd_{kind}": None if hours is None else hours * price for kind, price in prices.items()}}


def gpt3_cost(row: dict, prices: dict, steps: int = 1000) -> dict:
    """GPT-3 XL per ``steps`` steps on the 256 chips, and its ICI bytes against what FSDP must move."""
    seconds = row.get("estimated_step_seconds")
    chip_hours = None if seconds is None else seconds * steps * row["chips"] / 3600
    out = {"steps": steps, "chip_hours": chip_hours,
           **{f"usd_{kind}": None if chip_hours is None else chip_hours * price for kind, price in prices.items()}}
    parameters, chips = row.get("parameters"), row["chips"]
    if parameters and row.get("collective_bytes") is not None:
        # bf16 parameters gathered forward and backward, and the gradient reduce-scattered (bf16), per chip.
        fsdp = (chips - 1) / chips * (2 * 2 * parameters + 2 * parameters)
        out.update(fsdp_reference_bytes=fsdp, ici_over_reference=row["collective_bytes"] / fsdp)
    return out


def _cell(value, form: str) -> str:
    return cli.fmt(value, form, missing="unknown")


def format_report(before: dict, after: dict, prices: dict) -> str:
    lines = [f"{'run':20} {'before: step s':>14} {'bound':>11} {'MFU':>6}   {'after: step s':>13} {'bound':>11} "
             f"{'MFU':>6} {'loops (uncounted)':>17}"]
    old = {row["name"]: row for row in before["paper"]}
    for row in after["paper"]:
        if row.get("same_program_as"):
            continue
        was = old.get(row["name"], {})
        loops = f"{row.get('loops_counted')} ({row.get('loops_uncounted')})"
        lines.append(f"{row['name']:20} {_cell(was.get('estimated_step_seconds'), '.4f'):>14} "
                     f"{was.get('bound') or '-':>11} {_cell(was.get('estimated_mfu'), '.1%'):>6}   "
                     f"{_cell(row['estimated_step_seconds'], '.4f'):>13} {row['bound'] or '-':>11} "
                     f"{_cell(row['estimated_mfu'], '.1%'):>6} {loops:>17}")
    # Before and after are compared on the runs both sides compiled; the after side is also totalled alone.
    compiled_before = {row["name"].rsplit("-s", 1)[0] for row in before["paper"]}
    common = [name for name in after["runs"] if name.rsplit("-s", 1)[0] in compiled_before]
    sides = [("before", before, common), ("after", after, common)]
    if len(common) < len(after["runs"]):
        sides.append(("after, every run", after, after["runs"]))
    for side, data, names in sides:
        cost = sweep_cost(data["paper"], names, prices)
        lines.append(f"paper sweep {side}, {cost['runs']} runs on one {PAPER_TOPOLOGY} host: "
                     f"{_cell(cost['chip_hours'], ',.1f')} chip-hours ({_cell(cost['wall_hours'], ',.1f')} h wall), "
                     f"${_cell(cost['usd_on_demand'], ',.0f')} on-demand, ${_cell(cost['usd_spot'], ',.0f')} Spot")
    for side, data in (("before", before), ("after", after)):
        row = data["gpt3-xl"]
        cost = gpt3_cost(row, prices)
        ici = (f", ICI {row['collective_bytes'] / 1e9:.1f} GB/chip/step = {cost['ici_over_reference']:.2f}x the "
               f"FSDP minimum" if "ici_over_reference" in cost else "")
        lines.append(f"GPT-3 XL fsdp=256 on {GPT3_TOPOLOGY} {side}: {_cell(row.get('estimated_step_seconds'), '.3f')}"
                     f" s/step ({row.get('bound') or '-'}), MFU {_cell(row.get('estimated_mfu'), '.1%')}, loops "
                     f"uncounted {row.get('loops_uncounted')}{ici}; per 1,000 steps "
                     f"{_cell(cost['chip_hours'], ',.0f')} chip-hours, ${_cell(cost['usd_on_demand'], ',.0f')} "
                     f"on-demand, ${_cell(cost['usd_spot'], ',.0f')} Spot")
    lines.append(f"prices: ${prices['on_demand']:.2f} (on-demand) and ${prices['spot']:.2f} (Spot) per v5e chip-hour, "
                 "cloud.google.com/tpu/pricing as read in 2024, not re-checked; training steps only; roofline "
                 "estimates from TPU programs compiled on a CPU, nothing ran on a TPU")
    if "paper_preflight_seconds" in after:
        lines.append(f"preflight of these paper runs: {after['paper_preflight_seconds']:.0f} s on this machine")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--only", action="append", default=[], metavar="GLOB", help="paper runs to include")
    parser.add_argument("--after", help="rows saved by an earlier --save: report without compiling")
    parser.add_argument("--save", help="write the after rows (JSON) here")
    parser.add_argument("--jobs", type=int, default=None, help="compile processes (default: preflight's)")
    parser.add_argument("--on-demand", type=float, default=PRICES["on_demand"], help="USD per chip-hour")
    parser.add_argument("--spot", type=float, default=PRICES["spot"], help="USD per chip-hour")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from sweeps import preflight

    if args.after:
        after = json.loads(Path(args.after).read_text())
    else:
        if not preflight.libtpu_installed():
            print('error: needs the TPU compiler; install it with: pip install -e ".[tpu]"', file=sys.stderr)
            return 2
        after = after_rows(args.only, args.jobs or preflight.default_jobs())
    if args.save:
        Path(args.save).write_text(json.dumps(after, indent=1))
    before = json.loads(BEFORE.read_text())
    prices = {"on_demand": args.on_demand, "spot": args.spot}
    if args.json:
        print(json.dumps({"before": before, "after": after, "prices": prices}, indent=1))
    else:
        print(format_report(before, after, prices))
    return 0


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    sys.exit(main())
