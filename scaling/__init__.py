"""Training side of the project: model, data, trainer, checkpoints, records."""

from scaling.storage import use_emulator as _use_emulator

# STORAGE_EMULATOR_HOST alone points every storage client at a local emulator (see scaling/storage.py).
_use_emulator()
