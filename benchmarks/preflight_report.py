"""Preflight figures for the note: the paper sweep's largest run and a GPT-3 XL shape on a big slice.

    python benchmarks/preflight_report.py                       # v5e:16x16 (v5e-256), table
    python benchmarks/preflight_report.py --topology v4:4x4x4 --json
    python benchmarks/preflight_report.py --set mesh.data=16 --set mesh.fsdp=16

Two rows, both compiled ahead of time for the slice by ``sweeps.preflight``
(needs ``pip install -e ".[tpu]"``; no TPU):
1. the largest run of ``sweeps/configs/paper.py`` at depth 48 (its widest
   width, seed 0), exactly as the sweep defines it;
2. GPT-3 XL's shape: L=24, d=2048, 16 heads of 128, 2048-token sequences,
   512 sequences per step (GPT-3 XL's 1M-token batch), on the paper sweep's
   base config (bfloat16 compute, float32 parameters, AdamW, full remat,
   fsdp over the whole slice).
``--set KEY=VALUE`` overrides fields of both configs (e.g. the mesh).
Each row has the preflight's two estimates (the corrected roofline and the
compiler's own) and their range; below the table, each run's chip-hours and
dollars (on demand, spot; the price source and its date) for ``--tokens``
tokens (GPT-3's 300B by default) at both ends of the range.

Measured with jax 0.10.2 / libtpu 0.0.42.1 on the 2-core dev machine, v5e:16x16,
before issue 27 (HBM per chip 16 GiB; step time = compiled FLOPs / 197e12, so MFU
is an upper bound; each row then also paid two small extra compiles for the FLOP count):

  as the sweep defines them (mesh data=1, fsdp=256), no --set:
    paper L48-d1600   FAIL  49.8 GiB/chip: fsdp=256 does not divide d=1600, so
                            the 19.6 GB state stays whole on every chip
    GPT-3 XL          FAIL  198 GiB/chip of temporaries, the size of the float32
                            logits of the whole batch (512·2048·50261·4 B = 196 GiB):
                            activations are not kept sharded over the batch
  after issue 40 (two estimates, their range, dollars), as the sweep defines them, no --set; 38 s from an
  empty compile cache (--compile-cache DIR), libtpu on the CPU, nothing run on a TPU:
    paper L48-d1600   FAIL  45.4 GiB/chip (fsdp=256 does not divide d=1600), as before
    GPT-3 XL          PASS  1.66 GiB/chip, 44.5 TFLOP/chip, step 0.293..0.346 s (corrected roofline ..
                            compiler's estimated_cycles), MFU 54.5%..64.3% (causal half 50.9%..60.0%);
                            300B tokens: 2.86e5 steps, 5,967..7,040 chip-hours (23.3..27.5 h on 256 chips),
                            $7,160-8,449 on demand ($1.20/chip-hour), $1,461-4,224 spot ($0.245-0.600),
                            prices from the project's table (SkyPilot's GCP catalog v8, US regions)
  --set mesh.data=16 --set mesh.fsdp=16 (before issue 27):
    paper L48-d1600   PASS  4.32 GiB/chip, 13.0 TFLOP/chip, 0.066 s/step, MFU <= 69.7%, compile 76 s
    GPT-3 XL          PASS  9.01 GiB/chip, 45.6 TFLOP/chip, 0.232 s/step, MFU <= 65.0%, compile 82 s
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from scaling.overrides import override
from sweeps import preflight, spec
from sweeps.preflight import compile_cache, prices

# "Language Models are Few-Shot Learners" (GPT-3), section 2.2: every model was trained for 300 billion tokens.
GPT3_TOKENS = 3e11
PAPER_SWEEP = Path(__file__).resolve().parents[1] / "sweeps" / "configs" / "paper.py"


def report_runs(overrides: list[str]) -> list[tuple[str, object]]:
    """(name, TrainConfig) of the paper sweep's largest depth-48 run and of the GPT-3 XL shape."""
    sweep = spec.load_sweep(PAPER_SWEEP)
    deepest = [run for run in sweep.expand().runs if run.depth == 48 and run.seed == 0]
    largest = max(deepest, key=lambda run: run.width)
    base = sweep.base
    xl = dataclasses.replace(
        base, name="gpt3-xl", batch_size=512,
        model=dataclasses.replace(base.model, depth=24, width=2048, head_dim=128, max_seq_len=2048),
        data=dataclasses.replace(base.data, seq_len=2048))
    return [(f"paper {largest.name}", override(largest.config, overrides)),
            ("GPT-3 XL L24-d2048", override(xl, overrides))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", default="v5e:16x16", help="TPU slice, e.g. v5e:16x16 (default) or v4:4x4x4")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field of both runs, e.g. mesh.fsdp=16 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the preflight rows as JSON")
    parser.add_argument("--tokens", type=float, default=GPT3_TOKENS,
                        help="tokens each run trains on, for its chip-hours and dollars (default 3e11, GPT-3's)")
    parser.add_argument("--prices", metavar="FILE", help="dollars per chip-hour (as the preflight's --prices)")
    parser.add_argument("--compile-cache", default=None, metavar="DIR",
                        help="the preflight's compile cache (default: as the preflight's; 'off' for none)")
    args = parser.parse_args(argv)
    if not preflight.libtpu_installed():
        print('error: needs the TPU compiler; install it with: pip install -e ".[tpu]"', file=sys.stderr)
        return 2
    try:
        runs = report_runs(args.overrides)
        preflight.parse_topology(args.topology)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        price_table = prices.load_prices(args.prices)
    except prices.PriceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = preflight.check_runs(runs, args.topology, pod_wide=True,  # both runs span the whole slice
                                progress=lambda text: print(text, file=sys.stderr, flush=True),
                                cache_directory=compile_cache.default_directory(args.compile_cache))
    generation = preflight.parse_topology(args.topology).generation
    for (_, config), row in zip(runs, rows):
        row.update(depth=config.model.depth, width=config.model.width, batch_size=config.batch_size,
                   seq_len=config.data.seq_len, mesh={k: v for k, v in dataclasses.asdict(config.mesh).items()
                                                      if k != "rules"}, remat=config.model.remat)
        row["training"] = training_cost(row, config, args.tokens, price_table, generation)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(preflight.format_table(rows))
    for row in rows:
        print(f"{row['name']}: {row['training']['line']}")
    return 0


