"""Compiled memory of the real train step against depth, for each remat policy.

For each depth (default 6, 12, 24) at width 256 (sequence 128, batch 16, the
throughput benchmark's model, scanned layers) and each ``ModelConfig.remat``
policy, it compiles the train step ahead of time (``scaling.model.run_program.lower_train_step``)
from abstract shapes (nothing is allocated) and reports XLA's
``memory_analysis()`` in MiB:
- temp: scratch buffers live during the step (activations kept for the
  backward pass dominate it; this is what remat trades for recomputation);
- argument / output: the train state and batch in, the new state and metrics
  out (the state is donated, so most output aliases the arguments).
The last column is the temp reduction against ``remat=none``.

    python benchmarks/memory.py
    python benchmarks/memory.py --depths 24 --width 256 --json
"""

from __future__ import annotations

import json
import sys

from throughput import train_config  # first: it configures JAX for this CPU benchmark

from scaling import cli

POLICIES = ("none", "full", "dots", "dots_no_batch")
MIB = 2**20


def measure(depth: int, width: int, remat: str, scan_layers: bool = True) -> dict:
    """XLA's compiled memory figures (bytes) of the train step for one config."""
    import jax

    from scaling.model import mesh as mesh_lib
    from scaling.model import program as program_lib, run_program
    from scaling.config import MeshConfig

    config = train_config(depth, width, remat=remat, scan_layers=scan_layers)
    mesh = mesh_lib.make_mesh(MeshConfig(), jax.devices()[:1])
    _, lowered = run_program.lower_train_step(config, mesh)
    stats = lowered.compile().memory_analysis()
    return {"depth": depth, "width": width, "remat": remat, "scan_layers": scan_layers,
            "temp_bytes": int(stats.temp_size_in_bytes), "argument_bytes": int(stats.argument_size_in_bytes),
            "output_bytes": int(stats.output_size_in_bytes), "alias_bytes": int(stats.alias_size_in_bytes)}


def main() -> None:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--depths", type=int, nargs="+", default=[6, 12, 24], help="layer counts (default: %(default)s)")
    parser.add_argument("--width", type=int, default=256, help="model width in channels (default: %(default)s)")
    parser.add_argument("--remat", nargs="+", default=list(POLICIES), choices=POLICIES,
                        help="remat policies to compare (default: all)")
    parser.add_argument("--unrolled", action="store_true", help="unrolled layers instead of nn.scan")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per (depth, policy)")
    args = parser.parse_args()
    if min(args.depths) < 1 or args.width < 1:
        print("error: --depths and --width must be positive integers", file=sys.stderr)
        sys.exit(2)
    policies = ["none"] + [p for p in args.remat if p != "none"]
    rows = [measure(depth, args.width, remat, not args.unrolled) for depth in args.depths for remat in policies]
    baseline = {r["depth"]: r["temp_bytes"] for r in rows if r["remat"] == "none"}
    for r in rows:
        r["temp_reduction_vs_none"] = 1.0 - r["temp_bytes"] / baseline[r["depth"]]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"width {args.width}, sequence 128, batch 16, {'unrolled' if args.unrolled else 'scanned'} layers; MiB")
    print(f"{'L':>4} {'remat':>14} {'temp':>9} {'argument':>9} {'output':>9} {'temp cut':>9}")
    for r in rows:
        print(f"{r['depth']:>4} {r['remat']:>14} {r['temp_bytes'] / MIB:>9.1f} {r['argument_bytes'] / MIB:>9.1f} "
              f"{r['output_bytes'] / MIB:>9.1f} {100 * r['temp_reduction_vs_none']:>8.0f}%")


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    main()
