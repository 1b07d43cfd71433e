"""``python -m sweeps ...`` is ``python -m sweeps.launch ...``."""

import sys

from sweeps.launch import main

sys.exit(main())
