"""The name a command line tool was started under, for its usage and error lines."""

import os
import sys

SCRIPT_PREFIX = "depth-width-"  # the console scripts of pyproject.toml


def prog(module_form: str) -> str:
    """``depth-width-…`` when started as an installed console script, else ``module_form`` (``python -m …``)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name.startswith(SCRIPT_PREFIX) else module_form
