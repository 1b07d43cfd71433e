"""Shared test set-up.

JAX fixes its device list when its backend starts, so the 8 fake CPU devices
that the sharding tests need are requested here, before any test imports a
module that touches a device. Single-device code is unaffected: unsharded
arrays live on device 0. Tests that need the 8 devices take the
``eight_devices`` fixture, which hands them the device list.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Most tests train the same few tiny shapes, many of them in launcher and trainer
# subprocesses, which would otherwise each compile them again; XLA compiling
# dominates the suite's time. One persistent compilation cache per test session,
# inherited by those subprocesses and by pytest-xdist's workers, compiles each
# program once. It starts empty and is deleted at the end, so no run of the
# suite depends on an earlier one.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _compilation_cache = tempfile.mkdtemp(prefix="scaling-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _compilation_cache
    atexit.register(shutil.rmtree, _compilation_cache, ignore_errors=True)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture
def eight_devices():
    devices = jax.devices()
    if len(devices) < 8:
        pytest.fail(f"expected 8 fake CPU devices, found {len(devices)}; is the backend started before conftest?")
    return devices[:8]
