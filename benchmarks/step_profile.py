"""Where one CPU train step's time goes, ours (XLA's own op timings) and nanoGPT's (torch.profiler).

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
  embedding/unembedding and the loss);
- its **part of the step**, the split both frameworks are compared by
  (``CATEGORIES``): the matrix products outside attention, attention (scores,
  softmax, mixing: everything under ``attention/`` but its four projections),
  elementwise ops and layer norms (with copies and the loss), the optimizer
  update (clipping, AdamW, the non-finite guard), and the host work between
  ops: the wall time during which no XLA op ran.

With ``--peer`` the same step of nanoGPT's model.py is profiled with
``torch.profiler`` and split the same way: self CPU time under the optimizer
(clipping and AdamW, labelled), under scaled-dot-product attention, of
``aten::mm``/``addmm``/``bmm``, of every other operator, and the rest of the
wall time (Python, autograd's engine) as host work. Markdown output names
the CPU (``cpu_info.py``) above each table.

    python benchmarks/step_profile.py                           # 4x256, ours only
    python benchmarks/step_profile.py --configs 2x64 4x128 4x256 --peer /path/to/nanoGPT/model.py
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
import time
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
CATEGORIES = ("matmuls", "attention", "elementwise+layernorm", "optimizer update")
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


def hlo_ops(hlo_text: str) -> dict[str, tuple[str, str, str, str]]:
    """Each instruction's name in optimized HLO text -> (kind, pass, part, category), as the module docstring
    says (``part`` is empty for everything but matrix products; ``category`` is one of ``CATEGORIES``).
    The text is read by ``sweeps.preflight.hlo.parse``."""
    module = hlo.parse(hlo_text)

    def opcodes(computation_name: str, seen: tuple = ()) -> set[str]:
        found = set()
        for instruction in getattr(module.computation(computation_name), "instructions", []):
            found.add(instruction.opcode)
            for _, called in instruction.called():
                if called not in seen:
                    found |= opcodes(called, (*seen, called))
        return found

    def op_name(computation, instruction, depth: int = 0) -> str:
        # Some fusions XLA:CPU forms (the attention einsums' ynn_fusion) carry no metadata: they take
        # the JAX name of their first operand that has one, so they are not counted as the optimizer's.
        found = _OP_NAME.search(instruction.attributes)
        if found or depth > 4:
            return found.group(1) if found else ""
        for operand in instruction.operands:
            source = computation.by_name.get(operand)
            if source is not None and (name := op_name(computation, source, depth + 1)):
                return name
        return ""

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
            name = op_name(computation, instruction)
            phase = "backward" if "transpose(" in name else "forward" if "jvp(" in name else "optimizer"
            ops[instruction.name] = (kind, phase, model_part(name) if kind == "matmul" else "",
                                     category(kind, phase, name))
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


def category(kind: str, phase: str, op_name: str) -> str:
    """Which of ``CATEGORIES`` an XLA op belongs to, from its kind, pass and JAX op name: the optimizer's
    ops, attention's scores, softmax and mixing (not its q/k/v/output projections), the other matrix
    products, and everything else (layer norms, GELU, residual adds, copies, the loss)."""
    if phase == "optimizer":
        return "optimizer update"
    path = op_name.split("/")
    if "attention" in path:
        module = path[path.index("attention") + 1] if path.index("attention") + 1 < len(path) else ""
        if module not in ("query", "key", "value", "out"):
            return "attention"
    return "matmuls" if kind == "matmul" else "elementwise+layernorm"


def busy_ms(events: list[dict]) -> float:
    """Milliseconds during which at least one of ``events`` (complete trace events, µs) was running."""
    total, reach = 0.0, float("-inf")
    for begin, end in sorted((event["ts"], event["ts"] + event["dur"]) for event in events):
        if end > reach:
            total += end - max(begin, reach)
            reach = end
    return total / 1e3


def profile_ours(depth: int, width: int, steps: int) -> dict:
    """Milliseconds per step by (kind, pass), by model part, by ``CATEGORIES``, and the step's wall time.

    ``categories`` are XLA thread-milliseconds (the 2 threads overlap);
    ``host`` is the wall time during which no XLA op ran (dispatch, the
    runtime's scheduling, waiting), from the union of the ops' intervals.
    """
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
    table, parts, categories = (collections.defaultdict(float) for _ in range(3))
    unmatched = collections.Counter()
    matched = [event for event in events if event["name"] in ops and ops[event["name"]][0] != "control"]
    for event in events:
        name = event["name"]
        if name in ops:
            kind, phase, part, group = ops[name]
            table[kind, phase] += event["dur"] / 1e3 / steps
            if part:
                parts[part, phase] += event["dur"] / 1e3 / steps
            if kind != "control":
                categories[group] += event["dur"] / 1e3 / steps
        elif re.match(r"^[\w.\-]+$", name) and ("fusion" in name or "." in name):
            unmatched[name] += event["dur"] / 1e3 / steps
    wall_ms = 1e3 * wall / steps
    return {"wall_ms": wall_ms, "table": dict(table), "matmul_parts": dict(parts), "categories": dict(categories),
            "host_ms": max(wall_ms - busy_ms(matched) / steps, 0.0), "unmatched_ms": sum(unmatched.values()),
            "top_unmatched": unmatched.most_common(5)}


def peer_category(event) -> str:
    """Which of ``CATEGORIES`` (or ``host``) a ``torch.profiler`` event's self time belongs to, by its name
    and its callers': under the optimizer's label, under scaled-dot-product attention, a matrix product,
    a framework wrapper (autograd's engine, our labels: host), or any other operator."""
    names, parent = [], event
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    if any(name == "peer.optimizer" for name in names):
        return "optimizer update"
    if any("scaled_dot_product" in name.lower() for name in names):
        return "attention"
    if event.name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"):
        return "matmuls"
    if event.name.startswith(("autograd::", "peer.")) or not event.name.startswith("aten::"):
        return "host"
    return "elementwise+layernorm"


def profile_peer(path: str, depth: int, width: int, steps: int) -> dict:
    """The peer's step by ``CATEGORIES`` (self CPU milliseconds per step, from ``torch.profiler``), its wall
    time, ``host`` (the wall time outside every operator's self time: Python, autograd's engine), and its
    top operators."""
    import throughput
    import torch

    torch.set_num_threads(throughput.THREADS)
    peer = throughput.Peer(throughput.load_peer(path), depth, width)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):  # Peer.run's step, with the optimizer labelled
            _, loss = peer.model(peer.inputs, peer.targets)
            peer.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            with torch.profiler.record_function("peer.optimizer"):
                torch.nn.utils.clip_grad_norm_(peer.model.parameters(), 1.0)
                peer.optimizer.step()
        wall_ms = (time.perf_counter() - start) * 1e3 / steps
    categories = collections.defaultdict(float)
    for event in prof.events():
        categories[peer_category(event)] += event.self_cpu_time_total / 1e3 / steps
    host = categories.pop("host", 0.0)
    host += max(wall_ms - host - sum(categories.values()), 0.0)
    averages = sorted(prof.key_averages(), key=lambda row: row.self_cpu_time_total, reverse=True)
    return {"wall_ms": wall_ms, "categories": dict(categories), "host_ms": host,
            "top": [(row.key, row.self_cpu_time_total / 1e3 / steps) for row in averages[:12]]}


def category_rows(ours: dict, peer: dict | None) -> list[tuple[str, float, float, float | None]]:
    """(category, our XLA thread-ms, ours scaled to wall ms, the peer's ms) per step, ``host`` last.

    Ours are scaled so that the categories and host add up to the step's wall
    time: each category's share of the ops' thread time, times the wall time
    during which ops ran. The peer's operators run one at a time (each using
    both threads inside), so its self times are already wall time."""
    op_ms = sum(ours["categories"].values())
    busy = ours["wall_ms"] - ours["host_ms"]
    rows = []
    for name in CATEGORIES:
        thread_ms = ours["categories"].get(name, 0.0)
        rows.append((name, thread_ms, busy * thread_ms / max(op_ms, 1e-9),
                     peer["categories"].get(name, 0.0) if peer else None))
    rows.append(("host, between ops", float("nan"), ours["host_ms"], peer["host_ms"] if peer else None))
    return rows


def markdown(config: str, ours: dict, peer: dict | None, cpu: str) -> str:
    """One config's profile as markdown: the categories of both frameworks, then ours by kind and pass."""
    lines = [f"### {config}: ours {ours['wall_ms']:.1f} ms per step"
             + (f", nanoGPT {peer['wall_ms']:.1f} ms" if peer else "") + " (wall, under the profilers)", "",
             f"CPU: {cpu}", "",
             "| part of the step | ours, XLA thread ms | ours, ms of wall | share | nanoGPT ms | share |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, thread_ms, wall_ms, peer_ms in category_rows(ours, peer):
        peer_cells = f"{peer_ms:.2f} | {peer_ms / peer['wall_ms']:.0%}" if peer else "– | –"
        thread = "–" if thread_ms != thread_ms else f"{thread_ms:.2f}"
        lines.append(f"| {name} | {thread} | {wall_ms:.2f} | {wall_ms / ours['wall_ms']:.0%} | {peer_cells} |")
    lines += ["", "Ours by kind of XLA op and pass (thread ms per step):", "",
              "| kind | " + " | ".join(PASSES) + " | all |", "|---|" + "---:|" * (len(PASSES) + 1)]
    for kind in KINDS:
        values = [ours["table"].get((kind, phase), 0.0) for phase in PASSES]
        lines.append(f"| {kind} | " + " | ".join(f"{value:.2f}" for value in values) + f" | {sum(values):.2f} |")
    if peer:
        lines += ["", "nanoGPT's top operators (self CPU ms per step): " + ", ".join(
            f"`{name}` {ms:.1f}" for name, ms in peer["top"][:8])]
    return "\n".join(lines)


def main() -> None:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--configs", nargs="+", default=["4x256"], metavar="LxD",
                        help="depth x width pairs (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10, help="traced steps (default: %(default)s)")
    parser.add_argument("--peer", default=os.environ.get("NANOGPT_MODEL"),
                        help="path to nanoGPT's model.py, to profile the peer too (default: $NANOGPT_MODEL)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown tables")
    args = parser.parse_args()
    import cpu_info
    import throughput  # tunes glibc's allocator and picks the CPU before JAX starts, as the command lines do

    try:
        configs = [throughput.parse_config(text) for text in args.configs]
        if args.steps < 1:
            raise ValueError(f"--steps {args.steps}: must be >= 1")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    cpu = cpu_info.describe()
    results = []
    for depth, width in configs:
        ours = profile_ours(depth, width, args.steps)
        peer = profile_peer(args.peer, depth, width, args.steps) if args.peer else None
        results.append({"config": f"{depth}x{width}", "cpu": cpu, "peer": peer, "ours": {
            **ours, "table": [[*key, value] for key, value in ours["table"].items()],
            "matmul_parts": [[*key, value] for key, value in ours["matmul_parts"].items()]}})
        if not args.json:
            print(markdown(f"{depth}x{width}", ours, peer, cpu["summary"]) + "\n", flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    main()
