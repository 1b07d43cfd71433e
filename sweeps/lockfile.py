"""``python -m sweeps.lockfile``: the command that remakes ``constraints.txt`` (``sweeps/cloud/lockfile.py``).

Kept at this name because constraints.txt's header, the READMEs and the
task files tell users to type it.
"""

import sys

from sweeps.cloud.lockfile import main

if __name__ == "__main__":
    sys.exit(main())
