"""The lock file of the cloud installs: ``constraints.txt``, exact versions for every host.

    python -m sweeps.lockfile            # rewrite constraints.txt from pyproject.toml (asks the package index)
    python -m sweeps.lockfile --check    # does constraints.txt pin every dependency, within its range?

The SkyPilot tasks (``tpu/sweep.sky.yaml``, ``gpu/sweep.sky.yaml``) install
with ``uv pip install -c constraints.txt ...``, so a share started or recovered
weeks after another resumes its checkpoints under the same jax, jaxlib,
libtpu, orbax and tensorstore. Without it every provision resolves afresh.

The file is pip's own resolution (``pip install --dry-run --report``) of the
project's dependencies, the ``tpu`` extra, ``jax[cuda12]`` (the GPU task's
JAX) and ``uv`` (the tasks' installer), for the hosts' platform: Linux x86_64
and the tasks' Python (``PYTHON_VERSION``), from any machine. One resolution
for both tasks, so TPU and GPU hosts agree on every package they share.
Remake and commit it after changing pyproject.toml's dependencies.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCK_FILE = REPO / "constraints.txt"
PYTHON_VERSION = "3.11"  # the tasks' PYTHON_VERSION: the hosts' venv Python
# Linux x86_64 wheels the hosts' glibc (Ubuntu 22.04: 2.35) accepts; pip with --platform takes only the tags named.
PLATFORMS = ["linux_x86_64", "manylinux2014_x86_64"] + [f"manylinux_2_{v}_x86_64" for v in range(17, 36)]
EXTRA_REQUIREMENTS = ["jax[cuda12]", "uv"]  # the GPU task's JAX build; the tasks' installer
# Shown by `sweeps.launch sky --dry-run`: the packages a resumed checkpoint depends on.
KEY_PACKAGES = ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "orbax-checkpoint", "tensorstore", "flax", "optax")
HEADER = """\
# Exact versions for the cloud installs: tpu/sweep.sky.yaml and gpu/sweep.sky.yaml run
# `uv pip install -c constraints.txt ...`, so shares started or recovered at different times
# get the same jax, jaxlib, libtpu, orbax and tensorstore.
# Made by `python -m sweeps.lockfile` (pip's resolver, for Linux x86_64 and Python {python}) from
# pyproject.toml's dependencies, the tpu extra, {extra}. Remake and commit it after changing
# pyproject.toml's dependencies; `python -m sweeps.lockfile --check` says whether it still fits.
"""


def normalize(name: str) -> str:
    """A distribution name as the index compares it (PEP 503): ``Orbax_Checkpoint`` -> ``orbax-checkpoint``."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """What the lock resolves: the project's dependencies, its ``tpu`` extra and ``EXTRA_REQUIREMENTS``."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["tpu"]) + EXTRA_REQUIREMENTS


def read_pins(path: Path = LOCK_FILE) -> dict[str, str]:
    """``{normalized name: version}`` of a constraints file of ``name==version`` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            if not version:
                raise ValueError(f"{path}: {line!r} is not name==version")
            pins[normalize(name)] = version.strip()
    return pins


def resolve(reqs: list[str], python: str = PYTHON_VERSION) -> dict[str, str]:
    """pip's resolution of ``reqs`` for the hosts' platform: ``{normalized name: version}`` (asks the index)."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                   "--report", str(report), "--python-version", python, "--only-binary=:all:",
                   *(f"--platform={tag}" for tag in PLATFORMS), *reqs]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip could not resolve the requirements:\n{done.stderr[-3000:]}")
        installs = json.loads(report.read_text())["install"]
    return {normalize(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}


def render(pins: dict[str, str]) -> str:
    """The lock file's text: the header, then one ``name==version`` line per package, sorted."""
    header = HEADER.format(python=PYTHON_VERSION, extra=" and ".join(EXTRA_REQUIREMENTS))
    return header + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def problems(pins: dict[str, str], reqs: list[str]) -> list[str]:
    """Each requirement the pins leave out or contradict (a pin outside the requirement's range)."""
    from packaging.requirements import Requirement

    found = []
    for text in reqs:
        requirement = Requirement(text)
        name = normalize(requirement.name)
        if name not in pins:
            found.append(f"{requirement.name}: not pinned")
        elif requirement.specifier and not requirement.specifier.contains(pins[name], prereleases=True):
            found.append(f"{requirement.name}: pinned {pins[name]}, outside {requirement.specifier}")
    return found


def key_pins(pins: dict[str, str]) -> str:
    """The versions of ``KEY_PACKAGES`` among ``pins``, as ``jax==0.10.0, ...``."""
    return ", ".join(f"{name}=={pins[name]}" for name in KEY_PACKAGES if name in pins)


def summary(path: Path = LOCK_FILE) -> str:
    """One line for ``--dry-run``: the file and the versions of ``KEY_PACKAGES``."""
    pins = read_pins(path)
    return f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path} ({len(pins)} pins: {key_pins(pins)})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeps.lockfile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=LOCK_FILE, help="where to write (default: constraints.txt)")
    parser.add_argument("--check", action="store_true",
                        help="only check the file against pyproject.toml (no index); exit 1 if it does not fit")
    args = parser.parse_args(argv)
    reqs = requirements()
    if args.check:
        found = problems(read_pins(args.output), reqs)
        for line in found:
            print(f"{args.output}: {line}", file=sys.stderr)
        print(f"{args.output}: {'does not fit' if found else 'fits'} pyproject.toml")
        return 1 if found else 0
    pins = resolve(reqs)
    args.output.write_text(render(pins))
    print(f"wrote {args.output}: {len(pins)} packages ({key_pins(pins)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
