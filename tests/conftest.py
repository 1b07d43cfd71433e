"""Shared test set-up.

JAX fixes its device list when its backend starts, so the 8 fake CPU devices
that the sharding tests need are requested here, before any test imports a
module that touches a device. Single-device code is unaffected: unsharded
arrays live on device 0. Tests that need the 8 devices take the
``eight_devices`` fixture, which hands them the device list.
"""

import os

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture
def eight_devices():
    devices = jax.devices()
    if len(devices) < 8:
        pytest.fail(f"expected 8 fake CPU devices, found {len(devices)}; is the backend started before conftest?")
    return devices[:8]
