"""The trainer's command line: ``python -m scaling.train`` and ``depth-width-train``.

It reads the arguments and the config before anything heavy is imported:
JAX and the trainer (``scaling.run.train``) come in only to train, so ``--help``
and bad input answer at once. The trainer's Python names (``run``, ``run_pack``
and the hooks) are found here too, on first use, so ``from scaling import train;
train.run(config, workdir)`` keeps working.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from scaling import cli, python_file
from scaling.config import DataConfig, ModelConfig, TrainConfig, from_dict
from scaling.overrides import override
from scaling.store.storage import StorageAccessError, check_access, is_remote

# The trainer's public names, for code that imported them from ``scaling.train`` before the rooms existed:
# loaded on first use (PEP 562), so the command line still starts no JAX.
_TRAINER_NAMES = ("run", "run_pack", "Hook", "Evaluation", "Profile", "StepInfo", "resolve_config")


def __getattr__(name: str):
    if name in _TRAINER_NAMES:
        return getattr(importlib.import_module("scaling.run.train"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PRESETS = {
    # L=2, d=64 on the built-in corpus: ~300 steps in well under 2 minutes on 2 CPU cores.
    "tiny": TrainConfig(
        model=ModelConfig(depth=2, width=64, head_dim=16, max_seq_len=128),
        data=DataConfig(source="builtin", seq_len=128),
        steps=300, batch_size=16, eval_every=100, eval_batches=8, checkpoint_every=50, log_every=10,
        name="tiny"),
}
PRESET_NOTES = {"tiny": "L=2, d=64, 300 steps on the built-in corpus, about a minute on a CPU"}


def load_config(preset_or_file: str) -> TrainConfig:
    """A ``TrainConfig`` from a preset name, a ``config.json`` or a Python file defining ``config()``."""
    from etils import epath

    if preset_or_file in PRESETS:
        return PRESETS[preset_or_file]
    path = epath.Path(preset_or_file)
    if not path.exists():
        raise ValueError(f"--config {preset_or_file!r}: not a preset ({', '.join(PRESETS)}) and no such file")
    if path.suffix == ".json":
        return from_dict(TrainConfig, json.loads(path.read_text()))
    if path.suffix == ".py":
        return python_file.load(path, function="config", expected=TrainConfig, what="--config")
    raise ValueError(f"--config {preset_or_file}: expected a preset, a .json or a .py file")


def build_parser() -> argparse.ArgumentParser:
    """The trainer's argument parser; its ``prog`` is the command as typed (``cli.prog``)."""
    prog = cli.prog("python -m scaling.train")
    parser = cli.Parser(
        prog=prog,
        usage=f"{prog} --config PRESET_OR_FILE --workdir DIR [--set KEY=VALUE ...] [options]\n"
              f"       {prog} {{{','.join(USE_COMMANDS)}}} ... (a trained run or a config; e.g. {prog} eval --help)",
        description="Train one transformer LM into a run directory. Rerunning the same command resumes from the "
                    "latest checkpoint, or does nothing if the run already finished. 'eval RUN_DIR' and "
                    "'sample RUN_DIR' use a trained run instead (see 'eval --help', 'sample --help'); "
                    "'config' prints the resolved config and its --set keys, 'export' writes a run as a "
                    "Hugging Face model (each has --help).",
        epilog=f"Example: {prog} --config tiny --workdir runs/tiny --set optim.peak_lr=1e-3")
    parser.add_argument("--config", required=True,
                        help="a preset (" + "; ".join(f"{name}: {PRESET_NOTES[name]}" for name in PRESETS)
                             + "), a run's config.json, or a .py file defining config()")
    parser.add_argument("--workdir", required=True, help="run directory (local path or gs:// URI)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. model.depth=4 or optim.lr_rule=mup (repeatable)")
    parser.add_argument("--init-from", metavar="RUN_DIR",
                        help="start from another run's newest parameters (weights only; same model shape); "
                             "the run is a new run that records its parent")
    parser.add_argument("--profile", metavar="START:STEPS", type=_profile_steps,
                        help="write a jax.profiler trace of STEPS steps after the first START into "
                             "WORKDIR/profile (open it in TensorBoard or Perfetto), e.g. 10:5")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--json", action="store_true", help="end with the run's result as one JSON object "
                                                            "instead of a sentence")
    parser.add_argument("--coordinator", help="multi-process start-up: coordinator host:port (on a pod, use "
                                              "the sweep command's run --pod-wide, which finds it)")
    parser.add_argument("--num-processes", type=int, help="with --coordinator: total number of processes")
    parser.add_argument("--process-id", type=int, help="with --coordinator: this process's index")
    return parser


