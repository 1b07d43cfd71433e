"""Command line: optimal shapes, Table 1, transition sizes, and sweep analysis.

    python -m analysis optimal --params 175e9
    python -m analysis table --preset gpt3 --format markdown
    python -m analysis transition-size --depth 96 --json
    python -m analysis fit runs/my_sweep --save my_fit.json
    python -m analysis optimal --params 1.3B --fit my_fit.json
    python -m analysis plot runs/my_sweep --out figures/
    python -m analysis curves runs/my_sweep --out figures/curves --by width
    python -m analysis log-length results/log_length --figure accuracy.png
    python -m analysis hp-transfer results/hp_transfer --figure loss_vs_lr.png
    python -m analysis hp-transfer2 results/hp_transfer2 --figure loss_vs_lr.png
    python -m analysis synthetic --out sweep.csv

The same commands are installed as depth-width-analysis.

Sizes are non-embedding parameters N = 12·L·d²; widths are d_x in channels.
Bad input prints one error line and exits with status 2.
"""

from __future__ import annotations

import argparse
import inspect
import csv
import io
import json
import math
import sys

import numpy as np

from analysis import experiments_cli, projection
from analysis.errors import AnalysisInputError
from analysis.fit import save_fit
from analysis.shapes import width_at
from scaling import cli

MODULE_FORM = "python -m analysis"  # the command's name when not started as depth-width-analysis

# The sweep commands import pandas, scipy.stats and matplotlib only when they run,
# so `optimal`, `table` and `transition-size` start quickly.


def _params_arg(text):
    try:
        return projection.parse_params(text)
    except AnalysisInputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _depth_arg(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as a depth in layers") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"depth must be positive, got {text!r}")
    return int(value) if value.is_integer() else value


def _print_json(data):
    print(json.dumps(data, indent=2, default=_json_default, allow_nan=False))


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _print_written(paths, out, what: str = "") -> None:
    """The files a drawing command wrote, one a line under a heading naming their directory."""
    print(f"wrote {len(paths)} files to {out}{what}:")
    for path in paths:
        print(f"  {path}")


def _fit_banner(fit) -> str:
    return f"fit {fit.name}: a = {fit.a:.4g}, b = {fit.b:.4g}"


# ---------------------------------------------------------------- projections
def cmd_optimal(args) -> int:
    from analysis import tables

    fit = projection.resolve_fit(args.fit)
    shapes = [projection.optimal_shape(params, fit, head_size=args.head_size) for params in args.params]
    several = len(shapes) > 1
    for shape in shapes:
        for warning in (shape.warning, shape.budget_warning):
            if warning:
                print(f"warning: {f'N={shape.params:.3g}: ' if several else ''}{warning}", file=sys.stderr)
    if args.json:  # an object for one budget, a list for several
        _print_json([shape.to_dict() for shape in shapes] if several else shapes[0].to_dict())
        return 0
    if several:
        depths = f" (L = {fit.depth_range[0]:g} to {fit.depth_range[1]:g})" if fit.depth_range else ""
        print(f"Optimal depth and width for {len(shapes)} budgets N = 12·L·d² ({_fit_banner(fit)}).")
        print(f"L range: N_tr·e^(±ΔN/N_tr) = N; d rounded to heads of {args.head_size}; "
              f"fit range: L against the fit's depths{depths}.")
        print()
        print(tables.shapes_table(shapes))
        return 0
    (shape,) = shapes
    print(f"budget N = {shape.params:.4g} non-embedding parameters ({_fit_banner(fit)})")
    print(f"optimal depth  {shape.depth} layers (N_tr(L) = N at L = {shape.depth_continuous:.2f}; "
          f"N_tr·e^(±ΔN/N_tr) = N gives L = {cli.fmt(shape.depth_low, '.1f', 'unbounded')} to "
          f"{cli.fmt(shape.depth_high, '.1f', 'unbounded')})")
    if shape.depth_continuous < 1:
        print(f"  (N_tr(1) = {float(projection.transition_params(1, fit)):.3g} > N: even one layer is too deep "
              "for this budget under this fit)")
    print(f"optimal width  {shape.width:,.0f} channels (sqrt(N / (12·{shape.depth}))); "
          f"{shape.width_rounded:,} rounded to the head size {shape.head_size}")
    print(f"N_tr({shape.depth}) = {shape.n_transition:.4g} ± {shape.delta_n:.2g} parameters")
    return 0


def cmd_table(args) -> int:
    from analysis import paper_table, tables

    fit = projection.resolve_fit(args.fit)
    preset = None if args.params else (args.preset or "gpt3")
    budgets = ([projection.Budget.from_params(params) for params in args.params] if args.params
               else projection.resolve_budgets(preset))
    rows = projection.optimal_table(budgets, fit)
    for row in rows:
        if row["fit_range"] == "far outside":
            warning = projection.extrapolation_warning(row["optimal_depth_continuous"], fit)
            print(f"warning: {row['name']}: {warning}", file=sys.stderr)
    # Table 1's printed values sit beside ours only where they were computed the same way: the paper's fit.
    comparisons = [paper_table.compare(b, fit) if paper_table.applies(fit) else None for b in budgets]
    for row, comparison in zip(rows, comparisons):
        if comparison is not None:
            row.update(comparison.to_dict())
    fmt = "json" if args.json else args.format
    if fmt == "json":
        _print_json({"preset": preset, "fit": fit.name, "a": fit.a, "b": fit.b,
                     "cov": [list(r) for r in fit.cov], "rows": rows})
    elif fmt == "csv":
        out = io.StringIO()
        fields = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(out, fieldnames=fields + ["fit", "a", "b"], lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "fit": fit.name, "a": fit.a, "b": fit.b})
        print(out.getvalue(), end="")
    else:
        compared = any(comparisons)
        print(f"Optimal depth and width per budget, {f'preset {preset}' if preset else 'your budgets'} "
              f"({_fit_banner(fit)}).")
        print("Size N = 12·L·d² (of the trained shape L×d, where there is one); L range: N_tr·e^(±ΔN/N_tr) = N.")
        if compared:
            print("Paper: Table 1 of Levine et al. 2020 as printed; "
                  + ("how each printed value arises is listed below." if args.explain
                     else "--explain says how each printed value arises."))
        elif preset == "gpt3":
            print("(Table 1's printed values are shown beside these with --fit levine2020 only.)")
        print()
        print(tables.table1(rows, comparisons, explain=args.explain))
    return 0


