"""README.md's main job, typed as a new user types it.

The repository is cloned into a temporary directory and the commands of the
README's "The main job" section are run there *verbatim* by a shell (relative
work directory included), with the interpreter running these tests first on
PATH as an activated virtual environment would put it. It checks that every
run finished, that running the sweep again trains nothing, and that the plot
command writes its figures.

It trains the whole smoke sweep (minutes), so it is left out of the default
run; CI runs it with ``python3 -m pytest -m readme``.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scaling import records

REPO = Path(__file__).resolve().parents[1]
SECTION = "## The main job"

pytestmark = [pytest.mark.slow, pytest.mark.readme]


def main_job_commands(readme: str) -> list[str]:
    """The shell commands in the code blocks of the README's main-job section, in order."""
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    section = readme[start:end if end >= 0 else None]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_names_the_main_job():
    commands = main_job_commands((REPO / "README.md").read_text())
    assert any(" sweeps.launch run " in c for c in commands) and any(" analysis plot " in c for c in commands)


def test_the_main_job_runs_verbatim_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    commands = main_job_commands((clone / "README.md").read_text())
    # As a user types it: none of the suite's settings, its shared compilation cache included.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "XLA_FLAGS") and not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")  # as the README advises wherever libtpu is installed without a TPU

    def shell(command: str) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True,
                              timeout=1800)
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    run_command = next(c for c in commands if " sweeps.launch run " in c)
    for command in commands:
        shell(command)
    workdir = clone / re.search(r"--workdir (\S+)", run_command).group(1)
    sweep_dir = workdir / "smoke"
    run_dirs = [d for d in sweep_dir.iterdir() if (d / "config.json").exists()]
    assert len(run_dirs) == 6
    assert all(records.read_record(d).status == "finished" for d in run_dirs)
    written = {d: (d / "result.json").stat().st_mtime_ns for d in run_dirs}

    again = shell(run_command)
    assert "0 to train" in again.stdout + again.stderr
    assert {d: (d / "result.json").stat().st_mtime_ns for d in run_dirs} == written

    figures = clone / re.search(r"--out (\S+)", next(c for c in commands if " analysis plot " in c)).group(1)
    assert list(figures.glob("*.png")), "analysis plot wrote no figures"
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == "", f"the main job left files git does not ignore:\n{status.stdout}"
