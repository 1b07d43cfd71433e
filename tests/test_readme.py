"""README.md's commands, typed as a new user types them.

The repository is cloned into a temporary directory and every ```bash block
of README.md is run there verbatim, in README order, from the clone's root,
by ``bash -e`` (so every line must succeed), as a user's shell would run it:
none of the test suite's settings (JAX_PLATFORMS, PYTHONPATH, the shared XLA
cache, wandb's mode), the virtual environment that the set-up block creates
activated for every block after it. A block that cannot run here says so in
the line before it, with one of these markers:

    <!-- readme-test: skip (REASON) -->     not run here, e.g. it needs a Google Cloud account
    <!-- readme-test: needs libtpu -->      run where libtpu is installed (the tpu extra; CI installs it)
    <!-- readme-test: run by .ci/run ... --> CI runs it itself; each of its lines must be a line of .ci/run

After the main job's blocks, the test also checks what they promise: every
run of the smoke sweep finished, running it again trains nothing, the plot
command wrote figures, and nothing was left that git does not ignore.

Only the structure check runs by default. The whole README, which installs
into a fresh virtual environment and trains, is left out of the default run;
CI runs it with ``python3 -m pytest -m readme``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from helpers import REPO
MAIN_JOB = "The main job"
MARKER = re.compile(r"<!--\s*readme-test:\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\S*)\n(.*?)^```\n", flags=re.S | re.M)
# Words that give away a block needing a cloud account or a GPU; such a block must carry a skip marker.
LIBTPU_NOISE = ("E0000 ", "unexpected worker hostname", "Failed to find host bounds")
CLOUD_WORDS = ("gcloud ", "gsutil ", "tpu/", "sbatch ", "$BUCKET", "jax[cuda", "sky ")


@dataclasses.dataclass
class Block:
    """One ```bash block: its text, the section heading above it, and its marker (None if unmarked)."""

    text: str
    section: str
    marker: str | None

    @property
    def kind(self) -> str:
        if self.marker is None:
            return "run"
        for kind in ("skip", "needs libtpu", "run by .ci/run"):
            if self.marker.startswith(kind):
                return kind
        return "unknown"

    def commands(self) -> list[str]:
        return [line.strip() for line in self.text.splitlines() if line.strip() and not line.lstrip().startswith("#")]

    def __str__(self):
        return f"README section '{self.section}', block:\n{self.text}"


def readme_blocks(readme: str) -> tuple[list[Block], list[str]]:
    """The ```bash blocks in order, and the languages of every fenced block (to catch unlabelled ones)."""
    blocks, languages = [], []
    for match in FENCE.finditer(readme):
        language, text = match.group(1), match.group(2)
        languages.append(language)
        if language != "bash":
            continue
        before = readme[:match.start()]
        headings = re.findall(r"^## (.+)$", before, flags=re.M)
        previous = before.rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(previous.strip())
        blocks.append(Block(text=text, section=headings[-1] if headings else "", marker=marker and marker.group(1)))
    return blocks, languages


def libtpu_wanted() -> bool:
    """Run the libtpu blocks where libtpu is installed, and in CI (which requires it), else not."""
    return importlib.util.find_spec("libtpu") is not None or os.environ.get("SCALING_REQUIRE_LIBTPU") == "1"


# ---------------------------------------------------------------- structure (fast, default suite)
def test_every_block_is_run_or_says_why_not():
    readme = (REPO / "README.md").read_text()
    blocks, languages = readme_blocks(readme)
    assert all(languages), "every fenced block names its language (bash, text, bibtex, ...)"
    assert blocks and {b.section for b in blocks if b.kind == "run"} >= {
        "Set up", "The main job: a sweep in a few minutes on a CPU", "Ask the paper's fit", "Analyse a sweep",
        "Sweeps", "Train one model"}
    for block in blocks:
        assert block.kind != "unknown", f"unknown readme-test marker {block.marker!r} in {block}"
        if block.kind == "skip":
            assert re.fullmatch(r"skip \(.{10,}\)", block.marker), f"a skip marker gives its reason: {block}"
        elif any(word in block.text for word in CLOUD_WORDS):
            raise AssertionError(f"this block needs a cloud account or a GPU; mark it as skipped: {block}")
    assert any(b.kind == "needs libtpu" and " preflight " in b.text for b in blocks), "a preflight block is run"


def test_a_new_user_reads_set_up_main_job_answers_and_own_sweep_first():
    readme = (REPO / "README.md").read_text()
    sections = re.findall(r"^## (.+)$", readme, flags=re.M)
    first = ["Set up", "The main job: a sweep in a few minutes on a CPU", "Ask the paper's fit", "Sweeps"]
    assert sections[:len(first)] == first, sections
    for later in ("Results", "Run on a TPU pod", "Run on GPUs"):
        assert sections.index(later) > sections.index("Train one model"), sections
    # the plain install for users is named beside the contributors' dev extra
    assert "python3 -m pip install -e ." in readme


def test_blocks_that_need_an_account_or_hardware_say_so_in_visible_text():
    readme = (REPO / "README.md").read_text()
    for match in FENCE.finditer(readme):
        if match.group(1) != "bash":
            continue
        before = readme[:match.start()].rstrip("\n").rsplit("\n", 1)
        marker = MARKER.fullmatch(before[-1].strip())
        if not marker or not marker.group(1).startswith("skip (needs"):
            continue
        # the paragraph above the marker, as a reader sees it, names what the block needs
        visible = before[0].rstrip("\n").rsplit("\n\n", 1)[-1]
        assert re.search(r"\*\*Needs ", visible), f"say in visible text what this block needs:\n{match.group(0)}"


def test_no_block_writes_into_the_repository_root():
    blocks, _ = readme_blocks((REPO / "README.md").read_text())
    for block in blocks:
        for target in re.findall(r"--(?:out|save) (\S+)", block.text):
            assert "/" in target.rstrip("/") or target in ("figures", "runs"), f"{target} lands in the repository root: {block}"


def test_the_blocks_ci_runs_are_in_ci_verbatim():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    blocks, _ = readme_blocks((REPO / "README.md").read_text())
    ci_blocks = [b for b in blocks if b.kind == "run by .ci/run"]
    assert ci_blocks
    for block in ci_blocks:
        for command in block.commands():
            assert command in ci, f"{command!r} is not a line of .ci/run"
    setup = next(b for b in blocks if b.section == "Set up" and b.kind == "run")
    assert "python3 -m pip install -e \".[dev]\"" in setup.commands() and "python3 -m pip install -e \".[dev]\"" in ci


# ---------------------------------------------------------------- the whole README (slow; `-m readme`)
def user_environment(clone: Path) -> dict:
    """A user's shell after the set-up block: the clone's .venv activated, none of the suite's settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "XLA_FLAGS", "JAX_PLATFORMS", "WANDB_MODE", "WANDB_SILENT", "VIRTUAL_ENV",
                        "PYTHONHOME")
           and not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT", "PYTEST", "SCALING_"))}
    # Before the set-up block, `python3` is the interpreter running these tests (3.11 or newer);
    # after it, the clone's own virtual environment comes first, as `. .venv/bin/activate` puts it.
    env["PATH"] = os.pathsep.join([str(clone / ".venv" / "bin"), os.path.dirname(sys.executable),
                                   env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(clone / ".venv")
    return env


def run_block(block: Block, clone: Path, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, f"{block}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    for noise in LIBTPU_NOISE:  # once the tpu extra is in, a CPU machine still says nothing about TPUs
        assert noise not in done.stderr, f"{block}\nprinted libtpu's start-up errors:\n{done.stderr[-3000:]}"
    return done


def check_main_job(block: Block, clone: Path, env: dict) -> None:
    """What the main job promises: 6 finished runs, a rerun that trains nothing, figures, a clean tree."""
    from scaling.store import records

    run_command = next(c for c in block.commands() if " sweeps.launch run " in c)
    sweep_dir = clone / re.search(r"--workdir (\S+)", run_command).group(1) / "smoke"
    run_dirs = [d for d in sweep_dir.iterdir() if (d / "config.json").exists()]
    assert len(run_dirs) == 6
    assert all(records.read_record(d).status == "finished" for d in run_dirs)
    written = {d: (d / "result.json").stat().st_mtime_ns for d in run_dirs}
    again = run_block(Block(run_command, block.section, None), clone, env)
    assert "0 to train" in again.stdout + again.stderr
    assert {d: (d / "result.json").stat().st_mtime_ns for d in run_dirs} == written
    figures = clone / re.search(r"--out (\S+)", next(c for c in block.commands() if " analysis plot " in c)).group(1)
    assert list(figures.glob("*.png")), "analysis plot wrote no figures"
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == "", f"the main job left files git does not ignore:\n{status.stdout}"


@pytest.mark.slow
@pytest.mark.readme
def test_every_cloud_free_block_runs_verbatim_in_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    blocks, _ = readme_blocks((clone / "README.md").read_text())
    env = user_environment(clone)
    ran, left_out = set(), []
    for block in blocks:
        if block.kind in ("skip", "run by .ci/run") or (block.kind == "needs libtpu" and not libtpu_wanted()):
            left_out.append(f"{block.section}: {block.marker or block.kind}")
            continue
        run_block(block, clone, env)
        ran.add(block.section)
        if block.section.startswith(MAIN_JOB):
            check_main_job(block, clone, env)
    assert ran >= {"Set up", "Ask the paper's fit", "Analyse a sweep", "Sweeps", "Train one model"}
    assert (clone / ".venv" / "bin" / "depth-width-analysis").exists()  # the set-up block installed the scripts
    if not libtpu_wanted():
        warnings.warn("libtpu is not installed here, so the README's preflight block did not run")
    print("left out, as the README marks them:\n  " + "\n  ".join(left_out))
