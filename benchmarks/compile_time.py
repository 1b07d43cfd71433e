"""Compile time and step time of the real train step against depth, scanned against unrolled layers.

For each depth L (default 6, 24, 48) at width 64 (sequence 128, batch 16,
the throughput benchmark's model), it builds ``scaling.model.program.build(...)``
twice, with ``ModelConfig.scan_layers`` True and False, and reports:
- compile seconds: building the program (its abstract state), tracing,
  lowering and XLA compilation of ``train_step`` (ahead of time, from
  abstract shapes, by ``scaling.model.run_program.lower_train_step``);
- step milliseconds: the median wall time of one compiled step.
Scanning should keep compile time flat in depth; unrolling grows with it.

    python benchmarks/compile_time.py
    python benchmarks/compile_time.py --depths 6 24 48 --width 64 --json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from throughput import random_batch, train_config  # first: it configures JAX for this CPU benchmark

from scaling import cli


def measure(depth: int, width: int, scan_layers: bool, steps: int) -> dict:
    """Compile seconds and median step milliseconds of the train step for one (depth, width, layout)."""
    import jax

    from scaling.model import mesh as mesh_lib
    from scaling.model import program as program_lib, run_program
    from scaling.config import MeshConfig

    config = train_config(depth, width, scan_layers=scan_layers)
    mesh = mesh_lib.make_mesh(MeshConfig(), jax.devices()[:1])
    program_lib.forget_programs()  # compile from scratch, even a shape this process has built before
    start = time.perf_counter()
    program, lowered = run_program.lower_train_step(config, mesh)
    program = program.solo
    compiled = lowered.compile()
    compile_seconds = time.perf_counter() - start
    state, batch = program.init(jax.random.PRNGKey(0)), random_batch(mesh)
    hparams = jax.device_put(program_lib.hyperparameters(config), mesh_lib.replicated(mesh))
    state, metrics = compiled(state, batch, hparams)  # first run: allocation and warm-up
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch, hparams)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - start)
    return {"depth": depth, "width": width, "scan_layers": scan_layers, "compile_seconds": compile_seconds,
            "step_ms": 1e3 * statistics.median(times), "steps_timed": steps}


def main() -> None:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--depths", type=int, nargs="+", default=[6, 24, 48], help="layer counts (default: %(default)s)")
    parser.add_argument("--width", type=int, default=64, help="model width in channels (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per config, median (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per (depth, layout)")
    args = parser.parse_args()
    if min(args.depths) < 1 or args.width < 1 or args.steps < 1:
        print("error: --depths, --width and --steps must be positive integers", file=sys.stderr)
        sys.exit(2)
    measure(1, args.width, True, 1)  # pay JAX's one-off start-up costs outside the table
    rows = [measure(depth, args.width, scan, args.steps) for depth in args.depths for scan in (True, False)]
    if args.json:
        print(json.dumps(rows))
        return
    by_key = {(r["depth"], r["scan_layers"]): r for r in rows}
    print(f"width {args.width}, sequence 128, batch 16; compile = trace + lower + XLA compile of train_step")
    print(f"{'L':>4} {'scanned compile':>16} {'step':>9} {'unrolled compile':>17} {'step':>9}")
    for depth in args.depths:
        scanned, unrolled = by_key[(depth, True)], by_key[(depth, False)]
        print(f"{depth:>4} {scanned['compile_seconds']:>15.1f}s {scanned['step_ms']:>7.0f}ms "
              f"{unrolled['compile_seconds']:>16.1f}s {unrolled['step_ms']:>7.0f}ms")
    first, last = args.depths[0], args.depths[-1]
    growth = by_key[(last, True)]["compile_seconds"] / by_key[(first, True)]["compile_seconds"]
    print(f"scanned compile time, L={last} / L={first}: {growth:.2f}x")


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    main()
