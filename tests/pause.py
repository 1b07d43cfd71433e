"""Run a module's command line, pausing the first training run that logs a chosen step.

    python tests/pause.py PAUSE_FILE [RUN@]STEP MODULE [ARGUMENTS...]

runs ``python -m MODULE ARGUMENTS`` (``-m scaling.train`` or ``-m sweeps.launch``). Once a run's tracker
(with RUN@, only that of the run whose directory is named RUN) has logged STEP (so every metrics row before STEP is written, and every checkpoint before it is
under way), the process creates PAUSE_FILE and waits while it exists, for at most ten minutes. A test can
then kill it, signal it or break its storage at a step it knows, however fast or slow the machine is,
and delete the file to let the run go on. A test that would otherwise race a short run to a step
needs this; signals that arrive during the pause are handled as at any other moment.
"""

import runpy
import sys
import time
from pathlib import Path

from scaling.run.track import Tracker


def main() -> None:
    pause_file, when, module, *arguments = sys.argv[1:]
    run, _, step = when.rpartition("@")
    pause_file, step = Path(pause_file), int(step)
    log = Tracker.log
    paused = []

    def log_then_pause(self, at_step, metrics):
        log(self, at_step, metrics)
        if not paused and at_step >= step and run in ("", self.run_dir.name):
            paused.append(at_step)
            if self._writer is not None:  # rows uploaded behind the loop (gs://): written before the pause
                self._writer.wait(600)
            pause_file.touch()
            deadline = time.time() + 600
            while pause_file.exists() and time.time() < deadline:
                time.sleep(0.01)

    Tracker.log = log_then_pause
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
