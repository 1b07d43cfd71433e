"""Build and train one model: configs, parameter budgets, the Flax transformer, data, the trainer."""

from scaling.platforms import skip_absent_tpu
from scaling.storage import use_emulator as _use_emulator

# Every entry point (trainer, launcher, data tools) imports this package before JAX starts its
# backend, so a CPU machine with libtpu installed never probes for a TPU (scaling/platforms.py).
skip_absent_tpu()
# STORAGE_EMULATOR_HOST alone points every storage client at a local emulator (see scaling/storage.py).
_use_emulator()
