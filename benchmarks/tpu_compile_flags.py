"""How long libtpu takes to compile one preflight run, and what a libtpu flag changes (no TPU needed).

    python benchmarks/tpu_compile_flags.py                          # L6-d128-s0 of the paper sweep, v5e:2x4
    python benchmarks/tpu_compile_flags.py --log-passes             # also libtpu's own timing of its stages
    python benchmarks/tpu_compile_flags.py --flags=--xla_jf_hlo_deduplication=true --flags='--xla_jf_llo_level=1'

The preflight's first run over a sweep is as slow as libtpu compiling each
distinct program. This compiles one run's train step the way the preflight
does (``scaling.model.run_program.lower_train_step(...)``, then ``.compile()``, for the slice's
compile-only devices), once with libtpu's defaults and once per ``--flags``
(written ``--flags=VALUE``, as the value starts with dashes), each in a fresh process: libtpu reads ``LIBTPU_INIT_ARGS`` once, when
it starts. Printed per flag set: seconds to lower and to compile, the
compiled program's temporary and generated-code bytes (``memory_analysis``)
and the preflight's roofline step time read from its optimized HLO. A flag
is only any use to the preflight if it makes the compile faster *and*
leaves the temporary bytes (the fit verdict) and the roofline as they were.

``--log-passes`` turns on libtpu's verbose timing (``TPU_VMODULE``) and sums
the lines that report a cumulative time, by stage, and prints those of a
second or more: the HLO passes, the backend's lowering and optimisation
(its LLO scheduling runs once per fused region) and code generation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scaling import cli  # noqa: E402

_VMODULE = "deepsea_compiler_base=1,deepsea_compiler_backend=1,deepsea_compiler_hlo_passes=1"
# "XLA::TPU <stage> time: 1.2 s (1234 us) (cumulative: 15.2 s, max: ..., #called: 217)"
_STAGE = re.compile(r"\] (?P<stage>[^\]]*?) time: .*?\(cumulative: (?P<value>[0-9.]+) (?P<unit>us|ms|s),"
                    r".*#called: (?P<calls>\d+)")
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def compile_once(sweep_path: str, run_name: str, topology_name: str) -> dict:
    """Lower and compile ``run_name`` of the sweep for ``topology_name`` in this process; seconds and sizes."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from scaling.model import mesh as mesh_lib
    from scaling.model import program as program_lib, run_program
    from sweeps import preflight
    from sweeps.spec import load_sweep

    runs = {run.name: run for run in load_sweep(sweep_path).expand().runs}
    if run_name not in runs:
        raise SystemExit(f"error: --run {run_name!r} is not in {sweep_path}; it has e.g. {sorted(runs)[:4]}")
    config = runs[run_name].config
    topology = preflight.checked_topology(preflight.parse_topology(topology_name))
    mesh = mesh_lib.make_mesh(config.mesh, preflight.topology_devices(topology))
    program_lib.build(config, mesh, **preflight.program_arguments(config))  # built (not lowered) outside the timing
    start = time.perf_counter()
    _, lowered = run_program.lower_train_step(config, mesh, arguments=preflight.program_arguments(config))
    lowered_at = time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as error:  # a flag can make libtpu refuse the program; that is a result too
        return {"lower_s": lowered_at - start, "compile_s": time.perf_counter() - lowered_at,
                "error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
    compiled_at = time.perf_counter()
    memory = compiled.memory_analysis()
    estimate = preflight.step_estimate(config, mesh, compiled, topology.chip)
    return {"lower_s": lowered_at - start, "compile_s": compiled_at - lowered_at,
            "temp_bytes": memory.temp_size_in_bytes, "code_bytes": memory.generated_code_size_in_bytes,
            "roofline_ms": None if estimate.step_seconds is None else estimate.step_seconds * 1e3}


def stage_seconds(log: str) -> dict[str, tuple[float, int]]:
    """Cumulative seconds and call count of each stage libtpu's verbose log reports (last report wins)."""
    stages = {}
    for match in _STAGE.finditer(log):
        stages[match["stage"]] = (float(match["value"]) * _SECONDS[match["unit"]], int(match["calls"]))
    return stages


def measure(flags: str, args) -> tuple[dict, str]:
    """One flag set's ``compile_once`` in a fresh process; returns its result and its stderr."""
    env = {**os.environ, "LIBTPU_INIT_ARGS": flags, "JAX_PLATFORMS": "cpu"}
    if args.log_passes:
        env.update({"TPU_VMODULE": _VMODULE, "TPU_STDERR_LOG_LEVEL": "0", "TPU_MIN_LOG_LEVEL": "0"})
    child = subprocess.run([sys.executable, __file__, "--child", "--sweep", args.sweep, "--run", args.run,
                            "--topology", args.topology], env=env, capture_output=True, text=True)
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode or not lines:
        tail = " | ".join(child.stderr.strip().splitlines()[-3:])
        return {"error": f"the compile process exited with {child.returncode}: {tail[:300]}"}, child.stderr
    return json.loads(lines[-1]), child.stderr


def main() -> None:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--sweep", default=str(REPO / "sweeps" / "configs" / "paper.py"),
                        help="sweep file (default: the paper sweep)")
    parser.add_argument("--run", default="L6-d128-s0", help="run name in the sweep (default: %(default)s)")
    parser.add_argument("--topology", default="v5e:2x4", help="TPU slice to compile for (default: %(default)s)")
    parser.add_argument("--flags", action="append", default=[], metavar="FLAGS",
                        help="a LIBTPU_INIT_ARGS value to compare with libtpu's defaults; repeat it for more "
                             "(write --flags=--xla_...)")
    parser.add_argument("--log-passes", action="store_true", help="sum libtpu's verbose stage timings")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(compile_once(args.sweep, args.run, args.topology)), flush=True)
        return
    from sweeps import preflight

    if not preflight.libtpu_installed():
        print('error: libtpu is not installed; pip install -e ".[tpu]"', file=sys.stderr)
        sys.exit(2)
    print(f"{args.run} of {Path(args.sweep).name} on {args.topology}, one fresh process per flag set")
    print(f"{'flags':>44} {'lower s':>7} {'compile s':>9} {'temp bytes':>13} {'code bytes':>11} {'roofline ms':>11}")
    for flags in ["", *args.flags]:
        result, log = measure(flags, args)
        label = flags or "(libtpu defaults)"
        if "error" in result:
            print(f"{label:>44} failed: {result['error']}")
            continue
        roofline = "unknown" if result["roofline_ms"] is None else f"{result['roofline_ms']:.2f}"
        print(f"{label:>44} {result['lower_s']:>7.1f} {result['compile_s']:>9.1f} {result['temp_bytes']:>13,} "
              f"{result['code_bytes']:>11,} {roofline:>11}")
        if args.log_passes:
            stages = sorted(stage_seconds(log).items(), key=lambda item: -item[1][0])
            for stage, (seconds, calls) in [item for item in stages if item[1][0] >= 1.0]:  # the ones that count
                print(f"{'':>46}{seconds:>8.2f} s  {calls:>4}x  {stage}")


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    main()
