"""constraints.txt, the lock file the cloud installs use (sweeps/cloud/lockfile.py).

Checked without the package index: it pins every dependency of pyproject.toml and the tpu extra within
its range, the packages a checkpoint depends on agree with each other, and both SkyPilot tasks install
with it. The slow test resolves the install against the lock with pip (it asks the index)."""

import pytest
import yaml

import helpers
from helpers import REPO
from sweeps.cloud import lockfile


def test_lock_pins_every_dependency_within_its_range():
    pins = lockfile.read_pins()
    assert lockfile.problems(pins, lockfile.requirements()) == []
    for name in ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "orbax-checkpoint", "tensorstore", "uv"):
        assert name in pins, name
    # One JAX for TPU and GPU hosts: jaxlib and the CUDA plugin are released in step with jax.
    assert pins["jaxlib"] == pins["jax"] == pins["jax-cuda12-plugin"]
    assert lockfile.LOCK_FILE.read_text().startswith(lockfile.HEADER.splitlines()[0])


def test_problems_names_what_is_missing_or_out_of_range():
    pins = {"jax": "0.9.0", "flax": "0.12.8"}
    found = lockfile.problems(pins, ["jax>=0.10", "flax>=0.10", "optax>=0.2"])
    assert found == ["jax: pinned 0.9.0, outside >=0.10", "optax: not pinned"]


def test_check_command_reports_a_stale_lock(tmp_path):
    stale = tmp_path / "constraints.txt"
    stale.write_text("jax==0.4.30\n")
    done = helpers.run_module("sweeps.lockfile", "--check", "--output", stale, timeout=60)
    assert done.returncode == 1 and "jax: pinned 0.4.30, outside >=0.10" in done.stderr
    done = helpers.run_module("sweeps.lockfile", "--check", timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("task", ["tpu/sweep.sky.yaml", "gpu/sweep.sky.yaml"])
def test_tasks_install_with_the_lock_for_its_python(task):
    config = yaml.safe_load((REPO / task).read_text())
    assert config["envs"]["LOCK"] == lockfile.LOCK_FILE.name
    assert config["envs"]["PYTHON_VERSION"] == lockfile.PYTHON_VERSION
    installs = [line for line in config["setup"].splitlines() if "pip install" in line]
    assert len(installs) >= 2 and all('-c "$LOCK"' in line for line in installs), installs


@pytest.mark.slow
def test_lock_resolves_for_the_hosts():
    """pip resolves the tpu install and the GPU's JAX under the lock, for the hosts' platform (asks the index)."""
    pins = lockfile.resolve([*lockfile.requirements(), "-c", str(lockfile.LOCK_FILE)])
    locked = lockfile.read_pins()
    assert {name: version for name, version in pins.items() if name in locked} == \
        {name: locked[name] for name in pins if name in locked}


def test_the_docs_count_the_pins_of_the_lock_file():
    import re

    from helpers import REPO

    stated = re.search(r"pins every package the hosts install \((\d+) of them", (REPO / "tpu" / "README.md").read_text())
    assert stated and int(stated.group(1)) == len(lockfile.read_pins())