def cmd_transition_size(args) -> int:
    fit = projection.resolve_fit(args.fit)
    rows = []
    for depth in args.depth:
        with np.errstate(over="ignore", invalid="ignore"):
            size = float(projection.transition_params(depth, fit))
            delta = float(projection.transition_params_error(depth, fit))
        row = {"depth": depth, "n_transition": size, "delta_n": delta, "relative_error": delta / size,
               "width": float(width_at(size, depth)), "fit": fit.name, "a": fit.a, "b": fit.b,
               "note": None}
        if not all(math.isfinite(row[key]) for key in ("n_transition", "delta_n", "relative_error", "width")):
            # JSON has no infinity: give null and say why.
            row.update({key: None for key in ("n_transition", "delta_n", "relative_error", "width")})
            row["note"] = f"N_tr({depth:g}) exceeds the largest floating-point number; no value"
        warning = projection.extrapolation_warning(float(depth), fit)
        if warning:
            print(f"warning: L={depth:g}: {warning}", file=sys.stderr)
        rows.append(row)
    if args.json:
        _print_json(rows[0] if len(rows) == 1 else rows)
        return 0
    print(f"N_tr(L) = 12·L·e^(2a)·e^(2bL), ΔN from the full covariance ({_fit_banner(fit)})")
    for row in rows:
        if row["note"]:
            print(row["note"])
            continue
        print(f"N_tr({row['depth']:g}) = {row['n_transition']:.4g} ± {row['delta_n']:.2g} parameters "
              f"(ΔN/N = {row['relative_error']:.3f}; transition width {row['width']:,.0f})")
    return 0


# ---------------------------------------------------------------- sweep analysis
def _analyse(args):
    from analysis.results import load_runs, require_depths
    from analysis.summary import analyse

    table = load_runs(args.source, fingerprint=args.fingerprint, steps=args.steps)
    require_depths(table, 2)
    return analyse(table, alpha=args.alpha, method=args.test, loss_std=args.loss_std,
                   n_bootstrap=args.bootstrap, seed=args.seed, name=str(args.source).rstrip("/").rsplit("/", 1)[-1])


