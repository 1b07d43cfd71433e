"""Memory, collectives and roofline step time of three TPU compiles (no TPU needed; needs libtpu).

    python benchmarks/preflight_memory.py fsdp-l2    # L2 d256, fsdp=4 on v5e:2x2, with and without activation constraints
    python benchmarks/preflight_memory.py gpt3-xl    # GPT-3 XL at fsdp=256 on v5e:16x16 (pod-wide)
    python benchmarks/preflight_memory.py paper-l6   # the paper sweep's depth-6 runs (seed 0) on one v5e host

``paper-l6`` is exactly
``python -m sweeps.launch preflight sweeps/configs/paper.py --topology v5e:2x2 --only 'L6-*-s0' --json``.
The other two build their config from the paper sweep's base (bfloat16
compute, float32 parameters, AdamW, full remat, scanned layers):
- ``fsdp-l2``: depth 2, width 256, 64 sequences of 1024 tokens, a 260-id
  vocabulary (so the weights are 8 MB and the activations dominate), mesh
  data=1 fsdp=4, compiled unrolled. Printed: collective bytes by kind (whole
  buffers, and bytes each chip sends), temporaries, and the parameter bytes.
  ``--without-activation-constraints`` compiles the same step with the
  model's activation constraints switched off, the layout before they existed.
- ``gpt3-xl``: depth 24, width 2048 (16 heads of 128), 256 sequences of
  2048 tokens, the paper's 50261-id vocabulary, mesh data=1 fsdp=256 over a
  whole v5e:16x16, checked as ``preflight --pod-wide`` checks a run (one
  compile; since issue 27 its costs come from that program's HLO, every loop
  counted, where they used to come from extra depth-1/2 compiles).

Measured with jax 0.10.2 / libtpu 0.0.42.1 on the shared 2-core dev machine, by the
roofline of the time (loops counted once, all collectives added; see benchmarks/pod_report.py
for the same runs priced by the roofline of issue 27):

  before the chunked loss and the padded vocabulary (unpadded 260 ids, whole logits):
    fsdp-l2 --without-activation-constraints: all-gather 3.57 GB (68 ops), all-reduce 0.98 GB,
        temporaries 0.90 GiB, collective bytes sent 4.31 GB per chip (547x the 7.88 MB of parameters)
    fsdp-l2: all-gather 11.9 MB, all-reduce 0.14 MB + one 0.52 MB reduce-scatter, collective-permute
        6.3 MB, temporaries 0.64 GiB, collective bytes sent 15.8 MB per chip (2.0x the parameters)
  with the chunked loss and the vocabulary padded to 384 ids:
    fsdp-l2: all-gather 8.3 MB, all-reduce 0.21 MB, reduce-scatter 0.52 MB, collective-permute 6.6 MB,
        temporaries 0.63 GiB, collective bytes sent 13.5 MB per chip = 1.65x the 8.14 MB of parameters
    gpt3-xl: PASS, 0.95 GiB per chip (0.89 GiB temporaries; 198 GiB before), 23.3 TFLOP, 121 GB of HBM
        traffic and 20.9 GB of ICI traffic per chip per step: compute 0.118 s, memory 0.148 s,
        collectives 0.104 s, roofline step 0.252 s (bound: memory), MFU 37.4% where FLOPs / peak
        alone gives 79.9%; 481 s for its four compiles
    paper-l6: all 4 runs PASS on one v5e host (data=1, fsdp=4), every one memory-bound:
        run         GiB/chip  TFLOP/chip  ICI GB/chip  step s  MFU    MFU from FLOPs/peak
        L6-d128-s0  1.53      4.98        0.073        0.204   9.0%   72.5%
        L6-d192-s0  2.27      7.81        0.116        0.223   13.1%  73.8%
        L6-d256-s0  3.02      10.92       0.163        0.249   16.6%  74.6%
        L6-d320-s0  3.72      14.32       0.215        0.339   16.1%  75.2%
        summary: 5.6 chip-hours, 1.4 h wall on v5e:2x2 (training steps only); 30.8 GiB for L6-d128
        before the sliced loss
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PAPER_SWEEP = REPO / "sweeps" / "configs" / "paper.py"


def paper_base():
    from sweeps import spec

    return spec.load_sweep(PAPER_SWEEP).base


def fsdp_l2_config():
    from scaling.config import MeshConfig

    base = paper_base()
    model = dataclasses.replace(base.model, depth=2, width=256, vocab_size=260, scan_layers=False)
    return dataclasses.replace(base, model=model, batch_size=64, mesh=MeshConfig(data=1, fsdp=4, tensor=1),
                               name="fsdp-l2")


def gpt3_xl_config():
    from scaling.config import MeshConfig

    base = paper_base()
    model = dataclasses.replace(base.model, depth=24, width=2048, head_dim=128, max_seq_len=2048)
    return dataclasses.replace(base, model=model, data=dataclasses.replace(base.data, seq_len=2048),
                               batch_size=256, mesh=MeshConfig(data=1, fsdp=256, tensor=1), name="gpt3-xl")


@contextlib.contextmanager
def activation_constraints(enabled: bool):
    """Switch the model's activation constraints off (``enabled=False``) for the 'before' layout."""
    from scaling.model import mesh as mesh_lib

    original = mesh_lib.activation_sharding
    if not enabled:
        mesh_lib.activation_sharding = lambda mesh, rules: contextlib.nullcontext()
    try:
        yield
    finally:
        mesh_lib.activation_sharding = original


