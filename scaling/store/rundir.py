"""A run directory's identity and bookkeeping, apart from the record itself (``scaling.store.records``).

- ``absolute_path``: where a user's relative path really points;
- ``check_run_dir``: refuse a directory that holds another config's run;
- ``code_version``: the commit the record is stamped with;
- ``log_failure``: tracebacks go to ``<run dir>/error.log``, not the terminal.
Imports neither JAX nor the model.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import traceback

from etils import epath

from scaling.config import TrainConfig, config_id, from_dict
from scaling.store.storage import is_remote, write_atomic


def code_version(source_dir=None) -> str:
    """The git commit of this source tree (with ``+dirty`` if modified), else the package version.
    ``SCALING_CODE_VERSION``, when set, is the answer instead (``sweeps.piece`` sets it from --commit).

    Files under the repository's ``results/`` do not make the tree dirty: committed experiments keep their
    records there, and the launcher rewrites their ``sweep.json`` itself, so a run trained from clean code
    would otherwise be stamped as modified. ``source_dir``: a folder of the tree (default: this package's)."""
    named = os.environ.get("SCALING_CODE_VERSION", "").strip()
    if named:  # a tree copied without git (a lent machine): the commit its piece names, checked on return
        return named
    here = epath.Path(source_dir) if source_dir is not None else epath.Path(__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ":(top,exclude)results"], cwd=here, capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return "v" + version("depth-width-scaling")
        except PackageNotFoundError:
            return "unknown"


def absolute_path(path) -> epath.Path:
    """``path`` as an absolute ``epath.Path``: a local path is resolved against the current directory
    (orbax and a later ``cd`` both need that); a URI such as ``gs://bucket/dir`` is kept as it is."""
    text = str(path)
    if is_remote(text):
        return epath.Path(text)
    return epath.Path(os.path.abspath(os.path.expanduser(text)))


class ConfigMismatch(ValueError):
    """The run directory already holds a run of another config."""


def check_run_dir(run_dir: epath.Path, config: TrainConfig) -> None:
    """Refuse a run directory whose ``config.json`` is another config's (whatever the run's status)."""
    path = run_dir / "config.json"
    if not path.exists():
        return
    try:
        previous = from_dict(TrainConfig, json.loads(path.read_text()))
    except (ValueError, TypeError) as error:
        raise ConfigMismatch(f"{path} is not a readable config ({error}); use a new workdir") from None
    if config_id(previous) != config_id(config):
        raise ConfigMismatch(f"{run_dir} holds run {config_id(previous)} ({previous.name or 'unnamed'}), "
                             f"not this config's run {config_id(config)}; use a new workdir")


def one_line(error: BaseException) -> str:
    """``"<Type>: <first line of the message>"``, at most ~300 characters, for terminals and records."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    line = line.split(" See full TensorStore details")[0]  # orbax appends a multi-line spec dump
    return f"{type(error).__name__}: {line[:300]}"


def log_failure(run_dir: epath.Path, error: BaseException) -> str | None:
    """Append the traceback to ``<run_dir>/error.log``; returns the file name, or None if it cannot be written."""
    try:
        path = run_dir / "error.log"
        previous = path.read_text() if path.exists() else ""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        write_atomic(path, previous + f"--- {stamp} ---\n" + traceback.format_exc())
        return path.name
    except Exception:  # noqa: BLE001 - the record must still be written
        return None


# orbax's mark of a complete step on object stores (orbax.checkpoint's atomicity.COMMIT_SUCCESS_FILE, which
# scaling.store.leased_commit also writes last); named here so that reading a run imports no orbax.
COMMIT_FILE = "commit_success.txt"


def checkpoint_steps(run_dir) -> list[int]:
    """The steps of the committed checkpoints in ``<run_dir>/checkpoints/`` (local or gs://), ascending.

    A step is committed as orbax (and ``scaling.store.leased_commit``) commits it:
    on a local disk its folder ``<step>`` exists (it is written as
    ``<step>.orbax-checkpoint-tmp-...`` and renamed), on an object store the
    folder ``<step>`` also holds ``commit_success.txt`` (written last). Steps
    still in ``checkpoints-pending/`` are not the run's. Imports neither JAX
    nor orbax; ``OSError`` if the listing fails.
    """
    checkpoints = epath.Path(run_dir) / "checkpoints"
    if not checkpoints.exists():
        return []
    folders = [p for p in checkpoints.iterdir() if p.name.isdigit()]
    if is_remote(str(checkpoints)):
        folders = [p for p in folders if (p / COMMIT_FILE).exists()]
    return sorted(int(p.name) for p in folders)

def _sweep_listing(sweep_dir: epath.Path) -> dict[str, str]:
    """Run name -> folder, as the sweep's ``sweep.json`` lists its runs (empty without a readable one)."""
    try:
        runs = json.loads((sweep_dir / "sweep.json").read_text()).get("runs", [])
        return {run["name"]: run["run_id"] for run in runs}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def run_names(sweep_dir: epath.Path) -> dict[str, list[str]]:
    """Run name -> the folders under ``sweep_dir`` that hold a run of that name (their ``config.json``'s
    ``name``). A sweep's run folders are hashes of their configs (``scaling.config.config_id``); this is
    how a person's name for a run finds its folder."""
    folders: dict[str, list[str]] = {}
    for child in sorted(sweep_dir.iterdir(), key=lambda p: p.name):
        try:
            name = json.loads((child / "config.json").read_text()).get("name")
        except (OSError, ValueError, AttributeError):
            continue
        if name:
            folders.setdefault(name, []).append(child.name)
    return folders


def resolve_run_dir(path) -> epath.Path:
    """The run directory ``path`` names: ``path`` itself when it is a directory, else, when its last part
    is a run's name inside a sweep directory (``runs/smoke/L1-d128-s0``), that run's hashed folder
    (``runs/smoke/3f2a…``). Where several folders hold runs of that name (a sweep whose settings changed),
    the one the sweep's ``sweep.json`` lists now is chosen. ``ValueError`` (one line, naming the nearest
    names) when no run, or several unlisted runs, carry the name. A path whose parent is no directory is
    returned unchanged, for the caller's own "no such run directory"."""
    import difflib

    run_dir = absolute_path(path)
    if run_dir.is_dir() or not run_dir.parent.is_dir():
        return run_dir
    name, sweep_dir = run_dir.name, run_dir.parent
    folders = run_names(sweep_dir)
    found = folders.get(name, [])
    listed = _sweep_listing(sweep_dir).get(name)
    if len(found) == 1 or listed in found:
        return sweep_dir / (listed if listed in found else found[0])
    if found:
        raise ValueError(f"{path}: {len(found)} runs in {sweep_dir} are named {name!r} (folders "
                         f"{', '.join(found)}); give the folder")
    near = difflib.get_close_matches(name, list(folders), n=5, cutoff=0.5)
    if near:
        hint = f"; nearest run names: {', '.join(near)}"
    elif folders:
        names = sorted(folders)
        hint = f"; its runs are named {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}"
    else:
        hint = ""
    raise ValueError(f"{path}: no such run directory, and no run in {sweep_dir} is named {name!r}{hint}")