def _profile_steps(text: str) -> tuple[int, int]:
    """``START:STEPS`` as two integers, START >= 1 (step 0 compiles) and STEPS >= 1."""
    start, _, steps = text.partition(":")
    if not (start.isdigit() and steps.isdigit() and int(start) >= 1 and int(steps) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: allowed START:STEPS, integers, START >= 1 (step 0 "
                                         "compiles the program) and STEPS >= 1, e.g. 10:5")
    return int(start), int(steps)


# Commands that use a trained run, each a module of its own with a ``main(argv, prog)``.
USE_COMMANDS = {"eval": "scaling.run.evaluate", "sample": "scaling.run.generate", "config": "scaling.config_cli",
                "export": "scaling.run.export_hf"}


def named_for_workdir(config: TrainConfig, preset: str, overrides: list[str], workdir: str) -> TrainConfig:
    """A preset's run named after its work directory (``runs/tiny-deep`` -> ``tiny-deep``), so that the
    progress lines of several runs of one preset say which is which; an explicit ``--set name=...``, a
    config file's own name and the run id are left alone (the name is no part of the run id)."""
    import dataclasses

    if preset not in PRESETS or any(o.partition("=")[0] == "name" for o in overrides):
        return config
    name = os.path.basename(os.path.normpath(workdir.rstrip("/"))) or config.name
    return dataclasses.replace(config, name=name)


def main(argv=None) -> int:
    """Run the command line; returns the exit status (2 for unusable input)."""
    from scaling.entry import prepare_process

    prepare_process()  # before JAX starts its backend or a storage client
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in USE_COMMANDS:
        command = importlib.import_module(USE_COMMANDS[argv[0]])
        return command.main(argv[1:], prog=f"{cli.prog('python -m scaling.train')} {argv[0]}")
    args = build_parser().parse_args(argv)
    try:
        check_access(args.workdir, args.config)  # one line now, not a minute of client retries later
        base = load_config(args.config)
        config = named_for_workdir(override(base, args.overrides), args.config, args.overrides, args.workdir)
        if args.init_from:
            check_access(args.init_from)
            from scaling.store.rundir import absolute_path  # one spelling of the parent, whatever the working directory

            config = override(config, [f"init_from={absolute_path(args.init_from)}"])
        check_access(config.data.cache_dir)
        from scaling.data.corpus import check_hub_reachable

        check_hub_reachable(config.data)  # one line now, not a minute of the hub client's retries
    except (StorageAccessError, ValueError) as error:
        print(f"{_prog()}: error: {error}", file=sys.stderr)
        return 2
    if not is_remote(args.workdir) and os.path.isfile(os.path.expanduser(args.workdir)):
        print(f"{_prog()}: error: --workdir {args.workdir}: is a file, not a directory", file=sys.stderr)
        return 2
    if args.overrides:
        print(overrides_line(args.config, base, config, args.overrides), flush=True)  # stdout: errors stay one line
    from scaling.cpu_allocator import tune_cpu_allocator

    tune_cpu_allocator()  # before JAX starts its CPU backend
    from scaling.model import mesh as mesh_lib
    from scaling.store.checkpoints import exit_now_if_abandoned

    mesh_lib.initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    return exit_now_if_abandoned(_run_command(config, args))


def overrides_line(source: str, base: TrainConfig, config: TrainConfig, overrides: list[str]) -> str:
    """``config tiny with model.depth=4 (was 2), ...``: what ``--set`` changed, said once at start."""
    from scaling.config import to_dict

    before, after = to_dict(base), to_dict(config)
    changes = []
    for assignment in overrides:
        key = assignment.partition("=")[0]
        old, new = before, after
        for part in key.split("."):
            old, new = old[part], new[part]
        changes.append(f"{key}={json.dumps(new)} (was {json.dumps(old)})")
    return f"config {source} with {', '.join(changes)}"


def _run_command(config: TrainConfig, args) -> int:
    """Train, print the result's summary (or one line saying how the run ended) and return the exit
    status that ``scaling.run.ending`` gives the run's end."""
    import jax

    from scaling.run import train
    from scaling.store import rundir
    from scaling.run.ending import ending
    from scaling.run.stopping import PREEMPTED_EXIT_CODE

    hooks = []
    if args.profile:
        from etils import epath

        directory = epath.Path(rundir.absolute_path(args.workdir)) / "profile"
        hooks.append(train.Hook(train.Profile(*args.profile, directory), every=1, name="profile"))
    try:
        result = train.run(config, args.workdir, show_progress=not args.no_progress, hooks=hooks)
    except Exception as error:  # noqa: BLE001 - a failure's traceback is in the run's error.log
        end = ending(error)
        if end.exit_code == PREEMPTED_EXIT_CODE:
            print(f"{error}; rerun the same command to resume", file=sys.stderr)
        elif end.status != "failed":
            print(f"{_prog()}: error: {error}", file=sys.stderr)
        else:
            print(f"{_prog()}: error: run failed: {rundir.one_line(error)} ({_where_logged(error, args.workdir)})",
                  file=sys.stderr)
        return end.exit_code
    if jax.process_index() == 0:
        # wall_seconds: the whole run; train_seconds: its steps alone, compiling excluded (records.RunRecord)
        if args.json:
            print(json.dumps({k: getattr(result, k) for k in ("status", "name", "final_eval_loss", "steps",
                                                              "tokens", "train_seconds", "wall_seconds")}))
        else:
            print(result_sentence(result, args.workdir))
    return ending(None, result.status).exit_code


def result_sentence(result, workdir: str) -> str:
    """``tiny: finished, eval loss 2.1234, 300 steps in ... ; records in runs/tiny``, as the launcher says it."""
    from scaling.run import progress
    from scaling.cli import fmt

    return (f"{result.name}: {result.status}, eval loss {fmt(result.final_eval_loss, '.4f')}, "
            f"{progress.run_time(result.steps, result.train_seconds, result.wall_seconds)}; record in "
            f"{os.path.join(workdir, 'result.json')}")


def _prog() -> str:
    return cli.prog("python -m scaling.train")


def _where_logged(error: Exception, workdir: str) -> str:
    """Where a failure's traceback is: ``error.log`` only if it was written there (``member.Member``)."""
    if getattr(error, "error_log", None):
        return f"traceback in {error.error_log}"
    if hasattr(error, "error_log"):
        return f"no error.log: {workdir} could not be written"
    return f"failed before anything was recorded in {workdir}"


if __name__ == "__main__":
    # `python -m scaling.train`: the command line reads its arguments before this module (and JAX) is
    # imported, so --help and bad input answer at once; it imports scaling.run.train itself to train.
    import sys

    sys.exit(main())
