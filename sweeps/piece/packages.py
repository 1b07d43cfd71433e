"""The Python packages a piece needs: which the machine lacks, installed offline from a wheel folder.

The machine a piece runs on has JAX (with its accelerator's runtime), Flax, Optax and Orbax
(``IMAGE``), and no network. What the trainer imports beyond them (``CARRIED``: pydantic and
its parts, tokenizers, tqdm, tqdm-loggable, tabulate) travels as wheels with the code, built here
by ``python -m sweeps.piece wheels`` at the versions of the lock file (``constraints.txt``), and
is installed there with ``pip install --no-index --no-deps`` only when it is absent or older than
the project needs. wandb is not among them: a piece trains with ``wandb_mode=disabled``, which
never imports it (``scaling.run.track.open_wandb_run``).

Importing this module imports only the standard library: it runs before anything else of the
project can be imported.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
LOCK_FILE = REPO / "constraints.txt"
DEFAULT_WHEELS = REPO / "gpu" / "wheels"
# Python versions the wheel folder covers by default: compiled wheels (pydantic-core) exist per version, and
# the image's Python is not known here.
DEFAULT_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
PLATFORM = "manylinux2014_x86_64"


@dataclasses.dataclass(frozen=True)
class Requirement:
    """A distribution a piece imports: its name, the module that proves it is there, the oldest version
    that works (``minimum``; "" for any)."""

    distribution: str
    module: str
    minimum: str = ""


# On the machine already (the image); never carried. Missing -> the piece stops, naming them.
IMAGE = (Requirement("jax", "jax", "0.10"), Requirement("jaxlib", "jaxlib"), Requirement("flax", "flax"),
         Requirement("optax", "optax"), Requirement("orbax-checkpoint", "orbax.checkpoint"),
         Requirement("numpy", "numpy", "1.26"), Requirement("etils", "etils"))
# Carried as wheels and installed when absent or too old (the minimums are pyproject.toml's and pydantic's).
CARRIED = (Requirement("pydantic", "pydantic", "2.7"), Requirement("pydantic-core", "pydantic_core"),
           Requirement("annotated-types", "annotated_types", "0.6"),
           Requirement("typing-inspection", "typing_inspection", "0.4.4"),
           Requirement("typing-extensions", "typing_extensions", "4.16"),
           Requirement("tokenizers", "tokenizers", "0.20"), Requirement("tqdm", "tqdm", "4.66"),
           Requirement("tqdm-loggable", "tqdm_loggable", "0.4.1"), Requirement("tabulate", "tabulate", "0.9"))
# Installed together or not at all: pydantic pins its core exactly.
TOGETHER = {"pydantic": ("pydantic-core",), "pydantic-core": ("pydantic",)}


class PackagesError(RuntimeError):
    """Packages a piece needs are missing and cannot be installed; the message is one line naming them."""


def _numbers(version: str) -> tuple[int, ...]:
    """The leading numeric release of ``version`` (``2.14.4`` -> (2, 14, 4); ``0.4.1rc1`` -> (0, 4, 1))."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:4])


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` in this interpreter, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def lacking(requirements=CARRIED) -> list[Requirement]:
    """The requirements this interpreter lacks: not installed, or older than their minimum."""
    missing = []
    for requirement in requirements:
        version = installed_version(requirement.distribution)
        if version is None or (requirement.minimum and _numbers(version) < _numbers(requirement.minimum)):
            missing.append(requirement)
    names = {r.distribution for r in missing}
    for name in list(names):  # pydantic and its core go together
        for partner in TOGETHER.get(name, ()):
            if partner not in names:
                missing += [r for r in requirements if r.distribution == partner]
                names.add(partner)
    return missing


def locked_versions(lock_file: pathlib.Path = LOCK_FILE) -> dict[str, str]:
    """``name==version`` pins of the lock file, by normalised distribution name."""
    pins = {}
    for line in lock_file.read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9._-]+)==([^\s;#]+)", line)
        if match:
            pins[_normal(match.group(1))] = match.group(2)
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(requirements, lock_file: pathlib.Path = LOCK_FILE) -> list[str]:
    """``dist==version`` for ``requirements`` at the lock file's versions."""
    pins = locked_versions(lock_file)
    absent = [r.distribution for r in requirements if _normal(r.distribution) not in pins]
    if absent:
        raise PackagesError(f"{lock_file.name} pins no version of {', '.join(absent)}; remake it: "
                            "python -m sweeps.lockfile")
    return [f"{r.distribution}=={pins[_normal(r.distribution)]}" for r in requirements]


def ensure(wheels: pathlib.Path | None, lock_file: pathlib.Path = LOCK_FILE, say=print) -> list[str]:
    """Install what this interpreter lacks of ``CARRIED`` from the wheel folder ``wheels`` (offline), after
    checking that nothing of ``IMAGE`` is missing. Returns the ``dist==version`` installed (none: []).
    Raises ``PackagesError`` with one line naming what is missing and why it could not be installed."""
    image = lacking(IMAGE)
    if image:
        raise PackagesError("the machine lacks " + ", ".join(r.distribution for r in image)
                            + " (the image must have them; they are not carried)")
    missing = lacking(CARRIED)
    if not missing:
        return []
    wanted = pinned(missing, lock_file)
    names = ", ".join(wanted)
    if wheels is None or not wheels.is_dir():
        raise PackagesError(f"missing {names}, and no wheel folder at {wheels} to install them from "
                            "(build it with: python -m sweeps.piece wheels)")
    say(f"installing {names} from {wheels}")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                           "--disable-pip-version-check", "--find-links", str(wheels), *wanted],
                          capture_output=True, text=True)
    importlib.invalidate_caches()
    still = lacking(CARRIED)
    if done.returncode != 0 or still:
        reason = _last_line(done.stderr) or "pip installed them, but they are still missing"
        raise PackagesError(f"missing {', '.join(pinned(still or missing, lock_file))}: not installed from "
                            f"{wheels} ({reason})")
    return wanted


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def build_wheels(out: pathlib.Path, pythons=DEFAULT_PYTHONS, lock_file: pathlib.Path = LOCK_FILE,
                 say=print) -> int:
    """Download the wheels of ``CARRIED`` at the lock file's versions into ``out`` for every Python of
    ``pythons`` (Linux x86_64), with pip; returns the folder's size in bytes. Needs the package index."""
    out.mkdir(parents=True, exist_ok=True)
    wanted = pinned(CARRIED, lock_file)
    for python in pythons:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                   "--only-binary=:all:", "--platform", PLATFORM, "--python-version", python,
                   "--implementation", "cp", "--dest", str(out), *wanted]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise PackagesError(f"pip download for Python {python} failed: {_last_line(done.stderr)}")
        say(f"Python {python}: {', '.join(wanted)}")
    return folder_bytes(out)


def folder_bytes(folder: pathlib.Path) -> int:
    """Bytes of the files under ``folder``."""
    return sum(os.path.getsize(path) for path in glob.glob(str(folder / "**" / "*"), recursive=True)
               if os.path.isfile(path))


CARRY_LIMIT_BYTES = 64 * 2**20  # the tree and the files carried with it, all together


def tree_bytes(root: pathlib.Path = REPO) -> int:
    """Bytes of the files git tracks or would track (untracked, not ignored) under ``root``: the tree
    that travels to the lent machine."""
    done = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                          capture_output=True)
    if done.returncode != 0:
        raise PackagesError(f"git ls-files in {root}: {_last_line(done.stderr.decode(errors='replace'))}")
    names = [name for name in done.stdout.decode().split("\0") if name]
    return sum(os.path.getsize(root / name) for name in names if (root / name).is_file())


MISSING_EXIT = 3  # the exit status of a command that stops because packages are missing


def exit_if_missing(prog: str) -> None:
    """Exit with ``MISSING_EXIT`` and one line on stderr naming what is missing of ``IMAGE`` and ``CARRIED``
    (a command line's first step, before its imports would fail in a traceback)."""
    missing = lacking(IMAGE) + lacking(CARRIED)
    if missing:
        names = ", ".join(r.distribution for r in missing)
        print(f"{prog}: error: missing packages {names}: pip install -e . (offline: python -m sweeps.piece run "
              "installs them from a wheel folder)", file=sys.stderr)
        sys.exit(MISSING_EXIT)
