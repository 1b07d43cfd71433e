"""Which parallelism mode the preflight chooses for paper-sweep runs, and how it compares with fsdp (estimates).

    python benchmarks/parallelism_choice.py                          # the paper sweep's L6 runs (seed 0) on v5e:2x4
    python benchmarks/parallelism_choice.py --only 'L6-d128-s0' --topology v5e:2x2 --json

For each run of ``sweeps/configs/paper.py`` that ``--only`` names, every mode of
``sweeps.preflight.parallelism`` is compiled ahead of time for the slice (libtpu on
this CPU; nothing runs on a TPU): ``data`` (data=-1, fsdp=1), ``fsdp`` (data=1,
fsdp=-1, the mesh the paper sweep forced on every run before) and ``packed``
(one run per chip, as many runs as chips trained as one program). Each is priced
by the preflight's two estimates, the corrected roofline and the compiler's own
cycle estimate, as a run's seconds per step with the chips to itself (a pack's
step over its runs). ``fits`` is the preflight's memory check; ``chosen`` marks
the cheapest mode that fits by its slower estimate; ``vs fsdp`` is fsdp's
per-run seconds over the mode's, by each estimate (above 1: faster than fsdp).
Compiles go through the preflight's compile cache (``--compile-cache``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import time
from pathlib import Path

from scaling import cli

PAPER_SWEEP = Path(__file__).resolve().parents[1] / "sweeps" / "configs" / "paper.py"


def compare_runs(only: list[str], topology_name: str, cache_directory: str | None) -> list[dict]:
    """``{"name", "seconds", **compare_modes(...)}`` for each paper run matching ``only``."""
    from sweeps import preflight, spec
    from sweeps.preflight import compile_cache

    runs = [run for run in spec.load_sweep(PAPER_SWEEP).expand().runs
            if any(fnmatch.fnmatchcase(run.name, glob) for glob in only)]
    topology = preflight.checked_topology(preflight.parse_topology(topology_name))
    devices = preflight.topology_devices(topology)
    cache = compile_cache.CompileCache(compile_cache.default_directory(cache_directory))
    found = []
    for run in runs:
        print(f"compiling the modes of {run.name} for {topology.name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        compared = preflight.compare_modes(run.name, run.config, topology, devices, cache)
        found.append({"name": run.name, "topology": topology.name, "seconds": round(time.perf_counter() - started, 1),
                      **compared})
    return found


def _ratio(fsdp: dict | None, mode: dict, key: str) -> float | None:
    if fsdp is None or fsdp.get(key) is None or not mode.get(key):
        return None
    return fsdp[key] / mode[key]


def format_table(found: list[dict]) -> str:
    """One line per run and mode: per-run seconds per step by each estimate, fits, chosen, ratio to fsdp."""
    lines = []
    for run in found:
        fsdp = next((mode for mode in run["modes"] if mode["mode"] == "fsdp"), None)
        for mode in run["modes"]:
            name = mode["mode"] + (f"×{mode['pack_size']}" if mode["pack_size"] > 1 else "")
            ratios = [_ratio(fsdp, mode, key) for key in ("run_roofline_seconds", "run_compiler_seconds")]
            lines.append([run["name"], name, cli.fmt(mode["run_roofline_seconds"], ".4g"),
                          cli.fmt(mode["run_compiler_seconds"], ".4g"), "yes" if mode["fits"] else "no",
                          "*" if mode["mode"] == run["choice"] else "",
                          f"{cli.fmt(ratios[0], '.2f')} / {cli.fmt(ratios[1], '.2f')}"])
    header = ["run", "mode", "roofline s/step/run", "compiler s/step/run", "fits", "chosen",
              "vs fsdp (roofline / compiler)"]
    text = [cli.text_table(header, lines, align=("left", "left", "right", "right", "left", "left", "right"))]
    text += [f"{run['name']}: modes compiled and priced in {run['seconds']:.0f} s on {run['topology']}"
             for run in found]
    text.append("estimates from TPU programs compiled on a CPU with libtpu; nothing ran on a TPU")
    return "\n".join(text)


def main(argv=None) -> int:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--only", action="append", default=[], metavar="GLOB",
                        help="paper runs to compare (repeatable; default L6-*-s0)")
    parser.add_argument("--topology", default="v5e:2x4", help="TPU slice (default v5e:2x4)")
    parser.add_argument("--compile-cache", default=None, metavar="DIR|off",
                        help="the preflight's compile cache (default: its own default)")
    parser.add_argument("--json", action="store_true", help="print the comparisons as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from sweeps import preflight

    if not preflight.libtpu_installed():
        print('error: needs the TPU compiler; install it with: pip install -e ".[tpu]"', file=sys.stderr)
        return 2
    found = compare_runs(args.only or ["L6-*-s0"], args.topology, args.compile_cache)
    print(json.dumps(found, indent=1) if args.json else format_table(found))
    return 0


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    sys.exit(main())
