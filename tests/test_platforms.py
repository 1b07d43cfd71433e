"""A CPU machine with libtpu installed (the tpu extra) starts JAX without a word about TPUs."""

import os
import sys

import pytest

import helpers
from scaling import platforms


def test_cpu_only_exactly_when_libtpu_is_installed_without_a_tpu_gpu_or_choice():
    assert platforms.cpu_only({}, libtpu_installed=True, chips=0, gpu_present=False)
    assert not platforms.cpu_only({}, libtpu_installed=False, chips=0, gpu_present=False)
    assert not platforms.cpu_only({}, libtpu_installed=True, chips=4, gpu_present=False)
    assert not platforms.cpu_only({}, libtpu_installed=True, chips=0, gpu_present=True)
    assert not platforms.cpu_only({"JAX_PLATFORMS": "tpu"}, libtpu_installed=True, chips=0, gpu_present=False)


def test_tpu_chips_counts_googles_pci_devices(tmp_path):
    for name, vendor in [("0000:00:04.0", "0x1ae0"), ("0000:00:05.0", "0x1ae0"), ("0000:00:01.0", "0x8086")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "vendor").write_text(vendor + "\n")
    assert platforms.tpu_chips(str(tmp_path)) == 2
    assert platforms.tpu_chips(str(tmp_path / "absent")) == 0


def test_a_choice_already_made_is_kept():
    environ = {"JAX_PLATFORMS": "cuda"}
    assert platforms.skip_absent_tpu(environ) is False and environ == {"JAX_PLATFORMS": "cuda"}


def require_libtpu_on_a_cpu_machine():
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        message = 'needs libtpu, the optional tpu extra: pip install -e ".[tpu]"'
        if os.environ.get("SCALING_REQUIRE_LIBTPU") == "1":
            pytest.fail(message + " (SCALING_REQUIRE_LIBTPU=1)")
        pytest.skip(message)
    if platforms.tpu_chips() or any(os.path.exists(path) for path in platforms.GPU_DEVICE_FILES):
        pytest.skip("this machine has a TPU or GPU; the test is about CPU machines")


@pytest.mark.parametrize("command", [
    [sys.executable, "-m", "sweeps.launch", "hosts", "--check"],
    # a program of its own prepares the process as the command lines do (importing scaling does not)
    [sys.executable, "-c", "from scaling.entry import prepare_process; prepare_process(); import scaling.model.transformer, jax; "
                           "print(jax.numpy.ones(3).sum())"],
    # jax imported before the package: its config is updated, not only the environment
    [sys.executable, "-c", "import jax; from scaling.entry import prepare_process; prepare_process(); "
                           "print(jax.numpy.ones(3).sum())"],
], ids=["launcher", "library", "jax-first"])
def test_a_cpu_start_with_libtpu_installed_prints_nothing_about_tpus(command):
    require_libtpu_on_a_cpu_machine()
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # as a user's shell has it
    done = helpers.run(command, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    for word in ("TPU", "tpu", "E0000", "libtpu"):
        assert word not in done.stderr, done.stderr
    assert "cpu" in done.stdout.lower() or "3.0" in done.stdout
