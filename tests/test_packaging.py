"""The extras install together: pip's resolver finds one set of versions for `.[dev,tpu,cloud]`.

SkyPilot caps click below 8.2 while recent wandb needs click 8.2 or newer; the
cloud extra pins both so that the resolver of the pip a fresh virtual
environment ships (older than the newest pip, which backtracks further) finds
a solution. This asks the package registry, so it is marked slow and `.ci/run`
runs it by name.
"""

import json
import subprocess
import sys
import venv

import pytest

from helpers import REPO


@pytest.mark.slow
def test_every_extra_resolves_together_with_the_pip_a_new_venv_ships(tmp_path):
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    pip = [str(tmp_path / "venv" / "bin" / "python3"), "-m", "pip"]
    report = tmp_path / "report.json"
    out = subprocess.run(
        [*pip, "install", "--dry-run", "--ignore-installed", "--report", str(report),
         "-e", f"{REPO}[dev,tpu,cloud]"],
        capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # No backtracking: pip says so (INFO, on stdout) when it tries the releases of a package one by one.
    backtracked = sorted({line for line in out.stdout.splitlines() if "pip is looking at multiple versions" in line})
    assert not backtracked, backtracked
    chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"]
              for item in json.loads(report.read_text())["install"]}
    assert {"skypilot", "wandb", "click", "jax"} <= set(chosen), sorted(chosen)
    major, minor = (int(part) for part in chosen["click"].split(".")[:2])
    assert (major, minor) < (8, 2), chosen["click"]  # what SkyPilot 0.14 accepts
