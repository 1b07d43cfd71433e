"""``python -m sweeps ...`` is ``python -m sweeps.launch ...``."""

import sys

from sweeps.piece.packages import exit_if_missing

exit_if_missing("python -m sweeps")  # one line, not a traceback, when a dependency is missing

from sweeps.launch import main  # noqa: E402 - after the check above

sys.exit(main())