def training_cost(row: dict, config, tokens: float, price_table, generation: str) -> dict:
    """Chip-hours and dollars of training ``config`` for ``tokens`` tokens at the row's two step-time estimates
    (the corrected roofline and the compiler's: ``step_seconds_low``..``_high``); None where a run has neither."""
    low, high = row.get("step_seconds_low"), row.get("step_seconds_high")
    if low is None:
        return {"tokens": tokens, "chip_hours": None, "cost": None, "line": "no step time (see the table)"}
    steps = tokens / (config.batch_size * config.data.seq_len)
    hours = [seconds * steps * row["chips"] / 3600 for seconds in (low, high if high is not None else low)]
    priced = prices.cost(price_table, generation, tuple(hours))
    line = (f"{tokens:.3g} tokens in {steps:.3g} steps: {hours[0]:,.0f}..{hours[1]:,.0f} chip-hours "
            f"({hours[0] / row['chips']:,.1f}..{hours[1] / row['chips']:,.1f} h on {row['chips']} chips), MFU "
            f"{_percent(row.get('mfu_low'))}..{_percent(row.get('mfu_high'))} (causal half: "
            f"{_percent(row.get('mfu_causal_low'))}..{_percent(row.get('mfu_causal_high'))}); "
            + prices.cost_line(priced, generation, price_table))
    return {"tokens": tokens, "steps": steps, "chip_hours": hours, "cost": priced, "line": line}


def _percent(value) -> str:
    return "?" if value is None else f"{value:.1%}"


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    sys.exit(main())
