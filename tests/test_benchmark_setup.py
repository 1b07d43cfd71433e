"""The CPU benchmark runs the trainer as the command lines do: with glibc's allocator tuned before JAX starts."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_throughput_benchmark_tunes_the_allocator_like_the_command_lines():
    # (scaling.cpu_allocator decides; SCALING_MALLOC_TUNING=0 would switch it off.)
    env = {key: value for key, value in os.environ.items() if key not in ("JAX_PLATFORMS", "SCALING_MALLOC_TUNING")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "benchmarks"), env.get("PYTHONPATH", "")])
    code = "import throughput; print(throughput.MALLOC_TUNED)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "True"
