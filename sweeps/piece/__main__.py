"""``python -m sweeps.piece``: a sweep in pieces that one command on a lent machine can finish.

    python -m sweeps.piece wheels [--out gpu/wheels]        # here, with the package index: the wheels to carry
    python -m sweeps.piece run --stage 1 --commit SHA       # there (gpu/piece.sh): one piece, under $OUT
    python -m sweeps.piece accept COPY_OF_OUT --stage 1     # here: check what came back, add it to the ledger

Only the standard library is imported until ``run`` has checked (and installed) the packages.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import sys
import time

from sweeps.piece import packages

STARTED = time.monotonic()  # the piece's budget counts from here: installing the wheels is part of it
DEFAULT_BUDGET = 480.0  # seconds: a lent machine runs one command for at most 10 minutes
EXITS = ("exit status of run: 0 the stage is complete; 75 runs remain (run the next piece); 1 a run failed or "
         "diverged; 2 bad arguments; 3 packages missing that the wheel folder cannot supply; 4 the corpus archive "
         "is missing or not the committed one; 5 the next pack cannot finish inside any piece at the speed "
         "measured. accept: 0 all accepted, 1 some refused, 2 unreadable input.")


def seconds(text: str) -> float:
    """``45s``, ``8m``, ``1h`` or a number of seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"wants a duration such as 45s, 8m or 480, got {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def _common(sub) -> None:
    sub.add_argument("--stage", choices=("1", "2"), help="the depth experiment's stage (sets GPU_DEPTH_STAGE; "
                                                        "default: the environment's, else 1)")
    sub.add_argument("--sweep-file", type=pathlib.Path, default=packages.REPO / "sweeps/configs/gpu_depth.py",
                     help="a sweep file whose sweep is a PieceSweep (default: sweeps/configs/gpu_depth.py)")
    sub.add_argument("--ledger", type=pathlib.Path, help="the ledger of finished runs (default: the sweep's)")
    sub.add_argument("--fingerprint", type=pathlib.Path,
                     help="the committed corpus fingerprint whose archive SHA-256 is checked (default: the sweep's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sweeps.piece", epilog=EXITS,
                                     description="Train a sweep in pieces of one time-limited command each: "
                                                 "build the wheels to carry, run a piece, accept its records.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="train the next runs that fit the budget; write records under --out",
                              description="Train the next runs that fit the budget; write records under --out.",
                              epilog=EXITS)
    _common(run)
    run.add_argument("--budget", type=seconds, default=DEFAULT_BUDGET,
                     help=f"wall clock of the whole piece, installing included (default {DEFAULT_BUDGET:g} s)")
    run.add_argument("--out", type=pathlib.Path, default=os.environ.get("OUT") or None,
                     help="where records, piece.json and timing.md go (default: $OUT)")
    run.add_argument("--corpus", type=pathlib.Path, default=packages.REPO / "gpu/data/tokens.tar.xz",
                     help="the corpus archive tokens.tar.xz (default: gpu/data/tokens.tar.xz)")
    run.add_argument("--wheels", type=pathlib.Path, default=packages.DEFAULT_WHEELS,
                     help="the wheel folder to install missing packages from (default: gpu/wheels)")
    run.add_argument("--data-dir", type=pathlib.Path, default=pathlib.Path(os.environ.get("TMPDIR", "/tmp")),
                     help="where the archive is unpacked (default: $TMPDIR or /tmp)")
    run.add_argument("--probe", type=int, metavar="K",
                     help="first time solo against K packed runs of the cheapest shape (default: 4 on a card the "
                          "ledger has no timing for, else 0: none)")
    run.add_argument("--commit", default="", help="the commit this tree is (the machine has no git); accept checks it")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a base-config field that keeps run ids, e.g. model.attention_impl=... ")
    wheels = commands.add_parser("wheels", help="download the wheels a piece may need into a folder (needs the index)",
                                 description="Download, at the lock file's versions, the wheels of the packages "
                                             "the image may lack, for Linux x86_64; print the carry's size.")
    wheels.add_argument("--out", type=pathlib.Path, default=packages.DEFAULT_WHEELS, help="default: gpu/wheels")
    wheels.add_argument("--python", action="append", metavar="X.Y",
                        help=f"Python versions to cover (repeatable; default {', '.join(packages.DEFAULT_PYTHONS)})")
    wheels.add_argument("--corpus", type=pathlib.Path, default=packages.REPO / "gpu/data/tokens.tar.xz",
                        help="the corpus archive that travels too, counted in the carry's size")
    accept = commands.add_parser("accept", help="check the records a piece wrote and add them to the results",
                                 description="Check the records a piece wrote (a copy of its $OUT) and add the "
                                             "good ones to the results folder and the ledger.", epilog=EXITS)
    accept.add_argument("piece_out", type=pathlib.Path, help="the copy of the piece's $OUT")
    _common(accept)
    accept.add_argument("--results", type=pathlib.Path, default=packages.REPO / "results/gpu_depth",
                        help="the results folder (default: results/gpu_depth)")
    accept.add_argument("--repo", type=pathlib.Path, default=packages.REPO,
                        help="the git repository holding the commit the piece names (default: this checkout)")
    return parser


