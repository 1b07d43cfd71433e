"""The preflight's own command-line options, defined once: the flags and the typed options they make.

``add_arguments`` puts them on the launcher's ``preflight`` subcommand (``sweeps/launch_parser.py`` asks
for them; ``--prices`` it shares with ``dry-run``), and ``Options.from_args`` is what the preflight's
command (``sweeps.preflight.command.main``) reads: no attribute is looked up by name anywhere else.
Standard library only, so the launcher's ``--help`` starts no JAX.
"""

from __future__ import annotations

import argparse
import dataclasses

MODES = ("quick", "depths", "full")  # sweeps.preflight.quick.MODES


@dataclasses.dataclass(frozen=True)
class Options:
    """What one preflight is asked: the slice ``topology`` (e.g. ``"v5e:4x4"``), whether each run spans it
    (``pod_wide``), which programs are compiled (``mode``), in how many processes (``jobs``, None: as memory
    and cores allow), the comparisons asked for (``parallelism``, ``remat_search``), the compiler's cache
    (``compile_cache``: a directory, "off", or None for the default), a price file (``prices``), where the
    estimates are kept with the sweep (``sweep_estimates``, a file or None) and ``json`` output."""

    topology: str
    pod_wide: bool = False
    mode: str = "quick"
    jobs: int | None = None
    parallelism: bool = False
    remat_search: bool = False
    compile_cache: str | None = None
    prices: str | None = None
    sweep_estimates: str | None = None
    json: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is invalid: allowed one of {', '.join(MODES)}")
        if self.jobs is not None and (not isinstance(self.jobs, int) or self.jobs < 1):
            raise ValueError(f"jobs={self.jobs!r} is invalid: allowed an integer >= 1 (--jobs N)")

    @classmethod
    def from_args(cls, args: argparse.Namespace, **changes) -> "Options":
        """The options of a parsed ``preflight`` command line (``add_arguments``'s flags), with ``changes``."""
        fields = {field.name: getattr(args, field.name) for field in dataclasses.fields(cls)
                  if hasattr(args, field.name)}
        if getattr(args, "full", False):
            fields["mode"] = "full"
        return cls(**{**fields, **changes})


def add_arguments(sub: argparse.ArgumentParser) -> None:
    """The ``preflight`` subcommand's own flags (``--prices`` and the sweep's common ones are the launcher's)."""
    sub.add_argument("--topology", required=True,
                     help="TPU slice the sweep will run on, e.g. v5e:4x4 (16 chips, 4 hosts); on a multi-host "
                          "slice each run is checked on one host's 2x2 chips, as run trains it by default")
    sub.add_argument("--pod-wide", action="store_true", help="check each run on the whole slice, as run --pod-wide "
                                                             "trains it")
    sub.add_argument("--mode", choices=MODES, default="quick",
                     help="which programs to compile: quick (default) the runs no other dominates in depth and "
                          "width plus a few anchor widths, re-pricing other depths and interpolating other widths; "
                          "depths one per width; full every one (sweeps/preflight/quick.py)")
    sub.add_argument("--full", action="store_true", help="compile every program (same as --mode full)")
    sub.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="compile the distinct programs in N processes (default: as memory and cores allow, at "
                          "most 4)")
    for flag, text in (
            ("--parallelism", "also compile each compiled run data-parallel, fsdp and packed (one run per chip) and "
                              "keep the cheapest that fits (up to 2 more compiles a run); a sweep with "
                              "parallelism=\"auto\" then trains each run that way"),
            ("--remat-search", "for each run that fits, also compile the cheaper remat policies (none < dots < "
                               "full) and report the cheapest that fits (up to 2 more compiles a run)")):
        sub.add_argument(flag, action="store_true", help=text)
    # Without --workdir the preflight keeps its estimates only in this machine's cache.
    sub.set_defaults(workdir=None)
    sub.add_argument("--compile-cache", default=None, metavar="DIR",
                     help="where the TPU compiler's answers are kept, so a repeated preflight compiles only "
                          "programs that changed; 'off' compiles everything (default: $SCALING_PREFLIGHT_CACHE, "
                          "else ~/.cache/scaling/preflight)")