def fsdp_l2(constrained: bool) -> dict:
    """Compile the L2 fsdp=4 step on v5e:2x2 and report its collectives and memory (bytes per chip)."""
    import jax

    from scaling.model import mesh as mesh_lib, program as program_lib, run_program
    from scaling.hardware import GIB
    from sweeps import preflight

    config = fsdp_l2_config()
    devices = preflight.topology_devices(preflight.parse_topology("v5e:2x2"))
    mesh = mesh_lib.make_mesh(config.mesh, devices)
    started = time.perf_counter()
    with activation_constraints(constrained):
        # Built once per process: the patch above is part of its trace.
        program, lowered = run_program.lower_train_step(config, mesh)
        program = program.solo
        compiled = lowered.compile()
    traffic = preflight.collective_traffic(compiled.as_text(), len(devices))
    params = sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
                 for leaf in jax.tree_util.tree_leaves(program.abstract_state["params"]))
    stats = compiled.memory_analysis()
    return {"activation_constraints": constrained, "compile_seconds": round(time.perf_counter() - started, 1),
            "collective_bytes": traffic.bytes, "collective_buffer_bytes": traffic.buffer_bytes,
            "by_kind": {kind: {"count": count, "buffer_bytes": buffer, "bytes_sent": sent}
                        for kind, (count, buffer, sent) in traffic.by_kind.items()},
            "parameter_bytes": params, "collective_bytes_per_parameter_byte": traffic.bytes / params,
            "temporary_gib": stats.temp_size_in_bytes / GIB, "argument_gib": stats.argument_size_in_bytes / GIB}


def gpt3_xl() -> dict:
    """The preflight row of GPT-3 XL at fsdp=256 on v5e:16x16, as ``preflight --pod-wide`` computes it."""
    from sweeps import preflight

    config = gpt3_xl_config()
    (row,) = preflight.check_runs([("gpt3-xl L24-d2048", config)], "v5e:16x16", pod_wide=True,
                                  progress=lambda text: print(text, file=sys.stderr, flush=True))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=("fsdp-l2", "gpt3-xl", "paper-l6"))
    parser.add_argument("--without-activation-constraints", action="store_true",
                        help="fsdp-l2 only: compile with the model's activation constraints switched off")
    args = parser.parse_args(argv)
    from sweeps import preflight

    if not preflight.libtpu_installed():
        print('error: needs the TPU compiler; install it with: pip install -e ".[tpu]"', file=sys.stderr)
        return 2
    if args.figure == "paper-l6":
        from sweeps import launch

        return launch.main(["preflight", str(PAPER_SWEEP), "--topology", "v5e:2x2", "--only", "L6-*-s0", "--json"])
    result = fsdp_l2(not args.without_activation_constraints) if args.figure == "fsdp-l2" else gpt3_xl()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    sys.exit(main())
