"""Save compiled TPU train steps (HLO text and memory), then price them with this checkout's roofline.

    python benchmarks/compiled_steps.py save DIR paper 'L6-*-s0' v5e:2x4   # the paper sweep's runs that match
    python benchmarks/compiled_steps.py save DIR gpt3-xl                    # GPT-3 XL, fsdp=256 on v5e:16x16
    python benchmarks/compiled_steps.py price DIR > rows.json               # preflight-style rows, one per file

``save`` compiles with whatever code is first on ``PYTHONPATH`` through its
public names (``scaling.model.run_program.lower_train_step``, ``sweeps.preflight``'s
``topology_devices``, ``sweeps.spec``), so the programs of another commit
from this one on can be saved with it and priced by a newer roofline.
Commits older than ``lower_train_step`` had only the preflight's private
``_compile``, which this script's version of 7c57e3f calls; that is how
``benchmarks/pod_report_before.json`` was saved from the code before issue 27:

    git archive 3cb5523 | tar -x -C /tmp/before     # the code before issue 27
    git show 7c57e3f:benchmarks/compiled_steps.py > /tmp/compiled_steps_then.py
    PYTHONPATH=/tmp/before python /tmp/compiled_steps_then.py save /tmp/hlo-before paper 'L6-*-s0' v5e:2x4
    python benchmarks/compiled_steps.py price /tmp/hlo-before > benchmarks/pod_report_before.json

``price`` needs this checkout; its rows carry the same cost fields as the
preflight's (``sweeps.preflight.estimate_fields``) plus the saved memory.
Needs libtpu (``pip install -e ".[tpu]"``); nothing runs on a TPU.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import time
from pathlib import Path

def gpt3_xl_config(base):
    """GPT-3 XL's shape on the paper sweep's base: L24, d2048, 16 heads of 128, 256 × 2048 tokens, fsdp=256."""
    import dataclasses

    from scaling.config import MeshConfig

    model = dataclasses.replace(base.model, depth=24, width=2048, head_dim=128, max_seq_len=2048)
    return dataclasses.replace(base, model=model, data=dataclasses.replace(base.data, seq_len=2048),
                               batch_size=256, mesh=MeshConfig(data=1, fsdp=256, tensor=1), name="gpt3-xl")


def runs_to_save(which: str, pattern: str = "*", topology: str = "v5e:2x4") -> list[tuple[str, object, str]]:
    """(name, TrainConfig, topology) of the paper sweep's runs matching ``pattern``, or of GPT-3 XL."""
    import sweeps
    from sweeps import spec

    # The paper sweep of the code being run (PYTHONPATH), which may be an older commit's.
    sweep = spec.load_sweep(str(Path(sweeps.__file__).parent / "configs" / "paper.py"))
    if which == "gpt3-xl":
        return [("gpt3-xl-L24-d2048", gpt3_xl_config(sweep.base), "v5e:16x16")]
    return [(run.name, run.config, topology) for run in sweep.expand().runs
            if fnmatch.fnmatch(run.name, pattern) and run.seed == 0]


def save(directory: Path, runs) -> None:
    """Compile each run for its whole topology and write NAME.hlo and NAME.json (memory, config) to ``directory``."""
    import jax

    from scaling.model import mesh as mesh_lib, program as program_lib, run_program
    from scaling.config import to_dict
    from sweeps import preflight

    directory.mkdir(parents=True, exist_ok=True)
    for name, config, topology in runs:
        devices = preflight.topology_devices(preflight.parse_topology(topology))
        mesh = mesh_lib.make_mesh(config.mesh, devices)
        started = time.perf_counter()
        compiled = run_program.lower_train_step(config, mesh)[1].compile()
        stats = compiled.memory_analysis()
        planned = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
                   + stats.temp_size_in_bytes)
        (directory / f"{name}.hlo").write_text(compiled.as_text())
        (directory / f"{name}.json").write_text(json.dumps({
            "name": name, "topology": topology, "chips": len(devices), "jax": jax.__version__,
            "compile_seconds": round(time.perf_counter() - started, 1), "hbm_bytes_per_device": planned,
            "temporary_bytes": stats.temp_size_in_bytes, "config": to_dict(config)}, indent=1))
        print(f"{name}: compiled in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)


def price(directory: Path) -> list[dict]:
    """Preflight-style cost rows of every program saved in ``directory``, priced by this checkout's roofline."""
    from scaling.model import mesh as mesh_lib, program as program_lib, run_program
    from scaling.config import TrainConfig, from_dict
    from sweeps import preflight
    from sweeps.preflight import kernels, roofline

    rows = []
    for meta_path in sorted(directory.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        config = from_dict(TrainConfig, meta["config"])
        topology = preflight.parse_topology(meta["topology"])
        devices = preflight.topology_devices(topology)
        mesh = mesh_lib.make_mesh(config.mesh, devices)
        estimate = roofline.step_estimate(meta_path.with_suffix(".hlo").read_text(), topology.chip, mesh.devices.flat,
                                          kernels.kernel_cost(config.model))
        row = {key: meta[key] for key in ("name", "topology", "chips", "jax", "compile_seconds",
                                           "hbm_bytes_per_device", "temporary_bytes")}
        row["fits"] = meta["hbm_bytes_per_device"] <= preflight.FIT_FRACTION * topology.chip.hbm_bytes
        row["parameters"] = preflight.parameter_count(program_lib.build(config, mesh))
        row.update(preflight.estimate_fields(config, estimate, len(devices), topology.chip))
        rows.append(row)
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 2 and argv[0] == "save":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        save(Path(argv[1]), runs_to_save(*argv[2:]))
        return 0
    if len(argv) == 2 and argv[0] == "price":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        print(json.dumps(price(Path(argv[1])), indent=1))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    sys.exit(main())
