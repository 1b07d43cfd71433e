"""Where one CPU train step's time goes: XLA's own op timings, grouped by kind and by pass.

Profiles the benchmark step of ``benchmarks/throughput.py`` (same config, same
allocator tuning, the layout it recommends for the depth) with
``jax.profiler.trace`` and reads the Perfetto trace that JAX writes beside it.
Every XLA op the CPU runtime executed in the traced steps is a complete
event; each one is looked up in the compiled HLO and counted under

- its **kind**: ``matmul`` (a dot, or a fusion that contains one), ``reduce``
  (a fusion or op with a reduction: softmax sums, layer-norm moments, the
  global norm), ``copy/transpose``, ``elementwise`` (every other fusion or
  op), ``control`` (loops, calls and conditionals: their time contains their
  body's, so it is shown, not added);
- its **pass**: ``forward`` and ``backward`` from the op's JAX name
  (``jvp(...)`` and ``transpose(jvp(...))``), ``optimizer`` for the rest
  (clipping, AdamW, the schedule);
- for matrix products, its **part** of the model, from the same name:
  attention's q/k/v and output projections, its scores and mixing (the
  einsums), the feed-forward's two layers, and the rest (the tied
  embedding/unembedding and the loss).

With ``--peer`` the same step of nanoGPT's model.py is profiled with
``torch.profiler`` and its top operators are printed below, for comparison.

    python benchmarks/step_profile.py                           # 4x256, ours only
    python benchmarks/step_profile.py --config 4x256 --peer /path/to/nanoGPT/model.py
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from scaling import cli
from sweeps.preflight import hlo

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = ("matmul", "reduce", "copy/transpose", "elementwise")
PASSES = ("forward", "backward", "optimizer")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CONTROL = {"while", "call", "conditional"}
_DATA_MOVEMENT = {"fusion", "parameter", "copy", "transpose", "bitcast", "reshape", "slice", "concatenate",
                  "dynamic-slice", "dynamic-update-slice", "broadcast", "constant", "tuple", "get-tuple-element"}
PARTS = ("attention q/k/v", "attention out", "attention scores+mix", "mlp in", "mlp out", "embedding+loss")


def model_part(op_name: str) -> str:
    """Which of ``PARTS`` a matrix product belongs to, from its JAX op name (``.../layers_2/mlp/wo/dot_general``)."""
    path = op_name.split("/")
    if "attention" in path:
        module = path[path.index("attention") + 1] if path.index("attention") + 1 < len(path) else ""
        return {"query": PARTS[0], "key": PARTS[0], "value": PARTS[0], "out": PARTS[1]}.get(module, PARTS[2])
    if "mlp" in path:
        return PARTS[3] if "wi" in path else PARTS[4]
    return PARTS[5]


def hlo_ops(hlo_text: str) -> dict[str, tuple[str, str, str]]:
    """Each instruction's name in optimized HLO text -> (kind, pass, part), as the module docstring says
    (``part`` is empty for everything but matrix products). The text is read by ``sweeps.preflight.hlo.parse``."""
    module = hlo.parse(hlo_text)

    def opcodes(computation_name: str, seen: tuple = ()) -> set[str]:
        found = set()
        for instruction in getattr(module.computation(computation_name), "instructions", []):
            found.add(instruction.opcode)
            for _, called in instruction.called():
                if called not in seen:
                    found |= opcodes(called, (*seen, called))
        return found

    ops = {}
    for computation in module.computations.values():
        for instruction in computation.instructions:
            opcode = instruction.opcode
            inner = {opcode}
            if opcode == "fusion":
                for _, called in instruction.called():
                    inner |= opcodes(called)
            if opcode in _CONTROL:
                kind = "control"
            elif inner & {"dot", "convolution"}:
                kind = "matmul"
            elif inner & {"reduce", "reduce-window"}:
                kind = "reduce"
            elif opcode in {"copy", "transpose"} or (opcode == "fusion" and inner <= _DATA_MOVEMENT):
                kind = "copy/transpose"
            else:
                kind = "elementwise"
            op_name = _OP_NAME.search(instruction.attributes)
            name = op_name.group(1) if op_name else ""
            phase = "backward" if "transpose(" in name else "forward" if "jvp(" in name else "optimizer"
            ops[instruction.name] = (kind, phase, model_part(name) if kind == "matmul" else "")
    return ops


def trace_events(log_dir: str) -> list[dict]:
    """The complete events of the Perfetto trace that ``jax.profiler.trace`` wrote under ``log_dir``."""
    files = glob.glob(os.path.join(log_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    if not files:
        raise RuntimeError(f"no perfetto_trace.json.gz under {log_dir}; this JAX did not write one")
    with gzip.open(files[0], "rt") as handle:
        trace = json.load(handle)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [event for event in events if event.get("ph") == "X" and "dur" in event]


def profile_ours(depth: int, width: int, steps: int) -> dict:
    """Milliseconds per step by (kind, pass) over ``steps`` traced steps, and the step's wall time."""
    import jax
    import throughput

    ours = throughput.Ours(depth, width, scan_layers=depth > throughput.UNROLL_UP_TO_DEPTH)
    compiled = ours.step.lower(ours.state, ours.batch, ours.hparams).compile()
    ops = hlo_ops(compiled.as_text())
    ours.run(3)
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            wall = ours.run(steps)
        events = trace_events(log_dir)
    table, parts = collections.defaultdict(float), collections.defaultdict(float)
    unmatched = collections.Counter()
    for event in events:
        name = event["name"]
        if name in ops:
            kind, phase, part = ops[name]
            table[kind, phase] += event["dur"] / 1e3 / steps
            if part:
                parts[part, phase] += event["dur"] / 1e3 / steps
        elif re.match(r"^[\w.\-]+$", name) and ("fusion" in name or "." in name):
            unmatched[name] += event["dur"] / 1e3 / steps
    return {"wall_ms": 1e3 * wall / steps, "table": dict(table), "matmul_parts": dict(parts), "unmatched_ms": sum(unmatched.values()),
            "top_unmatched": unmatched.most_common(5)}


