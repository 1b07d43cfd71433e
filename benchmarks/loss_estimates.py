"""TPU step-time estimates split into loss, layers and rest, for each loss implementation (``model.loss_impl``).

    python benchmarks/loss_estimates.py save DIR                 # the paper sweep's L6 rows on v5e:2x4, both impls
    python benchmarks/loss_estimates.py save DIR --gpt3-xl       # and GPT-3 XL (fsdp=256) on v5e:16x16
    python benchmarks/loss_estimates.py table DIR > benchmarks/loss_estimates.md

``save`` compiles each run's train step ahead of time for its slice with
libtpu on this CPU (``benchmarks/compiled_steps.py``'s ``save``: NAME.hlo and
NAME.json), once per loss implementation; nothing runs on a TPU. ``table``
prices every saved program twice, as the preflight does: by the compiler's
own estimate (libtpu's ``estimated_cycles`` per op, the schedule replayed
with loop trip counts: ``sweeps.preflight.compiler_estimate``) and by the
corrected roofline (``sweeps.preflight.roofline_corrections``), and splits
each into three parts by where the ops of the step's top level come from
(the Python stack XLA keeps for every op, ``stack_frame_id`` in its metadata;
a loop counts whole, for the part most of its ops belong to):

- loss: ``scaling/model/loss.py`` and ``scaling/model/fused_loss.py`` (both
  loss loops, forward and backward, the gather of the unembedding);
- layers: the ops of one layer (``Block``, ``SelfAttention``, ``FeedForward``
  in ``scaling/model/transformer.py``, ``attention.py``): the layer loops
  forward and backward;
- rest: the step less the two (embedding, final norm, optimizer, gradient
  norm, exposed collectives).

Needs libtpu (``pip install -e ".[tpu]"``). Every figure is an estimate.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

LOSS_FILES = ("scaling/model/loss.py", "scaling/model/fused_loss.py", "scaling/model/pallas_loss.py")
MODEL_FILE, ATTENTION_FILE = "scaling/model/transformer.py", "scaling/model/attention.py"
LAYER_CLASSES = ("Block.", "SelfAttention.", "FeedForward.")  # functions of one layer in MODEL_FILE
_FRAME = re.compile(r"stack_frame_id=(\d+)")
IMPLS = ("chunked", "fused", "pallas")


MESHES = {"fsdp": (1, -1), "data": (-1, 1)}  # (data, fsdp): parameters sharded over the chips, or replicated


def runs(gpt3_xl: bool, pattern: str = "L6-*", impls=IMPLS, meshes=("fsdp",)) -> list[tuple[str, object, str]]:
    """(name, TrainConfig, topology) per loss implementation of ``impls`` and mesh of ``meshes`` (``MESHES``,
    whatever the sweep's own: it trains small runs data-parallel): the paper sweep's rows matching ``pattern``
    (seed 0) on v5e:2x4, and with ``gpt3_xl`` GPT-3 XL on v5e:16x16 (``compiled_steps.runs_to_save``; GPT-3 XL
    keeps its own mesh)."""
    from compiled_steps import runs_to_save
    from scaling.config import MeshConfig

    chosen = [(run, mesh) for run in runs_to_save("paper", pattern) for mesh in meshes]
    chosen += [(run, "fsdp") for run in (runs_to_save("gpt3-xl") if gpt3_xl else [])]
    out = []
    for (name, config, topology), mesh in chosen:
        if not name.startswith("gpt3"):
            data, fsdp = MESHES[mesh]
            config = dataclasses.replace(config, mesh=dataclasses.replace(config.mesh, data=data, fsdp=fsdp))
            name += "-data" if mesh == "data" else ""  # the names of programs saved before the mesh was a choice
        for impl in impls:
            out.append((f"{name}-{impl}", dataclasses.replace(config, model=dataclasses.replace(
                config.model, loss_impl=impl)), topology))
    return out


def mesh_name(config) -> str:
    """``fsdp`` or ``data`` for a saved program's mesh: the parameters sharded over the chips, or replicated."""
    return "data" if config.mesh.fsdp == 1 else "fsdp"


def _table(hlo_text: str, name: str) -> dict[int, str]:
    """One of the tables compiled HLO text opens with (``FileNames``, ``FileLocations``, ``StackFrames``, ...)."""
    found = re.search(rf"^{name}\n(.*?)(?:\n\n|\Z)", hlo_text, re.S | re.M)
    rows = (line.split(" ", 1) for line in found.group(1).splitlines()) if found else ()
    return {int(key): value for key, value in rows}


def frame_parts(hlo_text: str) -> dict[int, str]:
    """``loss``, ``layers`` or ``rest`` per stack frame of the program's op metadata, from the op's Python
    stack read from the innermost frame out: a frame of one layer (``LAYER_CLASSES`` in the model file, or
    the attention file) makes it ``layers``; the model's own call outside its layers (embedding, final
    norm) ``rest``; the loss files ``loss`` (a layer's op is called from the loss's ``loss_sums`` too, so
    the innermost decides); a stack with none of these (the optimizer) is ``rest``.

    A frame's ``parent_frame_id`` counts from 1 with 0 for none, one more than the frame's printed id
    (libtpu 0.0.42.1's text), as the stacks read this way show: Dense.__call__ <- FeedForward.__call__ <-
    Block.__call__ <- ... <- loss_sums <- ... <- train_step."""
    files = {key: value.strip('"') for key, value in _table(hlo_text, "FileNames").items()}
    functions = {key: value.strip('"') for key, value in _table(hlo_text, "FunctionNames").items()}
    locations, frames = ({key: dict(re.findall(r"(\w+)=(\d+)", value)) for key, value in _table(hlo_text, name).items()}
                         for name in ("FileLocations", "StackFrames"))

    def part(frame: int) -> str:
        seen = set()
        while frame in frames and frame not in seen:
            seen.add(frame)
            location = locations[int(frames[frame]["file_location_id"])]
            path = files.get(int(location["file_name_id"]), "")
            function = functions.get(int(location["function_name_id"]), "")
            if path.endswith(ATTENTION_FILE) or (path.endswith(MODEL_FILE) and function.startswith(LAYER_CLASSES)):
                return "layers"
            if path.endswith(MODEL_FILE) and function.startswith("Transformer."):
                return "rest"
            if path.endswith(LOSS_FILES):
                return "loss"
            frame = int(frames[frame]["parent_frame_id"]) - 1
        return "rest"

    return {frame: part(frame) for frame in frames}


def _part_counts(module, name: str, parts: dict, memo: dict) -> collections.Counter:
    """How many ops of computation ``name`` and of everything it calls belong to each part."""
    if name not in memo:
        memo[name] = collections.Counter()
        computation = module.computation(name)
        for instruction in computation.instructions if computation else ():
            memo[name] += _instruction_counts(module, instruction, parts, memo)
    return memo[name]


def _instruction_counts(module, instruction, parts: dict, memo: dict) -> collections.Counter:
    frame = _FRAME.search(instruction.attributes)
    counts = collections.Counter([parts.get(int(frame.group(1)), "rest")] if frame else [])
    for _, callee in instruction.called():
        counts += _part_counts(module, callee, parts, memo)
    return counts


def part_of(module, instruction, parts: dict, memo: dict) -> str:
    """``loss``, ``layers`` or ``rest``: the part most of an op's (or a loop's) ops belong to."""
    counts = _instruction_counts(module, instruction, parts, memo)
    return max(("loss", "layers", "rest"), key=lambda name: counts[name]) if counts else "rest"


def parted(base):
    """``base`` (a ``hlo_cost.ProgramCoster``) that also adds up the seconds of the entry computation's ops and
    loops by ``part_of`` in ``parts``."""

    class Parted(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.parts, self._memo = collections.Counter(), {}

        def _record(self, computation, instruction, seconds: float) -> float:
            if computation.is_entry:
                self.parts[part_of(self.module, instruction, self.frame_parts, self._memo)] += seconds
            return seconds

        def _priced_op(self, computation, instruction, cost):
            return self._record(computation, instruction, super()._priced_op(computation, instruction, cost))

        def _control_flow(self, computation, instruction, cost):
            return self._record(computation, instruction, super()._control_flow(computation, instruction, cost))

    return Parted


def split_estimates(hlo_text: str, generation: str, devices, kernel_cost) -> dict:
    """``{"compiler": {...}, "roofline": {...}}``, each ``step``, ``loss``, ``layers``, ``rest`` in seconds (the
    rest is the step less the other two, so it holds the collectives the schedule leaves exposed)."""
    from sweeps.preflight import compiler_estimate, hlo, roofline, roofline_corrections, tensorcore

    logical = hlo.parse(hlo_text)
    padded_text = roofline_corrections.padded_hlo_text(hlo_text)
    parts_by_frame, found = frame_parts(hlo_text), {}
    for kind, base in (("compiler", compiler_estimate.CompilerCoster),
                       ("roofline", roofline_corrections.CorrectedCoster)):
        def make(*args, kind=kind, base=base):
            found[kind] = parted(base)(*args)
            found[kind].clock, found[kind].frame_parts = tensorcore.clock_hz(generation), parts_by_frame
            return found[kind]

        step = roofline.estimate(roofline_corrections.corrected_cost(
            hlo_text, generation, devices, kernel_cost, coster=make, padded_text=padded_text,
            logical_module=logical)).step_seconds
        parts = found[kind].parts
        found[kind] = {"step": step, "loss": parts["loss"], "layers": parts["layers"],
                       "rest": None if step is None else step - parts["loss"] - parts["layers"]}
    return found


def _multiplicities(module) -> dict[str, float]:
    """How many times each computation runs per step: loop bodies by their trip counts (conditions once
    more), called and async computations once per call, all from the entry computation."""
    from sweeps.preflight import hlo

    times: dict[str, float] = collections.defaultdict(float)

    def visit(name: str, count: float) -> None:
        computation = module.computation(name)
        if computation is None:
            return
        times[name] += count
        for instruction in computation.instructions:
            if instruction.opcode not in ("while", "call", "conditional", "async-start"):
                continue
            trips = hlo.trip_count(module, computation, instruction) or 1 if instruction.opcode == "while" else 1
            for role, callee in instruction.called():
                visit(callee, count * (trips + (role == "condition")))

    visit(module.entry, 1.0)
    return times


def top_ops(hlo_text: str, generation: str, devices, kernel_cost, count: int = 12) -> list[dict]:
    """The ``count`` costliest ops of one step by the compiler's estimate (its ``estimated_cycles`` where it
    wrote them, the corrected roofline elsewhere: kernels, collectives), loops counted by their trips:
    ``{"op", "opcode", "shape", "part", "runs", "seconds"}`` (seconds per step, all runs)."""
    from sweeps.preflight import compiler_estimate, roofline_corrections, tensorcore

    seen: dict[tuple[str, str], tuple[float, object]] = {}

    class Recording(compiler_estimate.CompilerCoster):
        def _priced_op(self, computation, instruction, cost):
            seconds = super()._priced_op(computation, instruction, cost)
            seen[(computation.name, instruction.name)] = (seconds, instruction)
            return seconds

    def make(*args):
        coster = Recording(*args)
        coster.clock = tensorcore.clock_hz(generation)
        made["it"] = coster
        return coster

    made: dict = {}
    roofline_corrections.corrected_cost(hlo_text, generation, devices, kernel_cost, coster=make)
    module, parts, memo = made["it"].module, frame_parts(hlo_text), {}
    times = _multiplicities(module)
    rows = []
    for (computation, _), (seconds, instruction) in seen.items():
        runs = times.get(computation, 0.0)
        if runs and seconds:
            shape = ",".join(f"{a.dtype}[{'x'.join(map(str, a.dims))}]" for a in instruction.arrays[:2])
            # A splash-attention call carries no stack of this project's frames: it is a layer's by its name.
            part = "layers" if instruction.name.startswith("splash_mha") else part_of(module, instruction, parts, memo)
            rows.append({"op": instruction.name, "opcode": instruction.opcode, "shape": shape, "runs": runs,
                         "part": part, "seconds": seconds * runs})
    return sorted(rows, key=lambda row: -row["seconds"])[:count]


def price(directory: Path) -> list[dict]:
    """One row per saved program: name, impl, topology, HBM, and ``split_estimates``."""
    from scaling.config import TrainConfig, from_dict
    from scaling.model import mesh as mesh_lib
    from sweeps import preflight
    from sweeps.preflight import kernels

    rows = []
    for meta_path in sorted(p for p in directory.glob("*.json") if p.name != "rows.json"):
        meta = json.loads(meta_path.read_text())
        config = from_dict(TrainConfig, meta["config"])
        topology = preflight.parse_topology(meta["topology"])
        mesh = mesh_lib.make_mesh(config.mesh, preflight.topology_devices(topology))
        split = split_estimates(meta_path.with_suffix(".hlo").read_text(), topology.generation, mesh.devices.flat,
                                kernels.kernel_cost(config.model))
        rows.append({"name": meta["name"].rsplit("-", 1)[0].removesuffix("-data"), "impl": config.model.loss_impl,
                     "mesh": mesh_name(config),
                     "topology": meta["topology"], "jax": meta["jax"], "hbm_bytes": meta["hbm_bytes_per_device"],
                     **split})
    return rows


def print_ops(directory: Path, name: str, count: int) -> int:
    """Print ``top_ops`` of DIR/NAME as a markdown table; 2 if NAME was not saved there."""
    from scaling.config import TrainConfig, from_dict
    from scaling.model import mesh as mesh_lib
    from sweeps import preflight
    from sweeps.preflight import kernels

    meta_path = directory / f"{name}.json"
    if not meta_path.is_file():
        print(f"error: no saved program {name} in {directory} (save it first)", file=sys.stderr)
        return 2
    meta = json.loads(meta_path.read_text())
    config = from_dict(TrainConfig, meta["config"])
    topology = preflight.parse_topology(meta["topology"])
    mesh = mesh_lib.make_mesh(config.mesh, preflight.topology_devices(topology))
    rows = top_ops(meta_path.with_suffix(".hlo").read_text(), topology.generation, mesh.devices.flat,
                   kernels.kernel_cost(config.model), count)
    print(f"{name} on {meta['topology']}: the costliest ops by the compiler's estimate (ms per step, all runs)\n")
    print("| op | opcode | result | part | runs | ms |\n|---|---|---|---|---:|---:|")
    for row in rows:
        print(f"| {row['op']} | {row['opcode']} | {row['shape']} | {row['part']} | {row['runs']:,.0f} "
              f"| {row['seconds'] * 1e3:,.2f} |")
    return 0


def _ms(seconds) -> str:
    return "?" if seconds is None else f"{seconds * 1e3:,.1f}"


def table(rows: list[dict]) -> str:
    """The rows as a markdown table: per run and impl, both estimates' step and parts in ms."""
    lines = ["| run | slice | params | loss impl | compiler: step | loss | layers | rest | roofline: step | loss "
             "| layers | rest | HBM/chip GiB |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        c, r = row["compiler"], row["roofline"]
        lines.append(f"| {row['name']} | {row['topology']} | {row.get('mesh', 'fsdp')} | {row['impl']} "
                     f"| **{_ms(c['step'])}** | {_ms(c['loss'])} "
                     f"| {_ms(c['layers'])} | {_ms(c['rest'])} | {_ms(r['step'])} | {_ms(r['loss'])} "
                     f"| {_ms(r['layers'])} | {_ms(r['rest'])} | {row['hbm_bytes'] / 2**30:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    save_parser = commands.add_parser("save", help="compile the runs' train steps into DIR (minutes each)")
    save_parser.add_argument("directory", type=Path, metavar="DIR")
    save_parser.add_argument("--gpt3-xl", action="store_true", help="also GPT-3 XL on v5e:16x16")
    save_parser.add_argument("--rows", default="L6-*", help="the paper sweep's rows to compile (a glob; default L6-*)")
    save_parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS),
                             help="loss implementations to compile (default: all)")
    save_parser.add_argument("--meshes", nargs="+", choices=list(MESHES), default=["fsdp"],
                             help="the paper rows' meshes: fsdp (parameters sharded) and/or data (replicated); "
                                  "default fsdp")
    table_parser = commands.add_parser("table", help="price DIR's programs: a markdown table (and DIR/rows.json)")
    table_parser.add_argument("directory", type=Path, metavar="DIR")
    ops_parser = commands.add_parser("ops", help="the costliest ops of one saved program (the compiler's estimate)")
    ops_parser.add_argument("directory", type=Path, metavar="DIR")
    ops_parser.add_argument("name", help="a saved program's name (DIR/NAME.hlo), e.g. L6-d128-s0-data-pallas")
    ops_parser.add_argument("--top", type=int, default=12, help="how many ops (default 12)")
    args = parser.parse_args(argv)
    if args.command == "ops":
        return print_ops(args.directory, args.name, args.top)
    if args.command == "save":
        from compiled_steps import save

        save(args.directory, runs(args.gpt3_xl, args.rows, args.impls, args.meshes))
        return 0
    if not args.directory.is_dir():
        print(f"error: {args.directory} is not a directory of saved programs", file=sys.stderr)
        return 2
    rows = price(args.directory)
    print(table(rows))
    (args.directory / "rows.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    sys.exit(main())