def cmd_fit(args) -> int:
    result = _analyse(args)
    fit = result.fit(args.estimate)
    if fit is not None and args.save:
        save_fit(fit, args.save)
    if args.json:
        _print_json({**result.to_dict(), "fit": fit.to_dict() if fit else None, "estimate": args.estimate,
                     "fit_message": result.fit_messages.get(args.estimate) or result.message or None,
                     "saved": args.save if fit is not None and args.save else None})
    else:
        for line in result.lines(show_all_rates=args.all_rates):
            print(line)
        if fit is not None:
            (saa, sab), (_, sbb) = fit.cov
            print(f"cov ({args.estimate}) = [[{saa:.3g}, {sab:.3g}], [{sab:.3g}, {sbb:.3g}]]")
            if args.save:
                print(f"saved the {args.estimate} fit to {args.save} (use it with --fit {args.save})")
    if fit is None and args.save:
        # Non-zero, so that a script chaining `fit --save` into `optimal --fit` stops here, not one step later.
        why = result.fit_messages.get(args.estimate) or result.message or "no transitions to fit"
        print(f"{cli.prog(MODULE_FORM)} fit: nothing saved to {args.save}: no {args.estimate} fit ({why})", file=sys.stderr)
        return 1
    return 0


def cmd_plot(args) -> int:
    from analysis import plots  # matplotlib only when drawing
    from analysis.summary import Outcome

    plots.check_output_directory(args.out, args.source)
    result = _analyse(args)
    fit = result.fit(args.estimate)
    reference = projection.resolve_fit(args.fit)
    budgets = projection.resolve_budgets(args.preset) if args.preset else ()
    paths = plots.write_sweep_figures(result.runs, list(result.transitions), fit, args.out, reference=reference,
                                      budgets=budgets, estimate=args.estimate, source=result.table.source)
    plots.mark_source(args.out, args.source)
    notes = []
    if fit is None:
        why = result.message if result.outcome is not Outcome.FITTED else result.fit_messages[args.estimate]
        notes.append(f"{why}; drew {reference.name} (the paper's fit) for the N_tr(L) figures, "
                     "no width-fit figure")
    if args.json:
        _print_json({"figures": [str(p) for p in paths], "notes": notes, "outcome": result.outcome.value,
                     "significance": result.significance})
    else:
        print(result.table.describe())
        for line in [*result.table.notes, *result.rate_lines(args.all_rates)]:
            print(line)
        for note in notes:
            print(note)
        _print_written(paths, args.out)
    return 0


def cmd_curves(args) -> int:
    """Loss curves of a run or of every run under a directory (local or gs://): train loss (solid) and eval
    loss (dashed, markers) in nats per token against the optimizer step and against training tokens, one
    figure per depth or per width (analysis/curves.py)."""
    from etils import epath

    from analysis import curves  # matplotlib only when drawing

    out = epath.Path(args.out)
    if out.exists() and not out.is_dir():
        raise AnalysisInputError(f"--out {args.out}: is a file; give a directory for the figures")
    from scaling.store.rundir import resolve_run_dir

    source = args.source
    if not epath.Path(source).exists():  # a sweep's run by its name (runs/smoke/L1-d128-s0)
        try:
            source = str(resolve_run_dir(source))
        except ValueError as error:
            raise AnalysisInputError(str(error)) from None
    runs, notes = curves.load_curves(source)
    name = epath.Path(str(args.source).rstrip("/")).name or str(args.source)
    paths = curves.write_curves(runs, args.out, by=args.by, source=name, log=args.log)
    if args.json:
        _print_json({"runs": [run.path for run in runs], "figures": [str(p) for p in paths], "notes": notes})
        return 0
    print(f"read {len(runs)} runs from {args.source}: depths {sorted({r.depth for r in runs})}, "
          f"widths {sorted({r.width for r in runs})}")
    for note in notes:
        print(note)
    _print_written(paths, args.out, f" (one figure per {args.by}, PNG and PDF)")
    return 0


