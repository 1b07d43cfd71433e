"""The resolved config of a preset, a config file or a trained run: ``depth-width-train config``.

``config --config tiny --set model.depth=4`` prints every field as the
``--set`` key that changes it, with its value and the run id the config
hashes to (``scaling.config.config_id``): what ``--config tiny --set
model.depth=4`` would train, and the list of keys there are. ``config
RUN_DIR`` prints a run's own config (a sweep's run may be named:
``runs/smoke/L1-d128-s0``). ``--json`` prints the nested config instead,
a file that ``--config`` reads back.
"""

from __future__ import annotations

import json
import sys

from scaling import cli


def parser(prog: str):
    """The ``config`` command's parser (``prog``: how the user started it)."""
    result = cli.Parser(prog=prog, description="Print the resolved config of a preset, a config file or a run: "
                        "every field as its --set key and value, and the run id it hashes to.",
                        epilog=f"Examples: {prog} --config tiny --set model.num_heads=2; {prog} "
                               "runs/smoke/L1-d128-s0 --json > my_config.json")
    result.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="a run directory (or a sweep's run by its "
                        "name, e.g. runs/smoke/L1-d128-s0) whose config.json to print")
    result.add_argument("--config", help="instead of a run: a preset, a config.json or a .py file defining config()")
    result.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field first, as the trainer's --set does (repeatable)")
    result.add_argument("--json", action="store_true", help="the nested config as JSON (reads back with --config)")
    return result


def resolved(args):
    """(what was read, the ``TrainConfig`` with the overrides applied); ``ValueError`` for unusable input."""
    from scaling.overrides import override
    from scaling.train import load_config

    if (args.run_dir is None) == (args.config is None):
        raise ValueError("give either a RUN_DIR or --config PRESET_OR_FILE (not both)")
    if args.config is not None:
        return f"--config {args.config}", override(load_config(args.config), args.overrides)
    from scaling.run.restore import read_config
    from scaling.store.rundir import resolve_run_dir

    run_dir = resolve_run_dir(args.run_dir)
    return str(run_dir), override(read_config(run_dir), args.overrides)


def lines(config) -> list[str]:
    """``key = value`` for every field of ``config`` (values as JSON), keys aligned."""
    from scaling.config import to_dict
    from scaling.overrides import dotted_keys

    data = to_dict(config)
    keys = dotted_keys(data)
    width = max(map(len, keys))
    result = []
    for key in keys:
        node = data
        for part in key.split("."):
            node = node[part]
        result.append(f"{key:<{width}} = {json.dumps(node)}")
    return result


def main(argv=None, prog: str = "python -m scaling.train config") -> int:
    """Entry point of ``config``: prints the config; 2 with one line for unusable input."""
    args = parser(prog).parse_args(argv)
    try:
        source, config = resolved(args)
    except (ValueError, OSError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    from scaling.config import config_id, to_dict

    if args.json:
        print(json.dumps(to_dict(config), indent=2))
        return 0
    changed = f" with --set {' '.join(args.overrides)}" if args.overrides else ""
    print(f"# {source}{changed}: run id {config_id(config)}; change a field with --set KEY=VALUE")
    print("\n".join(lines(config)))
    return 0
