"""Every command line's --help: answered without importing JAX, named as it was started, short and plain
for the sweep launcher, and one line of description for every subcommand; and bad input answered with
one line naming the option, and exit status 2."""

import argparse
import sys
import textwrap
import tomllib

import pytest

import helpers
from helpers import REPO

HEAVY = ("jax", "flax", "optax", "orbax")  # what made --help take seconds

# module run by `python -m`, the function building its parser
ENTRY_POINTS = {
    "sweeps.launch": "sweeps.launch:build_parser",
    "scaling.train": "scaling.train:build_parser",
    "analysis": "analysis.__main__:build_parser",
    "scaling.data": "scaling.data.__main__:_parser",
}


def _env():
    return helpers.with_checkout(COLUMNS="80")


def _imported(importtime_log: str) -> set:
    """Top-level packages that ``python -X importtime`` reports imported."""
    names = set()
    for line in importtime_log.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_answers_without_jax_and_names_the_module(module):
    done = helpers.run([sys.executable, "-X", "importtime", "-m", module, "--help"], env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: python -m {module} ")
    imported = _imported(done.stderr)
    assert "argparse" in imported  # the log was read
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def _scripts() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_console_script_is_an_entry_point_tested_here():
    modules = {target.split(":")[0] for target in _scripts().values()}
    parser_modules = {target.split(":")[0] for target in ENTRY_POINTS.values()}
    assert modules == parser_modules, "a console script whose module is not in ENTRY_POINTS"


@pytest.mark.parametrize("script", sorted(_scripts()))
def test_console_script_help_is_named_as_typed_and_imports_no_jax(script):
    # The installed scripts run another checkout's code, so the script's target is called here as the
    # wrapper pip writes calls it: sys.argv[0] is the script's path.
    module, function = _scripts()[script].split(":")
    code = textwrap.dedent(f"""
        import contextlib, io, sys
        sys.argv = ["/some/venv/bin/{script}", "--help"]
        from {module} import {function}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                {function}()
            except SystemExit as stop:
                assert stop.code in (0, None), stop.code
        heavy = [name for name in {HEAVY!r} if name in sys.modules]
        assert not heavy, heavy
        print(out.getvalue())
    """)
    done = helpers.run_python(code, env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: {script} "), done.stdout[:200]


def test_sweep_help_is_short_and_plain():
    done = helpers.run_module("sweeps.launch", "--help", env=_env(), timeout=120)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert len(lines) <= 30, done.stdout
    assert "`" not in done.stdout  # reStructuredText markup
    for internal in ("scaling.", "sweeps.spec", "PREEMPTED_EXIT_CODE", "jax.distributed"):
        assert internal not in done.stdout.replace("python -m sweeps.launch", ""), internal
    for command in ("list", "dry-run", "run", "status", "preflight", "hosts", "sky"):
        assert any(line.split()[:1] == [command] for line in lines), command  # one line per command
    assert "75" in done.stdout and "resume" in done.stdout  # the exit status of a stopped sweep


def _builders():
    import importlib

    for module, target in ENTRY_POINTS.items():
        name, function = target.split(":")
        yield module, getattr(importlib.import_module(name), function)


@pytest.mark.parametrize("module,build", list(_builders()), ids=list(ENTRY_POINTS))
def test_every_subcommand_has_a_one_line_description(module, build):
    parser = build()
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for action in subcommands:
        for name, sub in action.choices.items():
            description = (sub.description or "").strip()
            assert description, f"{module} {name}: no description"
            assert "``" not in description, f"{module} {name}: reStructuredText in the description"
            help_text = sub.format_help()
            assert description.split()[0] in help_text  # shown by `COMMAND --help`


@pytest.mark.parametrize("command", ["list", "dry-run", "run", "status", "preflight", "hosts", "sky"])
def test_sweep_subcommand_help_is_plain(command):
    from sweeps import launch

    parser = launch.build_parser()
    sub = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    text = sub.choices[command].format_help()
    assert "`" not in text and "sweeps.spec" not in text, text


# Every `python -m` entry point (the console scripts' modules and the module-only tools) with a bad option value.
BAD_VALUES = {
    "scaling.train": (["--config", "tiny", "--workdir", "runs/x", "--num-processes", "two"], "--num-processes"),
    "scaling.train eval": (["eval", "runs/x", "--batches", "0"], "--batches"),
    "scaling.train export": (["export", "runs/x", "--to", "onnx", "out"], "--to"),
    "scaling.train config": (["config", "--config", "tiny", "--set"], "--set"),
    "scaling.data": (["batch-hash", "--seed", "x", "--step", "1", "--batch-size", "2"], "--seed"),
    "scaling.corpus": (["build", "--out", "corpus", "--xz-preset", "12"], "--xz-preset"),
    "scaling.corpus_build": (["--out", "corpus", "--xz-preset", "x"], "--xz-preset"),
    "scaling.migrate_records": (["runs", "--dry-run=yes"], "--dry-run"),
    "analysis": (["synthetic", "--out", "sweep.csv", "--seeds", "0"], "--seeds"),
    "sweeps.launch": (["run", "sweep.py", "--shard", "x"], "--shard"),
}


@pytest.mark.parametrize("entry", BAD_VALUES)
def test_a_bad_option_value_is_one_line_naming_it_and_exit_status_2(entry, tmp_path):
    module = entry.split()[0]
    argv, option = BAD_VALUES[entry]
    done = helpers.run_module(module, *argv, cwd=tmp_path, env=_env(), timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and option in lines[0], done.stderr
    assert lines[0].startswith(f"python -m {module}"), lines[0]  # says which command answered
    assert done.stdout == ""