def fail(command: str, message: str, code: int) -> int:
    print(f"python -m sweeps.piece {command}: error: {message}", file=sys.stderr)
    return code


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "stage", None):
        os.environ["GPU_DEPTH_STAGE"] = args.stage
    if args.command == "wheels":
        return cmd_wheels(args)
    if args.command == "run":
        if args.out is None:
            parser.error("--out is required when $OUT is not set")
        try:
            installed = packages.ensure(args.wheels, say=lambda line: print(f"piece: {line}", flush=True))
        except packages.PackagesError as error:
            return fail("run", str(error), 3)
        from sweeps.piece.run import PieceError, piece

        try:
            return piece(args, STARTED, installed, say=lambda line: print(line, flush=True))
        except PieceError as error:
            return fail("run", str(error), error.code)
        except ValueError as error:  # a sweep file or --set that does not validate
            return fail("run", str(error), 2)
    return cmd_accept(args)


def cmd_wheels(args) -> int:
    try:
        size = packages.build_wheels(args.out, tuple(args.python or packages.DEFAULT_PYTHONS))
    except packages.PackagesError as error:
        return fail("wheels", str(error), 1)
    tree = packages.tree_bytes()
    archive = args.corpus.stat().st_size if args.corpus.is_file() else 0
    total = size + tree + archive
    print(f"wheels {size / 2**20:.1f} MiB in {args.out}; tracked tree {tree / 2**20:.1f} MiB; corpus archive "
          f"{archive / 2**20:.1f} MiB{'' if archive else ' (not found: ' + str(args.corpus) + ')'}; carry "
          f"{total / 2**20:.1f} MiB of the {packages.CARRY_LIMIT_BYTES / 2**20:.0f} MiB limit")
    return 0 if total <= packages.CARRY_LIMIT_BYTES else fail("wheels", "the carry is over the limit", 1)


def cmd_accept(args) -> int:
    from scaling.entry import prepare_process

    prepare_process()
    from sweeps.piece.accept import accept
    from sweeps.piece.ledger import LedgerError
    from sweeps.piece.plan import PieceSweep
    from sweeps.spec import load_sweep

    try:
        sweep = load_sweep(args.sweep_file)
        if not isinstance(sweep, PieceSweep):
            return fail("accept", f"{args.sweep_file}: its sweep is not a PieceSweep", 2)
        fingerprint = args.fingerprint or packages.REPO / sweep.piece.fingerprint
        import json

        data_fingerprint = json.loads(fingerprint.read_text())["data_fingerprint"]
        return accept(args.piece_out, sweep, args.results, args.ledger or packages.REPO / sweep.piece.ledger,
                      data_fingerprint, args.repo)
    except (LedgerError, ValueError, OSError, KeyError) as error:
        return fail("accept", str(error), 2)


if __name__ == "__main__":
    sys.exit(main())