def profile_peer(path: str, depth: int, width: int, steps: int) -> list[tuple[str, float]]:
    """The peer's top operators, (name, self CPU milliseconds per step), from ``torch.profiler``."""
    import throughput
    import torch

    torch.set_num_threads(throughput.THREADS)
    peer = throughput.Peer(throughput.load_peer(path), depth, width)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        peer.run(steps)
    averages = sorted(prof.key_averages(), key=lambda row: row.self_cpu_time_total, reverse=True)
    return [(row.key, row.self_cpu_time_total / 1e3 / steps) for row in averages[:12]]


def print_ours(result: dict, depth: int, width: int) -> None:
    table = result["table"]
    counted = sum(value for (kind, _), value in table.items() if kind != "control")
    print(f"ours, {depth}x{width}: {result['wall_ms']:.1f} ms per step (wall, traced); XLA ops add up to "
          f"{counted:.1f} ms; ops not found in the HLO: {result['unmatched_ms']:.1f} ms")
    print(f"{'kind':<16}" + "".join(f"{phase:>12}" for phase in PASSES) + f"{'all':>12}{'share':>8}")
    for kind in KINDS:
        values = [table.get((kind, phase), 0.0) for phase in PASSES]
        print(f"{kind:<16}" + "".join(f"{value:>12.2f}" for value in values)
              + f"{sum(values):>12.2f}{sum(values) / max(counted, 1e-9):>8.0%}")
    totals = [sum(table.get((kind, phase), 0.0) for kind in KINDS) for phase in PASSES]
    print(f"{'all':<16}" + "".join(f"{value:>12.2f}" for value in totals) + f"{sum(totals):>12.2f}")
    print(f"\nmatrix products by part of the model, ms per step:\n{'part':<22}"
          + "".join(f"{phase:>12}" for phase in PASSES[:2]) + f"{'all':>12}")
    for part in PARTS:
        values = [result["matmul_parts"].get((part, phase), 0.0) for phase in PASSES[:2]]
        print(f"{part:<22}" + "".join(f"{value:>12.2f}" for value in values) + f"{sum(values):>12.2f}")
    control = sum(value for (kind, _), value in table.items() if kind == "control")
    if control:
        print(f"(loops and calls, containing the above: {control:.2f} ms)")


def main() -> None:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--config", default="4x256", metavar="LxD", help="depth x width (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10, help="traced steps (default: %(default)s)")
    parser.add_argument("--peer", default=os.environ.get("NANOGPT_MODEL"),
                        help="path to nanoGPT's model.py, to profile the peer too (default: $NANOGPT_MODEL)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args()
    import throughput  # tunes glibc's allocator and picks the CPU before JAX starts, as the command lines do

    try:
        depth, width = throughput.parse_config(args.config)
        if args.steps < 1:
            raise ValueError(f"--steps {args.steps}: must be >= 1")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    ours = profile_ours(depth, width, args.steps)
    peer = profile_peer(args.peer, depth, width, args.steps) if args.peer else None
    if args.json:
        print(json.dumps({"ours": {**ours, "table": [[*key, value] for key, value in ours["table"].items()],
                                   "matmul_parts": [[*key, value] for key, value in ours["matmul_parts"].items()]},
                          "peer": peer}))
        return
    print_ours(ours, depth, width)
    if peer:
        print("\npeer (nanoGPT, torch.profiler), top operators by self CPU time, ms per step:")
        for name, milliseconds in peer:
            print(f"  {name:<40}{milliseconds:>10.2f}")


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    main()