def cmd_synthetic(args) -> int:
    """Losses of every (depth, width, seed) from a shared power law plus a depth term that makes adjacent
    depths cross exactly at N_tr(L) of the fit, with Gaussian seed noise (analysis/synthetic.py). `fit`
    on the CSV should give back about the planted a and b."""
    from etils import epath

    from analysis.synthetic import synthetic_runs

    fit = projection.resolve_fit(args.fit)
    if len(set(args.depths)) < 2:
        raise AnalysisInputError(f"--depths: need 2 or more distinct depths for a transition, got {args.depths}")
    runs = synthetic_runs(depths=args.depths, a=fit.a, b=fit.b, seeds=args.seeds, noise=args.noise, rng=args.seed)
    epath.Path(args.out).write_text(runs.to_csv(index=False))  # local or gs://
    print(f"wrote {len(runs)} runs to {args.out}: depths {sorted(set(args.depths))}, {args.seeds} seeds, seed noise "
          f"{args.noise:g} nats, transitions planted at a = {fit.a:.4g}, b = {fit.b:.4g} ({fit.name})")
    return 0


def _noise_arg(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as nats per token") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"seed noise must be 0 or more nats per token, got {text!r}")
    return value


# ---------------------------------------------------------------- parser
# The options of the commands that read a sweep (fit, plot): (flags, add_argument's keywords).
SWEEP_OPTIONS = (
    (["source"], dict(help="sweep directory (searched for result.json) or CSV with columns depth,width,params,"
                           "seed,loss (optional: peak_lr,steps,lr_rule,data_fingerprint)")),
    (["--fingerprint"], dict(help="use only runs with this data_fingerprint (prefix ok)")),
    (["--steps"], dict(type=int, help="use only runs planned for this many steps")),
    (["--estimate"], dict(default="crossing", choices=("crossing", "paper"),
                          help="transition estimate to fit, save and plot: crossing (zero crossing of the loss "
                               "difference, default) or paper (first significantly-worse size); both are printed")),
    (["--all-rates"], dict(action="store_true",
                           help="list every learning rate's mean loss per shape, not only the chosen one")),
    (["--test"], dict(default="pooled", help="significance test for 'shallower is worse': pooled (default; seed "
                                             "std pooled per depth pair) or welch; see analysis/transition.py")),
    (["--alpha"], dict(type=float, default=0.05, help="one-sided significance level (0.05)")),
    (["--loss-std"], dict(type=float, help="seed std in nats/token, if runs have one seed each")),
    (["--bootstrap"], dict(type=int, default=1000,
                           help="parametric bootstrap replicates for both estimates' 95%% intervals (1000)")),
    (["--seed"], dict(type=int, default=0, help="random seed of the bootstrap")),
    (["--json"], dict(action="store_true", help="print JSON")),
)


def _command(commands, name: str, run, help: str, **options):
    """The subcommand ``name`` that calls ``run``: its ``--help`` opens with ``run``'s docstring, or with
    the one line the command list shows (``help``) where ``run`` has none."""
    description = inspect.cleandoc(run.__doc__) if run.__doc__ else help
    command = commands.add_parser(name, help=help, description=description, **options)
    command.set_defaults(run=run)
    return command


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m analysis`` argument parser."""
    parser = cli.Parser(prog=cli.prog(MODULE_FORM), description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    fit_help = "fit preset (levine2020, the paper's eq. 10) or a JSON file from `fit --save`"
    optimal = _command(commands, "optimal", cmd_optimal,
                       help="optimal depth and width for one or more parameter budgets")
    optimal.add_argument("--params", type=_params_arg, required=True, nargs="+", action="extend", metavar="N",
                         help="non-embedding budget(s) N = 12·L·d²: 175e9, 1.3B, 800M, 2T; several "
                              "(--params 125M 350M, or --params repeated) give one table")
    optimal.add_argument("--fit", default="levine2020", help=fit_help)
    optimal.add_argument("--head-size", type=int, default=64,
                         help="channels per attention head; the width is also given rounded to it (64)")
    optimal.add_argument("--json", action="store_true",
                         help="print JSON: an object for one budget, a list for several (a warning about "
                              "extrapolation still goes to stderr)")

    table = _command(commands, "table", cmd_table, help="optimal shapes for a list of budgets (Table 1)")
    budgets = table.add_mutually_exclusive_group()
    budgets.add_argument("--preset", default=None, choices=sorted(projection.BUDGET_PRESETS),
                         help="budget list: gpt3 = the 8 GPT-3 shapes plus a 1T budget (the default)")
    budgets.add_argument("--params", type=_params_arg, nargs="+", action="extend", metavar="N",
                         help="your own budgets instead of a preset: 125M 350M 1.3B")
    table.add_argument("--fit", default="levine2020", help=fit_help)
    table.add_argument("--format", default="markdown", choices=("markdown", "csv", "json"))
    table.add_argument("--json", action="store_true", help="same as --format json")
    table.add_argument("--explain", action="store_true",
                       help="list under the table how each of Table 1's printed values arises (which a, b "
                            "and rounding); the table itself says only 'same' or what differs")

    size = _command(commands, "transition-size", cmd_transition_size,
                    help="N_tr(L) ± ΔN at one or more depths (eq. 9)")
    size.add_argument("--depth", type=_depth_arg, nargs="+", required=True, help="depth(s) L in layers")
    size.add_argument("--fit", default="levine2020", help=fit_help)
    size.add_argument("--json", action="store_true",
                      help="print JSON (an object for one depth, a list for several)")

    sweep = cli.Parser(add_help=False)
    for flags, options in SWEEP_OPTIONS:
        sweep.add_argument(*flags, **options)

    fit = _command(commands, "fit", cmd_fit, parents=[sweep], help="transition widths and the log d = a + b·L fit")
    fit.add_argument("--save", metavar="PATH", help="write the fit (a, b, cov) as JSON for --fit PATH")

    plot = _command(commands, "plot", cmd_plot, parents=[sweep], help="figures like the paper's Figs. 2-4")
    plot.add_argument("--out", required=True, help="directory for the PNG and PDF files")
    plot.add_argument("--fit", default="levine2020", help="fit drawn when the sweep gives none of its own")
    plot.add_argument("--preset", default="gpt3", help="budgets marked on the projection figure ('' for none)")

    curves = _command(commands, "curves", cmd_curves,
                      help="train and eval loss against step and tokens for each run (from metrics.jsonl)")
    curves.add_argument("source", help="a run directory (holding config.json and metrics.jsonl) or a folder "
                                       "of runs, e.g. runs/smoke")
    curves.add_argument("--out", required=True, help="directory for the PNG and PDF files (made if missing)")
    curves.add_argument("--by", default="depth", choices=("depth", "width"),
                        help="one figure per depth, runs coloured by width (default), or per width")
    curves.add_argument("--log", action="store_true", help="logarithmic axes (leaves out the evaluation at step 0)")
    curves.add_argument("--json", action="store_true", help="print the runs read and the files written as JSON")

    synthetic = _command(commands, "synthetic", cmd_synthetic,
                         help="write a synthetic sweep (CSV) whose transitions are planted at a fit's a and b")
    synthetic.add_argument("--out", required=True, metavar="PATH", help="CSV file to write")
    synthetic.add_argument("--fit", default="levine2020", help="fit whose a and b are planted (" + fit_help + ")")
    synthetic.add_argument("--depths", type=cli.positive_int, nargs="+", default=[6, 12, 18, 24, 30, 36],
                           help="depths L in layers (default: the paper's 6 12 18 24 30 36)")
    synthetic.add_argument("--seeds", type=cli.positive_int, default=3, help="seeds per shape (3)")
    synthetic.add_argument("--noise", type=_noise_arg, default=0.004,
                           help="seed standard deviation in nats per token (0.004)")
    synthetic.add_argument("--seed", type=int, default=0, help="random seed of the noise (0)")

    experiments_cli.add_commands(commands, _command)
    return parser


# Arguments that may name a gs:// file or folder (each command has some of them).
PATH_ARGUMENTS = ("source", "directory", "out", "save", "figure", "fit")


def main(argv=None) -> int:
    """Run the CLI; returns the exit status (2 for unusable input)."""
    from scaling.entry import prepare_process

    prepare_process()  # before JAX starts its backend or a storage client
    parser = build_parser()
    args = parser.parse_args(argv)
    remote = [path for path in (getattr(args, name, None) for name in PATH_ARGUMENTS)
              if isinstance(path, str) and "://" in path]
    if remote:  # one line for an unreachable bucket, not a minute of client retries
        from scaling.store.storage import StorageAccessError, check_access

        try:
            check_access(*remote)
        except StorageAccessError as error:  # its message names the path and the likely cause
            print(f"{parser.prog} {args.command}: error: {error}", file=sys.stderr)
            return 2
    try:
        return args.run(args)
    except AnalysisInputError as error:
        print(f"{parser.prog} {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"{parser.prog} {args.command}: error: {error.strerror or error}: {error.filename or ''}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
