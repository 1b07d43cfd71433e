"""Helpers the command-line tools share: the name a tool was started under, an
argument parser whose errors are one line, option types, the frame of the commands
that use a trained run, and text tables and their number cells."""

import argparse
import math
import os
import re
import sys
import textwrap

SCRIPT_PREFIX = "depth-width-"  # the console scripts of pyproject.toml


def prog(module_form: str) -> str:
    """``depth-width-…`` when started as an installed console script, else ``module_form`` (``python -m …``)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name.startswith(SCRIPT_PREFIX) else module_form


class Parser(argparse.ArgumentParser):
    """argparse with one error line instead of usage + error: a sweep log stays readable.

    Every entry point's parser (and its subcommands', which argparse makes of the same class) is one.
    A value that looks like a negative number (``--params -1e9``) is read as a value, so that its
    option says what is wrong with it; argparse's own matcher knows only plain negative decimals
    and would call "-1e9" an unknown option.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class ParagraphHelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, with the description's and epilog's line breaks kept: each line is
    wrapped to the terminal on its own (argparse's default joins them into one paragraph)."""

    def _fill_text(self, text, width, indent):
        return "\n".join(textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent) if line
                         else "" for line in text.splitlines())


def positive_int(text: str) -> int:
    """An argparse type: a whole number, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text!r}")
    return value


def run_dir_command(parser: argparse.ArgumentParser, argv, use) -> int:
    """The frame of a command that uses a trained run (``eval``, ``sample``, ``export``): parse ``argv``,
    find the run directory (a sweep's run may be named: ``runs/smoke/L1-d128-s0``, ``rundir.resolve_run_dir``),
    set up the CPU allocator before JAX starts, check that the buckets of its ``gs://`` paths answer (the run
    directory, ``--data`` files), and return ``use(args)``'s exit status, or 2 with one line on stderr for an
    unusable run directory, bucket, input or file (``RunDirError`` is a ``ValueError``; ``OSError``)."""
    args = parser.parse_args(argv)
    from scaling.cpu_allocator import tune_cpu_allocator

    tune_cpu_allocator()
    from scaling.store.rundir import resolve_run_dir
    from scaling.store.storage import check_access

    try:
        # Seconds and one line, instead of a minute of storage client retries before "no such run directory".
        check_access(args.run_dir, *getattr(args, "data", ()))
        args.run_dir = str(resolve_run_dir(args.run_dir))
        return use(args)
    except (ValueError, OSError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2


def fmt(value, spec: str, missing: str = "-") -> str:
    """``value`` formatted with ``spec``, or ``missing`` for None, NaN and infinities."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    return format(value, spec)


def text_table(header: list[str], rows: list[list], align: tuple[str, ...] | None = None) -> str:
    """Cells padded into columns under ``header``, for terminals; ``align``: "left" or "right" per column
    (default left). Cells are printed as given, never re-read as numbers."""
    import tabulate

    return tabulate.tabulate(rows, headers=header, tablefmt="plain", disable_numparse=True, colalign=align)


def doc_parser(doc: str, **kwargs) -> argparse.ArgumentParser:
    """A parser whose ``--help`` shows a script's docstring as written: its first
    paragraph as the description, the rest (units, sources, caveats) after the options."""
    first, _, rest = doc.strip().partition("\n\n")
    return argparse.ArgumentParser(description=first, epilog=rest or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
