"""What every command line does first: the process-wide settings that importing ``scaling`` leaves alone.

A program that imports the package keeps its own ``JAX_PLATFORMS`` and
storage variables; a command line (``main`` of the trainer, the launcher,
the data tools, the analysis) calls ``prepare_process`` before anything
starts JAX's backend or a storage client.
"""

from __future__ import annotations


def prepare_process() -> None:
    """Keep JAX from probing for a TPU where none is attached (``platforms.skip_absent_tpu``), and point
    every storage client at the emulator ``STORAGE_EMULATOR_HOST`` names, if set (``storage.use_emulator``)."""
    from scaling.platforms import skip_absent_tpu
    from scaling.store.storage import use_emulator

    skip_absent_tpu()
    use_emulator()
