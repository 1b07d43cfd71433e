"""Command line: optimal shapes, Table 1, transition sizes, and sweep analysis.

    python -m analysis optimal --params 175e9
    python -m analysis table --preset gpt3 --format markdown
    python -m analysis transition-size --depth 96 --json
    python -m analysis fit runs/my_sweep --save my_fit.json
    python -m analysis optimal --params 1.3B --fit my_fit.json
    python -m analysis plot runs/my_sweep --out figures/
    python -m analysis log-length results/log_length --figure accuracy.png

Sizes are non-embedding parameters N = 12·L·d²; widths are d_x in channels.
Bad input prints one error line and exits with status 2.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path

from analysis import projection
from analysis.errors import AnalysisInputError
from analysis.fit import fit_log_width, save_fit

# The sweep commands import pandas, scipy.stats and matplotlib only when they run,
# so `optimal`, `table` and `transition-size` start quickly.


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error message instead of usage + error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


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


def _fit_banner(fit) -> str:
    return f"fit {fit.name}: a = {fit.a:.4g}, b = {fit.b:.4g}"


def _fmt(value, spec, missing="–"):
    return missing if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


# ---------------------------------------------------------------- projections
def cmd_optimal(args) -> int:
    fit = projection.resolve_fit(args.fit)
    shape = projection.optimal_shape(args.params, fit)
    if args.json:
        _print_json(shape.to_dict())
        return 0
    print(f"budget N = {shape.params:.4g} non-embedding parameters ({_fit_banner(fit)})")
    print(f"optimal depth  {shape.depth} layers (N_tr(L) = N at L = {shape.depth_continuous:.2f}; "
          f"N_tr ± ΔN = N gives L = {_fmt(shape.depth_low, '.1f', 'unbounded')} to "
          f"{_fmt(shape.depth_high, '.1f', 'unbounded')})")
    print(f"optimal width  {shape.width:,.0f} channels (sqrt(N / (12·{shape.depth})))")
    print(f"N_tr({shape.depth}) = {shape.n_transition:.4g} ± {shape.delta_n:.2g} parameters")
    return 0


def cmd_table(args) -> int:
    fit = projection.resolve_fit(args.fit)
    rows = projection.optimal_table(projection.resolve_budgets(args.preset), fit)
    fmt = "json" if args.json else args.format
    if fmt == "json":
        _print_json({"preset": args.preset, "fit": fit.name, "a": fit.a, "b": fit.b,
                     "cov": [list(r) for r in fit.cov], "rows": rows})
    elif fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) + ["fit", "a", "b"], lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "fit": fit.name, "a": fit.a, "b": fit.b})
        print(out.getvalue(), end="")
    else:
        print(f"Optimal depth and width per budget, preset {args.preset} ({_fit_banner(fit)}). "
              f"Size N = 12·L·d² of the trained shape.\n")
        print("| model | size N | trained L | trained d | optimal L | optimal d | L from N_tr ± ΔN |")
        print("|---|---|---|---|---|---|---|")
        for row in rows:
            print(f"| {row['name']} | {row['params']:.3g} | {_fmt(row['trained_depth'], 'd')} | "
                  f"{_fmt(row['trained_width'], 'd')} | {row['optimal_depth']} | {row['optimal_width']:,.0f} | "
                  f"{_fmt(row['depth_low'], '.1f')}–{_fmt(row['depth_high'], '.1f')} |")
    return 0


def cmd_transition_size(args) -> int:
    fit = projection.resolve_fit(args.fit)
    rows = []
    for depth in args.depth:
        size = float(projection.transition_params(depth, fit))
        delta = float(projection.transition_params_error(depth, fit))
        rows.append({"depth": depth, "n_transition": size, "delta_n": delta, "relative_error": delta / size,
                     "width": math.sqrt(size / (12.0 * depth)), "fit": fit.name, "a": fit.a, "b": fit.b})
    if args.json:
        _print_json(rows[0] if len(rows) == 1 else rows)
        return 0
    print(f"N_tr(L) = 12·L·e^(2a)·e^(2bL), ΔN from the full covariance ({_fit_banner(fit)})")
    for row in rows:
        print(f"N_tr({row['depth']:g}) = {row['n_transition']:.4g} ± {row['delta_n']:.2g} parameters "
              f"(ΔN/N = {row['relative_error']:.3f}; transition width {row['width']:,.0f})")
    return 0


# ---------------------------------------------------------------- sweep analysis
def _analyse(args):
    from analysis.results import load_runs, require_depths
    from analysis.transition import find_transitions, transition_points

    table = load_runs(args.source, fingerprint=args.fingerprint)
    require_depths(table, 2)
    transitions, test = find_transitions(table.runs, alpha=args.alpha, method=args.test,
                                         loss_std=args.loss_std, n_bootstrap=args.bootstrap, seed=args.seed)
    depths, widths, errors = transition_points(transitions)
    if depths.size >= 2:
        return table, transitions, test, fit_log_width(depths, widths, errors, name=Path(args.source).name), None
    missing = [f"{t.shallow_depth}->{t.deep_depth} ({t.status})" for t in transitions if not t.found]
    reason = (f"no transition in range for pair(s) {', '.join(missing)}" if missing else
              f"{len(transitions)} adjacent depth pair(s) only; train more depths")
    message = f"not enough points for the fit: found {depths.size} transition(s), need 2 or more; {reason}"
    return table, transitions, test, None, message


def cmd_fit(args) -> int:
    table, transitions, test, fit, message = _analyse(args)
    if fit is not None and args.save:
        save_fit(fit, args.save)
    if args.json:
        _print_json({"source": table.source, "runs": len(table.runs), "skipped": table.skipped,
                     "fingerprint": table.fingerprint, "significance": test,
                     "transitions": [t.to_dict() for t in transitions],
                     "fit": fit.to_dict() if fit else None, "fit_message": message,
                     "saved": args.save if fit is not None and args.save else None})
    else:
        print(table.describe())
        print(f"significance: {test}")
        for transition in transitions:
            line = transition.message
            if transition.crossing_width is not None:
                ci = transition.crossing_ci
                line += f"; crossing at width {transition.crossing_width:.0f}"
                if ci:
                    line += f" (95% bootstrap CI {ci[0]:.0f}–{ci[1]:.0f})"
            print(line)
        print(fit.describe() if fit else message)
        if fit is not None:
            (saa, sab), (_, sbb) = fit.cov
            print(f"cov = [[{saa:.3g}, {sab:.3g}], [{sab:.3g}, {sbb:.3g}]]")
            if args.save:
                print(f"saved fit to {args.save} (use it with --fit {args.save})")
    if fit is None and args.save:
        print(f"nothing saved to {args.save}: no fit", file=sys.stderr)
    return 0


def cmd_plot(args) -> int:
    from analysis import plots  # matplotlib only when drawing

    try:
        table, transitions, test, fit, message = _analyse(args)
    except AnalysisInputError as error:
        if "single seed" not in str(error):
            raise
        # No seed noise, so no transitions; the loss curves are still worth drawing.
        from analysis.results import load_runs

        table = load_runs(args.source, fingerprint=args.fingerprint)
        transitions, test, fit, message = [], None, None, str(error)
    reference = projection.resolve_fit(args.fit)
    budgets = projection.resolve_budgets(args.preset) if args.preset else ()
    paths = plots.write_sweep_figures(table.runs, transitions, fit, args.out, reference=reference,
                                      budgets=budgets)
    notes = [] if fit else [f"{message}; drew {reference.name} for the N_tr(L) figures, no width-fit figure"]
    if args.json:
        _print_json({"figures": [str(p) for p in paths], "notes": notes, "significance": test})
    else:
        print(table.describe())
        for note in notes:
            print(note)
        print(f"wrote {len(paths)} files to {args.out}:")
        for path in paths:
            print(f"  {path}")
    return 0


def cmd_log_length(args) -> int:
    from analysis import log_length

    print(log_length.run(args.directory, args.format, args.figure))
    if args.figure:
        print(f"figure: {args.figure}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The ``python -m analysis`` argument parser."""
    parser = _Parser(prog="python -m analysis", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    fit_help = "fit preset (levine2020, the paper's eq. 10) or a JSON file from `fit --save`"
    optimal = commands.add_parser("optimal", help="optimal depth and width for one parameter budget")
    optimal.add_argument("--params", type=_params_arg, required=True,
                         help="non-embedding budget N = 12·L·d²: 175e9, 1.3B, 800M, 2T")
    optimal.add_argument("--fit", default="levine2020", help=fit_help)
    optimal.add_argument("--json", action="store_true", help="print JSON")
    optimal.set_defaults(run=cmd_optimal)

    table = commands.add_parser("table", help="optimal shapes for a preset list of budgets (Table 1)")
    table.add_argument("--preset", default="gpt3", choices=sorted(projection.BUDGET_PRESETS),
                       help="budget list: gpt3 = the 8 GPT-3 shapes plus a 1T budget (default)")
    table.add_argument("--fit", default="levine2020", help=fit_help)
    table.add_argument("--format", default="markdown", choices=("markdown", "csv", "json"))
    table.add_argument("--json", action="store_true", help="same as --format json")
    table.set_defaults(run=cmd_table)

    size = commands.add_parser("transition-size", help="N_tr(L) ± ΔN at one or more depths (eq. 9)")
    size.add_argument("--depth", type=_depth_arg, nargs="+", required=True, help="depth(s) L in layers")
    size.add_argument("--fit", default="levine2020", help=fit_help)
    size.add_argument("--json", action="store_true",
                      help="print JSON (an object for one depth, a list for several)")
    size.set_defaults(run=cmd_transition_size)

    sweep = _Parser(add_help=False)
    sweep.add_argument("source", help="sweep directory (searched for result.json) or CSV with "
                                      "columns depth,width,params,seed,loss")
    sweep.add_argument("--fingerprint", help="use only runs with this data_fingerprint (prefix ok)")
    sweep.add_argument("--test", default="pooled",
                       help="significance test for 'shallower is worse': pooled (default) or welch; "
                            "see analysis/transition.py")
    sweep.add_argument("--alpha", type=float, default=0.05, help="one-sided significance level (0.05)")
    sweep.add_argument("--loss-std", type=float, help="seed std in nats/token, if runs have one seed each")
    sweep.add_argument("--bootstrap", type=int, default=1000, help="seed resamples for the crossing CI")
    sweep.add_argument("--seed", type=int, default=0, help="random seed of the bootstrap")
    sweep.add_argument("--json", action="store_true", help="print JSON")

    fit = commands.add_parser("fit", parents=[sweep], help="transition widths and the log d = a + b·L fit")
    fit.add_argument("--save", metavar="PATH", help="write the fit (a, b, cov) as JSON for --fit PATH")
    fit.set_defaults(run=cmd_fit)

    plot = commands.add_parser("plot", parents=[sweep], help="figures like the paper's Figs. 2-4")
    plot.add_argument("--out", required=True, help="directory for the PNG and PDF files")
    plot.add_argument("--fit", default="levine2020", help="fit drawn when the sweep gives none of its own")
    plot.add_argument("--preset", default="gpt3", help="budgets marked on the projection figure ('' for none)")
    plot.set_defaults(run=cmd_plot)

    length = commands.add_parser(
        "log-length", help="FIRST/PARITY length generalisation: accuracy and bits per (task, n, arm)",
        description="Mean ± std over seeds of test accuracy and cross-entropy (bits) per task, training "
                    "length and attention scaling, from the run records of sweeps/configs/log_length.py.")
    length.add_argument("directory", help="sweep directory, e.g. results/log_length")
    length.add_argument("--format", default="markdown", choices=("markdown", "csv", "json"))
    length.add_argument("--figure", metavar="PATH", help="also draw test accuracy vs training length (PNG/PDF)")
    length.set_defaults(run=cmd_log_length)
    return parser


def main(argv=None) -> int:
    """Run the CLI; returns the exit status (2 for unusable input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
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
