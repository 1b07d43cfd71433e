"""Keep JAX from probing for a TPU on machines that have none (libtpu installed for the preflight).

With the ``tpu`` extra installed, JAX's default platform list includes the
TPU plugin, and on a machine without TPU chips libtpu prints several lines of
errors at every start ("Failed to find host bounds ...", "E0000 ...
unexpected worker hostname ..."). They are harmless but look like failures.
Setting JAX_PLATFORMS=cpu before JAX starts its backend keeps libtpu
unloaded; compiling *for* a TPU topology (the preflight) does not need it.

The choice is left alone wherever it could matter: when JAX_PLATFORMS is
already set, when TPU chips are attached (Google's PCI vendor id, the test JAX
itself uses), or when a GPU is present (CPU-only would hide it).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

GOOGLE_PCI_VENDOR = "0x1ae0"
GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def tpu_chips(pci_devices: str = "/sys/bus/pci/devices") -> int:
    """Number of PCI devices from Google's vendor id (TPU chips) under ``pci_devices``."""
    count = 0
    for vendor in glob.glob(os.path.join(pci_devices, "*", "vendor")):
        try:
            with open(vendor) as handle:
                count += handle.read().strip() == GOOGLE_PCI_VENDOR
        except OSError:
            continue
    return count


def cpu_only(environ, libtpu_installed: bool, chips: int, gpu_present: bool) -> bool:
    """Whether to restrict JAX to the CPU: libtpu is installed, yet no TPU, no GPU and no choice made."""
    return "JAX_PLATFORMS" not in environ and libtpu_installed and chips == 0 and not gpu_present


def skip_absent_tpu(environ=os.environ) -> bool:
    """Set JAX_PLATFORMS=cpu where libtpu is installed but no TPU (or GPU) is attached; True if it did.

    Call before JAX starts a backend. If ``jax`` is already imported (it read
    its environment then), its config is updated too.
    """
    if "JAX_PLATFORMS" in environ or importlib.util.find_spec("libtpu") is None:
        return False  # the cheap checks first: every command line starts with this
    if not cpu_only(environ, True, tpu_chips(), any(os.path.exists(path) for path in GPU_DEVICE_FILES)):
        return False
    environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:
        sys.modules["jax"].config.update("jax_platforms", "cpu")
    return True
