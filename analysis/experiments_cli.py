"""The experiments' commands of ``python -m analysis``: each reads one results folder's run records and
prints (and draws) what its README reports.

    python -m analysis log-length results/log_length --figure accuracy.png
    python -m analysis hp-transfer results/hp_transfer --figure loss_vs_lr.png
    python -m analysis hp-transfer2 results/hp_transfer2 --figure loss_vs_lr.png

Each command imports its analysis module only when it runs, so the other commands start quickly.
"""

from __future__ import annotations

import json
import sys

from analysis.errors import AnalysisInputError
from scaling import cli


def cmd_log_length(args) -> int:
    """Mean ± std over seeds of test accuracy and cross-entropy (bits) per task, training setup (position
    encoding, fixed or fresh training strings), training length and attention scaling, and the two arms
    compared by Welch's t-test, from the run records of sweeps/configs/log_length.py."""
    from analysis import log_length

    print(log_length.run(args.directory, args.format, args.figure))
    if args.figure:
        print(f"figure: {args.figure}", file=sys.stderr)
    return 0


def cmd_hp_transfer(args) -> int:
    """Best peak rate per shape along the width axis (at --base-depth) and the depth axis (at --base-width)
    per parametrization, the spread of the best rates along each axis, and the pre-registered criterion
    of results/hp_transfer/README.md, from the run records of sweeps/configs/hp_transfer.py."""
    from analysis import hp_transfer

    print(hp_transfer.run(args.directory, args.json, args.figure, args.base_width, args.base_depth))
    if args.figure:
        print(f"figure: {args.figure}", file=sys.stderr)
    return 0


def cmd_hp_transfer2(args) -> int:
    """The second transfer experiment (results/hp_transfer2/README.md): base tuning, the best rate per shape
    from a parabola over seeds with a bootstrap interval, the drift of the best rate along width and depth,
    and the pre-registered criterion; --decisions prints what the sweep runs next."""
    from analysis import hp_transfer2

    if args.decisions:
        if args.base_extension:
            raise AnalysisInputError("--decisions reads the registered records only; drop --base-extension")
        print(json.dumps(hp_transfer2.decisions(args.directory), indent=2))
        return 0
    result = hp_transfer2.outcome(args.directory, args.base_extension)
    print(json.dumps(result, indent=2) if args.json else hp_transfer2.markdown(result))
    if args.figure:
        from analysis import hp_transfer2_plot

        hp_transfer2_plot.figure(hp_transfer2.plotted_runs(args.directory, result, args.base_extension), result,
                                 args.figure)
        print(f"figure: {args.figure}", file=sys.stderr)
    return 0


def add_commands(commands, command) -> None:
    """Add the experiments' subcommands to ``commands`` (argparse subparsers) with ``command(commands, name,
    run, help=...)``, the analysis CLI's way of making one (``analysis.__main__._command``)."""
    length = command(commands, "log-length", cmd_log_length,
                      help="FIRST/PARITY length generalisation: accuracy and bits per (task, setup, n, arm)")
    length.add_argument("directory", help="sweep directory, e.g. results/log_length")
    length.add_argument("--format", default="markdown", choices=("markdown", "csv", "json"))
    length.add_argument("--figure", metavar="PATH", help="also draw test accuracy vs training length (PNG/PDF)")

    transfer = command(commands, "hp-transfer", cmd_hp_transfer,
                        help="best learning rate per width and depth, per parametrization (μP, CompleteP)")
    transfer.add_argument("directory", help="sweep directory, e.g. results/hp_transfer")
    transfer.add_argument("--base-width", type=cli.positive_int, default=64, help="width of the depth axis (64)")
    transfer.add_argument("--base-depth", type=cli.positive_int, default=2, help="depth of the width axis (2)")
    transfer.add_argument("--json", action="store_true", help="JSON instead of markdown tables")
    transfer.add_argument("--figure", metavar="PATH", help="also draw loss against peak rate (PNG/PDF)")

    transfer2 = command(commands, "hp-transfer2", cmd_hp_transfer2,
                         help="second transfer experiment: best rate per shape with intervals, drift, criterion")
    transfer2.add_argument("directory", help="sweep directory, e.g. results/hp_transfer2")
    output = transfer2.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="JSON instead of markdown tables")
    output.add_argument("--decisions", action="store_true",
                        help="print the next stage's decisions (base settings, grid extensions) as JSON")
    transfer2.add_argument("--figure", metavar="PATH", help="also draw loss against rate per shape (PNG/PDF)")
    transfer2.add_argument("--base-extension", metavar="DIR", nargs="+",
                           help="exploratory: the base shape's fit also takes these sweeps' runs (README)")
